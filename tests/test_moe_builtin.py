"""Experts, latent attention and qk-norm built into autopar's own model (issue 26 item 1): the
MoE presets plan without transformers, and their graphs equal the transformers equivalents'
(:func:`autopar.models.hf_equivalent.preset_for_config`) per layer."""

from __future__ import annotations

import json
import sys

import pytest
import torch

import autopar
from autopar.errors import MissingDependency
from autopar.graph import extract
from autopar.models import ModelConfig, build, get_config
from autopar.problem import config_graph

MOE_PRESETS = ("mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b",
               "deepseek-v2", "deepseek-v3")
_TINY = dict(name="tiny-moe", family="llama", num_layers=3, hidden_size=64, num_heads=4,
             num_kv_heads=2, vocab_size=256, seq_len=64, ffn_hidden_size=128, num_experts=4,
             top_k=2, moe_ffn_hidden_size=32)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / b if b else float(a != b)


@pytest.fixture
def no_transformers(monkeypatch):
    """transformers unimportable: autopar.graph.hf raises MissingDependency, ``import
    transformers`` fails."""
    from autopar.graph import hf

    def missing():
        raise MissingDependency("transformers made unimportable by the test")

    monkeypatch.setattr(hf, "_transformers", missing)
    monkeypatch.setitem(sys.modules, "transformers", None)
    config_graph.cache_clear()
    yield
    config_graph.cache_clear()


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_moe_presets_build_without_transformers(name):
    cfg = get_config(name)
    assert not cfg.needs_transformers
    model = build(cfg)
    main = sum(p.numel() for p in model.parameters())
    assert main == ModelConfig.from_dict({**cfg.to_dict(), "mtp_layers": 0}).num_parameters


def test_optimize_and_cli_plan_moe_without_transformers(no_transformers, capsys):
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=2048)
    plan = autopar.optimize("mixtral-8x7b", "2x8xH100-80GB", train, time_limit_s=20)
    assert plan.config.tp * plan.config.pp * plan.config.dp * plan.config.cp == 16
    from autopar.cli import main
    assert main(["plan", "--model", "qwen3-30b-a3b", "--cluster", "2x8xH100-80GB",
                 "--global-batch", "64", "--seq-len", "2048", "--time-limit", "20",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out


@pytest.mark.parametrize("extra, experts, k", [
    ({}, 4, 2),
    (dict(kv_channels=32, qk_norm=True, first_dense_layers=1, moe_layer_interval=1), 4, 2),
    (dict(num_shared_experts=1, first_dense_layers=1, kv_lora_rank=16, q_lora_rank=24,
          qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, num_kv_heads=4), 4, 2),
])
def test_tiny_builtin_moe_graph_and_real_step(extra, experts, k, no_transformers):
    """Traced through torch.export (the fx path defers a routing block), with the routers'
    experts and top-k; a real fp32 CPU forward/backward runs (per-expert GEMMs there)."""
    cfg = ModelConfig.from_dict({**_TINY, **extra})
    g = config_graph(cfg, 64, "bf16", True)
    assert g.method == "export" and g.num_parameters == cfg.num_parameters
    moe = [cfg.moe_layer(i) for i in range(cfg.num_layers)]
    assert [(b.num_experts, b.experts_per_token) for b in g.blocks] == [
        (experts, k) if m else (0, 0) for m in moe]
    assert all(any(o.moe_role == "router" for o in b.ops) == m for b, m in zip(g.blocks, moe))
    model = build(cfg, device="cpu", dtype=torch.float32)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    model(ids).float().logsumexp(-1).mean().backward()
    grads = [p.grad for n, p in model.named_parameters() if "experts" in n]
    assert grads and all(gr is not None and torch.isfinite(gr).all() for gr in grads)


def test_experts_match_a_per_token_loop():
    """The sorted, grouped expert computation equals running each token through its k experts."""
    cfg = ModelConfig.from_dict(_TINY)
    model = build(cfg, device="cpu", dtype=torch.float32, seed=3)
    moe = model.layers[0].mlp
    x = torch.randn(1, 10, 64, generator=torch.Generator().manual_seed(1))
    weights, index = moe.router(x.reshape(-1, 64))
    ref = torch.zeros(10, 64)
    ex = moe.experts
    for t in range(10):
        for j in range(cfg.top_k):
            e = int(index[t, j])
            gate, up = (ex.gate_up_proj[e] @ x[0, t]).chunk(2)
            ref[t] += weights[t, j] * (ex.down_proj[e] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(moe(x)[0], ref, rtol=1e-5, atol=1e-5)
    assert torch.allclose(weights.sum(-1), torch.ones(10))


# -- against the transformers equivalents (only where transformers is installed) ---------------

@pytest.mark.parametrize("name", MOE_PRESETS)
def test_moe_preset_graph_equals_its_transformers_equivalent(name):
    """Per layer within 1%: parameters, forward and backward FLOPs, saved-activation bytes;
    experts and top-k equal. (Measured: parameters and FLOPs equal; saved bytes 0.05-0.35%
    lower, the RoPE cos/sin tables transformers passes into every layer, which autopar's model
    keeps as one buffer.)"""
    pytest.importorskip("transformers")
    from autopar.graph import hf
    from autopar.models.hf_equivalent import preset_for_config

    cfg = get_config(name)
    ours = extract(build(cfg), 1024, 1)
    theirs = extract(hf.build_preset(preset_for_config(cfg)), 1024, 1)
    assert ours.method == theirs.method == "export"
    assert ours.num_parameters == theirs.num_parameters
    assert ours.num_parameters == ModelConfig.from_dict(
        {**cfg.to_dict(), "mtp_layers": 0}).num_parameters
    assert len(ours.layers) == len(theirs.layers)
    for a, b in zip(ours.layers, theirs.layers):
        assert (a.num_experts, a.experts_per_token) == (b.num_experts, b.experts_per_token)
        assert a.num_parameters == b.num_parameters
        assert _rel(a.fwd_flops, b.fwd_flops) < 0.01 and _rel(a.bwd_flops, b.bwd_flops) < 0.01
        assert _rel(a.activations.total, b.activations.total) < 0.01, a.name
    assert ours.num_experts == cfg.num_experts


@pytest.mark.parametrize("name, plan", [
    ("mixtral-8x7b", dict(tp=2, pp=2, dp=4, ep=4, zero_stage=1, recompute="selective")),
    ("qwen3-30b-a3b", dict(tp=1, pp=2, dp=8, ep=8, zero_stage=1, recompute="full")),
    ("deepseek-v3", dict(tp=8, pp=8, dp=4, ep=4, zero_stage=1, recompute="selective")),
    ("deepseek-v3", dict(tp=1, pp=8, dp=8, ep=8, zero_stage=1, recompute="full")),
])
def test_fixed_plan_estimate_equals_transformers_route(name, plan):
    """Step time and memory of one plan, planned from the built-in model and from the
    transformers equivalent module, within 1% (DeepSeek-V3 without its MTP module, which only
    the config route adds)."""
    pytest.importorskip("transformers")
    from autopar.graph import hf
    from autopar.models.hf_equivalent import preset_for_config

    cfg = ModelConfig.from_dict({**get_config(name).to_dict(), "mtp_layers": 0})
    world = plan["tp"] * plan["pp"] * plan["dp"]
    cluster = f"{world // 8}x8xH100-80GB"
    train = autopar.TrainingConfig(global_batch_size=8 * plan["dp"], seq_len=4096,
                                   micro_batch_size=1)
    a = autopar.estimate(cfg, cluster, train, autopar.ParallelConfig(**plan))
    b = autopar.estimate(hf.build_preset(preset_for_config(cfg)), cluster, train,
                         autopar.ParallelConfig(**plan))
    assert _rel(a.step_time_s, b.step_time_s) < 0.01
    assert _rel(a.memory_per_gpu_bytes, b.memory_per_gpu_bytes) < 0.01


_FP_MOE = {"name": "moe-fp", "family": "llama", "num_layers": 2, "hidden_size": 128,
           "num_heads": 4, "num_kv_heads": 4, "ffn_hidden_size": 256, "vocab_size": 512,
           "seq_len": 128, "tied_embeddings": False, "num_experts": 8, "top_k": 2,
           "moe_ffn_hidden_size": 256}


@pytest.mark.parametrize("model, seq", [(_FP_MOE, 128), ("hf-tiny-mixtral", 64)])
def test_expert_gemms_are_priced_in_every_precision(model, seq):
    """torch's meta kernel of _grouped_mm takes bf16 only: under fp16/fp32 the built-in model
    runs autopar::grouped_mm and transformers its grouped_mm_fallback op; both are the same
    grouped GEMM, so the expert FLOPs do not depend on the precision (transformers' fallback was
    priced as an element-wise op before)."""
    if isinstance(model, str):
        pytest.importorskip("transformers")
    from autopar.problem import model_graph
    flops = set()
    for precision in ("bf16", "fp16", "fp32"):
        g, _ = model_graph(model, autopar.TrainingConfig(global_batch_size=8, seq_len=seq,
                                                         precision=precision))
        block = g.blocks[0]
        assert [o.kind for o in block.ops if "grouped" in o.target] == ["matmul", "matmul"]
        flops.add((block.fwd_flops, block.bwd_flops))
    assert len(flops) == 1
