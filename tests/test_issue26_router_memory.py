"""Issue 26: what an MoE router keeps for backward in Megatron-Core (its input as passed, not the
fp32 copies transformers' DeepSeek-V3 gate makes: autopar.cost.memory.router_saved_delta), and
what "layernorm" recompute drops under FP8 when only Linears keep a norm's output
(autopar.cost.selective.ModuleRecompute.norm_linear_seq)."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.cost import memory as mem  # noqa: E402
from autopar.cost import selective  # noqa: E402
from autopar.cost.model import CostModel  # noqa: E402
from autopar.frameworks import get_profile  # noqa: E402
from autopar.graph import extract, hf  # noqa: E402

S = 1024


@pytest.fixture(scope="module")
def dsv3():
    return extract(hf.build("hf-tiny-deepseek-v3"), S, 1)


@pytest.fixture(scope="module")
def qwen3():
    return extract(hf.build("hf-tiny-qwen3-moe"), S, 1)


def _moe(graph):
    return next(layer for layer in graph.layers if layer.num_experts)


def _router_saved(layer):
    router = next(o for o in layer.ops if o.moe_role == "router")
    return sum(n for name, _, n in layer.saved_by_op if name == router.name)


def _delta(layer, **kw):
    args = dict(fp8_linear_copies=False, micro_batch=1.0, tp=1, cp=1, sequence_parallel=False,
                dtype_bytes=2)
    return mem.router_saved_delta(layer, **{**args, **kw})


def test_conventions():
    for name in ("megatron", "nemo", "megatron-2023", "inhouse-2024"):
        m = get_profile(name).memory
        assert m.moe_router_input_saved == 1, name
        assert "RouterGatingLinearFunction" in m.sources["moe_router_input_saved"]
    for name in ("torch", "torchtitan", "deepspeed"):
        assert get_profile(name).memory.moe_router_input_saved == 0
    # torchtitan runs its gate under fp32 autocast: fp32 copies, as the graph counts
    assert "ab5ed59f8" in get_profile("torchtitan").memory.sources["moe_router_input_saved"]


def test_deepseek_gate_casts_are_dropped(dsv3):
    moe = _moe(dsv3)
    hidden_bf16 = moe.output_bytes            # [S, 64] in bf16
    saved = _router_saved(moe)
    # transformers' MoEGate saves the fp32 input (2 x the bf16 size) and the fp32 weight
    assert saved == 2 * hidden_bf16 + 8 * 64 * 4
    # the shared expert's up projection keeps the bf16 input already: only the copies go
    assert _delta(moe) == -saved
    # under FP8 that GEMM keeps an FP8 copy: the router's bf16 input comes on beside it
    assert _delta(moe, fp8_linear_copies=True) == -saved + hidden_bf16
    # sharded as the "seq" part, scaled by micro-batch / cp
    assert _delta(moe, tp=2, sequence_parallel=True) == pytest.approx(-saved / 2)
    assert _delta(moe, tp=2) == -saved
    assert _delta(moe, micro_batch=2.0, cp=2) == pytest.approx(-saved)
    # dense blocks have no router
    assert _delta(dsv3.layers[1]) == 0.0


def test_bf16_gate_keeps_the_graph_count(qwen3):
    moe = _moe(qwen3)
    assert _router_saved(moe) == moe.output_bytes   # the norm output itself, in bf16
    assert _delta(moe) == _delta(moe, fp8_linear_copies=True) == 0.0


def _estimate(graph, precision, modules, conv=None):
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=S, precision=precision)
    prof = get_profile("megatron")
    if conv is not None:
        prof = replace(prof, memory=replace(prof.memory, **conv))
    cm = CostModel(graph, autopar.Cluster.from_spec("1x8xH100-80GB"), train, framework=prof)
    cfg = autopar.ParallelConfig(tp=1, pp=1, ep=8, zero_stage=1, micro_batch_size=1,
                                 recompute="selective", recompute_modules=modules)
    return cm.estimate(cfg)


def test_megatron_estimate_drops_the_router_copies(dsv3):
    moe_blocks = sum(1 for layer in dsv3.layers if layer.num_experts)
    saved = _router_saved(_moe(dsv3))
    now = _estimate(dsv3, "bf16", ("core_attn",))
    graph = _estimate(dsv3, "bf16", ("core_attn",), dict(moe_router_input_saved=0))
    assert now.step_time_s == graph.step_time_s
    drop = graph.memory_breakdown.activations - now.memory_breakdown.activations
    assert drop == pytest.approx(moe_blocks * saved)
    # "moe" recompute keeps the layer's input only: the router's convention goes with it
    m_now = _estimate(dsv3, "bf16", ("moe",))
    m_graph = _estimate(dsv3, "bf16", ("moe",), dict(moe_router_input_saved=0))
    assert m_now.memory_breakdown.activations == m_graph.memory_breakdown.activations


def test_layernorm_recompute_under_fp8_keeps_the_linears_fp8_copies(dsv3):
    blk = next(layer for layer in dsv3.layers if layer.kind == "block")
    parts = selective.block_parts(blk)
    assert parts.input_norm is not None   # multi-latent attention: the norm is its own module
    out = blk.ops[parts.input_norm].bytes_written
    mr = selective.module_recompute(blk, ("layernorm",))
    assert mr.norm_linear_seq == out
    assert mr.norm_linear_dropped_bytes(micro_batch=2, tp=2, cp=2,
                                        sequence_parallel=True) == pytest.approx(out / 2)
    assert selective.module_recompute(blk, ("core_attn",)).norm_linear_seq == 0.0
    blocks = sum(1 for layer in dsv3.layers if layer.kind == "block")
    # bf16: "layernorm" drops each input norm's output (the down projections' saved input) and,
    # in MoE blocks, the pre-MLP norm's (the router's and the shared expert's saved input)
    bf16 = (_estimate(dsv3, "bf16", ("core_attn",)).memory_breakdown.activations
            - _estimate(dsv3, "bf16", ("core_attn", "layernorm")).memory_breakdown.activations)
    moe_blocks = sum(1 for layer in dsv3.layers if layer.num_experts)
    assert bf16 == pytest.approx((blocks + moe_blocks) * out)
    # FP8: the down projections keep their FP8 copies; only the pre-MLP norm's bf16 output,
    # which the router keeps, goes
    fp8 = (_estimate(dsv3, "fp8", ("core_attn",)).memory_breakdown.activations
           - _estimate(dsv3, "fp8", ("core_attn", "layernorm")).memory_breakdown.activations)
    assert fp8 == pytest.approx(moe_blocks * out)
