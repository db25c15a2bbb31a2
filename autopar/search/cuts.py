"""Exact per-rank recomputation and stage cuts by dynamic programming over the decoder blocks.

Per-rank recomputation (:func:`rank_recompute`). A pipeline rank's blocks each take none /
selective / full recomputation; identical blocks (one layer signature) are interchangeable in the
cost model (:meth:`autopar.cost.model.CostModel.estimate` prices a rank by (signature, mode)
counts), so a choice is one count per (signature, mode). The rank's time is the sum of its blocks'
forward + backward (+ its fixed layers and pipeline sends); its peak memory is the model states,
the activations of every block times the rank's in-flight multiplier, and the largest transient
of a recomputed block. The exact optimum (fastest fitting, then least memory) is found by
enumerating the transient's value (one of a few) and, under each, the (memory, time) Pareto
frontier of every signature's counts, combined signature by signature. A single signature with
the usual order of costs (more recomputation: more time, less memory) takes the O(k) path: for
each number of fully recomputed blocks, the fewest selective ones that fit.

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
from bisect import bisect_right
from collections import OrderedDict

from ..config import ParallelConfig
from ..cost.model import CostModel, StageLayout

MODES = ("none", "selective", "full")


def partial_mode(allowed: tuple[str, ...]) -> str:
    """The partial recompute mode the search weighs between none and full: Korthikanti's
    "selective" where allowed, else torchtitan's "selective-op"."""
    return "selective-op" if "selective-op" in allowed and "selective" not in allowed \
        else "selective"


def _slots(allowed: tuple[str, ...]) -> tuple[tuple[str, str, str], tuple[str, ...]]:
    """(the three slots none / partial / full, the allowed modes among them in slot order): a
    block takes one of the slots; the partial slot is :func:`partial_mode`'s."""
    slots = ("none", partial_mode(allowed), "full")
    return slots, tuple(m for m in slots if m in allowed)


def _frontier(points):
    """The (memory, time, counts) points not beaten in both memory and time, by memory."""
    out = []
    for p in sorted(points, key=lambda x: (x[0], x[1], x[2])):
        if not out or p[1] < out[-1][1]:
            out.append(p)
    return out


def _sig_points(k: int, modes: tuple[str, ...], t: dict, a: dict, budget: float,
                slots: tuple[str, ...] = MODES):
    """Every (memory, time, counts) of ``k`` identical blocks over ``modes`` within ``budget``
    (counts: one per slot of ``slots``, zero for modes not offered)."""
    pts = []
    idx = [slots.index(m) for m in modes]
    if len(modes) == 1:
        combos = [(k,)]
    elif len(modes) == 2:
        combos = [(n, k - n) for n in range(k + 1)]
    else:
        combos = [(k - x - y, x, y) for y in range(k + 1) for x in range(k - y + 1)]
    for combo in combos:
        counts = [0, 0, 0]
        for i, n in zip(idx, combo):
            counts[i] = n
        memory = sum(n * a[slots[i]] for i, n in enumerate(counts) if n)
        if memory <= budget:
            pts.append((memory, sum(n * t[slots[i]] for i, n in enumerate(counts) if n),
                        tuple(counts)))
    return pts


def _single_sig(k: int, modes: tuple[str, ...], t: dict, a: dict, budget: float,
                slots: tuple[str, ...] = MODES):
    """Fastest fitting (memory, time, counts) of ``k`` identical blocks, O(k) when all three
    modes are offered and cost in the usual order (none <= selective <= full in time, >= in
    memory); None when nothing fits."""
    mid = slots[1]
    ordered = (t["none"] <= t[mid] <= t["full"]
               and a["none"] >= a[mid] >= a["full"]) if len(modes) == 3 else False
    if not ordered:
        pts = _sig_points(k, modes, t, a, budget, slots)
        return min(pts, key=lambda p: (p[1], p[0], p[2])) if pts else None
    best = None
    saving = a["none"] - a[mid]
    for n_full in range(k + 1):
        rest = k - n_full
        base = n_full * a["full"] + rest * a["none"]
        if base <= budget:
            need = 0
        elif saving > 0:
            need = max(0, math.ceil((base - budget) / saving) - 1)
        else:
            continue
        for n_sel in range(need, min(rest, need + 2) + 1):
            memory = n_full * a["full"] + n_sel * a[mid] + (rest - n_sel) * a["none"]
            if memory <= budget:
                time = n_full * t["full"] + n_sel * t[mid] + (rest - n_sel) * t["none"]
                cand = (memory, time, (rest - n_sel, n_sel, n_full))
                if best is None or (cand[1], cand[0], cand[2]) < (best[1], best[0], best[2]):
                    best = cand
                break
    return best


def rank_recompute(cm: CostModel, c: ParallelConfig, st: StageLayout,
                   allowed: tuple[str, ...] = MODES
                   ) -> tuple[float, float, dict[int, str]] | None:
    """The fastest fitting recomputation of one pipeline rank, exactly.

    Args:
        cm: the cost model.
        c: a resolved configuration (its ``recompute`` is ignored).
        st: the rank's layout (:meth:`CostModel.stage_layout` or :meth:`CostModel.interval_layout`).
        allowed: the modes a block may take: a subset of none, the framework's partial mode
            (:func:`partial_mode`: "selective" or "selective-op") and full.

    Returns:
        (rank time per micro-batch in seconds, peak memory in bytes, mode by graph layer index
        of each of its decoder blocks), or None when no choice fits the GPU's memory. Ties in
        time go to less memory, then to fewer recomputed blocks.
    """
    layers = cm.graph.layers
    slots, allowed = _slots(allowed)
    limit = cm.device.visible_memory_bytes
    fixed_mem = sum(st.states) + cm.reserved_bytes + st.gather_bytes
    fixed_time = st.p2p_s
    by_sig: OrderedDict[str, list[int]] = OrderedDict()
    for li in st.layers:
        if layers[li].kind == "block":
            by_sig.setdefault(layers[li].signature, []).append(li)
        else:
            bc = cm.block_cost(li, "none", c)
            fixed_mem += bc.act_bytes * st.flight
            fixed_time += bc.fwd_s + bc.bwd_s
    if not by_sig:
        return (fixed_time, fixed_mem, {}) if fixed_mem <= limit else None
    costs = []
    for idx in by_sig.values():
        bcs = {mode: cm.block_cost(idx[0], mode, c) for mode in allowed}
        costs.append((len(idx), {m: b.fwd_s + b.bwd_s for m, b in bcs.items()},
                      {m: b.act_bytes * st.flight for m, b in bcs.items()},
                      {m: (b.transient_bytes if m != "none" else 0.0) for m, b in bcs.items()}))
    caps = sorted({0.0} | {tr[m] for _k, _t, _a, tr in costs for m in allowed})
    best = None
    for cap in caps:
        budget = limit - fixed_mem - cap
        if budget < 0:
            continue
        per_sig = []
        for k, t, a, tr in costs:
            modes = tuple(m for m in allowed if tr[m] <= cap)
            if not modes:
                break
            per_sig.append((k, modes, t, a))
        else:
            got = _combine(per_sig, budget, slots)
            if got is not None:
                memory, time, counts = got
                key = (time, memory + cap, counts)
                if best is None or key < best[0]:
                    best = (key, counts, cap)
                if cap == 0.0 and all(sum(cnt[1:]) == 0 for cnt in counts) and all(
                        t["none"] <= min(t.values()) for _k, t, _a, _tr in costs):
                    break   # no block recomputes, and no mode is faster than none
    if best is None:
        return None
    (time, memory, _), counts, _cap = best
    modes_of: dict[int, str] = {}
    for idx, cnt in zip(by_sig.values(), counts):
        order = ["full"] * cnt[2] + [slots[1]] * cnt[1] + ["none"] * cnt[0]
        modes_of.update(zip(idx, order))
    return fixed_time + time, fixed_mem + memory, modes_of


#: Relative margin around a rank's budget inside which :func:`rank_fits` defers to
#: :func:`rank_recompute` (its sums add the same terms in other orders: rounding differs by a
#: few ulps, far below this).
FIT_RTOL = 1e-9


def rank_fits(cm: CostModel, c: ParallelConfig, st: StageLayout,
              allowed: tuple[str, ...] = MODES) -> bool:
    """Whether :func:`rank_recompute` finds a fitting recomputation for this rank (the same
    answer, without searching for the fastest one).

    Some choice fits exactly when, for some transient cap (the largest transient of a
    recomputed block, one of a few values), every block takes its least-memory mode among those
    whose transient is within the cap and the total is within the budget: activation memory is
    a sum over blocks, so the least total is the sum of the least per block. Totals within
    :data:`FIT_RTOL` of a budget are settled by :func:`rank_recompute` itself.
    """
    layers = cm.graph.layers
    _slots_, allowed = _slots(allowed)
    limit = cm.device.visible_memory_bytes
    fixed_mem = sum(st.states) + cm.reserved_bytes + st.gather_bytes
    counts: OrderedDict[str, list] = OrderedDict()
    for li in st.layers:
        if layers[li].kind == "block":
            counts.setdefault(layers[li].signature, [li, 0])[1] += 1
        else:
            fixed_mem += cm.block_cost(li, "none", c).act_bytes * st.flight
    if not counts:
        return fixed_mem <= limit
    costs = []
    for li, k in counts.values():
        bcs = {mode: cm.block_cost(li, mode, c) for mode in allowed}
        costs.append((k, {m: b.act_bytes * st.flight for m, b in bcs.items()},
                      {m: (b.transient_bytes if m != "none" else 0.0) for m, b in bcs.items()}))
    caps = sorted({0.0} | {tr[m] for _k, _a, tr in costs for m in allowed})
    for cap in caps:
        budget = limit - fixed_mem - cap
        if budget < 0:
            continue
        least = 0.0
        for k, a, tr in costs:
            options = [a[m] for m in allowed if tr[m] <= cap]
            if not options:
                break
            least += k * min(options)
        else:
            if least <= budget - FIT_RTOL * limit:
                return True
            if least <= budget + FIT_RTOL * limit:
                return rank_recompute(cm, c, st, allowed) is not None
    return False


def _combine(per_sig, budget: float, slots: tuple[str, ...] = MODES):
    """Fastest (memory, time, counts per signature) over all signatures within ``budget``."""
    if len(per_sig) == 1:
        got = _single_sig(*per_sig[0], budget, slots)
        return None if got is None else (got[0], got[1], (got[2],))
    acc = [(0.0, 0.0, ())]
    for j, (k, modes, t, a) in enumerate(per_sig):
        pts = _frontier(_sig_points(k, modes, t, a, budget, slots))
        if not pts:
            return None
        if j == len(per_sig) - 1:   # last signature: best partner for each accumulated point
            mems = [p[0] for p in pts]
            best = None
            for m0, t0, c0 in acc:
                i = bisect_right(mems, budget - m0) - 1
                if i < 0:
                    continue
                # on the frontier the largest memory within budget is the fastest
                cand = (m0 + pts[i][0], t0 + pts[i][1], c0 + (pts[i][2],))
                if best is None or (cand[1], cand[0], cand[2]) < (best[1], best[0], best[2]):
                    best = cand
            return best
        acc = _frontier([(m0 + m1, t0 + t1, c0 + (c1,)) for m0, t0, c0 in acc
                         for m1, t1, c1 in pts if m0 + m1 <= budget])
    return None


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
