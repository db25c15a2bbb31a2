"""docs/extending.md stays true: every file it names exists, and every name it places in a file
is in that file (issue 24: adding a GPU is one row, a framework profile one module)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "extending.md").read_text()


def test_every_file_named_exists():
    paths = set(re.findall(r"`((?:autopar|tests|benchmarks|docs)/[\w/.\-]+)`", DOC))
    assert len(paths) > 40
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert missing == [], missing


def test_every_name_placed_in_a_file_is_there():
    pairs = re.findall(r"`(\w+)` in `((?:autopar|tests|benchmarks)/[\w/.]+\.py)`", DOC)
    pairs += [(name, path) for path, name in re.findall(
        r"`((?:autopar|tests|benchmarks)/[\w/.]+\.py)`,? \(`(\w+)`", DOC)]
    assert len(pairs) > 10
    absent = [(n, p) for n, p in pairs if not re.search(rf"\b{n}\b", (ROOT / p).read_text())]
    assert absent == [], absent


def test_it_is_in_the_site_nav():
    assert "extending.md" in (ROOT / "mkdocs.yml").read_text()


def test_a_gpu_is_one_row_and_a_profile_one_module():
    from autopar.frameworks import PROFILES
    from autopar.hardware.devices import DEVICES, GPUS
    assert len(GPUS) == len({row.name for row in GPUS}) and {r.name for r in GPUS} <= set(DEVICES)
    stacks = {p.stem for p in (ROOT / "autopar" / "frameworks" / "stacks").glob("*.py")} - {
        "__init__"}
    # every profile lives in a module of its own framework family (one module may hold a
    # framework's release variants, e.g. internevo and internevo-fsdp)
    assert len(stacks) >= 10 and len(PROFILES) >= len(stacks)
