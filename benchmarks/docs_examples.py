"""The numbers and messages the docs print, generated from the library itself.

    python -m benchmarks.docs_examples --write    # rewrite the generated parts of docs/
    python -m benchmarks.docs_examples --check    # exit 1 when docs/ differ from a new run

Generated parts (``<!-- begin generated: NAME ... -->`` markers, :mod:`benchmarks.docgen`):
docs/errors.md's table of error messages (:data:`EXAMPLES`, one input per error class, also the
cases of tests/test_errors.py) and the plan-file version; the README plan's Megatron re-estimate
in docs/runtime.md and its error band in docs/cost-model.md. tests/test_docs.py fails when they
drift. Deterministic; about half a minute on one core (the README plan's search).
"""

from __future__ import annotations

import argparse
import re

import torch

import autopar
from autopar import errors
from autopar.runtime.errors import UnsupportedPlanError

from . import docgen

_COMMAND = "python -m benchmarks.docs_examples --write"
TINY = dict(name="tiny", family="llama", num_layers=2, hidden_size=64, num_heads=4,
            vocab_size=128, seq_len=64)
TRAIN = dict(global_batch_size=16, seq_len=64)
#: The plan README.md's first command searches.
README_PROBLEM = ("llama2-70b", "4x8xA100-80GB",
                  dict(global_batch_size=1024, seq_len=4096))


class BranchyBlock(torch.nn.Module):
    """A decoder block whose forward branches on tensor data, as an untraceable model does."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        # data-dependent control flow: tracing on meta tensors cannot decide it
        if x.sum() > 0:
            return x + self.proj(x)
        return x


class BranchyLM(torch.nn.Module):
    """A language model (embedding, blocks, head) whose blocks are :class:`BranchyBlock`."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.blocks = torch.nn.ModuleList([BranchyBlock(), BranchyBlock()])
        self.head = torch.nn.Linear(16, 64)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _branchy_lm():
    with torch.device("meta"):
        model = BranchyLM()
    autopar.optimize(model, "1x8xA100", TRAIN)


def _plots_without_matplotlib():
    import builtins
    from autopar.report import plots
    real = builtins.__import__

    def fake(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real(name, *a, **k)
    builtins.__import__ = fake
    try:
        plots._pyplot()
    finally:
        builtins.__import__ = real


def _newer_plan_file():
    from autopar.io.planfile import PLAN_VERSION
    return autopar.Plan.from_json(
        f'{{"format": "autopar-plan", "version": {PLAN_VERSION + 1}}}')


def _pipeline_short_of_micro_batches():
    import dataclasses
    from autopar.runtime import check_plan
    plan = autopar.optimize("tiny-llama", "1x8xA100-80GB",
                            autopar.TrainingConfig(16, 32, precision="fp32"),
                            fixed=dict(tp=2, pp=2, cp=1, zero_stage=3))
    check_plan(dataclasses.replace(plan, config=plan.config.replace(
        micro_batch_size=8, virtual_stages=1, schedule="1f1b", stage_blocks=None)))


#: (error class, example input as the docs show it, the call) for every AutoparError subclass.
EXAMPLES = [
    (errors.InvalidModelConfig, "`optimize({..., 'hidden_size': 100, 'num_heads': 8}, ...)`",
     lambda: autopar.optimize({**TINY, "hidden_size": 100, "num_heads": 8}, "1x8xA100", TRAIN)),
    (errors.InvalidClusterSpec, "`Cluster.from_spec('4x8xB9000')`",
     lambda: autopar.Cluster.from_spec("4x8xB9000")),
    (errors.InvalidTrainingConfig, "`TrainingConfig(global_batch_size=0, seq_len=2048)`",
     lambda: autopar.TrainingConfig(global_batch_size=0, seq_len=2048)),
    (errors.InvalidParallelConfig, "`estimate(tiny, '1x8xA100', ..., ParallelConfig(tp=3))`",
     lambda: autopar.estimate(TINY, "1x8xA100", TRAIN, autopar.ParallelConfig(tp=3))),
    (errors.InfeasibleError, "`optimize('llama2-7b', '1x1xA100-40GB', gbs=64, seq=4096)`",
     lambda: autopar.optimize("llama2-7b", "1x1xA100-40GB",
                              dict(global_batch_size=64, seq_len=4096))),
    (errors.InfeasibleError, "`optimize(tiny, '1x8xA100', gbs=7, fixed={'tp': 1, 'pp': 1})`",
     lambda: autopar.optimize(TINY, "1x8xA100", dict(global_batch_size=7, seq_len=64),
                              fixed={"tp": 1, "pp": 1})),
    (errors.UntraceableModelError, "`optimize(language model whose block has a data-dependent if, ...)`",
     _branchy_lm),
    (errors.InvalidPlanFile, "`Plan.from_json` of a file from a newer autopar",
     _newer_plan_file),
    (errors.InvalidSearchOption, "`optimize(..., time_limit_s=-1)`",
     lambda: autopar.optimize(TINY, "1x8xA100", TRAIN, time_limit_s=-1)),
    (errors.MissingDependency, "`plots.plot_schedule(...)` without matplotlib",
     _plots_without_matplotlib),
    (errors.OutputError, "`plan.to_json('/nonexistent-folder/plan.json')`",
     lambda: autopar.optimize(TINY, "1x8xA100", TRAIN).to_json("/nonexistent-folder/plan.json")),
    (errors.InvalidCalibration, "`estimate(..., calibration={'format': 'autopar-calibration', "
                                "'version': 1})`",
     lambda: autopar.estimate(TINY, "1x8xA100", TRAIN, {"tp": 1},
                              calibration={"format": "autopar-calibration", "version": 1})),
    (UnsupportedPlanError, "`autopar.runtime.check_plan(plan)` (and `plan.apply`) with 1 micro-batch for a "
           "2-stage 1F1B pipeline", _pipeline_short_of_micro_batches),
]


def error_message(call) -> tuple[type, str]:
    """The class and message of the :class:`autopar.AutoparError` that ``call`` raises.

    Raises:
        AssertionError: ``call`` raised nothing, or not an AutoparError.
    """
    try:
        call()
    except errors.AutoparError as exc:
        return type(exc), str(exc)
    raise AssertionError(f"{call} raised no AutoparError")


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell (pipes escaped, one line)."""
    return " ".join(text.replace("|", "\\|").split())


def errors_table() -> str:
    """docs/errors.md's table: each example's class, input and full message."""
    lines = ["| class | example input | message |", "|---|---|---|"]
    for _, text, call in EXAMPLES:
        cls, msg = error_message(call)
        lines.append(f"| `{cls.__name__}` | {_cell(text)} | {_cell(msg)} |")
    return "\n".join(lines)


def readme_plan():
    """The plan README.md's first command finds (a search of about half a minute)."""
    model, cluster, train = README_PROBLEM
    return autopar.optimize(model, cluster, autopar.TrainingConfig(**train))


def megatron_verdict(plan) -> str:
    """The export warning that gives the plan's re-estimate under Megatron-LM."""
    return next(w for w in plan.to_megatron_args().warnings if w.startswith("re-estimated"))


def band_example(plan) -> str:
    """The step-time line of the plan's summary with its error band, e.g. ``step time 2.9 s ±
    6%`` or ``step time 2.9 s ± unknown (unvalidated regime)``."""
    m = re.search(r"^step time\s+(\S+ s ± (?:\d+%|unknown \(unvalidated regime\)))",
                  plan.summary(), re.M)
    return f"step time {m[1]}"


def memory_margin_text() -> str:
    """README.md's figures for the default memory margin: the growth over prediction that 68%
    of the measured dense peaks stayed within, their runs (autopar.cost.published.MEMORY_BAND)
    and the margin kept (rounded up)."""
    from autopar.cost.published import MEMORY_BAND
    from autopar.search.margin import default_margin
    return (f"{MEMORY_BAND[4]:.1%} over {MEMORY_BAND[2]} dense runs at this writing, so "
            f"{default_margin():.0%} is kept free")


def render() -> dict:
    """Every generated part of docs/ from a new run, as :func:`benchmarks.docgen.render` gives."""
    from autopar.io.planfile import PLAN_VERSION
    plan = readme_plan()
    return docgen.render([
        ("docs/errors.md", "error-examples", errors_table()),
        ("docs/errors.md", "plan-version", f"`version: {PLAN_VERSION}`"),
        ("docs/runtime.md", "megatron-verdict", f"`{megatron_verdict(plan)}`"),
        ("docs/cost-model.md", "band-example", f"`{band_example(plan)}`"),
        ("README.md", "memory-margin", memory_margin_text()),
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the generated parts")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 when the docs differ from a new run")
    args = ap.parse_args(argv)
    return docgen.write_or_check(render(), _COMMAND, args.check)


if __name__ == "__main__":
    raise SystemExit(main())
