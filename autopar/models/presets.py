"""Named model presets with their published hyperparameters, and :func:`get_config`."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from autopar.errors import InvalidModelConfig
from autopar.models.config import REQUIRED_KEYS, ModelConfig


@dataclass(frozen=True)
class Preset:
    """A named :class:`ModelConfig` and where its numbers come from (``source``: paper, table)."""

    config: ModelConfig
    source: str


_NARAYANAN = "Narayanan et al. 2021 (arXiv 2104.04473), Table 1; vocab 51200 and seq 2048 as there"
_LLAMA2 = "Touvron et al. 2023, Llama 2 (arXiv 2307.09288), Table 1 and the released params.json"
_LLAMA3 = "Dubey et al. 2024, The Llama 3 Herd of Models (arXiv 2407.21783), Table 3"


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelConfig:
    # Megatron pads GPT-2's 50257-token vocabulary to 51200; ffn 4h and tied embeddings are
    # Megatron GPT defaults.
    return ModelConfig(name=name, family="gpt", num_layers=layers, hidden_size=hidden,
                       num_heads=heads, vocab_size=51200, seq_len=2048,
                       ffn_hidden_size=4 * hidden, tied_embeddings=True)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
           seq: int, theta: float) -> ModelConfig:
    return ModelConfig(name=name, family="llama", num_layers=layers, hidden_size=hidden,
                       num_heads=heads, num_kv_heads=kv, ffn_hidden_size=ffn, vocab_size=vocab,
                       seq_len=seq, tied_embeddings=False, rope_theta=theta)


# (layers, hidden, heads) from Narayanan et al. 2021 Table 1, the same numbers as the
# megatron-ptdp-* records of published_plans.json.
_NARAYANAN_SIZES = {
    "gpt-1.7b": (24, 2304, 24),
    "gpt-3.6b": (30, 3072, 32),
    "gpt-7.5b": (36, 4096, 32),
    "gpt-18.4b": (40, 6144, 48),
    "gpt-39.1b": (48, 8192, 64),
    "gpt-76.1b": (60, 10240, 80),
    "gpt-145.6b": (80, 12288, 96),
    "gpt-310.1b": (96, 16384, 128),
    "gpt-529.6b": (105, 20480, 128),
    "gpt-1008b": (128, 25600, 160),
}


#: What the Qwen3 MoE models share (their config.json files): 4 KV heads of 128, qk-norm,
#: 128 experts top-8, the 151,936-token vocabulary
_QWEN3_MOE = dict(num_kv_heads=4, kv_channels=128, qk_norm=True, vocab_size=151936,
                  seq_len=40960, rope_theta=1e6, norm_eps=1e-6, num_experts=128, top_k=8,
                  router_load_balancing="global_aux_loss", router_aux_loss_coeff=1e-3)
#: Where Qwen3-MoE's router settings come from (the preset's source).
_QWEN3_ROUTER = ("; router: softmax with the global-batch load-balancing loss (Qwen3 technical "
                 "report, arXiv 2505.09388, section 2), coefficient 0.001 (router_aux_loss_coef,"
                 " also transformers' Qwen3MoeConfig default)")


#: What DeepSeek-V2 and V3 share (their config.json files): 128 heads of latent attention with
#: the same ranks and head sizes
_DEEPSEEK_MLA = dict(num_heads=128, num_kv_heads=128, seq_len=163840, norm_eps=1e-6,
                     q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                     qk_rope_head_dim=64, v_head_dim=128)


def _build_presets() -> dict[str, Preset]:
    presets = {
        "gpt3-175b": Preset(_gpt("gpt3-175b", 96, 12288, 96),
                            "Brown et al. 2020 (arXiv 2005.14165), Table 2.1; vocab 51200 and "
                            "seq 2048 as in Narayanan et al. 2021 (arXiv 2104.04473)"),
    }
    for name, (layers, hidden, heads) in _NARAYANAN_SIZES.items():
        presets[name] = Preset(_gpt(name, layers, hidden, heads), _NARAYANAN)
    llamas = [
        ("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 10000.0, _LLAMA2),
        ("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, 10000.0, _LLAMA2),
        ("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 10000.0, _LLAMA2),
        ("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0, _LLAMA3),
        ("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000.0, _LLAMA3),
        ("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, 500000.0, _LLAMA3),
    ]
    for name, *shape, source in llamas:
        presets[name] = Preset(_llama(name, *shape), source)
    # Mixtures of experts (issue 26), each hub repository's config.json; built by autopar's
    # own model (autopar/models/moe.py), no transformers needed. Not representable here, so
    # only as hf-* presets: gpt-oss (attention sinks, sliding windows) and Llama 4 (chunked
    # attention, interleaved dense layers of another width).
    moe = [
        ("mixtral-8x7b", dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                              ffn_hidden_size=14336, vocab_size=32000, seq_len=32768,
                              rope_theta=1e6, num_experts=8, top_k=2, moe_ffn_hidden_size=14336,
                              router_aux_loss_coeff=0.02),
         "mistralai/Mixtral-8x7B-v0.1 config.json (router_aux_loss_coef 0.02: a softmax "
         "router with the Switch aux loss)"),
        ("mixtral-8x22b", dict(num_layers=56, hidden_size=6144, num_heads=48, num_kv_heads=8,
                               ffn_hidden_size=16384, vocab_size=32768, seq_len=65536,
                               rope_theta=1e6, num_experts=8, top_k=2,
                               moe_ffn_hidden_size=16384),
         "mistralai/Mixtral-8x22B-v0.1 config.json"),
        ("qwen3-30b-a3b", dict(_QWEN3_MOE, num_layers=48, hidden_size=2048, num_heads=32,
                               ffn_hidden_size=6144, moe_ffn_hidden_size=768),
         "Qwen/Qwen3-30B-A3B config.json" + _QWEN3_ROUTER),
        ("qwen3-235b-a22b", dict(_QWEN3_MOE, num_layers=94, hidden_size=4096, num_heads=64,
                                 ffn_hidden_size=12288, moe_ffn_hidden_size=1536),
         "Qwen/Qwen3-235B-A22B config.json" + _QWEN3_ROUTER),
        ("deepseek-v2", dict(_DEEPSEEK_MLA, num_layers=60, hidden_size=5120,
                             ffn_hidden_size=12288, vocab_size=102400, num_experts=160, top_k=6,
                             moe_ffn_hidden_size=1536, num_shared_experts=2,
                             first_dense_layers=1),
         "deepseek-ai/DeepSeek-V2 config.json (group-limited routing as one group)"),
        ("deepseek-v3", dict(_DEEPSEEK_MLA, num_layers=61, hidden_size=7168,
                             ffn_hidden_size=18432, vocab_size=129280, num_experts=256, top_k=8,
                             moe_ffn_hidden_size=2048, num_shared_experts=1,
                             first_dense_layers=3, mtp_layers=1,
                             router_score_function="sigmoid", router_expert_bias=True,
                             router_load_balancing="seq_aux_loss", router_aux_loss_coeff=1e-4),
         "deepseek-ai/DeepSeek-V3 config.json (num_nextn_predict_layers 1: the MTP module it "
         "was trained with, arXiv 2412.19437 section 4.2; group-limited routing as one group); "
         "router: sigmoid affinities, auxiliary-loss-free balancing by expert bias and a "
         "sequence-wise balance loss with factor 1e-4 (arXiv 2412.19437 sections 2.1.2 and "
         "4.2)"),
    ]
    for name, shape, source in moe:
        presets[name] = Preset(ModelConfig(name=name, family="llama", tied_embeddings=False,
                                           **shape), source)
    # Tiny models for fast CPU tests; made up, not published.
    presets["tiny-gpt"] = Preset(
        ModelConfig(name="tiny-gpt", family="gpt", num_layers=4, hidden_size=64, num_heads=4,
                    ffn_hidden_size=128, vocab_size=256, seq_len=32),
        "autopar test model (not published)")
    presets["tiny-llama"] = Preset(
        ModelConfig(name="tiny-llama", family="llama", num_layers=4, hidden_size=64, num_heads=4,
                    num_kv_heads=2, ffn_hidden_size=176, vocab_size=256, seq_len=32),
        "autopar test model (not published)")
    return presets


#: Every preset by lower-case name (read-only).
PRESETS: Mapping[str, Preset] = MappingProxyType(_build_presets())


def list_presets() -> list[str]:
    """Names of all presets, in definition order (lower case; lookups ignore case)."""
    return list(PRESETS)


#: A Hugging Face Hub model id: "owner/name", no further slash, no file extension
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*"
                     r"(?<!\.json)(?<!\.py)(?<!\.yaml)(?<!\.yml)(?<!\.txt)")


def get_config(spec: str | Mapping[str, Any] | ModelConfig) -> ModelConfig:
    """Resolve a preset name, a published-plans-style model dict, or a config to a ModelConfig.

    Names are case-insensitive. A ModelConfig is returned unchanged; a dict goes through
    :meth:`ModelConfig.from_dict`.

    Raises:
        InvalidModelConfig: unknown preset name (message lists the valid names and the closest
            match), an invalid dict, or a value of another type.
    """
    if isinstance(spec, ModelConfig):
        return spec
    if isinstance(spec, Mapping):
        return ModelConfig.from_dict(spec)
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key in PRESETS:
            return PRESETS[key].config
        # a preset the name begins (gpt3 -> gpt3-175b), else the closest by spelling; a
        # loose match (gpt4 -> gpt-18.4b) misleads more than none
        # a letter O typed for a zero beside a digit (llama2-7OB) first: spelling alone finds
        # the shorter llama2-7b
        digits = re.sub(r"(?<=\d)o|o(?=\d)", "0", key)
        close = ([digits] if digits in PRESETS else
                 ([p for p in PRESETS if p.startswith(key)][:1]
                  or difflib.get_close_matches(key, list(PRESETS), n=1, cutoff=0.65)))
        hint = f" Did you mean {close[0]!r}?" if close else ""
        if _HUB_ID.fullmatch(spec.strip()):
            # "owner/name" as the Hugging Face Hub names a model: nothing is downloaded
            hint = (" It looks like a Hugging Face Hub id: autopar downloads nothing; use an "
                    "hf-* preset of that family (`autopar models` lists them, e.g. "
                    "'hf-mistral-7b'), or in Python pass the transformers model built on the "
                    "meta device (autopar.optimize(model, cluster, train)).")
        elif "/" in spec or "\\" in spec or key.endswith((".txt", ".yaml", ".yml", ".py")):
            # a path that is not a .json model file (the CLI reads only those); one that does
            # not exist is said first (a user fixing the suffix would meet that next)
            missing = "" if Path(spec.strip()).exists() else " (and no such file exists)"
            hint = (f" It looks like a file path{missing}: a model file must be a .json file "
                    "holding a model dict (e.g. model.json).")
        raise InvalidModelConfig(f"unknown model preset {spec!r}.{hint} Valid presets: "
                                 f"{', '.join(PRESETS)}; a Hugging Face preset (hf-*, listed by "
                                 f"`autopar models`); or a model dict with keys "
                                 f"{', '.join(REQUIRED_KEYS)}.")
    raise InvalidModelConfig(f"a model must be a preset name, a model dict or a ModelConfig, got "
                             f"{type(spec).__name__}; fix: pass e.g. 'llama3-8b'")
