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
#: matrices like GELU, activation relu(x)^2.
MLPS = ("gelu", "swiglu", "squared-relu")
POSITIONS = ("learned", "rope")

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

    Raises:
        InvalidModelConfig: a field has the wrong type or breaks a rule (positive sizes, heads divide
            hidden, kv heads divide heads, known family/norm/mlp/position, dropouts in [0, 1)).
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

    def _check_divisibility(self) -> None:
        h, a, kv = self.hidden_size, self.num_heads, self.num_kv_heads
        if h % a:
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
        """Features per attention head: hidden_size // num_heads."""
        return self.hidden_size // self.num_heads

    @property
    def num_parameters(self) -> int:
        """Parameters (elements) of the :class:`~autopar.models.transformer.Transformer` this
        config builds, tied embeddings counted once: embedding V*h (+ seq_len*h learned
        positions); per layer q/o projections 2*h*a*d, k/v 2*h*kv*d, MLP 3*h*f (SwiGLU) or 2*h*f
        (GELU, squared ReLU), two norms (h each, +h each for LayerNorm with bias) and biases when ``bias``;
        final norm; LM head V*h unless tied."""
        h, f, v = self.hidden_size, self.ffn_hidden_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        norm = h * (2 if self.norm == "layernorm" and self.bias else 1)
        attn = h * (2 * q + 2 * kv) + ((q + 2 * kv + h) if self.bias else 0)
        mats = 3 if self.mlp == "swiglu" else 2
        mlp = mats * h * f + (((mats - 1) * f + h) if self.bias else 0)
        layer = attn + mlp + 2 * norm
        total = v * h + self.num_layers * layer + norm
        if self.position == "learned":
            total += self.seq_len * h
        if not self.tied_embeddings:
            total += v * h
        return total

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Build a config from a dict shaped like a ``model`` entry of published_plans.json.

        Keys: name, family, num_layers, hidden_size, num_heads, vocab_size, seq_len (required);
        num_kv_heads, ffn_hidden_size, tied_embeddings, mlp, norm and every other field of this class
        (optional, family defaults). The output of :meth:`to_dict` is accepted.

        Raises:
            InvalidModelConfig: ``d`` is not a mapping, has unknown or missing keys, or a value of the
                wrong type or breaking a rule.
        """
        if not isinstance(d, Mapping):
            raise InvalidModelConfig(f"a model dict must be a mapping, got {type(d).__name__}; "
                                     "fix: pass e.g. {'name': ..., 'family': 'gpt', ...}")
        label = d.get("name", "<unnamed>")
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
