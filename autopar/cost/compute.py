"""Compute time of one layer on one GPU: a roofline per op.

Per op: GEMMs at ``peak * gemm_efficiency(M, K, N)`` on their TP-sharded shape; attention at
``peak * attention_efficiency`` on the causal work; every other op memory-bound at
``hbm_bandwidth * hbm_efficiency`` with a launch floor. Backward: GEMMs 2x forward (input and
weight gradients), attention 2.5x (FlashAttention-2's backward, torch.utils.flop_counter),
memory-bound ops 2x their bytes. Sharding: ops in the TP region run on 1/tp of their work; ops
outside it on all of it, or 1/tp with sequence parallelism; context parallelism divides tokens by cp.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.kernels import ATTENTION_BACKWARD_RATIO, UNFUSED_SCORE_BYTES
from ..graph.router import ROUTER_LOSS_KERNELS, is_router_loss, router_loss_backward_bytes
from ..graph.types import Layer
from .eager_bytes import (  # noqa: F401 (tests and callers import them from here)
    FP8_CAST_BYTES_PER_ELEMENT, FP8_AMAX_CAST_BYTES, FP8_FUSED_CAST_BYTES,
    EAGER_RMSNORM_BYTES_PER_ELEMENT, FUSED_NORM_BYTES_PER_ELEMENT,
    EAGER_RMSNORM_BWD_BYTES_PER_ELEMENT, EAGER_RMSNORM_KERNELS, EAGER_GLU_ACT_PASSES,
    EAGER_GLU_ACT_BWD_PASSES, NORM_INPUT_CAST_FWD_BYTES, NORM_INPUT_CAST_BWD_BYTES,
    EAGER_CE_FWD_BYTES_PER_LOGIT, EAGER_CE_BWD_BYTES_PER_LOGIT, EAGER_CE_KERNELS)
from .memory import GLU_ACTIVATIONS, op_sac_saved
from .params import CostParams
from .qk_norm import whole_head_ops


@dataclass(frozen=True)
class LayerTime:
    """Seconds one layer takes for one micro-batch on one GPU.

    Attributes:
        fwd_s: forward pass.
        bwd_s: backward pass (input and weight gradients).
        attention_fwd_s: forward time of the attention core (what selective recompute repeats).
        op_sac_recompute_s: forward time of the ops op-level selective checkpointing recomputes
            (all but attention and every second matmul, :func:`autopar.cost.memory.op_sac_saved`).
        fwd_flops / bwd_flops: FLOPs per GPU (after sharding) as the graph counts them (attention
            non-causal; the cost model takes the causal half off for MFU/HFU).
        wgrad_s: the part of ``bwd_s`` that computes weight gradients: for a GEMM with a weight,
            one of its two backward GEMMs (dW = dY^T X beside dX = dY W; Qi et al. 2023,
            arXiv 2401.10241, section 2: B and W each take about the forward's time). Attention,
            element-wise ops and FP8 casts count as input-gradient work. Zero-bubble schedules
            run this part as a separate W pass.
    """

    fwd_s: float
    bwd_s: float
    attention_fwd_s: float
    fwd_flops: float
    bwd_flops: float
    wgrad_s: float = 0.0

    op_sac_recompute_s: float = 0.0
    #: seconds of ``bwd_s`` that repeat forward work the framework checkpoints on its own in
    #: every mode (e.g. InternEvo's cast + norm, :data:`NORM_INPUT_CAST_FWD_BYTES`); full
    #: recomputation repeats the whole forward, so it does not pay them again
    checkpointed_s: float = 0.0
    #: forward seconds of each op of the layer, in ``layer.ops`` order (a memory-bound chain
    #: fused by ``fusion="compile"`` counts at its first op); they sum to ``fwd_s``
    op_fwd_s: tuple[float, ...] = ()
    #: forward seconds of the layer's GEMMs (matmul ops at their GEMM rate, FP8 casts apart);
    #: backward runs two GEMMs of each (``bwd_s`` holds twice this)
    gemm_fwd_s: float = 0.0

    def recompute_s(self, mode: str, ops: tuple[int, ...] | None = None) -> float:
        """Extra backward-time seconds a recompute mode costs (the repeated forward): all of it
        less what backward already repeats (``checkpointed_s``) (full), the attention core
        (selective), or the forward of the ops ``ops`` indexes (selective of Megatron-Core
        modules other than the default, :func:`autopar.cost.selective.module_recompute`), the
        ops op-level SAC does not save (``op_sac_recompute_s``, selective-op)."""
        if mode == "full":
            return self.fwd_s - self.checkpointed_s
        if mode == "selective":
            if ops is not None:
                return sum(self.op_fwd_s[i] for i in ops)
            return self.attention_fwd_s
        if mode == "selective-op":
            return self.op_sac_recompute_s
        return 0.0




def memory_bound_kernels(layer: Layer, fusion: str, eager_parts: tuple[str, ...] = ()):
    """The memory-bound kernels of ``layer`` with their backward.

    Yields ``(op, fwd_bytes, kernels, bwd_bytes, repeated_bytes)``: :func:`_memory_bound_ops`'
    forward bytes and kernels; backward bytes, twice the forward's (an element-wise op's input
    gradients) unless the op has a counted backward (an eager RMSNorm,
    :data:`EAGER_RMSNORM_BWD_BYTES_PER_ELEMENT`; a GLU activation,
    :data:`EAGER_GLU_ACT_BWD_PASSES`); ``repeated_bytes``, the part of the
    backward that repeats forward work the framework checkpoints itself (already in
    ``bwd_bytes``; a fully recomputed block does not pay it twice). ``eager_parts``
    (:data:`autopar.frameworks.profiles.EAGER_PARTS`): ``glu`` costs a gated linear unit's
    activation as its own kernel also outside ``fusion="eager"``; ``norm_input_cast`` costs a
    fused norm on an fp32 cast of its input (:data:`NORM_INPUT_CAST_FWD_BYTES`);
    ``fp32_cross_entropy`` costs the loss as torch's eager kernels
    (:data:`EAGER_CE_FWD_BYTES_PER_LOGIT`, :data:`EAGER_CE_BWD_BYTES_PER_LOGIT`). A MoE
    router's training-only loss (:mod:`autopar.graph.router`) runs its own kernels forward and
    backward (:data:`~autopar.graph.router.ROUTER_LOSS_KERNELS`).
    """
    glu = fusion != "eager" and "glu" in eager_parts
    cast = fusion == "fused" and "norm_input_cast" in eager_parts
    ce = "fp32_cross_entropy" in eager_parts
    if glu:
        for op in layer.ops:
            if op.kind == "view" and op.target.lower() in GLU_ACTIVATIONS:
                yield (op, EAGER_GLU_ACT_PASSES * op.bytes_read, 1,
                       EAGER_GLU_ACT_BWD_PASSES * op.bytes_read, 0.0)
    for op, nbytes, kernels in _memory_bound_ops(layer.ops, fusion):
        if op.kind == "view":   # an eager GLU activation (fusion="eager")
            yield op, nbytes, kernels, EAGER_GLU_ACT_BWD_PASSES * op.bytes_read, 0.0
            continue
        if is_router_loss(op):   # autopar.graph.router: its own kernels and backward
            if fusion == "compile":   # a chain starting at it: priced as the graph counts it
                yield op, nbytes, kernels, 2.0 * nbytes, 0.0
                continue
            yield op, nbytes, ROUTER_LOSS_KERNELS[op.target], router_loss_backward_bytes(op), 0.0
            continue
        if ce and op.kind == "loss" and op.bytes_written > 0:
            logits = op.bytes_written / 4.0   # the graph's loss writes the fp32 copy
            yield (op, op.bytes_read + EAGER_CE_FWD_BYTES_PER_LOGIT * logits, EAGER_CE_KERNELS,
                   op.bytes_read + EAGER_CE_BWD_BYTES_PER_LOGIT * logits, 0.0)
            continue
        if cast and op.kind == "norm":
            per = nbytes / FUSED_NORM_BYTES_PER_ELEMENT
            repeated = NORM_INPUT_CAST_FWD_BYTES * per if layer.kind == "block" else 0.0
            yield (op, NORM_INPUT_CAST_FWD_BYTES * per, 2,
                   NORM_INPUT_CAST_BWD_BYTES * per + repeated, repeated)
            continue
        if fusion == "eager" and op.kind == "norm" and "rmsnorm" in op.target.lower():
            bwd = nbytes * EAGER_RMSNORM_BWD_BYTES_PER_ELEMENT / EAGER_RMSNORM_BYTES_PER_ELEMENT
            yield op, nbytes, kernels, bwd, 0.0
            continue
        yield op, nbytes, kernels, 2.0 * nbytes, 0.0


def _memory_bound_ops(ops, fusion: str):
    """The memory-bound kernels of a layer's ops under ``fusion``.

    Yields ``(op, nbytes, kernels)``: the op's forward HBM bytes (read + written) at the graph's
    micro-batch and the kernels it launches. ``fused``: as the graph counts them (norms as one fused kernel). ``eager``:
    RMSNorms at :data:`EAGER_RMSNORM_BYTES_PER_ELEMENT`, and a gated linear unit's activation
    as its own kernel (:data:`EAGER_GLU_ACT_PASSES`). ``compile``: consecutive memory-bound
    ops (views between them ignored) form one TorchInductor kernel that reads what the chain
    takes from outside it and writes the chain's last output (an intermediate stays in
    registers); the chain is yielded as its first op with the chain's bytes.
    """
    chain: list = []

    def flush():
        if not chain:
            return None
        first, last = chain[0], chain[-1]
        reads = first.bytes_read + sum(max(0, b.bytes_read - a.bytes_written)
                                       for a, b in zip(chain, chain[1:]))
        out = (first, reads + last.bytes_written, 1)
        chain.clear()
        return out

    for op in ops:
        if op.kind == "view":
            if fusion == "eager" and op.target.lower() in GLU_ACTIVATIONS:
                yield op, EAGER_GLU_ACT_PASSES * op.bytes_read, 1
            continue
        if op.kind in ("matmul", "attention"):
            if fusion == "compile":
                done = flush()
                if done:
                    yield done
            continue
        if fusion == "compile":
            if chain and chain[-1].region != op.region:
                done = flush()
                if done:
                    yield done
            chain.append(op)
            continue
        nbytes, kernels = op.bytes_read + op.bytes_written, 1
        if fusion == "eager" and op.kind == "norm" and "rmsnorm" in op.target.lower():
            nbytes *= EAGER_RMSNORM_BYTES_PER_ELEMENT / FUSED_NORM_BYTES_PER_ELEMENT
            kernels = EAGER_RMSNORM_KERNELS
        yield op, nbytes, kernels
    done = flush()
    if done:
        yield done


#: HBM passes over the score matrix in an unfused attention forward, counted in autopar's own
#: ring attention (autopar/runtime/cp.py ``_ring``): q k^T written (1), scaled (read + write, 2),
#: masked_fill (2), logsumexp read (1), minus lse (2), exp (2), p @ v read (1) = 11; the
#: backward is taken as twice the forward, as for every unfused op here.
UNFUSED_SCORE_PASSES = 11


#: Extra HBM bytes per attention-score element, forward and backward each, of an unfused
#: attention that scales its scores and applies the causal mask as three separate element-wise
#: ops (``eager_parts`` "separate_scale_mask") where the graph's unfused path
#: (:data:`autopar.graph.kernels.UNFUSED_SCORE_BYTES`) counts one scale+mask pass (read and
#: write of 2-byte scores, 4). Megatron-LM v1 as DeepSpeedExamples ran it (Megatron-LM/mpu/
#: transformer.py at a79272c, GPT2ParallelSelfAttention.forward): ``attention_scores /
#: math.sqrt(...)``, then ``torch.mul(attention_scores, ltor_mask) - 10000.0 * (1.0 -
#: ltor_mask)``: a division, a multiply and a subtraction over the [b, np, s, s] scores (the
#: [1, 1, s, s] mask terms are small and left out): 3 x 4 = 12 bytes, 8 more than counted.
#: Backward: the division's and the multiply's input gradients (read and write, 4 each; the
#: subtraction passes its gradient through without a kernel): 8.
SEPARATE_SCALE_MASK_BYTES_PER_SCORE = 8


def unfused_scores(op) -> float:
    """Attention-score elements of an unfused attention op at the graph's micro-batch: the
    op's bytes beyond its q, k and v inputs (taken as three times its output, exact for
    multi-head attention and an overestimate of k and v, so a slight underestimate of the
    scores, under grouped-query attention) over the graph's
    :data:`autopar.graph.kernels.UNFUSED_SCORE_BYTES`. 0 for a fused attention op."""
    if op.fused:
        return 0.0
    return max(0.0, op.bytes_read - 3.0 * op.bytes_written) / UNFUSED_SCORE_BYTES


def _fused_attention_s(causal, flops, peak_flops, params, architecture, kernel, dims):
    """(forward, backward) seconds of a fused attention kernel: the ceiling is for forward +
    backward; it splits by the backward's relative efficiency r: forward at
    eff * (1 + R / r) / (1 + R), backward R / r times the forward."""
    work = params.causal_attention_work if causal else 1.0
    eff = (params.attention_ceiling(kernel, architecture)
           * params.attention_shape_factor(kernel, *dims))
    r = params.attention_backward_efficiency
    ratio = ATTENTION_BACKWARD_RATIO
    t = flops * work / (peak_flops * eff * (1 + ratio / r) / (1 + ratio))
    return t, ratio / r * t


def _cp_attention_s(flops, peak_flops, hbm_bandwidth, params, architecture, dims, path):
    """(forward, backward) seconds of a CP rank's attention run as ``path`` ("masked" or
    "unfused", :func:`layer_time`): every pair of the rank's queries and keys is computed."""
    if path == "masked":
        return _fused_attention_s(False, flops, peak_flops, params, architecture, "efficient",
                                  dims)
    head_dim = dims[0] or 128.0
    scores = flops / (4.0 * head_dim)   # query-key pairs x heads: flops = 4 pairs d
    t = (flops / (peak_flops * params.matmul_ceiling(architecture))
         + UNFUSED_SCORE_PASSES * 2 * scores / (hbm_bandwidth * params.hbm_efficiency))
    return t, 2.0 * t


def layer_time(layer: Layer, *, micro_batch: int, tp: int, cp: int, sequence_parallel: bool,
               peak_flops: float, hbm_bandwidth: float, params: CostParams,
               architecture: str = "ampere", fp8_peak_flops: float | None = None,
               attention_kernel: str = "fa2", fusion: str = "fused",
               attention_dims: tuple[float, float] = (0.0, 0.0),
               cp_attention: str = "fused", cp_imbalance: float = 1.0,
               expert_tp: int | None = None, eager_parts: tuple[str, ...] = (),
               local_experts: int = 1, routed_scale: float = 1.0) -> LayerTime:
    """Roofline time of ``layer`` for a micro-batch of ``micro_batch`` sequences.

    Args:
        layer: measured at the graph's micro-batch size (1 sequence is assumed per unit; sizes
            scale linearly with ``micro_batch``).
        micro_batch: sequences per micro-batch, b.
        tp / cp: tensor- and context-parallel degrees.
        sequence_parallel: whether TP-replicated ops are sharded over the sequence.
        peak_flops: dense peak of the compute dtype (FLOP/s); BF16 in FP8 training.
        fp8_peak_flops: FP8 dense peak (FLOP/s) when training in FP8, else None. Only the Linear
            GEMMs (TP role column/row) run at it and pay the FP8 casts
            (:data:`FP8_CAST_BYTES_PER_ELEMENT`); attention, the vocabulary projection (not FP8 in
            Megatron-Core nor in torchtitan's Float8 converter, which skips ``output``) and
            element-wise ops run in BF16. The casts are Transformer Engine's fused
            cast-transpose (:data:`FP8_FUSED_CAST_BYTES`), or torchao float8nocompile's
            amax-then-cast kernels with ``eager_parts`` "fp8_amax_casts"
            (:data:`FP8_AMAX_CAST_BYTES`).
        hbm_bandwidth: HBM bandwidth (bytes/s).
        params: calibration constants.
        architecture: the GPU architecture, for the per-architecture GEMM and attention ceilings.
        attention_kernel: the fused attention kernel that runs (:data:`ATTENTION_KERNELS`).
        fusion: fusion level of memory-bound ops (:data:`autopar.frameworks.profiles.
            FUSION_LEVELS`; see :func:`_memory_bound_ops`).
        attention_dims: (head dim, keys each query block visits per rank) of the layer's
            attention, for :meth:`CostParams.attention_shape_factor`; (0, 0) = unknown.
        cp_attention: how a context-parallel rank runs a fused attention op
            (:data:`autopar.frameworks.profiles.CP_ATTENTION_PATHS`): ``"fused"`` (the framework's kernel, causal blocks
            skipped), ``"masked"`` (SDPA with an explicit boolean mask: the memory-efficient
            kernel, which cannot skip masked blocks, so all s_local x s pairs run) or
            ``"unfused"`` (scores as plain tensor ops through HBM, all pairs:
            :data:`UNFUSED_SCORE_PASSES` passes over them). Never cheaper than ``"fused"`` (a
            slower implementation of the same attention).
        cp_imbalance: the slowest CP rank's causal attention work over the average (1 for the
            load-balanced split; ``(2 cp - 1) / cp`` for a contiguous one, whose last rank's
            queries see the most keys).
        expert_tp: expert-tensor-parallel degree etp of the routed experts' GEMMs (ops with
            ``moe_role == "expert"``) under MoE parallel folding; None = tp. A rank's expert
            FLOPs do not change with etp (balanced routing: the etp ranks of an expert-TP group
            gather etp / tp of an attention group's routed tokens and each holds 1 / etp of the
            expert matrices: Megatron-Core MoEAlltoAllTokenDispatcher), but the GEMM shape
            does: M x etp / tp rows, N (column) or K (row) / etp, which the efficiency curve
            reads.
        eager_parts: parts of the block the framework runs as eager ops inside a fused stack
            (:data:`autopar.frameworks.profiles.EAGER_PARTS`; :func:`memory_bound_kernels`);
            "separate_scale_mask" adds :data:`SEPARATE_SCALE_MASK_BYTES_PER_SCORE` to an
            unfused attention's forward and backward.
        local_experts: routed experts one rank holds (E / ep). A grouped expert GEMM runs one
            GEMM per local expert over the tokens routed to it (Megatron-Core GroupedMLP:
            ``grouped_gemm.ops.gmm`` with ``batch_sizes`` = tokens per expert; TE
            GroupedLinear: one cuBLAS GEMM per expert; ``torch._grouped_mm`` with ``offs``), so
            the efficiency curve reads M / local_experts rows (balanced routing), not the rows
            of all experts together. 1 (the default) is the most efficient case, the bounds'.
        routed_scale: rows the expert GEMMs run over the layer's dropless routed rows
            (:func:`autopar.cost.capacity.routed_scale`: above 1 for inputs padded to an expert
            capacity, below 1 for tokens dropped at it); scales their FLOPs and M.

    Returns:
        :class:`LayerTime` in seconds and per-GPU FLOPs.
    """
    fwd = bwd = attn = wgrad = gemm = 0.0
    fwd_flops = bwd_flops = 0.0
    scale = micro_batch / cp
    sac_saved = set(op_sac_saved(layer)) if layer.kind == "block" else set()
    sac_fwd = 0.0  # forward seconds of the ops op-level SAC saves (matmuls and attention only)
    op_fwd = [0.0] * len(layer.ops)
    for index, op in enumerate(layer.ops):
        if op.kind not in ("matmul", "attention"):
            continue
        before = fwd
        sharded = op.region == "tp" or op.tp_role in ("column", "row", "vocab") or (
            sequence_parallel)
        div = tp if sharded else 1
        if op.kind == "matmul":
            rows = routed_scale if op.moe_role == "expert" else 1.0
            flops = op.fwd_flops * scale * rows / div
            if op.gemm:
                m, k, n = op.gemm
                m = m * scale * rows
                split = tp
                if expert_tp is not None and op.moe_role == "expert":
                    m, split = m * expert_tp / tp, expert_tp
                if op.moe_role == "expert":
                    m = m / local_experts
                if op.tp_role in ("column", "vocab"):
                    n = n / split
                elif op.tp_role == "row":
                    k = k / split
                eff = params.gemm_efficiency(m, k, n, architecture)
            else:
                eff = params.matmul_ceiling(architecture)
            fp8 = fp8_peak_flops is not None and op.tp_role in ("column", "row")
            t = flops / ((fp8_peak_flops if fp8 else peak_flops) * eff)
            fwd += t
            gemm += t
            bwd += 2.0 * t
            if op.gemm or op.num_parameters or op.tp_role:  # a weight GEMM: dW is one of two
                wgrad += t
            if fp8 and op.gemm:
                bw = hbm_bandwidth * params.hbm_efficiency
                cx, cw, cg, cwb = (FP8_AMAX_CAST_BYTES if "fp8_amax_casts" in eager_parts
                                   else FP8_FUSED_CAST_BYTES)
                fwd += (cx * m * k + cw * k * n) / bw
                bwd += (cg * m * n + cwb * k * n) / bw
            fwd_flops += flops
            bwd_flops += 2.0 * flops
        elif op.kind == "attention":
            flops = op.fwd_flops * scale / tp
            if op.fused:
                t, tb = _fused_attention_s(op.causal, flops, peak_flops, params, architecture,
                                           attention_kernel, attention_dims)
                if cp > 1 and cp_attention != "fused":
                    t2, tb2 = _cp_attention_s(flops, peak_flops, hbm_bandwidth, params,
                                              architecture, attention_dims, cp_attention)
                    t, tb = max(t, t2), max(tb, tb2)
                if op.causal:
                    t, tb = t * cp_imbalance, tb * cp_imbalance
                bwd += tb
            else:  # batched GEMMs plus the s x s scores through HBM, masked work not skipped
                t = (flops / (peak_flops * params.matmul_ceiling(architecture))
                     + op.bytes_read * scale / tp / (hbm_bandwidth * params.hbm_efficiency))
                bwd += 2.0 * t
                if "separate_scale_mask" in eager_parts:
                    extra = (SEPARATE_SCALE_MASK_BYTES_PER_SCORE * unfused_scores(op) * scale
                             / tp / (hbm_bandwidth * params.hbm_efficiency))
                    t += extra
                    bwd += extra
            fwd += t
            attn += t
            fwd_flops += flops
            bwd_flops += ATTENTION_BACKWARD_RATIO * flops
        op_fwd[index] = fwd - before
        if index in sac_saved:
            sac_fwd += fwd - before
    repeated_s = 0.0
    position = {id(op): i for i, op in enumerate(layer.ops)}
    whole = whole_head_ops(layer, tp, eager_parts)
    for op, nbytes, kernels, bwd_bytes, repeated in memory_bound_kernels(layer, fusion,
                                                                           eager_parts):
        sharded = op.region == "tp" or op.tp_role in ("column", "row", "vocab") or (
            sequence_parallel)
        if position[id(op)] in whole:
            sharded = False   # on every head, on every TP rank (eager part above)
        share = scale / (tp if sharded else 1)
        bw = hbm_bandwidth * params.hbm_efficiency
        t = max(nbytes * share / bw, kernels * params.kernel_launch_s)
        op_fwd[position[id(op)]] += t
        fwd += t
        bwd += t * bwd_bytes / nbytes if nbytes else 2.0 * t
        repeated_s += t * repeated / nbytes if nbytes else 0.0
    return LayerTime(fwd_s=fwd, bwd_s=bwd, attention_fwd_s=attn, fwd_flops=fwd_flops,
                     bwd_flops=bwd_flops, wgrad_s=wgrad,
                     op_sac_recompute_s=fwd - sac_fwd, checkpointed_s=repeated_s,
                     op_fwd_s=tuple(op_fwd), gemm_fwd_s=gemm)
