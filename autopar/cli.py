"""Command line: ``autopar plan`` searches a plan, ``autopar estimate`` judges a given one.

    autopar plan --model llama2-70b --cluster 4x8xA100-80GB --global-batch 1024 --seq-len 4096
    autopar estimate --model llama2-70b --cluster 4x8xA100-80GB --global-batch 1024 \\
        --seq-len 4096 --tp 8 --pp 4 --recompute full

Errors autopar raises on purpose are printed as one line (exit code 2); Ctrl-C during a search
prints the best plan found so far.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from . import api
from .config import ParallelConfig, TrainingConfig
from .errors import AutoparError
from .report import estimate_lines


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True,
                   help="preset name (see `autopar models`) or a JSON file with a model dict")
    p.add_argument("--cluster", required=True,
                   help="cluster spec NODESxGPUSxGPU[+NICSxLINK], e.g. 4x8xA100-80GB")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per optimizer step (default: ~4M tokens, a multiple of GPUs)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sequence (default: the model's)")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="sequences per micro-batch (default: searched)")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32", "fp8"],
                   help="training precision (default bf16)")
    p.add_argument("--no-flash-attention", action="store_true",
                   help="model attention as the unfused path (stores s x s scores)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _parallel_flags(p: argparse.ArgumentParser, required_default: bool) -> None:
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel degree")
    p.add_argument("--pp", type=int, default=None, help="pipeline-parallel degree")
    p.add_argument("--dp", type=int, default=None, help="data-parallel degree")
    p.add_argument("--cp", type=int, default=None, help="context-parallel degree")
    p.add_argument("--zero", type=int, default=None, choices=[0, 1, 2, 3], help="ZeRO stage")
    p.add_argument("--recompute", default=None, choices=["none", "selective", "full"],
                   help="activation recomputation for every block")
    p.add_argument("--sp", dest="sequence_parallel", action="store_const", const=True,
                   default=None, help="sequence parallelism (with tp > 1)")
    p.add_argument("--virtual-stages", type=int, default=None,
                   help="interleaved 1F1B chunks per pipeline rank")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``autopar`` command."""
    ap = argparse.ArgumentParser(prog="autopar", description="Plan parallel training of "
                                 "transformers on GPU clusters.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="search the fastest plan that fits")
    _common(p)
    _parallel_flags(p, False)
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds to search before returning the best so far")
    p.add_argument("--top-k", type=int, default=5, help="alternatives to show")
    p.add_argument("--out", default=None, help="write the plan JSON to this file")
    e = sub.add_parser("estimate", help="judge one configuration")
    _common(e)
    _parallel_flags(e, True)
    sub.add_parser("models", help="list model presets")
    return ap


def _model_arg(text: str):
    if text.endswith(".json"):
        try:
            with open(text) as f:
                return json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise SystemExit(f"autopar: cannot read model file {text}: {exc}")
    return text


def _train(args, model, cluster) -> TrainingConfig:
    cfg = api._model_config(model)
    default = api.default_training(cfg, cluster)
    seq = args.seq_len or default.seq_len
    gbs = args.global_batch or default.global_batch_size
    return TrainingConfig(global_batch_size=gbs, seq_len=seq, micro_batch_size=args.micro_batch,
                          precision=args.precision,
                          flash_attention=not args.no_flash_attention)


def _fixed(args) -> dict:
    names = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "zero": "zero_stage",
             "recompute": "recompute", "sequence_parallel": "sequence_parallel",
             "virtual_stages": "virtual_stages"}
    return {dst: getattr(args, src) for src, dst in names.items()
            if getattr(args, src) is not None}


def _progress(console: Console):
    state = {"last": -1}

    def report(stage, done, total, best):
        pct = int(100 * done / max(total, 1))
        if pct // 10 != state["last"] and stage == "meshes":
            state["last"] = pct // 10
            msg = f"searching meshes {done}/{total}"
            if best is not None:
                msg += f", best so far {best.step_time_s:.3f} s/step"
            console.print(msg, style="dim")
    return report


def main(argv=None) -> int:
    """Entry point of the ``autopar`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    console = Console(stderr=True)
    out = Console()
    try:
        if args.command == "models":
            from .models import list_presets
            out.print("\n".join(list_presets()))
            return 0
        model = _model_arg(args.model)
        cluster = api.as_cluster(args.cluster)
        train = _train(args, model, cluster)
        if args.command == "plan":
            plan = api.optimize(model, cluster, train, fixed=_fixed(args),
                                time_limit_s=args.time_limit, top_k=args.top_k,
                                progress=None if args.json else _progress(console))
            if args.out:
                plan.to_json(args.out)
            print(plan.to_json() if args.json else plan.summary())
            return 0
        config = ParallelConfig(**_fixed(args), micro_batch_size=args.micro_batch)
        est = api.estimate(model, cluster, train, config)
        if args.json:
            print(json.dumps(est.to_dict(), indent=2, sort_keys=True))
        else:
            print("\n".join(estimate_lines(est)))
        return 0
    except AutoparError as exc:
        console.print(f"autopar: {type(exc).__name__}: {exc}", style="red", markup=False, soft_wrap=True,
                      highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted", style="red")
        return 130


if __name__ == "__main__":
    sys.exit(main())
