"""Read a torchtitan >= 0.3 job into autopar's terms, without running it: a Python config file
(as :func:`autopar.runtime.to_torchtitan_config` writes it, or a ``config_registry``-style
function of the user's) or the command-line overrides ``torchtitan.train`` takes.

torchtitan 0.3.0 (``config/manager.py``) builds a job from ``--module M --config F`` (a function
returning ``Trainer.Config``) and ``--section.key value`` overrides. A file is read with
:mod:`ast`: ``config.<section>.<key> = literal`` lines, ``ParallelismConfig(...)`` /
``TrainingConfig(...)`` / ``CompileConfig(...)`` keyword literals, ``activation_checkpoint`` set
to ``FullAC.Config()``, ``SelectiveAC.Config()`` or ``None``, and ``model_registry("FLAVOR",
moe_comm_backend=...)``. The keys then map as the TOML's do
(:func:`autopar.io.torchtitan_importer.from_torchtitan_doc`).
"""

from __future__ import annotations

import ast
import shlex
from dataclasses import replace
from pathlib import Path

from ..errors import InvalidParallelConfig
from .imported import Imported
from .torchtitan_importer import from_torchtitan_doc

#: torchtitan 0.3.0 config classes -> their section of Trainer.Config (trainer.py).
_SECTIONS = {"ParallelismConfig": "parallelism", "TrainingConfig": "training",
             "CompileConfig": "compile"}
#: distributed/activation_checkpoint.py policies -> the mode the TOML's importer reads.
_AC = {"FullAC": "full", "SelectiveAC": "selective", "MemoryBudgetAC": "memory-budget"}


def from_torchtitan_config(source: str | Path) -> Imported:
    """Read a torchtitan >= 0.3 job: a Python config file (a path, or its text) or its
    command-line overrides (a string starting with ``--``, e.g. ``"--module llama3 --config
    llama3_8b --parallelism.tensor_parallel_degree 8 activation_checkpoint:full"``).

    Returns:
        :class:`Imported`; ``model`` is the flavor the file registers itself, else a preset
        name from torchtitan's model and flavor (``llama3`` + ``8B`` -> ``llama3-8b``).

    Raises:
        InvalidParallelConfig: the file cannot be read, is not Python, holds no torchtitan
            setting (a TOML job file:
            :func:`autopar.io.torchtitan_importer.from_torchtitan_toml`), or has a
            mistyped value.
    """
    text = str(source)
    if text.lstrip().startswith("--"):
        doc, notes = _from_args(shlex.split(text))
    else:
        if "\n" not in text:
            try:
                text = Path(source).read_text()
            except OSError as exc:
                raise InvalidParallelConfig(
                    f"cannot read torchtitan config {source}: {exc.strerror or exc}. Fix: pass "
                    "the path of a torchtitan >= 0.3 Python config (or its text, or its "
                    "--section.key overrides).") from exc
        doc, notes = _from_python(text)
        if not doc:
            # nothing torchtitan's: estimating the defaults as if imported misleads
            toml = str(source).endswith(".toml") or text.lstrip().startswith("[")
            shown = "(text)" if "\n" in str(source) else source
            raise InvalidParallelConfig(
                f"torchtitan config {shown}: no "
                "torchtitan setting found in it (no config.<section>.<key> = value lines, "
                "ParallelismConfig(...) / TrainingConfig(...) / CompileConfig(...) calls or "
                "model_registry(...)). Fix: "
                + ("it looks like a TOML job file: pass it with --torchtitan-toml "
                   "(autopar.io.torchtitan_importer.from_torchtitan_toml in Python)." if toml else
                   "pass a torchtitan >= 0.3 Python config (as autopar's torchtitan-0.3 "
                   "export writes it), or a TOML job file with --torchtitan-toml."))
    imp = from_torchtitan_doc(doc, "0.3", what="torchtitan config")
    model = doc.get("model", {})
    preset = model.get("registered") or imp.model
    return replace(imp, model=preset, notes=imp.notes + tuple(notes))


def _set(doc: dict, section: str, key: str, value) -> None:
    doc.setdefault(section, {})[key] = value


def _from_python(text: str) -> tuple[dict, list[str]]:
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise InvalidParallelConfig(f"torchtitan config is not Python: {exc}. Fix: pass the "
                                    "file autopar wrote, or a config_registry function's "
                                    "module.") from exc
    doc: dict = {}
    notes: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "torchtitan.models.") and any(a.name == "model_registry" for a in node.names):
            _set(doc, "model", "name", node.module.split(".")[2])
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            _assign(doc, node.targets[0], node.value, notes)
        elif isinstance(node, ast.Call):
            _call(doc, node, notes)
    return doc, notes


def _assign(doc: dict, target, value, notes: list[str]) -> None:
    # config.<section>.<key> = literal, config.<section> = Class(...), llama3_configs[name] = fn
    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and \
            target.value.id.endswith("_configs"):
        try:
            _set(doc, "model", "registered", ast.literal_eval(target.slice))
        except ValueError:
            pass
        return
    if not isinstance(target, ast.Attribute):
        return
    if isinstance(target.value, ast.Attribute):
        if not isinstance(target.value.value, ast.Name):
            return                 # deeper than config.<section>.<key> (e.g. the loss's vocabulary)
        try:
            _set(doc, target.value.attr, target.attr, ast.literal_eval(value))
        except ValueError:
            notes.append(f"{target.value.attr}.{target.attr}: not a literal, ignored")
    elif target.attr == "activation_checkpoint":
        _ac(doc, value)


def _call(doc: dict, node: ast.Call, notes: list[str]) -> None:
    name = _name(node.func)
    if name in _SECTIONS:
        for kw in node.keywords:
            try:
                _set(doc, _SECTIONS[name], kw.arg, ast.literal_eval(kw.value))
            except ValueError:
                notes.append(f"{_SECTIONS[name]}.{kw.arg}: not a literal, ignored")
    elif name == "model_registry" and node.args:
        try:
            _set(doc, "model", "flavor", ast.literal_eval(node.args[0]))
        except ValueError:
            pass
        for kw in node.keywords:
            if kw.arg == "moe_comm_backend" and isinstance(kw.value, ast.Constant):
                _set(doc, "model", "moe_comm_backend", kw.value.value)
    elif name == "Float8LinearConverter.Config":
        doc["float8"] = True
    for kw in node.keywords:   # Trainer.Config(activation_checkpoint=FullAC.Config(), ...)
        if kw.arg == "activation_checkpoint":
            _ac(doc, kw.value)


def _ac(doc: dict, value) -> None:
    if isinstance(value, ast.Constant) and value.value is None:
        _set(doc, "activation_checkpoint", "mode", "none")
    elif isinstance(value, ast.Call) and _name(value.func).endswith(".Config"):
        mode = _AC.get(_name(value.func).rsplit(".", 1)[0])
        if mode is not None:
            _set(doc, "activation_checkpoint", "mode", mode)


def _name(func) -> str:
    """``a.b.C`` of a call's function (the last two parts: ``b.C``), or its bare name."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        head = func.value.id if isinstance(func.value, ast.Name) else \
            func.value.attr if isinstance(func.value, ast.Attribute) else ""
        return f"{head}.{func.attr}" if head else func.attr
    return ""


def _from_args(args: list[str]) -> tuple[dict, list[str]]:
    """``--module``, ``--config``, ``--section.key value`` (or ``=value``) and the
    ``activation_checkpoint:MODE`` subcommand, as tyro parses them (config/manager.py)."""
    doc: dict = {}
    notes: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("activation_checkpoint:") or arg.startswith("activation-checkpoint:"):
            mode = arg.split(":", 1)[1]
            _set(doc, "activation_checkpoint", "mode", mode)
            i += 1
            continue
        if not arg.startswith("--"):
            notes.append(f"{arg!r}: not an option, ignored")
            i += 1
            continue
        key, eq, value = arg[2:].partition("=")
        if not eq:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if nxt is None or nxt.startswith("--") or ":" in nxt:
                value = "true"        # a flag (tyro's booleans)
            else:
                value, i = nxt, i + 1
        i += 1
        key = key.replace("-", "_")
        if key == "module":
            _set(doc, "model", "name", value.split(".")[-1])
        elif key == "config":
            # torchtitan's registry functions are named MODULE_FLAVOR (llama3_8b, qwen3_14b)
            module = doc.get("model", {}).get("name")
            if module and value.startswith(module + "_"):
                _set(doc, "model", "flavor", value[len(module) + 1:])
            notes.append(f"--config {value}: its own settings (e.g. its activation "
                         "checkpointing) are not read, only the overrides given here")
        elif "." in key:
            section, _, field = key.partition(".")
            _set(doc, section, field, _literal(value))
        else:
            notes.append(f"--{key}: not a torchtitan section option, ignored")
    return doc, notes


def _literal(value: str):
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(value)
    except ValueError:
        return value
