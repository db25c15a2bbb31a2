"""The "what to change to fit" list offers only changes that lower the peak, and says when
several stop at the same floor (the model states and the optimizer step's working memory; a new
user's report of 2026-12-07: every row read 534.8 GB)."""

from __future__ import annotations

import autopar
from autopar.problem import Problem
from autopar.report.advice import fixes_to_fit
from autopar.report.tables import _common_floor, fixes_table


def _problem():
    return Problem.build("llama3-405b", "2x8xH100",
                         autopar.TrainingConfig(global_batch_size=64, seq_len=8192))


def test_every_offered_change_that_does_not_fit_lowers_the_peak():
    problem = _problem()
    cfg = autopar.ParallelConfig(tp=8, pp=2, dp=1)
    base = problem.cost_model.estimate(problem.cost_model.resolve(cfg))
    fixes = fixes_to_fit(problem, cfg)
    assert fixes and not base.fits
    assert all(e.fits or e.memory_per_gpu_bytes < base.memory_per_gpu_bytes for _t, e in fixes)
    # recomputation and SP all stop at one floor here: the table says so
    floor = _common_floor([e for _t, e in fixes if not e.fits])
    assert floor is not None and floor < base.memory_per_gpu_bytes
    assert "stop at the same" in str(fixes_table(base, fixes).caption)


def test_no_common_floor_among_distinct_peaks():
    class E:
        def __init__(self, b):
            self.memory_per_gpu_bytes = b
    assert _common_floor([E(1e9), E(2e9), E(3e9)]) is None
    assert _common_floor([E(3e9), E(2e9), E(2.001e9)]) == 2e9


def test_changes_that_come_to_the_same_plan_are_one_row():
    # a new user's trial: at dp 1 'pp 4->8 (dp 2->1)' and the same with ZeRO-1, -2 or -3 were
    # four rows of one plan (ZeRO shards nothing over one rank), crowding the eight the table has
    problem = Problem.build("llama2-70b", "4x8xA100-80GB",
                            autopar.TrainingConfig(global_batch_size=1024, seq_len=4096,
                                                   framework="megatron"))
    fixes = fixes_to_fit(problem, autopar.ParallelConfig(tp=4, pp=4, dp=2,
                                                         sequence_parallel=True))
    keys = [(e.step_time_s, e.memory_per_gpu_bytes, e.fits) for _t, e in fixes]
    assert len(keys) == len(set(keys))
    texts = [t for t, _e in fixes]
    assert "pp 4->8 (dp 2->1)" in texts
    assert not any(t.startswith("ZeRO-") and t.endswith("+ pp 4->8 (dp 2->1)") for t in texts)
