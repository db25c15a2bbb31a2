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

- ``moe_layer``: Megatron-Core's own ``TransformerLayer`` with an MoE MLP (megatron-core as
  installed, 0.16.1 in this project's venv; the Transformer Engine spec with grouped GEMM when TE
  imports, else the local spec, whose ``SequentialMLP`` loops over the experts in Python and is
  not what production runs use) at Qwen3-30B-A3B's per-rank shape (hidden 2048, 32 heads / 4
  groups, q/k RMSNorm, 128 experts top-8 of ffn 768) and the tokens per rank of the AWS p5
  campaign (sequence 4096 / TP 8 = 512 tokens, micro-batch 1 and 4), on one GPU (tp = ep = 1),
  for the all-to-all dispatcher (with and without ``moe_permute_fusion``; TE >= 2.1 for the
  fused one) and the all-gather one: the same per-layer figures as ``blocks`` plus the host
  synchronisations per layer forward and backward (profiler rows of :data:`SYNC_CALLS`). The
  all-to-all dispatcher's device-to-host copy of the token counts and its wait on that copy's
  event run at ep = 1 too (token_dispatcher.py ``MoEAlltoAllTokenDispatcher.preprocess``: the
  wait is at "before_permutation_2" with several local experts and no permute fusion, else
  "before_finish", when ep = tp = 1; "before_ep_alltoall" under EP; "before_permutation_1" with
  a capacity factor, dropless or not, where the output size is read); the unfused permute's
  two ``masked_select`` (moe_utils.py ``permute``) and the all-gather dispatcher's ``.cpu()`` of
  ``tokens_per_expert`` and ``masked_select`` of the probabilities block the host whatever the
  EP size. Megatron-Core is CUDA-only (its router and attention buffers call
  ``torch.cuda``), so this section does not run with ``--device cpu``. On a device machine
  without megatron-core, carry it: copy ``site-packages/megatron`` (17 MB) to an ignored
  folder of the tree, pass it in ``carry`` and put it on ``PYTHONPATH``.

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


#: Profiler names of the runtime calls where the host waits for the GPU: a blocking copy to
#: the host (``.cpu()``, ``.item()``, ``.tolist()``, and the count ``nonzero`` / ``masked_select``
#: read) synchronises the stream; Megatron's side-stream copy is waited on with an event.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")
#: (name, tokens per rank, micro-batch): Qwen3-30B-A3B under TP 8 with sequence parallelism at
#: sequence 4096 (the AWS awsome-distributed-ai p5 campaign's records, micro-batch 1 and 4).
MOE_SHAPES = (("qwen3-30b-a3b-tp8-mb1", 512, 1), ("qwen3-30b-a3b-tp8-mb4", 512, 4))
#: Qwen3-30B-A3B's layer (Megatron-Bridge qwen3_30b_a3b_pretrain_config, as the corpus records
#: describe it): hidden, heads, query groups, experts, top-k, expert ffn.
MOE_MODEL = {"hidden": 2048, "heads": 32, "groups": 4, "experts": 128, "topk": 8, "ffn": 768}
MOE_LAYERS = 4


def launches(names_counts) -> int:
    """Kernel launches among profiler rows given as ``(name, count)`` pairs (:data:`LAUNCH_CALLS`)."""
    return sum(n for name, n in names_counts if name in LAUNCH_CALLS)


def syncs(names_counts) -> int:
    """Host waits on the GPU among profiler rows given as ``(name, count)`` pairs
    (:data:`SYNC_CALLS`)."""
    return sum(n for name, n in names_counts if name in SYNC_CALLS)


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


class LayerStack:
    """Megatron-Core ``TransformerLayer`` s called one after another on ``[s, b, h]`` input (each
    returns ``(output, context)``); ``len`` is the number of layers, as
    :func:`measure_layer_stack` expects. Built by :func:`megatron_moe_stack`."""

    def __init__(self, layers):
        self.layers = layers

    def __len__(self) -> int:
        return len(self.layers)

    def __call__(self, x):
        for layer in self.layers:
            x, _ = layer(x, attention_mask=None)
        return x


def megatron_moe_config(dispatcher: str, permute_fusion: bool, layers: int = MOE_LAYERS,
                        model: dict | None = None):
    """Megatron-Core ``TransformerConfig`` of :data:`MOE_MODEL` (or ``model``, same keys) with
    the ``dispatcher`` ("alltoall" or "allgather") and ``moe_permute_fusion``: bf16, no bias,
    SwiGLU, RMSNorm with q/k norm, balanced routing (``moe_router_force_load_balancing``, as the
    AWS bench sets it), no auxiliary loss, no dropout."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    m = model or MOE_MODEL
    return TransformerConfig(
        num_layers=layers, hidden_size=m["hidden"], num_attention_heads=m["heads"],
        num_query_groups=m["groups"], ffn_hidden_size=m["ffn"], moe_ffn_hidden_size=m["ffn"],
        num_moe_experts=m["experts"], moe_router_topk=m["topk"],
        moe_token_dispatcher_type=dispatcher, moe_permute_fusion=permute_fusion,
        moe_grouped_gemm=True, moe_router_load_balancing_type="none",
        moe_router_force_load_balancing=True, add_bias_linear=False, gated_linear_unit=True,
        activation_func=F.silu, normalization="RMSNorm", qk_layernorm=True, bf16=True,
        params_dtype=torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0)


def megatron_moe_stack(torch, dispatcher: str, permute_fusion: bool, have_te: bool):
    """:class:`LayerStack` of :data:`MOE_LAYERS` Megatron-Core MoE layers on the current GPU
    (the TE spec with grouped GEMM when ``have_te``, else the local spec with the experts as a
    ``SequentialMLP``) and the spec's name."""
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.transformer_layer import TransformerLayer

    cfg = megatron_moe_config(dispatcher, permute_fusion)
    if have_te:
        spec, name = specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=cfg.num_moe_experts, moe_grouped_gemm=True, qk_layernorm=True), "te"
    else:
        cfg.moe_grouped_gemm = False
        spec, name = specs.get_gpt_layer_local_spec(
            num_experts=cfg.num_moe_experts, moe_grouped_gemm=False, qk_layernorm=True), "local"
    layers = torch.nn.ModuleList(TransformerLayer(cfg, spec.submodules, layer_number=i + 1)
                                 for i in range(cfg.num_layers)).cuda()
    return LayerStack(layers), name


def host_syncs(torch, model, x) -> tuple[int, int]:
    """Host waits (:data:`SYNC_CALLS`) during one forward and during its backward."""
    # the runtime calls are CUPTI rows: recorded only with the CUDA activity
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as fwd:
        loss = model(x).float().square().mean()
    with torch.profiler.profile(activities=acts) as bwd:
        loss.backward()
    torch.cuda.synchronize()
    return (syncs((e.key, e.count) for e in fwd.key_averages()),
            syncs((e.key, e.count) for e in bwd.key_averages()))


def run_moe_layer(torch, device: str) -> list[dict]:
    """The ``moe_layer`` section (module docstring); CUDA only."""
    if device != "cuda":
        raise RuntimeError("Megatron-Core's MoE layer needs CUDA (its router and attention "
                           "call torch.cuda); run this section on a GPU")
    import os

    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    try:
        import transformer_engine  # noqa: F401
        have_te = True
    except ImportError:
        have_te = False
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    variants = [("alltoall", False), ("allgather", False)]
    if have_te:
        variants.insert(0, ("alltoall", True))
    rows = []
    for dispatcher, fusion in variants:
        variant = {"dispatcher": dispatcher, "moe_permute_fusion": fusion}
        try:   # one failed variant (e.g. a TE without fused permute) is recorded, not fatal
            model, spec = megatron_moe_stack(torch, dispatcher, fusion, have_te)
            for name, tokens, mb in MOE_SHAPES:
                x = torch.randn(tokens, mb, MOE_MODEL["hidden"], device="cuda",
                                dtype=torch.bfloat16, requires_grad=True)
                row = {"shape": name, "tokens": tokens, "micro_batch": mb, "spec": spec,
                       **variant, **measure_layer_stack(torch, model, x, "cuda")}
                f, b = host_syncs(torch, model, x)
                row["syncs_fwd_per_layer"] = f / len(model)
                row["syncs_bwd_per_layer"] = b / len(model)
                rows.append(row)
            del model
        except Exception as e:  # noqa: BLE001
            rows.append({**variant, "error": repr(e)[:300],
                         "trace": traceback.format_exc()[-1500:]})
        torch.cuda.empty_cache()
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
    sections = {"blocks": run_blocks, "te_layer": run_te, "step_extras": run_step_extras,
                "moe_layer": run_moe_layer}
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
