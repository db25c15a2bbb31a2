"""Host (CPU) seconds to issue a transformer layer's kernels, for the host-issue model
(:mod:`autopar.cost.host`): what a GPU session has to measure before a per-framework host cost
can replace the dispatch-only lower bound ``CostParams.host_op_s``.

    python3 benchmarks/gpu_host.py OUT              # on a GPU machine: writes OUT/host.json
    python3 benchmarks/gpu_host.py OUT --device cpu --quick   # smoke run here (no CUDA figures)

Needs torch only; the Transformer Engine section runs when ``transformer_engine`` imports.

Why. ``host_op_s`` (8.13 us) is a back-to-back ``x.add_(1.0)``: no autograd recording, no
``nn.Module`` call, no Python of a framework's layer. Megatron-LM's CI goldens of its 12-layer,
hidden-512 test model (DGX H100) take about 4 ms per layer per micro-batch where the cost model
predicts under 1 ms of GPU time and 0.3 ms of issue time; no public figure gives the host cost of a
Megatron-Core / Transformer Engine layer (docs/cost-model.md, Host issue time). This script
measures, per layer and micro-batch, the pieces that figure is made of:

- ``blocks``: a stack of eager GPT blocks (``nn.LayerNorm``, ``nn.Linear`` q/k/v + out, causal
  ``F.scaled_dot_product_attention``, GELU MLP 4h, residuals; bf16 parameters) at the CI test
  model's shape (micro-batch 4, sequence 1024, hidden 512, 8 heads) and at a tiny shape whose GPU
  work is negligible (so the wall time is the host's). Per shape: the host seconds of the
  forward call and of ``loss.backward()`` (``time.perf_counter`` around the call, the queue
  drained before it: the call returns once its kernels are enqueued), the stream seconds of
  forward + backward and the wall seconds of ``ITERS`` back-to-back forward + backward calls
  (CUDA events; the wall time per call is what the cost model's ``max(stream, host)`` predicts), and
  the kernels launched (``torch.profiler``: runtime launch calls ``cudaLaunchKernel*`` /
  ``cuLaunchKernel*``). ``host_per_launch_s`` = host seconds / launches is the figure
  :attr:`autopar.cost.params.CostParams.host_op_s` would take with autograd and modules counted.
- ``te_layer``: the same measurements for ``transformer_engine.pytorch.TransformerLayer`` (the
  layer Megatron-Core's TE spec is built from) at the same shapes, and ``te.Linear`` against
  ``nn.Linear`` forward-only host seconds (NVIDIA/TransformerEngine#2053 reports 13.5 us for
  ``nn.Linear`` on a DGX H100's Xeon 8480C and 90-100 us for ``te.Linear`` on Grace CPUs; its
  H100 ``te.Linear`` figure is not in the stored excerpt; #2126, 2026-01: BF16 ``te.Linear`` now
  "nearly the same" as torch's).
- ``step_extras``: host + stream seconds of per-step work the CI test configs switch on
  (``--log-num-zeros-in-grad``: Megatron ``count_zeros_fp32`` loops over parameters with a
  ``count_nonzero`` each; ``--log-params-norm``: an L2 norm of every parameter, here
  ``torch._foreach_norm``; ``--log-memory-to-tensorboard``: ``torch.cuda.memory_stats()``) on
  the test model's parameter tensors (12 layers of the eager block); one GPU, so without their
  all-reduces.

Not measurable on one GPU and still needed: the same per-micro-batch figures inside a Megatron-LM
8-GPU run with the CI flags (``--deterministic-mode``, ``NCCL_ALGO=Ring``,
``CUDA_DEVICE_MAX_CONNECTIONS=1``, TP collectives and pipeline sends), e.g. a ``torch.profiler``
or Nsight Systems trace of steps 3-10 of ``gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer``
and ``gpt3_mcore_te_tp4_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce``: the CPU
time per layer forward/backward (NVTX ranges of ``TransformerLayer``), the GPU-idle time between
kernels, and the time in ``training_log`` / ``calc_params_l2_norm`` per step.

Timing: each figure is the median of ``REPEATS`` means over ``ITERS`` calls after ``WARMUP``
calls. Every section writes its results as soon as it ends; an exception is recorded and the next
section runs.
"""

from __future__ import annotations

import json
import platform
import sys
import time
import traceback
from pathlib import Path

REPEATS = 5
ITERS = 10
WARMUP = 3
#: (name, micro-batch, sequence, hidden, heads): the Megatron-LM CI test model's shape
#: (tests/functional_tests/test_cases/gpt/*/model_config.yaml: --micro-batch-size 4,
#: --seq-length 1024, --hidden-size 512, --num-attention-heads 8) and a tiny one.
SHAPES = (("ci-toy", 4, 1024, 512, 8), ("tiny", 1, 16, 64, 2))
LAYERS = 12
#: Profiler names of the runtime/driver calls that launch one kernel.
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel")


def launches(names_counts) -> int:
    """Kernel launches among profiler rows given as ``(name, count)`` pairs (:data:`LAUNCH_CALLS`)."""
    return sum(n for name, n in names_counts if name in LAUNCH_CALLS)


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def eager_blocks(torch, layers: int, hidden: int, heads: int, device: str):
    """``layers`` eager GPT blocks as one ``nn.Sequential`` (bf16 parameters)."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, h // heads).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + self.out(a.transpose(1, 2).reshape(b, s, h))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    return nn.Sequential(*[Block() for _ in range(layers)]).to(device, torch.bfloat16)


def measure_layer_stack(torch, model, x, device: str) -> dict:
    """Host seconds of forward and backward, stream and wall seconds, kernel launches, per layer
    of ``model`` (``len(model)`` layers) for one micro-batch ``x``."""
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def fwd_bwd():
        y = model(x)
        y.float().square().mean().backward()

    for _ in range(WARMUP):
        fwd_bwd()
    sync()
    host_f, host_b, wall, stream = [], [], [], []
    for _ in range(REPEATS):
        hf = hb = 0.0
        for _ in range(ITERS):
            sync()   # an empty queue: the timed calls below are the host's alone
            a = time.perf_counter()
            loss = model(x).float().square().mean()
            b = time.perf_counter()
            loss.backward()
            hf, hb = hf + b - a, hb + time.perf_counter() - b
        host_f.append(hf / ITERS)
        host_b.append(hb / ITERS)
        # back to back, as a training loop issues them: the host runs ahead of a slower GPU
        sync()
        t0 = time.perf_counter()
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        for _ in range(ITERS):
            fwd_bwd()
        if cuda:
            e1.record()
            e1.synchronize()
            stream.append(e0.elapsed_time(e1) / 1e3 / ITERS)
        sync()
        wall.append((time.perf_counter() - t0) / ITERS)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        fwd_bwd()
        sync()
    n = launches((e.key, e.count) for e in prof.key_averages())
    layers = len(model)
    row = {"layers": layers, "host_fwd_s_per_layer": median(host_f) / layers,
           "host_bwd_s_per_layer": median(host_b) / layers,
           "wall_fwd_bwd_s_per_layer": median(wall) / layers,
           "launches_per_layer": n / layers}
    if cuda:
        row["stream_fwd_bwd_s_per_layer"] = median(stream) / layers
    if n:
        row["host_per_launch_s"] = (median(host_f) + median(host_b)) / n
    return row


def run_blocks(torch, device: str) -> list[dict]:
    rows = []
    for name, mb, seq, hidden, heads in SHAPES:
        model = eager_blocks(torch, LAYERS, hidden, heads, device)
        x = torch.randn(mb, seq, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
        rows.append({"shape": name, "micro_batch": mb, "seq": seq, "hidden": hidden,
                     **measure_layer_stack(torch, model, x, device)})
    return rows


def run_te(torch, device: str) -> list[dict]:
    import transformer_engine.pytorch as te

    rows = []
    for name, mb, seq, hidden, heads in SHAPES:
        model = torch.nn.Sequential(*[te.TransformerLayer(
            hidden, 4 * hidden, heads, hidden_dropout=0.0, attention_dropout=0.0,
            self_attn_mask_type="causal", params_dtype=torch.bfloat16, attn_input_format="bshd")
            for _ in range(LAYERS)]).to(device)
        x = torch.randn(mb, seq, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
        rows.append({"module": "te.TransformerLayer", "shape": name,
                     **measure_layer_stack(torch, model, x, device)})
    x = torch.randn(4 * 1024, 512, device=device, dtype=torch.bfloat16)
    for label, lin in (("nn.Linear", torch.nn.Linear(512, 2048)), ("te.Linear", te.Linear(512, 2048))):
        lin = lin.to(device, torch.bfloat16)
        with torch.no_grad():
            for _ in range(WARMUP):
                lin(x)
            torch.cuda.synchronize()
            means = []
            for _ in range(REPEATS):
                t = 0.0
                for _ in range(ITERS):
                    torch.cuda.synchronize()
                    a = time.perf_counter()
                    lin(x)
                    t += time.perf_counter() - a
                means.append(t / ITERS)
        rows.append({"module": label, "op": "forward 4096x512 -> 2048, no grad",
                     "host_s": median(means)})
    return rows


def run_step_extras(torch, device: str) -> list[dict]:
    """Per-step work of the CI configs' logging flags on the test model's parameters."""
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = eager_blocks(torch, LAYERS, 512, 8, device)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)

    def count_zeros():     # megatron/core/optimizer/clip_grads.py count_zeros_fp32, one rank
        total = torch.zeros(1, dtype=torch.int64, device=device)
        for p in params:
            total += p.grad.numel() - torch.count_nonzero(p.grad)
        return total.item()

    def params_norm():     # calc_params_l2_norm, one rank: a multi-tensor norm, then .item()
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(params))).item()

    extras = {"log-num-zeros-in-grad": count_zeros, "log-params-norm": params_norm}
    if cuda:
        extras["log-memory-to-tensorboard"] = torch.cuda.memory_stats
    rows = []
    for flag, fn in extras.items():
        for _ in range(WARMUP):
            fn()
        means = []
        for _ in range(REPEATS):
            sync()
            a = time.perf_counter()
            for _ in range(ITERS):
                fn()
            sync()
            means.append((time.perf_counter() - a) / ITERS)
        rows.append({"flag": flag, "parameter_tensors": len(params), "wall_s": median(means)})
    return rows


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    device = argv[argv.index("--device") + 1] if "--device" in argv else "cuda"
    if "--quick" in argv:   # a smoke run of the harness: the tiny shape, one call per figure
        global REPEATS, ITERS, WARMUP, SHAPES
        REPEATS, ITERS, WARMUP, SHAPES = 1, 1, 1, SHAPES[-1:]
    import torch

    out.mkdir(parents=True, exist_ok=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    result = {"torch": torch.__version__, "cpu": cpu, "device": device,
              "gpu": torch.cuda.get_device_name() if device == "cuda" else None}
    sections = {"blocks": run_blocks, "te_layer": run_te, "step_extras": run_step_extras}
    for name, fn in sections.items():
        try:
            result[name] = fn(torch, device)
        except Exception as e:  # noqa: BLE001 - a failed section is recorded, the next one runs
            result[name] = {"error": repr(e)[:300], "trace": traceback.format_exc()[-2000:]}
        (out / "host.json").write_text(json.dumps(result, indent=1))
        print(name, json.dumps(result[name])[:600], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
