"""Inside one configuration: per-rank recomputation and pipeline stage cuts.

Recomputation. A faster pipeline rank never makes the step slower (the pipeline is a max-plus
system, monotone in every duration, and a slower bottleneck hides at most ``dp_overlap`` < 1 of
its extra time behind DP traffic while adding at least m times it), so each rank independently
takes its fastest mix of none / selective / full recomputation that fits its memory. For a rank
whose blocks are identical that mix is found exactly by enumerating the number of fully
recomputed blocks (O(k)); ranks holding different block kinds go to CP-SAT
(:mod:`autopar.search.recompute`).

Stage cuts. Blocks per pipeline chunk are enumerated exhaustively when the compositions are few,
otherwise taken from a neighbourhood of the balanced cut that moves blocks off the first and last
chunks (which also carry the embedding and the head), the non-uniformity that matters in practice.
"""

from __future__ import annotations

import math
from itertools import combinations

from ..config import ParallelConfig
from ..cost.model import CostModel
from ..cost.stages import balanced_stage_blocks
from .recompute import MODES, solve_recompute

#: Largest number of stage-cut compositions enumerated exhaustively per configuration.
MAX_EXHAUSTIVE_CUTS = 64


def partial_mode(allowed: tuple[str, ...]) -> str:
    """The partial recompute mode the search weighs between none and full: Korthikanti's
    "selective" where allowed, else torchtitan's "selective-op"."""
    return "selective-op" if "selective-op" in allowed and "selective" not in allowed \
        else "selective"


def _rank_modes(cm: CostModel, c: ParallelConfig, rank: int, allowed: tuple[str, ...]):
    """Fastest fitting (n_none, n_sel, n_full) for a rank of identical blocks, or None.

    Returns (modes by block index, rank time) or None when nothing fits.
    """
    st = cm.stage_layout(c)[rank]
    layers = cm.graph.layers
    blocks = [i for i in st.layers if layers[i].kind == "block"]
    fixed = sum(st.states) + cm.reserved_bytes + st.gather_bytes
    fixed_time = st.p2p_s
    for i in st.layers:
        if layers[i].kind != "block":
            bc = cm.block_cost(i, "none", c)
            fixed += bc.act_bytes * st.flight
            fixed_time += bc.fwd_s + bc.bwd_s
    limit = cm.device.visible_memory_bytes
    if not blocks:
        return ({}, fixed_time) if fixed <= limit else None
    k = len(blocks)
    mid = partial_mode(allowed)
    modes = ("none", mid, "full")
    opt = {m: cm.block_cost(blocks[0], m, c) for m in modes}
    t = {m: opt[m].fwd_s + opt[m].bwd_s for m in modes}
    a = {m: opt[m].act_bytes * st.flight for m in modes}
    tr = {m: opt[m].transient_bytes for m in modes}
    best = None
    full_range = range(k + 1) if "full" in allowed else (0,)
    for n_full in full_range:
        sel_range = range(k - n_full + 1) if mid in allowed else (0,)
        for n_sel in _sel_candidates(n_full, k, sel_range, fixed, a, tr, limit, mid):
            n_none = k - n_full - n_sel
            if n_none and "none" not in allowed:
                continue
            transient = max(tr["full"] if n_full else 0.0, tr[mid] if n_sel else 0.0)
            memory = fixed + n_full * a["full"] + n_sel * a[mid] + n_none * a["none"] \
                + transient
            if memory > limit:
                continue
            time = fixed_time + n_full * t["full"] + n_sel * t[mid] + n_none * t["none"]
            key = (time, memory, n_full, n_sel)
            if best is None or key < best[0]:
                best = (key, n_full, n_sel)
    if best is None:
        return None
    _, n_full, n_sel = best
    order = ["full"] * n_full + [mid] * n_sel + ["none"] * (k - n_full - n_sel)
    return dict(zip(blocks, order)), best[0][0]


def _sel_candidates(n_full, k, sel_range, fixed, a, tr, limit, mid):
    """The few n_sel worth trying for a given n_full: 0, the smallest that fits, and all
    selective (memory falls linearly in n_sel, so the smallest fitting count is fastest)."""
    if len(sel_range) == 1:
        return sel_range
    rest = k - n_full
    saving = a["none"] - a[mid]
    cands = {0, rest}
    if saving > 0:
        base = fixed + n_full * a["full"] + rest * a["none"] + max(
            tr["full"] if n_full else 0.0, tr[mid])
        need = math.ceil((base - limit) / saving) if base > limit else 0
        for n in (need - 1, need, need + 1):
            if 0 <= n <= rest:
                cands.add(n)
    return sorted(cands)


def best_recompute(cm: CostModel, c: ParallelConfig,
                   allowed: tuple[str, ...] = MODES) -> tuple[str, ...] | None:
    """Per-block recompute modes giving every pipeline rank its fastest fitting mix, for the
    resolved config ``c`` (its own ``recompute`` is ignored); None when some rank cannot fit."""
    layers = cm.graph.layers
    modes: dict[int, str] = {}
    hetero = False
    for rank, st in enumerate(cm.stage_layout(c)):
        sigs = {layers[i].signature for i in st.layers if layers[i].kind == "block"}
        if len(sigs) > 1:
            hetero = True
            break
        got = _rank_modes(cm, c, rank, allowed)
        if got is None:
            return None
        modes.update(got[0])
    if hetero:
        return solve_recompute(cm, c, modes=("none", partial_mode(allowed), "full"))
    return tuple(modes[i] for i in cm.blocks)


def _compositions(n: int, parts: int):
    """All ways to cut n blocks into ``parts`` non-empty runs, in lexicographic order."""
    for bars in combinations(range(1, n), parts - 1):
        edges = (0, *bars, n)
        yield tuple(edges[i + 1] - edges[i] for i in range(parts))


def cut_candidates(num_blocks: int, chunks: int) -> list[tuple[int, ...]]:
    """Stage cuts to try: every composition when there are at most
    :data:`MAX_EXHAUSTIVE_CUTS`, else the balanced cut and its neighbours with 1-3 blocks moved
    off the last chunk and 0-2 off the first, spread over the middle chunks."""
    if chunks == 1:
        return [(num_blocks,)]
    if math.comb(num_blocks - 1, chunks - 1) <= MAX_EXHAUSTIVE_CUTS:
        return list(_compositions(num_blocks, chunks))
    base = balanced_stage_blocks(num_blocks, chunks)
    out = [base]
    middle = list(range(1, chunks - 1)) or [0]
    for off_last in range(0, 4):
        for off_first in range(0, 3):
            if off_last == off_first == 0:
                continue
            cut = list(base)
            if cut[-1] - off_last < 1 or cut[0] - off_first < 1:
                continue
            cut[-1] -= off_last
            cut[0] -= off_first
            for j in range(off_last + off_first):
                cut[middle[j % len(middle)]] += 1
            if tuple(cut) not in out:
                out.append(tuple(cut))
    return out
