"""One-GPU measurements the cost model cannot get from datasheets: GEMM efficiency over shapes,
FP8 GEMMs, attention kernels (FlashAttention-2, cuDNN, memory-efficient) over sequence length
and head dim, memory-bound ops, and a small Llama's step time and peak memory under several
single-GPU plans (micro-batch x recompute) run through ``plan.apply``.

Two steps, so that the GPU run needs nothing but torch and autopar's runtime:

    python -m benchmarks.gpu_sweep prepare DIR     # here (CPU): writes the plan files to DIR
    python benchmarks/gpu_sweep.py run DIR OUT     # on the GPU: writes OUT/sweep.json

Every section writes its results as soon as it ends (a stopped run keeps what it measured) and
an exception in one section is recorded and the next section runs. Timing: CUDA events around
``iters`` back-to-back calls after warm-up calls; the figure is the median of ``REPEATS`` such
means. FLOP counts: GEMM 2*M*K*N; attention forward 4*b*h*s^2*d, halved for causal (the executed
triangle), backward 2.5x forward (FlashAttention-2 paper's convention, Dao 2023, sec. 4.1:
backward = 2.5 forward matmuls: five matmuls against two).

The measured data and how it was taken are committed in ``benchmarks/data/gpu/``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

REPEATS = 5

#: Llama shapes planned and run on one GPU: ~1.2B (Llama 3.2 1B's shape) and ~3.2B (Llama 3.2
#: 3B's shape), with the 128k vocabulary whose output layer and loss are a large share of a
#: small model's step.
MODELS = {
    "llama-1b": {"name": "llama-1b", "family": "llama", "num_layers": 16, "hidden_size": 2048,
                 "num_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 8192,
                 "vocab_size": 128256, "seq_len": 8192},
    "llama-3b": {"name": "llama-3b", "family": "llama", "num_layers": 28, "hidden_size": 3072,
                 "num_heads": 24, "num_kv_heads": 8, "ffn_hidden_size": 8192,
                 "vocab_size": 128256, "seq_len": 8192},
}
#: (model, seq_len, global batch, micro-batch, recompute)
PLANS = [
    ("llama-1b", 4096, 8, 1, "none"),
    ("llama-1b", 4096, 8, 2, "none"),
    ("llama-1b", 4096, 8, 4, "none"),
    ("llama-1b", 4096, 8, 4, "selective"),
    ("llama-1b", 4096, 8, 4, "full"),
    ("llama-1b", 8192, 4, 2, "none"),
    ("llama-1b", 2048, 16, 8, "none"),
    ("llama-3b", 4096, 8, 2, "none"),
    ("llama-3b", 4096, 8, 4, "selective"),
    ("llama-3b", 4096, 8, 4, "full"),
]


def prepare(out: Path) -> None:
    """Write one plan file per :data:`PLANS` row (cluster 1x1xH200, framework torch) to ``out``,
    with the plan's predicted step time and memory, and ``plans.json`` listing them."""
    import autopar

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (name, seq, gb, mb, rc) in enumerate(PLANS):
        model = dict(MODELS[name])
        train = autopar.TrainingConfig(global_batch_size=gb, seq_len=seq, precision="bf16",
                                       micro_batch_size=mb)
        plan = autopar.optimize(model, "1x1xH200", train,
                                fixed={"tp": 1, "pp": 1, "cp": 1, "recompute": rc})
        f = out / f"plan{i:02d}.json"
        plan.to_json(f)
        rows.append({"file": f.name, "model": name, "seq_len": seq, "global_batch": gb,
                     "micro_batch": mb, "recompute": rc,
                     "predicted_step_s": plan.estimate.step_time_s,
                     "predicted_memory_bytes": plan.estimate.memory_per_gpu_bytes})
        print(rows[-1])
    (out / "plans.json").write_text(json.dumps(rows, indent=1))


# ---------------------------------------------------------------- GPU side

def _timer(torch):
    def timed(fn, iters: int, warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        means = []
        for _ in range(REPEATS):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                fn()
            b.record()
            b.synchronize()
            means.append(a.elapsed_time(b) / 1e3 / iters)
        return sorted(means)[len(means) // 2]

    def auto_iters(fn, target_s: float = 0.01) -> int:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return max(1, min(100, int(target_s / max(time.perf_counter() - t0, 1e-6))))
    return timed, auto_iters


def gemm_shapes() -> list[tuple[int, int, int]]:
    """Squares, and (tokens, K, N) of Llama 8B/70B projections and their TP shards."""
    shapes = [(n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192, 16384)]
    proj = [(4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096), (4096, 128256),
            (8192, 8192), (8192, 28672), (28672, 8192), (8192, 1024),
            (2048, 2048), (2048, 8192), (8192, 2048), (2048, 512)]
    for m in (1024, 4096, 16384):
        for k, n in proj:
            shapes.append((m, k, n))
    for m in (512, 2048, 8192, 32768):
        for k, n in ((4096, 4096), (8192, 3584), (3584, 8192), (8192, 1024)):
            shapes.append((m, k, n))
    return sorted(set(shapes))


def run_gemms(torch, timed, auto_iters) -> list[dict]:
    rows = []
    for m, k, n in gemm_shapes():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        f = lambda: a @ b  # noqa: E731
        t = timed(f, auto_iters(f))
        rows.append({"dtype": "bf16", "m": m, "k": k, "n": n, "s": t,
                     "tflops": 2 * m * k * n / t / 1e12})
        a = b = None   # free before the next shape (rebinding, not del: the lambda closes over them)
    # FP8 (e4m3 x e4m3 -> bf16, per-tensor scales) through torch._scaled_mm, as torchao's and
    # Transformer Engine's per-tensor recipes issue it (cuBLASLt FP8 GEMM).
    for m, k, n in [(s, s, s) for s in (1024, 2048, 4096, 8192, 16384)] + [
            (16384, 4096, 14336), (16384, 14336, 4096), (16384, 8192, 28672),
            (4096, 4096, 4096), (4096, 8192, 1024), (16384, 4096, 1024)]:
        try:
            a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
            one = torch.ones((), device="cuda")
            f = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,  # noqa: E731
                                         out_dtype=torch.bfloat16)
            t = timed(f, auto_iters(f))
            rows.append({"dtype": "fp8", "m": m, "k": k, "n": n, "s": t,
                         "tflops": 2 * m * k * n / t / 1e12})
            a = b = None   # rebinding, not del: the lambda closes over them
        except Exception as e:  # noqa: BLE001 - recorded, next shape
            rows.append({"dtype": "fp8", "m": m, "k": k, "n": n, "error": repr(e)[:300]})
    return rows


def run_attention(torch, timed, auto_iters) -> list[dict]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    tokens = 32768
    for hd, heads in ((128, 32), (64, 32), (128, 64)):
        for s in (512, 1024, 2048, 4096, 8192, 16384, 32768):
            b = max(1, tokens // s)
            q = torch.randn(b, heads, s, hd, device="cuda", dtype=torch.bfloat16,
                            requires_grad=True)
            k = torch.randn_like(q, requires_grad=True)
            v = torch.randn_like(q, requires_grad=True)
            g = torch.randn_like(q)
            fwd_flops = 4 * b * heads * s * s * hd * 0.5
            for name, be in backends.items():
                try:
                    with sdpa_kernel([be]):
                        def fwd():
                            with torch.no_grad():
                                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                        def fwd_bwd():
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                            o.backward(g)
                            q.grad = k.grad = v.grad = None
                        tf = timed(fwd, auto_iters(fwd))
                        tfb = timed(fwd_bwd, auto_iters(fwd_bwd))
                    rows.append({"backend": name, "batch": b, "heads": heads, "seq": s,
                                 "head_dim": hd, "causal": True, "fwd_s": tf, "fwd_bwd_s": tfb,
                                 "fwd_tflops": fwd_flops / tf / 1e12,
                                 "bwd_tflops": 2.5 * fwd_flops / max(tfb - tf, 1e-9) / 1e12,
                                 "fwd_bwd_tflops": 3.5 * fwd_flops / tfb / 1e12})
                except Exception as e:  # noqa: BLE001
                    rows.append({"backend": name, "seq": s, "head_dim": hd, "heads": heads,
                                 "error": repr(e)[:300]})
            q = k = v = g = None   # free before the next length (rebinding, not del: closures use them)
    return rows


def run_memory_bound(torch, timed, auto_iters) -> list[dict]:
    import torch.nn.functional as F

    rows = []
    n = 1 << 30  # 1 Gi elements of fp32 = 4 GiB
    src = torch.ones(n, device="cuda")
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), 5)
    rows.append({"op": "copy fp32 4GiB", "bytes": 2 * 4 * n, "s": t, "GBps": 8 * n / t / 1e9})
    src = dst = None   # rebinding, not del: the lambda closes over them
    one = torch.zeros(1, device="cuda")
    rows.append({"op": "tiny kernel (launch)", "s": timed(lambda: one.add_(1.0), 200)})
    for tok, h in ((16384, 2048), (16384, 4096), (32768, 8192)):
        x = torch.randn(tok, h, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(h, device="cuda", dtype=torch.bfloat16)
        f = lambda: F.rms_norm(x, (h,), w, 1e-5)  # noqa: E731
        t = timed(f, auto_iters(f))
        rows.append({"op": f"rms_norm bf16 {tok}x{h}", "bytes": 2 * 2 * tok * h, "s": t,
                     "GBps": 4 * tok * h / t / 1e9})
        a = torch.randn(tok, 4 * h, device="cuda", dtype=torch.bfloat16)
        c = torch.randn_like(a)
        f = lambda: F.silu(a) * c  # noqa: E731
        t = timed(f, auto_iters(f))
        rows.append({"op": f"swiglu eager bf16 {tok}x{4 * h}", "bytes": 3 * 2 * tok * 4 * h,
                     "s": t, "GBps": 6 * tok * 4 * h / t / 1e9})
        x = a = c = None   # rebinding, not del: the lambdas close over them
    for tok, vocab in ((8192, 128256), (16384, 32000)):
        logits = torch.randn(tok, vocab, device="cuda", dtype=torch.bfloat16,
                             requires_grad=True)
        y = torch.randint(0, vocab, (tok,), device="cuda")

        def ce():
            loss = F.cross_entropy(logits.float(), y)
            loss.backward()
            logits.grad = None
        t = timed(ce, auto_iters(ce))
        rows.append({"op": f"cross_entropy fwd+bwd (fp32 upcast) {tok}x{vocab}",
                     "bf16_logit_bytes": 2 * tok * vocab, "s": t})
        logits = None   # rebinding, not del: ce() closes over it
    return rows


def run_plans(torch, plan_dir: Path, out: Path) -> list[dict]:
    import torch.distributed as dist

    from autopar.calibrate.measure import run_steps
    from autopar.plan import Plan

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    if not dist.is_initialized():
        try:
            dist.init_process_group("nccl", rank=0, world_size=1)
        except Exception:  # noqa: BLE001 - gloo also reduces CUDA tensors
            dist.init_process_group("gloo", rank=0, world_size=1)
    rows = []
    for row in json.loads((plan_dir / "plans.json").read_text()):
        r = dict(row)
        try:
            plan = Plan.from_json(plan_dir / row["file"])
            res = run_steps(plan, steps=5, warmup=2, device=torch.device("cuda"))
            ts = sorted(res["step_times_s"])
            r.update({"measured_step_s": ts[len(ts) // 2], "step_times_s": res["step_times_s"],
                      "measured_max_allocated_bytes": res["memory_per_rank_bytes"][0],
                      "max_reserved_bytes": torch.cuda.max_memory_reserved(),
                      "losses": res["losses"], "notes": res["notes"]})
        except Exception as e:  # noqa: BLE001
            r["error"] = repr(e)[:500]
            r["traceback"] = traceback.format_exc()[-1500:]
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("traceback", "losses")}),
              flush=True)
        torch.cuda.empty_cache()
        (out / "plans_measured.json").write_text(json.dumps(rows, indent=1))
    return rows


def run(plan_dir: Path, out: Path) -> None:
    """The GPU side: every section, results written to ``out/sweep.json`` as they come."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    timed, auto_iters = _timer(torch)
    props = torch.cuda.get_device_properties(0)
    result = {"env": {"device": props.name, "sm_count": props.multi_processor_count,
                      "total_memory_bytes": props.total_memory, "torch": torch.__version__,
                      "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                      "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "timing": f"CUDA events, median of {REPEATS} means of back-to-back calls"}}
    sections = [("gemm", lambda: run_gemms(torch, timed, auto_iters)),
                ("attention", lambda: run_attention(torch, timed, auto_iters)),
                ("memory_bound", lambda: run_memory_bound(torch, timed, auto_iters)),
                ("plans", lambda: run_plans(torch, plan_dir, out))]
    only = os.environ.get("SWEEP_ONLY")
    for name, fn in sections:
        if only and name not in only.split(","):
            continue
        t0 = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as e:  # noqa: BLE001 - the next section still runs
            result[name + "_error"] = traceback.format_exc()[-2000:]
            print(f"{name}: {e!r}", flush=True)
        result.setdefault("section_wall_s", {})[name] = round(time.perf_counter() - t0, 1)
        print(f"{name}: {result['section_wall_s'][name]} s", flush=True)
        (out / "sweep.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "prepare":
        prepare(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "run":
        run(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
