"""Fast timing of pipeline action orders: the orders compiled once into a flat dependency list.

Which action waits for which (:func:`autopar.cost.pipeline.replay.replay`'s rules, and
:func:`autopar.cost.pipeline.schedule.simulate_pipeline`'s) depends only on the orders, never on the
durations: the event replay discovers the same topological order for any times. So the orders of a
``(schedule, pp, m, v)`` are compiled once (cached) into a list of slots, each finishing at
``max(end of its predecessors) + duration``, in an order where every predecessor comes first;
timing a step is then one pass over that list. Every slot does the same floating-point
operations, in the same order, as the event replay (``max`` then one addition; an ``O`` pair run
one half after the other adds its backward's two passes one at a time, as the replay does), so
the result is bitwise the replay's (tests/test_timed_orders.py checks equality, not closeness).
Source: the replay itself (:mod:`autopar.cost.pipeline.orders`); this module only reorders
its work.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

from .orders import rank_orders

#: Slot 0 always holds 0.0 (an input ready at the start); slot 1 holds -inf (no predecessor).
_ZERO, _NONE = 0, 1

# the special op of a replay (a plain op's duration index is >= 0): a DualPipeV
# forward-backward pair
_O = -2


def _compile(orders: tuple, num_stages: int, m: int, gpipe_sim: bool) -> tuple:
    """(ops, last slot per rank, special ops) for ``orders`` of ``m`` micro-batches over ``num_stages``
    chunks.

    Slots are numbered in the order the ops are listed (0 and 1 are the constants above); an
    ``O`` pair fills two slots (its forward's end, then its backward's). A plain op is
    ``(free, dep, d)``: it ends at ``max(slot free, slot dep) + durations[d]`` with ``d = kind *
    pp + rank`` over the kinds F, I, W, B. A special op is ``(free, dep, -1 - k)`` with
    ``special[k] = (code, dep2, rank)``.
    ``gpipe_sim``: the 1F1B/GPipe simulation's rules (a backward also waits for its own
    forward): every op is then ``(free, dep, own, d)``, ``own`` the slot of a backward's own
    forward (``_NONE`` for a forward), a backward's ``d`` its input-gradient duration, and
    special ops is None (the simulation's backward is one pass).

    Each rank's actions are taken in order while their inputs exist; a rank that waits is
    woken when the slot it waits for is written (work linear in the number of actions).

    Raises:
        RuntimeError: the orders deadlock.
    """
    p = len(orders)
    last = num_stages - 1
    n_keys = num_stages * m
    slot_of = [-1] * (2 * n_keys)  # forward ends at s * m + j, backward ends at n_keys + s * m + j
    waiting: dict[int, list[int]] = {}
    pos, free = [0] * p, [_ZERO] * p
    ops: list[tuple] = []
    special: list[tuple] = []
    slots = 2
    todo = deque(range(p))
    code_of = {"F": 0, "I": p, "W": 2 * p, "B": 3 * p}

    def need(kind: str, s: int, j: int) -> int:
        """Index in ``slot_of`` of what an action waits for; -1: ready at the start."""
        if kind == "F":
            return -1 if s == 0 else (s - 1) * m + j
        if kind == "W":
            return -1
        return s * m + j if s == last else n_keys + (s + 1) * m + j

    def wrote(key: int, slot: int) -> None:
        slot_of[key] = slot
        if key in waiting:
            todo.extend(waiting.pop(key))

    while todo:
        r = todo.popleft()
        order = orders[r]
        i, n, fr = pos[r], len(order), free[r]
        while i < n:
            kind, s, j = order[i]   # an O pair: s and j are its (stage, mb) halves
            if kind == "O":
                (fs, fj), (bs, bj) = s, j
                k1, k2 = need("F", fs, fj), need("B", bs, bj)
                d1 = _ZERO if k1 < 0 else slot_of[k1]
                if d1 < 0:
                    waiting.setdefault(k1, []).append(r)
                    break
                d2 = _ZERO if k2 < 0 else slot_of[k2]
                if d2 < 0:
                    waiting.setdefault(k2, []).append(r)
                    break
                ops.append((fr, d1, -1 - len(special)))
                special.append((_O, d2, r))
                wrote(fs * m + fj, slots)
                wrote(n_keys + bs * m + bj, slots + 1)
                slots += 2
                fr = slots - 1
                i += 1
                continue
            if kind == "F":
                k = (s - 1) * m + j if s else -1
            elif kind == "W":
                k = -1
            else:
                k = s * m + j if s == last else n_keys + (s + 1) * m + j
            if k < 0:
                dep = _ZERO
            else:
                dep = slot_of[k]
                if dep < 0:
                    waiting.setdefault(k, []).append(r)
                    break
            if gpipe_sim:   # (free, dep, own forward's slot or _NONE, duration index)
                ops.append((fr, dep, slot_of[s * m + j] if kind == "B" else _NONE,
                            code_of["I" if kind == "B" else kind] + r))
            else:
                ops.append((fr, dep, code_of[kind] + r))
            if kind != "W":
                key = s * m + j if kind == "F" else n_keys + s * m + j
                slot_of[key] = slots
                if key in waiting:
                    todo.extend(waiting.pop(key))
            fr = slots
            slots += 1
            i += 1
        pos[r], free[r] = i, fr
    if any(pos[r] < len(orders[r]) for r in range(p)):
        raise RuntimeError("pipeline replay deadlocked (a bug in autopar)")
    return tuple(ops), tuple(free), None if gpipe_sim else tuple(special)


@lru_cache(maxsize=512)
def compiled_orders(schedule: str, pp: int, m: int, v: int) -> tuple:
    """The compiled :func:`~autopar.cost.pipeline.orders.rank_orders` of a schedule (cached).

    Raises:
        ValueError: the combination breaks a rule of
            :func:`~autopar.cost.pipeline.orders.check_order_args`.
    """
    return _compile(rank_orders(schedule, pp, m, v), pp * v, m, False)


@lru_cache(maxsize=512)
def compiled_simulation(schedule: str, pp: int, m: int) -> tuple:
    """The compiled order of :func:`autopar.cost.pipeline.schedule.simulate_pipeline` (one chunk per
    rank; a backward waits for the next rank's backward, or on the last rank for its own
    forward, and for its own forward) (cached).

    Raises:
        ValueError: ``schedule`` is not "1f1b" or "gpipe", or pp, m < 1.
    """
    if schedule not in ("1f1b", "gpipe"):
        raise ValueError(f"simulate_pipeline runs 1f1b or gpipe, not {schedule!r}")
    return _compile(rank_orders(schedule, pp, m, 1), pp, m, True)


def timed_step(plan: tuple, fwd, inp, wgt, overlap=None) -> float:
    """Step seconds of a compiled order (:func:`compiled_orders`): bitwise
    :func:`~autopar.cost.pipeline.replay.replay`'s first result for the same durations.

    Args:
        plan: from :func:`compiled_orders` or :func:`compiled_simulation`.
        fwd, inp, wgt: per rank, seconds of one chunk's forward, input-gradient and
            weight-gradient pass (a full backward ``inp + wgt``; for a compiled simulation pass
            the backward as ``inp`` and zeros as ``wgt``).
        overlap: per rank, seconds an ``O`` pair hides (None = 0).
    """
    ops, last, special = plan
    durs = [*fwd, *inp, *wgt, *(i + w for i, w in zip(inp, wgt))]
    end = [0.0, float("-inf")]
    put = end.append
    if special is None:   # a compiled simulation: a backward also waits for its own forward
        for a, b, c, d in ops:
            x, y = end[a], end[b]
            if c == _NONE:
                put((x if x >= y else y) + durs[d])
            else:   # max(x, y, end[c]) as the builtin takes it: a later item only if greater
                if y > x:
                    x = y
                y = end[c]
                put((y if y > x else x) + durs[d])
        return max(end[s] for s in last)
    if not special:   # plain ops only (no DualPipeV pair): the loop without its branch
        for a, b, d in ops:
            x, y = end[a], end[b]
            put((x if x >= y else y) + durs[d])
        return max(end[s] for s in last)
    for a, b, d in ops:
        x, y = end[a], end[b]
        if d >= 0:  # max(x, y) + duration, as the replay computes it (x on a tie)
            put((x if x >= y else y) + durs[d])
            continue
        _code, c, r = special[-1 - d]   # an O pair (the only special op of a replay)
        hidden = overlap[r] if overlap else 0.0
        if hidden > 0:
            e = max(x, y, end[c]) + (fwd[r] + inp[r] + wgt[r] - hidden)
            put(e)
            put(e)
        else:
            f_end = max(x, y) + fwd[r]
            put(f_end)
            put(max(f_end, end[c]) + inp[r] + wgt[r])
    return max(end[s] for s in last)
