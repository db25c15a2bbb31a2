"""Hugging Face transformers models built from configs only (no weights, no hub access), on meta.

``build("hf-llama3-8b")`` gives a ``LlamaForCausalLM`` on the meta device in bf16 with SDPA
attention, for :func:`autopar.graph.extract` (which takes such models through ``torch.export``,
since torch.fx cannot trace transformers 5.x). Needs the optional extra: ``pip install autopar[hf]``.
Sizes are the published configs (``config.json`` of each model's hub repository, cited per preset);
the ``hf-tiny-*`` presets are made-up small models for tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch import nn

from ..errors import InvalidModelConfig


@dataclass(frozen=True)
class HFPreset:
    """A transformers model class, its config class and keyword arguments, and their source."""

    model_class: str
    config_class: str
    config: dict = field(default_factory=dict)
    source: str = "autopar test model (not published)"


_TINY_LLAMA = dict(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)

_PRESETS = {
    "hf-llama3-8b": HFPreset("LlamaForCausalLM", "LlamaConfig", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        rope_theta=500000.0, rms_norm_eps=1e-5), "meta-llama/Meta-Llama-3-8B config.json"),
    "hf-llama3-405b": HFPreset("LlamaForCausalLM", "LlamaConfig", dict(
        vocab_size=128256, hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
        num_attention_heads=128, num_key_value_heads=8, max_position_embeddings=8192,
        rope_theta=500000.0, rms_norm_eps=1e-5), "meta-llama/Llama-3.1-405B config.json "
                                                 "(RoPE scaling left out: no effect on shapes)"),
    "hf-mistral-7b": HFPreset("MistralForCausalLM", "MistralConfig", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
        sliding_window=4096, rms_norm_eps=1e-5), "mistralai/Mistral-7B-v0.1 config.json"),
    "hf-qwen2-7b": HFPreset("Qwen2ForCausalLM", "Qwen2Config", dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
        "Qwen/Qwen2-7B config.json"),
    "hf-gpt2": HFPreset("GPT2LMHeadModel", "GPT2Config", dict(
        vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024),
        "openai-community/gpt2 config.json"),
    "hf-gpt2-xl": HFPreset("GPT2LMHeadModel", "GPT2Config", dict(
        vocab_size=50257, n_embd=1600, n_layer=48, n_head=25, n_positions=1024),
        "openai-community/gpt2-xl config.json"),
    "hf-gpt-neox-20b": HFPreset("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        vocab_size=50432, hidden_size=6144, num_hidden_layers=44, num_attention_heads=64,
        intermediate_size=24576, max_position_embeddings=2048, rotary_pct=0.25,
        use_parallel_residual=True, tie_word_embeddings=False),
        "EleutherAI/gpt-neox-20b config.json"),
    "hf-mixtral-8x7b": HFPreset("MixtralForCausalLM", "MixtralConfig", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
        num_local_experts=8, num_experts_per_tok=2, rope_theta=1000000.0, rms_norm_eps=1e-5),
        "mistralai/Mixtral-8x7B-v0.1 config.json"),
    # tiny test models (made up)
    "hf-tiny-llama": HFPreset("LlamaForCausalLM", "LlamaConfig", dict(_TINY_LLAMA)),
    "hf-tiny-mistral": HFPreset("MistralForCausalLM", "MistralConfig",
                                dict(_TINY_LLAMA, sliding_window=64)),
    "hf-tiny-qwen2": HFPreset("Qwen2ForCausalLM", "Qwen2Config",
                              dict(_TINY_LLAMA, tie_word_embeddings=False)),
    "hf-tiny-gpt2": HFPreset("GPT2LMHeadModel", "GPT2Config", dict(
        vocab_size=256, n_embd=64, n_layer=4, n_head=4, n_positions=128)),
    "hf-tiny-gpt-neox": HFPreset("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=256, max_position_embeddings=128, rotary_pct=0.25,
        tie_word_embeddings=False)),
    "hf-tiny-mixtral": HFPreset("MixtralForCausalLM", "MixtralConfig", dict(
        _TINY_LLAMA, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2)),
}

#: Every HF preset by name (read-only).
HF_PRESETS = MappingProxyType(_PRESETS)


def list_presets() -> list[str]:
    """Names of the HF presets."""
    return list(HF_PRESETS)


def _transformers():
    try:
        import transformers
    except ImportError as exc:  # optional dependency
        raise ImportError("Hugging Face presets need transformers: pip install 'autopar[hf]'") \
            from exc
    return transformers


def build(name: str, *, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """Build the HF model of preset ``name`` on the meta device (no weights, no network).

    Attention is SDPA (``attn_implementation="sdpa"``), special-token ids are cleared (the tiny
    vocabularies would not hold them), all parameters are in ``dtype``.

    Raises:
        InvalidModelConfig: unknown preset name.
        ImportError: transformers is not installed.
    """
    preset = HF_PRESETS.get(name)
    if preset is None:
        raise InvalidModelConfig(f"unknown HF preset {name!r}; fix: use one of "
                                 f"{', '.join(HF_PRESETS)}")
    tf = _transformers()
    config = getattr(tf, preset.config_class)(**preset.config, attn_implementation="sdpa",
                                              bos_token_id=None, eos_token_id=None)
    with torch.device("meta"):
        model = getattr(tf, preset.model_class)(config)
    return model.to(dtype=dtype)
