"""Mixture-of-experts layers and multi-head latent attention for :mod:`autopar.models.transformer`.

Written so that the graph extractor recognises them by the same aten patterns as the Hugging Face
transformers 5.x models (:mod:`autopar.graph.aten`, :mod:`autopar.graph.export_run`): the router
is a linear h -> E whose scores reach a ``topk`` over all E; the experts are two stacked
parameters (``gate_up_proj`` [E, 2f, h], ``down_proj`` [E, h, f], transformers' layout, which
:mod:`autopar.runtime.ep` also splits) run as grouped GEMMs (``torch._grouped_mm``) over the
tokens sorted by expert. A block holding these runs through ``torch.export``
(:func:`autopar.graph.extract`), as the transformers models do.

Shapes: T = tokens (b*s), h = hidden, E = routed experts, k = experts per token, f = expert width,
a = heads; latent attention: rq / rkv = query / key-value ranks, dn / dr / dv = per-head no-RoPE,
RoPE and value sizes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autopar.models.config import ModelConfig
from autopar.models.layers import RMSNorm, SwiGLU


class Router(nn.Module):
    """Top-k router: ``weight`` [E, h] (no bias), scores of [T, h] tokens -> (weights [T, k],
    expert ids [T, k] int64). The weights are fp32 with ``fp32_weights`` (the experts' outputs
    are then combined in fp32), else cast to the input dtype (see :func:`combines_in_fp32`).

    ``scoring="softmax"``: softmax over the E logits (in fp32), top-k, the k weights renormalised
    to sum to 1; this is Mixtral's top-k-then-softmax-over-k and Qwen3-MoE's softmax-then-top-k
    with ``norm_topk_prob`` (the same numbers; transformers ``MixtralTopKRouter``,
    ``Qwen3MoeTopKRouter``). ``scoring="sigmoid"``: DeepSeek-V3 (arXiv 2412.19437 section 2.1.2):
    sigmoid scores in fp32, top-k, the selected scores normalised; group-limited routing is one
    group (every expert eligible), the bias-based balancing term and the routed scaling factor
    are left out (they change no shape or cost beyond an elementwise op on [T, E]).
    """

    def __init__(self, hidden: int, num_experts: int, top_k: int, scoring: str,
                 fp32_weights: bool = True) -> None:
        super().__init__()
        self.top_k, self.scoring, self.fp32_weights = top_k, scoring, fp32_weights
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.scoring == "sigmoid":
            scores = F.linear(x.float(), self.weight.float()).sigmoid()
            index = torch.topk(scores, self.top_k, dim=-1)[1]
            weights = scores.gather(1, index)
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        else:
            logits = F.linear(x, self.weight)
            probs = F.softmax(logits, dim=-1, dtype=torch.float32)
            weights, index = torch.topk(probs, self.top_k, dim=-1)
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights if self.fp32_weights else weights.to(x.dtype)), index


def combines_in_fp32(config: ModelConfig) -> bool:
    """Whether the routing weights stay fp32, as in the transformers model
    :func:`autopar.models.hf_equivalent.preset_for_config` checks ``config`` against: yes for
    DeepSeek-V3's layers (latent attention) and Mixtral's (experts alone: no shared experts,
    leading dense layers, interval, qk-norm or biases); Qwen2/Qwen3-MoE cast them to the
    activations' dtype (``router_top_value.to(router_logits.dtype)``). The combine's
    element-wise bytes (T*k*h elements) follow."""
    plain = not (config.shared_expert_ffn_hidden_size or config.first_dense_layers
                 or config.moe_layer_interval != 1 or config.qk_norm or config.bias)
    return config.uses_mla or plain


def _loop_mm(x: torch.Tensor, weight_t: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows ``x`` [S, in] times each group's ``weight_t`` [E, in, out] -> [S, out], one GEMM per
    expert; ``offsets`` [E] int32: the end row of each expert's group."""
    ends = offsets.tolist()
    starts = [0, *ends[:-1]]
    return torch.cat([x[a:b] @ weight_t[e] for e, (a, b) in enumerate(zip(starts, ends))])


@torch.library.custom_op("autopar::grouped_mm", mutates_args=())
def grouped_mm(x: torch.Tensor, weight_t: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``torch._grouped_mm(x, weight_t, offs=offsets)`` for every dtype: torch's meta kernel of
    ``_grouped_mm`` takes bf16 only (torch 2.13), while fp16/fp32 grouped GEMMs exist in training
    stacks (Megatron-Core's grouped_gemm, Transformer Engine). The extractor prices it as a
    grouped GEMM (:func:`autopar.graph.aten.packet`). Shapes as :func:`_loop_mm`."""
    return _loop_mm(x, weight_t, offsets)


@grouped_mm.register_fake
def _grouped_mm_fake(x, weight_t, offsets):
    return x.new_empty(x.shape[0], weight_t.shape[-1])


def _grouped_mm_setup(ctx, inputs, output):
    x, weight_t, offsets = inputs
    ctx.save_for_backward(x, weight_t, offsets)


def _grouped_mm_backward(ctx, grad):
    x, weight_t, offsets = ctx.saved_tensors
    return _grouped_mm_grads(x, weight_t, offsets, grad)


@torch.library.custom_op("autopar::grouped_mm_grads", mutates_args=())
def _grouped_mm_grads(x: torch.Tensor, weight_t: torch.Tensor, offsets: torch.Tensor,
                      grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx [S, in], dweight_t [E, in, out]) of :func:`grouped_mm`: per group grad @ w^T and
    x^T @ grad."""
    ends = offsets.tolist()
    starts = [0, *ends[:-1]]
    dx = torch.cat([grad[a:b] @ weight_t[e].t() for e, (a, b) in enumerate(zip(starts, ends))])
    dw = torch.stack([x[a:b].t() @ grad[a:b] for a, b in zip(starts, ends)])
    return dx, dw


@_grouped_mm_grads.register_fake
def _grouped_mm_grads_fake(x, weight_t, offsets, grad):
    return torch.empty_like(x), torch.empty_like(weight_t)


grouped_mm.register_autograd(lambda ctx, grad: (*_grouped_mm_backward(ctx, grad), None),
                             setup_context=_grouped_mm_setup)


def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows ``x`` [S, in] sorted by expert times each expert's ``weight`` [E, out, in]^T ->
    [S, out]; ``offsets`` [E] int32: the end row of each expert's group.

    On the meta device and on CUDA in bf16 one ``torch._grouped_mm`` (what the extractor prices
    by :func:`autopar.graph.kernels.grouped_gemm_flops`); on the meta device in another dtype
    :func:`grouped_mm` (the same op for every dtype, priced the same); elsewhere (CPU training,
    fp32) one GEMM per expert: torch's CPU grouped GEMM needs 16-byte aligned strides and its
    backward fails on small shapes (torch 2.13).
    """
    x = x.to(weight.dtype)
    if x.device.type == "meta" and x.dtype != torch.bfloat16:
        return grouped_mm(x, weight.transpose(-2, -1), offsets)
    if x.device.type == "meta" or (x.device.type == "cuda" and x.dtype == torch.bfloat16):
        return torch._grouped_mm(x, weight.transpose(-2, -1), offs=offsets)
    return _loop_mm(x, weight.transpose(-2, -1), offsets)


class Experts(nn.Module):
    """E gated experts stacked: ``gate_up_proj`` [E, 2f, h] (gate rows then up rows),
    ``down_proj`` [E, h, f], ``act_fn`` SiLU (GELU, tanh approximation, under ``geglu``); the layout of transformers 5.x
    (``MixtralExperts``), which expert parallelism splits (:mod:`autopar.runtime.ep`).

    forward(hidden [T, h], top_k_index [T, k] int64, top_k_weights [T, k]) -> [T, h]: each
    token's weighted sum over its k experts. The T*k (token, expert) rows are sorted by expert
    and run as two grouped GEMMs (transformers ``grouped_mm_experts_forward``).
    """

    def __init__(self, hidden: int, width: int, num_experts: int, geglu: bool = False) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * width, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, width))
        self.act_fn = nn.GELU(approximate="tanh") if geglu else nn.SiLU()

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        k = top_k_index.size(-1)
        expert_ids, perm = torch.sort(top_k_index.reshape(-1))
        rows = hidden[perm // k]
        weights = top_k_weights.reshape(-1)[perm]
        # histc, not bincount: a fixed output size (E), so torch.export needs no data-dependent shape
        counts = torch.histc(expert_ids.float(), bins=self.num_experts, min=0,
                             max=self.num_experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        gate, up = _grouped_linear(rows, self.gate_up_proj, offsets).chunk(2, dim=-1)
        out = _grouped_linear(self.act_fn(gate) * up, self.down_proj, offsets)
        out = out * weights.unsqueeze(-1)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.size(0), device=perm.device)
        out = out[inverse].view(-1, k, hidden.size(-1)).sum(dim=1)
        return out.to(hidden.dtype)


class MoE(nn.Module):
    """A mixture-of-experts MLP: ``router`` (:class:`Router`), ``experts`` (:class:`Experts`,
    ``num_experts`` of ``moe_ffn_hidden_size``) and, when the config has shared experts,
    ``shared`` (one SwiGLU of ``shared_expert_ffn_hidden_size``, run on every token, as
    DeepSeek-V3's ``shared_experts``). Scoring: sigmoid with latent attention (DeepSeek-V3's
    layers, as :func:`autopar.models.hf_equivalent.preset_for_config` models every MLA config),
    else softmax. Input [b, s, h] -> output [b, s, h].
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()

        h = config.hidden_size
        self.router = Router(h, config.num_experts, config.top_k,
                             "sigmoid" if config.uses_mla else "softmax", combines_in_fp32(config))
        self.experts = Experts(h, config.moe_ffn_hidden_size, config.num_experts,
                               geglu=config.mlp == "geglu")
        width = config.shared_expert_ffn_hidden_size
        self.shared = SwiGLU(config, width) if width else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.size(-1))
        weights, index = self.router(tokens)
        y = self.experts(tokens, index, weights).view(x.shape)
        if self.shared is not None:
            y = y + self.shared(x)
        return y


class LatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 section 2.1; transformers
    ``DeepseekV3Attention``), causal, no biases.

    Queries: ``wq`` h -> a*(dn+dr), or with ``q_lora_rank`` ``wq_a`` h -> rq, ``q_norm``
    (RMSNorm rq), ``wq_b`` rq -> a*(dn+dr). Keys and values: ``wkv_a`` h -> rkv + dr (the
    compressed latent and one RoPE key shared by all heads), ``kv_norm`` (RMSNorm rkv), ``wkv_b``
    rkv -> a*(dn+dv). RoPE (``rope``, over dr features) on the dr query and key parts; attention
    over dn+dr query/key features and dv value features; ``wo`` a*dv -> h. Input [b, s, h] ->
    output [b, s, h].
    """

    def __init__(self, config: ModelConfig, rope: nn.Module) -> None:
        super().__init__()

        h, a = config.hidden_size, config.num_heads
        self.num_heads = a
        self.dn, self.dr, self.dv = (config.qk_nope_head_dim, config.qk_rope_head_dim,
                                     config.v_head_dim)
        self.rkv = config.kv_lora_rank
        self.attention_dropout = config.attention_dropout
        qk = self.dn + self.dr
        if config.q_lora_rank:
            self.wq = None
            self.wq_a = nn.Linear(h, config.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(config.q_lora_rank, eps=config.norm_eps)
            self.wq_b = nn.Linear(config.q_lora_rank, a * qk, bias=False)
        else:
            self.wq = nn.Linear(h, a * qk, bias=False)
            self.wq_a = self.q_norm = self.wq_b = None
        self.wkv_a = nn.Linear(h, self.rkv + self.dr, bias=False)
        self.kv_norm = RMSNorm(self.rkv, eps=config.norm_eps)
        self.wkv_b = nn.Linear(self.rkv, a * (self.dn + self.dv), bias=False)
        self.wo = nn.Linear(a * self.dv, h, bias=False)
        self.rope = rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.num_heads
        q = self.wq(x) if self.wq is not None else self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.unflatten(-1, (a, self.dn + self.dr)).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [self.dn, self.dr], dim=-1)
        latent, k_rot = torch.split(self.wkv_a(x), [self.rkv, self.dr], dim=-1)
        kv = self.wkv_b(self.kv_norm(latent)).unflatten(-1, (a, self.dn + self.dv)).transpose(1, 2)
        k_nope, v = torch.split(kv, [self.dn, self.dv], dim=-1)
        q_rot, k_rot = self.rope(q_rot, k_rot.unsqueeze(1))
        q = torch.cat([q_pass, q_rot], dim=-1)
        k = torch.cat([k_nope, k_rot.expand(-1, a, -1, -1)], dim=-1)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=(self.attention_dropout if self.training else 0.0), is_causal=True)
        return self.wo(out.transpose(1, 2).flatten(2))
