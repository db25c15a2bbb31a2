"""Calls from a layer to one above it, without an upward import (dependency inversion).

Two lower layers offer what only a higher one can do:

- a :class:`~autopar.plan.Plan` is plain data below the report, the runtime and the api, yet
  users call ``plan.summary()``, ``plan.apply(model)``, ``plan.to_megatron_args()`` and
  ``Plan.from_json(path)`` (which re-estimates the file: :mod:`autopar.reestimate`);
- an export's verdict (:mod:`autopar.runtime.verdict`) names the nearest plan a framework can
  run, which is a search (:func:`autopar.alternatives.nearest`).

The package's ``__init__``, the top of the layer order and imported before any module of the
package, provides each service by name (:data:`SERVICES`); the lower layer calls it with
:func:`call`. Nothing here imports the rest of autopar (docs/design.md, "Layer order").
"""

from __future__ import annotations

from typing import Callable

#: The services, by name, and what each does; ``autopar/__init__.py`` provides every one.
SERVICES = {
    "plan_summary": "plan -> str: autopar.report.summary.plan_summary",
    "apply": "(plan, model, **kw) -> ParallelRun: autopar.runtime.apply",
    "export": "(name, plan, *args, **kw) -> Export: autopar.runtime's exporter or launcher "
              "`name` (to_megatron_args, to_megatron_bridge, to_torchtitan, to_torchtitan_toml, "
              "to_torchtitan_config, to_deepspeed_config, to_accelerate_config, "
              "to_colossalai_plugin, to_torchrun_command, to_slurm_script)",
    "reestimate": "(plan-file fields, **kw) -> fields: autopar.reestimate.reestimate",
    "nearest": "(cost model, framework, planned estimate, limits=None, memory_margin=None) -> str: "
               "autopar.alternatives.nearest",
}

_provided: dict[str, Callable] = {}


def provide(name: str, fn: Callable) -> None:
    """Make ``fn`` the service ``name`` (a key of :data:`SERVICES`).

    Raises:
        KeyError: an unknown service name (a programming error, not a user's).
    """
    if name not in SERVICES:
        raise KeyError(f"unknown service {name!r}; known: {sorted(SERVICES)}")
    _provided[name] = fn


def provided() -> frozenset[str]:
    """The names of the services provided so far (every key of :data:`SERVICES` once
    ``autopar`` is imported)."""
    return frozenset(_provided)


def call(name: str, *args, **kwargs):
    """Call the service ``name`` with ``args`` and ``kwargs`` and return its result.

    Raises:
        KeyError: ``name`` was never provided (``autopar/__init__.py`` provides every one, and
            Python imports it before any module of the package).
    """
    return _provided[name](*args, **kwargs)
