"""The transformers model with the layers of a ``ModelConfig`` with experts, latent attention,
qk-norm or its own head size: :func:`preset_for_config`. The built-in ``Transformer`` builds them
all (:mod:`autopar.models.moe`); this model is what it is checked against
(``tests/test_moe_builtin.py``), and the route for latent attention without experts
(:attr:`~autopar.models.config.ModelConfig.needs_transformers`).
"""

from __future__ import annotations

from ..errors import InvalidModelConfig
from ..graph.hf import HFPreset
from .config import ModelConfig


def preset_for_config(cfg: ModelConfig) -> HFPreset:
    """The transformers model that has the layers of ``cfg`` (an autopar ``ModelConfig`` whose
    :attr:`~autopar.models.config.ModelConfig.needs_transformers` is true), as an
    :class:`HFPreset`:

    - latent attention: ``DeepseekV3ForCausalLM`` (MLA, ``first_k_dense_replace`` dense layers,
      shared experts, routing in one group: ``n_group = topk_group = 1``);
    - experts with neither shared experts, leading dense layers, an interval, qk-norm nor
      biases: ``MixtralForCausalLM``;
    - other experts without a shared expert: ``Qwen3MoeForCausalLM`` (``mlp_only_layers`` for
      the leading dense layers, ``decoder_sparse_step`` the interval; its q/k norms are extra
      where ``cfg`` has none);
    - experts with shared ones: ``Qwen2MoeForCausalLM`` (as Qwen3-MoE, the shared experts as
      one ``shared_expert`` of their total width, biases on q/k/v iff ``cfg.bias``);
    - a dense model with qk-norm or its own head size: ``Qwen3ForCausalLM``.

    A ``geglu`` config sets ``hidden_act="gelu_pytorch_tanh"`` (its gated MLPs and experts
    then gate with tanh-GELU). Shapes follow ``cfg``; what the stand-in adds beyond it is
    small and listed in the preset's ``source`` (Qwen2-MoE's shared-expert gate h x 1, Qwen3-MoE's q/k norms).

    Raises:
        InvalidModelConfig: a combination no transformers model has (latent attention with a
            MoE interval other than 1, with qk-norm, or with shared experts that are not a
            whole number of routed-expert widths).
    """
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                  num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                  num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=cfg.seq_len,
                  rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
                  tie_word_embeddings=cfg.tied_embeddings, intermediate_size=cfg.ffn_hidden_size)
    if cfg.mlp == "geglu":
        # the gated MLPs and experts of these models apply ACT2FN[hidden_act] to the gate
        common["hidden_act"] = "gelu_pytorch_tanh"
    source = f"autopar ModelConfig {cfg.name!r}"
    if cfg.uses_mla:
        if cfg.moe_layer_interval != 1 or cfg.qk_norm:
            raise InvalidModelConfig(
                f"model {cfg.name!r}: latent attention is modelled through DeepSeek-V3's layers, "
                "which have every layer after the leading dense ones MoE and no qk-norm; fix: "
                "moe_layer_interval=1 and qk_norm=False")
        dense = cfg.num_layers if not cfg.is_moe else cfg.first_dense_layers
        width = cfg.moe_ffn_hidden_size or cfg.ffn_hidden_size
        shared_width = cfg.shared_expert_ffn_hidden_size or 0
        if shared_width % width:
            raise InvalidModelConfig(
                f"model {cfg.name!r}: DeepSeek-V3's layers hold shared experts as a whole number "
                f"of routed-expert widths; shared_expert_ffn_hidden_size={shared_width} is not a "
                f"multiple of moe_ffn_hidden_size={width}. Fix: num_shared_experts with the "
                "default width, or a multiple of it")
        shared = shared_width // width
        return HFPreset("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(
            common, moe_intermediate_size=width, first_k_dense_replace=dense,
            n_routed_experts=max(cfg.num_experts, 1), num_experts_per_tok=max(cfg.top_k, 1),
            n_shared_experts=shared, n_group=1, topk_group=1,
            q_lora_rank=cfg.q_lora_rank or None, kv_lora_rank=cfg.kv_lora_rank,
            qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim,
            v_head_dim=cfg.v_head_dim), source + " as DeepSeek-V3 layers")
    head = dict(head_dim=cfg.head_dim)
    if not cfg.is_moe:
        return HFPreset("Qwen3ForCausalLM", "Qwen3Config", dict(common, **head),
                        source + " as Qwen3 layers")
    moe = dict(num_experts=cfg.num_experts, num_experts_per_tok=cfg.top_k,
               moe_intermediate_size=cfg.moe_ffn_hidden_size, norm_topk_prob=True,
               decoder_sparse_step=cfg.moe_layer_interval,
               mlp_only_layers=list(range(cfg.first_dense_layers)))
    plain = (not cfg.shared_expert_ffn_hidden_size and not cfg.first_dense_layers
             and cfg.moe_layer_interval == 1 and not cfg.qk_norm and not cfg.bias)
    if plain:
        return HFPreset("MixtralForCausalLM", "MixtralConfig", dict(
            common, **head, intermediate_size=cfg.moe_ffn_hidden_size,
            num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.top_k),
            source + " as Mixtral layers")
    if not cfg.shared_expert_ffn_hidden_size:
        # Qwen2-MoE cannot drop its shared expert (a zero-width one does not run)
        extra = "" if cfg.qk_norm else " (its q/k norms, 2 x head_dim per layer, are extra)"
        return HFPreset("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(common, **head, **moe),
                        source + " as Qwen3-MoE layers" + extra)
    return HFPreset("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        common, **head, **moe, qkv_bias=cfg.bias,
        shared_expert_intermediate_size=cfg.shared_expert_ffn_hidden_size or 0),
        source + " as Qwen2-MoE layers (its shared-expert gate, h x 1, is extra)")
