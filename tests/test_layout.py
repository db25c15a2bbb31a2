"""The package's layering: no import circle between autopar's modules, and no module importing
another module's private (underscore) names. Checked from the source with ``ast``, every import
counted (function-level ones too), so the test is deterministic and needs no torch import."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "autopar"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> tuple[nx.DiGraph, list[str]]:
    """(module import graph inside autopar, cross-module private imports as text)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    private = []
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append((sub, None) if sub in modules else (base, a.name))
            for target, name in targets:
                if not target.startswith("autopar"):
                    continue
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != mod:
                    g.add_edge(mod, target)
                if name and name.startswith("_") and not name.startswith("__") and target != mod:
                    private.append(f"{mod} imports {target}.{name}")
    return g, private


def _package_parents(mod: str) -> set[str]:
    parts = mod.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_import_circles():
    g, _ = import_graph()
    # a package's __init__ re-exporting its own submodules is not a circle of layers
    h = nx.DiGraph((a, b) for a, b in g.edges if b not in _package_parents(a))
    cycles = sorted(sorted(c) for c in nx.simple_cycles(h))
    assert cycles == [], f"import circles: {cycles}"


def test_no_cross_module_private_imports():
    _, private = import_graph()
    assert private == [], "\n".join(private)


def test_stages_import_no_layer_above():
    """graph and hardware know nothing of cost; cost nothing of search; search nothing of
    runtime, report, io or cli (docs/design.md, data flow)."""
    g, _ = import_graph()
    above = {
        "autopar.graph": ("autopar.cost", "autopar.search", "autopar.runtime", "autopar.report",
                          "autopar.cli", "autopar.api", "autopar.plan"),
        "autopar.hardware": ("autopar.cost", "autopar.search", "autopar.runtime",
                             "autopar.report", "autopar.cli", "autopar.api", "autopar.plan"),
        "autopar.cost": ("autopar.search", "autopar.runtime", "autopar.report", "autopar.cli",
                         "autopar.api", "autopar.plan"),
        "autopar.search": ("autopar.runtime", "autopar.report", "autopar.cli", "autopar.api",
                           "autopar.plan"),
    }
    bad = [f"{a} -> {b}" for a, b in g.edges for low, highs in above.items()
           if (a == low or a.startswith(low + ".")) and any(
               b == h or b.startswith(h + ".") for h in highs)]
    assert bad == [], bad


def test_the_package_exports_extract():
    import autopar.graph
    assert callable(autopar.graph.extract)
