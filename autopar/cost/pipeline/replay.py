"""A timed replay of the per-rank orders of :mod:`autopar.cost.pipeline.orders`: a step's
duration and each rank's busy seconds, with every action starting when its rank is free and
its input is ready (the reference the compiled replay of :mod:`.timed_orders` is checked
against)."""

from __future__ import annotations

from collections import deque

from .orders import Action

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
