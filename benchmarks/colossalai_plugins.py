"""Regenerate ``tests/data/colossalai_plugins.json``: the keyword arguments of Colossal-AI's
booster plugins (name, annotation, default) and the value lists their ``__init__`` checks, read
from the source with ``ast`` (nothing is imported or executed).

    python -m benchmarks.colossalai_plugins /path/to/ColossalAI COMMIT

Why a recorded schema: colossalai on PyPI (0.5.0) requires torch>=2.2,<=2.5.1, so installing it
would replace the torch 2.13 autopar is tested with; CI cannot import its plugin classes. The
test ``tests/test_export_plugins.py`` checks the exporter's output against this file instead.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "colossalai_plugins.json"

#: plugin class -> its file under the checkout.
PLUGINS = {
    "HybridParallelPlugin": "colossalai/booster/plugin/hybrid_parallel_plugin.py",
    "MoeHybridParallelPlugin": "colossalai/booster/plugin/moe_hybrid_parallel_plugin.py",
    "GeminiPlugin": "colossalai/booster/plugin/gemini_plugin.py",
    "LowLevelZeroPlugin": "colossalai/booster/plugin/low_level_zero_plugin.py",
}

#: module-level lists of allowed values, by file, recorded beside the signatures.
CONSTANTS = ("SUPPORT_SP_MODE", "SUPPORTED_PRECISION")


def _signature(tree: ast.Module, cls: str) -> dict:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    a = item.args
                    params = a.args[1:]
                    defaults = [None] * (len(params) - len(a.defaults)) + list(a.defaults)
                    out = {}
                    for p, d in zip(params, defaults):
                        out[p.arg] = {"annotation": ast.unparse(p.annotation) if p.annotation
                                      else None,
                                      "required": d is None,
                                      "default": ast.unparse(d) if d is not None else None}
                    return {"line": item.lineno, "params": out}
    raise SystemExit(f"{cls}.__init__ not found")


def _constants(tree: ast.Module) -> dict:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and node.targets[0].id in CONSTANTS:
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", help="ColossalAI source tree (the folder holding colossalai/)")
    ap.add_argument("commit", help="the commit the checkout is at (recorded in the file)")
    args = ap.parse_args(argv)
    root = Path(args.checkout)
    doc = {"source": f"hpcaitech/ColossalAI@{args.commit}",
           "version": (root / "version.txt").read_text().strip(), "plugins": {}}
    for cls, path in PLUGINS.items():
        tree = ast.parse((root / path).read_text())
        doc["plugins"][cls] = {"file": path, **_signature(tree, cls), "constants": _constants(tree)}
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
