"""How the search orders estimates: fastest first, ties to the simpler plan, one plan per kind.

- Two step times are **equal** when they differ by at most :data:`TIE_RTOL` of the faster one.
  The cost model sums thousands of floating-point terms in an order that depends on the
  configuration (e.g. cp=2 x dp=4 and dp=8 can give the same time up to rounding), so an exact
  comparison would break such ties on noise.
- Among equal times the **simpler** plan wins (:func:`simplicity_key`): fewer parallel dimensions
  of degree > 1, then no context parallelism, then less memory per GPU, then the configuration's
  text (a stable, total last resort: the same input always gives the same plan).
- Plans of the same **kind** (:func:`kind_key`: the same degrees, ZeRO stage, recomputation,
  micro-batch and interleaving) differ only in choices a person rarely acts on (rank placement,
  CP mode, stage cuts, schedule, sequence parallelism, FSDP's kept blocks, the blocks that
  recompute otherwise than most); runner-ups are shown one per kind, so alternatives differ in
  something that matters and never repeat the best plan under another placement that gives the
  same groups.
- The **most frugal** of a set (:func:`more_frugal`) takes the least memory per GPU; among equal
  memory (within :data:`TIE_RTOL`) the smaller micro-batch, then the simpler plan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ..config import RECOMPUTE_MODES, ParallelConfig
from ..cost.types import Estimate

#: Relative tolerance under which two step times are equal (floating-point noise of the cost
#: model's sums, far below any difference the model can resolve: its own error is ~10%).
TIE_RTOL = 1e-9

#: The mesh dimensions counted by :func:`simplicity_key`.
PARALLEL_DIMS = ("tp", "cp", "pp", "dp", "ep")


def tied(a: float, b: float) -> bool:
    """True when step times ``a`` and ``b`` (seconds) are equal within :data:`TIE_RTOL`."""
    return abs(a - b) <= TIE_RTOL * min(a, b)


def simplicity_key(e: Estimate, text: bool = True) -> tuple:
    """Sort key among equally fast estimates: (parallel dimensions of degree > 1, CP used,
    memory per GPU in bytes, the configuration's text); smaller is simpler. ``text`` False
    leaves the text out (the key's prefix)."""
    c = e.config
    dims = sum(1 for d in PARALLEL_DIMS if getattr(c, d) > 1)
    if not text:
        return (dims, c.cp > 1, e.memory_per_gpu_bytes)
    return (dims, c.cp > 1, e.memory_per_gpu_bytes, repr(c))


def rank_key(e: Estimate, text: bool = True) -> tuple:
    """Total order by exact step time, then :func:`simplicity_key` (the first pass of
    :func:`ranked`, which then reorders times within :data:`TIE_RTOL`); ``text`` False leaves
    out the configuration's text."""
    return (e.step_time_s, *simplicity_key(e, text))


def better(a: Estimate, b: Estimate) -> bool:
    """True when ``a`` ranks before ``b``: faster beyond the tolerance, or tied and simpler."""
    if tied(a.step_time_s, b.step_time_s):
        ka, kb = simplicity_key(a, text=False), simplicity_key(b, text=False)
        # the configuration's text (costly to build) only where the rest is equal
        return ka < kb if ka != kb else repr(a.config) < repr(b.config)
    return a.step_time_s < b.step_time_s


def ranked(estimates: Iterable[Estimate]) -> list[Estimate]:
    """``estimates`` fastest first, equal times (within :data:`TIE_RTOL` of the fastest of
    their class) ordered simplest first.

    Classes are anchored at their fastest member so the order is a function of the set alone
    (not of the order estimates were found): walking by exact time, a class takes every
    estimate within the tolerance of its first one.
    """
    # sorted by rank_key, whose last field (the configuration's text) is computed only where
    # the fields before it are equal: the same order, without the text of every estimate
    by_time = sorted(estimates, key=lambda e: rank_key(e, text=False))
    i = 0
    while i < len(by_time):
        head = rank_key(by_time[i], text=False)
        j = i + 1
        while j < len(by_time) and rank_key(by_time[j], text=False) == head:
            j += 1
        if j - i > 1:
            by_time[i:j] = sorted(by_time[i:j], key=lambda e: repr(e.config))
        i = j
    out: list[Estimate] = []
    i = 0
    while i < len(by_time):
        anchor = by_time[i].step_time_s
        j = i
        while j < len(by_time) and tied(by_time[j].step_time_s, anchor):
            j += 1
        out.extend(sorted(by_time[i:j], key=simplicity_key) if j - i > 1 else by_time[i:j])
        i = j
    return out


def kind_key(c: ParallelConfig) -> tuple:
    """What makes two configurations different plans to a person: the degrees (tp, cp, pp, dp,
    ep, expert tp), ZeRO stage, recomputation, micro-batch size and interleaving degree.

    A per-block recomputation (a tuple of modes) counts as the mode most of its blocks take
    (of equal counts, the one that recomputes less): which few blocks differ follows from the stage cuts and the
    memory left on each rank (e.g. by blocks that keep FSDP's gathered parameters), not from a
    choice of its own. Counted per tuple, runner-ups that differed only in that
    (``recompute 26 full+54 selective-op->29 full+51 selective-op, FSDP keeps 0->1 of 80 blocks
    gathered``) were listed as different kinds."""
    rc = c.recompute
    if not isinstance(rc, str):
        counts = Counter(rc)
        rc = max(counts, key=lambda m: (counts[m], -RECOMPUTE_MODES.index(m)))
    return (c.tp, c.cp, c.pp, c.dp, c.ep, c.zero_stage, rc, c.micro_batch_size,
            c.virtual_stages, c.expert_tp)


def more_frugal(a: Estimate, b: Estimate) -> bool:
    """True when ``a`` is more memory-frugal than ``b``: less memory per GPU beyond
    :data:`TIE_RTOL`, or equal memory and a smaller micro-batch, then simpler
    (:func:`simplicity_key`). Memory often ties exactly across micro-batches (under full
    recomputation the peak can be the optimizer step's, the same for every micro-batch); the
    first one seen then used to be named, e.g. mbs 8 when mbs 1 needs as much."""
    ma, mb = a.memory_per_gpu_bytes, b.memory_per_gpu_bytes
    if tied(ma, mb):
        return ((a.config.micro_batch_size, *simplicity_key(a))
                < (b.config.micro_batch_size, *simplicity_key(b)))
    return ma < mb


def one_per_kind(estimates: Iterable[Estimate]) -> list[Estimate]:
    """The first estimate of each :func:`kind_key`, in the given order (pass :func:`ranked`
    output to get the best of each kind)."""
    seen: set[tuple] = set()
    out = []
    for e in estimates:
        k = kind_key(e.config)
        if k not in seen:
            seen.add(k)
            out.append(e)
    return out
