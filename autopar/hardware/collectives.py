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
  each node, binary tree across nodes; latency 2((m-1) alpha_intra + ceil(log2 N) alpha_inter),
  bandwidth term 2 x nbytes / bw (NCCL's model: tree algbw = busbw / 2). It wins only on
  latency, for small messages over many nodes.
* ``hierarchical`` (groups spanning nodes with >1 member on a node): intra-node reduce-scatter,
  inter-node all-reduce (ring or tree) of the shards between rail peers, intra-node all-gather; for
  all_gather / reduce_scatter the inter-node and intra-node halves of that.
* ``pairwise`` (all_to_all): n-1 exchange rounds (Thakur et al., 2005), NVLink and NIC traffic
  overlapping; ``direct`` (send_recv): one hop.

``collective_time`` returns the fastest applicable algorithm, as NCCL's tuner picks; uneven groups are
costed at their worst node (most members for intra-node terms, fewest for NIC share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from autopar.errors import InvalidParallelConfig

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
    """

    intra_Bps: float
    inter_per_gpu_Bps: float
    intra_latency_s: float
    inter_latency_s: float
    launch_latency_s: float


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
    if op == "all_reduce":
        steps, inter, vol = 2 * (n - 1), 2 * (N - 1), 2 * (n - 1) / n * M
    elif op in ("all_gather", "reduce_scatter"):
        steps, inter, vol = n - 1, N - 1, (n - 1) / n * M
    else:  # broadcast: pipelined chain; across nodes every step is priced as a network step
        steps, inter, vol = n - 1, (n - 1 if N > 1 else 0), M
    alpha = (steps - inter) * f.intra_latency_s + inter * f.inter_latency_s
    return f.launch_latency_s + alpha + vol / _ring_bw(g, f)


def _tree_all_reduce(M: float, g: GroupLayout, f: Fabric) -> float:
    alpha = 2 * ((g.max_per_node - 1) * f.intra_latency_s + math.ceil(math.log2(g.nodes)) * f.inter_latency_s)
    return f.launch_latency_s + alpha + 2 * M / _ring_bw(g, f)


def _hierarchical_parts(op: str, M: float, g: GroupLayout, f: Fabric) -> tuple[float, float, bool]:
    """(seconds inside nodes incl. the launch, seconds between nodes, whether the inter-node
    all-reduce is a tree) of the hierarchical algorithm; the phases run one after another."""
    m, N = g.max_per_node, g.nodes
    node_bw = g.min_per_node * f.inter_per_gpu_Bps
    intra = (m - 1) * f.intra_latency_s + (m - 1) / m * M / f.intra_Bps  # one RS or AG inside the node
    if op == "all_reduce":
        ring = 2 * (N - 1) * f.inter_latency_s + 2 * (N - 1) / N * M / node_bw
        tree = 2 * math.ceil(math.log2(N)) * f.inter_latency_s + 2 * M / node_bw
        return f.launch_latency_s + 2 * intra, min(ring, tree), tree < ring
    inter = (N - 1) * f.inter_latency_s + (N - 1) / N * M / node_bw
    return f.launch_latency_s + intra, inter, False


def _hierarchical(op: str, M: float, g: GroupLayout, f: Fabric) -> float:
    intra_s, inter_s, _ = _hierarchical_parts(op, M, g, f)
    return intra_s + inter_s


def _pairwise_all_to_all(M: float, g: GroupLayout, f: Fabric) -> float:
    n = g.size
    alpha = (n - 1) * (f.inter_latency_s if g.nodes > 1 else f.intra_latency_s)
    intra = (g.max_per_node - 1) / n * M / f.intra_Bps
    inter = (n - g.min_per_node) / n * M / f.inter_per_gpu_Bps if g.nodes > 1 else 0.0
    return f.launch_latency_s + alpha + max(intra, inter)


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
    if op != "broadcast" and g.nodes > 1 and g.max_per_node > 1:
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
        return LinkLoad(self.intra_bytes + other.intra_bytes, self.intra_s + other.intra_s,
                        self.inter_bytes + other.inter_bytes, self.inter_s + other.inter_s)

    def scaled(self, k: float) -> "LinkLoad":
        """The load of ``k`` such collectives."""
        if self is NO_LOAD:
            return self
        return LinkLoad(k * self.intra_bytes, k * self.intra_s, k * self.inter_bytes,
                        k * self.inter_s)

    @property
    def nbytes(self) -> float:
        """Bytes one GPU sends over both link classes."""
        return self.intra_bytes + self.inter_bytes


#: The load of a collective that moves nothing (one rank, zero bytes).
NO_LOAD = LinkLoad()


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
        phases = 2 if op == "all_reduce" else 1
        inter = (2 * M if tree else 2 * (N - 1) / N * M) if op == "all_reduce" else (N - 1) / N * M
        return LinkLoad(phases * (m - 1) / m * M, intra_s, inter / m, inter_s)
    if name == "pairwise":
        intra, inter = (m - 1) / n * M, (n - m) / n * M
    else:   # ring (bus bytes) or tree (2 x nbytes): 1 / m of it leaves the node
        total = 2 * M if name == "tree" else M * bus_factor(op, n)
        intra, inter = total * (m - 1) / m, total / m
    return LinkLoad(intra, seconds if intra > 0 else 0.0, inter, seconds)
