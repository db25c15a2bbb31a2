"""GeGLU MLPs and MoE router settings (issue 26, item 1): config validation and parameter
counts, the built-in GeGLU block against transformers' Gemma, the router losses the trace
cannot see, and the Megatron-LM / torchtitan import and export of both."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autopar
from autopar.errors import InvalidModelConfig
from autopar.runtime.errors import UnsupportedPlanError
from autopar.graph import extract
from autopar.io.importers import from_megatron_args
from autopar.models import ModelConfig, build, get_config
from autopar.models.config import ROUTER_DEFAULTS

_TINY = dict(name="tiny-geglu", family="llama", num_layers=2, hidden_size=64, num_heads=4,
             num_kv_heads=2, vocab_size=256, seq_len=64, ffn_hidden_size=176, mlp="geglu")
_TINY_MOE = dict(name="tiny-moe", family="llama", num_layers=3, hidden_size=64, num_heads=4,
                 num_kv_heads=2, vocab_size=256, seq_len=64, ffn_hidden_size=128,
                 num_experts=8, top_k=2, moe_ffn_hidden_size=32)


# -- GeGLU --------------------------------------------------------------------------------------
def test_geglu_counts_three_matrices_like_swiglu():
    geglu = ModelConfig.from_dict(_TINY)
    swiglu = ModelConfig.from_dict({**_TINY, "mlp": "swiglu"})
    gelu = ModelConfig.from_dict({**_TINY, "mlp": "gelu"})
    h, f, L = 64, 176, 2
    assert geglu.num_parameters == swiglu.num_parameters
    assert geglu.num_parameters - gelu.num_parameters == L * h * f
    model = build(geglu)
    assert sum(p.numel() for p in model.parameters()) == geglu.num_parameters
    assert ModelConfig.from_dict(geglu.to_dict()) == geglu
    with pytest.raises(InvalidModelConfig, match="geglu"):
        ModelConfig.from_dict({**_TINY, "mlp": "reglu"})


def test_geglu_block_computes_tanh_gelu_gate():
    model = build(ModelConfig.from_dict(_TINY), device="cpu", dtype=torch.float32)
    mlp = model.layers[0].mlp
    x = torch.randn(2, 5, 64)
    want = mlp.w2(F.gelu(mlp.w1(x), approximate="tanh") * mlp.w3(x))
    assert torch.allclose(mlp(x), want)


def test_tiny_gemma_matches_builtin_geglu():
    """transformers' GemmaForCausalLM (GeGLU with gelu_pytorch_tanh, tied embeddings) and the
    built-in GeGLU config of its shapes: same parameters, same per-layer FLOPs, the gated
    unit fused in both (the activation recorded as a view at the product)."""
    pytest.importorskip("transformers")
    from autopar.graph import hf
    cfg = ModelConfig.from_dict({**_TINY, "num_layers": 4, "seq_len": 128,
                                 "tied_embeddings": True, "norm_eps": 1e-6})
    ours, gemma = (extract(m, 32, 1) for m in (build(cfg), hf.build("hf-tiny-gemma")))
    assert ours.num_parameters == gemma.num_parameters == cfg.num_parameters
    assert ours.num_blocks == gemma.num_blocks == 4
    for a, b in zip(ours.blocks, gemma.blocks):
        assert (a.num_parameters, a.fwd_flops, a.bwd_flops) == (
            b.num_parameters, b.fwd_flops, b.bwd_flops)
        for g in (a, b):
            gelu = [o for o in g.ops if o.target == "gelu"]
            assert len(gelu) == 1 and gelu[0].kind == "view"
    assert ours.forward_flops == gemma.forward_flops


def test_geglu_moe_stand_in_gates_with_tanh_gelu():
    from autopar.models.hf_equivalent import preset_for_config
    cfg = ModelConfig.from_dict({**_TINY_MOE, "mlp": "geglu"})
    assert preset_for_config(cfg).config["hidden_act"] == "gelu_pytorch_tanh"
    assert "hidden_act" not in preset_for_config(ModelConfig.from_dict(_TINY_MOE)).config


def test_builtin_geglu_experts_gate_with_tanh_gelu():
    """The built-in MoE's experts and shared experts follow the config's gated activation."""
    geglu = build(ModelConfig.from_dict({**_TINY_MOE, "mlp": "geglu"}), device="cpu",
                  dtype=torch.float32)
    swiglu = build(ModelConfig.from_dict(_TINY_MOE), device="cpu", dtype=torch.float32)
    act = geglu.layers[0].mlp.experts.act_fn
    assert isinstance(act, torch.nn.GELU) and act.approximate == "tanh"
    assert isinstance(swiglu.layers[0].mlp.experts.act_fn, torch.nn.SiLU)


_TRAIN = autopar.TrainingConfig(global_batch_size=16, seq_len=64)


def _plan(model, tp: int = 2):
    """The plan of ``model`` on 8 H100s at a fixed layout (no search)."""
    return autopar.optimize(model, "1x8xH100-80GB", _TRAIN,
                            fixed=dict(tp=tp, pp=1, dp=8 // tp, zero_stage=1, recompute="none",
                                       micro_batch_size=1))


def _step_s(model) -> float:
    return autopar.estimate(model, "1x8xH100-80GB", _TRAIN,
                            autopar.ParallelConfig(tp=1, dp=8, micro_batch_size=1)).step_time_s


def test_geglu_export_megatron_warns_and_torchtitan_refuses():
    plan = _plan(ModelConfig.from_dict({**_TINY, "num_layers": 4}))
    out = plan.to_megatron_args()
    assert "--swiglu" not in out.value and "--squared-relu" not in out.value
    assert any("geglu" in w and "gated_linear_unit" in w for w in out.warnings)
    with pytest.raises(UnsupportedPlanError, match="SwiGLU"):
        plan.to_torchtitan_toml()
    with pytest.raises(UnsupportedPlanError, match="SwiGLU"):
        plan.to_torchtitan_config()


# -- router settings --------------------------------------------------------------------------
def test_router_defaults_are_megatron_cores():
    cfg = ModelConfig.from_dict(_TINY_MOE)
    assert {k: getattr(cfg, k) for k in ROUTER_DEFAULTS} == ROUTER_DEFAULTS
    # Megatron-Core skips an aux loss whose coefficient is 0 (its default)
    assert cfg.router_aux_loss is None
    dsv3 = get_config("deepseek-v3")
    assert (dsv3.router_score_function, dsv3.router_expert_bias, dsv3.router_load_balancing,
            dsv3.router_aux_loss_coeff) == ("sigmoid", True, "seq_aux_loss", 1e-4)
    assert get_config("mixtral-8x7b").router_aux_loss == "aux_loss"
    assert get_config("qwen3-30b-a3b").router_aux_loss == "global_aux_loss"


@pytest.mark.parametrize("extra, match", [
    (dict(router_score_function="tanh"), "router_score_function"),
    (dict(router_load_balancing="switch"), "router_load_balancing"),
    (dict(router_expert_bias=True), "sigmoid"),
    (dict(router_load_balancing="sinkhorn", router_aux_loss_coeff=0.01), "sinkhorn"),
    (dict(router_aux_loss_coeff=-1.0), "router_aux_loss_coeff"),
    (dict(router_z_loss_coeff="1e-3"), "router_z_loss_coeff"),
])
def test_router_validation(extra, match):
    with pytest.raises(InvalidModelConfig, match=match):
        ModelConfig.from_dict({**_TINY_MOE, **extra})


def test_router_settings_need_experts():
    dense = {k: v for k, v in _TINY_MOE.items()
             if k not in ("num_experts", "top_k", "moe_ffn_hidden_size")}
    with pytest.raises(InvalidModelConfig, match="without experts"):
        ModelConfig.from_dict({**dense, "router_z_loss_coeff": 1e-3})


def test_router_losses_priced_only_when_on():
    """The aux loss (coefficient > 0) and z-loss add memory-bound ops after each MoE block's
    router: forward bytes per [tokens, experts] element as counted in autopar.graph.router,
    a slower step; a zero coefficient (Megatron-Core's default) adds nothing."""
    pytest.importorskip("transformers")
    from autopar.cost.compute import memory_bound_kernels
    from autopar.graph.router import AUX_LOSS_BWD_BYTES, AUX_LOSS_FWD_BYTES
    from autopar.problem import config_graph
    base = ModelConfig.from_dict(_TINY_MOE)
    off = ModelConfig.from_dict({**_TINY_MOE, "router_load_balancing": "seq_aux_loss"})
    on = ModelConfig.from_dict({**_TINY_MOE, "router_aux_loss_coeff": 0.01,
                                "router_z_loss_coeff": 1e-3})
    g0, g_off, g_on = (config_graph(c, 64, "bf16", True) for c in (base, off, on))
    assert g_off.layers == g0.layers
    block = g_on.blocks[0]
    names = [o.name for o in block.ops]
    router = next(i for i, o in enumerate(block.ops) if o.moe_role == "router")
    assert names[router + 1:router + 3] == ["router_z_loss", "router_aux_loss_softmax"]
    elements = 64 * 8
    rows = {o.target: (n, bwd) for o, n, _k, bwd, _r in memory_bound_kernels(block, "fused")}
    a, b = AUX_LOSS_FWD_BYTES["softmax"]
    c, d = AUX_LOSS_BWD_BYTES["softmax"]
    assert rows["router_aux_loss_softmax"] == ((a * 2 + b) * elements, (c * 2 + d) * elements)
    assert rows["router_z_loss"] == (6 * 2 * elements, 9 * 2 * elements)
    assert _step_s(on) > _step_s(base)


def test_router_flags_round_trip_through_megatron():
    cfg = ModelConfig.from_dict({**_TINY_MOE, "router_score_function": "sigmoid",
                                 "router_expert_bias": True,
                                 "router_load_balancing": "seq_aux_loss",
                                 "router_aux_loss_coeff": 1e-4, "router_z_loss_coeff": 1e-3})
    args = _megatron_router_args(cfg.to_dict())
    assert args == ["--moe-router-score-function", "sigmoid", "--moe-router-load-balancing-type",
                    "seq_aux_loss", "--moe-aux-loss-coeff", "0.0001",
                    "--moe-router-enable-expert-bias", "--moe-z-loss-coeff", "0.001"]
    back = from_megatron_args(args)
    assert ModelConfig.from_dict({**_TINY_MOE, **back.model_fields}) == cfg
    assert not any("ignored" in n for n in back.notes)
    # defaults write nothing
    assert _megatron_router_args(ModelConfig.from_dict(_TINY_MOE).to_dict()) == []
    several = from_megatron_args("--moe-router-load-balancing-type seq_aux_loss aux_loss "
                                 "--moe-aux-loss-coeff 1e-4 1e-2")
    assert several.model_fields == {"router_load_balancing": "seq_aux_loss",
                                    "router_aux_loss_coeff": 1e-4}
    assert any("one load-balancing type" in n for n in several.notes)
    newer = from_megatron_args("--moe-router-score-function sqrtsoftplus "
                               "--moe-router-load-balancing-type quantile_balancing")
    assert newer.model_fields == {} and sum("not modelled" in n for n in newer.notes) == 2


def _megatron_router_args(m: dict) -> list[str]:
    from autopar.runtime.export.megatron import MEGATRON_FLAGS, _megatron_router
    args = _megatron_router(m)
    assert {a for a in args if a.startswith("--")} <= MEGATRON_FLAGS
    return args


def test_cli_applies_imported_router_flags(tmp_path, capsys):
    pytest.importorskip("transformers")
    import json
    from autopar.cli import main
    model = tmp_path / "moe.json"
    model.write_text(json.dumps(_TINY_MOE))
    argv = ["estimate", "--model", str(model), "--cluster", "1x8xH100-80GB", "--global-batch",
            "16", "--seq-len", "64", "--json", "--megatron-args"]
    assert main(argv + ["--tensor-model-parallel-size 1"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(argv + ["--tensor-model-parallel-size 1 --moe-aux-loss-coeff 0.01"]) == 0
    with_loss = json.loads(capsys.readouterr().out)
    assert with_loss["step_time_s"] > plain["step_time_s"]


def test_torchtitan_export_names_the_router():
    pytest.importorskip("transformers")
    mixtral = ModelConfig.from_dict({**_TINY_MOE, "router_aux_loss_coeff": 0.02})
    warnings = _plan(mixtral, tp=1).to_torchtitan_config().warnings
    assert any("score_func='softmax', load_balance_coeff=None" in w for w in warnings)
    assert any("computes no aux_loss load-balancing loss" in w for w in warnings)
    # routed as torchtitan's defaults route: nothing to say
    sig = ModelConfig.from_dict({**_TINY_MOE, "router_score_function": "sigmoid",
                                 "router_expert_bias": True})
    assert not any("score_func" in w or "computes no" in w
                   for w in _plan(sig, tp=1).to_torchtitan_config().warnings)
