"""The plan: the chosen ParallelConfig, its Estimate, what it was searched for; versioned JSON.

A plan file is plain JSON (``format: "autopar-plan"``, ``version``); loading it builds dataclasses
from checked values and never executes code. Loading never trusts the file's numbers: the config
is the plan, and every estimate is recomputed from it with the cost model
(:mod:`autopar.reestimate`), so a hand-edited config loads with its own estimate.

A plan is data: this module imports no layer above it (docs/design.md, "Layer order"). Its
conveniences (:meth:`Plan.summary`, :meth:`Plan.apply`, the exporters, the re-estimate of
:meth:`Plan.from_dict`) call the report, the runtime and :mod:`autopar.reestimate` through
:mod:`autopar.hooks`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import hooks
from .config import ParallelConfig, TrainingConfig
from .cost.types import Estimate
from .errors import AutoparError, InvalidCalibration, InvalidPlanFile, output_error
from .io.planfile import PLAN_FORMAT, PLAN_VERSION, check_plan

if TYPE_CHECKING:
    import torch

    from .cost.params import CostParams
    from .hardware.cluster import Cluster


@dataclass(frozen=True)
class SearchStats:
    """How the plan was found.

    Attributes:
        evaluated: configurations the cost model estimated.
        meshes: (tp, cp, pp, dp) meshes considered.
        wall_s: search wall time (seconds).
        complete: False when a time limit or Ctrl-C stopped the search (the plan is the best
            so far).
        gap: relative optimality gap of the plan in the searched space, (best - lower bound) /
            best: no plan in the space is faster than ``step_time_s * (1 - gap)``, i.e. the
            plan is at most ``gap / (1 - gap)`` slower than the best (0 when complete; 1 when
            unbounded).
        memory_margin: fraction of each GPU's memory the search kept free for the memory
            model's error (:mod:`autopar.search.margin`; 0: none).
        objective: what chose the plan among those the search found
            (:mod:`autopar.search.robust`): "robust" (a simpler plan of a validated regime when
            the fastest one's advantage over it is inside the fastest one's error band; that
            faster plan is then ``alternatives[0]``) or "fastest" (the model's fastest plan;
            plan files written before the objective existed load as "fastest").
    """

    evaluated: int = 0
    meshes: int = 0
    wall_s: float = 0.0
    complete: bool = True
    gap: float = 0.0
    memory_margin: float = 0.0
    objective: str = "fastest"


@dataclass(frozen=True)
class Plan:
    """A parallel training plan and its predicted cost.

    Attributes:
        config: the :class:`ParallelConfig` chosen, every field filled (``recompute`` is a mode,
            or a tuple of one mode per decoder block when blocks differ).
        estimate: its :class:`~autopar.cost.types.Estimate` (step time, MFU, memory, comm).
        model: the model's name; ``model_config`` its hyperparameters when known (preset/dict).
        cluster: the cluster's spec string (e.g. ``4x8xA100-SXM4-80GB+8xib-hdr``).
        train: the :class:`TrainingConfig` planned for.
        alternatives: runner-up estimates, fastest first (not including this plan).
        pareto: the searched time/memory Pareto front (fitting estimates no other beats in both
            step time and memory), fastest first.
        search: :class:`SearchStats`.
        profile_edits: the cost fields of the framework profile the plan was costed with that
            differ from the stock one (``{field: {"value", "source"}}``,
            :func:`autopar.frameworks.profile_edits`); {} for the stock profile. They are
            written to JSON, re-applied on loading, and the exporters write those they can.
    """

    config: ParallelConfig
    estimate: Estimate
    model: str
    cluster: str
    train: TrainingConfig
    model_config: dict | None = None
    alternatives: tuple[Estimate, ...] = field(default=())
    pareto: tuple[Estimate, ...] = field(default=())
    search: SearchStats = field(default_factory=SearchStats)
    profile_edits: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        """GPUs the plan uses: tp * pp * cp * dp."""
        c = self.config
        return c.tp * c.pp * c.cp * c.dp

    def summary(self) -> str:
        """A readable table: degrees, stages, recompute, time, MFU, memory, communication
        (:func:`autopar.report.summary.plan_summary`)."""
        return hooks.call("plan_summary", self)

    # -- runtime and exporters (autopar.runtime, which loads torch.distributed on first use) --
    def apply(self, model, *, device_mesh=None, **kwargs):
        """Parallelise ``model`` by this plan inside a process group: see
        :func:`autopar.runtime.apply` (returns a ``ParallelRun`` with ``step(batch, labels)``)."""
        return hooks.call("apply", self, model, device_mesh=device_mesh, **kwargs)

    def to_megatron_args(self):
        """Megatron-LM arguments: :func:`autopar.runtime.to_megatron_args`."""
        return hooks.call("export", "to_megatron_args", self)

    def to_megatron_bridge(self):
        """Megatron-Bridge recipe overrides: :func:`autopar.runtime.to_megatron_bridge`."""
        return hooks.call("export", "to_megatron_bridge", self)

    def to_torchtitan_toml(self):
        """torchtitan v0.2.x job TOML: :func:`autopar.runtime.to_torchtitan_toml`."""
        return hooks.call("export", "to_torchtitan_toml", self)

    def to_torchtitan_config(self):
        """torchtitan >= 0.3 Python config: :func:`autopar.runtime.to_torchtitan_config`."""
        return hooks.call("export", "to_torchtitan_config", self)

    def to_torchtitan(self, series: str | None = None):
        """torchtitan's format for ``series`` ("0.2", "0.3"; None = the installed one, else
        the one the plan was made for):
        :func:`autopar.runtime.to_torchtitan`."""
        return hooks.call("export", "to_torchtitan", self, series)

    def to_deepspeed_config(self):
        """DeepSpeed config: :func:`autopar.runtime.to_deepspeed_config`."""
        return hooks.call("export", "to_deepspeed_config", self)

    def to_accelerate_config(self, plugin: str = "fsdp"):
        """Accelerate launch YAML: :func:`autopar.runtime.to_accelerate_config`."""
        return hooks.call("export", "to_accelerate_config", self, plugin)

    def to_colossalai_plugin(self):
        """Colossal-AI plugin arguments: :func:`autopar.runtime.to_colossalai_plugin`."""
        return hooks.call("export", "to_colossalai_plugin", self)

    def to_torchrun_command(self, script: str = "train.py", **kwargs):
        """torchrun command: :func:`autopar.runtime.to_torchrun_command`."""
        return hooks.call("export", "to_torchrun_command", self, script, **kwargs)

    def to_slurm_script(self, script: str = "train.py", **kwargs):
        """Slurm batch script: :func:`autopar.runtime.to_slurm_script`."""
        return hooks.call("export", "to_slurm_script", self, script, **kwargs)

    # -- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain-JSON form (see :meth:`from_dict`)."""
        return {
            "format": PLAN_FORMAT, "version": PLAN_VERSION,
            "model": self.model, "model_config": self.model_config, "cluster": self.cluster,
            "world_size": self.world_size,
            "train": dict(self.train.__dict__),
            "config": self.config.to_dict(), "estimate": self.estimate.to_dict(),
            "alternatives": [a.to_dict() for a in self.alternatives],
            "pareto": [a.to_dict() for a in self.pareto],
            # wall time is left out: the same input must give the same bytes
            "search": {"evaluated": self.search.evaluated, "meshes": self.search.meshes,
                       "complete": self.search.complete, "gap": self.search.gap,
                       "objective": self.search.objective,
                       # only when set, so plans searched without one keep their bytes
                       **({"memory_margin": self.search.memory_margin}
                          if self.search.memory_margin else {})},
            # only when edited, so plans of stock profiles keep their bytes
            **({"profile_edits": self.profile_edits} if self.profile_edits else {}),
        }

    def to_json(self, path: str | Path | None = None) -> str:
        """The plan as JSON text (sorted keys, so equal plans give equal bytes); also written to
        ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if path is not None:
            try:
                Path(path).write_text(text)
            except OSError as exc:
                raise output_error(path, exc) from exc
        return text

    @classmethod
    def from_dict(cls, d: dict, *, model: torch.nn.Module | None = None,
                  cluster: Cluster | None = None, params: CostParams | None = None,
                  calibration: object = None) -> "Plan":
        """Build a plan from :meth:`to_dict`'s output, checking it strictly and re-estimating it.

        Unknown keys, missing choices, wrong types, degrees whose product is not the GPU count of
        the plan's cluster and stage cuts that do not cover the model's blocks are errors. The
        keys ``compare`` and ``run_cost`` that ``autopar plan --json`` adds are accepted and
        ignored. Older versions are migrated (:data:`MIGRATIONS`) or refused. The estimate,
        alternatives and Pareto front are recomputed from their configurations with the cost
        model (the written numbers are never trusted: :mod:`autopar.reestimate`).

        Args:
            d: the parsed plan file.
            model: the ``nn.Module`` of a plan whose ``model_config`` is null (needed to
                re-estimate it); ignored otherwise.
            cluster: the :class:`~autopar.Cluster` of a plan whose cluster is a custom name.
            params: :class:`~autopar.CostParams` to estimate with (default ``CostParams()``).
            calibration: the calibration the plan was priced with (a file path, its dict or a
                :class:`~autopar.calibrate.Calibration`): re-estimated with its fits, on its
                measured cluster for a plan priced on
                :func:`~autopar.calibrate.measured_cluster` (:mod:`autopar.reestimate`).

        Raises:
            InvalidPlanFile: wrong format or version, or a field that is missing, unknown,
                mistyped or inconsistent (the message names it and says how to fix it); a plan
                that cannot be re-estimated without ``model=`` or ``cluster=`` (the message says
                which).
            InvalidCalibration: ``calibration`` is invalid, or of another device or precision.
        """
        try:
            kw = hooks.call("reestimate", check_plan(d), model=model, cluster=cluster,
                            params=params, calibration=calibration)
            return cls(**{**kw, "search": SearchStats(**kw["search"])})
        except (InvalidPlanFile, InvalidCalibration):
            raise  # a calibration's fault is not the file's
        except AutoparError as exc:
            raise InvalidPlanFile(f"invalid plan file: {exc}") from exc

    @classmethod
    def from_json(cls, source: str | Path, *, model: torch.nn.Module | None = None,
                  cluster: Cluster | None = None, params: CostParams | None = None,
                  calibration: object = None) -> "Plan":
        """Load a plan from a JSON file path or JSON text (only ``json`` parses it: loading
        never executes code), re-estimated with the cost model as :meth:`from_dict` does
        (``model``, ``cluster``, ``params``, ``calibration``: see there).

        Raises:
            InvalidPlanFile: unreadable, not JSON, or not a valid plan.
        """
        return cls.from_dict(read_plan_json(source), model=model, cluster=cluster,
                             params=params, calibration=calibration)


def read_plan_json(source: str | Path) -> object:
    """The parsed JSON of a plan file path or JSON text (only ``json`` parses it: reading never
    executes code); :func:`autopar.io.planfile.check_plan` checks it.

    Raises:
        InvalidPlanFile: unreadable or not JSON.
    """
    if isinstance(source, (bytes, bytearray)):
        try:
            source = bytes(source).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidPlanFile(f"plan bytes are not UTF-8 JSON: {exc}. Fix: pass the "
                                  "file's path or its text.") from exc
    if not isinstance(source, (str, Path)):
        raise InvalidPlanFile(
            f"a plan source must be a path or JSON text; got {type(source).__name__}. Fix: "
            "pass e.g. 'plan.json'.")
    text = str(source)
    if not text.lstrip().startswith("{"):
        # a path is shown whole (a temporary directory alone takes 80 characters); text that
        # is no path is cut
        shown = text if len(text) <= 240 else text[:237] + "..."
        fix = "give the JSON file `autopar plan --out` (or plan.to_json()) wrote"
        try:
            text = Path(source).read_text(encoding="utf-8")   # JSON is UTF-8 (RFC 8259)
        except FileNotFoundError as exc:
            raise InvalidPlanFile(f"no such file: {shown}. Fix: check the path, or {fix}, or "
                                  "its JSON text.") from exc
        except UnicodeDecodeError as exc:   # an image, an archive: bytes, not a plan's text
            raise InvalidPlanFile(f"not a plan file: {shown} is not UTF-8 text. Fix: "
                                  f"{fix}.") from exc
        except (OSError, ValueError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)[:200]
            raise InvalidPlanFile(f"cannot read plan file {shown}: {why}. Fix: {fix}, or its "
                                  "JSON text.") from exc
    if not text.strip():   # a file truncated or created by a failed redirect
        raise InvalidPlanFile("the plan file is empty. Fix: regenerate it with plan.to_json() "
                              "or `autopar plan --out`.")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidPlanFile(
            f"plan file is not valid JSON: {type(exc).__name__}: {str(exc)[:200]}. Fix: "
            "regenerate it with plan.to_json() or `autopar plan --out`.") from exc
    return data

