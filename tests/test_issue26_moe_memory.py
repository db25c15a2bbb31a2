"""Issue 26: an MoE block's saved tensors as the framework's expert layer keeps them, not as the
transformers block the graph traces (autopar.cost.memory.moe_saved_delta)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.cost import memory as mem  # noqa: E402
from autopar.cost.model import CostModel  # noqa: E402
from autopar.frameworks import get_profile  # noqa: E402
from autopar.frameworks.stacks.megatron import with_moe_probs_at_combine  # noqa: E402
from autopar.graph import extract  # noqa: E402
from autopar.graph.hf import build  # noqa: E402

#: Mixtral 8x7B at 4096 tokens: the routed tokens (4096 x top-2) x hidden 4096 in bf16, the size
#: of the experts' input and of their down projection's output.
ROUTED = 4096 * 2 * 4096 * 2


@pytest.fixture(scope="module")
def graph():
    return extract(build("hf-mixtral-8x7b"), 4096, 1)


def _delta(layer, **kw):
    args = dict(combine_saved=True, input_gathered=False, micro_batch=1.0, tp=1, etp=1, cp=1,
                sequence_parallel=False, dtype_bytes=2)
    return mem.moe_saved_delta(layer, **{**args, **kw})


def test_the_graph_keeps_the_expert_output_for_the_combine(graph):
    block = graph.blocks[0]
    row = [o for o in block.ops if o.moe_role == "expert" and o.tp_role == "row"]
    assert len(row) == 1 and row[0].bytes_written == ROUTED
    assert _delta(block) == 0.0
    assert _delta(graph.layers[0]) == _delta(graph.layers[0], combine_saved=False) == 0.0


@pytest.mark.parametrize("kw, expected", [
    # probabilities in the activation: the combine's copy of the expert output is not kept
    (dict(combine_saved=False), -ROUTED),
    (dict(combine_saved=False, tp=2, etp=2, sequence_parallel=True), -ROUTED / 2),
    # tokens gathered over etp = tp = 2 ranks: the experts keep all the TP group's tokens
    (dict(input_gathered=True, tp=2, etp=2, sequence_parallel=True), ROUTED / 2),
    (dict(input_gathered=True, tp=4, etp=4, sequence_parallel=True), ROUTED * 3 / 4),
    (dict(combine_saved=False, input_gathered=True, tp=2, etp=2, sequence_parallel=True), 0.0),
    # folded (etp 1): each rank keeps its own sequence-parallel share, as the graph counts
    (dict(input_gathered=True, tp=2, etp=1, sequence_parallel=True), 0.0),
    # no sequence parallelism: every TP rank already holds every token
    (dict(input_gathered=True, tp=2, etp=2), 0.0),
    # tp 1, etp 2 (folded): the two expert-TP ranks gather each other's tokens
    (dict(input_gathered=True, tp=1, etp=2), ROUTED),
    (dict(combine_saved=False, micro_batch=2.0, cp=2), -ROUTED),
])
def test_moe_saved_delta(graph, kw, expected):
    assert _delta(graph.blocks[0], **kw) == pytest.approx(expected)


def test_megatron_keeps_what_megatron_core_saves():
    m = get_profile("megatron").memory
    assert (m.moe_combine_saved, m.expert_input_gathered) == (0, 1)
    assert "weighted_bias_swiglu_impl" in m.sources["moe_combine_saved"]
    assert "dispatch_postprocess" in m.sources["expert_input_gathered"]
    assert get_profile("nemo").memory.moe_combine_saved == 0
    assert get_profile("megatron-2023").memory.moe_combine_saved == 1
    assert get_profile("inhouse-2024").memory.moe_combine_saved == 1   # Megatron-LM of 2024
    older = with_moe_probs_at_combine(get_profile("megatron")).memory
    assert older.moe_combine_saved == 1 and "unpermute" in older.sources["moe_combine_saved"]
    for name in ("torch", "torchtitan", "deepspeed"):
        t = get_profile(name).memory
        assert (t.moe_combine_saved, t.expert_input_gathered) == (1, 0)


def test_megatron_activations_drop_the_combine_copy_per_moe_block(graph):
    train = autopar.TrainingConfig(global_batch_size=256, seq_len=4096, framework="megatron")
    cluster = autopar.Cluster.from_spec("4x8xH100")
    now = CostModel(graph, cluster, train)
    before = CostModel(graph, cluster, train,
                       framework=with_moe_probs_at_combine(get_profile("megatron")))
    cfg = autopar.ParallelConfig(tp=1, pp=1, ep=8, zero_stage=1, recompute="none",
                                 micro_batch_size=1)
    a_now = now.estimate(cfg).memory_breakdown.activations
    a_before = before.estimate(cfg).memory_breakdown.activations
    assert a_before - a_now == pytest.approx(32 * ROUTED)   # 32 MoE blocks x 64 MiB = 2 GiB
    full = autopar.ParallelConfig(tp=1, pp=1, ep=8, zero_stage=1, recompute="full",
                                  micro_batch_size=1)
    # full recompute keeps block inputs only; the recomputed block holds one copy less
    assert (before.estimate(full).memory_breakdown.activations
            == now.estimate(full).memory_breakdown.activations)


def test_records_before_megatron_core_0_13_keep_the_combine_copy():
    from benchmarks import records, validation
    raw = {r["id"]: r for r in validation.load_corpus()}
    mixtral = records.parse(raw["moer-mlm756-mixtral8x7b-h100-16gpu-tp2-ep8"])   # 2024
    dsv3 = records.parse(raw["moe-megatron-pr6311-dsv3-14l-64xh100-tp1pp4vpp2-ep16-"
                             "norecompute"])                                     # 2026-08
    assert validation.record_profile(mixtral).memory.moe_combine_saved == 1
    assert validation.record_profile(dsv3).memory.moe_combine_saved == 0
