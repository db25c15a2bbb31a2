"""ruff over the code base (rules and line length in pyproject.toml's [tool.ruff]): CI installs the
test extra, which brings ruff, so this test is how CI lints."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="ruff is not installed (pip install -e '.[test]')")
def test_ruff_check_passes():
    args = ["check", "autopar", "benchmarks", "tests"]
    run = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, f"`ruff {' '.join(args)}` failed:\n{run.stdout}{run.stderr}"
