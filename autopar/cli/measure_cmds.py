"""The ``autopar calibrate`` and ``autopar measure`` commands (run under torchrun on the
user's nodes, or as one process); the measuring itself is in :mod:`autopar.calibrate`."""

from __future__ import annotations

import json
import os
import warnings

import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table

from ..errors import InvalidCalibration, output_error
from ..hardware import Cluster
from ..report.summary import plural
from .inputs import model_arg


def _on_every_rank(work, single_group: bool = False):
    """``(work(device), rank)``: ``work`` run on this process's device under a process group
    (torchrun's, or a one-process group made here and destroyed after), and this rank."""
    from ..calibrate.run import init_distributed
    device, owned = init_distributed(single_group=single_group)
    try:
        result = work(device)
        rank = dist.get_rank() if dist.is_initialized() else 0
    finally:
        if owned:
            dist.destroy_process_group()
    return result, rank


def _sizes(args) -> None:
    for flag in ("seq_len", "min_bytes", "max_bytes", "copy_bytes"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise InvalidCalibration(f"--{flag.replace('_', '-')} must be >= 1; got {v}.")
    if args.min_bytes and args.max_bytes and args.min_bytes > args.max_bytes:
        raise InvalidCalibration(f"--min-bytes {args.min_bytes} exceeds --max-bytes "
                                 f"{args.max_bytes}. Fix: swap them.")


def cmd_calibrate(args, out: Console, err: Console) -> dict | None:
    """Run the calibration; rank 0 writes ``--out`` and prints the comparison table
    (``--check``: :func:`cmd_check`)."""
    from ..calibrate.run import (Options, comparison, fit_warnings, run_calibration)
    _sizes(args)
    with_check = ("calibration", "cluster", "plan", "threshold")
    if not args.check and any(getattr(args, f) is not None for f in with_check):
        raise InvalidCalibration("--calibration, --cluster, --plan and --threshold belong to "
                                 "--check. Fix: add --check, or drop them.")
    if args.check:
        return cmd_check(args, out, err)
    if args.model is None or args.out is None:
        raise InvalidCalibration("calibrate needs --model and --out (or --check). Fix: e.g. "
                                 "`autopar calibrate --model llama3-8b --out cal.json`.")
    options = Options(model=model_arg(args.model), seq_len=args.seq_len,
                      precision=args.precision, budget_s=args.budget, min_bytes=args.min_bytes,
                      max_bytes=args.max_bytes, copy_bytes=args.copy_bytes, catalog=args.device)
    talk = int(os.environ.get("RANK", 0)) == 0  # rank 0 reports progress, on stderr

    def progress(line: str) -> None:
        if talk:
            err.print(f"calibrate: {line}", style="dim", highlight=False)

    def work(device):
        if talk:
            err.print(f"calibrate: budget {args.budget:g} s (--budget); what is measured by "
                      "then is written, with notes on what was skipped", style="dim",
                      highlight=False)
            if "RANK" not in os.environ:
                err.print("calibrate: one process (not under torchrun): no collectives are "
                          "measured; run `torchrun --nproc-per-node=N -m autopar.cli calibrate "
                          "...` to measure links" + ("" if device.type == "cuda" else
                          "; on a CPU the figures describe this CPU (a measured cluster), "
                          "not a GPU"), style="yellow", highlight=False)
        return run_calibration(options, device, progress)

    cal, rank = _on_every_rank(work)
    if rank != 0:
        return None
    cal.to_json(args.out)
    notes = [f"note: {n}" for n in cal.notes]
    warns = [f"warning: {w}" for w in fit_warnings(cal)]
    if args.json:
        for w in warns + notes:  # on stderr, so that --json's output stays the file
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
    for n in notes:
        out.print(n, style="yellow", highlight=False)
    err.print(f"wrote {args.out}", style="dim")
    return None


def cmd_measure(args, out: Console, err: Console) -> dict | None:
    """Run the plan's steps; rank 0 writes the record to ``--out``."""
    from ..calibrate.measure import preflight, record, run_steps
    from ..hardware import Cluster
    from ..plan import Plan
    cluster = Cluster.from_spec(args.cluster) if args.cluster else None
    with warnings.catch_warnings(record=True) as caught:  # the calibration's notes: rank 0 prints
        warnings.simplefilter("always", UserWarning)
        plan = Plan.from_json(args.plan, cluster=cluster, calibration=args.calibration)
    if not dist.is_initialized():  # refused before a process group or a model exists
        world = int(os.environ.get("WORLD_SIZE", 1)) if "RANK" in os.environ else 1
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) \
            if torch.cuda.is_available() else torch.device("cpu")
        preflight(plan, world, device, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    rec, rank = _on_every_rank(lambda device: record(
        plan, run_steps(plan, args.steps, args.warmup, device), args.steps, args.warmup, device,
        args.calibration), single_group=True)
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
              f"({plural(plan.world_size, 'rank')}): median step {m['step_time_s']:.4f} s over "
              f"{plural(args.steps, 'step')}; predicted {p['step_time_s']:.4f} s "
              f"({p['step_time_relative_error'] * 100:+.1f}%)", highlight=False)
    if m["memory_gib"] is not None:  # a GPU's allocator peak; None on a CPU (not compared)
        out.print(memory_line(rec), highlight=False)
    if rec["notes"]:
        out.print(f"note: {rec['notes']}", style="yellow", highlight=False)
    err.print(f"wrote {args.out}", style="dim")
    return None


def memory_line(rec: dict) -> str:
    """The measured and predicted peak memory per GPU of a GPU's record (:func:`cmd_measure`),
    in GB (1e9 bytes) as ``plan`` and ``estimate`` print memory, e.g. ``peak memory 42.00 GB
    per GPU (max over ranks); predicted 45.00 GB (+7.1%)``. The record's ``memory_gib`` field
    stays in GiB; the line is computed from ``memory_per_rank_bytes``."""
    m, p = rec["measured"], rec["prediction"]
    line = (f"peak memory {max(m['memory_per_rank_bytes']) / 1e9:.2f} GB per GPU (max over "
            f"ranks); predicted {p['memory_per_gpu_bytes'] / 1e9:.2f} GB")
    err = p.get("memory_relative_error")
    return line if err is None else f"{line} ({err * 100:+.1f}%)"


def _measured(args):
    """The check's calibration: ``--calibration``'s file, else measured now on every rank
    (None on ranks other than 0); ``--out`` written by rank 0."""
    from ..calibrate import load_calibration
    from ..calibrate.check import measure_links
    if args.calibration:
        return load_calibration(args.calibration)
    cal, rank = _on_every_rank(lambda device: measure_links(
        device, args.min_bytes, args.max_bytes, args.budget, args.device))
    if rank != 0:
        return None
    if args.out:
        cal.to_json(args.out)
    return cal


def _problem_cost(model, cluster, calibration, seq_len):
    """The best plan of ``model`` on ``cluster`` (the catalogue's figures, default training:
    :func:`autopar.optimize`), priced with the measured links by
    :func:`autopar.calibrate.check.plan_cost` (here, above the API: calibrate sits below it).

    Raises:
        AutoparError subclasses: as :func:`autopar.optimize` and ``plan_cost``.
    """
    from .. import api
    from ..calibrate.check import plan_cost
    from ..problem import model_config_of
    train = None
    if seq_len is not None:
        train = api.default_training(model_config_of(model), cluster, seq_len, model=model)
    return plan_cost(api.optimize(model, cluster, train), calibration, cluster=cluster)


def _cost(args, cal, report):
    """``report`` with the cost of ``--plan`` (or of ``--model``'s best plan on the reference),
    or a note saying why there is none."""
    from ..calibrate.check import plan_cost, reference_cluster, with_cost
    from ..errors import AutoparError
    try:
        if args.plan:
            cost = plan_cost(args.plan, cal, Cluster.from_spec(args.cluster) if args.cluster
                             else None)
        elif args.model:
            cost = _problem_cost(model_arg(args.model), reference_cluster(cal, args.cluster),
                                 cal, args.seq_len)
        else:
            return with_cost(report, None, "no plan priced: pass --plan FILE or --model NAME to "
                                           "see what the measured links cost a step.")
    except AutoparError as exc:
        return with_cost(report, None, f"the plan was not re-estimated with the measured links: "
                                       f"{exc}")
    return with_cost(report, cost)


def cmd_check(args, out: Console, err: Console) -> dict | None:
    """``calibrate --check``: rank 0 prints each link's measured bus bandwidth against the
    catalogue and published runs, flags the short ones and prices the plan both ways."""
    from ..calibrate.check import check_links, reference_cluster
    from ..plan import Plan
    cal = _measured(args)
    if cal is None:
        return None
    cluster = args.cluster
    if cluster is None and args.plan:
        cluster = Plan.from_json(args.plan).cluster
    if reference_cluster(cal, cluster) is None:
        return _unreferenced(args, cal, out)
    report = _cost(args, cal, check_links(cal, cluster, args.threshold))
    args.short_links = len(report.short)  # the command's exit code: 1 when any is short
    if args.json:
        return report.to_dict()
    w = cal.world
    out.print(f"[bold]autopar calibrate --check[/bold]: {w.world_size} ranks on {w.num_nodes} "
              f"node(s) ({cal.device.name}, {cal.backend}) against {report.cluster}")
    t = Table("link", "op", "size", "measured busbw", "catalogue", "ratio", "short below",
              "published (same fabric)", "verdict")
    for v in report.verdicts:
        where = (f"node ({v.group_size} ranks)" if v.scope == "intra"
                 else f"rails ({v.nodes} nodes)")
        pub = "-"
        if v.published is not None:
            pub = (f"{v.published.busbw_Bps / 1e9:.1f} GB/s at "
                   f"{v.published.nbytes / 2 ** 30:.0f} GiB")
            pub += (f" (x{v.published_ratio:.2f})" if v.published_ratio is not None
                    else " (not measured at that size: --max-bytes)")
        t.add_row(where, v.op, _size(v.nbytes), f"{v.measured_Bps / 1e9:.3g} GB/s",
                  f"{v.expected_Bps / 1e9:.3g} GB/s", f"{v.ratio:.2f}", f"{v.threshold:.2f}",
                  pub, "[bold red]SHORT[/bold red]" if v.short else "ok")
    out.print(t)
    for v in report.short:
        out.print(f"short: {v.scope}-node {v.op} at {_size(v.nbytes)}: {v.short}",
                  style="bold red", highlight=False)
    for thr, src in dict.fromkeys((v.threshold, v.threshold_source) for v in report.verdicts):
        out.print(f"short below {thr:.2f}: {src}", style="dim", highlight=False)
    if report.cost is not None:
        c = report.cost
        out.print(f"step time of {c.plan}: {c.catalog_step_s:.4g} s with the catalogue's links, "
                  f"{c.measured_step_s:.4g} s with the measured ones ({c.slowdown:.2f}x)",
                  highlight=False)
        for n in c.notes:
            out.print(f"note: {n}", style="yellow", highlight=False)
    for n in report.notes:
        out.print(f"note: {n}", style="yellow", highlight=False)
    return None


def _unreferenced(args, cal, out: Console) -> dict | None:
    """Measured bus bandwidths alone, for a device with no catalogue row and no --cluster."""
    from ..hardware.collectives import bus_factor
    rows = [{"scope": c.scope, "op": c.op, "group_size": c.group_size, "nbytes": c.nbytes,
             "busbw_Bps": c.nbytes / c.seconds * bus_factor(c.op, c.group_size)}
            for c in cal.collectives]
    note = (f"{cal.device.name} has no catalogue row: nothing to check the links against. "
            "Fix: pass --cluster SPEC naming the fabric they should match"
            + (f"; the measurements are in {args.out} (--calibration)." if args.out else "."))
    if args.json:
        return {"measured": rows, "notes": [note]}
    t = Table("link", "op", "size", "measured busbw")
    for r in rows:
        t.add_row(f"{r['scope']} ({r['group_size']} ranks)", r["op"], _size(r["nbytes"]),
                  f"{r['busbw_Bps'] / 1e9:.3g} GB/s")
    out.print(t)
    out.print(f"note: {note}", style="yellow", highlight=False)
    return None


def _size(nbytes: int) -> str:
    """A collective's message size in binary units (GiB = 2^30 bytes): the sweeps' sizes are
    powers of two, as nccl-tests' are, so 8 GiB prints exactly where GB would read 8.6."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.0f} {unit}"
    return f"{nbytes} B"
