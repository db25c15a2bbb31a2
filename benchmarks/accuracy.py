"""Cost-model accuracy: predicted vs measured step time over published runs.

    python -m benchmarks.accuracy [--plans PATH]     # one line per record
    python -m benchmarks.accuracy --markdown         # the same as a Markdown table
    python -m benchmarks.accuracy --write-docs       # rewrite the generated parts of the docs
                                                     # and autopar/cost/published.py (bands)
    python -m benchmarks.accuracy --check-docs       # exit 1 when the docs differ from a new run
    python -m benchmarks.accuracy --cv source --pairs --memory   # out of sample, whole corpus

Each record is estimated with its own published plan; fields the source leaves null take the
documented default of the framework that ran it (:func:`benchmarks.validation.framework_defaults`),
never the cost model's own fastest choice, and the kernel that framework ran
(the cost fields of :func:`benchmarks.validation.record_profile`). The line of a record prints the defaults taken
and what the fastest legal choice would change (the spread). Last line:
``MAPE <x>% max <y>% over <n> records``. ``--cv``, ``--pairs`` and ``--memory`` run over the
whole corpus (``benchmarks/data/*.json``; see :mod:`benchmarks.validation`).

The accuracy table of docs/cost-model.md and the summary in README.md are this benchmark's output,
between ``<!-- begin generated: NAME ... -->`` and ``<!-- end generated: NAME -->`` markers
(:data:`GENERATED`); ``--write-docs`` rewrites them from a new run and tests/test_docs.py fails
when they drift. The run is deterministic (no time limit), about 13 s on one CPU core.
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass
from pathlib import Path

import autopar

from . import bands, docgen, validation
from .records import load, parse

ROOT = Path(__file__).resolve().parents[1]
_COMMAND = "python -m benchmarks.accuracy --write-docs"


def evaluate(rec, spread: bool = True) -> validation.Row:
    """One parsed record at its framework's defaults (see :func:`benchmarks.validation.evaluate`;
    ``spread`` also searches the fastest legal choice of the open fields)."""
    return validation.evaluate(rec, spread=spread)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", default=None, help="published_plans.json-format file")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--markdown", action="store_true", help="print a Markdown table instead")
    out.add_argument("--write-docs", action="store_true",
                     help="rewrite the generated table and summary in docs/ and README.md")
    out.add_argument("--check-docs", action="store_true",
                     help="exit 1 when docs/ or README.md differ from what this run generates")
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
        print(markdown_table(run(args.plans)))
        return 0
    if args.write_docs or args.check_docs:
        # the error-band and MFU tables (autopar/cost/published.py) come from the same cost
        # model over the whole corpus: regenerated (or checked) by the same command, as is the
        # out-of-sample summary in docs/cost-model.md (about two minutes in all)
        tables_stale = bands.main(["--check" if args.check_docs else "--write"])
        texts = render_docs(run(args.plans), validation_lines(args.plans))
        stale = docgen.write_or_check(texts, _COMMAND, args.check_docs)
        return 1 if (stale or tables_stale) and args.check_docs else 0
    errors = []
    print(f"{'id':36s} {'pred s':>9s} {'meas s':>9s} {'err':>7s}  {'MFU':>5s} {'mem GB':>6s}  "
          "defaults taken (fastest legal choice)")
    for raw in load(args.plans):
        t0 = time.monotonic()
        rec = parse(raw)
        try:
            r = evaluate(rec)
        except autopar.AutoparError as exc:
            print(f"{rec.id:36s} error: {exc}")
            continue
        if rec.measured_step_s is None:
            print(f"{rec.id:36s} {r.predicted_s:9.3f} {'-':>9s}")
            continue
        errors.append(abs(r.error))
        spread = (r.fastest_s - r.predicted_s) / r.predicted_s
        print(f"{rec.id:36s} {r.predicted_s:9.3f} {rec.measured_step_s:9.3f} "
              f"{r.error * 100:+6.1f}%  {r.mfu * 100:5.1f} {r.memory_gib * 2 ** 30 / 1e9:6.1f}  "
              f"{r.chosen if r.chosen else ''} ({spread * 100:+.0f}%) "
              f"{'' if r.fits else 'DOES-NOT-FIT'} ({time.monotonic() - t0:.1f}s)")
    if errors:
        print(f"MAPE {100 * sum(errors) / len(errors):.1f}% max {100 * max(errors):.1f}% "
              f"over {len(errors)} records")
    return 0


@dataclass(frozen=True)
class Row:
    """One measured record's outcome: ``error`` is (predicted - measured) / measured."""

    id: str
    predicted_s: float
    measured_s: float
    mfu: float
    memory_bytes: float
    fits: bool

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def run(plans=None) -> list[Row]:
    """Evaluate every record with a measured step time (records autopar cannot estimate raise:
    a table in the docs must not silently lose rows)."""
    rows = []
    for raw in load(plans):
        rec = parse(raw)
        if rec.measured_step_s is None:
            continue
        r = evaluate(rec, spread=False)
        rows.append(Row(rec.id, r.predicted_s, rec.measured_step_s, r.mfu,
                        r.memory_gib * 2 ** 30, r.fits))
    return rows


def validation_lines(plans=None, cv: bool = True, pairs: bool = True,
                     memory: bool = True) -> list[str]:
    """The lines ``--cv source --pairs --memory`` prints (``plans``: a corpus file instead of
    ``benchmarks/data``), open fields at the framework's documented defaults."""
    raw = validation.load_corpus([plans] if plans else None)
    rows, skipped = validation.evaluate_all(raw)
    lines = [f"{len(raw)} records, {len(rows)} evaluated, {len(skipped)} skipped "
             "(open plan fields at the framework's documented default)"]
    lines += [f"  skipped {rid}: {why}" for rid, why in skipped]
    for r in rows:
        err = r.error
        spread = (r.fastest_s - r.predicted_s) / r.predicted_s if r.predicted_s else 0.0
        lines.append(f"  {r.rec.id:44s} pred {r.predicted_s:9.3f} s "
                     f"meas {r.rec.measured_step_s or float('nan'):9.3f} s "
                     f"{'' if err is None else f'{100 * err:+6.1f}%'}  fastest legal "
                     f"{100 * spread:+.0f}%  {r.chosen if r.chosen else ''}")
    if cv:
        lines += validation.loso(rows)
    if pairs:
        lines += validation.pairs(rows)
    if memory:
        lines += validation.memory(rows, validation.measured_plans_memory())
    return lines


def _validate(args) -> int:
    """--cv / --pairs / --memory over the corpus (or --plans)."""
    print("\n".join(validation_lines(args.plans, bool(args.cv), args.pairs, args.memory)))
    return 0


def _one(pattern: str, lines: list[str]) -> re.Match:
    """The match of ``pattern`` in the one line of ``lines`` it matches first."""
    for line in lines:
        m = re.match(pattern, line)
        if m:
            return m
    raise ValueError(f"no line of the validation output matches {pattern!r}")


def out_of_sample_summary(lines: list[str]) -> str:
    """The sentence docs/cost-model.md gives for the whole corpus, from :func:`validation_lines`
    (all three parts)."""
    corpus = _one(r"(\d+) records, (\d+) evaluated", lines)
    loso = _one(r"LOSO MAPE ([\d.]+)% max ([\d.]+)% worst source [\d.]+% over (\d+) records, "
                r"(\d+) sources", lines)
    worst = _one(r"worst source: (.*?)[ ,(].*\(bias ([-+\d.]+)%\)$", lines)
    pairs = _one(r"pairs ordered as measured: (\d+) of (\d+) \(([\d.]+)%\)", lines)
    mem = _one(r"memory MAPE ([\d.]+)% over (\d+) runs", lines)
    own = _one(r"memory MAPE ([\d.]+)% over (\d+) measured plan.apply runs", lines)
    return (f"({corpus[1]} published runs, {loso[3]} with a step time autopar can model, "
            f"{loso[4]} sources) gives a leave-one-source-out MAPE of {loso[1]}% (max {loso[2]}%, "
            f"worst source's bias {worst[2]}%: {worst[1]}), {pairs[1]} of {pairs[2]} measured plan "
            f"pairs in the measured order ({pairs[3]}%), and a peak-memory MAPE of {mem[1]}% over "
            f"{mem[2]} published runs ({own[1]}% over {own[2]} runs measured here through "
            "plan.apply)")


def summary(rows: list[Row]) -> tuple[float, float, int]:
    """(mean absolute error, max absolute error, records), errors as fractions."""
    errors = [abs(r.error) for r in rows]
    return sum(errors) / len(errors), max(errors), len(errors)


def markdown_table(rows: list[Row]) -> str:
    """The comparison as a Markdown table and a summary line (GB = 1e9 bytes)."""
    lines = ["| record | predicted s/step | measured s/step | error | predicted MFU % | "
             "predicted GB/GPU | fits (model) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.id} | {r.predicted_s:.3f} | {r.measured_s:.3f} | "
                     f"{r.error * 100:+.1f}% | {r.mfu * 100:.1f} | {r.memory_bytes / 1e9:.1f} | "
                     f"{'yes' if r.fits else 'no'} |")
    mape, worst, n = summary(rows)
    lines += ["", f"MAPE {100 * mape:.1f}% max {100 * worst:.1f}% over {n} records"]
    return "\n".join(lines)


def _readme_summary(rows: list[Row]) -> str:
    mape, worst, n = summary(rows)
    return f"{n} published runs (MAPE {100 * mape:.1f}%, max {100 * worst:.1f}%)"


#: Generated parts of the docs from the 29 records: (file under the repository, marker name,
#: renderer of :func:`run`'s rows).
GENERATED = (("docs/cost-model.md", "accuracy-table", markdown_table),
             ("README.md", "accuracy-summary", _readme_summary))


def render_docs(rows: list[Row], validation: list[str] | None = None) -> dict[Path, str]:
    """Each file of :data:`GENERATED` with its marked parts replaced by ``rows``' rendering, and
    docs/cost-model.md's ``out-of-sample`` part by :func:`out_of_sample_summary` of
    ``validation`` (:func:`validation_lines`) when given.

    Raises:
        ValueError: a file lacks its ``begin generated``/``end generated`` marker pair.
    """
    parts = [(rel, name, render(rows)) for rel, name, render in GENERATED]
    if validation is not None:
        parts.append(("docs/cost-model.md", "out-of-sample", out_of_sample_summary(validation)))
    return docgen.render(parts)


if __name__ == "__main__":
    raise SystemExit(main())
