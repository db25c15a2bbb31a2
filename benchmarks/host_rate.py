"""The per-kernel host rate of stacks that issue each kernel through their own module code
(:attr:`autopar.frameworks.FrameworkProfile.host_op_s_published`: megatron and nemo), fitted to
every measured run of those stacks in the development split, and the rate each source is
estimated with under leave-one-source-out.

    python -m benchmarks.host_rate [--write | --check]

Rule (session 28; it replaces the first rule, below, after a new development source showed that
rule's flaw):

- Candidates: development-split records with a measured step whose profile carries a stack
  rate (``host_op_s_published > 0``, ``host_issue`` per kernel).
- Every candidate is priced at each rate of :data:`GRID` (0 to 300 us per kernel in 5 us
  steps). A source's error at a rate is the mean absolute relative error of its runs' priced
  steps (its MAPE).
- The stack rate is the grid rate with the least mean over sources of that MAPE (each source
  weighs the same; ties go to the lower rate); a source is estimated with the rate the other
  sources give so (:func:`loso_rate`), so no run is priced with a rate its own source set.

The first rule (2026-12-07) let a run set the rate only when, priced at the raw dispatch rate,
it fell short of its measured step by a third or more, and took the median over sources of the
rates at which such runs matched. That selects on the residual: a run the raw rate already
prices right can never pull the rate down, however far a high rate pushes it. The first source
added after it (Megatron-MoE-ModelZoo's Qwen3-235B on 256 H100, estimated before any change:
+0.2% at the raw rate, +56% at the 161.5 us the rule gave) is such a run.

The figure is a total per counted kernel (the module code of Megatron-Core and Transformer
Engine, the dispatcher's host reads, launch latencies), not a measurement of host time. It
depends on the host CPU, which the cluster model does not hold: most runs behind it ran on x86
hosts, swiss-ai's on GH200's Arm Grace CPU, where Transformer Engine's module code runs several
times longer (NVIDIA/TransformerEngine#2053).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from autopar.frameworks import with_host_rate

DATA = Path(__file__).resolve().parent / "data" / "host" / "stack_host_rates.json"
#: Rates priced (seconds per kernel): 0 to 300 us in 5 us steps. 300 us is above every rate a
#: run of the corpus implies except the two on other hosts (Grace, A800 nodes: module docstring).
GRID = tuple(round(i * 5e-6, 9) for i in range(61))


def with_rate(profile, rate_s: float):
    """``profile`` with its stack rate set to ``rate_s`` seconds per kernel
    (:func:`autopar.frameworks.with_host_rate`)."""
    return with_host_rate(profile, rate_s, "benchmarks.host_rate: a rate fitted to the "
                          "published runs of the stack (module docstring)")


def run_errors(rec) -> list[float]:
    """Signed relative error of ``rec``'s priced step at each rate of :data:`GRID`."""
    from . import validation
    m = rec.measured_step_s
    return [validation.evaluate(rec, spread=False, host_rate=r).predicted_s / m - 1
            for r in GRID]


def source_mape(runs: dict[str, list[float]]) -> list[float]:
    """A source's MAPE at each rate of :data:`GRID`, from its runs' :func:`run_errors`."""
    return [sum(abs(e[i]) for e in runs.values()) / len(runs) for i in range(len(GRID))]


def best_rate(curves: list[list[float]]) -> float:
    """The :data:`GRID` rate with the least mean of the sources' MAPE ``curves`` (the lowest
    such rate on a tie); 0.0 without sources."""
    if not curves:
        return 0.0
    macro = [sum(c[i] for c in curves) / len(curves) for i in range(len(GRID))]
    return GRID[min(range(len(GRID)), key=lambda i: (round(macro[i], 12), i))]


def compute() -> dict:
    """``{"rule", "grid_s", "rate_s", "sources": {key: {"rate_s", "mape", "runs": {id:
    errors}}}}`` over the development split (module docstring); a source's ``rate_s`` is the
    rate its own runs alone would give (not used to price anything)."""
    from . import validation
    from .records import parse, source_key
    sources: dict[str, dict[str, list[float]]] = {}
    for raw in validation.dev_corpus():
        try:
            rec = parse(raw)
            prof = validation.record_profile(rec)
        except validation.REFUSED:
            continue
        if not rec.measured_step_s or prof.host_op_s_published <= 0 \
                or prof.host_issue != "per_kernel":
            continue
        try:
            errors = run_errors(rec)
        except validation.REFUSED:
            continue
        sources.setdefault(source_key(raw), {})[rec.id] = [round(e, 6) for e in errors]
    per = {}
    for key, runs in sorted(sources.items()):
        curve = source_mape(runs)
        per[key] = {"rate_s": best_rate([curve]), "mape": [round(c, 6) for c in curve],
                    "runs": dict(sorted(runs.items()))}
    return {"rule": __doc__.split("Rule", 1)[1].split("The first rule", 1)[0].strip(),
            "grid_s": list(GRID),
            "rate_s": best_rate([s["mape"] for s in per.values()]),
            "sources": per}


def loso_rate(key: str, data: dict | None = None) -> float | None:
    """The stack rate a run of source ``key`` is estimated with: :func:`best_rate` over the
    other sources of :data:`DATA` when ``key`` is one of them, else None (the profile's own
    rate, which no run of ``key`` set)."""
    if data is None:   # the committed file: each source's rate once, not once per run
        memo = _CACHE.setdefault("loso", {})
        if key not in memo:
            memo[key] = loso_rate(key, _load())
        return memo[key]
    if key not in data.get("sources", {}):
        return None
    return best_rate([s["mape"] for k, s in data["sources"].items() if k != key])


_CACHE: dict = {}


def _load() -> dict:
    if "data" not in _CACHE:
        _CACHE["data"] = json.loads(DATA.read_text()) if DATA.exists() else {}
    return _CACHE["data"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"write {DATA.name}")
    g.add_argument("--check", action="store_true",
                   help=f"exit 1 when {DATA.name} differs from what this run computes")
    args = ap.parse_args(argv)
    data = compute()
    at = GRID.index(data["rate_s"]) if data["rate_s"] in GRID else 0
    print("own us  MAPE at the stack rate  runs  source")
    for key, s in data["sources"].items():
        print(f"{s['rate_s'] * 1e6:6.0f}  {100 * s['mape'][at]:6.1f}%  {len(s['runs']):3d}  "
              f"{key[:90]}")
    print(f"stack rate (least macro MAPE over {len(data['sources'])} sources): "
          f"{data['rate_s'] * 1e6:.1f} us per kernel")
    # one line per list of numbers (61 per run): a reviewable file, not one number a line
    text = re.sub(r"\[\s+([-0-9.e,\s]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]",
                  json.dumps(data, indent=1, ensure_ascii=False)) + "\n"
    if args.write:
        DATA.write_text(text)
    if args.check:
        old = DATA.read_text() if DATA.exists() else ""
        if json.loads(old or "{}") != json.loads(text):
            print(f"{DATA} is out of date: python -m benchmarks.host_rate --write",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
