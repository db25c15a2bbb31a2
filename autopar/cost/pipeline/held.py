"""Which chunks a pipeline rank holds at the instants its activations peak, walked along the
order torch builds for it (:mod:`autopar.cost.pipeline.orders`; the memory model's per-chunk
counts under several chunks per rank, and the chunks whose data-parallel state is held)."""

from __future__ import annotations

from functools import lru_cache

from ...config import DUAL_PIPES
from .orders import check_order_args, looped_peak_order, rank_order


def held_chunks_at_peak(schedule: str, pp: int, m: int, v: int, rank: int,
                        group: int | None = None) -> tuple[tuple[frozenset, frozenset], ...]:
    """Which of rank ``rank``'s chunks hold per-chunk data-parallel state at the instants its
    activations peak, for a framework that gathers a chunk's parameters once per step and
    accumulates its gradients unsharded until the chunk's last backward (FSDP under pipeline
    parallelism).

    Walks the rank's full order (:func:`rank_orders`, all ``m`` micro-batches) and, at every
    instant where the rank holds :func:`peak_in_flight` chunk-micro-batches, records two sets
    of global chunk indices:

    - ``forward``: chunks whose first forward has run and whose last backward has not;
    - ``backward``: chunks whose first backward (``B``, or ``W``: the weight-gradient pass that
      writes the gradients) has started and whose last backward has not finished.

    Instants: after each forward, and at the start of each backward, counted before its
    micro-batch's activations are freed and after its chunk's gradients are allocated (so a
    chunk's first backward counts both: an upper bound by at most one chunk-micro-batch).
    A chunk's state is freed when its ``m``-th backward ends.

    Source: torch.distributed.pipelining (torch 2.5-2.6, the versions torchtitan ran at the end
    of 2024, and torch 2.13): stage.py ``backward_maybe_with_nosync`` sets
    ``set_requires_gradient_sync(False)`` / ``set_reshard_after_backward(False)`` on an FSDP
    stage module for every backward but that stage's last, and runs FSDP's ``post_backward``
    (reduce-scatter into sharded gradients, reshard the parameters) after it; the schedules
    flag ``last_backward`` per stage (``Schedule1F1B``: ``bwd_mb_index == n_microbatches - 1``;
    ``PipelineScheduleMulti``: ``backward_counter[stage_index] == n_microbatches``; torch 2.13
    ``_add_reduce_grad``: REDUCE_GRAD "just after the last backward-like" action of the stage).
    FSDP2 allocates a parameter's unsharded gradient in its first backward
    (``fsdp/_fully_shard/_fsdp_param.py`` ``to_accumulated_grad_if_needed``). So under
    ``Schedule1F1B`` the single chunk's gradients exist from the rank's first backward, when its
    activations peak; under ``ScheduleInterleaved1F1B`` a rank's earlier chunk starts its
    backward only after its later chunk has run several backwards, and the later chunk's state
    is freed before the earlier one's last backward.

    ``group``: interleaved 1F1B's micro-batch group in Megatron-LM's order
    (:func:`~autopar.cost.pipeline.orders.rank_orders`); None = torch's.

    Returns:
        the distinct (forward, backward) pairs of frozensets, in order of first occurrence.

    Raises:
        ValueError: the combination breaks a rule of :func:`check_order_args`.
    """
    check_order_args(schedule, pp, m, v, group)
    return _at_peak(schedule, pp, m, v, rank, group)[0]


def chunk_counts_at_peak(schedule: str, pp: int, m: int, v: int, rank: int,
                         group: int | None = None) -> dict[int, int]:
    """Per global chunk of rank ``rank``: the most micro-batches it holds activations for at an
    instant where the rank holds its :func:`peak_in_flight` chunk-micro-batches (same walk and
    instants as :func:`held_chunks_at_peak`). Under interleaved 1F1B with m = pp the last rank
    holds its first chunk's m micro-batches but only one of its last chunk's (the one with the
    output head), not the rank's mean of (m + 1) / 2. ``group`` as in
    :func:`held_chunks_at_peak`.

    Raises:
        ValueError: the combination breaks a rule of :func:`check_order_args`.
    """
    check_order_args(schedule, pp, m, v, group)
    return dict(_at_peak(schedule, pp, m, v, rank, group)[1])


@lru_cache(maxsize=4096)
def _at_peak(schedule: str, pp: int, m: int, v: int, rank: int, group: int | None = None
             ) -> tuple[tuple[tuple[frozenset, frozenset], ...], tuple[tuple[int, int], ...]]:
    """(:func:`held_chunks_at_peak`, :func:`chunk_counts_at_peak` as sorted (chunk, count)
    pairs) of one rank, from one walk of its order (cached; the arguments are checked by the
    callers).

    One pass, without the peak known in advance: ``top`` is the most chunk-micro-batches held
    so far, and what was recorded at a lower level is dropped when a new one is reached, so
    what is left at the end is what was recorded at the instants holding the order's peak
    (:func:`autopar.cost.pipeline.orders.peak_in_flight`: the same +1 per forward, -1 per backward or
    weight pass, an ``O`` pair's forward first), in order of occurrence. Two instants are not
    recorded again: a set pair unchanged since the last one recorded at the same level (the
    dict keeps the first occurrence anyway), and the counts at the start of a backward or
    weight pass: they are those after the last forward (only a forward raises a count, and a
    backward or weight pass lowers the total below the level it ran at, so the last change
    before an instant at the running peak is a forward, recorded at that same level).
    """
    if v == 1 and schedule in ("1f1b", "gpipe"):
        # one chunk (the rank's own): its first forward opens it and every later forward
        # raises the count until the rank's first backward, which runs at that level (1F1B
        # runs min(m, pp - rank) forwards before it, GPipe all m) and opens its gradients;
        # afterwards a forward only follows a backward, so the level is never passed again,
        # and the chunk closes at its last backward, below it. So the walk records the chunk
        # forward-only, then forward and backward (checked equal to the walk,
        # tests/test_schedules.py)
        one = frozenset((rank,))
        peak = min(m, pp - rank) if schedule == "1f1b" else m
        return ((one, frozenset()), (one, one)), ((rank, peak),)
    if schedule == "interleaved-1f1b":   # its steady state repeats: the prefix that shows it
        order = looped_peak_order(pp, m, v, rank, group)
    else:
        order = rank_order(schedule, pp, m, v, rank)
    if schedule in DUAL_PIPES:   # their O pairs: the forward, then the backward
        order = [step for a in order for step in (
            (("F", a[1][0]), ("B", a[2][0])) if a[0] == "O" else (a,))]
    chunks = pp * v
    total = top = 0
    fwd_open: set = set()
    bwd_open: set = set()
    done_b = [0] * chunks
    count = [0] * chunks    # activations held per global chunk
    seen: list[int] = []    # chunks in order of their first forward
    raised: list[int] = []  # chunks whose count rose since the last instant recorded
    sets: dict[tuple[frozenset, frozenset], None] = {}
    best: dict[int, int] = {}
    changed = True   # the set pair differs from the one last recorded at this level
    for a in order:
        kind, stage = a[0], a[1]
        if kind == "F":
            total += 1
            count[stage] += 1
            raised.append(stage)
            if stage not in fwd_open and stage not in seen:
                seen.append(stage)
                fwd_open.add(stage)
                changed = True
            if total >= top:
                if total > top:   # a new level: what the lower one recorded is dropped
                    top, sets, best, changed = total, {}, {}, True
                    raised = seen.copy()   # every chunk run so far is recorded
                if changed:
                    sets.setdefault((frozenset(fwd_open), frozenset(bwd_open)), None)
                    changed = False
                # a count not raised since the last instant recorded is at most what that
                # instant recorded for it
                for c in raised:
                    n = count[c]
                    if n > best.get(c, -1):
                        best[c] = n
                raised = []
        elif kind == "B" or kind == "W":
            if stage not in bwd_open:
                bwd_open.add(stage)
                changed = True
            if total == top and changed:
                sets.setdefault((frozenset(fwd_open), frozenset(bwd_open)), None)
                changed = False
            total -= 1
            count[stage] -= 1
            done_b[stage] += 1
            if done_b[stage] == m:
                fwd_open.discard(stage)
                bwd_open.discard(stage)
                changed = True
    return tuple(sets), tuple(sorted(best.items()))
