"""Megatron-LM's block recompute in the search: for a framework with one recompute policy for
all blocks that can also recompute the first N blocks of every pipeline chunk fully
(:attr:`autopar.frameworks.FrameworkProfile.recompute_first_n`: Megatron-LM's
``--recompute-granularity full --recompute-method block --recompute-num-layers N``), the
smallest N that fits, where no recompute does not.

Why the smallest: each block recomputed adds its forward to the step and frees its saved
activations, so the step time grows and the memory shrinks with N; the fastest fitting N is the
smallest that fits, found by bisection over 1 .. (largest chunk - 1) (N = the largest chunk is
"full" on every block, which the uniform policies already try).
"""

from __future__ import annotations

from ..config import ParallelConfig
from ..cost.types import Estimate
from ..errors import InvalidParallelConfig
from ..frameworks.rules import first_n_modes


def first_n_estimate(run, c: ParallelConfig, allowed) -> Estimate | None:
    """The estimate of ``c`` with the smallest first-N block recompute that fits, or None (the
    profile has no such flags, "full" is not allowed, ``c`` does not resolve, or no N below
    the largest chunk fits). ``run``: the search's :class:`autopar.search.phases.Run`."""
    if not run.profile.recompute_first_n or "full" not in allowed:
        return None
    try:
        r = run.cm.resolve(c.replace(recompute="full"))
    except InvalidParallelConfig:
        return None
    chunks = r.stage_blocks or ()
    low, high, best = 1, max(chunks, default=1) - 1, None
    while low <= high:
        n = (low + high) // 2
        e = run.estimate(r.replace(recompute=first_n_modes(chunks, n)))
        if e is not None and e.fits:
            best, high = e, n - 1
        else:
            low = n + 1
    return best
