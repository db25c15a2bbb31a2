"""Parse cluster spec strings.

Grammar (case-insensitive, spaces ignored)::

    spec  := NODES "x" GPUS "x" GPU [ "+" NICS "x" LINK ]
           | NODES "x" "NVL" GPUS "x" GPU [ "+" NICS "x" LINK ]   # the same: NVL72 = 72 per node
           | TOTAL "x" GPU [ "+" NICS "x" LINK ]        # TOTAL GPUs in full nodes of the GPU's box

e.g. ``4x8xA100-80GB``, ``2048xH100``, ``8x8xH100+8xroce-400g``, ``2x8xA800-80GB+1xeth-25g``,
``2x72xGB200`` (= ``2xNVL72xGB200`` = ``144xGB200``: two NVL72 racks).

A node is one scale-up domain: the GPUs the box's intra-node link joins. For HGX/DGX boards and
the 8-GPU AMD platforms that is 8 GPUs (the ``TOTAL`` form's default); for a GB200/GB300 NVL72
rack it is the rack's 72-GPU NVLink Switch domain, so a rack is written as one node of 72 GPUs
(its 18 trays of 4 are the box's ``gpus_per_host``), and the ``TOTAL`` form fills 72-GPU racks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autopar.errors import InvalidClusterSpec
from autopar.hardware.catalog import Catalog
from autopar.hardware.devices import CATALOG, Device
from autopar.hardware.links import LinkType, get_link, list_links

#: Most GPUs a cluster may have: 2**20, ten times the largest clusters built (~100k GPUs); the
#: search enumerates divisors of the GPU count, so absurd counts (typos) are refused up front.
MAX_WORLD_SIZE = 2 ** 20

#: GPUs per node assumed by the ``TOTALxGPU`` form (DGX/HGX boards carry 8).
DEFAULT_GPUS_PER_NODE = 8

#: Most compute NICs per GPU a spec may give: 4, the largest shipped figure autopar knows (AWS
#: p5.48xlarge: 32 EFA interfaces for 8 H100 GPUs, its instance-type documentation); more (e.g.
#: '4x8xH100+100xib-ndr') is taken for a typo, not priced as bandwidth no node has.
MAX_NICS_PER_GPU = 4

_GRAMMAR = "NODESxGPUSxGPU[+NICSxLINK] or TOTALxGPU[+NICSxLINK], e.g. '4x8xA100-80GB+4xib-hdr' or '2048xH100'"
_MAIN = re.compile(r"^(\d+)x(?:(?:nvl)?(\d+)x)?([a-z][a-z0-9\-]*)$")
_NIC = re.compile(r"^(\d+)x([a-z][a-z0-9\-]*)$")


@dataclass(frozen=True)
class ParsedSpec:
    """What a spec string says; links not given are None (the node template decides);
    ``gpu_name`` is the GPU part as written (lower case)."""

    num_nodes: int
    gpus_per_node: int
    device: Device
    nics_per_node: int | None
    nic_link: LinkType | None
    gpu_name: str = ""


def _positive(value: str, what: str, spec: str, example: str = "'4x8xA100-80GB' (4 nodes of "
              "8 GPUs)") -> int:
    n = int(value)
    if n <= 0:
        raise InvalidClusterSpec(f"cluster spec {spec!r}: {what} must be >= 1, got {n}; "
                                 f"fix: e.g. {example}")
    return n


def _count_fix(total: int, per_node: int, gpu_name: str, box) -> str:
    """The fix for a ``TOTALxGPU`` spec whose ``total`` is not a multiple of ``per_node``: specs
    :class:`~autopar.hardware.cluster.Cluster` accepts (a suggestion the node-size check refuses
    next is no fix: ``1x12xH100`` is refused, an HGX H100 board joins at most 8 GPUs).

    Nodes of an NVSwitch/NVLink board, a rack's NVLink domain or a switchless mesh (xGMI) hold
    at most ``per_node`` GPUs, so the fix is the nearest whole numbers of nodes or, when some
    divisor of ``total`` in 2..per_node exists, smaller nodes of it; a node of another fabric
    (PCIe) may hold more, so one node of ``total`` GPUs is offered too."""
    low, high = total // per_node * per_node, (total // per_node + 1) * per_node
    near = " or ".join(f"'{n}x{gpu_name}'" for n in (low, high) if n) + " (full nodes)"
    bounded = box is None or box.rack_scale or get_link(box.intra_link).kind in (
        "nvswitch", "nvlink") or get_link(box.intra_link).mesh_links
    part = max(d for d in range(1, per_node + 1) if total % d == 0)
    # one GPU is one node of one (a single-GPU spec, '1x1xH100')
    other = (f"'{total // part}x{part}x{gpu_name}' (nodes of {part})" if part > 1 else
             f"'1x1x{gpu_name}' (one GPU)" if total == 1 else "")
    if not bounded:
        other = f"'1x{total}x{gpu_name}' (one node)"
    return f"write {near}" + (f", or {other}" if other else "")


def parse_spec(spec: str, catalog: Catalog = CATALOG) -> ParsedSpec:
    """Read a cluster spec string (grammar in the module docstring); GPU names resolve in
    ``catalog`` (default: :data:`autopar.hardware.devices.CATALOG`).

    Raises:
        InvalidClusterSpec: naming the part that could not be read (the node/GPU part, the GPU name,
            the NIC part or the link name), with the valid GPU or link names; or more NICs
            per node than :data:`MAX_NICS_PER_GPU` per GPU.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidClusterSpec(f"cluster spec must be a non-empty string like {_GRAMMAR}; got {spec!r}")
    text = re.sub(r"\s+", "", spec).lower()
    main, plus, nic_part = text.partition("+")
    m = _MAIN.match(main)
    counts = re.match(r"^(-?[0-9.]+)x(?:(-?[0-9.]+)x)?", main)
    if not m and counts and not all(g is None or g.isdigit() for g in counts.groups()):
        bad = next(g for g in counts.groups() if g is not None and not g.isdigit())
        raise InvalidClusterSpec(
            f"cluster spec {spec!r}: node and GPU counts are whole numbers >= 1, got {bad}; "
            "fix: e.g. '4x8xA100-80GB' (4 nodes of 8 GPUs) or '32xH100' (32 GPUs)")
    if not m:
        raise InvalidClusterSpec(
            f"cannot read {main!r} in cluster spec {spec!r}: expected {_GRAMMAR}. "
            f"Valid GPUs: {', '.join(catalog.names())}, or a short alias of one ('h100')"
        )
    first, second, gpu_name = m.groups()
    try:
        device = catalog.device(gpu_name)
    except InvalidClusterSpec as err:
        if catalog.extending(gpu_name):   # several GPUs begin so: the error names them as fix
            raise InvalidClusterSpec(f"cluster spec {spec!r}: {err}") from None
        raise InvalidClusterSpec(f"cluster spec {spec!r}: GPU part {gpu_name!r}: {err}. Fix: use a "
                                 f"valid GPU name, e.g. '4x8xA100-80GB'") from None
    if second is not None:
        num_nodes = _positive(first, "the node count", spec)
        gpus_per_node = _positive(second, "GPUs per node", spec)
    else:
        total = _positive(first, "the GPU count", spec)
        box = catalog.box(device)
        per_node = box.gpus_per_node if box is not None else DEFAULT_GPUS_PER_NODE
        if total % per_node:
            fix = (f"check the GPU count: autopar plans for at most {MAX_WORLD_SIZE} GPUs"
                   if total > MAX_WORLD_SIZE else _count_fix(total, per_node, gpu_name, box))
            raise InvalidClusterSpec(
                f"cluster spec {spec!r}: GPU count {total} in {main!r} is not a multiple of "
                f"{per_node} (GPUs per {gpu_name} node). Fix: {fix}")
        num_nodes, gpus_per_node = total // per_node, per_node
    if not plus:
        return ParsedSpec(num_nodes, gpus_per_node, device, None, None, gpu_name)
    n = _NIC.match(nic_part)
    if not n:
        raise InvalidClusterSpec(
            f"cannot read the NIC part {nic_part!r} of cluster spec {spec!r}: expected NICSxLINK; "
            f"fix: e.g. '+8xib-ndr'. Valid links: {', '.join(list_links())}"
        )
    try:
        link = get_link(n.group(2))
    except InvalidClusterSpec as err:
        raise InvalidClusterSpec(f"cluster spec {spec!r}: NIC part {nic_part!r}: {err}. Fix: use a "
                                 f"valid link name, e.g. '+8xib-ndr'") from None
    nics = _positive(n.group(1), "the NIC count", spec,
                     "'2x8xH100+8xib-ndr' (8 NICs per node)")
    if nics > MAX_NICS_PER_GPU * gpus_per_node:
        raise InvalidClusterSpec(
            f"cluster spec {spec!r}: {nics} NICs per node of {gpus_per_node} GPUs is more than "
            f"{MAX_NICS_PER_GPU} per GPU, the most any shipped node has (AWS p5.48xlarge: 32 EFA "
            f"for 8 GPUs); the NIC count is per node, not per cluster. Fix: give the NICs of one "
            f"node, e.g. '+{gpus_per_node}x{n.group(2)}' (one per GPU)")
    return ParsedSpec(num_nodes, gpus_per_node, device, nics, link, gpu_name)
