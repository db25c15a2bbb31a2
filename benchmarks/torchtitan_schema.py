"""Record the installed torchtitan's job schema: its config sections, each field and the field's
type and default, read from torchtitan's own dataclasses.

    python -m benchmarks.torchtitan_schema

v0.2.x: ``torchtitan.config.job_config.JobConfig`` (the TOML's tables) ->
``tests/data/torchtitan_0.2.2_job_config.json``; 0.3 and later: the sections of
``torchtitan.trainer.Trainer.Config`` that autopar's Python config sets (parallelism, training,
compile) -> ``tests/data/torchtitan_0.3.0_config.json`` (the version is the installed one's).
The export tests check what autopar writes against these files where that torchtitan is not
installed, and check the files against torchtitan where it is (a drift test).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from importlib.metadata import version
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
#: The 0.3 sections autopar's Python config sets (config.<section>.<key> = value).
SECTIONS_03 = ("parallelism", "training", "compile")


def _type_name(t) -> str:
    if isinstance(t, str):
        return t
    if typing.get_origin(t) is typing.Literal:
        return "Literal[" + ", ".join(repr(a) for a in typing.get_args(t)) + "]"
    return getattr(t, "__name__", None) or str(t).replace("typing.", "")


def _fields(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if dataclasses.is_dataclass(default) or callable(default):
            default = None
        out[f.name] = {"type": _type_name(f.type), "default": default}
    return out


def schema() -> tuple[str, dict]:
    """(file name, {section: {field: {type, default}}}) of the installed torchtitan."""
    v = version("torchtitan")
    try:
        from torchtitan.config.job_config import JobConfig   # v0.2.x
    except ImportError:
        from torchtitan.trainer import Trainer
        job = Trainer.Config()
        sections = {s: _fields(type(getattr(job, s))) for s in SECTIONS_03}
        return f"torchtitan_{v}_config.json", {"torchtitan": v, "sections": sections}
    sections = {f.name: _fields(f.type if dataclasses.is_dataclass(f.type) else
                                type(f.default_factory()))
                for f in dataclasses.fields(JobConfig)}
    return f"torchtitan_{v}_job_config.json", {"torchtitan": v, "sections": sections}


def main() -> int:
    name, data = schema()
    (DATA / name).write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    print(f"wrote tests/data/{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
