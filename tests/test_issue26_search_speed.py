"""Issue 26, item 5: the speed-ups of the per-block recomputation give the answers of the plain
computations. The relaxation bound of a rank (:func:`autopar.search.cuts.time_floor`) is never
above the exact answer; the stage-cut programme that skips intervals by it, the run's memo of
CP-SAT answers and the kept-gathered variants bounded by it and by monotonicity leave the
search's best, top, front and counts as the computations without them."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.search import cuts, kept, optimize, phases, recompute
from autopar.search.margin import derated
from autopar.search.rankcost import MODES
from rank_problems import BYTES, SIGS, brute, rank_problem


@settings(max_examples=200, deadline=None)
@given(sigs=SIGS,
       modes=st.sampled_from([m for r in (1, 2, 3, 4) for m in itertools.combinations(MODES, r)]),
       floor=BYTES, budget=st.integers(0, 40), fixed_s=st.sampled_from([0.0, 0.5]))
def test_the_relaxation_bound_is_never_above_the_exact_answer(sigs, modes, floor, budget,
                                                              fixed_s):
    rc = rank_problem(sigs, floor, budget, fixed_s)
    exact = brute(rc, modes)
    bound = cuts.time_floor(rc, modes)
    if exact is None:
        return   # the relaxation may still fit fractions
    assert bound <= fixed_s + exact[0]
    # and it is a bound worth having: at least every block in its fastest mode when that fits
    assert bound >= 0


@settings(max_examples=150, deadline=None)
@given(sigs=SIGS,
       modes=st.sampled_from([m for r in (1, 2, 3, 4) for m in itertools.combinations(MODES, r)]),
       floor=BYTES, budgets=st.lists(st.integers(0, 40), min_size=2, max_size=8))
def test_ranks_sharing_their_layers_costs_get_the_answers_solved_alone(sigs, modes, floor,
                                                                       budgets):
    # ranks built from the same layers' costs share what the solvers derive from them (caps,
    # chains, hulls, answers by budget): each answer, in any order of budgets, is the one a
    # problem of its own gets, and so is its relaxation bound
    import dataclasses
    from autopar.search import rank_dp
    shared = rank_problem(sigs, floor, 0.0)
    derived: dict = {}
    cm = object.__new__(CostModel)   # a key for the per-model memos, nothing else
    for budget in budgets:
        rc = dataclasses.replace(shared, limit_bytes=float(budget), derived=derived)
        alone = rank_problem(sigs, floor, budget)
        assert cuts._solve(cm, rc, modes) == rank_dp.solve(alone, modes)
        assert cuts.time_floor(rc, modes) == cuts.time_floor(alone, modes)


def _result(r):
    return (repr(r.best.config), r.best.step_time_s,
            [(repr(e.config), e.step_time_s, e.memory_per_gpu_bytes) for e in r.top],
            [(repr(e.config), e.step_time_s, e.memory_per_gpu_bytes) for e in r.pareto],
            r.evaluated, r.meshes)


@pytest.mark.parametrize("fraction", [0.9, 0.6])
def test_skipping_by_bounds_and_the_cp_sat_memo_change_no_answer(mixed, fraction, monkeypatch):
    """With memory binding on a model of mixed blocks: the search with the relaxation's skips
    in the stage-cut programme and the kept-gathered variants, and with the run's memo of
    CP-SAT answers, equals the search without any of them (every interval solved, every
    problem re-solved), and solves no more models."""
    cm0, peak = mixed
    cm = derated(cm0, 1 - fraction * peak / cm0.device.visible_memory_bytes)
    fast = optimize.search(CostModel(cm.graph, cm.cluster, cm.train))
    monkeypatch.setattr(cuts, "time_floor", lambda rc, modes: 0.0)
    monkeypatch.setattr(kept, "time_floor", lambda rc, modes: 0.0)
    monkeypatch.setattr(kept._RankByKept, "probe", lambda self, beyond: None)
    monkeypatch.setattr(cuts, "_solve_cp_sat",
                        lambda rc, modes, log: recompute.solve_rank(rc, modes, log=log))
    plain = optimize.search(CostModel(cm.graph, cm.cluster, cm.train))
    assert _result(fast) == _result(plain)
    assert fast.assignments <= plain.assignments


@pytest.mark.parametrize("name,cluster,batch", [("llama3-8b", "1x8xH100", 32),
                                                ("llama3-8b", "2x8xH100", 64)])
def test_kept_gathered_bounds_change_no_answer(name, cluster, batch, monkeypatch):
    """The kept-gathered search (ZeRO-3 under torchtitan's per-block reshard) with the rank's
    time bounded by the relaxation and by smaller solved amounts gives the plans, the front and
    the counted configurations of solving every amount that fits."""
    train = autopar.TrainingConfig(global_batch_size=batch, seq_len=8192)
    graph, _ = model_graph(name, train)
    spec = autopar.Cluster.from_spec(cluster)
    fast = optimize.search(CostModel(graph, spec, train))
    monkeypatch.setattr(kept, "time_floor", lambda rc, modes: 0.0)
    monkeypatch.setattr(kept._RankByKept, "probe", lambda self, beyond: None)
    monkeypatch.setattr(kept._RankByKept, "lower", lambda self, k: 0.0)
    plain = optimize.search(CostModel(graph, spec, train))
    assert _result(fast) == _result(plain)


def test_a_search_defers_cp_sat_to_the_plans_it_returns(mixed, monkeypatch):
    """Inside a search the enumeration answers the mixed, memory-bound ranks and CP-SAT solves
    only those of the returned plans, each distinct problem once, with no disagreement in
    time."""
    cm0, peak = mixed
    cm = derated(cm0, 1 - 0.5 * peak / cm0.device.visible_memory_bytes)
    logs = []

    def recording(self, *args, **kw):
        phases_init(self, *args, **kw)
        logs.append(self.log)

    phases_init = phases.Run.__init__
    monkeypatch.setattr(phases.Run, "__init__", recording)
    r = optimize.search(CostModel(cm.graph, cm.cluster, cm.train), fixed={"micro_batch_size": 4})
    log = logs[-1]
    assert log.defer and log.deferred and log.disagreements == 0
    returned = {e.config for e in (r.best, *r.top, *r.pareto)}
    wanted = {k for c in returned for k in log.used.get(c, ())}
    assert wanted and log.certified == len(wanted) == r.assignments
    # what was deferred is what CP-SAT takes outside a search: mixed blocks, memory binding
    assert all(cuts.uses_cp_sat(rc, modes) for rc, modes, _answer in log.deferred.values())
