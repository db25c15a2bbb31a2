"""Regenerate ``tests/data/megatron_bridge_schema.json``: the field names of the Megatron-Bridge
``ConfigContainer`` sections autopar's export sets (each dataclass with its bases, through
Megatron-Core and ``megatron.training``), the section names, and the registered mixed-precision
recipe names, read from the source with ``ast`` (nothing is imported or executed).

    python -m benchmarks.megatron_bridge_schema BRIDGE_GIT_DIR BRIDGE_COMMIT MEGATRON_LM_GIT_DIR

The Megatron-LM commit is the one Megatron-Bridge pins as its ``3rdparty/Megatron-LM``
submodule at ``BRIDGE_COMMIT``; both are read with ``git show`` (bare clones are enough).

Why a recorded schema: megatron-bridge on PyPI (0.6.x) requires Python >=3.12,<3.13 and
megatron-core[dev,mlm], transformer-engine and flashinfer; autopar is tested on Python 3.11 with
the CPU torch, so CI cannot import its config classes. ``tests/test_export_megatron_bridge.py``
checks the exporter's output against this file instead.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "megatron_bridge_schema.json"

#: ConfigContainer section -> (module, class) of the dataclass autopar's export fills.
SECTIONS = {
    "model": ("megatron.bridge.models.gpt_provider", "GPTModelProvider"),
    "train": ("megatron.bridge.training.config", "TrainingConfig"),
    "ddp": ("megatron.bridge.training.config", "DistributedDataParallelConfig"),
    "optimizer": ("megatron.bridge.training.config", "OptimizerConfig"),
    "dist": ("megatron.bridge.training.config", "DistributedInitConfig"),
    "dataset": ("megatron.bridge.training.config", "GPTDatasetConfig"),
}
CONTAINER = ("megatron.bridge.training.config", "ConfigContainer")
MIXED_PRECISION = "megatron.bridge.training.mixed_precision"


class Source:
    """Module files of Megatron-Bridge (``src/``) and its pinned Megatron-LM, read by git."""

    def __init__(self, bridge: str, commit: str, megatron: str):
        self.bridge, self.commit, self.megatron = bridge, commit, megatron
        line = self._git(bridge, "ls-tree", commit, "3rdparty/Megatron-LM").split()
        self.megatron_commit = line[2]
        self._trees: dict[str, ast.Module] = {}

    @staticmethod
    def _git(git_dir: str, *args: str) -> str:
        return subprocess.run(["git", "--git-dir", git_dir, *args], check=True,
                              capture_output=True, text=True).stdout

    def where(self, module: str) -> tuple[str, str, str] | None:
        """(git dir, commit, path) of ``module``'s file, or None when not in either tree."""
        rel = module.replace(".", "/")
        if module.startswith("megatron.bridge"):
            cands = [(self.bridge, self.commit, f"src/{rel}.py"),
                     (self.bridge, self.commit, f"src/{rel}/__init__.py")]
        elif module.startswith(("megatron.core", "megatron.training")):
            cands = [(self.megatron, self.megatron_commit, f"{rel}.py"),
                     (self.megatron, self.megatron_commit, f"{rel}/__init__.py")]
        else:
            return None
        for git_dir, commit, path in cands:
            try:
                self._git(git_dir, "cat-file", "-e", f"{commit}:{path}")
                return git_dir, commit, path
            except subprocess.CalledProcessError:
                continue
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            loc = self.where(module)
            self._trees[module] = None if loc is None else ast.parse(
                self._git(loc[0], "show", f"{loc[1]}:{loc[2]}"))
        return self._trees[module]


def _imports(tree: ast.Module, module: str, package: bool) -> dict[str, tuple[str, str]]:
    """Local name -> (module, name) for the ``from X import Y [as Z]`` lines of ``tree``
    (``package``: the module is a package's ``__init__``, which relative imports start from)."""
    out = {}
    pkg = module if package else module.rsplit(".", 1)[0]
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                                + ([base] if base else []))
            for a in node.names:
                out[a.asname or a.name] = (base, a.name)
    return out


def fields(src: Source, module: str, cls: str, seen=None) -> tuple[set[str], list[str]]:
    """(annotated field names of ``cls`` and its bases, the classes read as module.Class)."""
    seen = seen if seen is not None else set()
    if (module, cls) in seen:
        return set(), []
    seen.add((module, cls))
    tree = src.tree(module)
    if tree is None:
        return set(), []
    imports = _imports(tree, module, src.where(module)[2].endswith("__init__.py"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            break
    else:   # re-exported from a package __init__
        if cls in imports:
            return fields(src, *imports[cls], seen)
        return set(), []
    names = {n.target.id for n in node.body
             if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    read = [f"{module}.{cls}"]
    for base in node.bases:
        b = base.value if isinstance(base, ast.Subscript) else base
        name = b.id if isinstance(b, ast.Name) else None
        if name is None:
            continue
        target = imports.get(name, (module, name))
        more, classes = fields(src, *target, seen)
        names |= more
        read += classes
    return names, read


def mixed_precision_recipes(src: Source) -> list[str]:
    """Names of the ``@register``-ed recipe factories (also accepted with '-' for '_')."""
    tree = src.tree(MIXED_PRECISION)
    return sorted(n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                  and any(isinstance(d, ast.Name) and d.id == "register"
                          for d in n.decorator_list))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bridge", help="git dir of NVIDIA-NeMo/Megatron-Bridge")
    ap.add_argument("commit", help="the Megatron-Bridge commit to read")
    ap.add_argument("megatron", help="git dir of NVIDIA/Megatron-LM (holding the pinned commit)")
    args = ap.parse_args(argv)
    src = Source(args.bridge, args.commit, args.megatron)
    doc = {"source": f"NVIDIA-NeMo/Megatron-Bridge@{args.commit}",
           "megatron_lm": f"NVIDIA/Megatron-LM@{src.megatron_commit}",
           "container": sorted(fields(src, *CONTAINER)[0]), "sections": {},
           "mixed_precision": mixed_precision_recipes(src)}
    for section, (module, cls) in SECTIONS.items():
        names, read = fields(src, module, cls)
        doc["sections"][section] = {"classes": read, "fields": sorted(names)}
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
