"""Search quality: the searched plan vs the published hand-tuned plan, under the same cost model.

    python -m benchmarks.search_quality [--plans PATH] [--time-limit S]

Per record: the published plan's predicted step time (its null fields chosen by the search, as in
``benchmarks.accuracy``), the searched plan's (the whole space: degrees, micro-batch, interleaving,
ZeRO, placement, CP mode, stage cuts, per-block recomputation), their ratio and the search wall
time. A published plan that does not fit under autopar's memory model is still compared on time
and flagged. Then ``better-or-equal <k>/<n>, mean speedup <x>, max search <s> s``.

Then, on heterogeneous models (:data:`HETERO`: dense and MoE blocks, sliding and global
attention, linear and full attention), the best uniform plan (one recompute mode for all blocks,
balanced stage cuts: ``SpaceLimits(layerwise=False)``) and the best layer-wise plan (per-block
recomputation, uneven cuts) side by side, with what layer-wise choice buys. ``--no-hetero`` skips
them; ``--hetero-only`` skips the published records. A time marked ``*`` is the best found before
``--time-limit`` stopped that search.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.graph import extract, hf
from autopar.search.optimize import search
from autopar.search.space import SpaceLimits

from .accuracy import evaluate
from .records import load, parse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", default=None, help="published_plans.json-format file")
    ap.add_argument("--time-limit", type=float, default=None, help="search limit per record (s)")
    ap.add_argument("--no-hetero", action="store_true", help="skip the heterogeneous models")
    ap.add_argument("--hetero-only", action="store_true", help="only the heterogeneous models")
    args = ap.parse_args(argv)
    if not args.hetero_only:
        _published(args)
    if not args.no_hetero:
        hetero(args.time_limit)
    return 0


#: Heterogeneous problems: (HF preset, cluster, global batch, sequence length). Memory-tight on
#: purpose (where recomputation and uneven cuts matter); not published runs.
HETERO = [
    ("hf-gemma3-27b", "2x8xA100-40GB", 64, 4096),
    ("hf-gpt-oss-20b", "1x8xA100-80GB", 64, 4096),
    ("hf-llama4-scout", "4x8xA100-80GB", 128, 8192),
    ("hf-qwen3-next-80b-a3b", "4x8xH100", 128, 4096),
    ("hf-deepseek-v3", "32x8xH100", 1024, 4096),
]


def _describe(e) -> str:
    c = e.config
    rc = c.recompute if isinstance(c.recompute, str) else "/".join(
        f"{m[0]}{c.recompute.count(m)}" for m in ("none", "selective", "full")
        if m in c.recompute)
    return (f"tp{c.tp} pp{c.pp} dp{c.dp} cp{c.cp} ep{c.ep} z{c.zero_stage} "
            f"mbs{c.micro_batch_size} v{c.virtual_stages} rc={rc} cuts={list(c.stage_blocks)}")


def hetero(time_limit: float | None) -> None:
    """Print the best uniform and the best layer-wise plan of every :data:`HETERO` problem."""
    print(f"\n{'heterogeneous model':24s} {'cluster':14s} {'uniform s':>9s} {'layerwise s':>11s} "
          f"{'speedup':>7s}  plans (uniform | layer-wise)")
    for preset, spec, gbs, seq in HETERO:
        train = autopar.TrainingConfig(global_batch_size=gbs, seq_len=seq)
        graph = extract(hf.build(preset), seq, 1, name=preset)
        cm = CostModel(graph, autopar.Cluster.from_spec(spec), train)
        got = {}
        for name, layerwise in (("uniform", False), ("layerwise", True)):
            try:
                got[name] = search(cm, time_limit_s=time_limit, top_k=1,
                                   limits=SpaceLimits(layerwise=layerwise))
            except autopar.InfeasibleError:
                got[name] = None
        # '*': the time limit stopped that search (best so far shown)
        mark = {k: "" if r is None or r.complete else "*" for k, r in got.items()}
        u, lw = (got[k].best if got[k] else None for k in ("uniform", "layerwise"))
        us = f"{u.step_time_s:.3f}{mark['uniform']}".rjust(9) if u else f"{'no fit':>9s}"
        ls = f"{lw.step_time_s:.3f}{mark['layerwise']}".rjust(11) if lw else f"{'no fit':>11s}"
        sp = f"{u.step_time_s / lw.step_time_s:7.3f}" if u and lw else f"{'-':>7s}"
        print(f"{preset:24s} {spec:14s} {us} {ls} {sp}  "
              f"{_describe(u) if u else '-'} | {_describe(lw) if lw else '-'}")


def _published(args) -> None:
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


if __name__ == "__main__":
    raise SystemExit(main())
