"""Issue 24, item 7: the per-block recomputation of a pipeline rank whose blocks differ and whose
memory binds is an OR-Tools CP-SAT model (autopar/search/recompute.py) that the search calls
(since issue 26, item 5: on the ranks of the plans it returns);
its answer equals brute force and the exact enumeration (autopar/search/rank_dp.py), the
search's plans are the enumeration's, and a work limit returns the best assignment with its gap.
"""

from __future__ import annotations

import itertools
import warnings
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar
from autopar.cost.model import CostModel
from autopar.search import cuts, rank_dp, recompute
from autopar.search.margin import derated
from autopar.search.optimize import search
from autopar.search.rankcost import MODES, RankCosts, rank_costs, slots
from rank_problems import BYTES, SIGS, brute, rank_problem


@settings(max_examples=150, deadline=None)
@given(sigs=SIGS,
       modes=st.sampled_from([m for r in (2, 3) for m in itertools.combinations(MODES, r)]),
       floor=BYTES, budget=st.integers(0, 40))
def test_cp_sat_equals_brute_force_on_small_mixed_problems(sigs, modes, floor, budget):
    """A few blocks of 1-3 kinds, 2-3 modes, equal costs included: CP-SAT's assignment has the
    brute force's time and memory, and the enumeration's."""
    rc = rank_problem(sigs, floor, budget)
    got, exact, forced = recompute.solve_rank(rc, modes), rank_dp.solve(rc, modes), brute(rc, modes)
    assert (got is None) == (forced is None) == (exact is None)
    if got is not None:
        assert (got.time_s, got.peak_bytes) == pytest.approx(forced, rel=1e-12)
        assert (exact[0], exact[1]) == pytest.approx(forced, rel=1e-12)
        assert got.optimal and got.gap == 0.0 and got.bound_s == got.time_s
        # the same assignment as the enumeration, ties included
        norm = [{m: n for m, n in d.items() if n} for d in got.by_mode]
        assert norm == [{m: n for m, n in d.items() if n} for d in exact[2]]


def _squeezed(mixed, fraction: float) -> CostModel:
    """The mixed model on GPUs of ``fraction`` of its unconstrained best plan's memory."""
    cm, peak = mixed
    return derated(cm, 1 - fraction * peak / cm.device.visible_memory_bytes)


@pytest.mark.parametrize("fraction", [0.9, 0.5])
def test_cp_sat_equals_brute_force_on_the_ranks_of_a_mixed_model(mixed, fraction):
    """Every rank of 1-3 pipeline ranks of a dense-then-MoE model under binding memory, with
    2-3 modes: CP-SAT's time and memory are brute force's."""
    cm = _squeezed(mixed, fraction)
    seen = 0
    for pp, modes in itertools.product((1, 2, 3), [("none", "full"),
                                                   ("none", "selective", "full")]):
        try:
            c = cm.resolve(autopar.ParallelConfig(pp=pp, tp=8 // (pp if pp != 3 else 1)
                                                  if pp != 3 else 1, dp=None))
        except autopar.InvalidParallelConfig:
            continue
        for st_ in cm.stage_layout(c):
            rc = rank_costs(cm, c, st_, slots(modes))
            if len(rc.sigs) < 2 or not rc.step_fits:
                continue
            seen += 1
            got, forced = recompute.solve_rank(rc, modes), brute(rc, modes)
            assert (got is None) == (forced is None)
            if got is not None:
                assert (got.time_s, got.peak_bytes) == pytest.approx(forced, rel=1e-12)
    assert seen > 0


@pytest.mark.parametrize("fraction,fixed", [(0.9, None), (0.5, {"micro_batch_size": 4})])
def test_the_search_calls_cp_sat_where_blocks_differ_and_memory_binds(mixed, fraction, fixed,
                                                                      monkeypatch):
    """The search solves with CP-SAT the ranks of mixed blocks under binding memory of the
    plans it returns (observed by a recording wrapper and by the result's count; while it
    searches, the exact enumeration answers them, issue 26 item 5), CP-SAT agrees with the
    enumeration there (a disagreement warns), and the plans are those the enumeration alone
    gives (the search before CP-SAT was on its path). At 0.9 of the memory the returned plans
    need no mixed recomputation; at 0.5 with 4-sequence micro-batches they do."""
    cm = _squeezed(mixed, fraction)
    calls = []
    solve = recompute.solve_rank

    def recording(rc, modes, **kw):
        calls.append(len(rc.sigs))
        return solve(rc, modes, **kw)

    monkeypatch.setattr(recompute, "solve_rank", recording)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with_cp_sat = search(CostModel(cm.graph, cm.cluster, cm.train), fixed=fixed)
    if fixed:
        assert calls and min(calls) >= 2
    assert with_cp_sat.assignments == len(calls) and with_cp_sat.assignment_gap == 0.0
    monkeypatch.setattr(cuts, "uses_cp_sat", lambda rc, modes: False)
    calls.clear()
    alone = search(CostModel(cm.graph, cm.cluster, cm.train), fixed=fixed)
    assert not calls and alone.assignments == 0
    for a, b in zip((with_cp_sat.best, *with_cp_sat.top), (alone.best, *alone.top)):
        assert a.config == b.config and a.step_time_s == b.step_time_s
    assert len(with_cp_sat.top) == len(alone.top)


def test_homogeneous_blocks_stay_with_the_enumeration(dense_or_tiny_moe, monkeypatch):
    """A model of one kind of block never reaches CP-SAT, memory binding or not (the speed
    problems' case: the enumeration is exact there, and O(blocks))."""
    cfg = {"name": "small", "family": "llama", "num_layers": 12, "hidden_size": 5120,
           "num_heads": 40, "num_kv_heads": 8, "vocab_size": 32000, "seq_len": 4096}
    cm = dense_or_tiny_moe("dense", cfg)
    monkeypatch.setattr(recompute, "solve_rank", lambda *a, **k: pytest.fail("CP-SAT called"))
    r = search(cm)
    assert r.assignments == 0
    assert not isinstance(r.best.config.recompute, str) or r.best.config.recompute != "none" \
        or r.best.fits


def test_a_work_limit_returns_the_best_assignment_with_its_gap():
    """Stopped before it proves optimality, the model returns a fitting assignment, the bound
    it proved and the gap between them; the same input gives the same answer."""
    k = 40
    costs = [(k, {"none": 1.0 + i / 7, "selective": 1.1 + i / 5, "full": 1.4 + i / 3},
              {"none": 9.0 + i, "selective": 6.0 + i, "full": 1.0 + i / 2},
              {"none": 0.0, "selective": 1.0, "full": 2.0}) for i in range(3)]
    by_sig = OrderedDict((f"s{i}", list(range(100 * i, 100 * i + k))) for i in range(3))
    rc = RankCosts(0.0, 0.0, 0.0, by_sig, costs, True, 3 * k * 5.0)
    modes = ("none", "selective", "full")
    stopped = [recompute.solve_rank(rc, modes, time_limit=0.0) for _ in range(2)]
    assert stopped[0] == stopped[1]
    got = stopped[0]
    assert got is not None and not got.optimal
    assert got.bound_s <= got.time_s and got.gap == pytest.approx(
        (got.time_s - got.bound_s) / got.time_s)
    assert got.peak_bytes <= rc.budget_bytes and got.gap > 0
    full = recompute.solve_rank(rc, modes)
    assert full.optimal and full.gap == 0.0 and got.bound_s <= full.time_s <= got.time_s
