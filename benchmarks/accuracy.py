"""Cost-model accuracy: predicted vs measured step time over published runs.

    python -m benchmarks.accuracy [--plans PATH]

Each record is estimated with its own published plan; fields the source leaves null are chosen by
autopar's search under the same cost model as the fastest (the natural choice for a measured, tuned
run, which fitted in reality whatever autopar's memory model says; its verdict is printed) and
printed. Last line: ``MAPE <x>% max <y>% over <n> records``.
"""

from __future__ import annotations

import argparse
import time

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.search.optimize import search

from .records import load, parse


def evaluate(rec):
    """(estimate, chosen open fields) for one parsed record."""
    graph, _ = model_graph(rec.model, rec.train)
    cm = CostModel(graph, rec.cluster, rec.train)
    if rec.open_fields:
        # the run happened, so it fitted: its unpublished fields are the fastest choice under the
        # cost model, whatever autopar's memory model says (the line reports that separately)
        e = search(cm, rec.fixed, top_k=1, require_fit=False).best
    else:
        e = cm.estimate(autopar.ParallelConfig(**rec.fixed))
    chosen = {k: getattr(e.config, k) for k in rec.open_fields}
    return e, chosen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", default=None, help="published_plans.json-format file")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table instead")
    ap.add_argument("--cv", choices=["source"], default=None,
                    help="leave one source out over the whole corpus (benchmarks/data): signed "
                         "bias and MAPE per source, pooled LOSO MAPE")
    ap.add_argument("--pairs", action="store_true",
                    help="same-problem pairs of measured plans: share ordered as measured")
    ap.add_argument("--memory", action="store_true",
                    help="predicted vs published peak memory per GPU (MAPE)")
    args = ap.parse_args(argv)
    if args.cv or args.pairs or args.memory:
        return _validate(args)
    if args.markdown:
        return _markdown(args.plans)
    errors = []
    print(f"{'id':36s} {'pred s':>9s} {'meas s':>9s} {'err':>7s}  {'MFU':>5s} {'mem GB':>6s}  chosen")
    for raw in load(args.plans):
        t0 = time.monotonic()
        rec = parse(raw)
        try:
            e, chosen = evaluate(rec)
        except autopar.AutoparError as exc:
            print(f"{rec.id:36s} error: {exc}")
            continue
        if rec.measured_step_s is None:
            print(f"{rec.id:36s} {e.step_time_s:9.3f} {'-':>9s}")
            continue
        err = (e.step_time_s - rec.measured_step_s) / rec.measured_step_s
        errors.append(abs(err))
        print(f"{rec.id:36s} {e.step_time_s:9.3f} {rec.measured_step_s:9.3f} {err * 100:+6.1f}%  "
              f"{e.mfu * 100:5.1f} {e.memory_per_gpu_bytes / 1e9:6.1f}  "
              f"{chosen if chosen else ''} {'' if e.fits else 'DOES-NOT-FIT'} "
              f"({time.monotonic() - t0:.1f}s)")
    if errors:
        print(f"MAPE {100 * sum(errors) / len(errors):.1f}% max {100 * max(errors):.1f}% "
              f"over {len(errors)} records")
    return 0


def _validate(args) -> int:
    """--cv / --pairs / --memory over the corpus (or --plans), open fields at framework defaults."""
    from . import validation
    raw = validation.load_corpus([args.plans] if args.plans else None)
    rows, skipped = validation.evaluate_all(raw)
    print(f"{len(raw)} records, {len(rows)} evaluated, {len(skipped)} skipped "
          "(open plan fields at the framework's documented default)")
    for rid, why in skipped:
        print(f"  skipped {rid}: {why}")
    for r in rows:
        err = r.error
        spread = (r.fastest_s - r.predicted_s) / r.predicted_s if r.predicted_s else 0.0
        print(f"  {r.rec.id:44s} pred {r.predicted_s:9.3f} s "
              f"meas {r.rec.measured_step_s or float('nan'):9.3f} s "
              f"{'' if err is None else f'{100 * err:+6.1f}%'}  fastest legal {100 * spread:+.0f}%"
              f"  {r.chosen if r.chosen else ''}")
    if args.cv:
        print("\n".join(validation.loso(rows)))
    if args.pairs:
        print("\n".join(validation.pairs(rows)))
    if args.memory:
        print("\n".join(validation.memory(rows)))
    return 0


def _markdown(plans) -> int:
    """The same comparison as a Markdown table (for docs/cost-model.md)."""
    errors = []
    print("| record | predicted s/step | measured s/step | error | predicted MFU % | "
          "predicted GB/GPU | fits (model) |")
    print("|---|---|---|---|---|---|---|")
    for raw in load(plans):
        rec = parse(raw)
        e, _ = evaluate(rec)
        if rec.measured_step_s is None:
            continue
        err = (e.step_time_s - rec.measured_step_s) / rec.measured_step_s
        errors.append(abs(err))
        print(f"| {rec.id} | {e.step_time_s:.3f} | {rec.measured_step_s:.3f} | {err * 100:+.1f}% | "
              f"{e.mfu * 100:.1f} | {e.memory_per_gpu_bytes / 1e9:.1f} | "
              f"{'yes' if e.fits else 'no'} |")
    print(f"\nMAPE {100 * sum(errors) / len(errors):.1f}% max {100 * max(errors):.1f}% over "
          f"{len(errors)} records")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
