"""The shape of a transformer: :class:`ModelConfig`.

Two families are modelled:

- ``gpt``: Megatron-LM GPT (Shoeybi et al. 2019; Narayanan et al. 2021): LayerNorm, GELU MLP, learned
  positions, biases on every linear, dropout 0.1 on embeddings, attention probabilities and both
  residual branches (Megatron's defaults; Korthikanti et al. 2022 count these dropout masks in
  activation memory, so they must be present for the memory model to match).
- ``llama``: Llama 2/3 (Touvron et al. 2023; Dubey et al. 2024): RMSNorm, SwiGLU MLP, RoPE,
  grouped-query attention, no biases, no dropout.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from autopar.errors import InvalidModelConfig

FAMILIES = ("gpt", "llama")
NORMS = ("layernorm", "rmsnorm")
#: MLP kinds: GELU (GPT), SwiGLU (Llama; Shazeer 2020), squared ReLU (So et al. 2021, Primer,
#: arXiv 2109.08668; Nemotron-4, arXiv 2402.16819; Megatron-LM ``--squared-relu``): two
#: matrices like GELU, activation relu(x)^2; GeGLU (Shazeer 2020, arXiv 2002.05202; T5 v1.1,
#: Gemma): three matrices like SwiGLU, the gate through tanh-approximated GELU as Gemma's
#: ``gelu_pytorch_tanh`` and Megatron-Core's fused ``bias_geglu`` (fusions/fused_bias_geglu.py).
MLPS = ("gelu", "swiglu", "squared-relu", "geglu")
#: MLPs with a gate: act(x W_gate) * (x W_up), then W_down (three h x f matrices).
GATED_MLPS = ("swiglu", "geglu")
POSITIONS = ("learned", "rope")
#: MoE router score functions and load-balancing types, as Megatron-Core 0.16.1 names them
#: (megatron/core/transformer/transformer_config.py ``moe_router_score_function``,
#: ``moe_router_load_balancing_type``; one type, not Megatron's list of several).
ROUTER_SCORE_FUNCTIONS = ("softmax", "sigmoid")
ROUTER_LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")
#: Router settings of a MoE model and their defaults: Megatron-Core 0.16.1's TransformerConfig
#: defaults (``moe_router_score_function="softmax"``, ``moe_router_load_balancing_type=
#: "aux_loss"``, ``moe_aux_loss_coeff=0.0``, ``moe_router_enable_expert_bias=False``,
#: ``moe_z_loss_coeff=None``). A dense model keeps them all at these values.
ROUTER_DEFAULTS: dict[str, Any] = {
    "router_score_function": "softmax", "router_load_balancing": "aux_loss",
    "router_aux_loss_coeff": 0.0, "router_expert_bias": False, "router_z_loss_coeff": None}

# Family defaults for the fields left as None. Sources: Megatron-LM arguments.py (gpt), Llama
# reference model.py / params.json (llama).
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt": dict(tied_embeddings=True, norm="layernorm", mlp="gelu", position="learned", bias=True,
                attention_dropout=0.1, hidden_dropout=0.1),
    "llama": dict(tied_embeddings=False, norm="rmsnorm", mlp="swiglu", position="rope", bias=False,
                  attention_dropout=0.0, hidden_dropout=0.0),
}

_INT_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
               "vocab_size", "seq_len")
#: Mixture-of-experts and latent-attention sizes (0 = absent; ``None`` = derived, see
#: :class:`ModelConfig`); counts, each at most ``MAX_SIZE["ffn_hidden_size"]``.
_MOE_INT_FIELDS = ("kv_channels", "num_experts", "top_k", "moe_ffn_hidden_size",
                   "num_shared_experts", "shared_expert_ffn_hidden_size", "first_dense_layers",
                   "moe_layer_interval", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                   "qk_rope_head_dim", "v_head_dim", "mtp_layers")
#: Every field that describes experts, latent attention, qk-norm, the head size or MTP: absent
#: (the defaults) in a dense model.
MOE_FIELDS = (*_MOE_INT_FIELDS, "qk_norm")
#: Largest value accepted per size field: beyond any published model (GPT-3: 96 layers, h=12288;
#: Llama 3 405B: 126 layers, h=16384, 128K vocabulary), and small enough that building the meta
#: model and its graph stays within seconds (a 4096-layer model takes ~10 s to extract).
MAX_SIZE = {"num_layers": 4096, "hidden_size": 2 ** 20, "num_heads": 2 ** 16,
            "num_kv_heads": 2 ** 16, "ffn_hidden_size": 2 ** 22, "vocab_size": 2 ** 24,
            "seq_len": 2 ** 24}
#: Keys a model dict must have (:meth:`ModelConfig.from_dict`).
REQUIRED_KEYS = ("name", "family", "num_layers", "hidden_size", "num_heads", "vocab_size",
                 "seq_len")


def _fail(name: str, message: str) -> InvalidModelConfig:
    return InvalidModelConfig(f"model {name!r}: {message}")


def default_ffn_hidden_size(family: str, hidden_size: int) -> int:
    """Default MLP width for ``family`` at ``hidden_size`` h.

    gpt: 4h (Megatron). llama: 2/3 of 4h rounded up to a multiple of 256, the rule of the Llama
    reference code without ``ffn_dim_multiplier`` (gives 11008 at h=4096 and 13824 at h=5120).
    """
    if family == "llama":
        return 256 * math.ceil(8 * hidden_size / 3 / 256)
    return 4 * hidden_size


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Hyperparameters of a decoder-only transformer (immutable, validated on construction).

    Sizes are counts (layers, features, heads, tokens), not bytes. Fields left as ``None`` take the
    family defaults (see module docstring): ``num_kv_heads`` -> ``num_heads``; ``ffn_hidden_size`` ->
    :func:`default_ffn_hidden_size`; ``tied_embeddings``, ``norm``, ``mlp``, ``position``, ``bias``,
    ``attention_dropout``, ``hidden_dropout`` -> the family's. After construction no field is None.

    ``seq_len`` is the maximum number of positions (size of the learned position table or of the RoPE
    table) and the default training sequence length. ``position`` ("learned" | "rope") and ``bias``
    and ``rope_theta`` are additions beyond the published-plans schema so that every architectural
    choice is explicit.

    Mixture of experts and its neighbours (llama family only; 0 = absent): ``num_experts``
    routed experts per MoE layer, ``top_k`` of them per token, each ``moe_ffn_hidden_size``
    wide; ``num_shared_experts`` always-on experts, ``shared_expert_ffn_hidden_size`` wide in
    all (default: count x expert width); ``first_dense_layers`` leading dense layers and a MoE
    layer every ``moe_layer_interval`` (:meth:`moe_layer`). Latent attention (DeepSeek-V2/V3):
    ``kv_lora_rank`` > 0 with ``q_lora_rank`` (0: uncompressed queries), ``qk_nope_head_dim``,
    ``qk_rope_head_dim``, ``v_head_dim``. ``kv_channels``: the head size when not h/a
    (Megatron's ``--kv-channels``); ``qk_norm``: RMSNorm on queries and keys per head (Qwen3).
    The built-in model builds them all (:mod:`autopar.models.moe`); see
    :attr:`needs_transformers` for the one case planned from transformers.
    ``mtp_layers``: DeepSeek-V3's multi-token-prediction modules (:mod:`autopar.graph.mtp`).

    Router (MoE only; defaults and names are Megatron-Core's, :data:`ROUTER_DEFAULTS`):
    ``router_score_function`` ("softmax" | "sigmoid"), ``router_load_balancing`` (one of
    :data:`ROUTER_LOAD_BALANCING`), ``router_aux_loss_coeff`` (0: the aux loss is not computed),
    ``router_expert_bias`` (aux-loss-free balancing, DeepSeek-V3; needs sigmoid) and
    ``router_z_loss_coeff`` (None: no z-loss). Their training-only kernels are priced by
    :mod:`autopar.graph.router`.

    Raises:
        InvalidModelConfig: a field has the wrong type or breaks a rule (positive sizes, heads divide
            hidden, kv heads divide heads, known family/norm/mlp/position, dropouts in [0, 1),
            MoE and latent-attention sizes complete and consistent).
    """

    name: str
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    seq_len: int
    num_kv_heads: int | None = None
    ffn_hidden_size: int | None = None
    tied_embeddings: bool | None = None
    norm: str | None = None
    mlp: str | None = None
    position: str | None = None
    bias: bool | None = None
    attention_dropout: float | None = None
    hidden_dropout: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    kv_channels: int | None = None
    qk_norm: bool = False
    num_experts: int = 0
    top_k: int = 0
    moe_ffn_hidden_size: int | None = None
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int | None = None
    first_dense_layers: int = 0
    moe_layer_interval: int = 1
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0
    router_score_function: str = "softmax"
    router_load_balancing: str = "aux_loss"
    router_aux_loss_coeff: float = 0.0
    router_expert_bias: bool = False
    router_z_loss_coeff: float | None = None

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        if not isinstance(self.name, str) or not self.name:
            raise InvalidModelConfig(f"model name must be a non-empty string, got {self.name!r}; "
                                     "fix: pass name='my-model'")
        name = self.name
        family = self.family.lower() if isinstance(self.family, str) else self.family
        if family not in FAMILIES:
            raise _fail(name, f"family={self.family!r} is not one of {FAMILIES}; fix: use 'gpt' "
                              "(LayerNorm/GELU/learned positions) or 'llama' (RMSNorm/SwiGLU/RoPE)")
        set_("family", family)
        for key in _INT_FIELDS:
            value = getattr(self, key)
            if value is None and key in ("num_kv_heads", "ffn_hidden_size"):
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise _fail(name, f"{key} must be an int, got {type(value).__name__} {value!r}; "
                                  f"fix: pass {key} as a whole number")
            if value <= 0:
                raise _fail(name, f"{key}={value} must be positive; fix: pass {key} >= 1")
            if value > MAX_SIZE[key]:
                raise _fail(name, f"{key}={value} exceeds the largest value autopar plans for "
                                  f"({MAX_SIZE[key]}); fix: pass {key} <= {MAX_SIZE[key]}")
        if self.num_kv_heads is None:
            set_("num_kv_heads", self.num_heads)
        if self.ffn_hidden_size is None:
            set_("ffn_hidden_size", default_ffn_hidden_size(family, self.hidden_size))
        for key, default in _FAMILY_DEFAULTS[family].items():
            if getattr(self, key) is None:
                set_(key, default)
        self._check_choices()
        self._check_numbers()
        self._check_moe()
        self._check_router()
        self._check_divisibility()

    def _check_choices(self) -> None:
        for key, allowed in (("norm", NORMS), ("mlp", MLPS), ("position", POSITIONS)):
            value = getattr(self, key)
            value = value.lower() if isinstance(value, str) else value
            if value not in allowed:
                raise _fail(self.name, f"{key}={getattr(self, key)!r} is not one of {allowed}; "
                                       f"fix: use one of {allowed} or omit {key} for the "
                                       f"{self.family} default")
            object.__setattr__(self, key, value)
        for key in ("tied_embeddings", "bias"):
            if not isinstance(getattr(self, key), bool):
                raise _fail(self.name, f"{key} must be a bool, got {getattr(self, key)!r}; "
                                       f"fix: pass {key}=True or False")

    def _check_numbers(self) -> None:
        for key in ("attention_dropout", "hidden_dropout", "norm_eps", "rope_theta"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _fail(self.name, f"{key} must be a number, got {value!r}; fix: pass a float")
            object.__setattr__(self, key, float(value))
        for key in ("attention_dropout", "hidden_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise _fail(self.name, f"{key}={getattr(self, key)} must be in [0, 1); "
                                       "fix: use 0.0 (no dropout) or e.g. 0.1 (Megatron GPT)")
        for key in ("norm_eps", "rope_theta"):
            if not 0 < getattr(self, key) < math.inf:
                raise _fail(self.name, f"{key}={getattr(self, key)} must be finite and > 0; "
                                       f"fix: e.g. norm_eps=1e-5, rope_theta=10000")

    def _check_moe(self) -> None:
        name = self.name
        for key in _MOE_INT_FIELDS:
            value = getattr(self, key)
            if value is None and key in ("kv_channels", "moe_ffn_hidden_size",
                                         "shared_expert_ffn_hidden_size"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _fail(name, f"{key} must be a whole number >= 0, got {value!r}; fix: pass "
                                  f"{key} as an int (0 = none)")
            if value > MAX_SIZE["ffn_hidden_size"]:
                raise _fail(name, f"{key}={value} exceeds {MAX_SIZE['ffn_hidden_size']}")
        if not isinstance(self.qk_norm, bool):
            raise _fail(name, f"qk_norm must be a bool, got {self.qk_norm!r}; fix: true or "
                              "false")
        if self.kv_channels == 0:
            raise _fail(name, "kv_channels=0; fix: omit it (hidden_size / num_heads) or pass "
                              "the head size")
        special = self.is_moe or self.uses_mla or self.qk_norm or self.kv_channels is not None
        if special and self.family != "llama":
            raise _fail(name, "experts, latent attention, qk_norm and kv_channels are modelled "
                              "for the llama family (RMSNorm, SwiGLU, RoPE); fix: family='llama'")
        if self.moe_layer_interval < 1:
            raise _fail(name, "moe_layer_interval must be >= 1 (1: every layer after the "
                              "first_dense_layers is MoE); fix: moe_layer_interval=1, or "
                              "omit it")
        if not self.is_moe:
            moe_keys = [k for k in ("top_k", "num_shared_experts", "first_dense_layers")
                        if getattr(self, k)]
            if moe_keys or self.moe_ffn_hidden_size is not None:
                raise _fail(name, f"{moe_keys or ['moe_ffn_hidden_size']} set with "
                                  "num_experts=0; fix: pass num_experts (routed experts per "
                                  "MoE layer) or drop them")
        else:
            if self.num_experts < 2:
                raise _fail(name, f"num_experts={self.num_experts}: a MoE layer routes among "
                                  "at least 2 experts; fix: num_experts >= 2, or 0 for dense")
            if self.top_k == 0:   # the field's default: most often not given at all
                raise _fail(name, f"top_k=0 (routed experts per token; 0 when not given) must "
                                  f"be in [1, num_experts={self.num_experts}]; fix: pass top_k "
                                  "with num_experts (Mixtral 8x7B: 2 of 8)")
            if not 1 <= self.top_k <= self.num_experts:
                raise _fail(name, f"top_k={self.top_k} must be in [1, num_experts="
                                  f"{self.num_experts}] (routed experts per token); fix: top_k "
                                  f"at most {self.num_experts} (Mixtral 8x7B: 2 of 8), or more "
                                  "num_experts")
            if not self.moe_ffn_hidden_size:
                raise _fail(name, "moe_ffn_hidden_size (each routed expert's MLP width) is "
                                  "missing; fix: pass it (Mixtral 8x7B: 14336)")
            if self.first_dense_layers >= self.num_layers:
                raise _fail(name, f"first_dense_layers={self.first_dense_layers} leaves no MoE "
                                  f"layer among {self.num_layers}; fix: fewer, or num_experts=0")
            if self.shared_expert_ffn_hidden_size is None:
                object.__setattr__(self, "shared_expert_ffn_hidden_size",
                                   self.num_shared_experts * self.moe_ffn_hidden_size)
        mla = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        if self.kv_lora_rank and not all(getattr(self, k) for k in mla):
            raise _fail(name, f"latent attention (kv_lora_rank={self.kv_lora_rank}) needs "
                              f"{list(mla)} > 0; fix: pass them (DeepSeek-V3: 128, 64, 128)")
        if not self.kv_lora_rank and (self.q_lora_rank or any(getattr(self, k) for k in mla)):
            raise _fail(name, "q_lora_rank / qk_*_head_dim / v_head_dim describe latent "
                              "attention, which needs kv_lora_rank > 0; fix: pass kv_lora_rank "
                              "or drop them")

    def _check_router(self) -> None:
        name = self.name
        for key, allowed in (("router_score_function", ROUTER_SCORE_FUNCTIONS),
                             ("router_load_balancing", ROUTER_LOAD_BALANCING)):
            value = getattr(self, key)
            value = value.lower() if isinstance(value, str) else value
            if value not in allowed:
                raise _fail(name, f"{key}={getattr(self, key)!r} is not one of {allowed}; fix: "
                                  f"use one of them (Megatron-Core's default: "
                                  f"{ROUTER_DEFAULTS[key]!r})")
            object.__setattr__(self, key, value)
        if not isinstance(self.router_expert_bias, bool):
            raise _fail(name, f"router_expert_bias must be a bool, got "
                              f"{self.router_expert_bias!r}")
        for key in ("router_aux_loss_coeff", "router_z_loss_coeff"):
            value = getattr(self, key)
            if value is None and key == "router_z_loss_coeff":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 <= value < math.inf):
                raise _fail(name, f"{key} must be a finite number >= 0, got {value!r}; fix: "
                                  "e.g. 1e-2 (aux loss) or 1e-3 (z-loss); 0 / None = off")
            object.__setattr__(self, key, float(value))
        changed = [k for k, v in ROUTER_DEFAULTS.items() if getattr(self, k) != v]
        if changed and not self.is_moe:
            raise _fail(name, f"{changed} set on a model without experts; fix: drop them, or "
                              "pass num_experts")
        if self.router_expert_bias and self.router_score_function != "sigmoid":
            # Megatron-Core transformer_config.py __post_init__ refuses the same
            raise _fail(name, "router_expert_bias (aux-loss-free balancing) needs "
                              "router_score_function='sigmoid', as Megatron-Core requires; fix: "
                              "set it, or router_expert_bias=False")
        if self.router_load_balancing == "sinkhorn" and self.router_aux_loss_coeff:
            # Megatron-Core moe/router.py sinkhorn_load_balancing asserts moe_aux_loss_coeff == 0
            raise _fail(name, "sinkhorn routing takes no aux loss (Megatron-Core asserts "
                              "moe_aux_loss_coeff == 0); fix: router_aux_loss_coeff=0")

    @property
    def router_aux_loss(self) -> str | None:
        """The auxiliary load-balancing loss the router computes in training ("aux_loss",
        "seq_aux_loss" or "global_aux_loss"), or None: Megatron-Core skips each loss whose
        coefficient is 0 (moe/router.py ``_apply_aux_loss``: ``if aux_loss_coeff == 0: return
        probs``), its default."""
        if self.router_load_balancing.endswith("aux_loss") and self.router_aux_loss_coeff > 0:
            return self.router_load_balancing
        return None

    def _check_divisibility(self) -> None:
        h, a, kv = self.hidden_size, self.num_heads, self.num_kv_heads
        if h % a and self.kv_channels is None and not self.uses_mla:
            divisors = [d for d in range(1, min(h, 4 * a) + 1) if h % d == 0]
            ok = sorted(sorted(divisors, key=lambda d: abs(d - a))[:4])
            raise _fail(self.name, f"num_heads={a} must divide hidden_size={h} (h % heads = "
                                   f"{h % a}); fix: pick num_heads among divisors of {h} such as "
                                   f"{ok}, or change hidden_size to a multiple of {a}")
        if a % kv:
            ok = [d for d in range(1, a + 1) if a % d == 0]
            raise _fail(self.name, f"num_kv_heads={kv} must divide num_heads={a} (each kv head "
                                   f"serves a whole group of query heads); fix: use one of {ok}")
        if self.position == "rope" and self.head_dim % 2:
            raise _fail(self.name, f"head_dim = hidden_size/num_heads = {self.head_dim} must be even "
                                   "for RoPE (it rotates pairs of features); fix: change "
                                   "num_heads or hidden_size")

    @property
    def head_dim(self) -> int:
        """Features per attention head: ``kv_channels`` where given (Qwen3: 128 at h=2048 with
        32 heads), else hidden_size // num_heads."""
        return self.kv_channels or self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        """Whether the model has mixture-of-experts layers (``num_experts`` > 0)."""
        return self.num_experts > 0

    @property
    def uses_mla(self) -> bool:
        """Whether attention is multi-head latent attention (DeepSeek-V2/V3: ``kv_lora_rank`` >
        0)."""
        return self.kv_lora_rank > 0

    @property
    def needs_transformers(self) -> bool:
        """Whether planning traces the equivalent Hugging Face transformers model
        (:func:`autopar.models.hf_equivalent.preset_for_config`) instead of the built-in
        :class:`~autopar.models.transformer.Transformer`: only for latent attention without
        experts. The built-in model builds experts, latent attention, qk-norm and any head
        size; a MoE block is measured through torch.export, where the extractor recognises
        MoE, and MLA's low-rank projections kept whole under TP (``aten.replicated_linears``),
        but a dense model goes through torch.fx, which has no such rule for MLA."""
        return self.uses_mla and not self.is_moe

    def moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (0-based) is a MoE layer: after the
        ``first_dense_layers``, those with (index + 1) divisible by ``moe_layer_interval``
        (transformers' Qwen2-MoE ``decoder_sparse_step`` and Llama 4
        ``interleave_moe_layer_step`` rule)."""
        if not self.is_moe or index < self.first_dense_layers:
            return False
        return (index + 1) % self.moe_layer_interval == 0

    @property
    def num_parameters(self) -> int:
        """Parameters (elements) of the :class:`~autopar.models.transformer.Transformer` this
        config builds, tied embeddings counted once: embedding V*h (+ seq_len*h learned
        positions); per layer q/o projections 2*h*a*d, k/v 2*h*kv*d, MLP 3*h*f (SwiGLU, GeGLU) or
        2*h*f (GELU, squared ReLU), two norms (h each, +h each for LayerNorm with bias) and biases when ``bias``;
        final norm; LM head V*h unless tied. A MoE layer has E routed experts of 3*h*f_e and a
        router row each (h*E), and shared experts 3*h*f_s, instead of the MLP; latent attention
        as :meth:`_mla_parameters`. Router biases and shared-expert gates (E or h per layer,
        depending on the implementation) are not counted. Each multi-token-prediction module
        adds a copy of the last layer and its 2h x h projection (:mod:`autopar.graph.mtp`)."""
        h, f, v = self.hidden_size, self.ffn_hidden_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        norm = h * (2 if self.norm == "layernorm" and self.bias else 1)
        attn = h * (2 * q + 2 * kv) + ((q + 2 * kv + h) if self.bias else 0)
        if self.uses_mla:
            attn = self._mla_parameters()
        if self.qk_norm:
            attn += 2 * self.head_dim
        mats = 3 if self.mlp in GATED_MLPS else 2
        mlp = mats * h * f + (((mats - 1) * f + h) if self.bias else 0)
        moe = (self.num_experts * (3 * h * (self.moe_ffn_hidden_size or 0) + h)
               + 3 * h * (self.shared_expert_ffn_hidden_size or 0))
        n_moe = sum(self.moe_layer(i) for i in range(self.num_layers))
        layer = attn + mlp + 2 * norm
        total = v * h + self.num_layers * layer + n_moe * (moe - mlp) + norm
        last = layer + (moe - mlp if self.moe_layer(self.num_layers - 1) else 0)
        total += self.mtp_layers * (last + 2 * h * h)
        if self.position == "learned":
            total += self.seq_len * h
        if not self.tied_embeddings:
            total += v * h
        return total

    def _mla_parameters(self) -> int:
        """Multi-head latent attention per layer (DeepSeek-V2, arXiv 2405.04434, section 2.1):
        query h*a*(dn+dr), or h*rq + rq + rq*a*(dn+dr) with a compressed query; key/value
        down-projection h*(rkv+dr) and its norm rkv; up-projection rkv*a*(dn+dv); output a*dv*h."""
        h, a = self.hidden_size, self.num_heads
        dn, dr, dv = self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        rq, rkv = self.q_lora_rank, self.kv_lora_rank
        query = h * a * (dn + dr) if not rq else h * rq + rq + rq * a * (dn + dr)
        return query + h * (rkv + dr) + rkv + rkv * a * (dn + dv) + a * dv * h

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Build a config from a dict shaped like a ``model`` entry of published_plans.json.

        Keys: name, family, num_layers, hidden_size, num_heads, vocab_size, seq_len (required);
        num_kv_heads, ffn_hidden_size, tied_embeddings, mlp, norm and every other field of this class
        (optional, family defaults); ``head_dim`` is read as ``kv_channels``. The output of
        :meth:`to_dict` is accepted.

        Raises:
            InvalidModelConfig: ``d`` is not a mapping, is a Hugging Face config (``model_type``
                or ``architectures``), has unknown or missing keys, or a value of the wrong
                type or breaking a rule.
        """
        if not isinstance(d, Mapping):
            raise InvalidModelConfig(f"a model dict must be a mapping, got {type(d).__name__}; "
                                     "fix: pass e.g. {'name': ..., 'family': 'gpt', ...}")
        if "model_type" in d or "architectures" in d:   # a transformers config.json
            raise InvalidModelConfig(
                f"this is a Hugging Face config (model_type {d.get('model_type')!r}), not "
                "autopar's model dict. Fix: use the hf-* preset of its family (`autopar "
                "models`), in Python pass the transformers model built on the meta device, or "
                "write autopar's keys (name, family; num_hidden_layers -> num_layers, "
                "num_attention_heads -> num_heads, num_key_value_heads -> num_kv_heads, "
                "intermediate_size -> ffn_hidden_size, max_position_embeddings -> seq_len).")
        label = d.get("name", "<unnamed>")
        if "head_dim" in d:
            # the published-run records' (and transformers') name for Megatron's kv_channels
            if "kv_channels" in d:
                raise _fail(label, "both head_dim and kv_channels given (the same size); fix: "
                                   "keep one")
            d = {("kv_channels" if k == "head_dim" else k): v for k, v in d.items()}
        valid = [f.name for f in fields(cls)]
        unknown = sorted(str(k) for k in d if k not in valid)
        if unknown:
            hints = {k: difflib.get_close_matches(k, valid, n=1) for k in unknown}
            hint = "; ".join(f"{k!r} -> did you mean {v[0]!r}?" for k, v in hints.items() if v)
            raise _fail(label, f"unknown key(s) {unknown}; valid keys are {valid}"
                               + (f"; {hint}" if hint else ""))
        missing = [k for k in REQUIRED_KEYS if k not in d]
        if missing:
            raise _fail(label, f"missing required key(s) {missing}; fix: add them "
                               f"(required: {list(REQUIRED_KEYS)})")
        return cls(**dict(d))

    def to_dict(self) -> dict[str, Any]:
        """Every field as a JSON-ready dict; ``ModelConfig.from_dict(c.to_dict()) == c``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
