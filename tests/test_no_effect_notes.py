"""Choices that change nothing in a hand-written plan are noted, not silently accepted."""

from __future__ import annotations

import dataclasses

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel


def _model(cluster="2x8xA100-80GB"):
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=512)
    graph = model_graph("tiny-llama", train)[0]
    return CostModel(graph, autopar.Cluster.from_spec(cluster), train)


def _notes(est, word):
    return [w for w in est.warnings if word in w]


def test_zero_at_dp_1_is_noted_and_costs_nothing():
    cm = _model("1x2xA100-80GB")
    plain = cm.estimate(autopar.ParallelConfig(tp=2, dp=1, micro_batch_size=2))
    zero = cm.estimate(autopar.ParallelConfig(tp=2, dp=1, zero_stage=3, micro_batch_size=2))
    assert zero.step_time_s == plain.step_time_s
    assert len(_notes(zero, "zero_stage=3 with dp x cp = 1")) == 1
    assert not _notes(plain, "zero_stage")


def test_pipeline_schedule_at_pp_1_is_noted():
    cm = _model()
    for schedule in ("gpipe", "dualpipev", "interleaved-1f1b"):
        est = cm.estimate(autopar.ParallelConfig(dp=16, schedule=schedule, micro_batch_size=2))
        assert len(_notes(est, f"schedule {schedule!r} at pp=1")) == 1
    assert not _notes(cm.estimate(autopar.ParallelConfig(dp=16, micro_batch_size=2)), "pp=1")


def test_interleaving_at_pp_1_is_noted_and_costs_nothing():
    # virtual_stages=4 at pp=1 was dropped silently (costed as v=1), while a schedule got a note
    cm = _model()
    plain = cm.estimate(autopar.ParallelConfig(dp=16, micro_batch_size=2))
    est = cm.estimate(autopar.ParallelConfig(dp=16, virtual_stages=4, micro_batch_size=2))
    assert est.step_time_s == plain.step_time_s and est.config.virtual_stages == 1
    assert len(_notes(est, "virtual_stages=4 at pp=1")) == 1
    assert "drop it, or pp > 1" in _notes(est, "virtual_stages=4")[0]
    assert not _notes(cm.estimate(autopar.ParallelConfig(dp=16, virtual_stages=1,
                                                         micro_batch_size=2)), "virtual_stages")
    piped = cm.estimate(autopar.ParallelConfig(pp=2, dp=8, virtual_stages=2, micro_batch_size=2))
    assert piped.config.virtual_stages == 2 and not _notes(piped, "virtual_stages")


def test_device_without_sm_count_is_noted_and_pays_no_slowdown():
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=512)
    graph = model_graph("tiny-llama", train)[0]
    known = autopar.Cluster.from_spec("2x8xA100-80GB")
    dev = dataclasses.replace(known.device, name="my-gpu", sm_count=0)
    unknown = autopar.Cluster.custom(2, 8, dev, intra=known.intra_link, inter=known.inter_link,
                                     nics_per_node=known.nics_per_node)
    cfg = autopar.ParallelConfig(dp=16, zero_stage=3, micro_batch_size=2)
    est = CostModel(graph, unknown, train).estimate(cfg)
    assert len(_notes(est, "has no sm_count")) == 1
    assert est.time_breakdown.overlap_slowdown == 0.0
    assert not _notes(CostModel(graph, known, train).estimate(cfg), "sm_count")

def test_context_parallel_mode_at_cp_1_is_noted_and_costs_nothing():
    # cp_mode='ulysses' at cp=1 was accepted in silence from Python (the CLI noted it)
    cm = _model()
    plain = cm.estimate(autopar.ParallelConfig(dp=16, micro_batch_size=2))
    for mode in ("ulysses", "allgather"):
        est = cm.estimate(autopar.ParallelConfig(dp=16, cp_mode=mode, micro_batch_size=2))
        assert est.step_time_s == plain.step_time_s
        assert len(_notes(est, f"cp_mode={mode!r} at cp=1")) == 1
    assert not _notes(plain, "cp_mode")
    ring = cm.estimate(autopar.ParallelConfig(dp=8, cp=2, cp_mode="ulysses",
                                              micro_batch_size=2))
    assert not _notes(ring, "cp_mode")
