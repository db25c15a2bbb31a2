"""The package's layering, as docs/design.md ("Layer order") states it: no import circle between
autopar's modules nor between its packages, no module importing a layer above its own, and no
module importing another module's private (underscore) names. Checked from the source with
``ast``, every import counted (function-level ones and ``if TYPE_CHECKING:`` ones too), so the
test is deterministic and needs no torch import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "autopar"
DESIGN = ROOT.parent / "docs" / "design.md"

#: The layer order, lowest first: a module may import only modules of its own layer or of layers
#: before it. Each layer is a top-level package or module of autopar (``autopar`` itself, the
#: package's ``__init__``, is the top: it provides the services of ``autopar.hooks``).
#: docs/design.md's "Layer order" lists the same names in the same order (tested below).
LAYERS = ("errors", "frozen", "hooks", "config", "graph", "hardware", "models", "frameworks", "cost",
          "search", "problem", "io", "plan", "report", "runtime", "calibrate", "reestimate",
          "alternatives", "api", "cli", "autopar")

#: The pipeline's stages (docs/design.md, "Data flow"): each must be a layer.
STAGES = ("graph", "hardware", "models", "frameworks", "config", "cost", "search", "problem",
          "plan", "io", "report", "runtime", "calibrate", "api", "cli")


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


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def import_graph() -> tuple[nx.DiGraph, list[str]]:
    """(module import graph inside autopar, cross-module private imports as text)."""
    modules = _modules()
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


def layer(mod: str) -> str:
    """The layer of a module: its top-level package or module under autopar (``autopar.cost.model``
    -> ``cost``), ``autopar`` for the package's ``__init__``."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph() -> nx.DiGraph:
    """The import graph with every module collapsed to its layer (:func:`layer`)."""
    g, _ = import_graph()
    p = nx.DiGraph()
    p.add_nodes_from(layer(m) for m in g.nodes)
    p.add_edges_from((layer(a), layer(b)) for a, b in g.edges if layer(a) != layer(b))
    return p


def _package_parents(mod: str) -> set[str]:
    parts = mod.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_import_circles():
    g, _ = import_graph()
    # a package's __init__ re-exporting its own submodules is not a circle of layers
    h = nx.DiGraph((a, b) for a, b in g.edges if b not in _package_parents(a))
    cycles = sorted(sorted(c) for c in nx.simple_cycles(h))
    assert cycles == [], f"import circles: {cycles}"


def test_no_package_import_circles():
    """Collapsed to their top-level packages, autopar's modules import in no circle."""
    cycles = sorted(sorted(c) for c in nx.simple_cycles(package_graph()))
    assert cycles == [], f"package import circles: {cycles}"


def test_no_cross_module_private_imports():
    _, private = import_graph()
    assert private == [], "\n".join(private)


def test_every_layer_is_listed_and_every_stage_is_a_layer():
    found = set(package_graph().nodes)
    unlisted = sorted(found - set(LAYERS))
    assert unlisted == [], (f"{unlisted} are in no layer: add each to LAYERS here and to the "
                            "'Layer order' of docs/design.md, where it belongs")
    assert sorted(set(LAYERS) - found) == [], "LAYERS names a layer that is not in autopar/"
    assert len(set(LAYERS)) == len(LAYERS)
    assert [s for s in STAGES if s not in LAYERS] == []


def test_no_module_imports_a_layer_above_its_own():
    """Every import, module-level or inside a function, goes down the layer order (or stays in
    its own layer): graph and hardware know nothing of cost, cost nothing of search, search
    nothing of the problem, the plan nothing of the report, the runtime or the api..."""
    g, _ = import_graph()
    rank = {name: i for i, name in enumerate(LAYERS)}
    # a layer missing from LAYERS is reported by the test above
    up = sorted(f"{a} -> {b} ({layer(a)} is below {layer(b)})" for a, b in g.edges
                if rank.get(layer(b), -1) > rank.get(layer(a), len(LAYERS)))
    assert up == [], "\n".join(up)


def test_the_plan_is_data_and_the_searches_are_above_report_and_runtime():
    """What issue 24 moved: the plan imports no report, runtime, re-estimate or api; the report
    and the runtime run no search (autopar.alternatives does); calibration goes through the
    problem layer, not the api."""
    g, _ = import_graph()
    out = {m: {layer(b) for b in g.successors(m)} for m in g.nodes}
    assert out["autopar.plan"].isdisjoint(
        {"report", "runtime", "reestimate", "alternatives", "api", "calibrate"})
    for mod in g.nodes:
        if layer(mod) in ("report", "runtime"):
            assert not any(b.startswith(("autopar.search.optimize", "autopar.search.margin"))
                           for b in g.successors(mod)), mod
    assert "api" not in {layer(b) for m in g.nodes if layer(m) == "calibrate"
                         for b in g.successors(m)}


def test_no_import_by_name_below_the_top():
    """``importlib.import_module`` and ``__import__`` would hide an import from these tests: only
    the package's ``__init__`` (the top layer: its lazy public names) uses them."""
    hidden = []
    for mod, path in _modules().items():
        if mod == "autopar":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in ("import_module", "__import__"):
                    hidden.append(f"{mod}:{node.lineno}")
    assert hidden == [], hidden


def design_layers(text: str) -> tuple[str, ...]:
    """The layer names of docs/design.md's "Layer order" section: the first backquoted name of
    each numbered line, in order."""
    section = text.split("## Layer order", 1)[1].split("\n## ", 1)[0]
    return tuple(m.group(1) for m in re.finditer(r"^\d+\.\s+`([\w.]+)", section, re.M))


def test_design_md_states_the_same_layer_order():
    assert design_layers(DESIGN.read_text()) == LAYERS


def test_the_package_exports_extract():
    import autopar.graph
    assert callable(autopar.graph.extract)
