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

from ..errors import InvalidModelConfig, MissingDependency


@dataclass(frozen=True)
class HFPreset:
    """A transformers model class, its config class and keyword arguments, and their source."""

    model_class: str
    config_class: str
    config: dict = field(default_factory=dict)
    source: str = "autopar test model (not published)"
    #: transformers attention implementation: "sdpa", or "eager" where transformers has no SDPA
    #: path (gpt-oss's attention sinks); the extractor runs either as one flash kernel
    attn_implementation: str = "sdpa"


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
    # Models whose layers differ (issue 14). Numbers from each hub repository's config.json
    # (text_config for the multimodal ones); parts that do not change shapes (RoPE scaling,
    # quantisation, token ids) are left out. Not built by transformers, so not here: DeepSeek-V3's
    # multi-token-prediction layer (num_nextn_predict_layers) and Qwen3-Next's MTP layer.
    "hf-deepseek-v3": HFPreset("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=61, first_k_dense_replace=3, num_attention_heads=128,
        num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256,
        num_experts_per_tok=8, n_group=8, topk_group=4, q_lora_rank=1536, kv_lora_rank=512,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False),
        "deepseek-ai/DeepSeek-V3 config.json"),
    "hf-qwen3-30b-a3b": HFPreset("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False),
        "Qwen/Qwen3-30B-A3B config.json"),
    "hf-qwen3-235b-a22b": HFPreset("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
        num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False),
        "Qwen/Qwen3-235B-A22B config.json"),
    "hf-gpt-oss-120b": HFPreset("GptOssForCausalLM", "GptOssConfig", dict(
        vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=36,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=128,
        num_experts_per_tok=4, sliding_window=128, attention_bias=True,
        tie_word_embeddings=False), "openai/gpt-oss-120b config.json (layer_types alternate "
                                    "sliding/full, transformers' default)", "eager"),
    "hf-gpt-oss-20b": HFPreset("GptOssForCausalLM", "GptOssConfig", dict(
        vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
        num_experts_per_tok=4, sliding_window=128, attention_bias=True,
        tie_word_embeddings=False), "openai/gpt-oss-20b config.json", "eager"),
    "hf-llama4-scout": HFPreset("Llama4ForCausalLM", "Llama4TextConfig", dict(
        vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
        num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
        num_local_experts=16, num_experts_per_tok=1, interleave_moe_layer_step=1,
        attention_chunk_size=8192, use_qk_norm=True, rms_norm_eps=1e-5,
        tie_word_embeddings=False), "meta-llama/Llama-4-Scout-17B-16E config.json (text_config)"),
    "hf-llama4-maverick": HFPreset("Llama4ForCausalLM", "Llama4TextConfig", dict(
        vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
        num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
        num_local_experts=128, num_experts_per_tok=1, interleave_moe_layer_step=2,
        attention_chunk_size=8192, use_qk_norm=False, rms_norm_eps=1e-5,
        tie_word_embeddings=False),
        "meta-llama/Llama-4-Maverick-17B-128E config.json (text_config)"),
    "hf-gemma3-27b": HFPreset("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        vocab_size=262208, hidden_size=5376, intermediate_size=21504, num_hidden_layers=62,
        num_attention_heads=32, num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=168,
        sliding_window=1024, layer_types=[
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(62)],
        rms_norm_eps=1e-6, tie_word_embeddings=True),
        "google/gemma-3-27b-pt config.json (text_config; sliding_window_pattern 6: every "
        "sixth layer global)"),
    "hf-qwen3-next-80b-a3b": HFPreset("Qwen3NextForCausalLM", "Qwen3NextConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5120, num_hidden_layers=48,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_conv_kernel_dim=4,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
        linear_num_value_heads=32, num_experts=512, num_experts_per_tok=10,
        moe_intermediate_size=512, shared_expert_intermediate_size=512, norm_topk_prob=True,
        max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False),
        "Qwen/Qwen3-Next-80B-A3B-Instruct config.json (full_attention_interval 4: "
        "transformers' default layer_types)"),
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
    # Gemma (1): GeGLU MLP (transformers GemmaConfig rewrites the releases' "gelu" to
    # "gelu_pytorch_tanh"), tied embeddings, head_dim = hidden / heads
    "hf-tiny-gemma": HFPreset("GemmaForCausalLM", "GemmaConfig", dict(
        _TINY_LLAMA, head_dim=16, rms_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh")),
    "hf-tiny-mixtral": HFPreset("MixtralForCausalLM", "MixtralConfig", dict(
        _TINY_LLAMA, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2)),
    # tiny versions keeping each architecture's features (for tests at seq 32):
    # DeepSeek-V3: 1 dense layer then MoE with a shared expert, MLA, group-limited top-3 routing
    "hf-tiny-deepseek-v3": HFPreset("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3,
        n_group=2, topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=128,
        tie_word_embeddings=False)),
    "hf-tiny-qwen3-moe": HFPreset("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
        vocab_size=256, hidden_size=64, intermediate_size=176, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=8, num_experts_per_tok=2, max_position_embeddings=128)),
    # gpt-oss: sinks, sliding (16 tokens) then full attention, 4 experts top-2 with biases
    "hf-tiny-gpt-oss": HFPreset("GptOssForCausalLM", "GptOssConfig", dict(
        vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=16), attn_implementation="eager"),
    # Llama 4: dense and MoE layers interleaved (step 2), chunked attention (16 tokens) on
    # three of four layers, the fourth global without RoPE
    "hf-tiny-llama4": HFPreset("Llama4ForCausalLM", "Llama4TextConfig", dict(
        vocab_size=256, hidden_size=64, intermediate_size=32, intermediate_size_mlp=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
        attention_chunk_size=16, max_position_embeddings=128)),
    # Gemma 3: two sliding-window layers (16 tokens) then a global one; a vocabulary that
    # outweighs the blocks (the 27B's 262k vocabulary x 5376 is 1.4B parameters)
    "hf-tiny-gemma3": HFPreset("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=16,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=128)),
    # Qwen3-Next: three Gated DeltaNet layers then a gated full-attention one, MoE with a
    # gated shared expert
    "hf-tiny-qwen3-next": HFPreset("Qwen3NextForCausalLM", "Qwen3NextConfig", dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, max_position_embeddings=128)),
}

#: Every HF preset by name (read-only).
HF_PRESETS = MappingProxyType(_PRESETS)


def list_presets() -> list[str]:
    """Names of the HF presets."""
    return list(HF_PRESETS)


def describe(name: str) -> dict:
    """Preset ``name`` as plain JSON: its transformers model class, layer count, hidden size,
    vocabulary, positions (``max_position_embeddings``), routed experts and top-k (None for a
    dense model; counts, from the config class with the preset's arguments; no model is built)
    and source.

    Raises:
        InvalidModelConfig: unknown preset name.
        MissingDependency: transformers is not installed.
    """
    preset = HF_PRESETS.get(name)
    if preset is None:
        raise InvalidModelConfig(f"unknown HF preset {name!r}; fix: use one of "
                                 f"{', '.join(HF_PRESETS)}")
    config = getattr(_transformers(), preset.config_class)(
        **preset.config, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return {"name": name, "model_class": preset.model_class,
            "layers": getattr(config, "num_hidden_layers", None),
            "hidden": getattr(config, "hidden_size", None),
            "vocabulary": getattr(config, "vocab_size", None),
            "positions": getattr(config, "max_position_embeddings", None),
            **_experts(config), "source": preset.source}


def _experts(config) -> dict:
    """``{"experts": routed experts, "top_k": experts per token}`` of a transformers config
    (DeepSeek's ``n_routed_experts``, Mixtral/gpt-oss/Llama 4's ``num_local_experts``, Qwen3's
    ``num_experts``); None for both in a dense model."""
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        n = getattr(config, key, None)
        if isinstance(n, int) and n > 0:
            return {"experts": n, "top_k": getattr(config, "num_experts_per_tok", None)}
    return {"experts": None, "top_k": None}


def _transformers():
    try:
        import transformers
    except ImportError as exc:  # optional dependency
        raise MissingDependency("Hugging Face presets need transformers; fix: pip install "
                                "'autopar[hf]' (from a clone: pip install -e '.[hf]'; or pip install "
                                "transformers)") from exc
    return transformers


def build(name: str, *, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """Build the HF model of preset ``name`` on the meta device (no weights, no network).

    Attention is SDPA (``attn_implementation="sdpa"``) or, where transformers has none (gpt-oss),
    eager, which the extractor recognises and counts as one flash kernel; special-token ids are
    cleared (the tiny vocabularies would not hold them), all parameters are in ``dtype``.

    Raises:
        InvalidModelConfig: unknown preset name.
        MissingDependency: transformers is not installed (an ``ImportError`` too).
    """
    preset = HF_PRESETS.get(name)
    if preset is None:
        raise InvalidModelConfig(f"unknown HF preset {name!r}; fix: use one of "
                                 f"{', '.join(HF_PRESETS)}")
    return build_preset(preset, dtype=dtype)


def build_preset(preset: HFPreset, *, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """Build the model of ``preset`` on the meta device, as :func:`build` does for a name.

    Raises:
        MissingDependency: transformers is not installed.
    """
    tf = _transformers()
    config = getattr(tf, preset.config_class)(
        **preset.config, attn_implementation=preset.attn_implementation, bos_token_id=None,
        eos_token_id=None, pad_token_id=None)
    with torch.device("meta"):
        model = getattr(tf, preset.model_class)(config)
    return model.to(dtype=dtype)
