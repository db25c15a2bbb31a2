"""Host (CPU) seconds of a Megatron-Core transformer layer against the same ops in plain torch,
measured on a CPU: the part of a layer's host time that is the framework's own Python, which
``CostParams.host_op_s`` (a back-to-back ``x.add_(1.0)``) leaves out (docs/cost-model.md, Host
issue time).

    python -m benchmarks.cpu_host_megatron            # prints the figures
    python -m benchmarks.cpu_host_megatron --write    # also writes benchmarks/data/host/cpu_host_megatron.json

Needs megatron-core (a test dependency; its ``local`` layer spec, no Transformer Engine) and
torch; one process, gloo, tp = pp = 1, one CPU thread.

What. The tiny shapes (hidden 64, 4 heads, 16 tokens, vocab 128) make every op's own work a few
microseconds, so a step's CPU time is what the host spends issuing it: Python, the dispatcher,
autograd. Each model is a GPT of ``L`` layers (Megatron-Core ``GPTModel`` with
``get_gpt_layer_local_spec()``; the plain one: ``nn.LayerNorm``, a fused q/k/v ``nn.Linear``,
``torch.baddbmm`` scores, masked softmax, ``torch.bmm``, output projection, GELU MLP of 4h,
residuals, the same unfused attention path Megatron's local ``DotProductAttention`` takes), timed
at two depths: the slope per layer of one forward + backward (``loss.backward()``) is the layer's
host seconds, the embedding and loss cancelling. Aten ops per layer are counted with a
``TorchDispatchMode`` (every op the dispatcher runs, views included).

What it is not: a GPU host figure. On a GPU each op also pays ``cudaLaunchKernel`` and the
caching allocator, and this CPU is not a DGX host's; the ratio of the two stacks on one CPU (the
framework's Python per op, relative to plain torch's) is what carries over, not the seconds.
Transformer Engine's layer (what Megatron-Core's default spec builds) is not measured here
(``benchmarks/gpu_host.py`` does, on a GPU). Megatron-Core's CUDA-only calls are patched for the
CPU run: ``torch.cuda.current_device`` returns "cpu" (a buffer's device) and the model-parallel
RNG tracker's ``fork`` is a no-op (dropout 0 here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

OUT = Path(__file__).resolve().parent / "data" / "host" / "cpu_host_megatron.json"
HIDDEN, HEADS, SEQ, VOCAB = 64, 4, 16, 128
DEPTHS = (1, 24)
STEPS, WARMUP, TRIALS = 20, 3, 5


class _Count(TorchDispatchMode):
    """Counts the aten ops the dispatcher runs."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _time(step) -> tuple[float, int]:
    """(CPU seconds per call of ``step``, the least of :data:`TRIALS` means of :data:`STEPS`
    calls: other processes' load only adds time; aten ops per call)."""
    for _ in range(WARMUP):
        step()
    best = float("inf")
    for _ in range(TRIALS):
        t = time.process_time()
        for _ in range(STEPS):
            step()
        best = min(best, (time.process_time() - t) / STEPS)
    cpu = best
    count = _Count()
    with count:
        step()
    return cpu, count.n


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.fc1, self.fc2 = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x, mask):
        d = HIDDEN // HEADS
        q, k, v = self.qkv(self.ln1(x)).view(SEQ, 1, HEADS, 3 * d).split(d, dim=-1)
        q, k, v = (t.reshape(SEQ, HEADS, d).transpose(0, 1) for t in (q, k, v))
        scores = torch.baddbmm(torch.empty(HEADS, SEQ, SEQ), q, k.transpose(1, 2), beta=0.0,
                               alpha=d ** -0.5)
        probs = torch.softmax(scores.masked_fill(mask, -10000.0), -1)
        x = x + self.proj(torch.bmm(probs, v).transpose(0, 1).reshape(SEQ, 1, HIDDEN))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class _Plain(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(SEQ, HIDDEN)
        self.blocks = nn.ModuleList(_Block() for _ in range(layers))
        self.lnf = nn.LayerNorm(HIDDEN)

    def forward(self, tokens, labels, mask):
        x = (self.emb(tokens) + self.pos(torch.arange(SEQ))[None]).transpose(0, 1)
        for b in self.blocks:
            x = b(x, mask)
        logits = self.lnf(x) @ self.emb.weight.t()
        return F.cross_entropy(logits.reshape(-1, VOCAB).float(), labels.t().reshape(-1))


def _plain_step(layers: int):
    torch.manual_seed(0)
    model = _Plain(layers)
    tokens, labels = torch.randint(0, VOCAB, (1, SEQ)), torch.randint(0, VOCAB, (1, SEQ))
    mask = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
    return lambda: model(tokens, labels, mask).backward()


def _megatron_setup() -> str:
    """Initialises one gloo process and Megatron-Core's model-parallel state; its version."""
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.current_device = lambda: "cpu"   # where Megatron-Core asks for a buffer's device
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import __version__, parallel_state, tensor_parallel
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    return __version__


def _megatron_step(layers: int):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    torch.manual_seed(0)
    cfg = TransformerConfig(num_layers=layers, hidden_size=HIDDEN, num_attention_heads=HEADS,
                            use_cpu_initialization=True, hidden_dropout=0.0,
                            attention_dropout=0.0)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=VOCAB, max_sequence_length=SEQ)
    tokens, labels = torch.randint(0, VOCAB, (1, SEQ)), torch.randint(0, VOCAB, (1, SEQ))
    pos = torch.arange(SEQ)[None]
    mask = torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool).tril().logical_not()
    return lambda: model(tokens, pos, mask, labels=labels).sum().backward()


def per_layer(make) -> dict:
    """Per layer of one forward + backward: CPU seconds and aten ops (the slope between
    :data:`DEPTHS`)."""
    (t0, n0), (t1, n1) = (_time(make(depth)) for depth in DEPTHS)
    span = DEPTHS[1] - DEPTHS[0]
    return {"cpu_s": (t1 - t0) / span, "aten_ops": (n1 - n0) / span}


def measure() -> dict:
    """The figures, with the machine and versions they were taken on."""
    torch.set_num_threads(1)
    version = _megatron_setup()
    mcore, plain = per_layer(_megatron_step), per_layer(_plain_step)
    return {
        "what": "CPU seconds and aten ops per transformer layer of one forward + backward at "
                f"hidden {HIDDEN}, {HEADS} heads, {SEQ} tokens (dispatch-bound), slope between "
                f"{DEPTHS[0]} and {DEPTHS[1]} layers, one CPU thread",
        "machine": {"cpu": _cpu_name(), "python": platform.python_version(),
                    "torch": torch.__version__, "megatron_core": version},
        "megatron_core_local_layer": mcore,
        "plain_torch_layer": plain,
        "ratio_cpu_s": mcore["cpu_s"] / plain["cpu_s"],
        "cpu_s_per_aten_op": {"megatron_core": mcore["cpu_s"] / mcore["aten_ops"],
                              "plain_torch": plain["cpu_s"] / plain["aten_ops"]},
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"also write {OUT.name}")
    args = p.parse_args(argv)
    try:
        r = measure()
    except ImportError as exc:
        print(f"needs megatron-core ({exc}); pip install megatron-core")
        return 1
    m, t = r["megatron_core_local_layer"], r["plain_torch_layer"]
    print(f"{r['machine']['cpu']}, torch {r['machine']['torch']}, megatron-core "
          f"{r['machine']['megatron_core']}")
    print(f"Megatron-Core local layer: {m['cpu_s'] * 1e3:.2f} ms CPU, {m['aten_ops']:.0f} aten "
          f"ops per forward + backward")
    print(f"plain torch layer:         {t['cpu_s'] * 1e3:.2f} ms CPU, {t['aten_ops']:.0f} aten ops")
    print(f"ratio {r['ratio_cpu_s']:.2f}; CPU per aten op {r['cpu_s_per_aten_op']['megatron_core'] * 1e6:.1f} "
          f"vs {r['cpu_s_per_aten_op']['plain_torch'] * 1e6:.1f} us")
    if args.write:
        OUT.write_text(json.dumps(r, indent=1) + "\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
