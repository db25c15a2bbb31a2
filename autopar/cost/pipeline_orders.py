"""The order in which each pipeline rank runs its compute actions, per schedule, as
``torch.distributed.pipelining`` (torch 2.13, ``schedules.py``) builds it; and a timed replay
of those orders that gives a step's duration and the micro-batches each rank holds.

An action is ``(kind, stage, micro-batch)`` with ``stage`` the global chunk index (0 .. S-1,
``S = pp * v``) and ``kind`` one of:

- ``F``: forward of one micro-batch through one chunk;
- ``B``: full backward (input and weight gradients together);
- ``I``: backward for the input gradient only (zero-bubble split; torch ``BACKWARD_INPUT``);
- ``W``: backward for the weight gradient only (torch ``BACKWARD_WEIGHT``);
- ``O``: an ``F`` and a ``B`` of two different micro-batches issued together (DualPipeV's
  ``OVERLAP_F_B``); ``stage``/``mb`` hold the pair ``((f_stage, f_mb), (b_stage, b_mb))``.

Chunk placement: looped schedules put chunk ``c`` on rank ``c % pp``; V-shaped ones (ZBV,
DualPipeV, exactly two chunks per rank) put chunk ``c < pp`` on rank ``c`` and chunk
``c >= pp`` on rank ``2 pp - 1 - c`` (torch ``generate_stage_to_rank_mapping(style="v")``), so
the last chunk sits on rank 0 beside the first.

What each order is (sources: the torch 2.13 classes named; Qi et al. 2023, "Zero Bubble
Pipeline Parallelism", arXiv 2401.10241; DeepSeek-AI 2024, DeepSeek-V3 technical report, arXiv
2412.19437, section 3.2.1):

- ``gpipe`` (``ScheduleGPipe``): every forward, then every backward.
- ``1f1b`` (``Schedule1F1B``; Narayanan et al. 2021 figure 4): ``pp - r - 1`` warm-up forwards,
  then one forward / one backward, then the remaining backwards.
- ``interleaved-1f1b`` (``ScheduleInterleaved1F1B``) and ``interleaved-zero-bubble``
  (``ScheduleInterleavedZeroBubble``, the paper's ZB-H1 generalised to v chunks): rounds of
  ``mpr = m / max(1, m // pp)`` micro-batches walk the rank's chunks; warm-up
  ``(v - 1) mpr + k (pp - 1 - r)`` forwards (k = 2 for 1F1B, 1 for zero bubble); the zero-bubble
  variant splits each backward into I and W and, from rank r's ``r``-th steady step on, follows
  each I with the oldest pending W (weight gradients fill what would be bubbles).
- ``zbv-zero-bubble`` (``ScheduleZBVZeroBubble``, the paper's ZB-V, section 6).
- ``dualpipev`` (``ScheduleDualPipeV``, DeepSeek's DualPipe folded onto ``pp`` ranks): eight
  phases; its steady state pairs the forward of one chunk with the full backward of the other
  (``O`` actions), and the last ``pp`` backwards split into I and W.

Memory: torch's input-gradient pass keeps the autograd graph for the weight pass
(``torch/distributed/pipelining/_backward.py``, ``stage_backward_input`` calls
``autograd.grad(..., retain_graph=True)``), so a micro-batch's activations in a chunk are held
from its ``F`` until its ``W`` (or ``B``). The count a rank holds therefore follows from its
own order alone (:func:`peak_in_flight`), independent of timing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from functools import lru_cache

#: Schedules whose ranks each hold exactly two chunks in a V.
V_SHAPED = ("zbv-zero-bubble", "dualpipev")
#: Schedules that split a backward into input- and weight-gradient passes.
SPLIT_BACKWARD = ("interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev")
#: Every schedule this module orders.
ORDERED = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zero-bubble", "zbv-zero-bubble",
           "dualpipev")

Action = tuple  # (kind, stage, mb) or ("O", (f_stage, f_mb), (b_stage, b_mb))


def stage_rank(stage: int, pp: int, schedule: str) -> int:
    """The pipeline rank that runs global chunk ``stage`` under ``schedule`` (see module doc)."""
    if schedule in V_SHAPED:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def check_order_args(schedule: str, pp: int, m: int, v: int) -> None:
    """Raise ValueError unless ``schedule`` can be ordered for pp ranks, m micro-batches and v
    chunks per rank (torch's constructor rules: ZBV and DualPipeV need v = 2, DualPipeV
    m >= 2 pp, the looped schedules m a multiple of their rounds, GPipe and 1F1B v = 1)."""
    if schedule not in ORDERED:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; known: {ORDERED}")
    if pp < 1 or m < 1 or v < 1:
        raise ValueError("pipeline orders need pp >= 1, m >= 1 and v >= 1")
    if schedule in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"{schedule} runs one chunk per rank, not {v}")
    if schedule in V_SHAPED and v != 2:
        raise ValueError(f"{schedule} runs exactly two chunks per rank, not {v}")
    if schedule == "dualpipev" and m < 2 * pp:
        raise ValueError(f"dualpipev needs at least 2 pp = {2 * pp} micro-batches, not {m}")
    if schedule in ("interleaved-1f1b", "interleaved-zero-bubble") and m % max(1, m // pp):
        raise ValueError(f"{schedule} needs m a multiple of its rounds max(1, m // pp)")


def rank_orders(schedule: str, pp: int, m: int, v: int = 1) -> tuple[tuple[Action, ...], ...]:
    """Per pipeline rank, its compute actions in the order torch 2.13 issues them (cached).

    Args:
        schedule: a name of :data:`ORDERED`.
        pp: pipeline ranks; m: micro-batches per step; v: chunks per rank.

    Returns:
        ``pp`` tuples of actions (module docstring); idle slots are not actions.

    Raises:
        ValueError: the combination breaks a rule of :func:`check_order_args`.
    """
    check_order_args(schedule, pp, m, v)
    return _rank_orders(schedule, pp, m, v)


@lru_cache(maxsize=1024)
def _rank_orders(schedule: str, pp: int, m: int, v: int) -> tuple[tuple[Action, ...], ...]:
    make = _MAKERS[schedule]
    return tuple(tuple(make(schedule, pp, m, v, r)) for r in range(pp))


def _gpipe(_s: str, _pp: int, m: int, _v: int, r: int) -> list:
    return [("F", r, j) for j in range(m)] + [("B", r, j) for j in range(m)]


def _one_f_one_b(_s: str, pp: int, m: int, _v: int, r: int) -> list:
    warm = min(m, pp - r - 1)
    out = [("F", r, j) for j in range(warm)]
    f = warm
    for b in range(m):
        if f < m:
            out.append(("F", r, f))
            f += 1
        out.append(("B", r, b))
    return out


def _looped(schedule: str, pp: int, m: int, v: int, r: int) -> list:
    zb = schedule == "interleaved-zero-bubble"
    rounds = max(1, m // pp)
    per_round = m // rounds
    warm = min((v - 1) * per_round + (1 if zb else 2) * (pp - 1 - r), m * v)
    total = m * v

    def f_stage(step: int) -> int:
        return (step // per_round) % v * pp + r

    def b_stage(step: int) -> int:
        return (v - 1 - ((step - warm) // per_round) % v) * pp + r

    # next micro-batch per global chunk, for forwards, backwards and weight passes
    nf, nb, nw = [0] * (pp * v), [0] * (pp * v), [0] * (pp * v)
    out, b_steps, w_done = [], [], 0
    back = "I" if zb else "B"
    for step in range(total + warm):
        if step < total:
            stage = f_stage(step)
            out.append(("F", stage, nf[stage]))
            nf[stage] += 1
        if step >= warm:
            stage = b_stage(step)
            out.append((back, stage, nb[stage]))
            nb[stage] += 1
            b_steps.append(step)
            if zb and step - warm >= r:  # rank r delays its weight passes by r steps
                stage = b_stage(b_steps[w_done])
                out.append(("W", stage, nw[stage]))
                nw[stage] += 1
                w_done += 1
    while zb and w_done < len(b_steps):
        stage = b_stage(b_steps[w_done])
        out.append(("W", stage, nw[stage]))
        nw[stage] += 1
        w_done += 1
    return out


def _zbv(_s: str, pp: int, m: int, _v: int, r: int) -> list:
    # orders n = max(2 pp - 1, m) micro-batches (enough to fill the V), then drops those >= m
    n = max(2 * pp - 1, m)
    c0, c1 = r, 2 * pp - 1 - r
    cnt = {"F0": 0, "F1": 0, "B0": 0, "B1": 0}
    out = []

    def step(kind: str, chunk: int, key: str) -> None:
        out.append((kind, c0 if chunk == 0 else c1, cnt[key]))
        if kind != "I":
            cnt[key] += 1

    for _ in range(2 * (pp - r) - 1):
        step("F", 0, "F0")
    for _ in range(r):
        step("F", 1, "F1")
        step("F", 0, "F0")
    for _ in range(pp - r):
        step("F", 1, "F1")
        step("I", 1, "B1")
        step("W", 1, "B1")
    while cnt["F1"] < cnt["F0"] or cnt["F0"] < n:
        if cnt["F0"] < n:
            step("F", 0, "F0")
        step("I", 0, "B0")
        step("W", 0, "B0")
        step("F", 1, "F1")
        step("I", 1, "B1")
        step("W", 1, "B1")
    w0, w1 = cnt["B0"], cnt["B1"]
    for _ in range(r):
        out.append(("I", c0, cnt["B0"]))
        cnt["B0"] += 1
        out.append(("I", c1, cnt["B1"]))
        cnt["B1"] += 1
    for _ in range(pp - r):
        out.append(("I", c0, cnt["B0"]))
        cnt["B0"] += 1
        out.append(("W", c0, w0))
        w0 += 1
    out += [("W", c1, j) for j in range(w1, cnt["B1"])]
    out += [("W", c0, j) for j in range(w0, cnt["B0"])]
    return [a for a in out if a[2] < m]


def _dualpipev(_s: str, pp: int, m: int, _v: int, r: int) -> list:
    c0, c1 = r, 2 * pp - 1 - r
    nxt: dict[tuple, int] = {}
    pending: deque = deque()  # weight passes owed, oldest first
    out: list = []

    def take(key: tuple) -> int:
        j = nxt.get(key, 0)
        nxt[key] = j + 1
        return j

    def single(stage: int, kind: str) -> None:
        j = take((stage, "F" if kind == "F" else "B"))
        out.append((kind, stage, j))
        if kind == "I":
            pending.append((stage, j))

    def pair(f_stage: int, b_stage: int) -> None:
        out.append(("O", (f_stage, take((f_stage, "F"))), (b_stage, take((b_stage, "B")))))

    def weight() -> None:
        if pending:
            stage, j = pending.popleft()
            out.append(("W", stage, j))

    for _ in range(2 * (pp - r - 1)):                 # 1: F0
        single(c0, "F")
    for _ in range(r + 1):                            # 2: F0 F1
        single(c0, "F")
        single(c1, "F")
    for _ in range(pp - r - 1):                       # 3: I1 W1 F1
        single(c1, "I")
        weight()
        single(c1, "F")
    for i in range(m - 2 * pp + r + 1):               # 4: (F0 B1) (F1 B0)
        if i == 0 and r == pp - 1:                    # not overlapped: a shorter bubble
            single(c0, "F")
            single(c1, "B")
        else:
            pair(c0, c1)
        pair(c1, c0)
    for _ in range(pp - r - 1):                       # 5: B1 (F1 B0)
        single(c1, "B")
        pair(c1, c0)
    split = False
    for i in range(r + 1):                            # 6: B1 B0, the second half split
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        single(c1, "I" if split else "B")
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        single(c0, "I" if split else "B")
    for _ in range(pp - r - 1):                       # 7: W0 B0
        weight()
        single(c0, "I" if split else "B")
    for _ in range(r + 1):                            # 8: W0
        weight()
    return out


def rank_peak_in_flight(schedule: str, pp: int, m: int, v: int, rank: int) -> int:
    """:func:`peak_in_flight` of rank ``rank``'s order for ``m`` micro-batches (cached; builds
    that rank's order only, for a shorter step with the same warm-up when there is one: the
    peak is reached before the steady state repeats. Checked equal to the full order for
    pp 2-8, v 1-4 and every accepted m < 160).

    Raises:
        ValueError: the combination breaks a rule of :func:`check_order_args`.
    """
    check_order_args(schedule, pp, m, v)
    if schedule in V_SHAPED:
        m = min(m, 3 * pp)
    elif schedule in ("interleaved-1f1b", "interleaved-zero-bubble"):
        rounds = max(1, m // pp)
        per_round = m // rounds
        m = next((k * per_round for k in range(3, rounds) if k * per_round // pp == k), m)
    return _rank_peak(schedule, pp, m, v, rank)


@lru_cache(maxsize=8192)
def _rank_peak(schedule: str, pp: int, m: int, v: int, rank: int) -> int:
    return peak_in_flight(tuple(_MAKERS[schedule](schedule, pp, m, v, rank)))


_MAKERS = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved-1f1b": _looped,
           "interleaved-zero-bubble": _looped, "zbv-zero-bubble": _zbv, "dualpipev": _dualpipev}


def peak_in_flight(order: tuple[Action, ...]) -> int:
    """Most chunk-micro-batches a rank holds activations for along ``order``: +1 at each
    forward, -1 at each weight pass or full backward (an input-gradient pass frees nothing,
    see the module docstring); an ``O`` pair counts its forward before its backward."""
    held = peak = 0
    for a in order:
        kinds = ("F", "B") if a[0] == "O" else (a[0],)
        for k in kinds:
            if k == "F":
                held += 1
                peak = max(peak, held)
            elif k in ("B", "W"):
                held -= 1
    return peak


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
    order = _MAKERS[schedule](schedule, pp, m, v, rank)
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
    order = _MAKERS[schedule](schedule, pp, m, v, rank)
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


def replay(orders: tuple[tuple[Action, ...], ...], num_stages: int, schedule: str,
           fwd: tuple[float, ...], inp: tuple[float, ...], wgt: tuple[float, ...],
           overlap: tuple[float, ...] | None = None, events: list | None = None
           ) -> tuple[float, tuple[float, ...]]:
    """Time one step: each rank runs its actions in order, each starting when the rank is free
    and its input is ready.

    Dependencies (those torch's schedules wait for with p2p receives): ``F`` of chunk s after
    ``F`` of chunk s - 1 on the same micro-batch; ``I``/``B`` of chunk s after ``I``/``B`` of
    chunk s + 1 (the last chunk: after its own ``F``); ``W`` after its ``I`` (same rank, earlier
    in the order). Communication time is inside the per-chunk durations, as the cost model
    charges it.

    Args:
        orders: from :func:`rank_orders`; num_stages: chunks in total (pp * v).
        schedule: for the chunk-to-rank map (:func:`stage_rank`).
        fwd, inp, wgt: per rank, seconds of one micro-batch's forward, input-gradient and
            weight-gradient pass through ONE chunk (a full backward takes ``inp + wgt``).
        overlap: per rank, seconds an ``O`` pair saves by running its two halves at once
            (communication of one hidden behind the other's compute); None = 0.
        events: when a list, receives ``(rank, kind, start_s, duration_s, stage, mb)`` per
            action run (an ``O`` pair as its ``F`` and ``B``, or as one ``O`` when overlapped).

    Returns:
        (step seconds, per rank the seconds it is busy).

    Raises:
        RuntimeError: the orders deadlock (not for orders from :func:`rank_orders`).
    """
    p = len(orders)
    done_f: dict[tuple[int, int], float] = {}
    done_b: dict[tuple[int, int], float] = {}
    pos, free, busy = [0] * p, [0.0] * p, [0.0] * p
    last = num_stages - 1

    def ready(kind: str, s: int, j: int) -> float | None:
        if kind == "F":
            return 0.0 if s == 0 else done_f.get((s - 1, j))
        if kind in ("I", "B"):
            return done_f.get((s, j)) if s == last else done_b.get((s + 1, j))
        return 0.0

    todo, queued = deque(range(p)), [True] * p
    while todo:
        r = todo.popleft()
        queued[r] = False
        moved = False
        while pos[r] < len(orders[r]):
            a = orders[r][pos[r]]
            if a[0] == "O":
                (fs, fj), (bs, bj) = a[1], a[2]
                t1, t2 = ready("F", fs, fj), ready("B", bs, bj)
                if t1 is None or t2 is None:
                    break
                hidden = overlap[r] if overlap else 0.0
                dur = fwd[r] + inp[r] + wgt[r] - hidden
                if hidden > 0:  # both halves run together and finish together
                    end = max(free[r], t1, t2) + dur
                    done_f[(fs, fj)] = end
                    if events is not None:
                        events.append((r, "O", end - dur, dur, fs, fj))
                else:  # torch runs the sub-actions one after the other, forward first
                    f_end = max(free[r], t1) + fwd[r]
                    done_f[(fs, fj)] = f_end
                    end = max(f_end, t2) + inp[r] + wgt[r]
                    if events is not None:
                        events.append((r, "F", f_end - fwd[r], fwd[r], fs, fj))
                        events.append((r, "B", end - inp[r] - wgt[r], inp[r] + wgt[r], bs, bj))
                done_b[(bs, bj)] = end
            else:
                kind, s, j = a
                t = ready(kind, s, j)
                if t is None:
                    break
                dur = {"F": fwd[r], "I": inp[r], "W": wgt[r], "B": inp[r] + wgt[r]}[kind]
                end = max(free[r], t) + dur
                if kind == "F":
                    done_f[(s, j)] = end
                elif kind != "W":
                    done_b[(s, j)] = end
                if events is not None:
                    events.append((r, kind, end - dur, dur, s, j))
            busy[r] += dur
            free[r] = end
            pos[r] += 1
            moved = True
        if moved:
            for k in range(p):  # V-shaped chunks talk to ranks other than neighbours
                if k != r and not queued[k] and pos[k] < len(orders[k]):
                    todo.append(k)
                    queued[k] = True
    if any(pos[r] < len(orders[r]) for r in range(p)):
        raise RuntimeError(f"pipeline replay of {schedule} deadlocked (a bug in autopar)")
    return max(free), tuple(busy)
