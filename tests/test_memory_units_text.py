"""User-facing memory figures: a value an f-string prints right before "GB" (1e9 bytes) is not
divided by 2**30, one before "GiB" (2**30 bytes) not by 1e9 (SI bytes inside, converted once
at the edge: autopar.report, autopar.runtime.verdict). Values converted before the f-string
are not seen by this check."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import autopar

ROOT = Path(autopar.__file__).parent
#: modules that print memory figures to a person
FILES = ("cost/notes.py", "cost/regime.py", "search/diagnose.py", "search/margin.py",
         "cli/output.py", "cli/commands.py", "cli/inputs.py", "cli/plan_input.py",
         "cli/measure_cmds.py",
         "runtime/verdict.py", "alternatives.py", "hardware/catalog.py", "calibrate/check.py",
         *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "report").glob("*.py"))))
SI = re.compile(r"\b1e9\b|\b10 ?\*\* ?9\b|\bGB\b")          # a divisor named GB = 1e9
BINARY = re.compile(r"2 ?\*\* ?30|1 ?<< ?30|1024 ?\*\* ?3|_?GIB\b")


def _mixed(path: Path, seen: list | None = None) -> list[str]:
    """Each formatted value of an f-string whose next literal starts with a unit ("GB",
    "GiB"), checked against the divisors written in it."""
    src, bad = path.read_text(), []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.JoinedStr):
            continue
        for v, nxt in zip(node.values, node.values[1:]):
            if not isinstance(v, ast.FormattedValue) or not isinstance(nxt, ast.Constant):
                continue
            code = ast.get_source_segment(src, v.value) or ""
            unit = re.match(r"\s*(GiB|GB)\b(?!/s)", str(nxt.value))
            if unit and seen is not None:
                seen.append(code)
            if unit and unit[1] == "GiB" and SI.search(code):
                bad.append(f"{path.name}:{node.lineno} GiB from {code}")
            if unit and unit[1] == "GB" and BINARY.search(code):
                bad.append(f"{path.name}:{node.lineno} GB from {code}")
    return bad


def test_printed_memory_units_match_their_divisor():
    files = [ROOT / f for f in FILES]
    assert all(f.exists() for f in files), [f for f in files if not f.exists()]
    seen: list[str] = []
    assert [b for f in files for b in _mixed(f, seen)] == []
    assert len(seen) > 25   # the check reads the printed figures (not an empty pass)


def test_the_check_catches_a_mismatch(tmp_path):
    f = tmp_path / "x.py"
    f.write_text('a = 1\ns = f"{a / 2 ** 30:.1f} GB"\nt = f"{a / 1e9:.1f} GiB"\n'
                 'u = f"{a / 1e9:.1f} GB, {a / 2 ** 30:.1f} GiB of {a / 1e9:.0f} GB/s"\n')
    f.write_text(f.read_text() + 'v = f"{a / 2 ** 30:.1f} GiB and {a / 1e9:.1f} GB"\n')
    # line 4 and 5 match each value to its own unit (GB/s is a rate, not a size)
    assert _mixed(f) == ["x.py:2 GB from a / 2 ** 30", "x.py:3 GiB from a / 1e9"]
