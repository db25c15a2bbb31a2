"""What an NCCL collective takes from the compute running beside it: its thread blocks' SMs.

NCCL runs one CUDA thread block (CTA) per channel, and a CTA holds its SM for the whole
collective, waits for peers included; compute kernels do not share that SM (NVIDIA/nccl issue
#689, S. Jeaugey: "NCCL CTAs won't share an SM with compute kernels"; NCCL launches "the
minimal number of SMs to achieve the performance of the platform": 2 on a PCI system with one
NIC, 16 on a DGX with 8 NICs). A compute kernel overlapped with a collective therefore runs on
the SMs left, at ``1 - ctas / sm_count`` of its rate.

CTAs per collective, by the slowest link class the group crosses (NCCL rings span the whole
group, so the network's channel count applies to an inter-node ring):

- network (``infiniband``, ``roce``): two channels per NIC the group's ranks on a node use,
  at least 2 and at most NCCL's 32 (MAXCHANNELS): NCCL's topology search finds one ring per
  NIC and the execution channels are typically twice the search channels (NVIDIA/nccl issue
  #1041, S. Jeaugey), which gives the 16 SMs of a DGX with 8 NICs and the 2 of a one-NIC
  system quoted above. A group member uses its node's ``nics_per_node / gpus_per_node`` NICs
  (the share the collective model gives it, :meth:`autopar.hardware.Cluster.fabric`), so a
  group of ``k`` ranks per node uses ``k x nics_per_node / gpus_per_node`` of them: a DP group
  of one GPU per node drives one NIC and takes 2 SMs, not 16;
- ``nvlink`` (an NVSwitch node of 8 GPUs): 24, the channels NCCL runs all-reduce with on HGX
  A100 (NVIDIA/nccl-tests issue #100 log: "Channel 23/24"; NVIDIA/nccl issue #1225: "for
  dgxA100, 12 nvlink and 24 cta for allreduce") and on H100 (NVIDIA/nccl issue #1367: 12 search
  rings duplicated to 24 channels);
- ``pcie`` and ``ethernet`` (the socket transport): 2, the one-NIC PCI figure above.

Cross-check, not a fitted input: 16 / 108 = 15% (A100) and 16 / 132 = 12% (H100) of the SMs
for an inter-node collective, 24 / 108 = 22% over NVLink; Lee et al. 2025 (arXiv 2507.03114,
abstract) measure overlapped compute 18.9% slower on average (up to 40%) than alone on A100,
H100 and MI250; DeepSeek-V3 (arXiv 2412.19437, section 3.2.2) reserves 20 of 132 H800 SMs
(15%) for its all-to-all. HBM traffic of the collective (a few times the link's bandwidth) is
not counted: it is under 5% of HBM bandwidth for a NIC-bound collective.
"""

from __future__ import annotations

from autopar.errors import InvalidClusterSpec

#: NCCL's largest channel count (src/include/device.h MAXCHANNELS = 32).
MAX_CHANNELS = 32
#: Channels (one CTA each) per NIC of the node for a network ring (module docstring).
CHANNELS_PER_NIC = 2
#: Channels (one CTA each) of a collective inside one node, by link class (module docstring).
INTRA_NODE_CTAS = {"nvlink": 24, "pcie": 2}
#: Link classes :func:`collective_ctas` knows (``local`` is a one-rank group: no collective).
LINK_CLASSES = ("local", "nvlink", "pcie", "infiniband", "roce", "ethernet")
#: Largest share of the SMs a collective is taken to hold (keeps compute progressing).
MAX_SM_SHARE = 0.5


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
