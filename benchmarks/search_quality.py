"""Search quality: the searched plan vs the published hand-tuned plan, under the same cost model.

    python -m benchmarks.search_quality [--plans PATH] [--time-limit S]

Per record: the published plan's predicted step time (its null fields chosen by the search, as in
``benchmarks.accuracy``), the searched plan's (the whole space: degrees, micro-batch, interleaving,
ZeRO, placement, CP mode, stage cuts, per-block recomputation), their ratio, whether the speedup
exceeds the published plan's error band (its regime's validated band, or "unvalidated"), and the
search wall time; then the plan :func:`autopar.optimize` returns with a user's defaults (the
robust objective and the default memory margin, :func:`autopar.search.margin.default_margin`)
and its ratio to the published plan. Both are costed and searched under the record's own
framework profile and options (:func:`benchmarks.validation.scored_profile`, as
``benchmarks.accuracy`` costs the published plan), so the ratio compares plans, not frameworks.
The search is :func:`autopar.search.optimize.search` itself (the model's fastest plan, no memory
margin: not ``optimize``'s robust objective). A published plan that does not fit under
autopar's memory model is still compared on time and flagged. Then ``better-or-equal <k>/<n>,
mean speedup <x>, beyond the published plan's band <b>/<n>, max search <s> s`` and ``with a
user's defaults: better-or-equal <k>/<n>`` (issue 25: the defaults should never return a plan
the model predicts slower than the published one). Records of one problem (model, cluster,
training config and profile) share one search ("same" in the search column).

Then, on heterogeneous models (:data:`HETERO`: dense and MoE blocks, sliding and global
attention, linear and full attention), the best uniform plan (one recompute mode for all blocks,
balanced stage cuts: ``SpaceLimits(layerwise=False)``) and the best layer-wise plan (per-block
recomputation, uneven cuts) side by side, with what layer-wise choice buys (per-block
recomputation as blocks per mode: ``n`` none, ``s`` selective, ``o`` selective-op, ``f`` full). ``--no-hetero`` skips
them; ``--hetero-only`` skips the published records. A time marked ``*`` is the best found before
``--time-limit`` stopped that search.

Last, DeepSeek-V3 on 2048 H800 (:func:`deepseek_v3`): its published plan (:data:`DEEPSEEK_V3_PLAN`)
under the cost model beside the best uniform and best layer-wise searched plan for the same model,
cluster and batch, with their ratios to the published plan. ``--no-deepseek`` skips it.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.cost.regime import ErrorBand, Regime, band_for
from autopar.graph import extract, hf
from autopar.search.margin import default_margin, search_with_margin
from autopar.search.optimize import search
from autopar.search.robust import robust_result
from autopar.search.space import SpaceLimits

from . import validation
from .accuracy import evaluate
from .records import load, parse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", default=None, help="published_plans.json-format file")
    ap.add_argument("--time-limit", type=float, default=None, help="search limit per record (s)")
    ap.add_argument("--no-hetero", action="store_true", help="skip the heterogeneous models")
    ap.add_argument("--hetero-only", action="store_true", help="only the heterogeneous models")
    ap.add_argument("--no-deepseek", action="store_true", help="skip the DeepSeek-V3 comparison")
    ap.add_argument("--framework", default="torch", choices=list(autopar.config.FRAMEWORKS),
                    help="target framework of the heterogeneous problems (default torch; "
                         "megatron also searches MoE parallel folding)")
    args = ap.parse_args(argv)
    if not args.hetero_only:
        _published(args)
    if not args.no_hetero:
        hetero(args.time_limit, args.framework)
    if not args.no_deepseek:
        deepseek_v3(args.time_limit)
    return 0


#: DeepSeek-V3's published plan (DeepSeek-V3 technical report, arXiv 2412.19437, sec. 3.2: "16-way
#: Pipeline Parallelism (PP), 64-way Expert Parallelism (EP) spanning 8 nodes, and ZeRO-1 Data
#: Parallelism (DP)", "without using costly Tensor Parallelism"; sec. 3.2.3: "We recompute all
#: RMSNorm operations and MLA up-projections"; sec. 4.2: sequence 4096, global batch 15360).
#: As autopar writes it:
#:
#: - DualPipe (sec. 3.2.1, bidirectional, two copies of the model) -> ``dualpipev``, the nearest
#:   schedule torch.distributed.pipelining runs (ScheduleDualPipeV: DualPipe folded into a V, two
#:   chunks per rank, one copy of the model), so ``virtual_stages`` is 2;
#: - the recomputation of RMSNorm and MLA up-projections -> ``selective`` (autopar's nearest
#:   policy that recomputes a cheap part of each block; no mode is exactly that set);
#: - dp = 2048 / 16 = 128 (derived); EP64 is carved out of it, on consecutive ranks (8 nodes);
#: - fields the report leaves open take the documented default of the stack that runs the
#:   schedule (plan.apply on torch.distributed: :data:`benchmarks.validation._DEFAULTS` for an
#:   unnamed stack): micro-batch 1, no CP, no sequence parallelism, balanced stage cuts, default
#:   placement; not the cost model's fastest choice.
DEEPSEEK_V3_PLAN = dict(tp=1, pp=16, dp=128, cp=1, ep=64, zero_stage=1, recompute="selective",
                        sequence_parallel=False, micro_batch_size=1, schedule="dualpipev",
                        virtual_stages=2)
#: The problem: (HF preset, cluster, global batch, sequence length, precision). The H800 node
#: template carries the report's links (NVLink, 8 x 400 Gb/s InfiniBand NDR: 50 GB/s per GPU).
#: The preset leaves out the multi-token-prediction module (not built by transformers).
DEEPSEEK_V3 = ("hf-deepseek-v3", "256x8xH800", 15360, 4096, "fp8")
#: The report's own throughput: 180K H800-hours per trillion tokens (sec. 1), as seconds per
#: 15360 x 4096-token step on 2048 GPUs (a whole-run average: a reference, not a target).
DEEPSEEK_V3_REPORTED_S = 15360 * 4096 * 180e3 * 3600 / 1e12 / 2048


def deepseek_v3(time_limit: float | None) -> None:
    """Print DeepSeek-V3's published plan under the cost model, the best uniform and the best
    layer-wise searched plan for the same problem, and each one's ratio to the published plan.

    All three use one cost model: the ``torch`` framework profile (what plan.apply runs: the
    DualPipeV schedule, ZeRO-1 with expert parallelism; it does not hide the expert all-to-alls
    behind compute as DualPipe does, for either plan). A plan that does not fit under autopar's
    memory model is still compared on time and flagged."""
    preset, spec, gbs, seq, precision = DEEPSEEK_V3
    train = autopar.TrainingConfig(global_batch_size=gbs, seq_len=seq, precision=precision,
                                   optimizer="adamw", framework="torch")
    graph = extract(hf.build(preset), seq, 1, name=preset)
    cm = CostModel(graph, autopar.Cluster.from_spec(spec), train)
    pub = cm.estimate(autopar.ParallelConfig(**DEEPSEEK_V3_PLAN))
    print(f"\nDeepSeek-V3 on {spec} (global batch {gbs}, seq {seq}, {precision}); the report's "
          f"own average: {DEEPSEEK_V3_REPORTED_S:.1f} s per step")
    rows = [("published (DualPipe->dualpipev)", pub, "")]
    for name, layerwise in (("searched uniform", False), ("searched layer-wise", True)):
        t0 = time.monotonic()
        r = search(cm, time_limit_s=time_limit, top_k=1, limits=SpaceLimits(layerwise=layerwise))
        rows.append((name, r.best, f"{time.monotonic() - t0:.1f} s search"
                     + ("" if r.complete else ", time limit hit")))
    print(f"{'plan':32s} {'step s':>8s} {'ratio':>6s} {'mem GiB':>8s}  plan")
    for name, e, note in rows:
        flag = "" if e.fits else "  [does not fit under our memory model]"
        print(f"{name:32s} {e.step_time_s:8.3f} {e.step_time_s / pub.step_time_s:6.3f} "
              f"{e.memory_per_gpu_bytes / 2 ** 30:8.1f}  {_describe(e)}"
              f"{' (' + note + ')' if note else ''}{flag}")


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
    short = {"none": "n", "selective": "s", "selective-op": "o", "full": "f"}
    rc = c.recompute if isinstance(c.recompute, str) else "/".join(
        f"{short[m]}{c.recompute.count(m)}" for m in autopar.config.RECOMPUTE_MODES
        if m in c.recompute)
    return (f"tp{c.tp} pp{c.pp} dp{c.dp} cp{c.cp} ep{c.ep}"
            f"{f' etp{c.etp}' if c.folded else ''} z{c.zero_stage} "
            f"mbs{c.micro_batch_size} v{c.virtual_stages} rc={rc} cuts={list(c.stage_blocks)}")


def hetero(time_limit: float | None, framework: str = "torch") -> None:
    """Print the best uniform and the best layer-wise plan of every :data:`HETERO` problem for
    the target ``framework`` (its profile sets the space: e.g. MoE parallel folding under
    Megatron, shown as ``etp``)."""
    print(f"\nframework profile: {framework}")
    print(f"{'heterogeneous model':24s} {'cluster':14s} {'uniform s':>9s} {'layerwise s':>11s} "
          f"{'speedup':>7s}  plans (uniform | layer-wise)")
    for preset, spec, gbs, seq in HETERO:
        train = autopar.TrainingConfig(global_batch_size=gbs, seq_len=seq, framework=framework)
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


def published_band(row) -> ErrorBand:
    """The error band of a record's published plan (its validation ``row``): its regime's
    (:func:`autopar.cost.regime.band_for`), keyed as ``benchmarks.bands`` keys the record: the
    regime of the published plan's estimate (``row.regime``,
    :meth:`autopar.cost.regime.Regime.of`: the framework the
    record's stack is banded with, its precision, GPU generation, the sharding kind of the
    published plan with its open fields at the framework's defaults, dense/MoE, the cluster's
    scale and the model's size bucket)."""
    return band_for(Regime(*row.regime))


def band_verdict(speedup: float, band: ErrorBand) -> str:
    """Whether a speedup over the published plan (published / searched step time) exceeds the
    published plan's band: "beyond ± 7%", "inside ± 7%", or "unvalidated" (no validated band:
    the model cannot say whether the difference is real)."""
    if not band.validated:
        return "unvalidated"
    return f"{'beyond' if abs(speedup - 1) > band.half_width else 'inside'} {band.text()}"


def _published(args) -> None:
    better, speedups, walls, n, beyond, default_ok = 0, [], [], 0, 0, 0
    searched: dict = {}   # problem -> (best or the InfeasibleError, search seconds, defaults' best)
    shown: set = set()
    print("Each record searched under its own framework profile (benchmarks.validation."
          "scored_profile: the profile and options its published plan is costed with); band: "
          "whether the speedup exceeds the published plan's regime band")
    print(f"{'id':36s} {'published s':>11s} {'searched s':>10s} {'ratio':>6s} {'band':>13s} "
          f"{'search s':>8s} {'default':>7s}  searched plan (fastest, no margin) | plan with a "
          "user's defaults (ratio in 'default')")
    for raw in load(args.plans):
        rec = parse(raw)
        try:
            published = evaluate(rec)
        except autopar.AutoparError as exc:
            print(f"{rec.id:36s} published plan could not be estimated: {exc}")
            continue
        # the record's framework and options, as validation.evaluate costs the published plan
        # (searching under the default torch profile compared two frameworks)
        train = dataclasses.replace(validation.training(rec), micro_batch_size=None)
        profile = validation.scored_profile(rec)
        # records of one problem (the same model, cluster, training and profile: e.g. one
        # model's full and selective recomputation runs) search once
        key = (repr(rec.model), repr(rec.cluster), train, repr(profile))
        if key not in searched:
            graph, _ = model_graph(rec.model, train)
            cm = CostModel(graph, rec.cluster, train, framework=profile)
            t0 = time.monotonic()
            try:
                searched[key] = (search(cm, time_limit_s=args.time_limit, top_k=1).best,
                                 time.monotonic() - t0, user_defaults(cm, args.time_limit))
            except autopar.InfeasibleError as exc:
                searched[key] = (exc, 0.0, None)
        found, wall, default = searched[key]
        again = key in shown   # the search of an earlier record: its time counted once
        shown.add(key)
        if isinstance(found, Exception):
            print(f"{rec.id:36s} no fitting plan: {found}")
            continue
        n += 1
        ratio = found.step_time_s / published.fastest_s
        better += ratio <= 1 + 1e-9
        speedups.append(1 / ratio)
        walls.append(0.0 if again else wall)
        verdict = band_verdict(1 / ratio, published_band(published))
        beyond += verdict.startswith("beyond")
        dratio = default.step_time_s / published.fastest_s if default else float("nan")
        default_ok += default is not None and dratio <= 1 + 1e-9
        print(f"{rec.id:36s} {published.fastest_s:11.3f} {found.step_time_s:10.3f} "
              f"{ratio:6.3f} {verdict:>13s} {'same' if again else f'{wall:.2f}':>8s} "
              f"{dratio:7.3f}  {_short(found)} | {_short(default) if default else 'no plan'}"
              f"{'' if published.fits else '  [published plan does not fit under our model]'}")
    if n:
        print(f"better-or-equal {better}/{n}, mean speedup {sum(speedups) / n:.3f}, "
              f"beyond the published plan's band {beyond}/{n}, max search {max(walls):.1f} s")
        print(f"with a user's defaults (robust objective, memory margin {default_margin():.2f}): "
              f"better-or-equal {default_ok}/{n}")


def user_defaults(cm, time_limit):
    """The best plan :func:`autopar.optimize` returns for ``cm``'s problem with a user's
    defaults: the default memory margin and the robust objective (as ``search_plan`` runs
    them), or None when nothing fits under the margin."""
    margin = default_margin()
    try:
        result = search_with_margin(cm, None, memory_margin=margin, time_limit_s=time_limit,
                                    top_k=6)
        return robust_result(cm, result, None, memory_margin=margin, time_limit_s=time_limit,
                             top_k=6).best
    except autopar.InfeasibleError:
        return None


def _short(e) -> str:
    """The estimate's plan in one column: degrees, CP mode, ZeRO stage, micro-batch, virtual
    stages and recomputation ("mixed" when per block)."""
    c = e.config
    rc = c.recompute if isinstance(c.recompute, str) else "mixed"
    return (f"tp{c.tp} pp{c.pp} dp{c.dp} cp{c.cp}({c.cp_mode}) z{c.zero_stage} "
            f"mbs{c.micro_batch_size} v{c.virtual_stages} rc={rc}")


if __name__ == "__main__":
    raise SystemExit(main())
