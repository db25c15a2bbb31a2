"""autopar: find how to train a transformer on a GPU cluster.

>>> import autopar
>>> plan = autopar.optimize("llama2-70b", "4x8xA100-80GB",
...                         autopar.TrainingConfig(global_batch_size=1024, seq_len=4096))
>>> print(plan.summary())

The names below are loaded on first use (PEP 562 ``__getattr__``): ``import autopar`` itself does
not import torch, so the ``autopar`` command can answer a Ctrl-C that arrives while torch loads
with its own one-line message (see :mod:`autopar.cli`) rather than a traceback from inside an
import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from . import hooks as _hooks

__version__ = "0.1.0"

#: Public name -> the module (under autopar) that defines it.
_EXPORTS = {
    "optimize": "api", "estimate": "api", "Plan": "plan", "Estimate": "cost.types",
    "ParallelConfig": "config", "TrainingConfig": "config", "Cluster": "hardware",
    "CostParams": "cost.params",
    **{name: "errors" for name in (
        "AutoparError", "InfeasibleError", "InvalidCalibration", "InvalidClusterSpec", "InvalidModelConfig",
        "InvalidParallelConfig", "InvalidPlanFile", "InvalidSearchOption",
        "InvalidTrainingConfig", "MissingDependency", "OutputError", "UntraceableModelError")},
}
#: Subpackages and modules reachable as attributes (``autopar.models.build``) after
#: ``import autopar``, as they were when this module imported them eagerly.
_SUBMODULES = ("api", "cli", "config", "cost", "errors", "graph", "hardware", "io", "models",
               "plan", "report", "runtime", "search")

__all__ = [
    "optimize", "estimate", "Plan", "Estimate", "ParallelConfig", "TrainingConfig", "Cluster",
    "CostParams", "AutoparError", "InfeasibleError", "InvalidCalibration", "InvalidClusterSpec",
    "InvalidModelConfig",
    "InvalidParallelConfig", "InvalidPlanFile", "InvalidSearchOption", "InvalidTrainingConfig",
    "MissingDependency", "OutputError", "UntraceableModelError",
]


def __getattr__(name: str):
    """Load a public name or submodule on first use (then it is an ordinary attribute)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'autopar' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))


# -- the services lower layers call (autopar.hooks): provided here, at the top of the layer
# order, each importing its layer on first use (so `import autopar` stays free of torch)


def _plan_summary(plan):
    from .report.summary import plan_summary
    return plan_summary(plan)


def _apply(plan, model, **kwargs):
    from .runtime import apply
    return apply(plan, model, **kwargs)


def _export(name: str, plan, *args, **kwargs):
    from . import runtime
    return getattr(runtime, name)(plan, *args, **kwargs)


def _reestimate(kw: dict, **kwargs) -> dict:
    from .reestimate import reestimate
    return reestimate(kw, **kwargs)


def _nearest(cm, framework: str, planned, limits: dict | None = None,
             memory_margin: float | None = None) -> str:
    from .alternatives import nearest
    return nearest(cm, framework, planned, limits, memory_margin)


for _name, _fn in (("plan_summary", _plan_summary), ("apply", _apply), ("export", _export),
                   ("reestimate", _reestimate), ("nearest", _nearest)):
    _hooks.provide(_name, _fn)
del _name, _fn

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ loads these
    from .api import estimate, optimize
    from .config import ParallelConfig, TrainingConfig
    from .cost.params import CostParams
    from .cost.types import Estimate
    from .errors import (AutoparError, InfeasibleError, InvalidClusterSpec, InvalidModelConfig,
                         InvalidParallelConfig, InvalidPlanFile, InvalidSearchOption,
                         InvalidTrainingConfig, MissingDependency, OutputError,
                         UntraceableModelError)
    from .hardware import Cluster
    from .plan import Plan
