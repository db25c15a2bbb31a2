"""ZeRO-3 blocks that keep their gathered parameters from forward to backward (FSDP2
``reshard_after_forward=False``): the fastest such variant of a fitting plan, searched exactly
under the cost model with bounds and a step-time screen that leave the search's best and top
plans unchanged (tests/test_issue24_speed.py). ``run`` is the search's
:class:`autopar.search.phases.Run` (its cost model, profile, bar, estimates and counts)."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math

from ..config import ParallelConfig
from ..cost.memory import kept_params_per_rank
from ..cost.pipeline.orders import SPLIT_BACKWARD
from ..cost.pipeline.schedule import pipeline_time
from ..cost.types import Estimate
from ..errors import InvalidParallelConfig
from .cuts import rank_fits, rank_recompute_bounded, time_floor
from .rankcost import rank_costs, slots
from .ranking import TIE_RTOL, better, kind_key


def dp_cost(e: Estimate) -> float:
    """Seconds the data-parallel collectives add to ``e``'s step: exposed, plus the slowdown
    of the compute they overlap, plus the copies around them (``time_breakdown`` components
    ``dp_comm_exposed``, ``overlap_slowdown`` and ``dp_copies``; the latter two 0 in
    estimates of older plan files)."""
    tb = e.time_breakdown
    return tb.dp_comm_exposed + tb.overlap_slowdown + tb.dp_copies


def keep_gathered(run, e0: Estimate, modes: tuple[str, ...], allowed) -> Estimate:
    """The fastest of ``e0`` (a fitting ZeRO-3 plan whose DP traffic is exposed) and its
    variants in which some blocks keep their gathered parameters from forward to backward
    (``reshard_after_forward`` False: one all-gather per micro-batch fewer, the block's full
    parameters resident), each with its ranks' fastest fitting recomputation.

    Exact under the cost model: the step's ZeRO-3 traffic is that of the rank with the most
    parameters (the first such), so keeping blocks elsewhere only costs memory; on that rank
    identical blocks are interchangeable, so every count of kept blocks per layer signature is
    tried, and the rank's recomputation re-solved under the memory left
    (:func:`autopar.search.cuts.rank_recompute`).
    """
    cm, c = run.cm, e0.config
    layout = cm.stage_layout(c)
    params = [st.params for st in layout]
    psi = max(params)
    r = params.index(psi)
    saving = _kept_saving(run, e0, c, psi)
    if e0.step_time_s - saving(psi) > run.threshold():
        return e0
    st = layout[r]
    layers = cm.graph.layers
    by_sig: dict[str, list[int]] = {}
    for li in st.layers:
        if layers[li].kind == "block":
            by_sig.setdefault(layers[li].signature, []).append(li)
    per_block = {sig: kept_params_per_rank(layers[idx[0]], c.tp, c.ep)
                 for sig, idx in by_sig.items()}
    position = {li: j for j, li in enumerate(cm.blocks)}
    best = e0
    # most parameters kept first: the variant that saves the most tends to come early, and
    # the bound then skips those that cannot beat it
    options = [counts for counts in itertools.product(
        *(range(len(idx) + 1) if per_block[sig] > 0 else range(1)
          for sig, idx in by_sig.items())) if any(counts)]
    options.sort(key=lambda counts: (-sum(n * per_block[s] for n, s in zip(counts, by_sig)),
                                     counts))
    timed: dict[tuple, float] = {}   # step seconds by the rank's recomputation
    pipe_floor = _pipe_floor(e0, r)
    rank = _RankByKept(run, c, st, allowed,
                       sorted({_kept_of(counts, per_block, by_sig) for counts in options}))
    # a few solves spread over the kept amounts first, so the bound below has points to use
    rank.probe(lambda bound: pipe_floor(bound, math.inf) > max(
        run.threshold(), e0.step_time_s * (1 + TIE_RTOL)))
    for counts in options:
        kept = _kept_of(counts, per_block, by_sig)
        saved = saving(kept)
        floor = e0.step_time_s - saved
        if floor > run.threshold():
            continue   # not the best, nor faster than the k-th kind
        if not rank.fits(kept):
            continue   # keeping this many does not fit (fewer may)
        # the rank's time only rises with what it keeps (less memory left): a solved smaller
        # amount bounds it, and the pipelined step without DP seconds bounds the variant's
        # step; over the loosest bar _may_matter could apply, it would rule the variant out
        bar = max(run.threshold(), max(best.step_time_s, e0.step_time_s) * (1 + TIE_RTOL))
        if max(floor, pipe_floor(rank.lower(kept), math.inf)) > bar:
            run.evaluated += 1   # as _may_matter counts a variant its floor rules out
            continue
        got = rank.solve(kept)
        if got is None:
            continue   # keeping this many does not fit (fewer may)
        floor = max(floor, pipe_floor(got[0], saved))
        per = list(modes)
        for li, mode in got[2].items():
            per[position[li]] = mode
        rc = per[0] if len(set(per)) == 1 else tuple(per)
        flags = [True] * len(cm.blocks)
        for n, idx in zip(counts, by_sig.values()):
            for li in idx[:n]:
                flags[position[li]] = False
        variant = c.replace(recompute=rc, reshard_after_forward=tuple(flags))
        # the step time falls as more is kept under the same recomputation (one gather fewer
        # per kept element, nothing else changes) and more is kept first: a timed variant of
        # the same recomputation bounds this one from below
        same = tuple(sorted(got[2].items()))
        matters, t = _may_matter(run, variant, max(floor, timed.get(same, 0.0)), best, e0)
        if t is not None:
            timed[same] = t
        if not matters:
            continue
        e = run.estimate(variant)
        if e is not None:   # its ranks: e0's, and this rank's new problem
            run.log.used[e.config] = run.log.used.get(e0.config, ()) + rank.keys[kept]
        if e is not None and e.fits and better(e, best):
            best = e
    return best


def _kept_of(counts: tuple, per_block: dict, by_sig: dict) -> float:
    """Parameter elements kept by ``counts`` (blocks per signature, ``by_sig`` order)."""
    return sum(n * per_block[sig] for n, sig in zip(counts, by_sig))


class _RankByKept:
    """The recomputation of :func:`keep_gathered`'s rank as a function of the parameter
    elements it keeps (the only thing the variants change on it: its weight bytes), solved
    once per amount, with what monotonicity gives for free.

    Keeping more leaves the rank less memory: the set of fitting recomputations only shrinks,
    so whether it fits falls from True to False once along the amounts (found by bisecting
    :func:`autopar.search.cuts.rank_fits`, no solve), and its fastest fitting time only
    rises, so a proven lower bound of a solved amount bounds every larger one
    (:meth:`lower`)."""

    def __init__(self, run, c: ParallelConfig, st, allowed, levels: list[float]):
        self.run, self.c, self.st, self.allowed = run, c, st, allowed
        self.levels = levels                  # every amount the options keep, rising
        self.answers: dict[float, tuple] = {}  # amount -> (answer, lower bound seconds)
        self.floors: dict[float, float] = {}   # amount -> its relaxation's bound
        self.keys: dict[float, tuple] = {}     # amount -> its deferred problem (certify)
        self.solved: list[float] = []         # amounts solved, rising
        self.bounds: list[float] = []         # running max of their bounds, same order
        lo, hi = 0, len(levels)
        while lo < hi:                        # the first amount that does not fit
            mid = (lo + hi) // 2
            if rank_fits(run.cm, c, self._layout(levels[mid]), allowed):
                lo = mid + 1
            else:
                hi = mid
        self.fitting = lo                     # levels[:lo] fit

    def _layout(self, kept: float):
        w, g, o = self.st.states
        return dataclasses.replace(self.st, states=(w + kept * self.run.cm.train.dtype_bytes,
                                                    g, o))

    def fits(self, kept: float) -> bool:
        return self.fitting > 0 and kept <= self.levels[self.fitting - 1]

    def solve(self, kept: float):
        """:func:`autopar.search.cuts.rank_recompute` of the rank keeping ``kept``."""
        hit = self.answers.get(kept)
        if hit is None:
            log = self.run.log
            outer, log.trail = log.trail, []
            hit = self.answers[kept] = rank_recompute_bounded(
                self.run.cm, self.c, self._layout(kept), self.allowed, log)
            self.keys[kept] = tuple(log.trail)
            log.trail = outer
            if hit[1] is not None:
                j = bisect.bisect_left(self.solved, kept)
                self.solved.insert(j, kept)
                self.bounds.insert(j, hit[1])
                for i in range(max(j, 1), len(self.bounds)):
                    self.bounds[i] = max(self.bounds[i], self.bounds[i - 1])
        return hit[0]

    def lower(self, kept: float) -> float:
        """A proven lower bound on the rank's seconds keeping ``kept``: the larger of the
        linear relaxation's (:func:`autopar.search.cuts.time_floor`) and the largest of the
        solved amounts up to it."""
        floor = self.floors.get(kept)
        if floor is None:
            modes = slots(self.allowed)
            floor = self.floors[kept] = time_floor(
                rank_costs(self.run.cm, self.c, self._layout(kept), modes), modes)
        j = bisect.bisect_right(self.solved, kept)
        return max(floor, self.bounds[j - 1]) if j else floor

    def probe(self, beyond) -> None:
        """Bisect the fitting amounts for the first whose bound satisfies ``beyond`` (a
        predicate rising with the rank's seconds), solving about log2(amounts) of them."""
        lo, hi = 0, self.fitting
        while lo < hi:
            mid = (lo + hi) // 2
            self.solve(self.levels[mid])
            if beyond(self.lower(self.levels[mid])):
                hi = mid
            else:
                lo = mid + 1


def _may_matter(run, v: ParallelConfig, floor: float, best: Estimate,
                e0: Estimate) -> tuple[bool, float | None]:
    """Whether the kept-gathered variant ``v`` of ``e0`` could change the search's best or
    top plans, judged by its step time alone (:meth:`CostModel.step_time_s`, about half an
    estimate), and that time (None when not needed); ``floor``: a lower bound on it. It could
    not when it is slower than ``best`` and ``e0`` (neither best, nor first of its kind if it
    is of ``best``'s kind) and, if of another kind, slower than the top-k bar. Such a variant
    is counted as evaluated but not kept, so the time-memory front
    (``SearchResult.pareto``) does not list it: it keeps more parameters than ``e0`` for a
    slower step."""
    bar = max(best.step_time_s, e0.step_time_s) * (1 + TIE_RTOL)
    if kind_key(v) != kind_key(best.config):
        bar = max(bar, run.threshold())
    if floor > bar:
        run.evaluated += 1
        return False, None
    try:
        t = run.cm.step_time_s(v)
    except InvalidParallelConfig:
        return True, None   # the estimate says why
    if t <= bar:
        return True, t
    run.evaluated += 1
    return False, t


def _pipe_floor(e0: Estimate, r: int):
    """A function of pipeline rank ``r``'s new micro-batch seconds (forward + backward, as
    :func:`autopar.search.cuts.rank_recompute` gives them) and an upper bound on the DP
    seconds the variant saves to a lower bound on the step of a variant of ``e0`` that
    changes only that rank.

    Where the schedule's step is the closed form of
    :func:`autopar.cost.pipeline.schedule.pipeline_time` (one rank, interleaved 1F1B): the
    pipelined step with the other ranks' times unchanged, plus the optimizer and fixed
    seconds, plus, while ``r`` stays off the slowest rank (whose micro-batch hides the ZeRO-3
    collectives and whose layers they gather: both unchanged), ``e0``'s DP seconds less the
    saving; when ``r`` is or becomes the slowest, its longer micro-batch may hide more, so
    only the pipelined step counts. Elsewhere (simulated or replayed orders) 0."""
    c = e0.config
    if not (c.pp == 1 or (c.schedule not in SPLIT_BACKWARD and (
            (c.virtual_stages or 1) > 1 or c.schedule == "interleaved-1f1b"))):
        return lambda rank_s, saving_s: 0.0
    tb = e0.time_breakdown
    rest = tb.optimizer + tb.fixed_step
    dp0 = dp_cost(e0)
    times = list(e0.stage_time_s)
    slowest = max(times)
    others = max((t for q, t in enumerate(times) if q != r), default=0.0)
    off_slowest = times.index(slowest) != r

    def floor(rank_s: float, saving_s: float) -> float:
        times[r] = rank_s
        t_pipe = pipeline_time(times, e0.num_micro_batches, c.virtual_stages or 1)[0]
        dp = max(0.0, dp0 - saving_s) if off_slowest and rank_s < others else 0.0
        # the same sums in another order: a rounding's margin below
        return (t_pipe + rest + dp) * (1 - 1e-9)
    return floor


def _kept_saving(run, e0: Estimate, c: ParallelConfig, psi: float):
    """A function of kept parameter elements ``k`` (on the rank with the most, ``psi``) to
    an upper bound on the seconds keeping them gathered can save from ``e0``'s step.

    Per micro-batch, keeping ``k`` skips ``k / psi`` of the ZeRO-3 re-gather pass
    (:meth:`autopar.cost.dp.DataParallel.zero3_collective_s`, as the framework issues it)
    and, with FSDP2's copies, their copy-out (read and write of ``k`` elements); exposure plus
    compute slowdown of a collective grows at most 1:1 with its seconds
    (:func:`autopar.cost.comm.overlapped_comm`), so the step shrinks by at most that, and
    never by more than the DP collectives cost in ``e0``. Recomputation the kept memory forces
    only adds time."""
    cm = run.cm
    wbytes = cm.train.dtype_bytes
    m = e0.num_micro_batches
    # the pass is issued over the slowest pipeline rank's layers, which the kept memory's
    # recomputation may change: the longest pass of any rank bounds it
    t_pass = max(cm.dp.zero3_collective_s(c, rank, wbytes, "all_gather")
                 for rank in range(c.pp))
    copy = 2 * wbytes / cm.hbm_Bps if run.profile.fsdp2_copies else 0.0
    cap = dp_cost(e0)

    def saving(k: float) -> float:
        frac = k / psi if psi > 0 else 0.0
        return min(cap, m * (frac * t_pass + k * copy))
    return saving
