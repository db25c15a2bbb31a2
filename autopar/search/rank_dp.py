"""The exact per-rank recomputation by enumeration: the hand-written solver for ranks whose
blocks are all of one kind, or whose blocks all fit in their fastest modes
(:func:`autopar.search.cuts.rank_recompute` routes the others to the CP-SAT model of
:mod:`autopar.search.recompute`; both give the same optimum, tests/test_issue24_search.py).

The exact optimum (fastest fitting, then least memory, then fewest blocks in the strongest
modes) is found by enumerating the rank's largest transient (one of a few values,
:meth:`RankCosts.caps`) and, under each:

- per signature, the modes reduce to the chain of those not beaten in both time and memory
  (a beaten mode is never in an optimum: swapping it for the mode beating it loses nothing),
  ordered by memory falling and time rising;
- one signature: counts are enumerated strongest mode first, each from the fewest that can
  still fit (the rest in the least-memory mode left), stopping once the time bound (the rest in
  the fastest mode) passes the best found; the two weakest modes of the chain take the fewest
  blocks of the stronger one that fit (O(1)): O(k) steps for three modes, and few more for four;
- several signatures: the (memory, time) Pareto frontier of all but the one with most blocks,
  combined signature by signature, each point completed by that signature's exact best under
  the memory left (branch and bound on time).
"""

from __future__ import annotations

import bisect
import math

from .rankcost import STRENGTH, RankCosts

#: Relative margin of the branch-and-bound prunes on time: a branch is cut only when its bound
#: exceeds the best time by more than this (sums in other orders differ by a few ulps), so a
#: tie is never cut.
_PRUNE_RTOL = 1e-12
#: Relative margin of :func:`combine`'s cut of partial sums that cannot be completed: far above
#: the rounding of sums taken in another order, far below any difference a choice makes.
_PRUNE_MARGIN = 1e-9


def chain(modes, t: dict, a: dict) -> tuple[str, ...]:
    """The modes of ``modes`` not beaten in both time ``t`` and memory ``a`` (of equal ones the
    weakest), by time rising: memory falls strictly along the chain and time rises strictly."""
    out: list[str] = []
    for m in sorted(modes, key=lambda x: (t[x], a[x], STRENGTH[x])):
        if not out or a[m] < a[out[-1]]:
            out.append(m)
    return tuple(out)


def frontier(points):
    """The (memory, time, counts) points not beaten in both memory and time, by memory."""
    out = []
    for p in sorted(points, key=lambda x: (x[0], x[1], x[2])):
        if not out or p[1] < out[-1][1]:
            out.append(p)
    return out


def sig_points(k: int, ts: list, ms: list, budget: float) -> list:
    """Every (memory, time, counts) of ``k`` identical blocks within ``budget`` over a chain
    (:func:`chain`) of modes of per-block times ``ts`` and memories ``ms`` (counts in chain
    order), less the count vectors that cannot fit whatever the weaker modes take."""
    pts: list = []
    r = len(ts)

    m0, t0 = ms[0], ts[0]

    def level(j: int, rest: int, mem: float, time: float, outer: tuple) -> None:
        if j == 0:
            memory = mem + rest * m0
            if memory <= budget:
                pts.append((memory, time + rest * t0, (rest, *outer)))
            return
        mj, below = ms[j], ms[j - 1]
        base = mem + rest * below
        lo = 0 if base <= budget else max(0, math.ceil((base - budget) / (below - mj)) - 1)
        if j == 1:   # the last choice: each count's point directly (the j == 0 case inlined)
            tj = ts[1]
            for n in range(min(lo, rest + 1), rest + 1):
                memory = mem + n * mj + (rest - n) * m0
                if memory <= budget:
                    pts.append((memory, time + n * tj + (rest - n) * t0, (rest - n, n, *outer)))
            return
        for n in range(min(lo, rest + 1), rest + 1):
            level(j - 1, rest - n, mem + n * mj, time + n * ts[j], (n, *outer))

    level(r - 1, k, 0.0, 0.0, ())
    level = None   # the recursive closure refers to itself: leave no cycle for the collector
    return pts


def sig_frontier(k: int, ts: list, ms: list, budget: float, memo: dict | None = None) -> list:
    """``frontier(sig_points(k, ts, ms, budget))``, shared through ``memo`` by every call with
    the same blocks and chain: the points within a smaller budget are a prefix (by memory) of
    those within a larger one, so the frontier of the prefix is the larger frontier cut at
    ``budget`` (``frontier`` keeps a point by comparing it with smaller-memory points only).
    ``memo`` maps (k, times, memories) to (the budget solved for, its frontier)."""
    if memo is None:
        return frontier(sig_points(k, ts, ms, budget))
    key = (k, tuple(ts), tuple(ms))
    got = memo.get(key)
    if got is None or got[0] < budget:
        # a larger budget than asked (twice the last, at most every point's: k blocks in the
        # most memory-hungry mode, ms[0]) so that rising budgets re-enumerate a few times only
        wide = budget if got is None else max(budget, min(2 * got[0], k * ms[0] * 1.000001))
        got = memo[key] = (wide, frontier(sig_points(k, ts, ms, wide)))
    pts = got[1]
    return pts[:bisect.bisect_right(pts, budget, key=lambda p: p[0])]


def best_of_sig(k: int, ts: list, ms: list, budget: float, tie, bound: float = math.inf):
    """Fastest fitting (time, memory, counts in chain order) of ``k`` identical blocks over a
    chain (:func:`chain`) of per-block times ``ts`` and memories ``ms``; ties in time go to
    less memory, then to the least ``tie(counts)``. None when nothing fits or nothing is within
    ``bound`` seconds.

    Exact: counts are enumerated strongest mode first, each from the fewest that can still fit
    (the rest in the least-memory mode left: memory falls along the chain), while the time
    bound of the rest in the fastest mode (``ts[0]``) stays within the best found; the chain's
    two weakest modes then take the fewest blocks of the stronger that fit, the fastest split
    of those blocks (time rises along the chain)."""
    r = len(ts)
    best = None

    def offer(time: float, memory: float, counts: tuple) -> None:
        nonlocal best
        if best is None or time < best[0] or (time == best[0] and (
                memory < best[1] or (memory == best[1] and tie(counts) < tie(best[2])))):
            best = (time, memory, counts)

    t0, m0 = ts[0], ms[0]
    if r == 1:
        memory = k * m0
        if memory <= budget and k * t0 <= bound:
            best = (k * t0, memory, (k,))
        return best
    t1, m1 = ts[1], ms[1]
    saving = m0 - m1

    def pair(rest: int, mem: float, time: float, outer: tuple) -> None:
        base = mem + rest * m0
        need = 0 if base <= budget else max(0, math.ceil((base - budget) / saving) - 1)
        for n1 in range(need, min(rest, need + 2) + 1):
            memory = mem + n1 * m1 + (rest - n1) * m0
            if memory <= budget:
                time = time + n1 * t1 + (rest - n1) * t0
                if time <= bound:
                    offer(time, memory, (rest - n1, n1, *outer))
                return

    def level(j: int, rest: int, mem: float, time: float, outer: tuple) -> None:
        if j == 1:
            pair(rest, mem, time, outer)
            return
        tj, mj, below = ts[j], ms[j], ms[j - 1]
        base = mem + rest * below
        lo = 0 if base <= budget else max(0, math.ceil((base - budget) / (below - mj)) - 1)
        for n in range(lo, rest + 1):
            limit = bound if best is None else min(bound, best[0] * (1 + _PRUNE_RTOL))
            if time + n * tj + (rest - n) * t0 > limit:
                break   # the bound only rises with n
            level(j - 1, rest - n, mem + n * mj, time + n * tj, (n, *outer))

    level(r - 1, k, 0.0, 0.0, ())
    level = None   # the recursive closure refers to itself: leave no cycle for the collector
    return best


def combine(per_sig: list, budget: float, memo: dict | None = None, bound: float = math.inf):
    """Fastest (time, memory, counts per signature in chain order) over all signatures within
    ``budget``; ``per_sig`` holds (blocks, chain times, chain memories, tie key) per signature.
    All signatures but the one with most blocks are combined as (memory, time) Pareto frontiers;
    each point is completed by that signature's exact best (:func:`best_of_sig`) under the
    memory left, skipped when even its fastest completion cannot beat the best. ``memo``: as
    :func:`sig_frontier`. None when nothing fits or nothing is within ``bound`` seconds."""
    if len(per_sig) == 1:
        k, ts, ms, tie = per_sig[0]
        got = best_of_sig(k, ts, ms, budget, tie, bound)
        return None if got is None else (got[0], got[1], (got[2],))
    inner = max(range(len(per_sig)), key=lambda j: (per_sig[j][0], j))
    # what the signatures not yet merged take at least: their blocks in the fastest mode, and
    # in the least-memory one (memory falls along a chain). A partial sum that cannot be
    # completed within the bound or the budget even so is dropped before the merge's sort (a
    # point it beats could not be completed either); the margin keeps a tie off the cut
    rest_s = sum(k * ts[0] for k, ts, _ms, _tie in per_sig)
    rest_b = sum(k * ms[-1] for k, _ts, ms, _tie in per_sig)
    slack = 1 + _PRUNE_MARGIN
    acc = None
    for j, (k, ts, ms, _tie) in enumerate(per_sig):
        if j == inner:
            continue
        rest_s -= k * ts[0]
        rest_b -= k * ms[-1]
        t_bar, b_bar = bound * slack - rest_s, budget * slack - rest_b
        pts = sig_frontier(k, ts, ms, budget, memo)
        if acc is None:
            # the first signature's frontier within the budget is the partial sums' as it is
            # (sorted by memory, time falling): no merge, no sort
            acc = [(m1, t1, (c1,)) for m1, t1, c1 in pts if t1 <= t_bar and m1 <= b_bar]
        else:
            acc = frontier([(m, t, c0 + (c1,)) for m0, t0, c0 in acc for m1, t1, c1 in pts
                            if (m := m0 + m1) <= budget and m <= b_bar
                            and (t := t0 + t1) <= t_bar])
        if not acc:
            return None
    k, ts, ms, tie = per_sig[inner]
    fastest = k * ts[0]

    def tie_all(counts: tuple) -> tuple:
        return tuple(per_sig[j][3](cnt) for j, cnt in enumerate(counts))

    best = None
    for m0, t0, c0 in reversed(acc):   # fastest partial first: a good bound early
        limit = bound if best is None else min(bound, best[0] * (1 + _PRUNE_RTOL))
        if t0 + fastest > limit:
            continue
        got = best_of_sig(k, ts, ms, budget - m0, tie, limit - t0)
        if got is None:
            continue
        cand = (t0 + got[0], m0 + got[1], c0[:inner] + (got[2],) + c0[inner:])
        if best is None or cand[0] < best[0] or (cand[0] == best[0] and (
                cand[1] < best[1] or (cand[1] == best[1]
                                      and tie_all(cand[2]) < tie_all(best[2])))):
            best = cand
    return best


def _chains(costs: list, modes: tuple[str, ...], cap: float):
    """Per signature of ``costs`` (:attr:`RankCosts.sigs`), the chain (:func:`chain`) of the
    modes whose transient is within ``cap``, as :func:`combine` takes it: (per signature
    (blocks, chain times, chain memories, tie key), the chains); None when a signature has no
    mode within the cap. Reads the layers' costs only, so :func:`solve` keeps it per cap in
    :attr:`RankCosts.derived`."""
    per_sig, chains = [], []
    for k, t, a, tr in costs:
        ch = chain([m for m in modes if tr[m] <= cap], t, a)
        if not ch:
            return None
        per_sig.append((k, [t[m] for m in ch], [a[m] for m in ch], _tie_key(ch)))
        chains.append(ch)
    return per_sig, chains


#: :func:`_tie_key` by chain: a search meets a handful of chains.
_TIE_KEYS: dict = {}


def _tie_key(ch: tuple[str, ...]):
    """The tie key of a chain's counts (in chain order): the counts from the strongest mode
    down, compared as a tuple (fewer blocks in the strongest modes first)."""
    got = _TIE_KEYS.get(ch)
    if got is None:
        strong = tuple(sorted(range(len(ch)), key=lambda i: -STRENGTH[ch[i]]))
        got = _TIE_KEYS[ch] = lambda cnt: tuple(cnt[i] for i in strong)
    return got


def solve(rc: RankCosts, modes: tuple[str, ...], memo: dict | None = None):
    """The fastest fitting recomputation of the rank ``rc`` over ``modes`` (weakest first):
    (block seconds, block bytes at the peak (activations + the largest transient), {mode:
    count} per signature), or None when nothing fits. Ties in time go to less memory, then to
    fewer blocks in the strongest modes. ``rc.step_fits`` and rank without blocks are the
    caller's. ``memo``: the signatures' frontiers (:func:`sig_frontier`), kept by the caller
    across solves (a search's ranks share most of them)."""
    costs = rc.sigs
    best = None
    for cap in rc.caps():
        budget = rc.limit_bytes - rc.fixed_bytes - cap
        if budget < 0:
            break   # caps rise: every later budget is smaller
        key = ("chains", modes, cap)
        if key in rc.derived:
            got = rc.derived[key]
        else:
            got = rc.derived[key] = _chains(costs, modes, cap)
        if got is None:
            continue   # some signature has no mode within the cap
        per_sig, chains = got
        # a larger transient cannot win on time where even every block in its fastest
        # mode is slower than the best found (a tie still can, on memory)
        bound = math.inf if best is None else best[0][0] * (1 + _PRUNE_RTOL)
        if sum(k * ts[0] for k, ts, _ms, _tie in per_sig) > bound:
            continue
        got = combine(per_sig, budget, memo, bound)
        if got is not None:
            time, memory, counts = got
            by_mode = tuple(dict(zip(ch, cnt)) for ch, cnt in zip(chains, counts))
            key = (time, memory + cap,
                   tuple(tuple(n.get(m, 0) for m in reversed(modes)) for n in by_mode))
            if best is None or key < best[0]:
                best = (key, by_mode)
            if all(n.get("none", 0) == k for n, (k, _t, _a, _tr) in zip(by_mode, costs)) \
                    and all(t["none"] <= min(t.values()) for _k, t, _a, _tr in costs):
                break   # no block recomputes, and no mode is faster than none
    if best is None:
        return None
    (time, peak, _), by_mode = best
    return time, peak, by_mode
