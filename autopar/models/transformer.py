"""Plain decoder-only transformers (GPT and Llama) as readable ``nn.Module`` trees, with
mixture-of-experts layers and latent attention from :mod:`autopar.models.moe`, qk-norm and any
head size.

Written for two consumers: the graph extractor (``torch.fx.symbolic_trace`` of the whole model or of
one :class:`Block`; attention is one ``F.scaled_dot_product_attention`` call, which the extractor
models as flash attention) and the runtime equivalence tests (real forward/backward of the tiny
presets on CPU). So a dense block has no data-dependent control flow (MoE blocks go through
torch.export, see :mod:`autopar.models.moe`), and k/v are never repeated by hand for
grouped-query attention (``enable_gqa`` does it inside SDPA, as flash attention does).

Shapes: b = batch, s = sequence, h = hidden, a = heads, kv = kv heads, d = head_dim, f = ffn, V = vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from autopar.models.config import GATED_MLPS, ModelConfig
# RMSNorm, MLP, SwiGLU and make_norm are re-exported here, where they were first defined
from autopar.models.layers import MLP, RMSNorm, SwiGLU, make_norm  # noqa: F401
from autopar.models.moe import LatentAttention, MoE

# Init scales: std 0.02 everywhere (GPT-2, Megatron), and 0.02/sqrt(2L) for the projections that
# write into the residual stream (Megatron's output_layer_init_method), so the residual variance does
# not grow with depth.
INIT_STD = 0.02
_RESIDUAL_OUT = ("attn.wo.weight", "mlp.fc2.weight", "mlp.w2.weight", "shared.w2.weight",
                 "experts.down_proj")


def _as_dtype(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``table`` in ``x``'s dtype, with no cast where it has it already. Eager PyTorch's
    ``.to`` of the same dtype is a no-op too, but torch.export records it, and the export path
    of the extractor prices an aten ``to`` as a copy kernel; a torch.fx proxy keeps the call
    (the fx path counts a cast that copies nothing as a view)."""
    if isinstance(table, torch.Tensor) and isinstance(x, torch.Tensor) and table.dtype == x.dtype:
        return table
    return table.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021) with real-valued cos/sin tables.

    Uses the rotate-half layout (GPT-NeoX / Hugging Face): feature i pairs with i + d/2. Buffers
    ``cos`` and ``sin`` are [seq_len, d], not persistent (recomputed, never checkpointed). One
    instance is shared by every Attention of a model so the tables exist once.
    """

    def __init__(self, head_dim: int, seq_len: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.seq_len, self.theta = head_dim, seq_len, theta
        cos, sin = self._tables(None)  # None: the ambient default device (meta under build)
        self.register_buffer("cos", cos.to(torch.get_default_dtype()), persistent=False)
        self.register_buffer("sin", sin.to(torch.get_default_dtype()), persistent=False)

    def _tables(self, device: torch.device | None) -> tuple[torch.Tensor, torch.Tensor]:
        # Angles in float32 whatever the model dtype: bf16 cannot represent large position*freq.
        half = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device)
        inv_freq = 1.0 / (self.theta ** (half / self.head_dim))
        pos = torch.arange(self.seq_len, dtype=torch.float32, device=device)
        angles = torch.outer(pos, inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """Recompute the tables in place (needed after ``to_empty``, which leaves them garbage)."""
        if self.cos.is_meta:
            return
        cos, sin = self._tables(self.cos.device)
        self.cos.copy_(cos)
        self.sin.copy_(sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        # the tables stay fp32 (a buffer mixed precision does not cast); computing in them would
        # promote q and k to fp32 beside a bf16 v, which attention refuses
        return x * _as_dtype(cos, x) + rotated * _as_dtype(sin, x)

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [b, a, s, d] and k [b, kv, s, d] by their positions: 0..s-1 (s <= seq_len),
        or ``positions`` (int64 [s], each < seq_len; a context-parallel rank's global ones)."""
        if positions is None:
            # narrow, not [:s]: fx cannot slice a real buffer with a proxied size, but narrow
            # dispatches.
            s = q.size(2)
            cos, sin = self.cos.narrow(0, 0, s), self.sin.narrow(0, 0, s)
        else:
            cos, sin = self.cos[positions], self.sin[positions]
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)


class Attention(nn.Module):
    """Causal multi-head / grouped-query self-attention.

    ``wq``: h -> a*d, ``wk`` and ``wv``: h -> kv*d, ``wo``: a*d -> h (biases iff ``config.bias``);
    d is ``config.head_dim`` (``kv_channels`` where given). With ``config.qk_norm``, ``q_norm`` and
    ``k_norm`` (RMSNorm over d, per head, before RoPE: Qwen3, transformers ``Qwen3MoeAttention``),
    else None. ``rope``: the shared :class:`RotaryEmbedding` or None (learned positions). Input [b, s, h] ->
    output [b, s, h]. Attention-probability dropout (``config.attention_dropout``) is applied inside
    SDPA in training mode only.
    """

    def __init__(self, config: ModelConfig, rope: RotaryEmbedding | None = None) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, d
        self.attention_dropout = config.attention_dropout
        self.wq = nn.Linear(h, self.num_heads * d, bias=config.bias)
        self.wk = nn.Linear(h, self.num_kv_heads * d, bias=config.bias)
        self.wv = nn.Linear(h, self.num_kv_heads * d, bias=config.bias)
        self.wo = nn.Linear(self.num_heads * d, h, bias=config.bias)
        self.q_norm = RMSNorm(d, eps=config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(d, eps=config.norm_eps) if config.qk_norm else None
        self.rope = rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # unflatten/flatten instead of view(b, s, ...) so fx needs no shape proxies.
        q = self.wq(x).unflatten(-1, (self.num_heads, self.head_dim))
        k = self.wk(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.wv(x).unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)
        if self.rope is not None:
            q, k = self.rope(q, k)
        out = F.scaled_dot_product_attention(
            q, k, v,
            dropout_p=(self.attention_dropout if self.training else 0.0),
            is_causal=True,
            enable_gqa=(self.num_kv_heads < self.num_heads),
        )
        return self.wo(out.transpose(1, 2).flatten(2))


class Block(nn.Module):
    """Pre-norm transformer layer: x + drop(attn(attn_norm(x))), then x + drop(mlp(mlp_norm(x))).

    Attributes ``attn_norm``, ``attn`` (:class:`Attention`, or
    :class:`~autopar.models.moe.LatentAttention` for ``config.uses_mla``), ``mlp_norm``, ``mlp``
    (:class:`MLP`, :class:`SwiGLU`, or :class:`~autopar.models.moe.MoE` where
    ``config.moe_layer(index)``), and
    ``attn_drop``/``mlp_drop``: ``nn.Dropout(config.hidden_dropout)`` when that is > 0, else None
    (these are the two s*b*h dropout masks of Korthikanti et al. 2022). Input/output [b, s, h].
    """

    def __init__(self, config: ModelConfig, rope: RotaryEmbedding | None = None,
                 index: int = 0) -> None:
        super().__init__()
        self.attn_norm = make_norm(config)
        self.attn = LatentAttention(config, rope) if config.uses_mla else Attention(config, rope)
        self.mlp_norm = make_norm(config)
        if config.moe_layer(index):
            self.mlp = MoE(config)
        else:
            self.mlp = SwiGLU(config) if config.mlp in GATED_MLPS else MLP(config)
        p = config.hidden_dropout
        self.attn_drop = nn.Dropout(p) if p > 0 else None
        self.mlp_drop = nn.Dropout(p) if p > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.attn(self.attn_norm(x))
        if self.attn_drop is not None:
            y = self.attn_drop(y)
        x = x + y
        y = self.mlp(self.mlp_norm(x))
        if self.mlp_drop is not None:
            y = self.mlp_drop(y)
        return x + y


class Transformer(nn.Module):
    """Decoder-only language model built from a :class:`ModelConfig`.

    Attributes: ``config``; ``embed`` (nn.Embedding V x h); ``pos_embed`` (nn.Embedding seq_len x h
    for learned positions, else None); ``drop`` (embedding dropout, nn.Dropout(hidden_dropout) when
    > 0, else None); ``rope`` (shared :class:`RotaryEmbedding` for RoPE, else None); ``layers``
    (nn.ModuleList of :class:`Block`); ``norm`` (final norm); ``lm_head`` (nn.Linear h -> V, no bias;
    with tied embeddings ``lm_head.weight is embed.weight``).

    Built with the ambient default device/dtype (use ``autopar.models.build`` for meta builds and
    deterministic init). Construction uses torch's default init; call :meth:`init_weights` for the
    seeded one.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.embed = nn.Embedding(config.vocab_size, h)
        learned = config.position == "learned"
        self.pos_embed = nn.Embedding(config.seq_len, h) if learned else None
        self.drop = nn.Dropout(config.hidden_dropout) if config.hidden_dropout > 0 else None
        rotated = config.qk_rope_head_dim if config.uses_mla else config.head_dim
        self.rope = (None if learned else
                     RotaryEmbedding(rotated, config.seq_len, config.rope_theta))
        self.layers = nn.ModuleList(Block(config, self.rope, i) for i in range(config.num_layers))
        self.norm = make_norm(config)
        self.lm_head = nn.Linear(h, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Make ``lm_head.weight`` the very Parameter ``embed.weight`` when embeddings are tied.

        Needed again after ``to_empty``/``_apply`` conversions that replace Parameters.
        """
        if self.config.tied_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [b, s, V] (model dtype) for token ids ``input_ids`` [b, s] (int64, s <= seq_len)."""
        x = self.embed(input_ids)
        if self.pos_embed is not None:
            positions = torch.arange(input_ids.size(1), device=input_ids.device)
            x = x + self.pos_embed(positions)
        if self.drop is not None:
            x = self.drop(x)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Deterministic init from ``seed``, identical on any device and dtype.

        Linear/embedding weights ~ N(0, 0.02) (residual-output projections N(0, 0.02/sqrt(2L))),
        biases 0, norm weights 1; RoPE tables recomputed. Values are drawn in float32 on the CPU,
        in ``named_parameters`` order, then copied, so a CPU and a GPU model built with the same seed
        match. Does nothing on meta tensors.
        """
        params = dict(self.named_parameters())
        if any(p.is_meta for p in params.values()):
            return
        gen = torch.Generator(device="cpu").manual_seed(seed)
        out_std = INIT_STD / math.sqrt(2 * self.config.num_layers)
        for name, p in params.items():
            if name.endswith("bias"):
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                std = out_std if name.endswith(_RESIDUAL_OUT) else INIT_STD
                p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, std, generator=gen))
        if self.rope is not None:
            self.rope.reset_buffers()
