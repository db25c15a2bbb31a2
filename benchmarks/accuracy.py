"""Cost-model accuracy: predicted vs measured step time over published runs.

    python -m benchmarks.accuracy [--plans PATH]     # one line per record
    python -m benchmarks.accuracy --markdown         # the same as a Markdown table
    python -m benchmarks.accuracy --write-docs       # rewrite the generated parts of the docs
                                                     # and autopar/cost/published.py (bands)
    python -m benchmarks.accuracy --check-docs       # exit 1 when the docs differ from a new run
    python -m benchmarks.accuracy --cv source --pairs --memory   # out of sample, whole corpus
    python -m benchmarks.accuracy --cv source --split locked     # only the locked split
    python -m benchmarks.accuracy --cv source --split all        # development, then locked

Each record is estimated with its own published plan; fields the source leaves null take the
documented default of the framework that ran it (:func:`benchmarks.validation.framework_defaults`),
never the cost model's own fastest choice, and the kernel that framework ran
(the cost fields of :func:`benchmarks.validation.record_profile`). The line of a record prints the defaults taken
and what the fastest legal choice would change (the spread). Last line:
``MAPE <x>% max <y>% over <n> records``. ``--cv``, ``--pairs`` and ``--memory`` run over the
whole corpus (``benchmarks/data/*.json``; see :mod:`benchmarks.validation`):

- Every record is evaluated or refused: ``refused (N): reason counts`` lists each reason with
  its count and each refused record with a one-line reason (vocab_size or precision not
  published, an MoE model, a GPU not in the catalog); the last line, ``0 records skipped
  silently``, counts the records of the corpus files that were neither (it must be 0). A null
  ``training.precision`` takes the framework's documented default where there is one
  (:data:`benchmarks.records.PRECISION_DEFAULTS`: torchtitan and NeMo bf16), else the record is
  refused ("precision not published": Megatron-LM's and DeepSpeed's documented default, fp32,
  is not what such runs used).
- ``--cv source`` prints per source the signed bias and MAPE, the **macro** figure (mean over
  sources of each source's MAPE and bias) and the **pooled** one (over all runs), then the
  per-regime table (GPU generation x framework family x sharding kind x dense/MoE x nodes x
  model size, :mod:`benchmarks.regimes`: runs, bias, MAPE) and the **band coverage**: the share
  of runs whose |error| is within the estimate's stated 68% band, per regime with at least 10
  runs and pooled (and, for comparison, with the bands refitted without the run's source), and
  the share of runs measured inside the middle-68% measured / predicted range of the other
  sources' runs of their regime.
- ``--split``: the sources listed in ``benchmarks/data/locked_split.json`` (the locked
  validation split, ``{"rule": ..., "sources": [source keys]}``) are held out: ``dev`` (the
  default) evaluates every other record and prints ``locked split: K sources, R runs held out
  (not evaluated)`` without estimating them; ``locked`` evaluates only the locked sources (no
  leave-one-source-out is needed: no constant is fitted to any source) with the same per-source,
  per-regime and coverage figures; ``all`` prints both. The error bands
  (:mod:`benchmarks.bands`) are derived from the development split only.

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

from . import bands, docgen, lock_split, regimes, validation
from .records import load, parse, source_key

ROOT = Path(__file__).resolve().parents[1]
_COMMAND = "python -m benchmarks.accuracy --write-docs"


def evaluate(rec, spread: bool = True) -> validation.Row:
    """One parsed record at its framework's defaults (see :func:`benchmarks.validation.evaluate`;
    ``spread`` also searches the fastest legal choice of the open fields)."""
    return validation.evaluate(rec, spread=spread)


def check_locked_written() -> None:
    """Refuse to run while ``benchmarks/data/locked_split.json`` lacks a source the rule locks
    (:func:`benchmarks.lock_split.locked_sources`): a new corpus file's locked sources would be
    estimated as development ones and their residuals seen before the end (LOCKED.md).

    Raises:
        SystemExit: naming the first missing source and the fix.
    """
    unwritten = sorted(set(lock_split.locked_sources()) - validation.locked_sources())
    if unwritten:
        raise SystemExit(
            f"benchmarks/data/locked_split.json lacks {len(unwritten)} source(s) the rule locks "
            f"(first: {unwritten[0][:80]!r}); estimating now would show their residuals. "
            "Fix: python -m benchmarks.lock_split --write, then run this again.")


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
    ap.add_argument("--split", choices=SPLITS, default=None,
                    help="which records --cv/--pairs/--memory evaluate: dev (default: all but "
                         "the locked validation split, benchmarks/data/locked_split.json, whose "
                         "runs are counted, not estimated), locked (only the locked split) or "
                         "all (both, one after the other); alone it implies --cv source")
    args = ap.parse_args(argv)
    if not args.plans:
        check_locked_written()
    if args.split and not (args.cv or args.pairs or args.memory):
        args.cv = "source"
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


SPLITS = ("dev", "locked", "all")


def validation_lines(plans=None, cv: bool = True, pairs: bool = True,
                     memory: bool = True, split: str = "dev", estimate=None) -> list[str]:
    """The lines ``--cv source --pairs --memory`` prints (``plans``: a corpus file instead of
    ``benchmarks/data``), open fields at the framework's documented defaults.

    ``split``: ``dev`` evaluates the development split (every record whose source is not in
    ``benchmarks/data/locked_split.json``; the locked ones are counted, never estimated),
    ``locked`` only the locked split, ``all`` both, one after the other. ``estimate``: the
    evaluation of a parsed record (default :func:`benchmarks.validation.evaluate`)."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS}")
    files = [Path(plans)] if plans else validation.corpus_files()
    raw = validation.load_corpus(files)
    locked = validation.locked_sources()
    dev, held = validation.split_corpus(raw, locked)
    held_sources = {source_key(r) for r in held}
    lines, seen = [], 0
    if split in ("dev", "all"):
        absent = len(locked - held_sources)
        lines += [f"locked split: {len(held_sources)} sources, {len(held)} runs held out "
                  "(not evaluated)" + (f"; {absent} listed sources have no record in the corpus"
                                       if absent else "") if split == "dev" else
                  f"development split: {len(dev)} runs of sources not in the locked split"]
        part, seen_dev = _split_lines(dev, cv, pairs, memory, False, estimate)
        lines += part
        seen += seen_dev
    if split in ("locked", "all"):
        lines += [f"locked split: {len(locked)} sources listed, {len(held_sources)} in the "
                  f"corpus, {len(held)} runs, evaluated with the cost model as it stands"]
        part, seen_locked = _split_lines(held, cv, pairs, memory, True, estimate)
        lines += part
        seen += seen_locked
    not_run = len(held) if split == "dev" else len(dev) if split == "locked" else 0
    total = sum(len(validation.load_corpus([f])) for f in files)
    lines.append(f"{total - seen - not_run} records skipped silently ({seen} evaluated or "
                 f"refused + {not_run} not in the split run = {total} records in "
                 f"{'the corpus file' if plans else 'benchmarks/data/*.json'})")
    return lines


def _split_lines(raw: list[dict], cv: bool, pairs: bool, memory: bool, held_out: bool,
                 estimate=None) -> tuple[list[str], int]:
    """(lines for one split's records, records evaluated or refused)."""
    rows, refused = validation.evaluate_all(raw, estimate)
    timed = sum(r.error is not None for r in rows)
    lines = [f"{len(raw)} records, {len(rows)} evaluated, {len(refused)} refused "
             "(open plan fields at the framework's documented default)",
             f"  evaluated: {timed} with a measured step time, "
             f"{sum(r.error is None and bool(r.rec.measured_memory_gib) for r in rows)} with "
             "a peak memory only, "
             f"{sum(r.rec.oom for r in rows)} published out of memory, "
             f"{sum(r.error is None and not r.rec.measured_memory_gib and not r.rec.oom for r in rows)}"
             " with neither"]
    neither = [r.rec.id for r in rows
               if r.error is None and not r.rec.measured_memory_gib and not r.rec.oom]
    if neither:
        lines.append(f"  evaluated with nothing measured to compare (in no figure): "
                     f"{', '.join(neither)}")
    lines += validation.refusal_counts(refused)
    for r in rows:
        err = r.error
        spread = (r.fastest_s - r.predicted_s) / r.predicted_s if r.predicted_s else 0.0
        lines.append(f"  {r.rec.id:44s} pred {r.predicted_s:9.3f} s "
                     f"meas {r.rec.measured_step_s or float('nan'):9.3f} s "
                     f"{'' if err is None else f'{100 * err:+6.1f}%'}  fastest legal "
                     f"{100 * spread:+.0f}%  {r.chosen if r.chosen else ''}")
    if cv:
        lines += validation.loso(rows, held_out)
        lines += validation.host_lines(rows)
        lines += regimes.table(rows, held_out)
        if not held_out:
            lines += regimes.refit_coverage(rows)
    if pairs:
        lines += validation.pairs(rows)
    if memory:
        lines += validation.memory(rows, validation.measured_plans_memory(), refused, raw)
    return lines, len(rows) + len(refused)


def _validate(args) -> int:
    """--cv / --pairs / --memory over the corpus (or --plans)."""
    print("\n".join(validation_lines(args.plans, bool(args.cv), args.pairs, args.memory,
                                     args.split or "dev")))
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


def corpus_size(lines: list[str]) -> str:
    """The corpus size README.md gives (``N published runs``: the development split's records,
    evaluated or refused), from :func:`validation_lines`; generated so it follows the corpus."""
    runs = _one(r"(\d+) records, (\d+) evaluated", lines)[1]
    return f"{runs} published runs"


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
    docs/cost-model.md's ``out-of-sample`` part by :func:`out_of_sample_summary` and README.md's
    ``corpus-size`` by :func:`corpus_size` of ``validation`` (:func:`validation_lines`) when
    given.

    Raises:
        ValueError: a file lacks its ``begin generated``/``end generated`` marker pair.
    """
    parts = [(rel, name, render(rows)) for rel, name, render in GENERATED]
    if validation is not None:
        parts += [("docs/cost-model.md", "out-of-sample", out_of_sample_summary(validation)),
                  ("README.md", "corpus-size", corpus_size(validation))]
    return docgen.render(parts)


if __name__ == "__main__":
    raise SystemExit(main())
