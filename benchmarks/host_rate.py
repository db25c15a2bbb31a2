"""The per-kernel host rate of stacks that issue each kernel through their own module code
(:attr:`autopar.frameworks.FrameworkProfile.host_op_s_published`: megatron and nemo), inverted
from the measured steps of the development split's host-bound runs, and the rate each source is
estimated with under leave-one-source-out.

    python -m benchmarks.host_rate [--write | --check]

Rule (written before its result was read; docs/cost-model.md, Host issue time):

- Candidates: development-split records with a measured step whose profile carries a stack
  rate (``host_op_s_published > 0``, ``host_issue`` per kernel).
- A run measures the rate when the host must explain a large part of its step: priced at the
  measured dispatch rate alone (:attr:`autopar.cost.params.CostParams.host_op_s`) its step is
  below the measured one by at least :data:`SHARE_MIN` of it, and some rate up to
  :data:`MAX_RATE_S` reaches the measured step. Its rate is the one whose priced step equals the
  measured one (bisection; the priced step grows monotonically with the rate).
- A source's rate is the median of its runs'; the stack rate is the median over sources (each
  source weighs the same); a source is estimated with the median over the other sources
  (:func:`loso_rate`), so no run is priced with a rate its own source set.

The figure is a total per counted kernel (the module code of Megatron-Core and Transformer
Engine, the dispatcher's host reads, launch latencies), not a measurement of host time. It
depends on the host CPU, which the cluster model does not hold: most runs behind it ran on x86
hosts, swiss-ai's on GH200's Arm Grace CPU, where Transformer Engine's module code runs several
times longer (NVIDIA/TransformerEngine#2053).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from autopar.frameworks import with_host_rate

DATA = Path(__file__).resolve().parent / "data" / "host" / "stack_host_rates.json"
#: Share of the measured step the host must explain for a run to measure the rate: a third, so
#: a run missing time mostly to other causes does not set it.
SHARE_MIN = 1.0 / 3.0
#: Highest rate searched (seconds per kernel): ten times the largest published figure.
MAX_RATE_S = 2e-3
#: Bisection steps (2e-3 / 2**20: below 0.002 us).
STEPS = 20


def with_rate(profile, rate_s: float):
    """``profile`` with its stack rate set to ``rate_s`` seconds per kernel
    (:func:`autopar.frameworks.with_host_rate`)."""
    return with_host_rate(profile, rate_s, "benchmarks.host_rate: a rate inverted from "
                          "published host-bound runs (module docstring)")


def _priced(rec, rate_s: float) -> float:
    from . import validation
    return validation.evaluate(rec, spread=False, host_rate=rate_s).predicted_s


def implied_rate(rec) -> float | None:
    """Seconds per kernel at which ``rec``'s priced step equals its measured one, or None when
    the run does not measure the rate (module docstring)."""
    m = rec.measured_step_s
    base = _priced(rec, 0.0)
    if base >= m or (m - base) / m < SHARE_MIN or _priced(rec, MAX_RATE_S) < m:
        return None
    lo, hi = 0.0, MAX_RATE_S
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _priced(rec, mid) < m else (lo, mid)
    return (lo + hi) / 2


def compute() -> dict:
    """``{"rule", "share_min", "rate_s", "sources": {key: {"rate_s", "runs": {id: rate}}}}``
    over the development split (module docstring)."""
    from . import validation
    from .records import parse, source_key
    sources: dict[str, dict[str, float]] = {}
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
            rate = implied_rate(rec)
        except validation.REFUSED:
            continue
        if rate is not None:
            sources.setdefault(source_key(raw), {})[rec.id] = rate
    per = {k: {"rate_s": statistics.median(v.values()), "runs": dict(sorted(v.items()))}
           for k, v in sorted(sources.items())}
    return {"rule": __doc__.split("Rule", 1)[1].split("The figure", 1)[0].strip(),
            "share_min": SHARE_MIN,
            "rate_s": statistics.median(s["rate_s"] for s in per.values()) if per else 0.0,
            "sources": per}


def loso_rate(key: str, data: dict | None = None) -> float | None:
    """The stack rate a run of source ``key`` is estimated with: the median over the other
    sources of :data:`DATA` when ``key`` is one of them, else None (the profile's own rate,
    which no run of ``key`` set)."""
    data = data if data is not None else _load()
    if key not in data.get("sources", {}):
        return None
    others = [s["rate_s"] for k, s in data["sources"].items() if k != key]
    return statistics.median(others) if others else None


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
    for key, s in data["sources"].items():
        print(f"{s['rate_s'] * 1e6:7.1f} us  {len(s['runs']):3d} runs  {key[:90]}")
    print(f"stack rate (median over {len(data['sources'])} sources): "
          f"{data['rate_s'] * 1e6:.1f} us per kernel")
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
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
