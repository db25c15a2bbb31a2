"""Which chunks a pipeline rank holds at the instants its activations peak, walked along the
order torch builds for it (:mod:`autopar.cost.pipeline.orders`; the memory model's per-chunk
counts under several chunks per rank, and the chunks whose data-parallel state is held)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from .orders import check_order_args, peak_in_flight, rank_order

def _chunk_steps(order) -> Iterator[tuple[str, int]]:
    """(kind, global chunk) of each pass in a rank's order, an ``O`` pair as its ``F`` then its
    ``B`` (the walk :func:`held_chunks_at_peak` and :func:`chunk_counts_at_peak` share)."""
    for a in order:
        if a[0] == "O":
            yield "F", a[1][0]
            yield "B", a[2][0]
        else:
            yield a[0], a[1]


def held_chunks_at_peak(schedule: str, pp: int, m: int, v: int, rank: int
                         ) -> tuple[tuple[frozenset, frozenset], ...]:
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

    Returns:
        the distinct (forward, backward) pairs of frozensets, in order of first occurrence.

    Raises:
        ValueError: the combination breaks a rule of :func:`check_order_args`.
    """
    check_order_args(schedule, pp, m, v)
    return _held_chunks_at_peak(schedule, pp, m, v, rank)


@lru_cache(maxsize=4096)
def _held_chunks_at_peak(schedule: str, pp: int, m: int, v: int, rank: int
                         ) -> tuple[tuple[frozenset, frozenset], ...]:
    order = rank_order(schedule, pp, m, v, rank)
    peak = peak_in_flight(tuple(order))
    held = 0
    fwd_open: set = set()
    bwd_open: set = set()
    done_b: dict[int, int] = {}
    seen_f: set = set()
    out: dict[tuple[frozenset, frozenset], None] = {}

    def note() -> None:
        if held == peak:
            out.setdefault((frozenset(fwd_open), frozenset(bwd_open)), None)

    for kind, stage in _chunk_steps(order):
        if kind == "F":
            held += 1
            if stage not in seen_f:
                seen_f.add(stage)
                fwd_open.add(stage)
            note()
        elif kind in ("B", "W"):
            bwd_open.add(stage)
            note()
            held -= 1
            done_b[stage] = done_b.get(stage, 0) + 1
            if done_b[stage] == m:
                fwd_open.discard(stage)
                bwd_open.discard(stage)
    return tuple(out)


def chunk_counts_at_peak(schedule: str, pp: int, m: int, v: int, rank: int
                         ) -> dict[int, int]:
    """Per global chunk of rank ``rank``: the most micro-batches it holds activations for at an
    instant where the rank holds its :func:`peak_in_flight` chunk-micro-batches (same walk and
    instants as :func:`held_chunks_at_peak`). Under interleaved 1F1B with m = pp the last rank
    holds its first chunk's m micro-batches but only one of its last chunk's (the one with the
    output head), not the rank's mean of (m + 1) / 2.

    Raises:
        ValueError: the combination breaks a rule of :func:`check_order_args`.
    """
    check_order_args(schedule, pp, m, v)
    return dict(_chunk_counts_at_peak(schedule, pp, m, v, rank))


@lru_cache(maxsize=4096)
def _chunk_counts_at_peak(schedule: str, pp: int, m: int, v: int, rank: int
                          ) -> tuple[tuple[int, int], ...]:
    order = rank_order(schedule, pp, m, v, rank)
    peak = peak_in_flight(tuple(order))
    held: dict[int, int] = {}
    best: dict[int, int] = {}

    def note() -> None:
        if sum(held.values()) == peak:
            for c, n in held.items():
                best[c] = max(best.get(c, 0), n)

    for kind, stage in _chunk_steps(order):
        if kind == "F":
            held[stage] = held.get(stage, 0) + 1
            note()
        elif kind in ("B", "W"):
            note()
            held[stage] -= 1
    return tuple(sorted(best.items()))
