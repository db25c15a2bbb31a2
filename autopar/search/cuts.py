"""Exact per-rank recomputation and stage cuts by dynamic programming over the decoder blocks.

Per-rank recomputation (:func:`rank_recompute`). A pipeline rank's blocks each take one of the
recompute modes the target framework runs (a subset of :data:`autopar.config.RECOMPUTE_MODES`:
none, Korthikanti's selective, torchtitan's op-level selective-op, full; every one of them a
choice of its own). Identical blocks (one layer signature) are interchangeable in the cost model
(:meth:`autopar.cost.model.CostModel.estimate` prices a rank by (signature, mode) counts), so a
choice is one count per (signature, mode). The rank's time is the sum of its blocks' forward +
backward (+ its fixed layers and pipeline sends). Its peak memory is what
:meth:`CostModel.estimate` counts: the model states, the activations of every layer times the
rank's in-flight multiplier, and the largest transient of any of its layers (a recomputed block
re-materialises what it did not keep; the head's loss; FP8 weight copies), or the optimizer
step's temporaries where they exceed the activations.

The exact optimum (fastest fitting, then least memory, then fewest blocks in the strongest
modes) is found by enumerating the transient's value (one of a few) and, under each:

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

Stage cuts (:func:`dp_cut`), for one chunk per rank (1F1B, GPipe): with f(i, a, b) the fastest
fitting time of rank i holding blocks a..b-1 (infinite when nothing fits), a first dynamic
programme finds the least possible slowest stage ``M = min over cuts of max_i f(i, .)`` and a
second the cut of least total time among those whose every stage is within M: the step time
``T >= m * max_i t_i`` is paced by the slowest stage, and the rest fills the warm-up and
cool-down (Narayanan et al. 2021, section 2.2). The cut is exact for that pair of objectives,
memory included, for any mix of layer kinds; ranks whose intervals hold the same layers in the
same position share one evaluation. This is our own algorithm (the classic linear-partition DP
with a per-interval memory check).
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict

from ..config import RECOMPUTE_MODES, ParallelConfig
from ..cost.model import CostModel, StageLayout

#: Every recompute mode, weakest first (:data:`autopar.config.RECOMPUTE_MODES`): the default of
#: ``allowed`` below; the search passes the target framework's own subset.
MODES = RECOMPUTE_MODES
_STRENGTH = {m: i for i, m in enumerate(RECOMPUTE_MODES)}

#: Relative margin of the branch-and-bound prunes on time: a branch is cut only when its bound
#: exceeds the best time by more than this (sums in other orders differ by a few ulps), so a
#: tie is never cut.
_PRUNE_RTOL = 1e-12


def _slots(allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The modes of ``allowed`` in :data:`autopar.config.RECOMPUTE_MODES` order, weakest first
    (the order of the counts :func:`rank_recompute` works with)."""
    return tuple(m for m in RECOMPUTE_MODES if m in allowed)


def _chain(modes, t: dict, a: dict) -> tuple[str, ...]:
    """The modes of ``modes`` not beaten in both time ``t`` and memory ``a`` (of equal ones the
    weakest), by time rising: memory falls strictly along the chain and time rises strictly."""
    out: list[str] = []
    for m in sorted(modes, key=lambda x: (t[x], a[x], _STRENGTH[x])):
        if not out or a[m] < a[out[-1]]:
            out.append(m)
    return tuple(out)


def _frontier(points):
    """The (memory, time, counts) points not beaten in both memory and time, by memory."""
    out = []
    for p in sorted(points, key=lambda x: (x[0], x[1], x[2])):
        if not out or p[1] < out[-1][1]:
            out.append(p)
    return out


def _sig_points(k: int, ts: list, ms: list, budget: float) -> list:
    """Every (memory, time, counts) of ``k`` identical blocks within ``budget`` over a chain
    (:func:`_chain`) of modes of per-block times ``ts`` and memories ``ms`` (counts in chain
    order), less the count vectors that cannot fit whatever the weaker modes take."""
    pts: list = []
    r = len(ts)

    def level(j: int, rest: int, mem: float, time: float, outer: tuple) -> None:
        if j == 0:
            memory = mem + rest * ms[0]
            if memory <= budget:
                pts.append((memory, time + rest * ts[0], (rest, *outer)))
            return
        mj, below = ms[j], ms[j - 1]
        base = mem + rest * below
        lo = 0 if base <= budget else max(0, math.ceil((base - budget) / (below - mj)) - 1)
        for n in range(min(lo, rest + 1), rest + 1):
            level(j - 1, rest - n, mem + n * mj, time + n * ts[j], (n, *outer))

    level(r - 1, k, 0.0, 0.0, ())
    del level   # the recursive closure refers to itself: leave no cycle for the collector
    return pts


def _best_of_sig(k: int, ts: list, ms: list, budget: float, tie, bound: float = math.inf):
    """Fastest fitting (time, memory, counts in chain order) of ``k`` identical blocks over a
    chain (:func:`_chain`) of per-block times ``ts`` and memories ``ms``; ties in time go to
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
    del level   # the recursive closure refers to itself: leave no cycle for the collector
    return best


def _combine(per_sig: list, budget: float):
    """Fastest (time, memory, counts per signature in chain order) over all signatures within
    ``budget``; ``per_sig`` holds (blocks, chain times, chain memories, tie key) per signature.
    All signatures but the one with most blocks are combined as (memory, time) Pareto frontiers;
    each point is completed by that signature's exact best (:func:`_best_of_sig`) under the
    memory left, skipped when even its fastest completion cannot beat the best."""
    if len(per_sig) == 1:
        k, ts, ms, tie = per_sig[0]
        got = _best_of_sig(k, ts, ms, budget, tie)
        return None if got is None else (got[0], got[1], (got[2],))
    inner = max(range(len(per_sig)), key=lambda j: (per_sig[j][0], j))
    acc = [(0.0, 0.0, ())]
    for j, (k, ts, ms, _tie) in enumerate(per_sig):
        if j == inner:
            continue
        pts = _frontier(_sig_points(k, ts, ms, budget))
        acc = _frontier([(m0 + m1, t0 + t1, c0 + (c1,)) for m0, t0, c0 in acc
                         for m1, t1, c1 in pts if m0 + m1 <= budget])
        if not acc:
            return None
    k, ts, ms, tie = per_sig[inner]
    fastest = k * ts[0]

    def tie_all(counts: tuple) -> tuple:
        return tuple(per_sig[j][3](cnt) for j, cnt in enumerate(counts))

    best = None
    for m0, t0, c0 in reversed(acc):   # fastest partial first: a good bound early
        limit = math.inf if best is None else best[0] * (1 + _PRUNE_RTOL)
        if t0 + fastest > limit:
            continue
        got = _best_of_sig(k, ts, ms, budget - m0, tie, limit - t0)
        if got is None:
            continue
        cand = (t0 + got[0], m0 + got[1], c0[:inner] + (got[2],) + c0[inner:])
        if best is None or cand[0] < best[0] or (cand[0] == best[0] and (
                cand[1] < best[1] or (cand[1] == best[1]
                                      and tie_all(cand[2]) < tie_all(best[2])))):
            best = cand
    return best


#: Per cost model: what :func:`_rank_costs` reads of the layers of a rank, by the
#: configuration fields :meth:`CostModel.block_cost` keys on, the rank's layers and in-flight
#: multiplier and the modes (a rank's ZeRO stage and states change none of it).
_LAYER_COSTS: "weakref.WeakKeyDictionary[CostModel, dict]" = weakref.WeakKeyDictionary()


def _layer_costs(cm: CostModel, c: ParallelConfig, st: StageLayout, slots: tuple[str, ...]):
    """(per non-block layer (activation bytes x in-flight, forward + backward seconds), the
    largest non-block transient in bytes, block indices per signature, per signature (blocks,
    {mode: seconds}, {mode: activation bytes x in-flight}, {mode: transient bytes})) of one
    rank, cached per cost model (:data:`_LAYER_COSTS`)."""
    memo = _LAYER_COSTS.get(cm)
    if memo is None:
        memo = _LAYER_COSTS[cm] = {}
    key = (c.tp, c.cp, c.dp, c.pp, c.micro_batch_size, c.sequence_parallel, c.cp_mode,
           c.placement, c.ep, c.expert_tp, st.layers, st.flight, st.edge_flight, slots)
    hit = memo.get(key)
    if hit is not None:
        return hit
    layers = cm.graph.layers
    fixed = []
    floor = 0.0
    by_sig: OrderedDict[str, list[int]] = OrderedDict()
    for li in st.layers:
        if layers[li].kind == "block":
            by_sig.setdefault(layers[li].signature, []).append(li)
        else:
            bc = cm.block_cost(li, "none", c)
            fixed.append((bc.act_bytes * st.flight_of(li), bc.fwd_s + bc.bwd_s))
            floor = max(floor, bc.transient_bytes)
    costs = []
    for idx in by_sig.values():
        bcs = {mode: cm.block_cost(idx[0], mode, c) for mode in slots}
        costs.append((len(idx), {m: b.fwd_s + b.bwd_s for m, b in bcs.items()},
                      {m: b.act_bytes * st.flight for m, b in bcs.items()},
                      {m: b.transient_bytes for m, b in bcs.items()}))
    hit = memo[key] = (tuple(fixed), floor, by_sig, costs)
    return hit


def _rank_costs(cm: CostModel, c: ParallelConfig, st: StageLayout, slots: tuple[str, ...]):
    """What :func:`rank_recompute` and :func:`rank_fits` read of one rank: (bytes that do not
    depend on recomputation (states, reserve, ZeRO-3 gathers, non-block activations), seconds
    likewise (pipeline sends, non-block layers), the largest non-block transient in bytes,
    the block indices per signature, per signature (blocks, {mode: seconds}, {mode: activation
    bytes}, {mode: transient bytes}), whether the optimizer step's temporaries fit beside the
    states)."""
    fixed, floor, by_sig, costs = _layer_costs(cm, c, st, slots)
    states = sum(st.states)
    fixed_mem = states + cm.reserved_bytes + st.gather_bytes
    fixed_time = st.p2p_s
    for act, time in fixed:
        fixed_mem += act
        fixed_time += time
    # CostModel.estimate: the step's temporaries replace the activations at the step's peak
    step_fits = states + cm.reserved_bytes + cm.optimizer_step_bytes(c, st.params) \
        <= cm.device.visible_memory_bytes
    return fixed_mem, fixed_time, floor, by_sig, costs, step_fits


def _caps(floor: float, costs: list) -> list[float]:
    """Candidate values of a rank's largest transient: the non-block layers' and each
    (signature, mode)'s above it, rising."""
    return sorted({floor} | {tr for _k, _t, _a, trs in costs for tr in trs.values()
                             if tr > floor})


def rank_recompute(cm: CostModel, c: ParallelConfig, st: StageLayout,
                   allowed: tuple[str, ...] = MODES
                   ) -> tuple[float, float, dict[int, str]] | None:
    """The fastest fitting recomputation of one pipeline rank, exactly.

    Args:
        cm: the cost model.
        c: a resolved configuration (its ``recompute`` is ignored).
        st: the rank's layout (:meth:`CostModel.stage_layout` or :meth:`CostModel.interval_layout`).
        allowed: the modes a block may take: any non-empty subset of
            :data:`autopar.config.RECOMPUTE_MODES` (the target framework's, see
            :func:`autopar.search.space.recompute_modes`); each is a choice of its own.

    Returns:
        (rank time per micro-batch in seconds, peak memory in bytes, mode by graph layer index
        of each of its decoder blocks), or None when no choice fits the GPU's memory. Ties in
        time go to less memory, then to fewer blocks in the strongest modes.
    """
    slots = _slots(allowed)
    limit = cm.device.visible_memory_bytes
    fixed_mem, fixed_time, floor, by_sig, costs, step_fits = _rank_costs(cm, c, st, slots)
    if not step_fits:
        return None
    if not by_sig:
        return (fixed_time, fixed_mem + floor, {}) if fixed_mem + floor <= limit else None
    best = None
    for cap in _caps(floor, costs):
        budget = limit - fixed_mem - cap
        if budget < 0:
            break   # caps rise: every later budget is smaller
        per_sig, chains = [], []
        for k, t, a, tr in costs:
            chain = _chain([m for m in slots if tr[m] <= cap], t, a)
            if not chain:
                break
            strong = sorted(range(len(chain)), key=lambda i: -_STRENGTH[chain[i]])
            per_sig.append((k, [t[m] for m in chain], [a[m] for m in chain],
                            lambda cnt, s=strong: tuple(cnt[i] for i in s)))
            chains.append(chain)
        else:
            got = _combine(per_sig, budget)
            if got is not None:
                time, memory, counts = got
                by_mode = tuple(dict(zip(ch, cnt)) for ch, cnt in zip(chains, counts))
                key = (time, memory + cap,
                       tuple(tuple(n.get(m, 0) for m in reversed(slots)) for n in by_mode))
                if best is None or key < best[0]:
                    best = (key, by_mode, cap)
                if all(n.get("none", 0) == k for n, (k, _t, _a, _tr) in zip(by_mode, costs)) \
                        and all(t["none"] <= min(t.values()) for _k, t, _a, _tr in costs):
                    break   # no block recomputes, and no mode is faster than none
    if best is None:
        return None
    (time, peak, _), by_mode, _cap = best
    modes_of: dict[int, str] = {}
    for idx, n in zip(by_sig.values(), by_mode):
        order = [m for m in reversed(slots) for _ in range(n.get(m, 0))]   # strongest first
        modes_of.update(zip(idx, order))
    return fixed_time + time, fixed_mem + peak, modes_of


#: Relative margin around a rank's budget inside which :func:`rank_fits` defers to
#: :func:`rank_recompute` (its sums add the same terms in other orders: rounding differs by a
#: few ulps, far below this).
FIT_RTOL = 1e-9


def rank_fits(cm: CostModel, c: ParallelConfig, st: StageLayout,
              allowed: tuple[str, ...] = MODES) -> bool:
    """Whether :func:`rank_recompute` finds a fitting recomputation for this rank (the same
    answer, without searching for the fastest one).

    Some choice fits exactly when the optimizer step's temporaries fit beside the states and,
    for some transient cap (the largest transient of the rank's layers, one of a few values),
    every block takes its least-memory mode among those whose transient is within the cap and
    the total is within the budget: activation memory is a sum over blocks, so the least total
    is the sum of the least per block. Totals within :data:`FIT_RTOL` of a budget are settled
    by :func:`rank_recompute` itself.
    """
    slots = _slots(allowed)
    limit = cm.device.visible_memory_bytes
    fixed_mem, _time, floor, by_sig, costs, step_fits = _rank_costs(cm, c, st, slots)
    if not step_fits:
        return False
    if not by_sig:
        return fixed_mem + floor <= limit
    for cap in _caps(floor, costs):
        budget = limit - fixed_mem - cap
        if budget < 0:
            return False
        least = 0.0
        for k, _t, a, tr in costs:
            options = [a[m] for m in slots if tr[m] <= cap]
            if not options:
                break
            least += k * min(options)
        else:
            if least <= budget - FIT_RTOL * limit:
                return True
            if least <= budget + FIT_RTOL * limit:
                return rank_recompute(cm, c, st, allowed) is not None
    return False


def dp_cut(cm: CostModel, c: ParallelConfig, allowed: tuple[str, ...] = MODES,
           memo: dict | None = None) -> tuple[int, ...] | None:
    """Blocks per pipeline stage of the resolved, non-interleaved config ``c`` (its own
    ``stage_blocks`` ignored) minimising the slowest stage under every stage's memory, then the
    total stage time; every stage holds at least one block.

    Args:
        cm: the cost model.
        c: a resolved configuration with ``virtual_stages == 1``.
        allowed: recompute modes a block may take.
        memo: a dict reused across calls on the same model (keys include the configuration).

    Returns:
        One block count per stage (``c.pp`` entries summing to the model's blocks), or None when
        no cut fits in memory, the model has fewer blocks than stages, or ``c`` is interleaved.
    """
    n, p = len(cm.blocks), c.pp
    if (c.virtual_stages or 1) != 1 or n < p or p < 1:
        return None
    memo = {} if memo is None else memo
    sigs = [cm.graph.layers[i].signature for i in cm.blocks]
    kinds = sorted(set(sigs))
    prefix = {s: [0] * (n + 1) for s in kinds}
    for j, s in enumerate(sigs):
        for s2 in kinds:
            prefix[s2][j + 1] = prefix[s2][j] + (s2 == s)
    ckey = (c.tp, c.pp, c.cp, c.dp, c.micro_batch_size, c.sequence_parallel, c.zero_stage,
            c.schedule, c.placement, c.ep, c.cp_mode, allowed)

    local: dict[tuple[int, int, int], float] = {}   # this call's f by (i, a, b)

    def f(i: int, a: int, b: int) -> float:
        hit = local.get((i, a, b))
        if hit is not None:
            return hit
        key = (ckey, i, a == 0, b == n, sigs[a - 1] if a else None, sigs[b - 1],
               tuple(prefix[s][b] - prefix[s][a] for s in kinds))
        hit = memo.get(key)
        if hit is None:
            st = cm.interval_layout(c, i, a, b)
            # rank_fits answers "nothing fits" without searching for the fastest mix
            got = rank_recompute(cm, c, st, allowed) if rank_fits(cm, c, st, allowed) else None
            hit = memo[key] = math.inf if got is None else got[0]
        local[(i, a, b)] = hit
        return hit

    inf = math.inf
    # best[i][b]: least slowest stage over cuts of blocks 0..b-1 into ranks 0..i
    best = [[inf] * (n + 1) for _ in range(p)]
    for b in range(1, n - p + 2):
        best[0][b] = f(0, 0, b) if p > 1 or b == n else inf
    for i in range(1, p):
        last = i == p - 1
        for b in (range(n, n + 1) if last else range(i + 1, n - (p - 1 - i) + 1)):
            for a in range(i, b):
                if best[i - 1][a] >= best[i][b]:
                    continue   # (inf included) no stage time can bring the max below best
                val = max(best[i - 1][a], f(i, a, b))
                if val < best[i][b]:
                    best[i][b] = val
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
