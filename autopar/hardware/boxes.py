"""Default node ("box") layouts: which links and NICs a server built around each GPU has.

Used by ``Cluster.from_spec`` when the spec names only a GPU (``4x8xA100-80GB``) and by
``Cluster.custom`` for the arguments left out. Override the NICs in a spec with ``+NICSxLINK``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from autopar.hardware.devices import Device


@dataclass(frozen=True)
class NodeTemplate:
    """The default build of an 8-GPU server around one GPU model.

    Attributes:
        device: canonical GPU name.
        intra_link: catalog link name joining the GPUs of one node.
        nics_per_node: compute NICs per node (one per GPU "rail" in DGX/HGX designs).
        nic_link: catalog link name of each NIC.
        source: which system this describes, or why it was assumed.
    """

    device: str
    intra_link: str
    nics_per_node: int
    nic_link: str
    source: str


_DGX_A100 = ("DGX A100: NVSwitch + 8 x ConnectX-6 HDR compute ports "
             "(docs/reference/hardware_and_formulas.md: 'DGX A100 has 8 ports')")
_DGX_H100 = ("DGX H100 / H200: NVSwitch + 8 x ConnectX-7 NDR "
             "(docs/reference/hardware_and_formulas.md: 'DGX H100 has 8 ports')")
_PCIE_BOX = ("commodity 8-GPU PCIe server, GPUs peer over PCIe switches and the host; one compute NIC, "
             "as in DeepSeek Fire-Flyer AI-HPC (arXiv 2408.14158: 8 x A100 PCIe + one 200 Gb/s IB NIC); "
             "assumption for other PCIe boxes")

#: Canonical GPU name -> its default node.
NODE_TEMPLATES: Mapping[str, NodeTemplate] = MappingProxyType({t.device: t for t in (
    NodeTemplate("A100-SXM4-40GB", "nvlink3", 8, "ib-hdr", _DGX_A100),
    NodeTemplate("A100-SXM4-80GB", "nvlink3", 8, "ib-hdr", _DGX_A100),
    NodeTemplate("A100-PCIe-40GB", "pcie-gen4", 1, "ib-hdr", _PCIE_BOX),
    NodeTemplate("A100-PCIe-80GB", "pcie-gen4", 1, "ib-hdr", _PCIE_BOX),
    NodeTemplate("A800-SXM4-80GB", "nvlink3-a800", 8, "ib-hdr",
                 "HGX A800: assumed built like HGX A100 (one HDR port per GPU). The reference's field "
                 "report (Megatron-LM #1059) ran 4 x 200G RoCE: write '+4xroce-200g' for that"),
    NodeTemplate("H100-SXM5-80GB", "nvlink4", 8, "ib-ndr", _DGX_H100),
    NodeTemplate("H100-PCIe-80GB", "pcie-gen5", 1, "ib-ndr", _PCIE_BOX),
    NodeTemplate("H800-SXM5-80GB", "nvlink4-h800", 8, "ib-ndr",
                 "HGX H800 as in the DeepSeek-V3 report (arXiv 2412.19437, sec. 3.2: 50 GB/s IB per GPU)"),
    NodeTemplate("H200-SXM-141GB", "nvlink4", 8, "ib-ndr", _DGX_H100),
)})


def default_nics(template: NodeTemplate, gpus_per_node: int) -> int:
    """Compute NICs of a node of ``gpus_per_node`` GPUs built like ``template``: its NICs, but
    no more than one per GPU. The DGX / HGX boxes give each GPU its own NIC (a "rail", the
    sources of :data:`NODE_TEMPLATES`), so a 2-GPU node of them has 2 NICs, not the 8-GPU box's
    8; a PCIe box's single NIC stays 1."""
    return min(template.nics_per_node, gpus_per_node)


def node_template(device: Device) -> NodeTemplate | None:
    """The default :class:`NodeTemplate` for ``device``, or None for a GPU not in the catalog
    (a hand-built :class:`Device`), whose links must then be given explicitly."""
    return NODE_TEMPLATES.get(device.name)
