"""The locked validation split of issue 25, by the rule written in benchmarks/data/LOCKED.md.

    python -m benchmarks.lock_split [--write]    # print (or write) benchmarks/data/locked_split.json

Candidates: the sources (:func:`benchmarks.records.source_key`) of the files
:data:`CANDIDATE_FILES` that no earlier corpus file has. Walk them in the order of the SHA-256
hex digest of their key; lock each unless that would leave its file with no development
source; stop at ceil(S / 3) locked, S = every source key of the corpus (evaluated or refused).
Sources of files added later are locked when their digest's first hex digit is below 6
(:func:`later_locked`). The list is data: once written it changes only by that later rule.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

from .records import source_key

DATA = Path(__file__).resolve().parent / "data"
LOCKED = DATA / "locked_split.json"
#: The files of issue 25's first corpus growth, whose sources the rule draws from.
CANDIDATE_FILES = ("published_runs_hopper.json", "published_runs_small.json",
                   "published_runs_pipeline.json", "published_runs_longseq.json",
                   "published_runs_fsdp.json", "published_runs_memory.json")
#: Corpus files that existed before issue 25 (tuned to: never locked).
EARLIER_FILES = ("published_plans.json", "published_runs_papers.json",
                 "published_runs_tables.json")
RULE = ("benchmarks/data/LOCKED.md: issue 25's new sources ordered by SHA-256 of their source "
        "key, ceil(S/3) locked keeping one development source per file; sources of later "
        "files locked when the digest's first hex digit < 6")


def digest(key: str) -> str:
    """SHA-256 hex digest of a source key (UTF-8)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


#: Sources whose measured-versus-predicted comparison an issue already states: their
#: residual was seen before any split could hide it, so locking them would measure nothing
#: (LOCKED.md). Issue 26 quotes autopar's 3.10 s against the 5.44-5.70 s of Megatron-LM #756.
SEEN_IN_ISSUES = ("NVIDIA/Megatron-LM issue #756",)


#: Sources estimated at intake, before the rule was applied to them: a helper adding them ran
#: the unchanged model over them and reported their residuals (LOCKED.md, 2026-12-07), so
#: locking them would measure nothing either. Key prefixes (benchmarks.records.source_key).
SEEN_AT_INTAKE = (
    "Hugging Face blog 'Ulysses Sequence Parallelism: Training with Million-Token Contexts'",
    "intelligent-machine-learning/dlrover atorch/examples/llama2/README.md 'Performance' table",
    # published_runs_new4.json: estimated by the intake's one accuracy run because
    # locked_split.json had not been rewritten yet (benchmarks.accuracy now refuses that)
    "pytorch/torchtitan PR #1610 'Switch DeepSeekV3 to Use FlexAttention by Default'",
    "pytorch/torchtitan PR #1690 '[Qwen3] Add 32b training configs'",
    # published_runs_new5.json: the lead estimated all its records with the unchanged model
    # (at 409bba9) before checking their digests; only PR #355's falls below 6
    "pytorch/torchtitan PR #355 '[torchtitan][optim] Add fused as an option in train config'",
)


def later_locked(key: str) -> bool:
    """Whether a source of a file added after the first growth is locked (6 of 16 digits),
    unless an issue already states its residual (:data:`SEEN_IN_ISSUES`) or its residual was
    read at intake (:data:`SEEN_AT_INTAKE`)."""
    if key.startswith(SEEN_IN_ISSUES + SEEN_AT_INTAKE):
        return False
    return int(digest(key)[0], 16) < 6


def _keys(name: str) -> list[str]:
    return [source_key(r) for r in json.loads((DATA / name).read_text())]


def first_walk() -> set[str]:
    """The walk over the first growth's candidates (run once: its result is data)."""
    earlier = {k for f in EARLIER_FILES for k in _keys(f)}
    files = sorted(p.name for p in DATA.glob("*.json") if p.name != LOCKED.name)
    every = {k for f in files for k in _keys(f)}
    by_file = {f: sorted(set(_keys(f)) - earlier) for f in CANDIDATE_FILES}
    target = math.ceil(len(every) / 3)
    dev_left = {f: len(keys) for f, keys in by_file.items()}
    locked: set[str] = set()
    for key in sorted({k for keys in by_file.values() for k in keys}, key=digest):
        if len(locked) >= target:
            break
        homes = [f for f, keys in by_file.items() if key in keys]
        if any(dev_left[f] <= 1 for f in homes):
            continue   # the file's last development source
        locked.add(key)
        for f in homes:
            dev_left[f] -= 1
    return locked


def locked_sources() -> list[str]:
    """The locked source keys (sorted): the first walk as written in :data:`LOCKED` (run
    only when the file has none yet), plus the sources of later files that
    :func:`later_locked` locks. A growing corpus never re-runs the walk: that would lock
    sources whose residuals have since been seen."""
    written = set(json.loads(LOCKED.read_text())["sources"]) if LOCKED.exists() else set()
    locked = written or first_walk()
    seen = {k for f in EARLIER_FILES + CANDIDATE_FILES for k in _keys(f)}
    for f in sorted(p.name for p in DATA.glob("*.json") if p.name != LOCKED.name):
        if f not in CANDIDATE_FILES and f not in EARLIER_FILES:
            locked |= {k for k in _keys(f) if k not in seen and later_locked(k)}
    return sorted(locked)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write benchmarks/data/locked_split.json")
    args = ap.parse_args(argv)
    keys = locked_sources()
    if args.write:
        LOCKED.write_text(json.dumps({"rule": RULE, "sources": keys}, indent=1,
                                     ensure_ascii=False) + "\n")
    for k in keys:
        print(k)
    print(f"{len(keys)} locked sources")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
