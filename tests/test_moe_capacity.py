"""MoE token dropping at an expert capacity (issue 26 item 3): Megatron-Core's capacity rule,
its price (expert GEMMs, dispatch all-to-all, routed activations), the frameworks that run it,
the exporters and the importer."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.api import model_graph  # noqa: E402
from autopar.cost import capacity, memory  # noqa: E402
from autopar.cost.model import CostModel  # noqa: E402
from autopar.errors import InvalidTrainingConfig  # noqa: E402
from autopar.io.importers import from_megatron_args  # noqa: E402
from autopar.runtime.errors import UnsupportedPlanError  # noqa: E402
from autopar.search.optimize import search  # noqa: E402

# 8 experts top-2, expert FFN 256, hidden 128: seq 1024 -> T x k / E = 256 rows per expert
_MOE = dict(name="cap-moe", family="llama", num_layers=4, hidden_size=128, num_heads=4,
            num_kv_heads=2, vocab_size=512, seq_len=1024, ffn_hidden_size=512,
            num_experts=8, top_k=2, moe_ffn_hidden_size=256)
_PLAN = dict(tp=1, pp=1, dp=4, ep=4, zero_stage=1, recompute="none", micro_batch_size=1)


def _train(**kw) -> autopar.TrainingConfig:
    return autopar.TrainingConfig(global_batch_size=8, seq_len=1024, framework="megatron", **kw)


@pytest.fixture(scope="module")
def graph():
    return model_graph(_MOE, _train())[0]


def _estimate(graph, **kw):
    cm = CostModel(graph, autopar.Cluster.from_spec("1x4xH100"), _train(**kw))
    return cm, cm.estimate(autopar.ParallelConfig(**_PLAN))


def test_capacity_is_megatrons_ceil_rule():
    # moe_utils.py get_capacity: ceil(num_tokens x topk / num_experts x capacity_factor)
    assert capacity.expert_capacity(4096, 2, 8, 1.25) == 1280
    assert capacity.expert_capacity(10, 1, 3, 0.3) == 1   # ceil(0.999...) = 1


@pytest.mark.parametrize("factor, pad, tokens, top_k, experts, scale", [
    (None, False, 4096, 2, 8, 1.0),      # dropless
    # balanced in expectation, capacity at the mean: random routing's excess dropped
    (1.0, False, 4096, 2, 8, capacity.random_routing_scale(4096, 2, 8, 1, 1024)),
    (2.0, False, 4096, 2, 8, 1.0),       # not padded: a larger capacity adds nothing
    (0.5, False, 4096, 2, 8, 0.5),       # half of each expert's 1024 rows dropped
    (1.25, True, 4096, 2, 8, 1.25),      # padded to 1280 of 1024
    (1.0, True, 1000, 8, 128, 63 / 62.5),  # ceil: 63 rows of a 62.5-row load
    (8.0, True, 8, 2, 8, 4.0),           # capacity 16 > 8 tokens: every token, once per expert
])
def test_routed_scale(factor, pad, tokens, top_k, experts, scale):
    train = _train(moe_capacity_factor=factor, moe_pad_to_capacity=pad)
    assert capacity.routed_scale(train, tokens, top_k, experts) == pytest.approx(scale)


@pytest.mark.parametrize("kw, match", [
    (dict(moe_capacity_factor=0), "positive number"),
    (dict(moe_capacity_factor=-1.0), "positive number"),
    (dict(moe_capacity_factor=math.nan), "positive number"),
    (dict(moe_capacity_factor=True), "positive number"),
    (dict(moe_pad_to_capacity=True), "needs moe_capacity_factor"),
])
def test_training_config_refuses_bad_capacity(kw, match):
    with pytest.raises(InvalidTrainingConfig, match=match):
        _train(**kw)


def test_frameworks_without_token_dropping_are_refused(graph):
    cluster = autopar.Cluster.from_spec("1x4xH100")
    for fw in ("torchtitan", "torch"):
        train = replace(_train(moe_capacity_factor=1.0), framework=fw)
        with pytest.raises(InvalidTrainingConfig, match="drop moe_capacity_factor"):
            CostModel(graph, cluster, train)
    dense = model_graph({k: v for k, v in _MOE.items()
                         if k not in ("num_experts", "top_k", "moe_ffn_hidden_size")},
                        _train())[0]
    with pytest.raises(InvalidTrainingConfig, match="no routed experts"):
        CostModel(dense, cluster, _train(moe_capacity_factor=1.0))


def test_padding_scales_expert_gemms_all_to_all_and_routed_activations(graph):
    cm0, e0 = _estimate(graph)
    # not padded, at the mean: drops the busiest rank's random excess, nothing more
    _, e1 = _estimate(graph, moe_capacity_factor=1.0)
    _, e2 = _estimate(graph, moe_capacity_factor=2.0, moe_pad_to_capacity=True)
    # (the tiny step is host-bound: the issue time hides the GPU seconds saved)
    assert e1.time_breakdown.compute < e0.time_breakdown.compute
    assert e1.step_time_s <= e0.step_time_s
    assert e1.memory_breakdown.activations < e0.memory_breakdown.activations
    # dropless, the busiest of 4 EP ranks runs s0 x its balanced rows (1,024 tokens a call)
    s0 = capacity.random_routing_scale(1024, 2, 8, 4)
    # twice the rows on the wire: the four all-to-alls per MoE block carry 2x the bytes
    assert e2.link_comm("nvlink").nbytes > e0.link_comm("nvlink").nbytes
    block = next(i for i, layer in enumerate(graph.layers) if layer.num_experts)
    resolved = cm0.resolve(autopar.ParallelConfig(**_PLAN))
    b0 = cm0.block_cost(block, "none", resolved)
    cm2 = CostModel(graph, cm0.cluster, _train(moe_capacity_factor=2.0, moe_pad_to_capacity=True))
    b2 = cm2.block_cost(block, "none", resolved)
    # (Megatron-Core's all-gather of the per-expert counts does not grow with the rows:
    # tests/test_issue26_alltoall_metadata.py)
    counts = cm0.blocks_cost.alltoall_metadata_s(graph.layers[block], resolved, 1.0)[3].nbytes
    assert b2.ep_load.nbytes - counts == pytest.approx(2 * (b0.ep_load.nbytes - counts) / s0)
    # the expert GEMMs' FLOPs go from s0 to 2 x the balanced ones; nothing else changes
    layer = graph.layers[block]
    expert = sum(o.fwd_flops for o in layer.ops if o.moe_role == "expert")
    lt0 = cm0.layer_time(block, 1, 1, 1, False, ep=4)
    lt2 = cm2.layer_time(block, 1, 1, 1, False, ep=4)
    assert lt2.fwd_flops - lt0.fwd_flops == pytest.approx(expert * (2 - s0))
    # routed saved bytes per rank and micro-batch: 2048 rows x (h + 3 f) x 2 bytes, once more
    routed = memory.routed_saved_bytes(layer, micro_batch=1, tp=1, cp=1)
    assert routed == pytest.approx(1024 * 2 * (128 + 3 * 256) * 2)
    assert b2.act_bytes - b0.act_bytes == pytest.approx(routed * (2 - s0))


def test_dropping_below_one_removes_rows(graph):
    cm0, e0 = _estimate(graph)
    cm5, e5 = _estimate(graph, moe_capacity_factor=0.5)
    block = next(i for i, layer in enumerate(graph.layers) if layer.num_experts)
    expert = sum(o.fwd_flops for o in graph.layers[block].ops if o.moe_role == "expert")
    lt0, lt5 = (cm.layer_time(block, 1, 1, 1, False, ep=4) for cm in (cm0, cm5))
    # dropless: the busiest rank's random excess (s0); factor 0.5: half, the excess dropped
    s0 = capacity.random_routing_scale(1024, 2, 8, 4)
    assert lt0.fwd_flops - lt5.fwd_flops == pytest.approx(expert * (s0 - 0.5))
    assert lt5.fwd_s < lt0.fwd_s
    assert e5.memory_breakdown.activations < e0.memory_breakdown.activations


def test_exporters_write_or_refuse_the_capacity(graph):
    cm = CostModel(graph, autopar.Cluster.from_spec("1x4xH100"),
                   _train(moe_capacity_factor=1.5, moe_pad_to_capacity=True))
    plan = autopar.api.build_plan(cm, search(cm, dict(_PLAN)), None)
    args = plan.to_megatron_args().value
    assert args[args.index("--moe-expert-capacity-factor") + 1] == "1.5"
    assert "--moe-pad-expert-input-to-capacity" in args
    with pytest.raises(UnsupportedPlanError, match="torchtitan's MoE is dropless"):
        plan.to_torchtitan_toml()
    # DeepSpeed sets the capacity in the model code: the JSON config says so, and runs
    ds = plan.to_deepspeed_config()
    assert any("MoE(capacity_factor=1.5, drop_tokens=True)" in w for w in ds.warnings)


def test_deepspeed_pads_every_expert_to_its_capacity(graph):
    # deepspeed/moe/sharded_moe.py topkgating: C = max(ceil(T / E x factor x k), min_capacity 4)
    # rows per expert, whatever the expert was sent; dropless pads to the busiest expert
    ds = _train(moe_capacity_factor=1.0)
    assert capacity.routed_scale(ds, 4096, 2, 8, rule="deepspeed") == pytest.approx(1.0)
    assert capacity.routed_scale(ds, 8, 2, 8, rule="deepspeed") == pytest.approx(2.0)  # C = 4
    half = _train(moe_capacity_factor=0.5)
    assert capacity.routed_scale(half, 4096, 2, 8, rule="deepspeed") == pytest.approx(0.5)
    hot = _train(moe_expert_load=(3, 1, 1, 1, 1, 1, 1, 1))
    # Megatron dropless: the busiest EP rank's block; DeepSpeed dropless: the busiest expert
    assert capacity.routed_scale(hot, 4096, 2, 8, ep=4) == pytest.approx((2.4 + 0.8) / 2)
    assert capacity.routed_scale(hot, 4096, 2, 8, ep=4, rule="deepspeed") == pytest.approx(2.4)
    assert capacity.routed_scale(replace(hot, moe_capacity_factor=1.0), 4096, 2, 8, ep=4,
                                 rule="deepspeed") == pytest.approx(1.0)
    # the cost model takes the rule from the framework profile
    cluster = autopar.Cluster.from_spec("1x4xH100")
    times = {}
    for fw in ("megatron", "deepspeed"):
        for load in (None, (3, 1, 1, 1, 1, 1, 1, 1)):
            cm = CostModel(graph, cluster, replace(_train(moe_expert_load=load), framework=fw))
            block = next(i for i, layer in enumerate(graph.layers) if layer.num_experts)
            times[fw, load is None] = cm.layer_time(block, 1, 1, 1, False, ep=4).fwd_flops
    # balanced in expectation: DeepSpeed pads every expert to the busiest one's count,
    # Megatron runs the busiest rank's block of experts (capacity.busiest_expert_scale)
    assert times["deepspeed", True] > times["megatron", True]
    assert times["deepspeed", False] > times["megatron", False] > times["megatron", True]


def test_megatron_import_reads_the_capacity():
    imp = from_megatron_args("--expert-model-parallel-size 4 --moe-expert-capacity-factor 1.25 "
                             "--moe-pad-expert-input-to-capacity")
    assert imp.train == {"moe_capacity_factor": 1.25, "moe_pad_to_capacity": True}
    # transformer_config.py: a negative factor is dropless
    assert "moe_capacity_factor" not in from_megatron_args(
        "--moe-expert-capacity-factor -1").train


def test_header_line_names_the_capacity():
    assert capacity.capacity_text(_train()) == ""
    assert capacity.capacity_text(_train(moe_capacity_factor=1.5, moe_pad_to_capacity=True)) \
        == ", MoE capacity factor 1.5 (padded)"


def _simulated_busiest(tokens: int, top_k: int, experts: int, ep: int, trials: int,
                       cap: int | None = None) -> float:
    """Monte Carlo of Megatron-Core's forced balancing: normal logits, top-k per token, one
    router call per EP rank, each expert's rows capped per call; the busiest EP rank's rows
    over its balanced share, averaged over trials."""
    import numpy as np
    rng = np.random.default_rng(0)
    local = experts // ep
    share = ep * tokens * top_k / ep
    out = []
    for _ in range(trials):
        counts = np.zeros((ep, experts))
        for src in range(ep):
            picks = np.argpartition(rng.standard_normal((tokens, experts)), -top_k,
                                    axis=1)[:, -top_k:]
            c = np.bincount(picks.ravel(), minlength=experts).astype(float)
            counts[src] = c if cap is None else np.minimum(c, cap)
        per_rank = counts.sum(axis=0).reshape(ep, local).sum(axis=1)
        out.append(per_rank.max() / share)
    return float(np.mean(out))


@pytest.mark.parametrize("tokens, top_k, experts, ep, cap", [
    (1024, 8, 128, 8, None),   # Qwen3-235B at tp 4 (SP), ep 8
    (512, 2, 32, 8, None),
    (1024, 8, 128, 8, 64),     # capacity factor 1
    (4096, 2, 8, 8, None),     # Mixtral, one expert per rank
])
def test_random_routing_scale_matches_a_simulation(tokens, top_k, experts, ep, cap):
    """The closed form (binomial counts, the without-replacement factor, Blom's expected
    maximum) against 40 simulated steps of random top-k routing: within 0.6%."""
    want = _simulated_busiest(tokens, top_k, experts, ep, 40, cap)
    got = capacity.random_routing_scale(tokens, top_k, experts, ep, cap)
    assert got == pytest.approx(want, rel=0.006)
    # one rank holding every expert runs the whole call: nothing fluctuates
    assert capacity.random_routing_scale(tokens, top_k, experts, 1) == 1.0
