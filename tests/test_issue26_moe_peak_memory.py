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
    from benchmarks.validation import load_corpus
    return next(r for r in load_corpus() if isinstance(r, dict) and r.get("id") == rid)


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
    (2 - 1) x 4, plus the one in its steady state) of 2 layers each; the routed activations
    those of the busiest of 16 EP ranks under random routing (capacity.random_routing_scale:
    13.14 GiB, 13.07 at the balanced share)."""
    rec, e = _estimate(NORECOMPUTE)
    b = e.stage_memory_breakdown
    peak = max(range(4), key=lambda i: b[i].allocated)
    assert peak == 2
    assert b[2].weights / GiB == pytest.approx(6.99, abs=0.01)
    assert b[2].gradients / GiB == pytest.approx(13.97, abs=0.01)
    assert b[2].optimizer_states / GiB == pytest.approx(32.15, abs=0.01)
    assert b[2].activations / GiB == pytest.approx(13.14, abs=0.05)
    assert rec.measured_memory_gib == pytest.approx(67.094)
    assert b[2].allocated / GiB == pytest.approx(66.31, abs=0.05)
    assert b[2].allocated / GiB == pytest.approx(rec.measured_memory_gib, rel=0.05)


def test_dsv3_proxy_peak_allocated_with_full_recompute():
    """PR #6429 arm C (full recompute, uniform, 1 layer): 60,154 MB = 58.74 GiB. Predicted 55.5
    GiB (-6%): the activations drop to the layers' inputs and one recomputed layer, so the peak
    moves to pipeline rank 3, which runs the MTP module without the embedding layer and so keeps
    Megatron-Core's copy of the embedding table (129,280 x 7,168 = 0.93e9 parameters at bf16 2 +
    fp32 main grad 4 + 12 / dp 16 bytes: +5.8 GiB; autopar.graph.mtp); rank 2 stays at 54.5 GiB
    (54.46 before the copy was counted, when it was the peak). The 8.35 GiB the PR measures
    between the arms is below the 10.8 GiB predicted between them (unexplained: see the
    branch's report)."""
    rec, e = _estimate(FULLRECOMPUTE)
    assert rec.measured_memory_gib == pytest.approx(58.744)
    b = e.stage_memory_breakdown
    assert max(range(4), key=lambda i: b[i].allocated) == 3
    assert (b[3].weights - b[2].weights) / GiB == pytest.approx(1.89, abs=0.01)
    assert b[2].allocated / GiB == pytest.approx(54.46, abs=0.05)
    assert e.memory_breakdown.allocated / GiB == pytest.approx(55.46, abs=0.05)
    assert e.memory_breakdown.allocated / GiB == pytest.approx(rec.measured_memory_gib, rel=0.10)


TITAN9 = "mem-titan-dsv3-16b-8xh100-dp8-ep4-run9-graphtrainer-minimalasyncep-cudagraph-b16"


def _memory_record(rid: str) -> dict:
    import json
    from pathlib import Path
    f = Path(records.__file__).parent / "data" / "published_runs_memory.json"
    return next(r for r in json.loads(f.read_text()) if r["id"] == rid)


def test_torchtitan_chunked_loss_keeps_one_chunk_of_logits():
    """torchtitan's ChunkedCELoss (components/loss.py at 6b9602339, num_chunks 8): DeepSeek-V3
    16B, local batch 16 x 4096 tokens, vocab 102400. Unchunked, the head keeps the fp32
    log-probabilities (16 x 1600 MiB = 25 GiB) and the loss's backward works on 8 bytes per
    logit (50 GiB). Chunked: kept = the final norm's input (0.25 GiB) + its eager RMSNorm fp32
    copy (0.5 GiB) + the accumulated input gradient (0.25 GiB) = 1.0 GiB; transient = (25 + 50)
    / 8 GiB for one chunk + the hidden states' chunks and the fp32 accumulator (3 x 0.25 GiB)."""
    raw = _memory_record(TITAN9)
    assert raw["training"]["loss_chunks"] == 8 and "num_chunks=8" in raw["source_quote"]
    rec = records.parse(raw)
    prof = validation.record_profile(rec)
    assert prof.memory.loss_chunks == 8
    train = validation.training(rec)
    graph, _ = validation.model_graph(rec.model, train)
    cm = validation.CostModel(graph, rec.cluster, train, framework=prof)
    c = cm.resolve(autopar.ParallelConfig(**{**validation.framework_defaults(rec), **rec.fixed}))
    head = len(graph.layers) - 1
    bc = cm.block_cost(head, "none", c)
    assert bc.act_bytes / GiB == pytest.approx(1.0, abs=0.01)
    assert bc.transient_bytes / GiB == pytest.approx(75.0 / 8 + 0.75, abs=0.01)
    unchunked = validation.CostModel(graph, rec.cluster, train,
                                     framework=validation.get_profile("torchtitan"))
    whole = unchunked.block_cost(head, "none", unchunked.resolve(c))
    assert whole.act_bytes / GiB == pytest.approx(26.0, abs=0.01)
    assert whole.transient_bytes / GiB == pytest.approx(50.0, abs=0.01)
    e = cm.estimate(c)
    # measured 57.31 GiB peak reserved (torchtitan max_reserved_gib); 120.4 GiB before
    assert rec.measured_memory_gib == pytest.approx(57.31)
    assert e.memory_breakdown.total / GiB == pytest.approx(54.8, abs=0.1)


def test_loss_chunks_is_a_whole_number():
    from autopar.errors import AutoparError
    from autopar.frameworks.stacks.torchtitan import with_chunked_loss
    prof = validation.get_profile("torchtitan")
    assert prof.memory.loss_chunks == 0
    assert with_chunked_loss(prof, 4, "a test").memory.loss_chunks == 4
    with pytest.raises(AutoparError, match="loss_chunks"):
        with_chunked_loss(prof, -1, "a test")


PITH_FSDP = "moe-pithtrain-pr40-qwen3-30b-a3b-64xh100-pp4-ep8-dualpipev-fsdp"


def test_pithtrain_loss_keeps_the_bf16_logits_as_their_gradient():
    """PithTrain's cross entropy (pith-train 093a9e4 pithtrain/operators/cross_entropy.py) writes
    the gradient into the bf16 logits in its forward, saves them and scales them in place in
    backward: Qwen3-30B-A3B's head at 4096 tokens keeps 4096 x 151936 x 2 bytes = 1.16 GiB of
    logits (not 2.32 GiB of fp32 log-probabilities) plus the final norm's input, and its
    backward allocates nothing beside them (not 8 bytes per logit = 4.64 GiB). The fullest rank
    (pipeline rank 0, which holds the head under DualPipeV) comes to 49.0 GiB allocated against
    48.33 measured (+1.5%; 61.4 before the loss, 55.5 before PithTrain's compiled layers and
    DualPipeV FSDP: autopar.frameworks.stacks.pithtrain). Under the compiled-layer fusion the
    final norm keeps no eager extra (it runs eagerly in PithTrain's epilog_f: 32 MiB short).
    49.1 GiB with the routed rows of the busiest EP rank under random routing
    (capacity.random_routing_scale)."""
    rec = records.parse(_published(PITH_FSDP))
    prof = validation.record_profile(rec)
    assert (prof.memory.loss_saved_bytes, prof.memory.loss_work_bytes) == (2, 0)
    assert "cross_entropy.py" in prof.memory.sources["loss_saved_bytes"]
    train = validation.training(rec)
    graph, _ = validation.model_graph(rec.model, train)
    cm = validation.CostModel(graph, rec.cluster, train, framework=prof)
    c = cm.resolve(autopar.ParallelConfig(**{**validation.framework_defaults(rec), **rec.fixed}))
    head = cm.block_cost(len(graph.layers) - 1, "none", c)
    logits = 4096 * 151936
    # (the loss op also writes its int64 labels, 32 KiB, counted with the logits)
    assert head.act_bytes == pytest.approx(2 * logits + 33587200, rel=1e-4)
    assert head.transient_bytes == 0.0
    e = cm.estimate(c)
    assert e.memory_breakdown.allocated / GiB == pytest.approx(49.15, abs=0.05)
    assert rec.measured_memory_gib == pytest.approx(48.33)
