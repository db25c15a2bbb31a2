"""Mixture-of-experts: expert parallelism in the cost model, the search and the exporters."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.cost.model import CostModel  # noqa: E402
from autopar.graph import extract  # noqa: E402
from autopar.graph.hf import build  # noqa: E402
from autopar.search.optimize import search  # noqa: E402


@pytest.fixture(scope="module")
def cm():
    graph = extract(build("hf-mixtral-8x7b"), 4096, 1)
    train = autopar.TrainingConfig(global_batch_size=256, seq_len=4096)
    return CostModel(graph, autopar.Cluster.from_spec("4x8xH100"), train)


def test_experts_are_found_with_their_parameters(cm):
    block = cm.graph.blocks[0]
    assert cm.graph.num_experts == 8 and block.experts_per_token == 2
    # 8 experts x 3 GEMMs of 4096 x 14336
    assert block.expert_parameters == 8 * 3 * 4096 * 14336


def test_expert_parallelism_shards_experts_and_adds_all_to_all(cm):
    base = dict(tp=2, pp=2, zero_stage=1, sequence_parallel=True, recompute="selective")
    e1 = cm.estimate(autopar.ParallelConfig(**base, ep=1))
    e4 = cm.estimate(autopar.ParallelConfig(**base, ep=4))
    assert e4.memory_breakdown.weights < 0.4 * e1.memory_breakdown.weights
    assert e1.time_breakdown.ep_comm == 0 < e4.time_breakdown.ep_comm
    assert e4.link_comm("nvlink").nbytes > e1.link_comm("nvlink").nbytes
    with pytest.raises(autopar.InvalidParallelConfig, match="ep=3"):
        cm.estimate(autopar.ParallelConfig(**base, ep=3))


def test_search_uses_expert_parallelism_when_it_helps(cm):
    best = search(cm).best
    assert best.fits and best.config.ep >= 1
    fixed = search(cm, {"ep": 1}).best
    assert best.step_time_s <= fixed.step_time_s


def test_megatron_export_names_expert_parallelism(cm):
    plan = autopar.api.build_plan(cm, search(cm, {"ep": 2}), None)
    args = plan.to_megatron_args().value
    assert "--expert-model-parallel-size" in args
    assert args[args.index("--expert-model-parallel-size") + 1] == "2"


def test_dualpipev_hides_all_to_all_only_where_the_framework_overlaps_it(cm):
    # torchtitan registers an OVERLAP_F_B callback for DualPipeV with ep > 1 (and refuses it
    # with activation checkpointing); stock torch runs the pair's halves one after the other
    titan = CostModel(cm.graph, cm.cluster, replace(cm.train, framework="torchtitan"))
    base = dict(tp=2, pp=2, ep=8, zero_stage=1, sequence_parallel=True, micro_batch_size=1,
                schedule="dualpipev")
    plain = cm.estimate(autopar.ParallelConfig(**base, recompute="none"))
    hidden = titan.estimate(autopar.ParallelConfig(**base, recompute="none"))
    assert hidden.time_breakdown.ep_comm < plain.time_breakdown.ep_comm
    assert hidden.time_breakdown.bubble >= 0
    # a pair starts only when both its inputs have arrived (overlap_callback waits on both
    # receives), so hiding pays only when the all-to-alls are long, as here (ep 8 over nodes)
    assert hidden.step_time_s < plain.step_time_s
    # with activation checkpointing nothing is hidden: the same step but for the optimizer
    # (torchtitan's fused AdamW against torch's foreach default) and the compute slowed by the
    # hidden gradient reduce-scatter (torchtitan reduces in fp32: twice the seconds)
    rc = dict(base, recompute="selective")
    t, c = (m.estimate(autopar.ParallelConfig(**rc)) for m in (titan, cm))
    assert t.step_time_s - t.time_breakdown.optimizer - t.time_breakdown.overlap_slowdown \
        == pytest.approx(c.step_time_s - c.time_breakdown.optimizer
                         - c.time_breakdown.overlap_slowdown)
    assert t.time_breakdown.overlap_slowdown > c.time_breakdown.overlap_slowdown
    assert t.time_breakdown.optimizer < c.time_breakdown.optimizer


def test_ep_on_a_dense_model_says_the_model_has_no_experts():
    # it said "must divide the model's 0 experts ... Fix: use ep in []"
    with pytest.raises(autopar.InvalidParallelConfig,
                       match=r"ep=2 needs a mixture-of-experts model.*Fix: ep=1"):
        autopar.estimate("tiny-gpt", "1x8xH100", autopar.TrainingConfig(global_batch_size=16, seq_len=64),
                         autopar.ParallelConfig(dp=8, ep=2))


def test_each_moe_block_pays_four_all_to_alls(cm):
    # dispatch and combine forward, the same two backward: the step was charged two in all,
    # half of what the communication ledger counted for the same collectives
    c = cm.resolve(autopar.ParallelConfig(tp=1, pp=1, ep=8, zero_stage=1, recompute="none"))
    i = next(i for i, layer in enumerate(cm.graph.layers) if layer.num_experts)
    layer = cm.graph.layers[i]
    # the busiest EP rank's rows under random routing (capacity.random_routing_scale)
    routed = (layer.output_bytes * c.micro_batch_size / cm.graph.micro_batch_size
              * layer.experts_per_token
              * cm.blocks_cost.routed_scale(layer, c.micro_batch_size, 1, 1, False, 8))
    one = cm.group("ep", c).time("all_to_all", routed)
    bc = cm.block_cost(i, "none", c)
    assert bc.ep_s == pytest.approx(4 * one, rel=1e-12)
