"""Issue 26 done-when 1 (MoE memory): the peak memory of published MoE runs, component by
component, against what the framework allocates for the plan."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from benchmarks import records, validation  # noqa: E402

GiB = 2 ** 30
_PR = "moe-megatron-pr6{}-dsv3-14l-64xh100-tp1pp4vpp2-ep16-{}"
NORECOMPUTE = _PR.format("311", "norecompute")
FULLRECOMPUTE = _PR.format("429", "fullrecompute-nooverlap")


def _published(rid: str) -> dict:
    import json
    from pathlib import Path
    for f in sorted((Path(records.__file__).parent / "data").glob("published_runs_moe*.json")):
        for r in json.loads(f.read_text()):
            if r["id"] == rid:
                return r
    raise KeyError(rid)


def _estimate(rid: str):
    rec = records.parse(_published(rid))
    train = validation.training(rec)
    graph, _ = validation.model_graph(rec.model, train)
    cm = validation.CostModel(graph, rec.cluster, train,
                              framework=validation.record_profile(rec))
    cfg = autopar.ParallelConfig(**{**validation.framework_defaults(rec), **rec.fixed})
    return rec, cm.estimate(cfg)


@pytest.mark.parametrize("rid", [NORECOMPUTE, FULLRECOMPUTE])
def test_dsv3_proxy_records_take_the_recipes_distributed_optimizer_and_dense_layers(rid):
    """The PRs' DeepSeek-V3 benchmark recipe (Megatron-LM dev examples/moe_recipes/deepseek_v3/
    h100/bf16_1024GPU_TP1PP16EP64.yaml): use_distributed_optimizer true, three leading dense
    layers (moe_layer_freq ([0]*3+...)), recorded as derived."""
    rec = records.parse(_published(rid))
    assert rec.fixed["zero_stage"] == 1
    assert rec.model.first_dense_layers == 3
    assert "DERIVED from the recipe" in _published(rid)["notes"]


def test_dsv3_proxy_peak_allocated_without_recompute():
    """PR #6311's no-recompute arm, 68,704 MB max allocated = 67.09 GiB. The peak rank is pipeline
    rank 2 (chunks 2 and 6: decoder layers 5-6 and 13-14, all MoE): dense parameters (MLA
    187.4e6 + shared expert 44.0e6 + router 1.8e6 per layer) ~0.93e9 at bf16 2 + fp32 main grad
    4 + (master 4 + Adam 8) / dp 16 bytes; routed experts 4 x 256 x 3 x 7168 x 2048 / ep 16 =
    2.82e9 at 2 + 4 + 12 bytes (expert data parallel 16 / 16 = 1: nothing to shard over); 7
    chunk-micro-batches in flight under interleaved 1F1B (Megatron's warm-up (4 - 2 - 1) x 2 +
    (2 - 1) x 4, plus the one in its steady state) of 2 layers each."""
    rec, e = _estimate(NORECOMPUTE)
    b = e.stage_memory_breakdown
    peak = max(range(4), key=lambda i: b[i].allocated)
    assert peak == 2
    assert b[2].weights / GiB == pytest.approx(6.99, abs=0.01)
    assert b[2].gradients / GiB == pytest.approx(13.97, abs=0.01)
    assert b[2].optimizer_states / GiB == pytest.approx(32.15, abs=0.01)
    assert b[2].activations / GiB == pytest.approx(13.94, abs=0.05)
    assert rec.measured_memory_gib == pytest.approx(67.094)
    assert b[2].allocated / GiB == pytest.approx(67.11, abs=0.05)
    assert b[2].allocated / GiB == pytest.approx(rec.measured_memory_gib, rel=0.05)


def test_dsv3_proxy_peak_allocated_with_full_recompute():
    """PR #6429 arm C (full recompute, uniform, 1 layer): 60,154 MB = 58.74 GiB. Predicted 54.5
    GiB (-7%): the same model states as without recompute; the activations drop to the layers'
    inputs and one recomputed layer. The 8.35 GiB the PR measures between the arms is below the
    12.6 GiB predicted between them (unexplained: see the branch's report)."""
    rec, e = _estimate(FULLRECOMPUTE)
    assert rec.measured_memory_gib == pytest.approx(58.744)
    assert e.memory_breakdown.allocated / GiB == pytest.approx(54.52, abs=0.05)
    assert e.memory_breakdown.allocated / GiB == pytest.approx(rec.measured_memory_gib, rel=0.10)
