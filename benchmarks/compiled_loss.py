"""What a cross entropy on bf16 logits keeps for backward, and allocates in it, eager and under
``torch.compile``: the loss as torchtitan writes it (``components/loss.py``
``cross_entropy_loss``: ``F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))``),
which torchtitan compiles whenever compile is on since bbb1b616e (2025-04-02, PR #1033;
``compile.components`` default ``["model", "loss"]``).

    python -m benchmarks.compiled_loss            # prints the figures
    python -m benchmarks.compiled_loss --write    # also writes benchmarks/data/memory/compiled_loss_cpu.json

How. One process on the CPU (TorchInductor's C++ backend), logits [1, N, V] in bf16 with
``requires_grad``. Saved bytes: every tensor autograd packs for backward
(``torch.autograd.graph.saved_tensors_hooks``), distinct storages summed, per logit element.
Backward work: the [N, V]-sized buffers the compiled backward allocates, read from Inductor's
generated code (``torch._inductor.utils.run_and_get_code``). Which tensors the compiled forward
saves is the AOTAutograd min-cut partitioner's choice, made before code generation and the same
for every device; the CUDA backward kernel is not read here (no GPU). Eager keeps the fp32
log-probabilities (4 bytes a logit); compiled keeps the bf16 logits (2) and two fp32 numbers
per row, and its backward writes one bf16 gradient (2): what
:func:`autopar.frameworks.stacks.with_compiled_loss` charges.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
from pathlib import Path

import torch
import torch.nn.functional as F

OUT = Path(__file__).parent / "data" / "memory" / "compiled_loss_cpu.json"


def loss_fn(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torchtitan's cross entropy (components/loss.py ``cross_entropy_loss``)."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def saved_bytes_per_logit(fn, tokens: int, vocab: int) -> tuple[float, list]:
    """(bytes autograd keeps for backward per logit element, [(shape, dtype)] of what it keeps)
    for one call of ``fn`` on [1, tokens, vocab] bf16 logits; runs backward too."""
    pred = torch.randn(1, tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    kept: list[torch.Tensor] = []

    def pack(t):
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(pred, labels)
    seen, total = set(), 0
    for t in kept:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
    loss.backward()
    return total / (tokens * vocab), [(list(t.shape), str(t.dtype).replace("torch.", ""))
                                      for t in kept]


def compiled_backward_buffers(tokens: int, vocab: int) -> list[str]:
    """The dtypes of the [tokens, vocab]-sized buffers Inductor's generated forward and backward
    code allocate for the compiled loss (``empty_strided`` calls)."""
    from torch._inductor.utils import run_and_get_code
    pred = torch.randn(1, tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    compiled = torch.compile(loss_fn)

    def step():
        compiled(pred, labels).backward()

    torch._dynamo.reset()
    _, codes = run_and_get_code(step)
    sizes = {f"({tokens}, {vocab})", f"(1, {tokens}, {vocab})"}
    found = []
    for code in codes:
        for shape, dtype in re.findall(r"empty_strided_\w+\((\([^)]*\)), \([^)]*\), torch\.(\w+)\)",
                                       code):
            if shape in sizes:
                found.append(dtype)
    return found


def measure(tokens: int = 2048, vocab: int = 32000) -> dict:
    """The figures this module's docstring describes, as a dict."""
    torch.manual_seed(0)
    eager, eager_kept = saved_bytes_per_logit(loss_fn, tokens, vocab)
    torch._dynamo.reset()
    comp, comp_kept = saved_bytes_per_logit(torch.compile(loss_fn), tokens, vocab)
    return {
        "what": "bytes per logit element kept for backward by a cross entropy on bf16 logits "
                "(torchtitan's cross_entropy_loss), eager and torch.compile'd, and the logit-"
                "sized buffers the compiled code allocates (benchmarks/compiled_loss.py)",
        "tokens": tokens, "vocab": vocab,
        "eager_saved_bytes_per_logit": round(eager, 4), "eager_saved": eager_kept,
        "compiled_saved_bytes_per_logit": round(comp, 4), "compiled_saved": comp_kept,
        "compiled_logit_sized_buffers": compiled_backward_buffers(tokens, vocab),
        "torch": torch.__version__, "machine": platform.machine(),
        "device": "cpu (TorchInductor C++ backend)",
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT}")
    args = ap.parse_args(argv)
    out = measure()
    print(json.dumps(out, indent=1))
    if args.write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
