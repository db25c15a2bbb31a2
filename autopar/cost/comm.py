"""Communication each parallelism issues, counted from the graph, timed on the cluster's links.

TP (Shoeybi et al. 2019; Korthikanti et al. 2022 with SP): per block and micro-batch, one
all-reduce per row-parallel output in forward and one per column-parallel input group in backward;
with SP each all-reduce becomes an all-gather plus a reduce-scatter at the same places (same
volume). Full recomputation repeats the forward ones. The vocabulary-parallel embedding all-reduces
(or reduce-scatters) its output; the head's input is all-gathered with SP.
PP: one send/recv of the stage boundary activation per micro-batch and direction, per chunk
boundary (Narayanan et al. 2021).
DP: gradient all-reduce, or reduce-scatter + all-gather of parameters under ZeRO-1/2; ZeRO-3
all-gathers parameters for forward and backward and reduce-scatters gradients every micro-batch.
CP: ring attention exchanges the K/V shard cp-1 times per block in forward, K/V and their
gradients in backward (Liu et al. 2023), overlapped with the attention of the chunk in hand.

Bytes recorded are **bytes on the wire per GPU**: what one GPU sends (and, in a ring, receives as
much) for a collective whose message is ``nbytes`` in the nccl-tests convention, as a ring
algorithm moves it: 2(n-1)/n x nbytes for all-reduce, (n-1)/n x nbytes for all-gather,
reduce-scatter and all-to-all, nbytes for send/recv (nccl-tests' "bus bytes", the factor of
:func:`autopar.hardware.collectives.bus_factor`). The per-link ledger books them to the links the
algorithm the timing picks really uses (:func:`autopar.hardware.collectives.link_load`): a
hierarchical all-reduce sends most of them over NVLink and a 1/g shard through the NICs, g
being the group's GPUs per node, so a link's bytes over its seconds never exceed its bandwidth.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from ..graph.types import Layer
from ..hardware.collectives import NO_LOAD, LinkLoad, bus_factor


@dataclass
class CommLedger:
    """Bytes on the wire (what one GPU sends) and the seconds each link class carries them, per
    link class, and bytes per parallelism, for one GPU and step.

    Attributes:
        intra, inter: the cluster's link class names (:attr:`autopar.hardware.Cluster.link_classes`),
            where a :class:`LinkLoad`'s intra-node and NIC parts are booked.
    """

    intra: str
    inter: str | None = None
    bytes_by_link: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    seconds_by_link: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    bytes_by_kind: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    kinds_by_link: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def add(self, kind: str, load: LinkLoad, times: float = 1.0) -> None:
        """Record ``times`` x ``load`` (bytes this GPU sends and seconds each link carries
        them) for parallelism ``kind`` ("tp", "dp", ...); links that carry nothing stay out."""
        for link, nbytes, seconds in ((self.intra, load.intra_bytes, load.intra_s),
                                      (self.inter, load.inter_bytes, load.inter_s)):
            if nbytes > 0 or seconds > 0:
                self.bytes_by_link[link] += nbytes * times
                self.seconds_by_link[link] += seconds * times
                if kind not in self.kinds_by_link[link]:
                    self.kinds_by_link[link].append(kind)
        self.bytes_by_kind[kind] += load.nbytes * times


class Collectives:
    """Times collectives on one process group of a cluster, memoised for one cost-model run.

    Args:
        cluster: an :class:`autopar.hardware.Cluster`.
        ranks: the group that prices its dimension (the slowest of the dimension's groups,
            :meth:`autopar.cost.groups.Groups.group`).
    """

    def __init__(self, cluster, ranks: tuple[int, ...]):
        self.cluster = cluster
        self.ranks = tuple(ranks)
        self.size = len(self.ranks)
        self.link = cluster.link_class(self.ranks) if self.size > 1 else "local"
        self._memo: dict[tuple[str, float], float] = {}
        self._loads: dict[tuple[str, float], LinkLoad] = {}

    def time(self, op: str, nbytes: float) -> float:
        """Seconds for ``op`` on ``nbytes`` (nccl-tests size convention); 0 for one rank."""
        if self.size <= 1 or nbytes <= 0:
            return 0.0
        key = (op, float(nbytes))
        t = self._memo.get(key)
        if t is None:
            t = self.cluster.collective_time(op, nbytes, self.ranks)
            self._memo[key] = t
        return t

    def load(self, op: str, nbytes: float) -> LinkLoad:
        """What ``op`` on ``nbytes`` puts on each link class per GPU, bytes and seconds
        (:meth:`autopar.hardware.Cluster.collective_load`); nothing for one rank.

        Raises:
            InvalidParallelConfig: an unknown op.
        """
        if self.size <= 1 or nbytes <= 0:
            return NO_LOAD
        key = (op, float(nbytes))
        hit = self._loads.get(key)
        if hit is None:
            hit = self._loads[key] = self.cluster.collective_load(op, nbytes, self.ranks)
        return hit

    def wire_bytes(self, op: str, nbytes: float) -> float:
        """Bytes one GPU of the group sends for ``op`` on a message of ``nbytes`` (nccl-tests
        convention): ``nbytes`` x :func:`~autopar.hardware.collectives.bus_factor` (ring
        all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n, send/recv 1);
        0 for one rank.

        Raises:
            InvalidParallelConfig: an unknown op.
        """
        if self.size <= 1 or nbytes <= 0:
            return 0.0
        return nbytes * bus_factor(op, self.size)


def mlp_linear_reductions(layer: Layer) -> tuple[float, ...]:
    """Input bytes of the reductions a layer adds when every column-parallel linear after its
    attention core reduces its own input gradient (per micro-batch of the graph, unsharded),
    beyond the one per distinct input that :attr:`Layer.tp_column_inputs` counts.

    A framework whose MLP projections are separate column-parallel modules, each with its own
    backward all-reduce of the input gradient, reduces a gated MLP's input twice: InternEvo
    c18bec9 internlm/model/linear.py ``FeedForward`` builds ``w1`` and ``w2`` as two flash-attn
    ``ColumnParallelLinear`` (flash-attn d2f4324, the submodule InternEvo pins,
    flash_attn/ops/fused_dense.py ``FusedDenseFunc.backward``: ``all_reduce_raw(grad_input)``
    per linear), where Megatron-Core runs one fused ``linear_fc1``. The linears are the layer's
    non-expert column-parallel GEMMs after its last attention op; their input is
    ``bytes_written`` x K / N of the GEMM's (M, K, N), and those reading inputs of one size are
    taken to read one tensor (a gated MLP's gate and up), which the graph already counts once.
    A layer without attention, or with one column GEMM per input, adds nothing.
    """
    last = max((i for i, o in enumerate(layer.ops) if o.kind == "attention"), default=None)
    if last is None:
        return ()
    seen, extra = set(), []
    for o in layer.ops[last + 1:]:
        if (o.kind != "matmul" or o.tp_role != "column" or not o.gemm
                or getattr(o, "moe_role", "") == "expert"):
            continue
        size = float(o.bytes_written) * o.gemm[1] / o.gemm[2]
        if size in seen:
            extra.append(size)
        seen.add(size)
    return tuple(extra)


def tp_layer_comm(layer: Layer, group: Collectives, *, micro_batch: int, cp: int,
                  sequence_parallel: bool,
                  mlp_per_linear: bool = False) -> tuple[float, float, LinkLoad, LinkLoad]:
    """TP communication of one layer per micro-batch: (fwd_s, bwd_s, fwd_load, bwd_load).

    Messages are the unsharded activation sizes (nccl-tests convention) scaled to the
    micro-batch; the loads are bytes on the wire per GPU and seconds per link
    (:meth:`Collectives.load`).
    ``mlp_per_linear``: each column-parallel linear of the MLP reduces its own input gradient
    (:func:`mlp_linear_reductions`; with sequence parallelism, gathers its own input too).
    """
    if group.size <= 1:
        return 0.0, 0.0, NO_LOAD, NO_LOAD
    scale = micro_batch / cp
    fwd = bwd = 0.0
    fb = bb = NO_LOAD
    rows = [r * scale for r in layer.tp_row_outputs]
    cols = [c * scale for c in layer.tp_column_inputs]
    if mlp_per_linear:
        cols += [c * scale for c in mlp_linear_reductions(layer)]
    vocab_out = layer.kind == "embedding" and any(o.tp_role == "vocab" for o in layer.ops)
    head_in = layer.kind == "head" and any(o.tp_role == "vocab" for o in layer.ops)
    if vocab_out:
        rows.append(layer.output_bytes * scale)
    if head_in:
        cols.append(layer.activations.layer_input * scale)
    if sequence_parallel:
        for r in rows:  # forward reduce-scatter, backward all-gather
            fwd += group.time("reduce_scatter", r)
            bwd += group.time("all_gather", r)
            fb += group.load("reduce_scatter", r)
            bb += group.load("all_gather", r)
        for c in cols:  # forward all-gather, backward reduce-scatter
            fwd += group.time("all_gather", c)
            bwd += group.time("reduce_scatter", c)
            fb += group.load("all_gather", c)
            bb += group.load("reduce_scatter", c)
    else:
        for r in rows:
            fwd += group.time("all_reduce", r)
            fb += group.load("all_reduce", r)
        for c in cols:
            bwd += group.time("all_reduce", c)
            bb += group.load("all_reduce", c)
    return fwd, bwd, fb, bb


def split_expert_tp(layer: Layer) -> tuple[Layer, Layer]:
    """``layer`` split into (its TP collectives without the routed experts', the routed experts'
    alone), for MoE parallel folding, where the experts' collectives run over the
    expert-tensor-parallel group instead of the attention's TP group.

    The experts' entries of :attr:`Layer.tp_row_outputs` / :attr:`Layer.tp_column_inputs` are
    found from the ops marked ``moe_role == "expert"``: a row-parallel expert GEMM's output
    (``bytes_written``), a column-parallel one's input (its output scaled by K / N of its
    ``gemm`` (M, K, N) shape; distinct inputs once, as the layer lists them). Each is taken out
    of the layer's lists once (the entry closest in size). A layer without experts returns
    (itself, a layer with no collectives).
    """
    rows, cols = list(layer.tp_row_outputs), list(layer.tp_column_inputs)
    e_rows, e_cols = [], []
    for o in layer.ops:
        if getattr(o, "moe_role", "") != "expert" or not o.gemm:
            continue
        if o.tp_role == "row":
            want, pool, out = float(o.bytes_written), rows, e_rows
        elif o.tp_role == "column":
            want, pool, out = float(o.bytes_written) * o.gemm[1] / o.gemm[2], cols, e_cols
        else:
            continue
        if not pool or (o.tp_role == "column"
                        and any(abs(x - want) <= 1e-6 * want for x in out)):
            continue   # a second GEMM on the same routed input (separate gate and up)
        best = min(range(len(pool)), key=lambda i: abs(pool[i] - want))
        out.append(pool.pop(best))
    return (replace(layer, tp_row_outputs=tuple(rows), tp_column_inputs=tuple(cols)),
            replace(layer, tp_row_outputs=tuple(e_rows), tp_column_inputs=tuple(e_cols)))


def cp_layer_comm(layer: Layer, group: Collectives, *, micro_batch: int, tp: int,
                  attention_fwd_s: float, mode: str = "ring",
                  overlap: float = 1.0, kv_repeat: bool = False) -> tuple[float, float, LinkLoad]:
    """Exposed context-parallel communication of one block: (fwd_s, bwd_s, the load: bytes on
    the wire per GPU and micro-batch, forward + backward, and the seconds the links carry them
    before overlap).

    Modes (sequence split over cp ranks, heads over tp):
      ring: cp - 1 steps each sending this rank's K and V shard to the ring neighbour while the
        attention of the previous shard runs; backward also returns dK, dV (Liu et al. 2023,
        Ring Attention). Hidden up to ``overlap`` of the attention time.
      ulysses: all-to-all of Q, K, V before attention (sequence-sharded -> head-sharded) and of the
        output after it; the same in backward (Jacobs et al. 2023, DeepSpeed-Ulysses). Exposed.
        With ``kv_repeat`` (:attr:`autopar.frameworks.FrameworkProfile.ulysses_kv_repeat`) K and
        V are repeated to the query heads before the all-to-all and cross it at Q's width:
        3 x Q's bytes instead of Q + 2 x the KV heads' (XTuner 0.1.16 dispatch/llama.py
        llama_attn_forward: repeat_kv before flash_attn_wo_mask's all-to-all; backward
        all-to-alls dQ, dK, dV at the same width, then repeat_kv's gradient sums the copies).
      allgather: all-gather of K and V before attention, reduce-scatter of dK and dV in backward
        (Llama 3, Dubey et al. 2024, section 3.3.2). Exposed.
    """
    if group.size <= 1 or layer.attention_heads == 0:
        return 0.0, 0.0, NO_LOAD
    attn = [o for o in layer.ops if o.kind == "attention"]
    cp = group.size
    q_heads, kv = layer.attention_heads, layer.kv_heads
    qkv_bytes = sum(o.bytes_read for o in attn) * micro_batch / tp
    if not attn[0].fused:  # bytes_read of unfused attention also counts its score traffic
        qkv_bytes = sum(o.bytes_written for o in attn) * (q_heads + 2 * kv) / q_heads \
            * micro_batch / tp
    kv_bytes = qkv_bytes * (2 * kv) / (q_heads + 2 * kv)
    out_bytes = qkv_bytes * q_heads / (q_heads + 2 * kv)
    if mode == "ulysses":
        if kv_repeat and 0 < kv < q_heads:   # grouped-query K and V at Q's width
            qkv_bytes = out_bytes * 3
        fwd = group.time("all_to_all", qkv_bytes / cp) + group.time("all_to_all", out_bytes / cp)
        return fwd, fwd, (group.load("all_to_all", qkv_bytes / cp)
                          + group.load("all_to_all", out_bytes / cp)).scaled(2)
    if mode == "allgather":
        fwd = group.time("all_gather", kv_bytes)
        bwd = group.time("reduce_scatter", kv_bytes)
        return fwd, bwd, group.load("all_gather", kv_bytes) + group.load("reduce_scatter", kv_bytes)
    shard = kv_bytes / cp
    step = group.time("send_recv", shard)
    steps = cp - 1
    per_step_compute = overlap * attention_fwd_s / cp
    fwd = max(0.0, steps * (step - per_step_compute))
    bwd = max(0.0, steps * (2 * step - 2.5 * per_step_compute))
    # each step sends the K/V shard forward; backward sends K/V and dK/dV (send/recv: wire = message)
    return fwd, bwd, group.load("send_recv", shard).scaled(steps * 3)


def overlapped_comm(comm_s: float, window_s: float, share: float) -> tuple[float, float]:
    """(exposed seconds, compute-slowdown seconds) of a collective of ``comm_s`` seconds issued
    beside ``window_s`` seconds of compute that would run alone in that time, when compute
    progresses at ``1 - share`` of its rate while the collective is in flight (``share``: the
    SMs its thread blocks hold, :func:`autopar.hardware.nccl.compute_share_taken`).

    Both end at ``max(comm_s, window_s + share x comm_s)`` when the compute outlasts the
    collective (it ran ``comm_s`` seconds at the reduced rate, then the rest alone), else at
    ``comm_s`` (compute finished inside it after ``window_s / (1 - share)`` seconds). The time
    beyond ``window_s`` is split into the slowdown, ``share`` x the seconds compute ran beside
    the collective, and the exposed rest: ``share x min(comm_s, window_s / (1 - share))`` and
    ``max(0, comm_s - window_s / (1 - share))``. With ``share = 0`` this is the ideal overlap
    ``max(0, comm_s - window_s)``; with no window the collective is exposed whole.

    Raises:
        ValueError: a negative time, or ``share`` outside [0, 1).
    """
    if comm_s < 0 or window_s < 0 or not 0.0 <= share < 1.0:
        raise ValueError(f"overlapped_comm needs comm_s, window_s >= 0 and 0 <= share < 1; got "
                         f"{comm_s}, {window_s}, {share}")
    if comm_s == 0.0:
        return 0.0, 0.0
    reach = window_s / (1.0 - share)   # seconds the slowed compute lasts
    return max(0.0, comm_s - reach), share * min(comm_s, reach)
