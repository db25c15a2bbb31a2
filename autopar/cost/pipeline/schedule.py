"""Pipeline schedules: step time of m micro-batches over p ranks with v chunks each.

Narayanan et al. 2021, section 2.2: for uniform stages of time t per micro-batch (forward +
backward), 1F1B and GPipe take (m + p - 1) t and interleaved 1F1B (m + (p - 1) / v) t; the bubble is
(p - 1) / (v m) of the ideal m t, i.e. (p - 1) / (v m + p - 1) of the total. For non-uniform stages
the slowest stage paces the steady state and the others fill the warm-up and cool-down:
``T = m * max_i t_i + (sum_i t_i - max_i t_i) / v``, which reduces to the uniform formula.

The schedules that split backward into input- and weight-gradient passes (interleaved zero
bubble, ZBV zero bubble, DualPipeV) have no closed form for arbitrary pass times: their step is
the timed replay of torch's own action order (:mod:`autopar.cost.pipeline.orders`). With equal
forward, input- and weight-gradient times per chunk the replay gives the published bubbles
(tests/test_schedules.py): ZB-H1 ``(p - 1)(F + B - 2W)`` (Qi et al. 2023, arXiv 2401.10241;
DeepSeek-V3 report, arXiv 2412.19437, table 2) and, with DualPipeV's forward-backward pairs run
as one, ``(p - 1)(F&B + B - 3W)`` (DeepSeek-V3 table 2, on ``p`` ranks holding ``2p`` chunks).
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

from .orders import SPLIT_BACKWARD, check_order_args
from .timed_orders import compiled_orders, compiled_simulation, timed_step


def pipeline_time(stage_times: list[float] | tuple[float, ...], num_micro_batches: int,
                  virtual_stages: int = 1) -> tuple[float, float]:
    """(step seconds, bubble seconds) of a pipelined step.

    Args:
        stage_times: per pipeline rank, seconds for one micro-batch forward + backward.
        num_micro_batches: m >= 1.
        virtual_stages: v >= 1 chunks per rank (interleaved 1F1B).

    Raises:
        ValueError: empty stage list, m < 1 or v < 1.
    """
    if not stage_times or num_micro_batches < 1 or virtual_stages < 1:
        raise ValueError("pipeline_time needs stages, m >= 1 and v >= 1")
    t_max = max(stage_times)
    total = num_micro_batches * t_max + (sum(stage_times) - t_max) / virtual_stages
    return total, total - num_micro_batches * t_max


def bubble_fraction(pp: int, num_micro_batches: int, virtual_stages: int = 1) -> float:
    """Share of a uniform pipeline's step spent idle: (p - 1) / (v m + p - 1)."""
    return (pp - 1) / (virtual_stages * num_micro_batches + pp - 1)


def simulate_pipeline(fwd: list[float] | tuple[float, ...], bwd: list[float] | tuple[float, ...],
                      num_micro_batches: int, schedule: str = "1f1b") -> float:
    """Event simulation of one step of a (possibly non-uniform) pipeline; returns seconds.

    Each rank runs its operations in schedule order, each starting when the rank is free and its
    input is ready: forward of micro-batch j on rank i after forward j on rank i - 1, backward j on
    rank i after backward j on rank i + 1. 1F1B: rank i runs min(m, p - i - 1) warm-up forwards,
    then alternates one forward and one backward, then drains backwards (Narayanan et al. 2021,
    Figure 4); GPipe: all forwards, then all backwards.

    Args:
        fwd, bwd: per rank, seconds of one micro-batch's forward / backward.
        num_micro_batches: m >= 1.
        schedule: "1f1b" or "gpipe".

    Raises:
        ValueError: mismatched lengths, m < 1 or an unknown schedule.
    """
    p, m = len(fwd), num_micro_batches
    if p == 0 or len(bwd) != p or m < 1 or schedule not in ("1f1b", "gpipe"):
        raise ValueError("simulate_pipeline needs equal-length fwd/bwd, m >= 1, 1f1b or gpipe")
    orders = []
    for i in range(p):
        if schedule == "gpipe":
            orders.append([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
            continue
        warm = min(m, p - i - 1)
        seq = [("F", j) for j in range(warm)]
        f_next, b_next = warm, 0
        while b_next < m:
            if f_next < m:
                seq.append(("F", f_next))
                f_next += 1
            seq.append(("B", b_next))
            b_next += 1
        orders.append(seq)
    done_f = [[-1.0] * m for _ in range(p)]
    done_b = [[-1.0] * m for _ in range(p)]
    pos = [0] * p
    free = [0.0] * p
    todo = deque(range(p))
    queued = [True] * p
    while todo:  # a rank is revisited only when a neighbour finished something
        i = todo.popleft()
        queued[i] = False
        advanced = False
        while pos[i] < len(orders[i]):
            kind, j = orders[i][pos[i]]
            if kind == "F":
                ready = done_f[i - 1][j] if i > 0 else 0.0
                if ready < 0:
                    break
                end = max(free[i], ready) + fwd[i]
                done_f[i][j] = end
            else:
                ready = done_b[i + 1][j] if i < p - 1 else done_f[i][j]
                if ready < 0:
                    break
                end = max(free[i], ready, done_f[i][j]) + bwd[i]
                done_b[i][j] = end
            free[i] = end
            pos[i] += 1
            advanced = True
        if advanced:
            for k in (i - 1, i + 1):
                if 0 <= k < p and not queued[k]:
                    todo.append(k)
                    queued[k] = True
    if any(pos[i] < len(orders[i]) for i in range(p)):
        raise RuntimeError("pipeline simulation deadlocked")  # not for valid schedules
    return max(free)


def pipeline_step_time(fwd: list[float] | tuple[float, ...], bwd: list[float] | tuple[float, ...],
                       num_micro_batches: int, virtual_stages: int = 1,
                       schedule: str = "1f1b", wgrad: list[float] | tuple[float, ...] | None = None,
                       overlap: tuple[float, ...] | None = None) -> tuple[float, float]:
    """(step seconds, bubble seconds) for per-rank forward/backward times.

    Uniform stages and interleaved schedules use the closed form (:func:`pipeline_time`);
    non-uniform 1F1B/GPipe pipelines are simulated (:func:`simulate_pipeline`) for the first
    ``m0 = min(m, 4p)`` (2p beyond 16 ranks) micro-batches, after which the slowest rank is saturated and each further
    micro-batch adds exactly its time (extrapolation error < 1.5% in tests against a full run).
    The split-backward schedules (:data:`~autopar.cost.pipeline.orders.SPLIT_BACKWARD`) replay
    torch's order (:func:`split_backward_step_time`).

    Args:
        fwd, bwd: per rank, seconds of one micro-batch's forward / backward over all its chunks.
        num_micro_batches: m >= 1; virtual_stages: chunks per rank.
        schedule: a name of :data:`autopar.config.SCHEDULES`.
        wgrad: per rank, the weight-gradient part of ``bwd`` (seconds); needed by the
            split-backward schedules (None = no separable part).
        overlap: per rank, seconds a DualPipeV forward-backward pair hides (None = none).

    Raises:
        ValueError: the schedule cannot order these counts (see
            :func:`~autopar.cost.pipeline.orders.check_order_args`).
    """
    if schedule in SPLIT_BACKWARD and len(fwd) > 1:
        return split_backward_step_time(fwd, bwd, wgrad or (0.0,) * len(fwd), num_micro_batches,
                                        virtual_stages, schedule, overlap)
    totals = [f + b for f, b in zip(fwd, bwd)]
    t_max = max(totals)
    m = num_micro_batches
    p = len(totals)
    uniform = max(totals) - min(totals) <= 1e-9 * t_max
    if p == 1 or uniform or virtual_stages > 1 or schedule == "interleaved-1f1b":
        return pipeline_time(totals, m, virtual_stages)
    m0 = min(m, 4 * p if p <= 16 else 2 * p)  # deep pipelines: fewer warm-up micro-batches
    total = _simulate(tuple(fwd), tuple(bwd), m0, schedule) + (m - m0) * t_max
    return total, total - m * t_max


@lru_cache(maxsize=4096)
def _simulate(fwd: tuple[float, ...], bwd: tuple[float, ...], m: int, schedule: str) -> float:
    """Memoised :func:`simulate_pipeline` (configurations differing only in ZeRO stage or DP
    placement share their pipeline), run from its compiled order
    (:func:`~autopar.cost.pipeline.timed_orders.timed_step`: bitwise the same seconds, tested)."""
    return timed_step(compiled_simulation(schedule, len(fwd), m), fwd, bwd, (0.0,) * len(fwd))


def replay_micro_batches(schedule: str, pp: int, m: int, v: int) -> int:
    """Micro-batches the replay of a long step runs before extrapolating: ``m`` itself up to
    ``3 pp`` (warm-up, one steady round and cool-down; the slowest rank is then saturated and
    each further micro-batch adds its own time: worst error 0.43% against a full replay over
    150 random non-uniform pipelines, pp 2-16, v 1-4, m 4-10 pp), else the smallest count from
    there up that the schedule accepts (:func:`~autopar.cost.pipeline.orders.
    check_order_args`)."""
    cap = 3 * pp
    if m <= cap:
        return m
    for m0 in range(cap, m):
        try:
            check_order_args(schedule, pp, m0, v)
            return m0
        except ValueError:
            continue
    return m


def split_backward_step_time(fwd, bwd, wgrad, num_micro_batches: int, virtual_stages: int,
                             schedule: str, overlap: tuple[float, ...] | None = None
                             ) -> tuple[float, float]:
    """(step seconds, bubble seconds) of a schedule run from torch's action order.

    Each rank's per-micro-batch times are split evenly over its ``v`` chunks; a chunk's
    forward takes ``fwd / v``, its input-gradient pass ``(bwd - wgrad) / v`` and its weight pass
    ``wgrad / v`` (a full backward both). The first ``m0`` micro-batches
    (:func:`replay_micro_batches`) are replayed (:func:`~autopar.cost.pipeline.replay.replay`),
    each further one adds the slowest rank's per-micro-batch time. Bubble = step - m x that time.
    With ``overlap`` (seconds each DualPipeV forward-backward pair hides), a rank's
    per-micro-batch time is ``t - v x overlap`` (its ``v`` forwards and ``v`` backwards form ``v``
    pairs in the steady state).

    Raises:
        ValueError: the schedule cannot order these counts.
    """
    p, m, v = len(fwd), num_micro_batches, virtual_stages
    check_order_args(schedule, p, m, v)
    hidden = overlap or (0.0,) * p
    t_max = max(f + b - v * h for f, b, h in zip(fwd, bwd, hidden))
    m0 = replay_micro_batches(schedule, p, m, v)
    w = tuple(min(max(x, 0.0), b) for x, b in zip(wgrad, bwd))
    t0 = _replay(schedule, p, m0, v, tuple(f / v for f in fwd),
                 tuple((b - x) / v for b, x in zip(bwd, w)), tuple(x / v for x in w),
                 None if overlap is None else tuple(overlap))
    total = t0 + (m - m0) * t_max
    return total, total - m * t_max


@lru_cache(maxsize=4096)
def _replay(schedule: str, p: int, m: int, v: int, fwd: tuple, inp: tuple, wgt: tuple,
            overlap: tuple | None) -> float:
    """Memoised replay (configurations differing only in ZeRO stage or DP placement share
    their pipeline), run from its compiled order (:func:`~autopar.cost.pipeline.timed_orders.timed_step`:
    bitwise :func:`~autopar.cost.pipeline.replay.replay`'s seconds, tested)."""
    return timed_step(compiled_orders(schedule, p, m, v), fwd, inp, wgt, overlap)
