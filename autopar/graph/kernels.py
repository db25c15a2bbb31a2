"""Kernels as a GPU training run executes them, for the extractor's meta-tensor runs.

Attention: flash attention instead of torch's meta math path. Norms: a fused norm kernel
(Apex / Transformer Engine / torch's fused CUDA norms) that saves its input and per-row statistics,
instead of whatever upcasts a hand-written norm happens to do in eager Python.

Scaled-dot-product attention:

On meta tensors torch dispatches ``F.scaled_dot_product_attention`` to its math path (an fp32
s x s score matrix saved for backward), which is not what a GPU training run executes. The
extractor replaces each SDPA call with :class:`FlashAttentionMeta`, whose saved tensors are those
of FlashAttention-2 (Dao 2023): q, k, v, the output and the fp32 log-sum-exp. With
``flash=False`` it saves what the unfused path saves instead (Korthikanti et al. 2022, section 4.1:
softmax output 2as^2b, dropout mask as^2b, dropout output 2as^2b bytes).
"""

from __future__ import annotations

import torch


def sdpa_forward_flops(q_shape, k_shape, v_shape) -> float:
    """Forward FLOPs of attention, non-causal, as torch's FlopCounterMode counts SDPA.

    Args:
        q_shape: (b, heads, s_q, d); k_shape: (b, kv_heads, s_k, d); v_shape: (b, kv_heads, s_k, d_v).

    Returns:
        2 * b * heads * s_q * s_k * (d + d_v) FLOPs (QK^T and PV, multiply-add = 2).
        Source: ``torch.utils.flop_counter.sdpa_flop_count``.
    """
    b, h, s_q, d = q_shape
    s_k = k_shape[-2]
    d_v = v_shape[-1]
    return 2.0 * b * h * s_q * s_k * (d + d_v)


#: Bytes of HBM traffic per attention-score element in unfused attention's forward pass:
#: QK^T written (2), scale+mask read and written (4), softmax read and written (4), dropout read,
#: written and its 1-byte mask (5), read again by PV (2). Counted from Megatron-LM's unfused
#: path (Korthikanti et al. 2022, section 4.1 lists the same tensors).
UNFUSED_SCORE_BYTES = 17


#: Backward / forward FLOP ratio of attention: the backward recomputes QK^T and runs four more
#: GEMMs of the same size (torch.utils.flop_counter.sdpa_backward_flop_count: 5 vs 2 GEMMs).
ATTENTION_BACKWARD_RATIO = 2.5


class FlashAttentionMeta(torch.autograd.Function):
    """Shape-only attention whose autograd saves what flash (or unfused) attention saves.

    forward(q [b,h,s,d], k [b,kv,s,d], v [b,kv,s,dv], flash: bool, dropout: bool) -> [b,h,s,dv].
    Values are never computed; use on meta tensors only.
    """

    @staticmethod
    def forward(ctx, q, k, v, flash: bool, dropout: bool):  # noqa: D102 - see class docstring
        b, h, s_q, _ = q.shape
        s_k = k.shape[-2]
        # flash kernels write [b, s, h, d]: the usual transpose+reshape before the output
        # projection is then a view, not a copy
        out = q.new_empty((b, s_q, h, v.shape[-1])).transpose(1, 2)
        if flash:
            lse = q.new_empty((b, h, s_q), dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
        else:
            probs = q.new_empty((b, h, s_q, s_k))
            extra = [probs]
            if dropout:
                extra.append(q.new_empty((b, h, s_q, s_k), dtype=torch.bool))
                extra.append(q.new_empty((b, h, s_q, s_k)))
            ctx.save_for_backward(q, k, v, *extra)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - shapes only
        q, k, v = ctx.saved_tensors[:3]
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, None


class FusedNormMeta(torch.autograd.Function):
    """Shape-only LayerNorm/RMSNorm that saves what a fused kernel saves.

    forward(x [..., h], weight [h] or None) -> [..., h]; saves x and the fp32 per-row statistics
    (mean and rstd: 2 floats per row), as ``torch.native_layer_norm`` does on CUDA.
    """

    @staticmethod
    def forward(ctx, x, weight):  # noqa: D102 - see class docstring
        stats = x.new_empty((*x.shape[:-1], 2), dtype=torch.float32)
        if weight is not None:
            ctx.save_for_backward(x, weight, stats)
        else:
            ctx.save_for_backward(x, stats)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - shapes only
        x = ctx.saved_tensors[0]
        weight = ctx.saved_tensors[1] if len(ctx.saved_tensors) == 3 else None
        return torch.empty_like(x), (torch.empty_like(weight) if weight is not None else None)


class FusedActivationMeta(torch.autograd.Function):
    """Shape-only pointwise activation (GELU, tanh-GELU, SiLU) that saves what a fused kernel saves.

    forward(x) -> tensor like x; saves x only. An eager decomposition (HF's ``gelu_new``: eight
    pointwise ops) saves several intermediates instead; a training run fuses it (torch.compile,
    Megatron's bias-gelu fusion), so the extractor counts the fused kernel.
    """

    @staticmethod
    def forward(ctx, x):  # noqa: D102 - see class docstring
        ctx.save_for_backward(x)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - shapes only
        return torch.empty_like(ctx.saved_tensors[0])


class FusedGLUMeta(torch.autograd.Function):
    """Shape-only gated linear unit act(a) * b (SwiGLU, GeGLU) as one fused kernel.

    forward(a [..., f], b [..., f]) -> [..., f]; saves a and b only, recomputing act(a) in
    backward, as Megatron-LM's fused ``bias_swiglu`` and Transformer Engine's SwiGLU do. Eager
    PyTorch (``F.silu(a) * b``) also keeps act(a), one more f-wide tensor per block. The output
    dtype is the promoted dtype of ``a`` and ``b``, as for the eager product (Qwen3-Next's gated
    norm multiplies a bf16 tensor by an fp32 gate).
    """

    @staticmethod
    def forward(ctx, a, b):  # noqa: D102 - see class docstring
        ctx.save_for_backward(a, b)
        return torch.empty_like(b, dtype=torch.promote_types(a.dtype, b.dtype))

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - shapes only
        a, b = ctx.saved_tensors
        return torch.empty_like(a), torch.empty_like(b)


def grouped_gemm_flops(x_shape, w_shape) -> float:
    """Forward FLOPs of ``torch._grouped_mm(x [M, K], w [E, K, N], offs)``: 2*M*K*N.

    Each of the M routed rows (tokens x experts_per_token, in total over all E groups) meets one
    K x N expert matrix. torch 2.13's FlopCounterMode has no rule for ``_grouped_mm`` (it counts 0),
    hence this rule; the backward (input and weight gradients) is twice this, as for any GEMM.
    """
    m, k = x_shape[-2], x_shape[-1]
    return 2.0 * m * k * w_shape[-1]


#: Backward / forward FLOP ratio of a GEMM (input gradient + weight gradient).
GEMM_BACKWARD_RATIO = 2.0


#: Chunk length of fla's chunked gated delta rule (``chunk_gated_delta_rule``, BT = 64).
DELTA_RULE_CHUNK = 64


class GatedDeltaRuleSavesMeta(torch.autograd.Function):
    """Identity on the output of a gated delta rule, saving what fla's fused kernel saves.

    fla ``ChunkGatedDeltaRuleFunction.forward`` (flash-linear-attention,
    ``fla/ops/gated_delta_rule/chunk.py``): ``save_for_backward(q, q_rstd, k, k_rstd, v, g, beta,
    A, initial_state)``: the l2-normalised q and k with their fp32 1/norms, v and beta as given,
    g's chunk-local cumulative sum in fp32, and A, the [b, s, heads, 64] inverse of the chunk's
    UT system, in k's dtype; everything else is recomputed in backward.

    forward(out, q [b,s,hk,dk], k [b,s,hk,dk], v [b,s,h,dv], g [b,s,h], beta [b,s,h]) -> out.
    """

    @staticmethod
    def forward(ctx, out, q, k, v, g, beta):  # noqa: D102 - see class docstring
        b, s, h = v.shape[:3]
        ctx.save_for_backward(
            torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32),
            torch.empty_like(k), k.new_empty(k.shape[:-1], dtype=torch.float32), v,
            g.new_empty(g.shape, dtype=torch.float32), beta,
            k.new_empty((b, s, h, DELTA_RULE_CHUNK)))
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - shapes only
        return grad_out, None, None, None, None, None
