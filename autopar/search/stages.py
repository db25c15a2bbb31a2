"""Inside one configuration: per-rank recomputation and pipeline stage cuts.

Recomputation. A faster pipeline rank never makes the step slower (the pipeline is a max-plus
system, monotone in every duration, and a slower bottleneck takes at most its extra time off
the DP traffic it overlaps, exposed plus slowdown (:func:`autopar.cost.comm.overlapped_comm`),
while adding at least that to the pipeline), so each rank independently
takes its fastest mix of the recompute modes the framework runs (none / selective /
selective-op / full, each a choice of its own) that fits its memory, found exactly for any mix of
block kinds by :func:`autopar.search.cuts.rank_recompute` (the OR-Tools CP-SAT model of
:mod:`autopar.search.recompute` where a rank's blocks differ and memory binds, the exact
enumeration of :mod:`autopar.search.rank_dp` elsewhere).

Stage cuts. Blocks per pipeline chunk are enumerated exhaustively when the compositions are few,
otherwise taken from a neighbourhood of the balanced cut that moves blocks off the first and last
chunks (which also carry the embedding and the head); for one chunk per rank the search adds the
cut of :func:`autopar.search.cuts.dp_cut` (exact least slowest stage under every stage's memory).
"""

from __future__ import annotations

import math
from itertools import combinations

from ..config import ParallelConfig
from ..cost.model import CostModel
from ..cost.stages import balanced_stage_blocks
from .cuts import MODES, rank_recompute
from .recompute import SolveLog

#: Largest number of stage-cut compositions enumerated exhaustively per configuration.
MAX_EXHAUSTIVE_CUTS = 64


def best_recompute(cm: CostModel, c: ParallelConfig, allowed: tuple[str, ...] = MODES,
                   log: SolveLog | None = None) -> tuple[str, ...] | None:
    """Per-block recompute modes giving every pipeline rank its fastest fitting mix, for the
    resolved config ``c`` (its own ``recompute`` is ignored); None when some rank cannot fit.
    Each rank is solved exactly, whatever mix of block kinds it holds
    (:func:`autopar.search.cuts.rank_recompute`: CP-SAT for ranks of mixed blocks where memory
    binds, counted in ``log``)."""
    modes: dict[int, str] = {}
    for st in cm.stage_layout(c):
        got = rank_recompute(cm, c, st, allowed, log)
        if got is None:
            return None
        modes.update(got[2])
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
