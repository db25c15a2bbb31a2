"""Default node ("box") layouts: which links and NICs a server built around each GPU has.

The box rows and which GPU ships in which are in :mod:`autopar.hardware.devices` (``BOXES``, each
GPU row's ``box``); this module answers "the default node of this GPU" from the default catalog.
Used by ``Cluster.from_spec`` when the spec names only a GPU (``4x8xA100-80GB``) and by
``Cluster.custom`` for the arguments left out. Override the NICs in a spec with ``+NICSxLINK``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from autopar.hardware.catalog import Box
from autopar.hardware.devices import CATALOG, Device

#: A GPU's default node is a :class:`~autopar.hardware.catalog.Box` (the name kept for callers).
NodeTemplate = Box

#: Canonical GPU name -> its default node (a view of the catalog's rows).
NODE_TEMPLATES: Mapping[str, Box] = MappingProxyType(
    {row.name: CATALOG.box(row.device) for row in CATALOG.gpus})


def default_nics(template: Box, gpus_per_node: int) -> int:
    """Compute NICs of a node of ``gpus_per_node`` GPUs built like ``template``
    (:meth:`Box.nics`: its NICs, no more than one per GPU)."""
    return template.nics(gpus_per_node)


def node_template(device: Device) -> Box | None:
    """The default node of ``device`` in the default catalog, or None for a GPU not in the
    catalog (a hand-built :class:`Device`), whose links must then be given explicitly."""
    return CATALOG.box(device)
