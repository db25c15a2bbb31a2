"""Accuracy of the validation rows per regime, and how often the stated error band holds.

Used by ``python -m benchmarks.accuracy --cv source`` (:mod:`benchmarks.accuracy`). A run's
*regime* here has the error band's buckets (:mod:`autopar.cost.regime`) with the framework as a
family and no precision: six fields, each read from the record and the plan it is estimated
with.

- ``gpu``: the GPU generation (:func:`autopar.cost.regime.gpu_generation`: ampere, hopper, ...).
- ``framework``: the family of the library profile the record runs
  (:func:`benchmarks.validation.profile_name`) as banded
  (:func:`autopar.frameworks.band_framework`): megatron (Megatron-LM, NeMo), torch (PyTorch
  FSDP stacks, torchtitan), deepspeed; ``other`` for the stacks banded with the pooled cells
  (in-house, InternEvo, flash-attention's training code).
- ``sharding``: the plan's dominant sharding (:func:`autopar.cost.regime.sharding_kind` of
  the published plan, open fields at the framework's default): ``pipeline`` when pp > 1, else
  ``tensor`` when tp or cp > 1, else ``fsdp-zero3`` with ZeRO stage 3, else ``data``.
- ``experts``: ``moe`` when the record's model has more than one expert
  (``model.num_experts``), else ``dense``.
- ``scale``: nodes of the cluster (:func:`autopar.cost.regime.scale_bucket`): ``1 node``,
  ``2-64 nodes``, ``>64 nodes``.
- ``size``: the model's parameters (:attr:`autopar.models.ModelConfig.num_parameters`;
  :func:`autopar.cost.regime.size_bucket`), each bucket holding its lower bound: ``<3B``,
  ``3-30B``, ``30-100B``, ``>100B`` (100e9 and up).

Band coverage: a run is within its band when ``|(predicted - measured) / measured|`` is at most
the half-width of the estimate's stated band (``Estimate.error_band``, a 68% band from
:mod:`autopar.cost.published`: the run's own regime's, when validated). Those tables are derived
from the development split including the run's own source; :func:`refit_coverage` also gives the
coverage of bands refitted without the run's source (the rules of
:func:`autopar.cost.regime.band_for`, the counting of :func:`benchmarks.bands.bands`).
"""

from __future__ import annotations

import math
from collections import defaultdict

from autopar.cost import regime as rg
from autopar.frameworks import band_framework

from . import validation

DIMENSIONS = ("gpu", "framework", "sharding", "experts", "scale", "size")
#: band framework -> framework family; a framework missing here is "other".
FAMILY = {"megatron": "megatron", "torch": "torch", "torchtitan": "torch",
          "deepspeed": "deepspeed"}
#: Fewest runs a regime needs for its band coverage to be printed.
MIN_COVERAGE_RUNS = 10


def _plan(row: validation.Row) -> dict:
    return {**row.chosen, **row.rec.fixed}


def sharding(tp: int, pp: int, cp: int, zero_stage) -> str:
    """The sharding kind of a plan (:func:`autopar.cost.regime.sharding_kind`, ``fsdp`` named
    ``fsdp-zero3``)."""
    kind = rg.sharding_kind(tp, pp, cp, zero_stage)
    return "fsdp-zero3" if kind == "fsdp" else kind


def experts(raw: dict) -> str:
    """``moe`` when the record's model has more than one expert, else ``dense``
    (:func:`autopar.cost.regime.experts_kind`)."""
    return rg.experts_kind((raw.get("model") or {}).get("num_experts") or 1)


def regime_of(row: validation.Row) -> tuple[str, ...]:
    """The run's regime, one value per :data:`DIMENSIONS`."""
    rec, plan = row.rec, _plan(row)
    fam = FAMILY.get(band_framework(validation.profile_name(rec)), "other")
    return (rg.gpu_generation(rec.cluster.device.name), fam,
            sharding(plan.get("tp", 1), plan.get("pp", 1), plan.get("cp", 1),
                     plan.get("zero_stage")),
            experts(rec.raw), rg.scale_bucket(rec.cluster.num_nodes),
            rg.size_bucket(rec.model.num_parameters))


def within_band(row: validation.Row) -> bool | None:
    """Whether the run's |error| is within its estimate's stated band; None without a measured
    step time or a band."""
    if row.error is None or row.band is None:
        return None
    return abs(row.error) <= row.band


def _stats(rows: list[validation.Row]) -> tuple[int, float, float, str]:
    errs = [r.error for r in rows]
    cover = [c for c in map(within_band, rows) if c is not None]
    cov = (f"{sum(cover):4d}/{len(cover):<4d} {100 * sum(cover) / len(cover):3.0f}%"
           if len(cover) >= MIN_COVERAGE_RUNS else "")
    return len(errs), 100 * sum(errs) / len(errs), 100 * sum(map(abs, errs)) / len(errs), cov


def table(rows: list[validation.Row], held_out: bool = False) -> list[str]:
    """Lines: per regime (and per value of each dimension) its runs, signed bias, MAPE and,
    with at least :data:`MIN_COVERAGE_RUNS` runs, the share within the stated band; then the
    pooled coverage (``held_out``: rows of the locked split, whose sources the bands never
    saw)."""
    measured = [r for r in rows if r.error is not None]
    groups: dict[tuple, list] = defaultdict(list)
    for r in measured:
        groups[regime_of(r)].append(r)
    head = f"{'':58s} {'n':>4s} {'bias':>7s} {'MAPE':>6s}  in band (68%)"
    lines = [f"per regime ({' x '.join(DIMENSIONS)}), {len(measured)} runs with a step time:",
             head.replace(" " * 58, f"  {'regime':56s}", 1)]
    for key, rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        n, bias, mape, cov = _stats(rs)
        lines.append(f"  {'/'.join(key):56s} {n:4d} {bias:+6.1f}% {mape:5.1f}%  {cov}")
    for i, dim in enumerate(DIMENSIONS):
        by: dict[str, list] = defaultdict(list)
        for r in measured:
            by[regime_of(r)[i]].append(r)
        lines.append(f"by {dim}:")
        for value, rs in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            n, bias, mape, cov = _stats(rs)
            lines.append(f"  {value:56s} {n:4d} {bias:+6.1f}% {mape:5.1f}%  {cov}")
    cover = [c for c in map(within_band, measured) if c is not None]
    pct = 100 * sum(cover) / len(cover) if cover else math.nan
    whose = "without these sources" if held_out else "incl. the run's own source"
    lines.append(f"band coverage: {sum(cover)} of {len(cover)} runs ({pct:.1f}%) within the "
                 "estimate's stated 68% band (autopar/cost/published.py, derived from the "
                 f"development split {whose}); {len(measured) - len(cover)} runs without a band")
    return lines


def refit_coverage(rows: list[validation.Row]) -> list[str]:
    """Lines: the share of runs within a band computed, by the rules of
    :func:`autopar.cost.regime.band_for` (the run's own regime, validated by
    :data:`~autopar.cost.regime.VALIDATED_RUNS` runs of
    :data:`~autopar.cost.regime.VALIDATED_SOURCES` sources, never a coarser cell), from the runs
    of the other sources only (leave one source out for the band itself); the runs whose regime
    the other sources do not validate are counted apart; then the same per band regime with at
    least :data:`MIN_COVERAGE_RUNS` such runs."""
    from .bands import Point, bands, measured_ranges
    measured = [r for r in rows if r.error is not None]
    # keyed by the estimate's own regime (Row.regime), as benchmarks.bands.points keys a run
    pts = [Point(r.rec.id, r.rec.source_key, r.regime, r.error, 0.0) for r in measured]
    hit = in_range = total = 0
    per_key: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])  # hit, in range, runs
    for src in sorted({p.source for p in pts}):
        others = [p for p in pts if p.source != src]
        table_, ranges = bands(others), measured_ranges(others)
        for p in (p for p in pts if p.source == src):
            row = table_.get(p.key)
            if row is not None and rg.validates(row[2], row[3]):
                low, high = ranges[p.key]
                counts = (abs(p.residual) <= row[0], low <= 1 / (1 + p.residual) <= high, 1)
                total += 1
                hit += counts[0]
                in_range += counts[1]
                per_key[p.key] = [a + b for a, b in zip(per_key[p.key], counts)]
    pct = 100 * hit / total if total else math.nan
    pct_range = 100 * in_range / total if total else math.nan
    lines = [f"band coverage, bands refitted without the run's source: {hit} of {total} runs "
             f"({pct:.1f}%) in a regime the other sources validate; {len(pts) - total} runs "
             "without one",
             f"measured-range coverage, refitted the same way: {in_range} of {total} runs "
             f"({pct_range:.1f}%) measured inside the middle 68% range of the other sources' "
             "runs of their regime",
             f"  per band regime with at least {MIN_COVERAGE_RUNS} such runs (the estimate's "
             "regime key): in band, in measured range"]
    for key, (h, r, n) in sorted(per_key.items(), key=lambda kv: (-kv[1][2], kv[0])):
        if n >= MIN_COVERAGE_RUNS:
            lines.append(f"  {'/'.join(map(str, key)):56s} {n:4d}  {h:4d} {100 * h / n:3.0f}%"
                         f"  {r:4d} {100 * r / n:3.0f}%")
    return lines
