"""Microbenchmarks of ``autopar calibrate``: GEMMs, attention, a copy, collectives.

Each runs on every rank at once (as training does); a figure is the median over repetitions of
one call, and the slowest rank's median is kept (a synchronous step waits for it). Timing is
wall clock around ``torch.cuda.synchronize()`` on a GPU. Iteration counts are fixed by sizes,
not by timing, so that every rank issues the same collectives.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..graph.types import ModelGraph
from .schema import AttentionSample, GemmSample, MemorySample

#: Tensor-parallel degrees whose sharded GEMM shapes are measured beside the unsharded ones
#: (the shapes plans run: column-parallel N/tp, row-parallel K/tp).
TP_DEGREES = (1, 2, 4, 8)
#: Most GEMM shapes measured (the largest first: they dominate step time).
MAX_GEMM_SHAPES = 24
#: Timed repetitions per figure (the median is kept) and untimed warm-up calls.
REPEATS, WARMUP = 3, 1


@dataclass
class Clock:
    """The run's time budget: ``deadline`` on ``now()`` (``time.monotonic`` unless a test passes
    a fake clock); ranks agree on running out through :meth:`expired` and on skipping a benchmark
    through :meth:`affords` (MAX all-reduces), so they stop at the same collective. ``notes``
    collects what was skipped and why (the calibration file keeps them); ``progress`` (a
    callable taking one line, or None) is told each step as it starts."""

    deadline: float
    device: torch.device
    now: Callable[[], float] = time.monotonic
    progress: Callable[[str], None] | None = None
    notes: list[str] = field(default_factory=list)

    def _any(self, flag: bool) -> bool:
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        if dist.is_initialized():
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def remaining(self) -> float:
        """Seconds left of the budget on this rank (negative past it)."""
        return self.deadline - self.now()

    def expired(self) -> bool:
        """True on every rank when any rank is past the deadline (a collective call)."""
        return self._any(self.remaining() < 0)

    def affords(self, seconds: float, nbytes: float = 0.0) -> bool:
        """True on every rank when every rank has ``seconds`` of budget left and ``nbytes`` of
        free memory (:func:`available_bytes`; a collective call)."""
        short = seconds > self.remaining() or nbytes > available_bytes(self.device)
        return not self._any(short)

    def say(self, line: str) -> None:
        """Report ``line`` to ``progress`` (nothing when there is none)."""
        if self.progress is not None:
            self.progress(line)


def available_bytes(device: torch.device) -> float:
    """Bytes that can be allocated now: a GPU's free memory (``torch.cuda.mem_get_info``), else
    the host's MemAvailable (/proc/meminfo; the free pages where there is none)."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024  # the file counts KiB
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Median seconds of one ``fn()`` call: :data:`WARMUP` calls, then :data:`REPEATS` timings
    of ``iters`` calls each."""
    for _ in range(WARMUP):
        fn()
    sync(device)
    samples = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        samples.append((time.perf_counter() - t0) / iters)
    return sorted(samples)[len(samples) // 2]


def _iters_for(seconds_once: float, target_s: float = 0.02) -> int:
    return max(1, min(50, int(target_s / max(seconds_once, 1e-9))))


def slowest(values: list[float], device: torch.device) -> list[float]:
    """Element-wise maximum of ``values`` over all ranks (the list has the same length on every
    rank)."""
    if not dist.is_initialized() or dist.get_world_size() == 1 or not values:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def gemm_shapes(graph: ModelGraph) -> list[tuple[int, int, int]]:
    """The model's distinct GEMM shapes (M, K, N) for one micro-batch, unsharded and as each of
    :data:`TP_DEGREES` shards them, largest work first, at most :data:`MAX_GEMM_SHAPES`."""
    shapes = set()
    for layer in graph.layers:
        for op in layer.ops:
            if op.kind != "matmul" or len(op.gemm) != 3:
                continue
            m, k, n = op.gemm
            for tp in TP_DEGREES:
                if op.tp_role in ("column", "vocab") and n % tp == 0:
                    shapes.add((m, k, n // tp))
                elif op.tp_role == "row" and k % tp == 0:
                    shapes.add((m, k // tp, n))
                elif tp == 1:
                    shapes.add((m, k, n))
    return sorted(shapes, key=lambda s: (-s[0] * s[1] * s[2], s))[:MAX_GEMM_SHAPES]


#: Calls of one shape's GEMM in :func:`bench_gemms`: two first calls, one sizing call,
#: :data:`WARMUP` and :data:`REPEATS` timed ones (a GEMM slower than ``_iters_for``'s 20 ms target
#: runs once per repetition).
GEMM_CALLS = 3 + WARMUP + REPEATS
#: Side of the square GEMM whose rate predicts the others' time before they run.
PROBE_SIZE = 512


def probe_rate(dtype: torch.dtype, device: torch.device) -> float:
    """FLOP/s of one :data:`PROBE_SIZE`-cubed ``a @ b`` (2 m k n FLOPs): the rate
    :func:`bench_gemms` predicts its first shape's time with (a GPU runs a small GEMM at a lower
    rate, so there the prediction errs long; a CPU's caches can make it err short)."""
    n = PROBE_SIZE
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b
    sync(device)
    t0 = time.perf_counter()
    a @ b
    sync(device)
    return 2.0 * n ** 3 / max(time.perf_counter() - t0, 1e-9)


def bench_gemms(shapes, dtype: torch.dtype, device: torch.device, clock: Clock) -> list[GemmSample]:
    """Time ``a @ b`` for each (M, K, N) in ``shapes``, the slowest rank's times.

    A shape runs only when its predicted time (:data:`GEMM_CALLS` calls at :func:`probe_rate`'s
    rate, then at the slowest rate measured) fits the budget left and its tensors the free
    memory; one that does not is skipped (a note on the clock) and the smaller ones after it
    are tried. A shape whose timed repetitions, sized by its own third call, no longer fit keeps
    that one call's time (noted), so a short prediction overruns the budget by at most three
    calls of one shape. Stops past the clock's deadline."""
    out, skipped, single = [], [], []
    elem = torch.tensor([], dtype=dtype).element_size()
    rate = probe_rate(dtype, device)
    for i, (m, k, n) in enumerate(shapes):
        if clock.expired():
            clock.notes.append(f"the budget ran out at GEMM shape {i + 1} of {len(shapes)} "
                               f"({len(out)} measured); the rest were not measured.")
            break
        flops = 2.0 * m * k * n
        predicted = GEMM_CALLS * flops / rate
        nbytes = 4.0 * (m * k + k * n) + elem * (m * k + k * n + m * n)
        if not clock.affords(predicted, nbytes):
            skipped.append((m, k, n, predicted, nbytes, rate))
            continue
        clock.say(f"GEMM {i + 1}/{len(shapes)} {m}x{k}x{n} (predicted {predicted:.3g} s)")
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        for _ in range(2):  # first calls pay for allocation and kernel selection
            a @ b
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        once = time.perf_counter() - t0
        iters = _iters_for(once)
        if clock.affords((WARMUP + REPEATS * iters) * once):
            t = timed(lambda: a @ b, device, iters)
        else:  # the prediction was short: keep the one timed call rather than overrun
            t = once
            single.append(f"{m}x{k}x{n}")
        out.append((m, k, n, t))
        rate = flops / t if len(out) == 1 else min(rate, flops / t)
        a = b = None   # free them before the next shape (rebinding, not del: the lambda closes over them)
    if single:
        clock.notes.append(f"GEMM {', '.join(single)}: one timed call, not the median of "
                           f"{REPEATS} (its repetitions did not fit the budget left).")
    if skipped:
        m, k, n, predicted, nbytes, at = skipped[0]
        clock.notes.append(
            f"{len(skipped)} of {len(shapes)} GEMM shapes were skipped: their predicted time "
            f"({GEMM_CALLS} calls at the rate seen so far) exceeded the budget left, or "
            f"their tensors the free memory (the largest: {m}x{k}x{n}, {predicted:.3g} s at "
            f"{at / 1e9:.3g} GFLOP/s, {nbytes / 2 ** 30:.2f} GiB). Fix: a larger --budget, a "
            "shorter --seq-len, or a GPU.")
    times = slowest([t for *_, t in out], device)
    return [GemmSample(m, k, n, t) for (m, k, n, _), t in zip(out, times)]


def attention_shape(graph: ModelGraph) -> tuple[int, int, int, int, bool] | None:
    """(heads, kv_heads, seq_len, head_dim, causal) of the model's first attention op, or None
    (head_dim from its counted FLOPs, 4 * b * heads * s^2 * head_dim)."""
    for layer in graph.blocks:
        for op in layer.ops:
            if op.kind == "attention" and layer.attention_heads:
                s, h = graph.seq_len, layer.attention_heads
                hd = round(op.fwd_flops / (4 * graph.micro_batch_size * h * s * s))
                return h, layer.kv_heads or h, s, max(hd, 1), op.causal
    return None


def bench_attention(shape, dtype: torch.dtype, device: torch.device, clock: Clock,
                    rate: float = 0.0) -> list[AttentionSample]:
    """Forward and forward+backward seconds of ``F.scaled_dot_product_attention`` for one
    sequence of the model's attention shape (empty without attention, past the deadline, or
    when its time predicted at ``rate`` FLOP/s, the GEMMs' fastest, exceeds the budget left;
    ``rate`` 0: :func:`probe_rate`)."""
    if shape is None:
        return []
    h, kv, s, hd, causal = shape
    if clock.expired():
        clock.notes.append("the budget ran out before attention was measured.")
        return []
    # calls: 2 sizing fwd+bwd, then timed() of fwd and of fwd+bwd (3.5x the forward's FLOPs);
    # the rate is the GEMMs' (attention's kernels run below it, so this errs short)
    rate = rate or probe_rate(dtype, device)
    fwd_flops = 4.0 * h * s * s * hd * (0.5 if causal else 1.0)
    predicted = (2 * 3.5 + (WARMUP + REPEATS) * 4.5) * fwd_flops / max(rate, 1.0)
    if not clock.affords(predicted):
        clock.notes.append(f"attention (seq {s}, {h} heads) was skipped: predicted "
                           f"{predicted:.3g} s exceeds the budget left. Fix: a larger --budget "
                           "or a shorter --seq-len.")
        return []
    clock.say(f"attention seq {s}, {h} heads (predicted {predicted:.3g} s)")
    q = torch.randn(1, h, s, hd, device=device).to(dtype).requires_grad_()
    k = torch.randn(1, kv, s, hd, device=device).to(dtype).requires_grad_()
    v = torch.randn(1, kv, s, hd, device=device).to(dtype).requires_grad_()
    grad = torch.randn(1, h, s, hd, device=device).to(dtype)
    gqa = kv != h

    def fwd():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        out.backward(grad)
        q.grad = k.grad = v.grad = None

    fwd_bwd()
    sync(device)
    t0 = time.perf_counter()
    fwd_bwd()
    sync(device)
    once = time.perf_counter() - t0
    iters = _iters_for(once)
    if not clock.affords((WARMUP + REPEATS * iters) * once * 4.5 / 3.5):
        clock.notes.append(f"attention (seq {s}, {h} heads) was stopped after its sizing calls "
                           f"({once:.3g} s each): its timed repetitions did not fit the budget "
                           "left. Fix: a larger --budget or a shorter --seq-len.")
        return []
    t_f, t_fb = slowest([timed(fwd, device, iters), timed(fwd_bwd, device, iters)], device)
    return [AttentionSample(1, h, kv, s, hd, causal, t_f, t_fb)]


def bench_memory(copy_bytes: int, device: torch.device, clock: Clock) -> MemorySample | None:
    """A ``copy_bytes`` device copy (bytes/s = 2 x bytes / s) and the time of one tiny kernel
    (an in-place add on one element, 200 issued back to back)."""
    if clock.expired():
        clock.notes.append("the budget ran out before the memory copy was measured.")
        return None
    if not clock.affords(0.0, 2.0 * copy_bytes):
        clock.notes.append(f"the memory copy of {copy_bytes} bytes was skipped: two buffers do "
                           "not fit the free memory. Fix: a smaller --copy-bytes.")
        return None
    clock.say(f"memory copy of {copy_bytes / 2 ** 20:.0f} MiB")
    n = copy_bytes // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    t_copy = timed(lambda: dst.copy_(src), device, 5)
    src = dst = None   # free the copy buffers (rebinding, not del: the lambda closes over them)
    one = torch.zeros(1, device=device)
    t_launch = timed(lambda: one.add_(1.0), device, 200)
    t_copy, t_launch = slowest([t_copy, t_launch], device)
    return MemorySample(n * 4, t_copy, t_launch)
