"""Per-head query/key norms run on whole heads under tensor parallelism: what the eager part
``tp_replicated_qk_norm`` (:data:`autopar.frameworks.profiles.EAGER_PARTS`) prices.

torchtitan's Qwen3 TP plan before 2025-10-14 wrapped ``attention.q_norm`` and
``attention.k_norm`` in ``NoParallel`` (input layout ``Replicate``): the head-sharded queries and
keys are all-gathered over TP before the norms, the norms and the rotary embedding after them run
on every head on every rank, and backward all-gathers their gradients
(:data:`autopar.frameworks.stacks.torchtitan.QK_NORM_SHARDED_SINCE`).
:func:`autopar.cost.compute.layer_time` prices the ops of :func:`qk_norm_ops` unsharded;
:meth:`autopar.cost.blocks.BlockCosts.block_cost` adds :func:`qk_norm_gather`.
"""

from __future__ import annotations

from ..graph.types import Layer
from ..hardware.collectives import NO_LOAD, LinkLoad


def qk_norm_ops(layer: Layer) -> frozenset[int]:
    """Indices of ``layer``'s per-head query/key norms and the memory-bound ops between them and
    the attention (the rotary embedding): from the first norm inside the tensor-parallel region
    (the column-parallel projections' head-sharded outputs; a block's input norms sit outside
    it) to the attention op. Empty without such a norm."""
    out: list[int] = []
    for i, op in enumerate(layer.ops):
        if op.kind == "attention":
            return frozenset(out)
        if out or (op.kind == "norm" and op.region == "tp"):
            if op.kind not in ("view", "matmul"):
                out.append(i)
    return frozenset()


def whole_head_ops(layer: Layer, tp: int, eager_parts: tuple[str, ...]) -> frozenset[int]:
    """:func:`qk_norm_ops` where they run on whole heads: under tensor parallelism (tp > 1) in a
    framework whose ``eager_parts`` hold "tp_replicated_qk_norm"; else empty."""
    if tp > 1 and "tp_replicated_qk_norm" in eager_parts:
        return qk_norm_ops(layer)
    return frozenset()


def qk_norm_bytes(layer: Layer) -> float:
    """Bytes of the queries and keys that ``layer``'s per-head norms take (their outputs, the
    graph's micro-batch, whole heads): what TP all-gathers before norms run replicated."""
    ops = layer.ops
    return float(sum(ops[i].bytes_written for i in qk_norm_ops(layer) if ops[i].kind == "norm"))


def qk_norm_gather(layer: Layer, tp_group, micro_batch: float, cp: int
                   ) -> tuple[float, LinkLoad]:
    """(seconds, per-GPU link load) of one pass's all-gather of ``layer``'s queries and keys over
    ``tp_group`` (:class:`autopar.cost.comm.Collectives`), ``micro_batch`` in units of the
    graph's, the sequence split over ``cp``: forward gathers them, backward their gradients
    (DTensor's Shard -> Replicate redistribute; its gradient's way back is the attention's local
    slice). (0, no load) without per-head norms."""
    nbytes = qk_norm_bytes(layer) * micro_batch / cp
    if not nbytes:
        return 0.0, NO_LOAD
    return tp_group.time("all_gather", nbytes), tp_group.load("all_gather", nbytes)
