"""The link catalog: one :class:`LinkType` row per interconnect, each with its source.

Bandwidths are per direction, in bytes/s, decimal (25 GB/s = 25e9). For NVLink rows the figure is the
per-GPU aggregate into the NVSwitch fabric; for a mesh row (``mesh_links`` > 0) it is the aggregate of
the GPU's ``mesh_links`` peer links, of which a group of m GPUs in the node uses m - 1
(:meth:`LinkType.group_bandwidth_Bps`). Network rows are per NIC port. Latencies are per-hop alphas
in seconds; they are modelling assumptions anchored on NCCL's own tuning model
(``NVIDIA/nccl src/graph/tuning.cc``, ``hwLat``: NVLink 0.47 / 1.9 / 3.4 us, PCI 1.0 / 2.5 / 5.7 us,
network 2.7-5.0 / 4.0-8.5 / 9.6-50 us for the LL / LL128 / Simple protocols), not measurements of ours.
Ring and tree collectives spanning nodes take NCCL's tuner constants themselves
(:mod:`autopar.hardware.collectives`); there a network row's latency counts only as its excess
over the InfiniBand row's 5 us.

AWS Elastic Fabric Adapter rows (kind ``efa``; NCCL runs over it through the aws-ofi-nccl plugin
on libfabric's SRD transport): bandwidths are the instance pages' line rates; latencies are
derived from published nccl-tests runs (measured), see :data:`EFA_LATENCY_SOURCES`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from autopar.errors import InvalidClusterSpec

#: Link kinds. ``nvlink`` is a point-to-point bridge, ``nvswitch`` an all-to-all NVLink fabric,
#: ``xgmi`` AMD Infinity Fabric (xGMI) links wiring a node's GPUs as a fully connected mesh (no
#: switch: each pair of GPUs has its own link, so a group of m GPUs reaches only m - 1 of them).
LINK_KINDS: tuple[str, ...] = ("nvlink", "nvswitch", "pcie", "infiniband", "roce", "efa",
                                "ethernet", "xgmi")
#: Kinds that can join GPUs inside one node.
INTRA_KINDS: tuple[str, ...] = ("nvlink", "nvswitch", "pcie", "xgmi")
#: Kinds that can join nodes.
NETWORK_KINDS: tuple[str, ...] = ("infiniband", "roce", "efa", "ethernet")

_GIGA = 1e9


@dataclass(frozen=True)
class LinkType:
    """One kind of interconnect.

    Attributes:
        name: catalog name, e.g. ``"ib-hdr"``.
        kind: one of :data:`LINK_KINDS`.
        bandwidth_Bps: bytes/s per direction (per GPU for NVLink fabrics, per port for NICs).
        latency_s: per-hop latency (alpha) in seconds, software included.
        source: where the figures come from.
        mesh_links: for a fully connected mesh without a switch (kind ``xgmi``), the peer links
            each GPU has (one to each other GPU of the node); 0 for a switched fabric or a bus.

    Raises:
        InvalidClusterSpec: on construction, if the kind is unknown, a figure is not positive
            (latency may be 0), or ``mesh_links`` is negative or given on a non-mesh kind.
    """

    name: str
    kind: str
    bandwidth_Bps: float
    latency_s: float
    source: str
    mesh_links: int = 0

    def group_bandwidth_Bps(self, members: int) -> float:
        """Bytes/s per direction one GPU of a group with ``members`` GPUs in this node can drive:
        the whole :attr:`bandwidth_Bps` for a switched fabric or bus; on a mesh, the share of its
        ``mesh_links`` links that lead to the other ``members - 1`` GPUs (a ring or all-to-all
        over 2 GPUs of an 8-GPU xGMI mesh has one 64 GB/s link, not seven). Mesh collectives
        over all m - 1 links assume the library stripes channels over every peer link, as
        RCCL's rings over a fully connected xGMI node do (unvalidated for autopar)."""
        if not self.mesh_links or members < 2:
            return self.bandwidth_Bps
        return self.bandwidth_Bps * min(members - 1, self.mesh_links) / self.mesh_links

    def __post_init__(self) -> None:
        if self.kind not in LINK_KINDS:
            raise InvalidClusterSpec(f"link {self.name!r}: kind {self.kind!r} is not one of {list(LINK_KINDS)}")
        if not self.bandwidth_Bps > 0:
            raise InvalidClusterSpec(f"link {self.name!r}: bandwidth_Bps must be > 0, got {self.bandwidth_Bps}")
        if self.latency_s < 0:
            raise InvalidClusterSpec(f"link {self.name!r}: latency_s must be >= 0, got {self.latency_s}")
        if self.mesh_links < 0 or (self.mesh_links and self.kind != "xgmi"):
            raise InvalidClusterSpec(f"link {self.name!r}: mesh_links={self.mesh_links} needs kind "
                                     f"'xgmi' and a count >= 0; fix: 0 for a switched link")


_REF = "docs/reference/hardware_and_formulas.md"
_NV_LAT = ("1 us: assumption between NCCL tuning.cc hwLat NVLink LL (0.47 us) and LL128 (1.9 us)")
_PCI_LAT = "1 us: NCCL tuning.cc hwLat PCI LL (1.0 us); assumption"
_IB_LAT = "5 us: NCCL tuning.cc hwLat NET tree LL (5.0 us); assumption"
_ROCE_LAT = "6 us: assumption, IB alpha plus ~1 us for lossless-Ethernet switching"
#: How each EFA row's per-hop latency is derived: the measured small-message (8 B to 1 KB)
#: all_reduce time of 2 nodes x 8 GPUs in aws-samples/awsome-distributed-training
#: micro-benchmarks/nccl-tests/README.md (commit 0162aacd, 'Results'), read as autopar prices it
#: (:mod:`autopar.hardware.collectives`: NCCL's tree, LL protocol, 25.2 us on the InfiniBand row,
#: of which 2 network steps), so latency = 5 us + (measured - 25.2 us) / 2.
EFA_LATENCY_SOURCES = {
    "efa-v1-100g": "2 x p4de.24xlarge: 161.0-165.0 us at 8 B-1 KB (out-of-place mean 162.3 us) -> 74 us",
    "efa-v2-100g": "2 x p5.48xlarge: 65.5-74.9 us at 8 B-1 KB (out-of-place mean 71.1 us) -> 28 us",
    "efa-v3-200g": "assumed equal to efa-v2-100g (no published p5en small-message run found)",
}
_EFA_REF = ("aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md "
            "(0162aacd) 'Results'")
_ETH_LAT = "30 us: assumption for NCCL's TCP socket transport (kernel network stack), 20-50 us typical"

#: Catalog name -> LinkType.
LINKS: Mapping[str, LinkType] = MappingProxyType({link.name: link for link in (
    LinkType("nvlink3", "nvswitch", 300 * _GIGA, 1.0e-6,
             f"{_REF}: A100 NVLink 600 GB/s bidir (12 x 25 GB/s per direction); {_NV_LAT}"),
    LinkType("nvlink3-a800", "nvswitch", 200 * _GIGA, 1.0e-6,
             f"{_REF}: A800 NVLink 400 GB/s bidir; {_NV_LAT}"),
    LinkType("nvlink4", "nvswitch", 450 * _GIGA, 1.0e-6,
             f"{_REF}: H100/H200 NVLink 900 GB/s bidir (18 x 25 GB/s per direction); {_NV_LAT}"),
    LinkType("nvlink4-h800", "nvswitch", 200 * _GIGA, 1.0e-6,
             f"{_REF}: H800 NVLink 400 GB/s bidir; {_NV_LAT}"),
    # NVLink 2.0 (Volta). NVIDIA Tesla V100 GPU Architecture whitepaper (2017), "NVLink": six
    # links per GPU at 25 GB/s per direction each, 300 GB/s total (150 GB/s per direction).
    LinkType("nvlink2-cubemesh", "nvlink", 150 * _GIGA, 1.0e-6,
             "NVIDIA Tesla V100 whitepaper: V100 SXM2 NVLink 2.0, 6 links x 25 GB/s per direction = "
             "300 GB/s bidir; DGX-1 wires them as a hybrid cube-mesh (point to point, no switch). "
             "Modelled as each GPU's 6-link aggregate (150 GB/s per direction) into a node fabric, "
             "as the NVSwitch rows are: right for NCCL rings that use every link, optimistic for "
             f"groups whose GPUs are not directly linked or all-to-all traffic; {_NV_LAT}"),
    LinkType("nvlink2", "nvswitch", 150 * _GIGA, 1.0e-6,
             "NVIDIA DGX-2 datasheet / NVSwitch whitepaper (2018): each V100's 6 NVLink 2.0 links "
             "(25 GB/s per direction each) into 12 NVSwitches, 300 GB/s bidir per GPU, any pair at "
             f"full rate; {_NV_LAT}"),
    # NVLink 5 (Blackwell): 18 links per GPU, 1.8 TB/s bidirectional. In an HGX B200/B300 board
    # the fabric is the board's NVSwitches; in a GB200/GB300 NVL72 rack it is the NVLink Switch
    # trays joining all 72 GPUs at the same per-GPU rate (rack datasheet: 130 TB/s = 72 x 1.8).
    LinkType("nvlink5", "nvswitch", 900 * _GIGA, 1.0e-6,
             f"{_REF}: Blackwell NVLink 5 1.8 TB/s bidir per GPU (HGX B200/B300 and GB200/GB300 "
             f"NVL72 datasheets: 'NVLink GPU-to-GPU bandwidth 1.8 TB/s', NVL72 rack 130 TB/s); "
             f"{_NV_LAT}; unvalidated: no NVLink 5 collective measured for autopar"),
    # AMD Infinity Fabric (xGMI) in an 8-GPU platform: every GPU has 7 links, one to each peer.
    LinkType("xgmi-mi300", "xgmi", 7 * 64 * _GIGA, 1.0e-6,
             f"{_REF}: AMD Instinct MI300X / MI325X datasheets: 7 Infinity Fabric links per GPU, "
             "128 GB/s peak each (64 GB/s per direction), fully connected 8-GPU platform (no "
             "switch): 448 GB/s per direction over all 7 peers; collectives by RCCL. Latency: "
             f"the NVLink row's assumption ({_NV_LAT.split(':')[0]}); unvalidated for RCCL",
             mesh_links=7),
    LinkType("xgmi-mi355", "xgmi", 7 * 76.8 * _GIGA, 1.0e-6,
             f"{_REF}: AMD Instinct MI355X datasheet: 7 Infinity Fabric links per GPU, 153.6 "
             "GB/s peak each (76.8 GB/s per direction), fully connected 8-GPU platform; "
             f"collectives by RCCL; latency as xgmi-mi300; unvalidated for RCCL", mesh_links=7),
    LinkType("pcie-gen3", "pcie", 16 * _GIGA, 1.0e-6,
             f"PCIe 3.0 x16 ~15.75 GB/s per direction (PCI-SIG), rounded as the reference rounds Gen4/5; {_PCI_LAT}"),
    LinkType("pcie-gen4", "pcie", 32 * _GIGA, 1.0e-6, f"{_REF}: PCIe Gen4 x16 ~32 GB/s per direction; {_PCI_LAT}"),
    LinkType("pcie-gen5", "pcie", 64 * _GIGA, 1.0e-6, f"{_REF}: PCIe Gen5 x16 ~64 GB/s per direction; {_PCI_LAT}"),
    LinkType("ib-edr", "infiniband", 12.5 * _GIGA, 5.0e-6,
             f"IB EDR 100 Gb/s per port = 12.5 GB/s per direction (DGX-1 / DGX-2 datasheets: "
             f"EDR InfiniBand 100 Gb/s ports); {_IB_LAT}"),
    LinkType("ib-hdr", "infiniband", 25 * _GIGA, 5.0e-6, f"{_REF}: IB HDR 25 GB/s per port per direction; {_IB_LAT}"),
    LinkType("ib-ndr", "infiniband", 50 * _GIGA, 5.0e-6, f"{_REF}: IB NDR 50 GB/s per port; {_IB_LAT}"),
    LinkType("ib-xdr", "infiniband", 100 * _GIGA, 5.0e-6,
             f"{_REF}: ConnectX-8 SuperNIC 800 Gb/s per port = 100 GB/s per direction (HGX B300 "
             f"and GB300 NVL72: one per GPU); {_IB_LAT}; unvalidated: no XDR collective measured "
             "for autopar"),
    LinkType("roce-100g", "roce", 12.5 * _GIGA, 6.0e-6, f"100 Gb/s line rate = 12.5 GB/s; {_ROCE_LAT}"),
    LinkType("roce-200g", "roce", 25 * _GIGA, 6.0e-6, f"200 Gb/s line rate = 25 GB/s; {_ROCE_LAT}"),
    LinkType("roce-400g", "roce", 50 * _GIGA, 6.0e-6, f"400 Gb/s line rate = 50 GB/s; {_ROCE_LAT}"),
    # AWS EFA, one row per adapter generation (per NIC port, per direction)
    LinkType("efa-v1-100g", "efa", 12.5 * _GIGA, 74.0e-6,
             "AWS p4d/p4de.24xlarge: 4 x 100 Gb/s EFA per node, 400 Gb/s (EC2 accelerated "
             "computing instance specifications; aws-samples/aws-efa-eks README: '4x100 Gbps "
             f"EFA'); 100 Gb/s = 12.5 GB/s per adapter; latency measured: {_EFA_REF}, "
             f"{EFA_LATENCY_SOURCES['efa-v1-100g']}"),
    LinkType("efa-v2-100g", "efa", 12.5 * _GIGA, 28.0e-6,
             "AWS p5/p5e.48xlarge: 32 network cards of 100 Gb/s EFAv2, 3,200 Gb/s per node (EC2 "
             "user guide p5-efa: 'up to 32 network cards ... up to 3,200 Gbps'); 12.5 GB/s per "
             f"adapter; latency measured: {_EFA_REF}, {EFA_LATENCY_SOURCES['efa-v2-100g']}"),
    LinkType("efa-v3-200g", "efa", 25 * _GIGA, 28.0e-6,
             "AWS p5en.48xlarge: 16 x 200 Gb/s EFAv3, 3,200 Gb/s per node (AWS p5en launch; 16 "
             "EFA devices in meta-pytorch/torchx named_resources_aws, PR #995); 25 GB/s per "
             f"adapter; latency {EFA_LATENCY_SOURCES['efa-v3-200g']}"),
    LinkType("roce-800g", "roce", 100 * _GIGA, 6.0e-6, f"800 Gb/s line rate = 100 GB/s; {_ROCE_LAT}"),
    LinkType("eth-25g", "ethernet", 3.125 * _GIGA, 30.0e-6, f"25 Gb/s line rate = 3.125 GB/s; {_ETH_LAT}"),
    LinkType("eth-100g", "ethernet", 12.5 * _GIGA, 30.0e-6, f"100 Gb/s line rate = 12.5 GB/s; {_ETH_LAT}"),
)})


def list_links() -> tuple[str, ...]:
    """Names of every link in the catalog, in catalog order."""
    return tuple(LINKS)


def get_link(name: str | LinkType) -> LinkType:
    """The catalog :class:`LinkType` named ``name`` (case-insensitive); a LinkType is returned as is.

    Raises:
        InvalidClusterSpec: if the name is unknown; the message lists the valid names and the closest.
    """
    if isinstance(name, LinkType):
        return name
    key = str(name).strip().lower()
    if key in LINKS:
        return LINKS[key]
    close = difflib.get_close_matches(key, list(LINKS), n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise InvalidClusterSpec(f"unknown link {name!r}.{hint} Valid links: {', '.join(LINKS)}")
