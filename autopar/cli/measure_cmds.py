"""The ``autopar calibrate`` and ``autopar measure`` commands (run under torchrun on the
user's nodes, or as one process); the measuring itself is in :mod:`autopar.calibrate`."""

from __future__ import annotations

import json
import warnings

import torch.distributed as dist
from rich.console import Console
from rich.table import Table

from ..errors import InvalidCalibration, output_error
from .inputs import model_arg


def add_parsers(sub, positive_float, int_at_least) -> None:
    """Add the ``calibrate`` and ``measure`` subcommands to ``sub`` (argparse subparsers)."""
    c = sub.add_parser("calibrate", help="measure this cluster (run under torchrun) and write a "
                       "calibration file for --calibration")
    c.add_argument("--model", required=True,
                   help="preset name or JSON model dict whose GEMM and attention shapes to time")
    c.add_argument("--out", required=True, help="calibration file to write (JSON)")
    c.add_argument("--seq-len", type=int, default=None,
                   help="sequence length of the attention and GEMM shapes (default: the model's)")
    c.add_argument("--precision", default=None, choices=["fp32", "tf32", "bf16", "fp16"],
                   help="precision of GEMMs and attention (default bf16 on a GPU, fp32 on CPU)")
    c.add_argument("--budget", type=positive_float, default=300.0,
                   help="seconds for all benchmarks together (default 300)")
    c.add_argument("--min-bytes", type=int, default=None,
                   help="smallest collective message (default 4096 on GPU, 1024 on CPU)")
    c.add_argument("--max-bytes", type=int, default=None,
                   help="largest collective message (default 256 MiB on GPU, 1 MiB on CPU)")
    c.add_argument("--copy-bytes", type=int, default=None,
                   help="bytes of the memory-bandwidth copy (default 1 GiB on GPU, 64 MiB on CPU)")
    c.add_argument("--device", default=None, metavar="GPU",
                   help="catalogue GPU these GPUs are, when the automatic match from the device "
                        "name is wrong (e.g. H100-SXM5-80GB)")
    c.add_argument("--json", action="store_true", help="print the calibration JSON")
    m = sub.add_parser("measure", help="run a plan's training steps on synthetic data (under "
                       "torchrun) and record step time, memory and the prediction error")
    m.add_argument("--plan", required=True, help="plan file (autopar plan --out)")
    m.add_argument("--out", required=True, help="record file to write (published-run JSON)")
    m.add_argument("--steps", type=int_at_least(1), default=10,
                   help="measured steps (default 10)")
    m.add_argument("--warmup", type=int_at_least(0), default=3,
                   help="warm-up steps before measuring (default 3)")
    m.add_argument("--calibration", metavar="FILE", default=None,
                   help="the calibration file the plan was priced with (autopar plan "
                        "--calibration, or measured_cluster in Python): the prediction is "
                        "re-estimated with its fits; needed for a plan priced on a CPU's or "
                        "unlisted GPU's measured cluster (e.g. 1x2xmeasured-cpu)")
    m.add_argument("--cluster", metavar="SPEC", default=None,
                   help="cluster spec to re-estimate the plan on, when its cluster is a custom "
                        "name (Cluster.custom(..., name=...)); e.g. 1x8xH100-80GB")
    m.add_argument("--json", action="store_true", help="print the record JSON")


def _sizes(args) -> None:
    for flag in ("seq_len", "min_bytes", "max_bytes", "copy_bytes"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise InvalidCalibration(f"--{flag.replace('_', '-')} must be >= 1; got {v}.")
    if args.min_bytes and args.max_bytes and args.min_bytes > args.max_bytes:
        raise InvalidCalibration(f"--min-bytes {args.min_bytes} exceeds --max-bytes "
                                 f"{args.max_bytes}. Fix: swap them.")


def cmd_calibrate(args, out: Console, err: Console) -> dict | None:
    """Run the calibration; rank 0 writes ``--out`` and prints the comparison table."""
    from ..calibrate.run import (Options, comparison, fit_warnings, init_distributed,
                                 run_calibration)
    _sizes(args)
    device, owned = init_distributed()
    try:
        cal = run_calibration(Options(model=model_arg(args.model), seq_len=args.seq_len,
                                      precision=args.precision, budget_s=args.budget,
                                      min_bytes=args.min_bytes, max_bytes=args.max_bytes,
                                      copy_bytes=args.copy_bytes, catalog=args.device), device)
        rank = dist.get_rank() if dist.is_initialized() else 0
    finally:
        if owned:
            dist.destroy_process_group()
    if rank != 0:
        return None
    cal.to_json(args.out)
    warns = [f"warning: {w}" for w in fit_warnings(cal)]
    if args.json:
        for w in warns:  # on stderr, so that --json's output stays the file
            err.print(w, style="bold yellow", highlight=False)
        return cal.to_dict()
    w = cal.world
    out.print(f"[bold]autopar calibrate[/bold]: {cal.device.name} (catalogue: "
              f"{cal.device.catalog or 'none'}), {w.world_size} process(es) on {w.num_nodes} "
              f"node(s), {cal.precision}, backend {cal.backend}")
    t = Table("quantity", "measured", "catalogue")
    for row in comparison(cal):
        t.add_row(*row)
    out.print(t)
    out.print(f"measured: {', '.join(cal.measured_fields)}", highlight=False)
    if not cal.collectives:
        out.print("no collectives measured (one process): run under torchrun "
                  "--nproc-per-node=GPUS to measure links.", style="yellow")
    for w in warns:
        out.print(w, style="bold yellow", highlight=False)
    err.print(f"wrote {args.out}", style="dim")
    return None


def cmd_measure(args, out: Console, err: Console) -> dict | None:
    """Run the plan's steps; rank 0 writes the record to ``--out``."""
    from ..calibrate.measure import record, run_steps
    from ..calibrate.run import init_distributed
    from ..hardware import Cluster
    from ..plan import Plan
    cluster = Cluster.from_spec(args.cluster) if args.cluster else None
    with warnings.catch_warnings(record=True) as caught:  # the calibration's notes: rank 0 prints
        warnings.simplefilter("always", UserWarning)
        plan = Plan.from_json(args.plan, cluster=cluster, calibration=args.calibration)
    device, owned = init_distributed(single_group=True)
    try:
        result = run_steps(plan, args.steps, args.warmup, device)
        rec = record(plan, result, args.steps, args.warmup, device, args.calibration)
        rank = dist.get_rank()
    finally:
        if owned:
            dist.destroy_process_group()
    if rank != 0:
        return None
    try:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
    except OSError as exc:
        raise output_error(args.out, exc) from exc
    for w in caught:  # on stderr, so that --json's output stays the record
        err.print(str(w.message), style="yellow", highlight=False)
    if args.json:
        return rec
    m, p = rec["measured"], rec["prediction"]
    out.print(f"[bold]autopar measure[/bold]: {plan.model} plan on {plan.cluster} "
              f"({plan.world_size} ranks): median step {m['step_time_s']:.4f} s over "
              f"{args.steps} steps; predicted {p['step_time_s']:.4f} s "
              f"({p['step_time_relative_error'] * 100:+.1f}%)", highlight=False)
    if m["memory_gib"] is not None:
        out.print(f"peak memory {m['memory_gib']:.2f} GiB per GPU (max over ranks); predicted "
                  f"{p['memory_per_gpu_bytes'] / 2 ** 30:.2f} GiB", highlight=False)
    if rec["notes"]:
        out.print(f"note: {rec['notes']}", style="yellow", highlight=False)
    err.print(f"wrote {args.out}", style="dim")
    return None
