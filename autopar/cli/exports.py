"""``autopar plan --export FRAMEWORK FILE``: the exporters it offers, the output paths checked
before a search, and the export written with its verdict (what the file really runs)."""

from __future__ import annotations

import difflib
import errno
import importlib.util
import os
from pathlib import Path

from ..errors import AutoparError, InvalidTrainingConfig, MissingDependency, output_error


#: ``--export`` targets: name -> (Plan method, its keyword arguments). ``torchtitan`` writes the
#: installed torchtitan's format (when none is installed, the one the plan was made for, else the
#: newest: autopar.runtime.to_torchtitan); ``torchtitan-0.2`` / ``torchtitan-0.3`` pick one.
EXPORTERS = {"megatron": ("to_megatron_args", {}),
             "megatron-bridge": ("to_megatron_bridge", {}), "torchtitan": ("to_torchtitan", {}),
             "torchtitan-0.2": ("to_torchtitan_toml", {}),
             "torchtitan-0.3": ("to_torchtitan_config", {}),
             "deepspeed": ("to_deepspeed_config", {}),
             "accelerate-fsdp": ("to_accelerate_config", {"plugin": "fsdp"}),
             "accelerate-deepspeed": ("to_accelerate_config", {"plugin": "deepspeed"}),
             "colossalai": ("to_colossalai_plugin", {})}


def check_outputs(args) -> None:
    """Fail before any search on what would fail after it: an unknown ``--export`` framework,
    an output path in a folder that does not exist or cannot be written, ``--plot`` without
    matplotlib, ``--price-per-gpu-hour`` without ``--tokens`` or a bad ``--currency``.

    Raises:
        InvalidTrainingConfig, OutputError, MissingDependency: as :func:`export_plan`, the plan
            writer, the plot and :func:`autopar.cli.output.run_costs` would.
    """
    from .output import run_costs   # the report's imports: not for building the parser
    run_costs(args, [])   # the run-cost flags, checked after the search before
    exports = getattr(args, "export", None) or []
    # framework names in any case, as every choice of the CLI ("--export Megatron f")
    exports = [[framework.lower(), path] for framework, path in exports]
    if exports:
        args.export = exports
    for framework, _ in exports:
        if framework not in EXPORTERS:
            near = difflib.get_close_matches(framework, list(EXPORTERS), n=1)
            guess = f" Did you mean {near[0]!r}?" if near else ""
            raise InvalidTrainingConfig(f"--export {framework!r}: autopar exports to "
                                        f"{', '.join(EXPORTERS)}.{guess} Fix: e.g. --export "
                                        "megatron args.txt")
    files = [Path(f).resolve() for _, f in exports]
    twice = next((f for f in files if files.count(f) > 1), None)
    if twice is not None:
        raise InvalidTrainingConfig(f"--export names {twice} more than once: the last export "
                                    "would overwrite the others. Fix: one FILE per --export.")
    paths = [getattr(args, "out", None), *(f for _, f in exports),
             getattr(args, "plot", None)]
    for path in filter(None, paths):
        folder = Path(path).resolve().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            # the OS's own words, as writing the file would raise (docs/errors.md, OutputError)
            code = errno.ENOENT if not folder.is_dir() else errno.EACCES
            raise output_error(path, OSError(code, os.strerror(code)))
    if getattr(args, "plot", None) and importlib.util.find_spec("matplotlib") is None:
        raise MissingDependency("--plot needs matplotlib, which is not installed. Fix: pip "
                                "install \"autopar[plot]\" (from a clone: pip install -e \".[plot]\"; "
                                "or pip install matplotlib).")
    if getattr(args, "plot", None):   # a format matplotlib cannot write, before the search
        from ..report.plots import check_plot_path
        args.plot = check_plot_path(args.plot)   # "wrote FILE" names the file written


def export_plans(args, plan) -> list[dict]:
    """Write every ``--export FRAMEWORK FILE`` (the flag may be repeated), in the order given;
    returns what :func:`export_plan` returns for each. Every export is built before any file is
    written, so one that cannot be written leaves none behind.

    Raises:
        as :func:`export_plan`, naming the export and that no file was written.
    """
    built = []
    for framework, path in getattr(args, "export", None) or []:
        try:
            built.append(_build(plan, framework, path))
        except AutoparError as exc:
            raise type(exc)(f"--export {framework} {path}: {exc} (no --export file was "
                            "written; without this --export the plan is printed)") from exc
    return [_write(*b) for b in built]


def export_plan(plan, framework: str, path: str) -> dict:
    """Write ``plan`` for ``framework`` (a key of :data:`EXPORTERS`) to ``path``; returns what was
    written and its verdict: ``{"framework", "file", "fits", "warnings"}``.

    Raises:
        InvalidTrainingConfig: an unknown framework; OutputError: FILE cannot be written;
        UnsupportedPlanError: the framework cannot run the plan.
    """
    return _write(*_build(plan, framework, path))


def _build(plan, framework: str, path: str):
    """(framework label, path, text, Export) of one export, nothing written."""
    framework = framework.lower()
    if framework not in EXPORTERS:
        raise InvalidTrainingConfig(f"--export {framework!r}: autopar exports to "
                                    f"{', '.join(EXPORTERS)}. Fix: e.g. --export megatron args.txt")
    method, kwargs = EXPORTERS[framework]
    ex = getattr(plan, method)(**kwargs)
    if framework == "torchtitan":   # say which format was written
        from ..runtime.export.version import torchtitan_series
        framework = f"torchtitan-{torchtitan_series(plan)}"
    text = ex.text()
    if framework == "torchtitan-0.3":   # the run line names the file's module
        text = text.replace("--module NAME", f"--module {Path(path).stem}").replace(
            "Save as NAME.py and run", "Run")
    return framework, path, text, ex


#: The file suffix each torchtitan format is read from (0.2: ``--job.config_file`` TOML; 0.3:
#: ``--module`` imports a Python file).
_SUFFIX = {"torchtitan-0.2": ".toml", "torchtitan-0.3": ".py"}


def _write(framework: str, path: str, text: str, ex) -> dict:
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise output_error(path, exc) from exc
    warnings = list(ex.warnings)
    want = _SUFFIX.get(framework)
    if want and Path(path).suffix != want:
        # --export torchtitan picks the format, not the file name: say when they disagree
        other = "torchtitan-0.3" if framework == "torchtitan-0.2" else "torchtitan-0.2"
        warnings.append(f"{path} holds {framework}'s format ({want[1:]}), not what its name "
                        f"suggests. Fix: name it *{want}, or --export {other} {path}.")
    return {"framework": framework, "file": path, "fits": ex.fits, "warnings": warnings}
