"""Mixture-of-experts and latent-attention model configs (issue 26): validation, parameter
counts against the published totals, and graphs identical to the transformers presets."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.errors import InvalidModelConfig  # noqa: E402
from autopar.models import ModelConfig, build, get_config  # noqa: E402
from autopar.models.hf_equivalent import preset_for_config  # noqa: E402
from autopar.graph import extract, hf  # noqa: E402
from autopar.problem import config_graph  # noqa: E402

_TINY_MOE = dict(name="tiny-moe", family="llama", num_layers=3, hidden_size=64, num_heads=4,
                 num_kv_heads=2, vocab_size=256, seq_len=64, ffn_hidden_size=128,
                 num_experts=8, top_k=2, moe_ffn_hidden_size=32)


@pytest.mark.parametrize("name, billions", [
    # totals as the model cards state them
    ("mixtral-8x7b", 46.7), ("mixtral-8x22b", 140.6), ("qwen3-30b-a3b", 30.5),
    ("qwen3-235b-a22b", 235.1), ("deepseek-v2", 235.7), ("deepseek-v3", 671.0)])
def test_moe_preset_parameters(name, billions):
    cfg = get_config(name)
    assert cfg.is_moe and not cfg.needs_transformers   # built in (autopar.models.moe)
    # the model card's total is without the MTP module (DeepSeek-V3: 671B main + MTP)
    main = ModelConfig.from_dict({**cfg.to_dict(), "mtp_layers": 0})
    assert main.num_parameters / 1e9 == pytest.approx(billions, abs=0.05)


def test_mtp_module_adds_a_block_and_a_second_head_pass():
    """DeepSeek-V3's MTP (arXiv 2412.19437 section 2.2): one more block of the last layer's
    kind with a 2h -> h projection, and the shared head's compute once more."""
    base = ModelConfig.from_dict({**_TINY_MOE, "num_shared_experts": 1})
    mtp = ModelConfig.from_dict({**base.to_dict(), "mtp_layers": 1})
    g0, g1 = (config_graph(c, 64, "bf16", True) for c in (base, mtp))
    h = base.hidden_size
    assert g1.num_blocks == g0.num_blocks + 1 and g1.blocks[-1].num_experts == 8
    # the built-in model: exactly the config's count (no stand-in's extra gate)
    assert g1.num_parameters == mtp.num_parameters
    assert g1.num_parameters - g0.num_parameters == g0.blocks[-1].num_parameters + 2 * h * h
    head0, head1 = g0.layers[-1], g1.layers[-1]
    assert head1.fwd_flops == 2 * head0.fwd_flops and head1.num_parameters == head0.num_parameters
    assert [layer.index for layer in g1.layers] == list(range(len(g1.layers)))


def test_mtp_stage_without_the_embedding_keeps_a_copy_of_the_table():
    """The MTP module looks up the shifted tokens' embeddings, so a pipeline rank that runs it
    without the embedding layer holds a copy of the table, as Megatron-Core builds it
    (megatron/core/models/gpt/gpt_model.py: ``if self.pre_process or self.mtp_process:
    self.embedding = ...``); a rank holding both stores the table once, and the model's unique
    parameter count does not change."""
    from autopar.cost.ranks import RankLayers

    cfg = ModelConfig.from_dict({**_TINY_MOE, "mtp_layers": 1})
    g = config_graph(cfg, 64, "bf16", True)
    table = cfg.vocab_size * cfg.hidden_size
    mtp = next(layer for layer in g.layers if layer.name == "mtp.1")
    assert mtp.shared_parameters == table
    assert mtp.ops[0].kind == "embedding" and mtp.ops[0].num_parameters == 0
    assert g.num_parameters == cfg.num_parameters
    ranks = RankLayers(g, tuple(b.index for b in g.blocks))
    embedding, head = 0, len(g.layers) - 1
    others = tuple(i for i in range(len(g.layers)) if i not in (embedding, mtp.index, head))
    last = (mtp.index, head)
    apart = ranks.rank_params(1, 1, others + (embedding,))[0] + ranks.rank_params(1, 1, last)[0]
    together = ranks.rank_params(1, 1, tuple(range(len(g.layers))))[0]
    assert together == g.num_parameters
    assert apart - together == table
    # vocabulary-parallel, as the embedding layer: the copy is split over TP
    assert ranks.rank_params(2, 1, last)[0] == pytest.approx(
        ranks.rank_params(2, 1, (head,))[0] + ranks.layer_params_per_rank(
            mtp.index, 2, False, 1) + table / 2)


@pytest.mark.parametrize("extra, cls, extra_params", [
    ({}, "MixtralForCausalLM", 0),
    (dict(num_shared_experts=2, first_dense_layers=1), "Qwen2MoeForCausalLM", 2 * 64),
    (dict(kv_channels=32, qk_norm=True), "Qwen3MoeForCausalLM", 0),
    (dict(first_dense_layers=1), "Qwen3MoeForCausalLM", 3 * 2 * 16),  # q/k norms extra
    (dict(num_shared_experts=1, first_dense_layers=1, kv_lora_rank=16, q_lora_rank=24,
          qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, num_kv_heads=4),
     "DeepseekV3ForCausalLM", 0),
])
def test_config_graph_matches_its_transformers_model(extra, cls, extra_params):
    """The transformers stand-in's graph has the config's parameters (plus what the stand-in
    adds, which preset_for_config names: Qwen2-MoE's h x 1 shared-expert gate per MoE layer);
    the graph planned from the config (the built-in model) has exactly the config's; both
    carry each MoE layer's experts and top-k."""
    cfg = ModelConfig.from_dict({**_TINY_MOE, **extra})
    assert preset_for_config(cfg).model_class == cls
    stand_in = extract(hf.build_preset(preset_for_config(cfg)), 64, 1)
    g = config_graph(cfg, 64, "bf16", True)
    assert g.method == stand_in.method == "export"
    assert stand_in.num_parameters == cfg.num_parameters + extra_params
    assert g.num_parameters == cfg.num_parameters
    moe = [cfg.moe_layer(i) for i in range(cfg.num_layers)]
    for graph in (g, stand_in):
        assert [b.num_experts for b in graph.blocks] == [8 if m else 0 for m in moe]
        assert {b.experts_per_token for b, m in zip(graph.blocks, moe) if m} == {2}


def test_moe_layer_interval_follows_transformers():
    cfg = ModelConfig.from_dict({**_TINY_MOE, "num_layers": 6, "moe_layer_interval": 2,
                                 "first_dense_layers": 2, "num_shared_experts": 1})
    assert [cfg.moe_layer(i) for i in range(6)] == [False, False, False, True, False, True]
    g = config_graph(cfg, 64, "bf16", True)
    assert [b.num_experts > 0 for b in g.blocks] == [cfg.moe_layer(i) for i in range(6)]


def test_config_estimate_equals_hf_preset():
    """The Mixtral 8x7B preset (autopar's built-in model) and the hf-mixtral-8x7b transformers
    preset are one model: the same within 1% (measured 0.3%: transformers passes the RoPE tables
    into every layer and multiplies them there, the built-in model keeps them as buffers). The
    preset's aux loss (router_aux_loss_coeff 0.02, computed by Megatron-Core in training, not by
    the transformers forward) adds only its memory-bound router ops (autopar.graph.router)."""
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=1024, micro_batch_size=1)
    plan = autopar.ParallelConfig(tp=1, pp=2, dp=8, ep=8, zero_stage=1, recompute="full")
    no_loss = {**get_config("mixtral-8x7b").to_dict(), "router_aux_loss_coeff": 0.0}
    a = autopar.estimate(no_loss, "2x8xH100-80GB", train, plan)
    b = autopar.estimate("hf-mixtral-8x7b", "2x8xH100-80GB", train, plan)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-2)
    assert a.memory_per_gpu_bytes == pytest.approx(b.memory_per_gpu_bytes, rel=1e-2)
    with_loss = autopar.estimate("mixtral-8x7b", "2x8xH100-80GB", train, plan)
    assert a.step_time_s < with_loss.step_time_s < 1.05 * a.step_time_s
    assert with_loss.memory_per_gpu_bytes == a.memory_per_gpu_bytes


@pytest.mark.parametrize("extra, words", [
    (dict(top_k=9), "top_k=9"),
    (dict(top_k=0), "top_k=0 (routed experts per token; 0 when not given)"),
    (dict(moe_ffn_hidden_size=None), "moe_ffn_hidden_size"),
    (dict(num_experts=1), "at least 2 experts"),
    (dict(first_dense_layers=3), "leaves no MoE"),
    (dict(family="gpt"), "llama family"),
    (dict(kv_lora_rank=16), "needs ['qk_nope_head_dim'"),
    (dict(num_experts=0, top_k=0, moe_ffn_hidden_size=None, q_lora_rank=8), "kv_lora_rank"),
    (dict(num_shared_experts=-1), ">= 0"),
])
def test_invalid_moe_configs_name_the_problem(extra, words):
    with pytest.raises(InvalidModelConfig, match="fix|must|needs|leaves|least"):
        try:
            ModelConfig.from_dict({**_TINY_MOE, **extra})
        except InvalidModelConfig as exc:
            assert words in str(exc)
            raise


def test_builtin_build_builds_experts():
    model = build(ModelConfig.from_dict(_TINY_MOE))
    assert type(model.layers[0].mlp).__name__ == "MoE"
    assert sum(p.numel() for p in model.parameters()) == ModelConfig.from_dict(
        _TINY_MOE).num_parameters


def test_dense_configs_unchanged():
    cfg = get_config("llama3-8b")
    assert not cfg.needs_transformers and cfg.head_dim == 128
    assert cfg.num_parameters == pytest.approx(8.03e9, rel=1e-3)


def test_head_dim_is_read_as_kv_channels():
    cfg = ModelConfig.from_dict({**_TINY_MOE, "head_dim": 32})
    assert cfg.kv_channels == 32 and cfg.head_dim == 32
    with pytest.raises(InvalidModelConfig, match="both head_dim and kv_channels"):
        ModelConfig.from_dict({**_TINY_MOE, "head_dim": 32, "kv_channels": 32})


def test_models_listing_shows_experts_mtp_and_sources(capsys):
    from autopar.cli import main
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    ds, mix = rows["deepseek-v3"], rows["mixtral-8x7b"]
    assert (ds["experts"], ds["top_k"], ds["expert_ffn_hidden"], ds["mtp_layers"]) == (
        256, 8, 2048, 1)
    assert ds["ffn_hidden"] == 18432 and mix["ffn_hidden"] is None   # Mixtral: no dense layer
    assert "config.json" in ds["source"] and rows["llama3-8b"]["experts"] == 0


def test_latent_attention_shared_experts_must_be_whole_expert_widths():
    mla = dict(_TINY_MOE, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
               v_head_dim=16, num_kv_heads=4)
    cfg = ModelConfig.from_dict({**mla, "shared_expert_ffn_hidden_size": 64})   # 2 x 32
    assert preset_for_config(cfg).config["n_shared_experts"] == 2
    with pytest.raises(InvalidModelConfig, match="not a multiple of moe_ffn_hidden_size=32"):
        preset_for_config(ModelConfig.from_dict({**mla, "shared_expert_ffn_hidden_size": 48}))
