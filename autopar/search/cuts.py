"""Per-rank recomputation (which solver answers) and stage cuts by dynamic programming.

Per-rank recomputation (:func:`rank_recompute`). A pipeline rank's blocks each take one of the
recompute modes the target framework runs (a subset of :data:`autopar.config.RECOMPUTE_MODES`:
none, Korthikanti's selective, torchtitan's op-level selective-op, full; every one of them a
choice of its own), to be fastest within the rank's memory (the problem:
:mod:`autopar.search.rankcost`). Two exact solvers answer it:

- the CP-SAT model of :mod:`autopar.search.recompute`, for every rank whose blocks are of more
  than one kind (MoE beside dense blocks, leading dense layers, blocks of other costs) and do
  not all fit in their fastest modes: the per-block choice the design gives OR-Tools. Inside a
  search (its :class:`SolveLog` defers) those ranks are answered by the enumeration while the
  search runs and CP-SAT solves the ones of the plans it returns, warning where their times
  differ (:func:`autopar.search.recompute.certify`): Llama 4 Maverick's search posed 3,266
  distinct such models at about 6 ms each (issue 26, item 5: 19 s of its 20 s), the
  enumeration answers all of them within its 4 s search, and both are exact;
- the enumeration of :mod:`autopar.search.rank_dp` for the rest: ranks of one kind of block
  (a closed form in O(blocks); the speed problems' homogeneous models solve thousands of
  memory-bound ranks, where a model per rank would cost a second or more each search) and ranks
  whose blocks all fit in their fastest modes (nothing to choose).

Stage cuts (:func:`dp_cut`), for one chunk per rank (1F1B, GPipe): with f(i, a, b) the fastest
fitting time of rank i holding blocks a..b-1 (infinite when nothing fits), a first dynamic
programme finds the least possible slowest stage ``M = min over cuts of max_i f(i, .)`` and a
second the cut of least total time among those whose every stage is within M: the step time
``T >= m * max_i t_i`` is paced by the slowest stage, and the rest fills the warm-up and
cool-down (Narayanan et al. 2021, section 2.2). The cut is exact for that pair of objectives,
memory included, for any mix of layer kinds (each f by the solver above); ranks whose intervals
hold the same layers in the same position share one evaluation. This is our own algorithm (the
classic linear-partition DP with a per-interval memory check), kept over a model: its
intervals' f are the work, and a model would need every one of them too.
"""

from __future__ import annotations

import bisect
import math
import weakref
from operator import itemgetter

from ..config import ParallelConfig
from ..cost.model import CostModel, StageLayout
from . import rank_dp, recompute
from .rankcost import MODES, STRENGTH, RankCosts, costs_key, rank_costs, slots
from .recompute import SolveLog

__all__ = ["MODES", "FIT_RTOL", "rank_recompute", "rank_recompute_bounded", "rank_fits",
           "dp_cut", "some_cut_fits", "uses_cp_sat"]


def uses_cp_sat(rc: RankCosts, modes: tuple[str, ...]) -> bool:
    """Whether :func:`rank_recompute` gives the rank ``rc`` to the CP-SAT model: its blocks are
    of more than one kind and, each in its fastest mode (of equal times the least memory, then
    the weakest), they overflow the rank's budget."""
    if len(rc.sigs) < 2:
        return False
    acts, cap = 0.0, rc.floor_bytes
    for k, t, a, tr in rc.sigs:
        m = min(modes, key=lambda x: (t[x], a[x], STRENGTH[x]))
        acts += k * a[m]
        cap = max(cap, tr[m])
    return acts > rc.budget_bytes - cap


def rank_recompute(cm: CostModel, c: ParallelConfig, st: StageLayout,
                   allowed: tuple[str, ...] = MODES, log: SolveLog | None = None
                   ) -> tuple[float, float, dict[int, str]] | None:
    """The fastest fitting recomputation of one pipeline rank, exactly.

    Args:
        cm: the cost model.
        c: a resolved configuration (its ``recompute`` is ignored).
        st: the rank's layout (:meth:`CostModel.stage_layout` or :meth:`CostModel.interval_layout`).
        allowed: the modes a block may take: any non-empty subset of
            :data:`autopar.config.RECOMPUTE_MODES` (the target framework's, see
            :func:`autopar.search.space.recompute_modes`); each is a choice of its own.
        log: where CP-SAT solves are counted (the search run's).

    Returns:
        (rank time per micro-batch in seconds, peak memory in bytes, mode by graph layer index
        of each of its decoder blocks), or None when no choice fits the GPU's memory. Ties in
        time go to less memory, then to fewer blocks in the strongest modes. Solved by CP-SAT
        where :func:`uses_cp_sat` says so, else by :func:`autopar.search.rank_dp.solve`.
    """
    return rank_recompute_bounded(cm, c, st, allowed, log)[0]


def rank_recompute_bounded(cm: CostModel, c: ParallelConfig, st: StageLayout,
                           allowed: tuple[str, ...] = MODES, log: SolveLog | None = None,
                           rc: RankCosts | None = None):
    """(:func:`rank_recompute`'s answer, a proven lower bound in seconds on the rank's fastest
    fitting time): the answer's own time where it is proven optimal (the enumeration, or
    CP-SAT within its work limit), else CP-SAT's proven bound; None with the answer None.
    ``rc``: ``rank_costs(cm, c, st, slots(allowed))`` where the caller already has it."""
    modes = slots(allowed)
    rc = rank_costs(cm, c, st, modes) if rc is None else rc
    if not rc.step_fits:
        return None, None
    if not rc.by_sig:
        if rc.fixed_bytes + rc.floor_bytes <= rc.limit_bytes:
            return (rc.fixed_s, rc.fixed_bytes + rc.floor_bytes, {}), rc.fixed_s
        return None, None
    if uses_cp_sat(rc, modes) and log is not None and log.defer:
        # a search: the enumeration now, CP-SAT on the ranks of the plans it returns
        # (autopar.search.recompute.certify); both are exact
        got = _solve(cm, rc, modes)
        if got is None:
            return None, None
        key = _problem_key(rc, modes)
        log.deferred.setdefault(key, (rc, modes, got))
        if log.trail is not None:
            log.trail.append(key)
        time, peak, by_mode = got
        bound = time
    elif uses_cp_sat(rc, modes):
        if _least_fits(rc, modes) is False:
            return None, None   # not even the least memory fits: no model to solve
        got = _solve_cp_sat(rc, modes, log)
        if got is None:
            return None, None
        time, peak, by_mode, bound = got.time_s, got.peak_bytes, got.by_mode, got.bound_s
    else:
        got = _solve(cm, rc, modes)
        if got is None:
            return None, None
        time, peak, by_mode = got
        bound = time
    return (rc.fixed_s + time, rc.fixed_bytes + peak, rc.modes_of(by_mode)), rc.fixed_s + bound


#: Per cost model: :func:`autopar.search.rank_dp.solve`'s answers by everything it reads of a
#: rank's problem (its modes, memory limit, fixed and floor bytes, and per signature the block
#: count and the seconds, activation and transient bytes of each mode).
_SOLVED: "weakref.WeakKeyDictionary[CostModel, dict]" = weakref.WeakKeyDictionary()
#: Per cost model: the signatures' (memory, time) frontiers the enumeration builds
#: (:func:`autopar.search.rank_dp.sig_frontier`), shared by the rank problems of a search.
_FRONTIERS: "weakref.WeakKeyDictionary[CostModel, dict]" = weakref.WeakKeyDictionary()


def _solve(cm: CostModel, rc: RankCosts, modes: tuple[str, ...]):
    """:func:`autopar.search.rank_dp.solve` of ``rc``, shared by ranks whose problems are
    equal value for value (ranks and configurations that differ in the layers' indices only,
    or in fields the problem does not read); its answer names no layer (counts per
    signature), so it serves each of them."""
    memo = _SOLVED.get(cm)
    if memo is None:
        memo = _SOLVED[cm] = {}
    key = _problem_key(rc, modes)
    if key in memo:
        return memo[key]
    # The answer reads the budget B = limit - fixed bytes only (with the layers' costs), and
    # is the least (time, peak, strong counts) over the choices whose peak is within B, a set
    # that grows with B. So an answer found under a larger budget B2 whose peak is within B is
    # B's answer too (it is in B's set, which is inside B2's), and nothing fitting under B2
    # means nothing under B. The least solved B2 >= B has the least peak of those answers;
    # the margin keeps choices at the edge of B (sums rounded another way) to the solver.
    budget = rc.limit_bytes - rc.fixed_bytes
    solved = rc.derived.setdefault(("answers", modes), [])
    i = bisect.bisect_left(solved, budget, key=itemgetter(0))
    if i < len(solved):
        got = solved[i][1]
        if got is None or got[1] <= budget - FIT_RTOL * rc.limit_bytes:
            memo[key] = got
            return got
    frontiers = _FRONTIERS.get(cm)
    if frontiers is None:
        frontiers = _FRONTIERS[cm] = {}
    got = memo[key] = rank_dp.solve(rc, modes, frontiers)
    solved.insert(i, (budget, got))
    return got


def _problem_key(rc: RankCosts, modes: tuple[str, ...]) -> tuple:
    """Everything both rank solvers read of ``rc`` under ``modes``: the modes, the memory
    limit, the fixed and floor bytes, and per signature the block count and the seconds,
    activation and transient bytes of each mode (not the layers' indices)."""
    sigs = rc.derived.get("key")
    if sigs is None:   # the layers' part, the same for every rank built from them
        sigs = rc.derived["key"] = costs_key(rc.sigs)
    return (modes, rc.limit_bytes, rc.fixed_bytes, rc.floor_bytes, sigs)


def _solve_cp_sat(rc: RankCosts, modes: tuple[str, ...], log: SolveLog | None):
    """:func:`autopar.search.recompute.solve_rank` of ``rc``, once per distinct problem in a
    run (:attr:`SolveLog.answers` of ``log``; without a log, every call solves). A repeated
    problem counts no solve, but its assignment's gap is still the run's to report."""
    if log is None:
        return recompute.solve_rank(rc, modes)
    key = _problem_key(rc, modes)
    if key in log.answers:
        got = log.answers[key]
        if got is not None:
            log.gap = max(log.gap, got.gap)
        return got
    got = log.answers[key] = recompute.solve_rank(rc, modes, log=log)
    return got


def time_floor(rc: RankCosts, modes: tuple[str, ...]) -> float:
    """A lower bound (seconds) on :func:`rank_recompute`'s time for the rank ``rc`` (inf when
    no choice fits): the linear relaxation of its problem, solved greedily.

    For each value of the rank's largest transient (:meth:`RankCosts.caps`: the answer's own
    is one of them), every block may take a fraction of each mode whose transient is within it,
    under the activation budget left. From every block in its fastest mode, memory is bought
    along each signature's lower convex hull of (bytes, seconds) at the least seconds per byte
    first (the fractional knapsack's optimum); an integer choice is one of the relaxation's
    points, so the least over the caps is at most the exact answer. A relative margin of 1e-9
    covers the sums' rounding. No solve: each cap's hulls are built once per layers' costs
    (:func:`_relaxation`, kept in ``rc.derived``), and a budget fills them."""
    if not rc.step_fits:
        return math.inf
    if not rc.by_sig:
        return rc.fixed_s if rc.fixed_bytes + rc.floor_bytes <= rc.limit_bytes else math.inf
    best = math.inf
    for cap in rc.caps():
        budget = rc.limit_bytes - rc.fixed_bytes - cap
        if budget < 0:
            break   # caps rise: every later budget is smaller
        key = ("hull", modes, cap)
        if key in rc.derived:
            hull = rc.derived[key]
        else:
            hull = rc.derived[key] = _relaxation(rc, modes, cap)
        if hull is None:
            continue   # some signature has no mode within the cap
        time, mem, segments = hull
        need = mem - budget
        if need > 0:
            for rate, room in segments:
                take = min(need, room)
                time += rate * take
                need -= take
                if need <= 0:
                    break
            if need > 1e-9 * rc.limit_bytes:
                continue   # not even fractions fit under this cap
        best = min(best, time)
    return (rc.fixed_s + best) * (1 - 1e-9) if math.isfinite(best) else math.inf


def _relaxation(rc: RankCosts, modes: tuple[str, ...], cap: float):
    """:func:`time_floor`'s data under one transient ``cap``, which reads the rank's layers'
    costs only (not its budget): (seconds and bytes with every block in its fastest mode,
    the lower hulls' segments as (seconds per byte saved, bytes it can save), cheapest
    first), or None when some signature has no mode within the cap."""
    time = mem = 0.0
    segments = []
    for k, t, a, tr in rc.sigs:
        ch = rank_dp.chain([m for m in modes if tr[m] <= cap], t, a)
        if not ch:
            return None
        hull = [(a[ch[0]], t[ch[0]])]   # fastest first: bytes fall, seconds rise
        for m in ch[1:]:
            p = (a[m], t[m])
            while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (hull[-2][0] - p[0]) \
                    >= (p[1] - hull[-2][1]) * (hull[-2][0] - hull[-1][0]):
                hull.pop()   # above the chord from hull[-2] to p: not on the lower hull
            hull.append(p)
        time += k * hull[0][1]
        mem += k * hull[0][0]
        for (a0, t0), (a1, t1) in zip(hull, hull[1:]):
            segments.append(((t1 - t0) / (a0 - a1), k * (a0 - a1)))
    segments.sort()
    return time, mem, tuple(segments)


#: Relative margin around a rank's budget inside which :func:`rank_fits` defers to
#: :func:`rank_recompute` (its sums add the same terms in other orders: rounding differs by a
#: few ulps, far below this).
FIT_RTOL = 1e-9


def rank_fits(cm: CostModel, c: ParallelConfig, st: StageLayout,
              allowed: tuple[str, ...] = MODES, rc: RankCosts | None = None) -> bool:
    """Whether :func:`rank_recompute` finds a fitting recomputation for this rank (the same
    answer, without searching for the fastest one).

    Some choice fits exactly when the optimizer step's temporaries fit beside the states and,
    for some transient cap (the largest transient of the rank's layers, one of a few values),
    every block takes its least-memory mode among those whose transient is within the cap and
    the total is within the budget: activation memory is a sum over blocks, so the least total
    is the sum of the least per block. Totals within :data:`FIT_RTOL` of a budget are settled
    by :func:`rank_recompute` itself. ``rc``: ``rank_costs(cm, c, st, slots(allowed))`` where
    the caller already has it.
    """
    modes = slots(allowed)
    rc = rank_costs(cm, c, st, modes) if rc is None else rc
    if not rc.step_fits:
        return False
    if not rc.by_sig:
        return rc.fixed_bytes + rc.floor_bytes <= rc.limit_bytes
    got = _least_fits(rc, modes)
    if got is None:
        return rank_recompute_bounded(cm, c, st, allowed, None, rc)[0] is not None
    return got


def _least_fits(rc: RankCosts, modes: tuple[str, ...]) -> bool | None:
    """:func:`rank_fits` for a rank with blocks whose optimizer step fits: True or False, or
    None when the least total is within :data:`FIT_RTOL` of the budget (the answer is then
    the solver's)."""
    limit = rc.limit_bytes
    for cap in rc.caps():
        budget = limit - rc.fixed_bytes - cap
        if budget < 0:
            return False
        least = 0.0
        for k, _t, a, tr in rc.sigs:
            options = [a[m] for m in modes if tr[m] <= cap]
            if not options:
                break
            least += k * min(options)
        else:
            if least <= budget - FIT_RTOL * limit:
                return True
            if least <= budget + FIT_RTOL * limit:
                return None
    return False


def dp_cut(cm: CostModel, c: ParallelConfig, allowed: tuple[str, ...] = MODES,
           memo: dict | None = None, log: SolveLog | None = None) -> tuple[int, ...] | None:
    """Blocks per pipeline stage of the resolved, non-interleaved config ``c`` (its own
    ``stage_blocks`` ignored) minimising the slowest stage under every stage's memory, then the
    total stage time; every stage holds at least one block.

    Args:
        cm: the cost model.
        c: a resolved configuration with ``virtual_stages == 1``.
        allowed: recompute modes a block may take.
        memo: a dict reused across calls on the same model (keys include the configuration).
        log: where CP-SAT solves are counted (the search run's).

    Returns:
        One block count per stage (``c.pp`` entries summing to the model's blocks), or None when
        no cut fits in memory, the model has fewer blocks than stages, or ``c`` is interleaved.
    """
    n, p = len(cm.blocks), c.pp
    if (c.virtual_stages or 1) != 1 or n < p or p < 1:
        return None
    memo = {} if memo is None else memo
    ckey = (c.tp, c.pp, c.cp, c.dp, c.micro_batch_size, c.sequence_parallel, c.zero_stage,
            c.schedule, c.placement, c.ep, c.cp_mode, allowed)
    # one small int per configuration key in this memo: a key hashes three ints, not ckey
    ids = memo.setdefault("configuration ids", {})
    ckey = ids.setdefault(ckey, len(ids))
    cls = _interval_classes(cm)

    local: dict[tuple[int, int, int], float] = {}   # this call's f by (i, a, b)
    low: dict[tuple[int, int, int], float] = {}     # this call's floors of f by (i, a, b)
    # this call's (layout, rank costs) by (i, a, b), from a floor for the f of the same
    # interval (each computed once: both are pure functions of (c, i, a, b))
    priced: dict[tuple[int, int, int], tuple] = {}
    modes = slots(allowed)

    def key_of(i: int, a: int, b: int) -> tuple:
        return (ckey, i, cls[a][b])

    def floor(i: int, a: int, b: int) -> float:
        """f(i, a, b) where known, else a lower bound on it (:func:`time_floor`): enough to
        skip an interval that could not improve the programme's value."""
        hit = low.get((i, a, b))   # exact values too (f writes them there)
        if hit is None:
            key = key_of(i, a, b)
            hit = memo.get(key)
            if hit is None:
                fkey = ("floor",) + key
                hit = memo.get(fkey)
                if hit is None:
                    st = cm.interval_layout(c, i, a, b)
                    rc = rank_costs(cm, c, st, modes)
                    priced[(i, a, b)] = (st, rc)
                    hit = memo[fkey] = time_floor(rc, modes)
            low[(i, a, b)] = hit
        return hit

    def f(i: int, a: int, b: int) -> float:
        hit = local.get((i, a, b))
        if hit is not None:
            return hit
        key = key_of(i, a, b)
        hit = memo.get(key)
        if hit is None:
            st, rc = priced.pop((i, a, b), (None, None))
            if st is None:
                st = cm.interval_layout(c, i, a, b)
                rc = rank_costs(cm, c, st, modes)
            # rank_fits answers "nothing fits" without searching for the fastest mix
            got = rank_recompute_bounded(cm, c, st, allowed, log, rc)[0] \
                if rank_fits(cm, c, st, allowed, rc) else None
            hit = memo[key] = math.inf if got is None else got[0]
        # the exact value is also the best floor: the loops below read floors from ``low``
        local[(i, a, b)] = low[(i, a, b)] = hit
        return hit

    inf = math.inf
    # best[i][b]: least slowest stage over cuts of blocks 0..b-1 into ranks 0..i
    best = [[inf] * (n + 1) for _ in range(p)]
    for b in range(1, n - p + 2):
        best[0][b] = f(0, 0, b) if p > 1 or b == n else inf
    # stages near the balanced length n / p first: a low best[i][b] early prunes the rest (a
    # min of maxima: the order of a changes which f are priced, not the value); one stable
    # sort per b, read from a = i on, is the order sorted(range(i, b)) would give
    near = [sorted(range(b), key=lambda a, b=b: abs((b - a) * p - n)) for b in range(n + 1)]
    # the even cut's slowest stage bounds the programme's value from above: a partial cut at
    # or above it cannot lead below it, so states start there (each then holds its exact value
    # when below the bound, else the bound; the value found is exact either way, the even cut
    # reaching the bound), and most (stage, end, start) are never priced
    start = _even_cut_bound(f, n, p)
    for i in range(1, p):
        last = i == p - 1
        before = best[i - 1]
        for b in (range(n, n + 1) if last else range(i + 1, n - (p - 1 - i) + 1)):
            cur = start
            for a in near[b]:
                prev = before[a]
                if a < i or prev >= cur:
                    continue   # (inf included) no stage time can bring the max below best
                lo = low.get((i, a, b))
                if lo is None:
                    lo = floor(i, a, b)
                if lo >= cur:
                    continue
                val = max(prev, f(i, a, b))
                if val < cur:
                    cur = val
            best[i][b] = cur
    bound = best[p - 1][n]
    if bound == inf:
        return None
    bound *= 1 + 1e-12
    # second pass: least total time with every stage within the bound
    total = [[inf] * (n + 1) for _ in range(p)]
    back = [[0] * (n + 1) for _ in range(p)]
    for b in range(1, n - p + 2):
        if p == 1 and b != n:
            continue
        t = f(0, 0, b)
        if t <= bound:
            total[0][b] = t
    for i in range(1, p):
        last = i == p - 1
        for b in (range(n, n + 1) if last else range(i + 1, n - (p - 1 - i) + 1)):
            for a in range(i, b):
                if total[i - 1][a] >= total[i][b]:
                    continue   # (inf included) stage times are >= 0: no improvement
                lo = floor(i, a, b)
                if lo > bound or total[i - 1][a] + lo >= total[i][b]:
                    continue   # f >= its floor: over the bound, or no improvement
                t = f(i, a, b)
                if t <= bound and total[i - 1][a] + t < total[i][b]:
                    total[i][b] = total[i - 1][a] + t
                    back[i][b] = a
    if total[p - 1][n] == inf:
        return None
    cut, b = [], n
    for i in range(p - 1, 0, -1):
        a = back[i][b]
        cut.append(b - a)
        b = a
    cut.append(b)
    return tuple(reversed(cut))


def _even_cut_bound(f, n: int, p: int) -> float:
    """The slowest stage of the even cut of ``n`` blocks over ``p`` stages (the first ``n %
    p`` stages one block more), ``f(stage, first, end)`` each stage's fastest fitting time (inf
    when one does not fit); inf for one stage (no bound needed)."""
    if p <= 1:
        return math.inf
    worst, a = 0.0, 0
    for i in range(p):
        b = a + n // p + (1 if i < n % p else 0)
        worst = max(worst, f(i, a, b))
        if worst == math.inf:
            break
        a = b
    return worst


#: Per cost model: :func:`_interval_classes`' table.
_CLASSES: "weakref.WeakKeyDictionary[CostModel, list]" = weakref.WeakKeyDictionary()


def _interval_classes(cm: CostModel) -> list[list[int]]:
    """``t[a][b]`` (0 <= a < b <= blocks): one id per class of block intervals [a, b) that
    :func:`dp_cut` prices alike: equal whether it starts at block 0 and ends at the last, the
    signatures of the block before it and of its last block, and its count of each signature.
    Built once per cost model (O(blocks^2 x signatures)), so that an interval's memo key is
    (configuration fields, rank, id) rather than a tuple rebuilt at each lookup."""
    got = _CLASSES.get(cm)
    if got is not None:
        return got
    n = len(cm.blocks)
    sigs = [cm.graph.layers[i].signature for i in cm.blocks]
    kinds = sorted(set(sigs))
    prefix = {s: [0] * (n + 1) for s in kinds}
    for j, s in enumerate(sigs):
        for s2 in kinds:
            prefix[s2][j + 1] = prefix[s2][j] + (s2 == s)
    ids: dict[tuple, int] = {}
    table = [[-1] * (n + 1) for _ in range(n + 1)]
    for a in range(n):
        for b in range(a + 1, n + 1):
            content = (a == 0, b == n, sigs[a - 1] if a else None, sigs[b - 1],
                       tuple(prefix[s][b] - prefix[s][a] for s in kinds))
            table[a][b] = ids.setdefault(content, len(ids))
    _CLASSES[cm] = table
    return table


def some_cut_fits(cm: CostModel, c: ParallelConfig, allowed: tuple[str, ...] = MODES) -> bool:
    """Whether some stage cut of the resolved, non-interleaved config ``c`` (every stage at
    least one block) fits every rank's memory, in O(p log n) rank evaluations.

    Greedy is exact here: a rank's least memory only grows when it holds more blocks (model
    states, activations and the largest gathered layer are monotone in the set of layers), so
    letting each rank in turn end as late as it can fit leaves the shortest remainder, and a
    shorter remainder is never harder to place. Returns False for interleaved ``c``.
    """
    n, p = len(cm.blocks), c.pp
    if (c.virtual_stages or 1) != 1 or n < p:
        return False
    def fits(i: int, a: int, b: int) -> bool:
        return rank_fits(cm, c, cm.interval_layout(c, i, a, b), allowed)

    a, length = 0, max(1, n // p)
    for i in range(p):
        if i == p - 1:
            return fits(i, a, n)
        lo, hi = a + 1, n - (p - 1 - i)   # rank i ends somewhere in [lo, hi]
        # the largest end that fits, by galloping from the previous rank's length (ranks
        # hold similar counts, so a few probes settle it; the same end as bisecting [lo, hi])
        guess = min(hi, max(lo, a + length))
        if fits(i, a, guess):
            lo, step = guess, 1
            while lo < hi:
                probe = min(hi, lo + step)
                if not fits(i, a, probe):
                    hi = probe - 1
                    break
                lo, step = probe, 2 * step
        else:
            hi, step = guess - 1, 1
            while True:
                if hi < lo:
                    return False          # not even one block fits
                probe = max(lo, hi - step + 1)
                if fits(i, a, probe):
                    lo = probe
                    break
                hi, step = probe - 1, 2 * step
        while lo < hi:                    # bisect what is left: largest end that fits
            mid = (lo + hi + 1) // 2
            if fits(i, a, mid):
                lo = mid
            else:
                hi = mid - 1
        length, a = lo - a, lo
    return True
