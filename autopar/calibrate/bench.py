"""Microbenchmarks of ``autopar calibrate``: GEMMs, attention, a copy, collectives.

Each runs on every rank at once (as training does); a figure is the median over repetitions of
one call, and the slowest rank's median is kept (a synchronous step waits for it). Timing is
wall clock around ``torch.cuda.synchronize()`` on a GPU. Iteration counts are fixed by sizes,
not by timing, so that every rank issues the same collectives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
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
    """The run's time budget: ``deadline`` on ``time.monotonic()``; ranks agree on running out
    through :meth:`expired` (a MAX all-reduce) so they stop at the same collective."""

    deadline: float
    device: torch.device

    def expired(self) -> bool:
        """True on every rank when any rank is past the deadline (a collective call)."""
        late = torch.tensor([1.0 if time.monotonic() > self.deadline else 0.0],
                            device=self.device)
        if dist.is_initialized():
            dist.all_reduce(late, op=dist.ReduceOp.MAX)
        return bool(late.item())


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


def bench_gemms(shapes, dtype: torch.dtype, device: torch.device, clock: Clock) -> list[GemmSample]:
    """Time ``a @ b`` for each (M, K, N) in ``shapes`` (stops early past the clock's
    deadline); the slowest rank's times."""
    out = []
    for m, k, n in shapes:
        if clock.expired():
            break
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        for _ in range(2):  # first calls pay for allocation and kernel selection
            a @ b
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        once = time.perf_counter() - t0
        out.append((m, k, n, timed(lambda: a @ b, device, _iters_for(once))))
        a = b = None   # free them before the next shape (rebinding, not del: the lambda closes over them)
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


def bench_attention(shape, dtype: torch.dtype, device: torch.device,
                    clock: Clock) -> list[AttentionSample]:
    """Forward and forward+backward seconds of ``F.scaled_dot_product_attention`` for one
    sequence of the model's attention shape (empty past the deadline or without attention)."""
    if shape is None or clock.expired():
        return []
    h, kv, s, hd, causal = shape
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
    iters = _iters_for(time.perf_counter() - t0)
    t_f, t_fb = slowest([timed(fwd, device, iters), timed(fwd_bwd, device, iters)], device)
    return [AttentionSample(1, h, kv, s, hd, causal, t_f, t_fb)]


def bench_memory(copy_bytes: int, device: torch.device, clock: Clock) -> MemorySample | None:
    """A ``copy_bytes`` device copy (bytes/s = 2 x bytes / s) and the time of one tiny kernel
    (an in-place add on one element, 200 issued back to back)."""
    if clock.expired():
        return None
    n = copy_bytes // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    t_copy = timed(lambda: dst.copy_(src), device, 5)
    src = dst = None   # free the copy buffers (rebinding, not del: the lambda closes over them)
    one = torch.zeros(1, device=device)
    t_launch = timed(lambda: one.add_(1.0), device, 200)
    t_copy, t_launch = slowest([t_copy, t_launch], device)
    return MemorySample(n * 4, t_copy, t_launch)
