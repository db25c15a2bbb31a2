"""Per-block recomputation of one pipeline rank as an OR-Tools CP-SAT model.

:func:`autopar.search.cuts.rank_recompute` calls it for every rank whose blocks are of more
than one kind (MoE blocks beside dense ones, leading dense layers, blocks that differ in cost)
and whose blocks do not all fit in their fastest modes; a search defers those to the plans it
returns (:func:`certify`: the enumeration answers while it searches; issue 26, item 5); ranks
of one kind of block, and ranks where memory does not bind, are solved by the enumeration of
:mod:`autopar.search.rank_dp` (O(blocks) for one kind: far faster than building and solving a
model, which the speed targets need). Both give the same optimum (tests/test_issue24_search.py).

The model (:class:`autopar.search.rankcost.RankCosts`: identical blocks are interchangeable, so
one integer per (signature, mode) counts the blocks in that mode):

- ``sum_m n[s, m] = blocks[s]``; ``u[s, m] = (n[s, m] > 0)`` where mode m's transient is above
  the non-block layers' (``floor``);
  ``cap = max(floor, max over used (s, m) of transient[s, m])``;
- memory: ``sum n[s, m] * act[s, m] + cap <= limit - fixed bytes``;
- objective, lexicographic as the enumeration's: least time ``sum n[s, m] * time[s, m]``
  (solve 1), then among the assignments of that time the least memory, then the fewest blocks
  in the strongest modes, signature by signature (solve 2 enumerates them; a third solve
  minimises memory first when they are many).

Integer scaling: seconds in picoseconds (rounded), bytes rounded down per term and the budget
up (the integer model is a relaxation), and the chosen assignment is checked against the float
budget; the rare pick that fails it (within a few bytes of the GPU's memory) is settled by the
enumeration (:attr:`SolveLog.fallbacks` counts them). Deterministic: one worker, a fixed seed,
and a deterministic work limit (:data:`LIMIT`), not wall time; when the limit ends solve 1
early, its best assignment is returned with the proven bound and gap (:class:`RankAssignment`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from ..config import ParallelConfig
from ..cost.model import CostModel
from . import rank_dp
from .rankcost import STRENGTH, RankCosts, rank_costs, slots

#: Seconds per time unit of the integer model: picoseconds (block times are >= microseconds,
#: so rounding never reorders assignments a float comparison tells apart).
TIME_UNIT_S = 1e-12
#: CP-SAT's deterministic work limit per solve (its ``max_deterministic_time``, in its own
#: deterministic seconds): far above what the search's rank models need (about 1e-3).
LIMIT = 10.0
#: Largest number of equally fast assignments solve 2 enumerates before it minimises memory
#: with a solve of its own.
MAX_TIES = 64
MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class RankAssignment:
    """A rank's per-block recomputation found by CP-SAT.

    Attributes:
        time_s: the blocks' forward + backward seconds per micro-batch.
        peak_bytes: the blocks' activations (x in-flight) plus the rank's largest transient.
        by_mode: per signature (:attr:`RankCosts.by_sig` order), blocks per mode.
        optimal: whether CP-SAT proved it optimal within :data:`LIMIT`.
        bound_s: the least block time CP-SAT proved possible (``time_s`` when optimal).
        gap: ``(time_s - bound_s) / time_s``: 0 when optimal.
    """

    time_s: float
    peak_bytes: float
    by_mode: tuple[dict, ...]
    optimal: bool
    bound_s: float
    gap: float


class SolveLog:
    """What one search's CP-SAT rank models did (owned by its run, surfaced in
    :class:`autopar.search.optimize.SearchResult`): models solved, assignments the float
    budget check sent to the enumeration, and the largest gap of an assignment used.

    It also holds the run's answers by rank problem (:attr:`answers`, filled by
    :func:`autopar.search.cuts.rank_recompute`): a model is solved once per distinct problem
    in a run, however many ranks, stage intervals, configurations or kept-gathered variants
    pose it (the answer is per-signature counts, no layer indices; CP-SAT is deterministic
    here, so a repeated solve would return the same)."""

    def __init__(self, defer: bool = False) -> None:
        self.solves = 0
        self.fallbacks = 0
        self.gap = 0.0
        self.answers: dict = {}
        # a search's log (defer): the enumeration answers the mixed, memory-bound ranks while
        # the search runs, and CP-SAT solves those of the plans it returns (certify)
        self.defer = defer
        self.deferred: dict = {}     # problem key -> (RankCosts, modes, enumeration's answer)
        self.trail: list | None = None   # keys deferred since the caller started a trail
        self.used: dict = {}         # configuration estimated -> keys of its deferred ranks
        self.certified = 0           # deferred problems CP-SAT has solved
        self.disagreements = 0       # ... whose time differed from the enumeration's
        self.tie_picks = 0           # ... of its time, with another peak (a tie told apart)

    def record(self, got: RankAssignment | None) -> None:
        self.solves += 1
        if got is not None:
            self.gap = max(self.gap, got.gap)


def _solver(time_limit: float, workers: int) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = float(time_limit)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    return solver


def _float_value(rc: RankCosts, counts: list[dict]) -> tuple[float, float, bool]:
    """(seconds, bytes at the peak, within the float budget) of per-signature ``counts``."""
    time = acts = 0.0
    cap = rc.floor_bytes
    for (_k, t, a, tr), n in zip(rc.sigs, counts):
        for m, cnt in n.items():
            if cnt:
                time += cnt * t[m]
                acts += cnt * a[m]
                cap = max(cap, tr[m])
    return time, acts + cap, acts <= rc.budget_bytes - cap


def _least_memory(rc: RankCosts, modes: tuple[str, ...]) -> list[dict] | None:
    """An assignment within the float budget, or None: per transient cap, each block in its
    least-memory mode under it (the feasibility answer of :func:`autopar.search.cuts.rank_fits`);
    the hint and the fallback of a solve the work limit ends without a solution."""
    for cap in rc.caps():
        counts = []
        for k, _t, a, tr in rc.sigs:
            options = [m for m in modes if tr[m] <= cap]
            if not options:
                break
            counts.append({min(options, key=lambda m: (a[m], -STRENGTH[m])): k})
        else:
            if _float_value(rc, counts)[2]:
                return counts
    return None


def certify(log: SolveLog, configs) -> None:
    """CP-SAT on every mixed, memory-bound rank problem that the plans ``configs`` (estimated
    by a deferring search, :attr:`SolveLog.used`) took from the enumeration: each distinct
    problem solved once, counted in ``log``; where a proven-optimal CP-SAT answer differs
    from the enumeration's in time beyond 1e-9 (relative), a RuntimeWarning and
    :attr:`SolveLog.disagreements` (both solvers are exact: a difference is a bug). Equal
    times with another peak are counted in :attr:`SolveLog.tie_picks`: a tie in time within
    float rounding that the enumeration (float sums) and CP-SAT (integer picoseconds) break
    differently; the plan keeps the enumeration's."""
    import warnings

    keys = []
    for c in configs:
        for key in log.used.get(c, ()):
            if key not in keys:
                keys.append(key)
    for key in keys:
        if key in log.answers:
            continue
        rc, modes, (time_s, peak, _by_mode) = log.deferred[key]
        got = log.answers[key] = solve_rank(rc, modes, log=log)
        log.certified += 1
        if got is not None and not got.optimal:
            continue   # the work limit ended it: its gap is reported, nothing to compare
        if got is not None and math.isclose(got.time_s, time_s, rel_tol=1e-9):
            if not math.isclose(got.peak_bytes, peak, rel_tol=1e-9):
                # equally fast assignments told apart differently: the enumeration compares
                # float sums (their last bits follow the order of addition), CP-SAT integer
                # picoseconds, so a tie to the last bit may go to another memory
                log.tie_picks += 1
            continue
        log.disagreements += 1
        warnings.warn(f"CP-SAT and the enumeration disagree on a rank's recomputation: "
                      f"{None if got is None else (got.time_s, got.peak_bytes)} against "
                      f"{(time_s, peak)} (seconds, bytes); please report it",
                      RuntimeWarning, stacklevel=2)


def solve_rank(rc: RankCosts, modes: tuple[str, ...], *, time_limit: float = LIMIT,
               workers: int = 1, log: SolveLog | None = None) -> RankAssignment | None:
    """The fastest fitting per-block recomputation of the rank ``rc`` by CP-SAT (module
    docstring): ties in time to less memory, then to fewer blocks in the strongest modes.

    Args:
        rc: the rank's problem (:func:`autopar.search.rankcost.rank_costs`); its
            ``step_fits`` is the caller's to check.
        modes: the modes a block may take, weakest first.
        time_limit: CP-SAT's deterministic work limit per solve.
        workers: CP-SAT search workers (1: deterministic).
        log: where the solve is counted (a search's :class:`SolveLog`).

    Returns:
        The assignment, or None when nothing fits. Raises nothing of its own.
    """
    got = _solve(rc, modes, time_limit, workers)
    if got is _UNSETTLED:
        # the integer optimum is over the float budget by rounding: the enumeration settles it
        exact = rank_dp.solve(rc, modes)
        got = None if exact is None else RankAssignment(exact[0], exact[1], exact[2], True,
                                                        exact[0], 0.0)
        if log is not None:
            log.fallbacks += 1
    if log is not None:
        log.record(got)
    return got


#: What :func:`_solve` returns when its optimum fails the float budget check.
_UNSETTLED = object()


def _solve(rc: RankCosts, modes: tuple[str, ...], time_limit: float, workers: int):
    """:func:`solve_rank`'s model and solves; :data:`_UNSETTLED` when the integer optimum is
    not within the float budget."""
    model = cp_model.CpModel()
    floor_int = math.floor(rc.floor_bytes)
    big = max([floor_int] + [math.floor(tr[m]) for _k, _t, _a, tr in rc.sigs for m in modes])
    cap = model.NewIntVar(floor_int, big, "cap")
    n, time_terms, mem_terms, tops = [], [], [], [floor_int]
    for s, (k, t, a, tr) in enumerate(rc.sigs):
        ns = {m: model.NewIntVar(0, k, f"n{s}{m}") for m in modes}
        model.Add(sum(ns.values()) == k)
        for m in modes:
            if math.floor(tr[m]) > floor_int:   # raises the cap: used[s, m] = (n[s, m] > 0)
                used = model.NewBoolVar(f"u{s}{m}")
                model.Add(ns[m] >= used)
                model.Add(ns[m] <= k * used)
                tops.append(math.floor(tr[m]) * used)
            time_terms.append(round(t[m] / TIME_UNIT_S) * ns[m])
            mem_terms.append(math.floor(a[m]) * ns[m])
        n.append(ns)
    model.AddMaxEquality(cap, tops)
    memory = sum(mem_terms) + cap
    model.Add(memory <= math.ceil(rc.budget_bytes))
    time = sum(time_terms)
    hint = _least_memory(rc, modes)
    if hint is not None:
        for ns, h in zip(n, hint):
            for m in modes:
                model.AddHint(ns[m], h.get(m, 0))
    model.Minimize(time)
    solver = _solver(time_limit, workers)
    status = solver.Solve(model)
    if status == cp_model.INFEASIBLE or (status == cp_model.UNKNOWN and hint is None):
        return None
    unit = TIME_UNIT_S
    if status != cp_model.OPTIMAL:
        # the work limit ended it: the best assignment found (or the hint) with its gap
        options = [hint] if hint is not None else []
        if status == cp_model.FEASIBLE and _float_value(rc, _values(solver, n))[2]:
            options.append(_values(solver, n))
        if not options:
            return _UNSETTLED
        counts = min(options, key=lambda cnt: _float_value(rc, cnt)[0])
        got_s, peak, _fits = _float_value(rc, counts)
        # every block in its fastest mode is a bound too (before CP-SAT has proved one)
        fastest = sum(k * min(t[m] for m in modes) for k, t, _a, _tr in rc.sigs)
        proved = solver.BestObjectiveBound() * unit if status == cp_model.FEASIBLE else 0.0
        bound_s = min(got_s, max(fastest, proved))
        return RankAssignment(got_s, peak, tuple(counts), False, bound_s,
                              (got_s - bound_s) / got_s if got_s > 0 else 0.0)
    best_time = round(solver.ObjectiveValue())
    model.ClearObjective()
    model.ClearHints()
    model.Add(time == best_time)
    counts = _tied(model, n, rc, modes, memory, time_limit, workers)
    if counts is None:
        return _UNSETTLED
    got_s, peak, _fits = _float_value(rc, counts)
    return RankAssignment(got_s, peak, tuple(counts), True, got_s, 0.0)


def _values(solver: cp_model.CpSolver, n: list[dict]) -> list[dict]:
    return [{m: solver.Value(v) for m, v in ns.items()} for ns in n]


def _order_key(rc: RankCosts, modes: tuple[str, ...], counts: list[dict]) -> tuple:
    """(bytes at the peak, blocks per mode strongest first, signature by signature)."""
    strong = tuple(reversed(modes))
    return (_float_value(rc, counts)[1],
            tuple(tuple(n.get(m, 0) for m in strong) for n in counts))


def _tied(model, n, rc: RankCosts, modes, memory, time_limit: float,
          workers: int) -> list[dict] | None:
    """Of the assignments of the least time (constrained in ``model``), the one within the
    float budget of least memory, then fewest blocks in the strongest modes; None when none is
    within the float budget."""
    found: list[list[dict]] = []

    class Collect(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            found.append([{m: self.Value(v) for m, v in ns.items()} for ns in n])
            if len(found) > MAX_TIES:
                self.StopSearch()

    solver = _solver(time_limit, workers)
    solver.parameters.enumerate_all_solutions = True
    status = solver.Solve(model, Collect())
    if len(found) > MAX_TIES or status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # many ties: the least memory by a solve of its own, then enumerate those
        model.Minimize(memory)
        solver = _solver(time_limit, workers)
        if solver.Solve(model) != cp_model.OPTIMAL:
            return None
        model.ClearObjective()
        model.Add(memory == round(solver.ObjectiveValue()))
        found.clear()
        solver = _solver(time_limit, workers)
        solver.parameters.enumerate_all_solutions = True
        solver.Solve(model, Collect())
    fits = [c for c in found if _float_value(rc, c)[2]]
    return min(fits, key=lambda c: _order_key(rc, modes, c)) if fits else None


def solve_recompute(cm: CostModel, c: ParallelConfig, *, time_limit_s: float = LIMIT,
                    workers: int = 1, modes: tuple[str, ...] = MODES) -> tuple[str, ...] | None:
    """Per-block recompute modes for the resolved config ``c`` with every pipeline rank solved
    by the CP-SAT model (:func:`solve_rank`) whatever its blocks; None if some rank cannot fit.

    Args:
        cm: the cost model (supplies per-block costs and per-rank layouts).
        c: a resolved configuration (its own ``recompute`` field is ignored).
        time_limit_s: CP-SAT's deterministic work limit per solve.
        workers: CP-SAT search workers; 1 keeps the search deterministic.
        modes: the modes blocks may take (any of :data:`autopar.config.RECOMPUTE_MODES`).

    Returns:
        One mode per decoder block in model order, or None when no choice fits.
    """
    allowed = slots(modes)
    chosen: dict[int, str] = {}
    for st in cm.stage_layout(c):
        rc = rank_costs(cm, c, st, allowed)
        if not rc.step_fits:
            return None
        if not rc.by_sig:
            if rc.fixed_bytes + rc.floor_bytes > rc.limit_bytes:
                return None
            continue
        got = solve_rank(rc, allowed, time_limit=time_limit_s, workers=workers)
        if got is None:
            return None
        chosen.update(rc.modes_of(got.by_mode))
    return tuple(chosen[li] for li in cm.blocks)
