"""Search quality: the searched plan vs the published hand-tuned plan, under the same cost model.

    python -m benchmarks.search_quality [--plans PATH] [--time-limit S]

Per record: the published plan's predicted step time (its null fields chosen by the search, as in
``benchmarks.accuracy``), the searched plan's (the whole space: degrees, micro-batch, interleaving,
ZeRO, placement, CP mode, stage cuts, per-block recomputation), their ratio and the search wall
time. A published plan that does not fit under autopar's memory model is still compared on time
and flagged. Last line: ``better-or-equal <k>/<n>, mean speedup <x>, max search <s> s``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.search.optimize import search

from .accuracy import evaluate
from .records import load, parse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", default=None, help="published_plans.json-format file")
    ap.add_argument("--time-limit", type=float, default=None, help="search limit per record (s)")
    args = ap.parse_args(argv)
    better, speedups, walls, n = 0, [], [], 0
    print(f"{'id':36s} {'published s':>11s} {'searched s':>10s} {'ratio':>6s} {'search s':>8s}  "
          "searched plan")
    for raw in load(args.plans):
        rec = parse(raw)
        try:
            published = evaluate(rec)
        except autopar.AutoparError as exc:
            print(f"{rec.id:36s} published plan could not be estimated: {exc}")
            continue
        train = dataclasses.replace(rec.train, micro_batch_size=None)
        graph, _ = model_graph(rec.model, train)
        cm = CostModel(graph, rec.cluster, train)
        t0 = time.monotonic()
        try:
            found = search(cm, time_limit_s=args.time_limit, top_k=1).best
        except autopar.InfeasibleError as exc:
            print(f"{rec.id:36s} no fitting plan: {exc}")
            continue
        wall = time.monotonic() - t0
        n += 1
        ratio = found.step_time_s / published.fastest_s
        better += ratio <= 1 + 1e-9
        speedups.append(1 / ratio)
        walls.append(wall)
        c = found.config
        rc = c.recompute if isinstance(c.recompute, str) else "mixed"
        print(f"{rec.id:36s} {published.fastest_s:11.3f} {found.step_time_s:10.3f} "
              f"{ratio:6.3f} {wall:8.2f}  tp{c.tp} pp{c.pp} dp{c.dp} cp{c.cp}({c.cp_mode}) "
              f"z{c.zero_stage} mbs{c.micro_batch_size} v{c.virtual_stages} rc={rc}"
              f"{'' if published.fits else '  [published plan does not fit under our model]'}")
    if n:
        print(f"better-or-equal {better}/{n}, mean speedup {sum(speedups) / n:.3f}, "
              f"max search {max(walls):.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
