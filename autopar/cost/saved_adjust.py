"""Bytes a block keeps for backward beyond (or short of) what its traced graph saved, where a
framework keeps its tensors otherwise: the routed tokens of a MoE layer and Megatron-Core's
conventions for them, FP8 copies of Linear inputs, and a loss computed in sequence chunks.
Each returns bytes per micro-batch on one rank (:mod:`autopar.cost.memory` adds them up);
the sources are in each function's docstring.
"""

from __future__ import annotations

from ..graph.types import Layer


def routed_saved_bytes(layer: Layer, *, micro_batch: float, tp: int, cp: int,
                       etp: int | None = None) -> float:
    """Bytes the routed expert GEMMs of ``layer`` save for backward per micro-batch on one rank,
    at dropless routing (0 for a layer without experts).

    What scales with the rows each expert runs (:func:`autopar.cost.capacity.routed_scale`):
    the routed input the first (column) expert GEMMs share and weight-gradient from, saved once;
    their outputs, which the gated activation saves (Megatron-Core's fused ``bias_swiglu``,
    :class:`autopar.graph.kernels.FusedGLUMeta`); and the input of the last (row) expert GEMM.
    The shared input holds the expert-TP group's rows (etp / tp of an attention-TP group's,
    all-gathered after the dispatch: Megatron-Core MoEAlltoAllTokenDispatcher), the others are
    split over the etp ranks as well (/ tp in all). ``etp`` None = tp.
    """
    etp = etp or tp
    shared_in = out = 0.0
    for o in layer.ops:
        if o.moe_role != "expert" or not o.gemm:
            continue
        _, k, n = o.gemm
        if o.tp_role == "column":
            shared_in = max(shared_in, o.bytes_written * k / n)
            out += o.bytes_written
        elif o.tp_role == "row":
            out += o.bytes_written * k / n
    return (shared_in * etp / tp + out / tp) * micro_batch / cp


def fp8_input_delta(layer: Layer, *, input_bytes: int | None, shared_bytes: int | None,
                    dtype_bytes: int, micro_batch: float, tp: int, cp: int,
                    sequence_parallel: bool, expert_glu_bytes: int | None = None) -> float:
    """Bytes one layer keeps per micro-batch beyond (positive) or short of (negative) the
    graph's count when its Linear ops keep FP8 copies of their inputs
    (:attr:`autopar.frameworks.MemoryConventions.fp8_input_saved_bytes` and
    ``fp8_shared_input_saved_bytes``, bytes per element; None keeps the graph's count): the
    inputs only Linear ops keep (:attr:`autopar.graph.types.ActivationBytes.linear_seq`,
    ``linear_tp``) cost ``input_bytes`` per element in place of ``dtype_bytes``, those another
    op keeps too (``linear_shared_seq``, ``linear_shared_tp``) ``shared_bytes``; the routed
    experts' gated-unit inputs (the output of each column expert GEMM, which the fused gated
    activation keeps; ``fp8_expert_glu_input_saved_bytes``) ``expert_glu_bytes``. Sharded as
    the graph counts them ("seq" by t only with sequence parallelism, "tp" by t), scaled by
    ``micro_batch`` (in units of the graph's micro-batch) / cp. A recompute mode that drops
    an input drops its delta with it (the caller applies this to what the mode keeps)."""
    a = layer.activations
    seq_div = tp if sequence_parallel else 1
    delta = 0.0
    for per_element, seq, tpb in ((input_bytes, a.linear_seq, a.linear_tp),
                                  (shared_bytes, a.linear_shared_seq, a.linear_shared_tp)):
        if per_element is not None:
            delta += (per_element / dtype_bytes - 1.0) * (seq / seq_div + tpb / tp)
    if expert_glu_bytes is not None:
        glu_in = sum(o.bytes_written for o in layer.ops
                     if o.moe_role == "expert" and o.gemm and o.tp_role == "column")
        delta += (expert_glu_bytes / dtype_bytes - 1.0) * glu_in / tp
    return delta * micro_batch / cp


def chunked_loss_bytes(layer: Layer, *, chunks: int, loss_saved_bytes: int,
                       loss_work_bytes: int, kept_extra: float, micro_batch: float, tp: int,
                       cp: int, sequence_parallel: bool) -> tuple[float, float]:
    """(kept, transient) bytes of the head ``layer`` per micro-batch when its LM head and loss
    run over ``chunks`` sequence chunks inside the loss call, each chunk's forward and backward
    before the next (:attr:`autopar.frameworks.MemoryConventions.loss_chunks`).

    Kept until the decoder's backward: the head's saved tensors other than the LM head's input
    (the final norm's, ``seq - linear_seq``, with ``kept_extra``: what an eager norm keeps beyond
    the graph's count) and the input's accumulated gradient, one [tokens, hidden] tensor in the
    training dtype (``layer_input``). Transient while the loss runs: one chunk's logit-sized
    tensors (the head's ``tp`` part, the loss's saved bytes beyond the graph's fp32 count and
    its backward work, ``loss_saved_bytes`` / ``loss_work_bytes`` per logit element) / chunks,
    beside the chunks of the hidden states (a contiguous copy, 1 x ``layer_input``) and the fp32
    gradient accumulator (2 x).

    Source: torchtitan 6b9602339 (graph_trainer/dsv3_scaling) torchtitan/components/loss.py
    ``ChunkedCELoss.__call__``: ``h_chunks = [c.detach().requires_grad_(...) for c in
    _chunk(hidden_states)]`` (``_chunk_local``: ``c.contiguous()`` per ``torch.chunk``),
    ``GradAccumulator(hidden_states, ..., dtype=torch.float32)`` (``torch.zeros_like(local,
    dtype=dtype)``), per chunk ``logits = lm_head(h_chunk)``, ``chunk_loss.backward()``,
    ``grad_accumulator.add(h_chunk.grad)``; then ``accumulated_grad = grad_accumulator.result()
    .to(hidden_states.dtype)`` saved by ``_DecoderOutputGradientBackProp`` for the decoder's
    backward. Scales with ``micro_batch`` (in units of the graph's micro-batch) / cp.
    """
    a = layer.activations
    seq_div = tp if sequence_parallel else 1
    scale = micro_batch / cp
    logits = sum(o.bytes_written for o in layer.ops if o.kind == "loss") / 4.0 * scale / tp
    hidden = a.layer_input / seq_div * scale
    kept = (a.seq - a.linear_seq) / seq_div * scale + kept_extra + hidden
    chunk = (a.tp / tp * scale + (loss_saved_bytes - 4) * logits + loss_work_bytes * logits)
    return kept, chunk / max(1, chunks) + 3.0 * hidden


def moe_saved_delta(layer: Layer, *, combine_saved: bool, input_gathered: bool,
                    micro_batch: float, tp: int, etp: int, cp: int, sequence_parallel: bool,
                    dtype_bytes: int) -> float:
    """Bytes one MoE block keeps per micro-batch beyond (positive) or short of (negative) the
    graph's count, for a framework whose expert layer saves other tensors than the transformers
    block the graph traced (:class:`autopar.frameworks.MemoryConventions`):

    - ``combine_saved`` False: the router's probabilities are folded into the experts'
      activation, so the combine's multiply, which keeps the down projection's
      [routed tokens, hidden] output (the graph's ``mul`` next after the row-parallel expert
      GEMM, reading at least its output), is not there: its bytes come off, sharded as the
      graph counts them (by t only with sequence parallelism). A graph whose weights are
      applied elsewhere (before the experts, or after a bias) keeps its count;
    - ``input_gathered`` True: the routed tokens are all-gathered over the ``etp`` expert-TP
      ranks before the up projection, which keeps etp / tp of the routed tokens of the layer,
      where the graph's count keeps 1 / tp with sequence parallelism and all of them without:
      (etp / tp - 1 / tp) of the up projection's input comes on with it, (etp / tp - 1)
      without (0 when etp = tp, the tokens already whole on every TP rank).

    0 for a layer without routed experts. Scales with ``micro_batch`` (in units of the graph's
    micro-batch) / cp.
    """
    ops = layer.ops
    experts = [i for i, o in enumerate(ops) if o.moe_role == "expert" and o.gemm]
    if not experts:
        return 0.0
    seq_div = tp if sequence_parallel else 1
    delta = 0.0
    if not combine_saved:
        for i in experts:
            row = ops[i]
            if row.tp_role != "row":
                continue
            out = row.bytes_written
            after = next((o for o in ops[i + 1:] if o.kind != "view"), None)
            if (after is not None and after.kind == "elementwise" and after.target == "mul"
                    and after.bytes_read >= out):
                delta -= out / seq_div
    if input_gathered:
        fc1_in = max((ops[i].gemm[0] * ops[i].gemm[1] * dtype_bytes for i in experts
                      if ops[i].tp_role == "column"), default=0)
        delta += fc1_in * (etp / tp - 1 / seq_div)
    return delta * micro_batch / cp


def router_saved_delta(layer: Layer, *, fp8_linear_copies: bool, micro_batch: float, tp: int,
                       cp: int, sequence_parallel: bool, dtype_bytes: int) -> float:
    """Bytes one MoE block keeps per micro-batch beyond (positive) or short of (negative) the
    graph's count where the router's gate GEMM keeps its input as passed, in the training
    dtype, and its weight parameter (:attr:`autopar.frameworks.MemoryConventions.
    moe_router_input_saved`; Megatron-Core's ``RouterGatingLinearFunction``).

    The router is the op with ``moe_role == "router"`` (a replicated GEMM); its input in the
    training dtype is the block's ``[tokens, hidden]`` (:attr:`~autopar.graph.types.Layer.
    output_bytes`). Where the
    graph's router saved no more than that (transformers' Qwen3-MoE and Mixtral gates run in
    bf16 and keep the norm output itself), 0. Where it saved more (cast copies: transformers'
    DeepSeek-V3 ``MoEGate`` saves the fp32 input and weight, 4 + 4 bytes), those bytes come
    off, and the input in the training dtype comes on unless the graph already counts it at
    another op that keeps it whole: a shared expert's first GEMM, a GEMM outside the routed
    experts after the router whose ``gemm = (tokens, hidden, n)`` reads ``[tokens, hidden]``
    and that saved its input. Under FP8
    training with Linear inputs kept as FP8 copies (``fp8_linear_copies``) that GEMM's count
    becomes its FP8 copy (:func:`fp8_input_delta`), so the router's training-dtype tensor
    comes on beside it (as Transformer Engine's shared inputs: 2 + 1 bytes per element).

    Sharded as the graph's "seq" part (by t only with sequence parallelism; Megatron-Core's
    router runs on the sequence-parallel shard), scaled by ``micro_batch`` (in units of the
    graph's micro-batch) / cp. 0 for a layer without a router.
    """
    ops = layer.ops
    at = next((i for i, o in enumerate(ops) if o.moe_role == "router"), None)
    if at is None or layer.kind != "block":
        return 0.0
    router = ops[at]
    own = layer.output_bytes   # the block's [tokens, hidden] in the training dtype
    graph = sum(n for name, part, n in layer.saved_by_op if name == router.name)
    if graph <= own:
        return 0.0
    saved = {name for name, _, n in layer.saved_by_op if n > 0}
    shared = any(o.kind == "matmul" and not o.moe_role and len(o.gemm) == 3
                 and o.gemm[0] * o.gemm[1] * dtype_bytes == own and o.name in saved
                 for o in ops[at + 1:])
    delta = -graph + (own if (not shared or fp8_linear_copies) else 0.0)
    seq_div = tp if sequence_parallel else 1
    return delta / seq_div * micro_batch / cp


def fp8_drop_restored(recompute, fp8_saved_bytes: float, dtype_bytes: int, *,
                      micro_batch: float, tp: int, cp: int, sequence_parallel: bool) -> float:
    """Bytes per micro-batch on one rank that a module recompute's drop (counted at the graph's
    dtype, ``dtype_bytes``) took beyond what FP8 copies of Linear inputs held: a checkpointed
    Linear's input goes with its FP8 copy of ``fp8_saved_bytes`` per element, so the rest of
    its drop comes back; a norm output only Linears keep was counted as their FP8 copies, which
    "layernorm" recompute does not discard, so its drop comes back whole.
    ``recompute``: an :class:`autopar.cost.selective.ModuleRecompute`."""
    shard = dict(micro_batch=micro_batch, tp=tp, cp=cp, sequence_parallel=sequence_parallel)
    return ((1.0 - fp8_saved_bytes / dtype_bytes) * recompute.linear_dropped_bytes(**shard)
            + recompute.norm_linear_dropped_bytes(**shard))
