"""Alpha-beta cost of NCCL-style collectives over a cluster's links; pure functions.

Conventions (as in nccl-tests): ``nbytes`` is the all_reduce buffer, the all_gather *output*, the
reduce_scatter *input*, the all_to_all bytes each rank sends plus keeps, the broadcast buffer, the
send_recv message. Bus bandwidth = algorithm bandwidth (nbytes / time) x :func:`bus_factor`.

Every GPU of the cluster is assumed to run the same-shaped collective in its own group at the same
time (all DP groups reduce together), so a node's NICs are shared: a group with ``m`` members on a node
gets ``m / gpus_per_node`` of that node's NIC bandwidth. This is folded into :class:`Fabric`.

Algorithms (each a sum of a launch latency, per-hop alphas and bytes over the bottleneck bandwidth):

* ``ring``: all_reduce 2(n-1) steps moving 2(n-1)/n x nbytes per rank; all_gather / reduce_scatter n-1
  steps moving (n-1)/n x nbytes; broadcast a pipelined chain of n-1 hops moving nbytes. Of the steps,
  2(N-1) (resp. N-1) cross nodes, N being the nodes spanned (NCCL tuning.cc's latency split). A
  broadcast spanning nodes pays the network latency at every one of its steps: NCCL's tuner
  (src/graph/tuning.cc ``ncclTopoTuneModel``, NVIDIA/nccl at 01afd20 and b647562) prices a
  Broadcast (and Reduce) ring with ``hw = NCCL_HW_NET`` whenever the communicator spans nodes,
  as ``nsteps = nRanks`` steps of ``hwLat[NET][ring][protocol]`` (LL 2.7 us, LL128 4.0 us; the
  Simple protocol takes the tree's chunk latency) unless its rings are duplicates
  (``sameChannels``: one step), where it splits all-reduce and all-gather steps into intra- and
  inter-node ones. autopar takes the per-step branch, at the inter-node link's own latency.
* ``tree`` (all_reduce over several nodes; NCCL does not use it inside one node): chain inside
  each node, binary tree across nodes; bandwidth term 2 x nbytes / (0.92 x bw) (NCCL's model:
  tree algbw = busbw / 2). It wins on latency, for small and medium messages over many nodes.
* **Across nodes, ring and tree are priced as NCCL's tuner prices them** (src/graph/tuning.cc
  ``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime``, NVIDIA/nccl at 5067397; the latency constants
  appear in 2.18.1, d97a32f), for each protocol, the fastest taken, as NCCL picks: LL (half the bus
  bandwidth, capped at ``llMaxBw``, 20.4 GB/s beyond 2 nodes), LL128 (92% of it) and Simple
  (all of it), each with its base latency and per-step hardware latencies (ring Simple: 8.4 us
  + 3.4 us per NVLink step + 14 us per network step, x 1.4 for all-reduce; LL: 6.6 + 1.0 +
  2.7 us). The ring's latency grows with the ranks (NVIDIA/nccl#1712, kiskra-nvidia: "The latency
  of ring increases linearly with the communicator size"). Protocols chosen so: LL up to ~1 MB,
  LL128 to a few hundred MB, Simple beyond (8 nodes of 8 A100). Inside one node the alpha-beta
  terms of the catalog stay (anchored on the measured 8-GPU latency floor, comm_params).
* ``hierarchical`` (all_reduce of groups spanning exactly 2 nodes with >1 member on a node):
  intra-node reduce-scatter, inter-node all-reduce (ring or tree, NCCL-priced) of the shards
  between rail peers, intra-node all-gather. NCCL has no such algorithm (its AllReduce runs
  Ring, Tree, CollNet or NVLS / NVLS-Tree); it stands for NCCL's tree on 2 nodes, whose network
  traffic is the same, M per node and direction: the graph search raises a tree's intra-node
  bandwidth to up to twice its network one "for trees (2 nodes or collnet)"
  (src/graph/search.cc, NVIDIA/nccl since 2.6.4, b221128e) and the tuner prices groups of
  ``nNodes <= 2`` at that intra-node bandwidth (src/graph/tuning.cc, 2.8.3 ``speedIntra``, 5067397
  ``bwIntra``), so a 2-node tree all-reduce moves at about the NICs' speed (sjeaugey,
  NVIDIA/nccl-tests#196: "On two nodes, NCCL uses the tree (or nvlstree) algorithm which can
  indeed go beyond the network bottleneck"). On 3 nodes or more the tuner prices trees at the
  network bandwidth (``bwInter``): a double binary tree's inner node receives and sends 2 x M/2
  per phase, 2M per direction as a ring, where the hierarchical ring of shards would send
  2(N-1)/N x M; so across more than 2 nodes only ring and tree (NCCL-priced) are candidates.
  NCCL has no hierarchical all-gather or reduce-scatter (its AllGather / ReduceScatter
  algorithms are Ring, PAT with one rank per node, and NVLS / CollNet, which need SHARP
  across nodes): those run as one ring over the whole group. PAT
  (NCCL >= 2.23, one rank per node, lower latency for small messages) is not modelled.
* ``pairwise`` (all_to_all): NCCL's all-to-all is a group of a send and a receive per peer,
  and the peers progress at once, 8 per channel over up to 32 channels (src/enqueue.cc,
  src/graph/paths.cc, src/init.cc ``p2pSchedule``; :func:`all_to_all_waves`): one step
  latency per round of peers (one round up to 256 ranks across nodes, one per 8 ranks inside
  an NVLink node), not n-1, and the bytes to node peers (NVLink) and to other nodes (NICs)
  moving at once; ``direct`` (send_recv): one hop.

``collective_time`` returns the fastest applicable algorithm, as NCCL's tuner picks; uneven groups are
costed at their worst node (most members for intra-node terms, fewest for NIC share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from autopar.errors import InvalidParallelConfig
from autopar.frozen import built

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
ALGORITHMS: tuple[str, ...] = ("ring", "tree", "hierarchical", "pairwise", "direct")


@dataclass(frozen=True)
class GroupLayout:
    """Where a process group's ranks sit.

    Attributes:
        size: ranks in the group (n).
        nodes: nodes spanned (N).
        max_per_node / min_per_node: most / fewest members on one spanned node.
        crosses_nodes_p2p: whether any consecutive pair of ranks (send_recv) is on different nodes.
    """

    size: int
    nodes: int
    max_per_node: int
    min_per_node: int
    crosses_nodes_p2p: bool


@dataclass(frozen=True)
class Fabric:
    """Effective per-GPU figures one group sees (efficiency and NIC sharing applied).

    Attributes:
        intra_Bps: bytes/s per GPU inside a node.
        inter_per_gpu_Bps: bytes/s per group member through the node's NICs.
        intra_latency_s / inter_latency_s: per-hop alpha inside / between nodes, seconds.
        launch_latency_s: fixed cost per collective call, seconds.
        intra_hw: ``"nvlink"`` or ``"pci"``: which row of NCCL's hardware latencies the
            intra-node steps of a collective spanning nodes take (:data:`NCCL_HW_LATENCY_US`).
        p2p_channels: NCCL's ``p2pnChannels``, the channels send/recv operations spread over
            (:func:`all_to_all_waves`): the communicator's channels rounded up to a power of 2,
            at most 32 (src/graph/paths.cc ``ncclTopoComputeP2pChannels``).
        p2p_channels_per_peer: NCCL's ``p2pnChannelsPerPeer`` before it is lowered for many
            peers: for a peer on another node, ``max(NICs local to the GPU, ceil(their GB/s /
            14))`` rounded up to a power of 2 (src/graph/paths.cc ``ncclTopoGetNchannels``,
            ``NCCL_P2P_PER_CHANNEL_NET_BW`` 14 GB/s; ``ncclTopoComputeP2pChannels``).
    """

    intra_Bps: float
    inter_per_gpu_Bps: float
    intra_latency_s: float
    inter_latency_s: float
    launch_latency_s: float
    intra_hw: str = "nvlink"
    p2p_channels: int = 32
    p2p_channels_per_peer: int = 4


@lru_cache(maxsize=65536)
def layout_of(ranks: tuple[int, ...], gpus_per_node: int) -> GroupLayout:
    """The :class:`GroupLayout` of ``ranks`` (global ranks; rank r is on node r // gpus_per_node)."""
    counts: dict[int, int] = {}
    for r in ranks:
        counts[r // gpus_per_node] = counts.get(r // gpus_per_node, 0) + 1
    crosses = any(a // gpus_per_node != b // gpus_per_node for a, b in zip(ranks, ranks[1:]))
    return GroupLayout(len(ranks), len(counts), max(counts.values()), min(counts.values()), crosses)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all
    (n-1)/n; broadcast, send_recv 1.

    Raises:
        InvalidParallelConfig: for an unknown op.
    """
    check_op(op)
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def check_op(op: str) -> None:
    """Raise InvalidParallelConfig naming the valid ops if ``op`` is not one of :data:`OPS`."""
    if op not in OPS:
        raise InvalidParallelConfig(f"unknown collective {op!r}; use one of {list(OPS)}")


def _ring_bw(g: GroupLayout, f: Fabric) -> float:
    """Bottleneck bytes/s of a ring: the NVLink/PCIe hop, or the NICs of the worst-served node."""
    if g.nodes == 1:
        return f.intra_Bps
    node_bw = g.min_per_node * f.inter_per_gpu_Bps
    return min(f.intra_Bps, node_bw) if g.max_per_node > 1 else node_bw


def _ring(op: str, M: float, g: GroupLayout, f: Fabric) -> float:
    n, N = g.size, g.nodes
    if N > 1 and op != "broadcast":
        return _net_ring(op, M, g, f, _ring_bw(g, f))
    if op == "all_reduce":
        steps, inter, vol = 2 * (n - 1), 2 * (N - 1), 2 * (n - 1) / n * M
    elif op in ("all_gather", "reduce_scatter"):
        steps, inter, vol = n - 1, N - 1, (n - 1) / n * M
    else:  # broadcast: pipelined chain; across nodes every step is priced as a network step
        steps, inter, vol = n - 1, (n - 1 if N > 1 else 0), M
    alpha = (steps - inter) * f.intra_latency_s + inter * f.inter_latency_s
    return f.launch_latency_s + alpha + vol / _ring_bw(g, f)


def _tree_all_reduce(M: float, g: GroupLayout, f: Fabric) -> float:
    return _net_tree(M, g, f, _ring_bw(g, f))


# ------------------------------------------------------------------ NCCL's tuner across nodes
#: NCCL's protocols, in the order of its tables: LL (8-byte lines, 4 of data and a flag),
#: LL128 (128-byte lines, 120 of data), Simple (bulk copies with a fence per step).
PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")
#: NCCL's tuner constants, NVIDIA/nccl src/graph/tuning.cc ``ncclTunerConstantsDefaults``
#: (at 5067397, 2026-06; the strings appear in 2.18.1, d97a32f): ``baseLatencies`` in us per
#: algorithm, (LL, LL128, Simple).
NCCL_BASE_LATENCY_US: dict[str, tuple[float, float, float]] = {
    "tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
#: ``hwLatencies`` in us: the per-step latency by the hardware a step crosses (NVLink, PCI,
#: the network) and algorithm, (LL, LL128, Simple).
NCCL_HW_LATENCY_US: dict[str, dict[str, tuple[float, float, float]]] = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
#: ``getNetOverhead``: the network post overhead, 1 us on Intel x86 and by default (2 us on
#: AMD); an inter-node ring's intra-node steps cost at least that, 3x under Simple.
NCCL_NET_OVERHEAD_US = 1.0
#: ``llMaxBws`` (GB/s, x86 Intel rows): LL's bus bandwidth cap across 2 nodes / more nodes.
NCCL_LL_MAX_BUSBW_Bps: tuple[float, float] = (39.0e9, 20.4e9)
#: Ring bus-bandwidth share per protocol (tuning.cc "Various model refinements": LL
#: ``busBw * .5``, LL128 ``busBw * 0.92 /*120.0/128.0*/``, Simple the whole).
NCCL_RING_PROTOCOL_BW: tuple[float, float, float] = (0.5, 0.92, 1.0)
#: Tree all-reduce: ``busBw * .92`` for all protocols, then LL ``/ 3.8``, LL128 ``* 120/128``
#: across nodes; a tree's algorithm bandwidth is half its bus bandwidth (``ratio *= .5``).
NCCL_TREE_BW = 0.92
NCCL_TREE_PROTOCOL_BW: tuple[float, float, float] = (1 / 3.8, 120.0 / 128.0, 1.0)
#: ``ncclTopoGetAlgoTime``: a ring Simple all-reduce across nodes pays its latency x 1.4
#: (compute capability >= 8.0; "Plateau effect of ring").
NCCL_RING_SIMPLE_AR_PLATEAU = 1.4
#: ``treeCorrectionFactor[protocol][log2(nBytes / 64)]``, 64 B to 256 MB: the tree's bandwidth
#: by message size ("Trees are not perfectly sticking to the model for medium sizes").
NCCL_TREE_CORRECTION: tuple[tuple[float, ...], ...] = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0,
     1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0,
     1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9,
     .9),
)
#: The per-hop network latency NCCL's NET constants stand for (the catalog's InfiniBand row);
#: a slower network (the socket transport) adds its excess, as NCCL adds the graph's
#: ``latencyInter`` to ``interLat``.
NET_BASE_HOP_S = 5.0e-6


#: The only node count at which an all-reduce is offered the hierarchical algorithm, NCCL's
#: 2-node tree (module docstring: search.cc / tuning.cc, nccl-tests#196).
HIERARCHICAL_NODES = 2


def _log2i(x: int) -> int:
    """NCCL's ``log2i``: floor(log2(x)), 0 for x < 2."""
    return max(int(x).bit_length() - 1, 0)


def _ll_cap(N: int) -> float:
    return NCCL_LL_MAX_BUSBW_Bps[0 if N <= 2 else 1]


def _net_extra_s(f: Fabric) -> float:
    return max(0.0, f.inter_latency_s - NET_BASE_HOP_S)


def net_ring_protocol_times(op: str, M: float, g: GroupLayout, f: Fabric,
                            bw: float) -> tuple[tuple[str, float], ...]:
    """Seconds of a ring ``op`` (all_reduce, all_gather, reduce_scatter) on ``M`` bytes over a
    group spanning nodes, per NCCL protocol, as NCCL's tuner prices them
    (src/graph/tuning.cc ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``): base latency +
    (steps - network steps) x intra-node step latency (at least the network post overhead,
    3x under Simple) + network steps x network step latency (the tree's when the group has one
    rank per node: "With ppn=1 latencies are fully exposed") + bus bytes / the protocol's share
    of the ring's bus bandwidth ``bw`` (LL also capped at ``llMaxBw``); Simple all-reduce pays
    its latency x 1.4. Steps: 2(n-1) for all-reduce, n-1 otherwise, of which 2(N-1) resp.
    N-1 cross nodes. LL128 needs NVLink inside the node (``typeIntra <= PATH_NVB``).
    """
    n, N = g.size, g.nodes
    if op == "all_reduce":
        steps, inter, vol = 2 * (n - 1), 2 * (N - 1), 2 * (n - 1) / n * M
    else:
        steps, inter, vol = n - 1, N - 1, (n - 1) / n * M
    net_row = NCCL_HW_LATENCY_US["net"]["tree" if g.max_per_node == 1 else "ring"]
    extra = _net_extra_s(f)
    out = []
    for i, proto in enumerate(PROTOCOLS):
        if proto == "LL128" and f.intra_hw != "nvlink":
            continue
        intra = max(NCCL_HW_LATENCY_US[f.intra_hw]["ring"][i],
                    NCCL_NET_OVERHEAD_US * (3 if proto == "Simple" else 1))
        lat = (NCCL_BASE_LATENCY_US["ring"][i] + (steps - inter) * intra
               + inter * net_row[i]) * 1e-6 + inter * extra
        if op == "all_reduce" and proto == "Simple":
            lat *= NCCL_RING_SIMPLE_AR_PLATEAU
        pbw = bw * NCCL_RING_PROTOCOL_BW[i]
        if proto == "LL":
            pbw = min(pbw, _ll_cap(N))
        out.append((proto, lat + vol / pbw))
    return tuple(out)


def net_tree_protocol_times(M: float, g: GroupLayout, f: Fabric,
                            bw: float) -> tuple[tuple[str, float], ...]:
    """Seconds of NCCL's tree all-reduce on ``M`` bytes over a group spanning nodes, per
    protocol (tuning.cc): base latency + 2((ranks per node - 1) x the intra-node tree step +
    floor(log2 N) x the network tree step) + 2M / (bus bandwidth x 0.92 x the protocol's
    share, LL capped at ``llMaxBw``, x the size's tree correction factor)."""
    m, N = g.max_per_node, g.nodes
    extra = _net_extra_s(f)
    log_size = _log2i(int(M) >> 6) if M >= 64 else -1
    out = []
    for i, proto in enumerate(PROTOCOLS):
        if proto == "LL128" and f.intra_hw != "nvlink":
            continue
        lat = (NCCL_BASE_LATENCY_US["tree"][i] + 2 * (
            (m - 1) * NCCL_HW_LATENCY_US[f.intra_hw]["tree"][i]
            + _log2i(N) * NCCL_HW_LATENCY_US["net"]["tree"][i])) * 1e-6 + 2 * _log2i(N) * extra
        bus = bw * NCCL_TREE_BW * NCCL_TREE_PROTOCOL_BW[i]
        if proto == "LL":
            bus = min(bus, _ll_cap(N))
        if 0 <= log_size < 23:
            bus *= NCCL_TREE_CORRECTION[i][log_size]
        out.append((proto, lat + 2 * M / bus))
    return tuple(out)


def _net_ring(op: str, M: float, g: GroupLayout, f: Fabric, bw: float) -> float:
    return min(t for _, t in net_ring_protocol_times(op, M, g, f, bw))


def _net_tree(M: float, g: GroupLayout, f: Fabric, bw: float) -> float:
    return min(t for _, t in net_tree_protocol_times(M, g, f, bw))


def _hierarchical_parts(op: str, M: float, g: GroupLayout, f: Fabric) -> tuple[float, float, bool]:
    """(seconds inside nodes incl. the launch, seconds between nodes, whether the inter-node
    all-reduce is a tree) of the hierarchical all-reduce; the phases run one after another.
    The inter-node phase is a ring or tree between rail peers (one rank per node), priced as
    NCCL's tuner prices those (:func:`net_ring_protocol_times`, :func:`net_tree_protocol_times`)."""
    m, N = g.max_per_node, g.nodes
    node_bw = g.min_per_node * f.inter_per_gpu_Bps
    intra = (m - 1) * f.intra_latency_s + (m - 1) / m * M / f.intra_Bps  # one RS or AG inside the node
    # m rail groups of one rank per node, each all-reducing its 1/m shard at 1/m of the NICs
    rails = GroupLayout(N, N, 1, 1, True)
    ring = _net_ring("all_reduce", M / m, rails, f, node_bw / m)
    tree = _net_tree(M / m, rails, f, node_bw / m)
    return f.launch_latency_s + 2 * intra, min(ring, tree), tree < ring


def _hierarchical(op: str, M: float, g: GroupLayout, f: Fabric) -> float:
    intra_s, inter_s, _ = _hierarchical_parts(op, M, g, f)
    return intra_s + inter_s


#: Send/recv operations one channel's thread block runs at once, one per warp group, each to a
#: different peer: NVIDIA/nccl src/include/device.h ``NCCL_MAX_DEV_WORK_P2P_PER_BATCH`` (8;
#: 2.8 release notes: "Increase send/recv parallelism by 8x, each warp sending or receiving
#: to a different peer").
P2P_PER_BATCH = 8
#: Most p2p channels: src/graph/paths.cc ``NCCL_MAX_P2P_NCHANNELS`` default ``MAXCHANNELS`` (32).
MAX_P2P_CHANNELS = 32


def all_to_all_waves(g: GroupLayout, f: Fabric) -> int:
    """Rounds of peers an NCCL all-to-all (``ncclGroupStart``, a ``ncclSend`` and ``ncclRecv``
    per peer, ``ncclGroupEnd``) runs one after another; every peer of a round is in flight at
    once, so the all-to-all pays one step latency per round, not one per peer.

    NVIDIA/nccl at 5067397: ``init.cc`` orders the peers (``p2pSchedule``, node by node); a
    channel's thread block runs up to :data:`P2P_PER_BATCH` of them at once (one work batch,
    ``enqueue.cc`` ``ncclAddWorkBatchToPlan``: a batch holds one group of 8 consecutive rounds)
    and its batches in turn; ``channel.h`` ``ncclP2pChannelBaseForRound`` puts each group of 8
    rounds on its own base channel and ``device.h`` ``ncclP2pChannelForPart`` stripes a peer's
    bytes over ``p2pnChannelsPerPeer`` channels from there. Across nodes
    ``paths.cc`` ``ncclTopoComputeP2pChannels`` halves the channels per peer (down to 1) until
    ``channelsPerPeer x ceil(n / 8) <= p2pnChannels``, "to fit all the peers within a single
    round": ``ceil(ceil(n / 8) / p2pnChannels)`` rounds (1 up to 8 x 32 = 256 ranks). Inside
    one NVLink node a peer takes every channel (``ncclTopoGetNchannels``: 2 per NVLink of the
    path, capped at ``p2pnChannels``), so each group of 8 peers is a round: ``ceil(n / 8)``.
    ``p2pnChannels`` is :attr:`Fabric.p2p_channels`."""
    groups = -(-g.size // P2P_PER_BATCH)
    if g.nodes == 1:
        return groups
    return -(-groups // max(1, f.p2p_channels))


#: Bytes of one network step of a send/recv (Simple protocol): src/init.cc
#: ``NCCL_P2P_NET_CHUNKSIZE`` default 128 KiB (``computeBuffSizes``, communicators spanning nodes).
P2P_NET_CHUNK_BYTES = 128 * 1024
#: Per-channel bytes up to which a send/recv uses the LL protocol: src/enqueue.cc
#: ``NCCL_P2P_LL_THRESHOLD`` default 16 KiB (``addP2pToPlan``: LL when bytes <= nChannels x it).
P2P_LL_THRESHOLD_BYTES = 16 * 1024


def _pow2_down_halving(c: int, limit: int, groups: int) -> int:
    while c * groups > limit and c > 1:
        c //= 2
    return c


def p2p_net_parts(peer_bytes: float, g: GroupLayout, f: Fabric) -> int:
    """Channels one send (or receive) of ``peer_bytes`` to a peer on another node is split over
    in an all-to-all of the group ``g`` (each part is its own network connection).

    NVIDIA/nccl at 5067397: ``paths.cc`` ``ncclTopoComputeP2pChannels`` starts from
    ``p2pnChannelsPerPeer`` (:attr:`Fabric.p2p_channels_per_peer`) and halves it until
    ``it x ceil(n / 8) <= p2pnChannels``; ``enqueue.cc`` ``scheduleP2pTasksToPlan`` halves a
    minimum from it until ``it x n <= p2pnChannels``, and ``addP2pToPlan`` takes
    ``min(minimum, ceil(bytes / (chunk / 2)))`` parts, doubling them (up to the per-peer
    channels) while a part holds more than one chunk (:data:`P2P_NET_CHUNK_BYTES`).
    """
    n = g.size
    c_max = _pow2_down_halving(max(1, f.p2p_channels_per_peer), f.p2p_channels,
                               -(-n // P2P_PER_BATCH))
    c_min = _pow2_down_halving(c_max, f.p2p_channels, n)
    if peer_bytes <= 0:
        return 1
    b = max(1, math.ceil(peer_bytes))
    min_part, max_part = P2P_NET_CHUNK_BYTES // 2, P2P_NET_CHUNK_BYTES
    parts = max(1, min(c_min, -(-b // min_part)))
    size = max(min_part, -(-b // parts))
    while size > max_part and parts <= c_max // 2:
        parts *= 2
        size = -(-b // parts)
    return parts


def all_to_all_net_posts_s(M: float, g: GroupLayout, f: Fabric) -> float:
    """Seconds the GPU's proxy thread spends launching the first network operation of every
    connection of an all-to-all of ``M`` bytes (nccl-tests size) over a group spanning nodes;
    0 inside one node (NVLink / PCIe peers need no proxy).

    Each GPU has one proxy progress thread ("NCCL Progress", src/proxy.cc
    ``ncclProxyProgress``) that posts every network send and receive. A rank on the
    worst-served node (``g.min_per_node`` members) has ``n - min_per_node`` peers on other
    nodes, each a send and a receive split over :func:`p2p_net_parts` connections, so
    ``2 x (n - m) x parts`` first posts before the last peer's bytes can move. Each is priced at
    NCCL's own per-post cost: ``tuning.cc`` ``getNetOverhead`` (1 us on Intel x86, 2 on AMD;
    :data:`NCCL_NET_OVERHEAD_US`), x3 under the Simple protocol (``ncclTopoTuneModel``:
    "Inter-node rings still have to launch nsteps * net overhead", ``netOverhead *= 3`` for
    Simple); a peer's send is LL up to 16 KiB per part (:data:`P2P_LL_THRESHOLD_BYTES`).
    Later chunks of a connection are posted while earlier ones are on the wire and are not
    counted."""
    if g.nodes == 1:
        return 0.0
    peer = M / g.size
    parts = p2p_net_parts(peer, g, f)
    simple = peer > parts * P2P_LL_THRESHOLD_BYTES
    posts = 2 * (g.size - g.min_per_node) * parts
    return posts * NCCL_NET_OVERHEAD_US * (3 if simple else 1) * 1e-6


def _pairwise_all_to_all(M: float, g: GroupLayout, f: Fabric) -> float:
    """Launch + :func:`all_to_all_waves` x the step latency of the slowest link (the network
    across nodes) + the proxy's first posts (:func:`all_to_all_net_posts_s`) + the slower of
    the bytes to node peers over the intra-node link and the bytes to other nodes through the
    NICs (both move at once)."""
    n = g.size
    alpha = all_to_all_waves(g, f) * (f.inter_latency_s if g.nodes > 1 else f.intra_latency_s)
    intra = (g.max_per_node - 1) / n * M / f.intra_Bps
    inter = (n - g.min_per_node) / n * M / f.inter_per_gpu_Bps if g.nodes > 1 else 0.0
    return f.launch_latency_s + alpha + all_to_all_net_posts_s(M, g, f) + max(intra, inter)


def _direct_send_recv(M: float, g: GroupLayout, f: Fabric) -> float:
    if g.crosses_nodes_p2p:
        return f.launch_latency_s + f.inter_latency_s + M / f.inter_per_gpu_Bps
    return f.launch_latency_s + f.intra_latency_s + M / f.intra_Bps


@lru_cache(maxsize=65536)
def algorithm_times(op: str, nbytes: float, g: GroupLayout, f: Fabric) -> tuple[tuple[str, float], ...]:
    """Seconds per applicable algorithm for one collective, as ``((name, seconds), ...)``.

    A group of one rank, or zero bytes, costs 0 s under every algorithm listed.

    Raises:
        InvalidParallelConfig: for an unknown op or negative ``nbytes``.
    """
    check_op(op)
    if nbytes < 0:
        raise InvalidParallelConfig(f"nbytes must be >= 0, got {nbytes}")
    if g.size == 1 or nbytes == 0:
        return (("direct", 0.0),)
    if op == "all_to_all":
        return (("pairwise", _pairwise_all_to_all(nbytes, g, f)),)
    if op == "send_recv":
        return (("direct", _direct_send_recv(nbytes, g, f)),)
    out = [("ring", _ring(op, nbytes, g, f))]
    if op == "all_reduce" and g.nodes > 1:
        out.append(("tree", _tree_all_reduce(nbytes, g, f)))
    if op == "all_reduce" and g.nodes == HIERARCHICAL_NODES and g.max_per_node > 1:
        out.append(("hierarchical", _hierarchical(op, nbytes, g, f)))
    return tuple(out)


def collective_seconds(op: str, nbytes: float, g: GroupLayout, f: Fabric, algorithm: str = "auto") -> float:
    """Seconds for ``op`` on ``nbytes`` with the fastest algorithm (``"auto"``) or the one named.

    Raises:
        InvalidParallelConfig: for an unknown op, negative bytes, or an algorithm that does not apply
            to this op and group (the message lists those that do).
    """
    times = dict(algorithm_times(op, nbytes, g, f))
    if algorithm == "auto":
        return min(times.values())
    if algorithm in times:
        return times[algorithm]
    if len(times) == 1 and "direct" in times and times["direct"] == 0.0 and algorithm in ALGORITHMS:
        return 0.0
    raise InvalidParallelConfig(
        f"algorithm {algorithm!r} does not apply to {op} over {g.size} ranks on {g.nodes} node(s); "
        f"use 'auto' or one of {sorted(times)}"
    )


@dataclass(frozen=True)
class LinkLoad:
    """What one collective puts on each link class, per GPU of the group.

    Attributes:
        intra_bytes / inter_bytes: bytes one GPU sends over the intra-node link / through its
            node's NICs (the group's average GPU), under the algorithm the timing picks.
        intra_s / inter_s: seconds that link carries the collective. Phases that run one after
            another (hierarchical) split the collective's time; pipelined ones (ring, tree,
            pairwise) keep both links busy for all of it, so the two may sum to more than the
            collective's seconds. Bytes / seconds never exceeds the link's per-GPU bandwidth.
    """

    intra_bytes: float = 0.0
    intra_s: float = 0.0
    inter_bytes: float = 0.0
    inter_s: float = 0.0

    def __add__(self, other: "LinkLoad") -> "LinkLoad":
        # most per-layer loads are empty (no TP, CP or EP group): adding zeros changes nothing
        if other is NO_LOAD:
            return self
        if self is NO_LOAD:
            return other
        return _link_load(self.intra_bytes + other.intra_bytes, self.intra_s + other.intra_s,
                          self.inter_bytes + other.inter_bytes, self.inter_s + other.inter_s)

    def scaled(self, k: float) -> "LinkLoad":
        """The load of ``k`` such collectives."""
        if self is NO_LOAD:
            return self
        return _link_load(k * self.intra_bytes, k * self.intra_s, k * self.inter_bytes,
                          k * self.inter_s)

    @property
    def nbytes(self) -> float:
        """Bytes one GPU sends over both link classes."""
        return self.intra_bytes + self.inter_bytes


#: The load of a collective that moves nothing (one rank, zero bytes).
NO_LOAD = LinkLoad()


def _link_load(intra_bytes: float, intra_s: float, inter_bytes: float,
               inter_s: float) -> LinkLoad:
    """``LinkLoad(...)``, built at once (:func:`autopar.frozen.built`): a search sums tens of
    thousands of loads."""
    return built(LinkLoad, intra_bytes=intra_bytes, intra_s=intra_s, inter_bytes=inter_bytes,
                 inter_s=inter_s)


def link_load(op: str, nbytes: float, g: GroupLayout, f: Fabric) -> LinkLoad:
    """The :class:`LinkLoad` of ``op`` on ``nbytes`` under the fastest algorithm (the one
    :func:`collective_seconds` times with ``"auto"``).

    With ``m = n / N`` members per node on average, per GPU: a ring sends its bus bytes
    (``nbytes`` x :func:`bus_factor`), ``1 / m`` of them through the NICs (one of each node's
    ``m`` ring edges leaves the node); a tree all-reduce sends 2 x ``nbytes``, ``1 / m`` of it
    through the NICs; hierarchical sends ``(m-1)/m`` x ``nbytes`` over the intra-node link per
    reduce-scatter or all-gather inside the node and the inter-node part on a ``1 / m`` shard;
    pairwise all-to-all sends ``(m-1)/n`` x ``nbytes`` to node peers and the rest,
    ``(n-m)/n`` x ``nbytes``, through the NICs; send/recv sends ``nbytes`` over the hop's link.
    Derivation and sources: the module docstring and docs/cost-model.md.

    Raises:
        InvalidParallelConfig: for an unknown op or negative ``nbytes``.
    """
    times = algorithm_times(op, nbytes, g, f)
    name, seconds = min(times, key=lambda kv: kv[1])
    if seconds == 0.0:
        return NO_LOAD
    M, n, N = nbytes, g.size, g.nodes
    if name == "direct":   # send_recv: one hop, inside or between nodes
        return LinkLoad(inter_bytes=M, inter_s=seconds) if g.crosses_nodes_p2p else \
            LinkLoad(intra_bytes=M, intra_s=seconds)
    if N == 1:
        return LinkLoad(intra_bytes=M * bus_factor(op, n), intra_s=seconds)
    m = n / N
    if name == "hierarchical":
        intra_s, inter_s, tree = _hierarchical_parts(op, M, g, f)
        inter = 2 * M if tree else 2 * (N - 1) / N * M
        return LinkLoad(2 * (m - 1) / m * M, intra_s, inter / m, inter_s)
    if name == "pairwise":
        intra, inter = (m - 1) / n * M, (n - m) / n * M
    else:   # ring (bus bytes) or tree (2 x nbytes): 1 / m of it leaves the node
        total = 2 * M if name == "tree" else M * bus_factor(op, n)
        intra, inter = total * (m - 1) / m, total / m
    return LinkLoad(intra, seconds if intra > 0 else 0.0, inter, seconds)
