"""Check corpus files without estimating anything: records parse, keep their provenance, ids
are unique.

    python -m benchmarks.corpus_check FILE...   # default: every record file of benchmarks/data

Per file: records, parsed, refused (each with its one-line reason,
:func:`benchmarks.validation.refusal`: a refusal is not an error, the evaluator lists it too),
and the errors: a record that is not an object or lacks its ``id``, ``source`` or
``source_quote``, or an id that another record of the given files or of
``benchmarks/data/*.json`` also has. Exit 1 when there is any error, else 0. Runs no cost model
(the locked validation split may be checked with it), about a second.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from . import validation
from .records import parse

#: Fields every record must have, non-empty (benchmarks/data/README.md, SOURCES.md).
REQUIRED = ("source", "source_quote")


def _name(path: Path) -> str:
    """``path`` relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _records(path: Path) -> list:
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path} holds a {type(data).__name__}, not a list of records")
    return data


def check(files: list[Path]) -> tuple[list[str], int]:
    """(lines to print, errors) for ``files``; ids are compared across ``files`` and every
    record file of :data:`benchmarks.validation.DATA_DIR`."""
    files = [Path(f) for f in files]
    lines, errors = [], 0
    where: dict[str, list[str]] = defaultdict(list)
    loaded: dict[Path, list] = {}
    for f in dict.fromkeys([*(p.resolve() for p in files),
                            *(p.resolve() for p in validation.corpus_files())]):
        try:
            loaded[f] = _records(f)
        except (OSError, ValueError) as exc:
            loaded[f] = exc
            continue
        for r in loaded[f]:
            if isinstance(r, dict) and r.get("id"):
                where[r["id"]].append(f.name)
    for f in files:
        data = loaded[f.resolve()]
        if isinstance(data, Exception):
            lines.append(f"{_name(f)}: ERROR cannot be read: {' '.join(str(data).split())}")
            errors += 1
            continue
        parsed, refused, bad = 0, [], []
        for i, r in enumerate(data):
            if not isinstance(r, dict):
                bad.append(f"record {i} is a {type(r).__name__}, not an object")
                continue
            rid = r.get("id")
            if not rid:
                bad.append(f"record {i} has no id")
            missing = [k for k in REQUIRED if not r.get(k)]
            if missing:
                bad.append(f"{rid or i}: missing {', '.join(missing)}")
            if rid and len(where[rid]) > 1:
                bad.append(f"{rid}: duplicate id (in {', '.join(where[rid])})")
            try:
                parse(r)
                parsed += 1
            except validation.REFUSED as exc:
                refused.append((rid or str(i), validation.refusal(exc)))
        lines.append(f"{_name(f)}: {len(data)} records, {parsed} parsed, {len(refused)} refused, "
                     f"{len(bad)} errors")
        lines += [f"  refused {rid}: {why}" for rid, why in refused]
        lines += [f"  ERROR {b}" for b in bad]
        errors += len(bad)
    lines.append(f"{errors} errors" if errors else "ok")
    return lines, errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="record files (default: benchmarks/data/*.json)")
    args = ap.parse_args(argv)
    lines, errors = check([Path(f) for f in args.files] or validation.corpus_files())
    print("\n".join(lines))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
