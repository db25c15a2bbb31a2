"""Generate autopar's error-band and MFU-plausibility tables from the published-run corpus.

    python -m benchmarks.bands --write     # rewrite autopar/cost/published.py from a new run
    python -m benchmarks.bands --check     # exit 1 when it differs from what a new run gives
    python -m benchmarks.bands             # print the cells and each record's regime

Every record of the development split (``benchmarks/data/*.json`` less the sources of the locked
validation split, ``benchmarks/data/locked_split.json``) that autopar can estimate is predicted with its
published plan, open fields at its framework's documented default (the same evaluation as
``python -m benchmarks.accuracy --cv source``: :func:`benchmarks.validation.evaluate`, no
search). Residuals ``(predicted - measured) / measured`` are leave-one-source-out by
construction: autopar fits no constant to the corpus (``validation.FITTED_CONSTANTS`` is empty).
The rules (regimes, quantile, coarser report cells) are :mod:`autopar.cost.regime`'s; this
script only counts. ``python -m benchmarks.accuracy --write-docs`` runs it too, so one command
regenerates every generated table after a cost-model change. Deterministic; about a minute on one core.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from autopar.cost import regime as rg

from . import validation
from .records import parse

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "autopar" / "cost" / "published.py"
COMMAND = "python -m benchmarks.bands --write"



@dataclass(frozen=True)
class Point:
    """One measured record: its regime key (:meth:`autopar.cost.regime.Regime.key`; framework
    may be "*"), residual, measured MFU."""

    id: str
    source: str
    key: tuple[str, ...]
    residual: float
    measured_mfu: float
    memory_residual: float | None = None


def points(raw: list[dict] | None = None) -> tuple[list[Point], list[tuple[str, str]]]:
    """(points of every measured record autopar estimates, (id, reason) of those refused), in
    corpus order; ``raw`` defaults to the development split (:func:`benchmarks.validation.
    dev_corpus`: the sources of the locked validation split never shape a band)."""
    raw = validation.dev_corpus() if raw is None else raw
    out, skipped = [], []
    for r in raw:
        try:
            rec = parse(r)
            if not rec.measured_step_s:
                continue
            row = validation.evaluate(rec, spread=False)
        except validation.REFUSED as exc:
            skipped.append((r.get("id", "?"), validation.refusal(exc)))
            continue
        meas, mem = rec.measured_step_s, rec.measured_memory_gib
        # the regime the cost model gave the estimate (autopar.cost.regime.Regime.of: the
        # record's stack banded with the framework whose code path it runs, its published plan's
        # sharding, the model graph's experts and parameters, the cluster's nodes): the cell
        # band_for looks up for the same plan
        out.append(Point(rec.id, rec.source_key, row.regime, (row.predicted_s - meas) / meas,
                         row.mfu * row.predicted_s / meas,
                         # the counter the record publishes (allocated, reserved, device), as
                         # benchmarks.accuracy --memory compares it
                         (row.memory_as_published() - mem) / mem
                         if mem and not rec.oom else None))
    return out, skipped


def bands(pts: list[Point]) -> dict[tuple, tuple[float, float, int, int]]:
    """cell -> (half-width, bias, records, sources) for every cell of every level of
    :data:`autopar.cost.regime.LEVELS` with at least :data:`~autopar.cost.regime.MIN_RECORDS`
    records (a record whose framework is "*" joins only cells that pool the framework)."""
    out = {}
    for c, ps in _cells(pts).items():
        errs = [p.residual for p in ps]
        out[c] = (round(rg.nearest_rank([abs(e) for e in errs]), 4),
                  round(sum(errs) / len(errs), 4), len(ps), len({p.source for p in ps}))
    return out


def measured_ranges(pts: list[Point]) -> dict[tuple, tuple[float, float]]:
    """cell -> (low, high) for every cell :func:`bands` gives: the nearest-rank quantiles
    (1 -+ :data:`~autopar.cost.regime.BAND_QUANTILE`) / 2 of measured / predicted step time over
    the cell's runs, the middle BAND_QUANTILE of them (:func:`autopar.cost.regime.
    measured_range`)."""
    return {c: rg.measured_range([p.residual for p in ps]) for c, ps in _cells(pts).items()}


def _cells(pts: list[Point]) -> dict[tuple, list[Point]]:
    """cell -> its points, sorted by cell, for every cell of every level of
    :data:`autopar.cost.regime.LEVELS` with at least :data:`~autopar.cost.regime.MIN_RECORDS`
    points (a point whose framework is "*" joins only cells that pool the framework)."""
    groups: dict[tuple, list[Point]] = defaultdict(list)
    for p in pts:
        for level in rg.LEVELS:
            if p.key[0] == rg.ANY and level[0]:
                continue
            groups[rg.cell(p.key, level)].append(p)
    return {c: ps for c, ps in sorted(groups.items()) if len(ps) >= rg.MIN_RECORDS}


def memory_residuals(pts: list[Point], raw: list[dict] | None = None,
                     experts: str | None = None) -> list[float]:
    """(predicted - measured) / measured peak memory of every run with a published peak (the
    counter it publishes: :meth:`benchmarks.validation.Row.memory_as_published`), OOM reports
    left out: those among ``pts``, then the records with a peak but no step time (evaluated
    here), then the plans measured through ``plan.apply``
    (:func:`benchmarks.validation.measured_plans_memory`, dense models); ``raw`` defaults to
    the development split. ``experts`` ("dense" or "moe", :func:`autopar.cost.regime.
    experts_kind`) keeps the runs of that kind only; None keeps all.
    """
    raw = validation.dev_corpus() if raw is None else raw
    kind = rg.FIELDS.index("experts")
    out = [p.memory_residual for p in pts if p.memory_residual is not None
           and experts in (None, p.key[kind])]
    for r in raw:
        try:
            rec = parse(r)
            if rec.measured_step_s or not rec.measured_memory_gib or rec.oom:
                continue
            if experts is not None and rg.experts_kind(rec.model.num_experts or 1) != experts:
                continue
            row = validation.evaluate(rec, spread=False)
        except validation.REFUSED:
            continue
        out.append((row.memory_as_published() - rec.measured_memory_gib)
                   / rec.measured_memory_gib)
    own = [(pred - meas) / meas for _, pred, meas in validation.measured_plans_memory()]
    return out + (own if experts in (None, "dense") else [])


def memory_band(residuals: list[float]) -> tuple[float, float, int, float, float]:
    """(half-width covering :data:`~autopar.cost.regime.BAND_QUANTILE` of the runs, mean signed
    residual, runs, the largest under-prediction as a positive fraction of the prediction:
    measured / predicted - 1, and the same quantile of that shortfall, 0 for a run measured at
    or below its prediction: the growth over prediction that BAND_QUANTILE of the runs stayed
    within, one-sided because only a peak above its prediction runs out of memory)."""
    short = [max(1 / (1 + e) - 1, 0.0) for e in residuals]
    return (round(rg.nearest_rank([abs(e) for e in residuals]), 4),
            round(sum(residuals) / len(residuals), 4), len(residuals), round(max(short), 4),
            round(rg.nearest_rank(short), 4))


def ceilings(pts: list[Point]) -> dict[tuple, tuple[float, str, str]]:
    """(framework, precision, gpu, experts) -> (best measured MFU, record id, source), per
    framework and pooled over frameworks ("*"), dense models and mixtures of experts apart (an
    MoE step's all-to-alls and small expert GEMMs hold its MFU below a dense model's); ties go
    to the first record in corpus order."""
    best: dict[tuple, Point] = {}
    for p in pts:
        fw, prec, gpu, experts = p.key[0], p.key[1], p.key[2], p.key[4]
        for c in dict.fromkeys(((fw, prec, gpu, experts), (rg.ANY, prec, gpu, experts))):
            if c not in best or p.measured_mfu > best[c].measured_mfu:
                best[c] = p
    return {c: (round(p.measured_mfu, 4), p.id, p.source) for c, p in sorted(best.items())}


def render(pts: list[Point]) -> str:
    """The text of autopar/cost/published.py for these points."""
    b, m = bands(pts), ceilings(pts)
    lines = [
        '"""Tables from the published-run corpus, GENERATED by',
        f"`{COMMAND}` (do not edit by hand).",
        "",
        f"From {len(pts)} measured runs of benchmarks/data/*.json that autopar estimates, each "
        "predicted",
        "with its published plan (open fields at its framework's default). Rules and meaning:",
        ":mod:`autopar.cost.regime`. tests/test_bands.py fails when these drift from the corpus.",
        '"""',
        "",
        "#: (framework, precision, gpu generation, sharding, experts, scale, size)",
        "#: (autopar.cost.regime.FIELDS) -> (band half-width, mean signed residual",
        "#: (predicted - measured) / measured, runs, sources); \"*\" = pooled.",
        "BANDS: dict[tuple[str, ...], tuple[float, float, int, int]] = {",
    ]
    lines += [f"    {c!r}: {v!r}," for c, v in b.items()]
    lines += ["}", "",
              "#: The same cells -> (low, high): the middle 68% of their runs measured between low and",
              "#: high times the predicted step time (autopar.cost.regime.measured_range).",
              "MEASURED_RANGES: dict[tuple[str, ...], tuple[float, float]] = {"]
    lines += [f"    {c!r}: {v!r}," for c, v in measured_ranges(pts).items()]
    lines += ["}", "",
              "#: (framework, precision, gpu generation, experts) -> (best MFU measured, in",
              "#: autopar's FLOPs convention, record id, source); \"*\" = any framework.",
              "MFU_CEILINGS: dict[tuple[str, str, str, str], tuple[float, str, str]] = {"]
    for c, (mfu, rid, src) in m.items():
        lines.append(f"    {c!r}: ({mfu!r}, {rid!r},")
        lines.append(f"        {src!r}),")
    lines += ["}", ""]
    dense, moe = memory_residuals(pts, experts="dense"), memory_residuals(pts, experts="moe")
    if dense:
        lines += ["#: Peak memory per GPU of dense models: (band half-width, mean signed residual",
                  "#: (predicted - measured) / measured, runs, largest under-prediction measured /",
                  "#: predicted - 1, the 68% quantile of that shortfall (0 for a run at or below",
                  "#: its prediction)) over the runs with a published peak and the plans measured",
                  "#: through plan.apply.",
                  f"MEMORY_BAND: tuple[float, float, int, float, float] = {memory_band(dense)!r}",
                  ""]
    if dense or moe:
        # a regime with fewer runs than the bands' minimum takes the band of every run
        enough = len(moe) >= rg.MIN_RECORDS
        lines += ["#: The same for mixtures of experts "
                  + ("(their own runs)." if enough else
                     f"(fewer than {rg.MIN_RECORDS} runs: the band of all runs)."),
                  f"MOE_MEMORY_BAND: tuple[float, float, int, float, float] = "
                  f"{memory_band(moe if enough else dense + moe)!r}", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"rewrite {TABLE.relative_to(ROOT)}")
    g.add_argument("--check", action="store_true", help="exit 1 when the table is stale")
    args = ap.parse_args(argv)
    pts, skipped = points()
    text = render(pts)
    rel = TABLE.relative_to(ROOT)
    if args.check:
        stale = TABLE.read_text() != text
        print(f"{rel} {'differs from the corpus: run ' + COMMAND if stale else 'is current'}")
        return 1 if stale else 0
    if args.write:
        TABLE.write_text(text)
        print(f"wrote {rel} ({len(pts)} runs, {len(skipped)} refused)")
        return 0
    for p in pts:
        print(f"{p.id:48s} {'/'.join(p.key):60s} {100 * p.residual:+6.1f}%  "
              f"measured MFU {100 * p.measured_mfu:5.1f}%")
    for rid, why in skipped:
        print(f"skipped {rid}: {why}")
    for c, (half, bias, n, s) in bands(pts).items():
        print(f"band {'/'.join(c):60s} +-{100 * half:4.1f}% bias {100 * bias:+5.1f}% "
              f"n={n} sources={s}")
    for c, (mfu, rid, _) in ceilings(pts).items():
        print(f"best MFU {'/'.join(c):28s} {100 * mfu:5.1f}% {rid}")
    for kind in ("dense", "moe"):
        res = memory_residuals(pts, experts=kind)
        if res:
            half, bias, n, worst, short = memory_band(res)
            print(f"memory band ({kind}) +-{100 * half:.1f}% bias {100 * bias:+.1f}% n={n} "
                  f"worst under-prediction {100 * worst:.1f}%, 68% of runs within "
                  f"{100 * short:.1f}% above prediction")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
