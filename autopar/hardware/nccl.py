"""What an NCCL collective takes from the compute running beside it: its thread blocks' SMs.

NCCL runs one CUDA thread block (CTA) per channel, and a CTA holds its SM for the whole
collective, waits for peers included; compute kernels do not share that SM (NVIDIA/nccl issue
#689, S. Jeaugey: "NCCL CTAs won't share an SM with compute kernels"; NCCL launches "the
minimal number of SMs to achieve the performance of the platform": 2 on a PCI system with one
NIC, 16 on a DGX with 8 NICs). A compute kernel overlapped with a collective therefore runs on
the SMs left, at ``1 - ctas / sm_count`` of its rate.

CTAs per collective, by the slowest link class the group crosses (NCCL rings span the whole
group, so the network's channel count applies to an inter-node ring):

- network (``infiniband``, ``roce``, ``efa``: aws-ofi-nccl is an NCCL net plugin, so NCCL's
  own channel search applies): two channels per NIC the group's ranks on a node use,
  at least 2 and at most NCCL's 32 (MAXCHANNELS): NCCL's topology search finds one ring per
  NIC and the execution channels are typically twice the search channels (NVIDIA/nccl issue
  #1041, S. Jeaugey), which gives the 16 SMs of a DGX with 8 NICs and the 2 of a one-NIC
  system quoted above. The search channels are a property of the communicator's topology,
  not of the traffic beside it: NCCL sets ``nChannels`` to "the number of channels the graph
  search discovered based on the node topology", then doubles it (NVIDIA/nccl issue #524,
  S. Jeaugey), and an inter-node ring enters and leaves a node through a NIC. So a group uses
  the NICs local to its ranks on a node (:func:`local_nics`: NIC ``j`` of ``n`` sits on the
  PCIe switch of GPUs ``j g / n`` to ``(j + 1) g / n - 1`` of ``g``, as a DGX pairs GPUs and
  NICs), the fewest over the nodes it spans (NCCL keeps the smallest channel count of its
  ranks). A DP group of one GPU per node drives one NIC and takes 2 SMs, not 16; the DP group
  of one TP rank under TP = 2 on 8 GPUs and 4 NICs has a GPU on every NIC's switch and runs
  all 8 channels, though the other TP rank's group shares those NICs' bandwidth
  (:meth:`autopar.hardware.Cluster.fabric` splits the bandwidth, not the channels);
- ``nvlink`` (an NVSwitch node of 8 GPUs): 24, the channels NCCL runs all-reduce with on HGX
  A100 (NVIDIA/nccl-tests issue #100 log: "Channel 23/24"; NVIDIA/nccl issue #1225: "for
  dgxA100, 12 nvlink and 24 cta for allreduce") and on H100 (NVIDIA/nccl issue #1367: 12 search
  rings duplicated to 24 channels);
- ``pcie`` and ``ethernet`` (the socket transport): 2, the one-NIC PCI figure above;
- ``xgmi`` (AMD Infinity Fabric, collectives by RCCL): RCCL's channel count on an 8-GPU xGMI
  mesh is not sourced here; NVLink's 24 is taken. Unvalidated, and inert for the catalog's AMD
  rows, which give no ``sm_count`` (no share is charged).

Cross-check, not a fitted input: 16 / 108 = 15% (A100) and 16 / 132 = 12% (H100) of the SMs
for an inter-node collective, 24 / 108 = 22% over NVLink; Lee et al. 2025 (arXiv 2507.03114,
abstract) measure overlapped compute 18.9% slower on average (up to 40%) than alone on A100,
H100 and MI250; DeepSeek-V3 (arXiv 2412.19437, section 3.2.2) reserves 20 of 132 H800 SMs
(15%) for its all-to-all. HBM traffic of the collective (a few times the link's bandwidth) is
not counted: it is under 5% of HBM bandwidth for a NIC-bound collective.
"""

from __future__ import annotations

import math

from autopar.errors import InvalidClusterSpec

#: NCCL's largest channel count (src/include/device.h MAXCHANNELS = 32).
MAX_CHANNELS = 32
#: Channels (one CTA each) per NIC of the node for a network ring (module docstring).
CHANNELS_PER_NIC = 2
#: Channels (one CTA each) of a collective inside one node, by link class (module docstring).
INTRA_NODE_CTAS = {"nvlink": 24, "pcie": 2, "xgmi": 24}
#: Link classes :func:`collective_ctas` knows (``local`` is a one-rank group: no collective).
LINK_CLASSES = ("local", "nvlink", "pcie", "infiniband", "roce", "efa", "ethernet", "xgmi")
#: Largest share of the SMs a collective is taken to hold (keeps compute progressing).
MAX_SM_SHARE = 0.5
#: GPU architectures whose library GEMMs run a persistent grid of one CTA per SM: Hopper's
#: cuBLAS / CUTLASS 3 kernels size the grid as min(SMs, output tiles) and each CTA loops over its
#: share of the tiles (CUTLASS include/cutlass/gemm/kernel/tile_scheduler_params.h,
#: ``PersistentTileSchedulerSm90Params::get_grid_shape``: ``min(sm_count, problem_blocks_total)``
#: for 1x1 clusters). Ampere's cuBLAS kernels launch one CTA per output tile (many waves).
PERSISTENT_GEMM_ARCHITECTURES = frozenset({"hopper"})


def gemm_share_taken(device, ctas: int) -> float:
    """Share of a persistent GEMM's rate (dimensionless, in [0, :data:`MAX_SM_SHARE`]) lost
    while an NCCL collective holds ``ctas`` of ``device``'s SMs.

    A persistent GEMM (:data:`PERSISTENT_GEMM_ARCHITECTURES`) launches one CTA per SM, each with
    an equal, fixed share of the output tiles; with ``c`` SMs held only ``S - c`` CTAs run at
    once and the rest wait for a second wave, so the GEMM takes ``ceil(S / (S - c))`` times as
    long: a share of ``1 - 1 / ceil(S / (S - c))`` (one half for any 0 < c < S / 2). Measured:
    a cuBLAS GEMM of 132 CTAs on an H100 beside an FSDP-style all-gather of 24 CTAs ran in two
    waves and took nearly twice as long (NVIDIA developer forum, "Compute-Communication Overlap
    Causes Severe GEMM Performance Degradation because of Tail Effect", thread 337991). 0 on
    other architectures (non-persistent GEMMs lose ``ctas / S``:
    :func:`compute_share_taken`), with no collective, or an unknown SM count.
    """
    sms = getattr(device, "sm_count", 0)
    if (ctas <= 0 or sms <= 0 or ctas >= sms
            or getattr(device, "architecture", "") not in PERSISTENT_GEMM_ARCHITECTURES):
        return 0.0
    return min(MAX_SM_SHARE, 1.0 - 1.0 / math.ceil(sms / (sms - ctas)))


def mixed_share(gemm_fraction: float, gemm_share: float, other_share: float) -> float:
    """The single share of :func:`autopar.cost.comm.overlapped_comm` for compute of which
    ``gemm_fraction`` of the seconds (alone) are GEMMs slowed by ``gemm_share`` and the rest by
    ``other_share``: the slowed compute lasts ``f / (1 - g) + (1 - f) / (1 - o)`` times as long,
    so the share is ``1 - 1 / that``.

    Raises:
        ValueError: a fraction outside [0, 1] or a share outside [0, 1).
    """
    if not (0.0 <= gemm_fraction <= 1.0 and 0.0 <= gemm_share < 1.0 and 0.0 <= other_share < 1.0):
        raise ValueError(f"mixed_share needs a fraction in [0, 1] and shares in [0, 1); got "
                         f"{gemm_fraction}, {gemm_share}, {other_share}")
    stretch = gemm_fraction / (1.0 - gemm_share) + (1.0 - gemm_fraction) / (1.0 - other_share)
    return 1.0 - 1.0 / stretch


def local_nics(ranks, gpus_per_node: int, nics_per_node: int) -> int:
    """Compute NICs local to a group's ranks on a node, the fewest over the nodes it spans:
    the NICs its inter-node rings can use, one search channel each (module docstring). Global
    rank ``r`` is GPU ``r % gpus_per_node`` of node ``r // gpus_per_node``; NIC ``j`` is local
    to GPUs ``j g // n`` to ``(j + 1) g // n - 1`` (``g`` GPUs, ``n`` NICs per node; with more
    NICs than GPUs, GPU ``i`` has NICs ``j`` with ``j g // n == i``). 0 when the node has no NIC.

    Raises:
        InvalidClusterSpec: an empty group, or ``gpus_per_node`` < 1 or ``nics_per_node`` < 0.
    """
    if gpus_per_node < 1 or nics_per_node < 0 or not ranks:
        raise InvalidClusterSpec(
            f"local_nics needs ranks, gpus_per_node >= 1 and nics_per_node >= 0; got "
            f"{len(ranks)} ranks, {gpus_per_node}, {nics_per_node}; fix: describe the node")
    g, n = gpus_per_node, nics_per_node
    if n == 0:
        return 0
    per_node: dict[int, set[int]] = {}
    for r in ranks:
        i = r % g
        nics = ({j for j in range(n) if j * g // n == i} if n >= g else {i * n // g})
        per_node.setdefault(r // g, set()).update(nics)
    return min(len(s) for s in per_node.values())


def collective_ctas(link_class: str, nics_used: float) -> int:
    """Thread blocks (= SMs) one NCCL collective holds on each GPU of a group whose slowest
    link is ``link_class`` (as :meth:`autopar.hardware.Cluster.link_class` names it), when the
    group's ranks on one node use ``nics_used`` compute NICs (may be fractional: ranks sharing
    a NIC); 0 for ``"local"``. Sources in the module docstring.

    Raises:
        InvalidClusterSpec: an unknown link class, or a network class with no NIC.
    """
    if link_class not in LINK_CLASSES:
        raise InvalidClusterSpec(
            f"unknown link class {link_class!r}; fix: use one of {list(LINK_CLASSES)}")
    if link_class == "local":
        return 0
    if link_class in INTRA_NODE_CTAS:
        return INTRA_NODE_CTAS[link_class]
    if link_class == "ethernet":
        return INTRA_NODE_CTAS["pcie"]
    if not nics_used > 0:
        raise InvalidClusterSpec(
            f"a {link_class} collective needs a NIC, got {nics_used} NICs in use; "
            "fix: give the cluster nics_per_node >= 1")
    return int(min(MAX_CHANNELS, max(CHANNELS_PER_NIC, round(CHANNELS_PER_NIC * nics_used))))


def compute_share_taken(device, link_class: str, nics_used: float) -> float:
    """Share of ``device``'s SMs (dimensionless, in [0, :data:`MAX_SM_SHARE`]) that an NCCL
    collective over ``link_class`` holds while in flight, its ranks on a node using
    ``nics_used`` NICs: :func:`collective_ctas` /
    :attr:`autopar.hardware.Device.sm_count`; 0 when the device's SM count is not known
    (``sm_count == 0``: no slowdown is charged, an optimistic default).

    Raises:
        InvalidClusterSpec: as :func:`collective_ctas`.
    """
    ctas = collective_ctas(link_class, nics_used)
    sms = getattr(device, "sm_count", 0)
    if ctas == 0 or sms <= 0:
        return 0.0
    return min(MAX_SM_SHARE, ctas / sms)
