"""Fast timing of pipeline action orders: the orders compiled once into a flat dependency list.

Which action waits for which (:func:`autopar.cost.pipeline_orders.replay`'s rules, and
:func:`autopar.cost.schedule.simulate_pipeline`'s) depends only on the orders, never on the
durations: the event replay discovers the same topological order for any times. So the orders of a
``(schedule, pp, m, v)`` are compiled once (cached) into a list of slots, each finishing at
``max(end of its predecessors) + duration``, in an order where every predecessor comes first;
timing a step is then one pass over that list. Every slot does the same floating-point
operations, in the same order, as the event replay (``max`` then one addition; an ``O`` pair run
one half after the other adds its backward's two passes one at a time, as the replay does), so
the result is bitwise the replay's (tests/test_timed_orders.py checks equality, not closeness).
Source: the replay itself (:mod:`autopar.cost.pipeline_orders`); this module only reorders
its work.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

from .pipeline_orders import rank_orders

#: Slot 0 always holds 0.0 (an input ready at the start); slot 1 holds -inf (no predecessor).
_ZERO, _NONE = 0, 1

# special ops (a plain op's duration index is >= 0): a simulated backward that also waits for
# its own forward, and a DualPipeV forward-backward pair
_SB, _O = -1, -2


def _compile(orders: tuple, num_stages: int, gpipe_sim: bool) -> tuple:
    """(ops, last slot per rank, rank of each special op) for ``orders``.

    Slots are numbered in the order the ops are listed (0 and 1 are the constants above); an
    ``O`` pair fills two slots (its forward's end, then its backward's). A plain op is
    ``(free, dep, d)``: it ends at ``max(slot free, slot dep) + durations[d]`` with ``d = kind *
    pp + rank`` over the kinds F, I, W, B. A special op is ``(free, dep, code, dep2, rank)``.
    ``gpipe_sim``: the 1F1B/GPipe simulation's rules (a backward also waits for its own forward).

    Each rank's actions are taken in order while their inputs exist; a rank that waits is
    woken when the slot it waits for is written (work linear in the number of actions).

    Raises:
        RuntimeError: the orders deadlock.
    """
    p = len(orders)
    last = num_stages - 1
    slot_of: dict[tuple, int] = {}
    waiting: dict[tuple, list[int]] = {}
    pos, free = [0] * p, [_ZERO] * p
    ops: list[tuple] = []
    slots = 2
    todo = deque(range(p))

    def need(kind: str, s: int, j: int):
        """The key of the slot an action waits for, or None (ready at the start)."""
        if kind == "F":
            return None if s == 0 else ("F", s - 1, j)
        if kind in ("I", "B"):
            return ("F", s, j) if s == last else ("B", s + 1, j)
        return None

    def wrote(key: tuple, slot: int) -> None:
        slot_of[key] = slot
        for k in waiting.pop(key, ()):
            todo.append(k)

    while todo:
        r = todo.popleft()
        order = orders[r]
        while pos[r] < len(order):
            a = order[pos[r]]
            if a[0] == "O":
                (fs, fj), (bs, bj) = a[1], a[2]
                keys = (need("F", fs, fj), need("B", bs, bj))
            else:
                keys = (need(a[0], a[1], a[2]),)
            missing = next((k for k in keys if k is not None and k not in slot_of), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(r)
                break
            deps = [_ZERO if k is None else slot_of[k] for k in keys]
            if a[0] == "O":
                ops.append((free[r], deps[0], _O, deps[1], r))
                wrote(("F", fs, fj), slots)
                wrote(("B", bs, bj), slots + 1)
                slots += 2
                free[r] = slots - 1
            else:
                kind, s, j = a
                if gpipe_sim and kind == "B":
                    ops.append((free[r], deps[0], _SB, slot_of[("F", s, j)], r))
                else:
                    ops.append((free[r], deps[0], "FIWB".index(kind) * p + r))
                if kind == "F":
                    wrote(("F", s, j), slots)
                elif kind != "W":
                    wrote(("B", s, j), slots)
                free[r] = slots
                slots += 1
            pos[r] += 1
    if any(pos[r] < len(orders[r]) for r in range(p)):
        raise RuntimeError("pipeline replay deadlocked (a bug in autopar)")
    return tuple(ops), tuple(free)


@lru_cache(maxsize=512)
def compiled_orders(schedule: str, pp: int, m: int, v: int) -> tuple:
    """The compiled :func:`~autopar.cost.pipeline_orders.rank_orders` of a schedule (cached).

    Raises:
        ValueError: the combination breaks a rule of
            :func:`~autopar.cost.pipeline_orders.check_order_args`.
    """
    return _compile(rank_orders(schedule, pp, m, v), pp * v, False)


@lru_cache(maxsize=512)
def compiled_simulation(schedule: str, pp: int, m: int) -> tuple:
    """The compiled order of :func:`autopar.cost.schedule.simulate_pipeline` (one chunk per
    rank; a backward waits for the next rank's backward, or on the last rank for its own
    forward, and for its own forward) (cached).

    Raises:
        ValueError: ``schedule`` is not "1f1b" or "gpipe", or pp, m < 1.
    """
    if schedule not in ("1f1b", "gpipe"):
        raise ValueError(f"simulate_pipeline runs 1f1b or gpipe, not {schedule!r}")
    return _compile(rank_orders(schedule, pp, m, 1), pp, True)


def timed_step(plan: tuple, fwd, inp, wgt, overlap=None) -> float:
    """Step seconds of a compiled order (:func:`compiled_orders`): bitwise
    :func:`~autopar.cost.pipeline_orders.replay`'s first result for the same durations.

    Args:
        plan: from :func:`compiled_orders` or :func:`compiled_simulation`.
        fwd, inp, wgt: per rank, seconds of one chunk's forward, input-gradient and
            weight-gradient pass (a full backward ``inp + wgt``; for a compiled simulation pass
            the backward as ``inp`` and zeros as ``wgt``).
        overlap: per rank, seconds an ``O`` pair hides (None = 0).
    """
    ops, last = plan
    durs = [*fwd, *inp, *wgt, *(i + w for i, w in zip(inp, wgt))]
    end = [0.0, float("-inf")]
    put = end.append
    for op in ops:
        x, y = end[op[0]], end[op[1]]
        d = op[2]
        if d >= 0:  # max(x, y) + duration, as the replay computes it (x on a tie)
            put((x if x >= y else y) + durs[d])
        elif d == _SB:
            r = op[4]
            put(max(x, y, end[op[3]]) + inp[r])
        else:
            r = op[4]
            hidden = overlap[r] if overlap else 0.0
            if hidden > 0:
                e = max(x, y, end[op[3]]) + (fwd[r] + inp[r] + wgt[r] - hidden)
                put(e)
                put(e)
            else:
                f_end = max(x, y) + fwd[r]
                put(f_end)
                put(max(f_end, end[op[3]]) + inp[r] + wgt[r])
    return max(end[s] for s in last)
