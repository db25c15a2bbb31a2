"""Re-estimate a loaded plan: a plan file's numbers are recomputed, never trusted as written.

A plan file's ``config`` is the plan; its ``estimate`` (and each estimate of ``alternatives`` and
``pareto``) is what the autopar that wrote the file predicted for it. :meth:`autopar.Plan.from_dict`
checks the file (:mod:`autopar.io.planfile`) and then calls :func:`reestimate`, which rebuilds the
cost model from the file's ``model_config``, ``cluster`` and ``train`` and estimates every
configuration again. So:

- a consistent hand edit of the config (``tp`` 2 -> 4 with ``dp`` halved, another ZeRO stage)
  loads, with the numbers of the edited config;
- an edited number (``estimate.step_time_s`` set to 0.5) is replaced by the cost model's;
- a plan written by an older cost model gets this one's numbers.

A plan of an ``nn.Module`` (a Hugging Face model, say) has no ``model_config``, and a plan of a
``Cluster.custom(..., name=...)`` cluster no readable spec: the file alone cannot rebuild the cost
model, so loading asks for the module (``model=``) or the cluster (``cluster=``), which
:meth:`Plan.from_json` passes here. Calibrated ``CostParams`` are not in the file either: pass
``params=`` to load with them (default: ``CostParams()``), or ``calibration=`` (the file the
plan was priced with): its fits are applied to the plan's cluster as when planning, and a plan
priced on :func:`autopar.calibrate.measured_cluster` (a CPU, an unlisted GPU: its cluster is a
name such as ``1x2xmeasured-cpu``, not a spec) gets that cluster back from the calibration.

This module sits at the api's level (docs/design.md, "Layer order"): the plan is data and never
imports it; ``Plan.from_json`` reaches :func:`reestimate` through :mod:`autopar.hooks`, and the
problem itself is built by the problem layer (:func:`autopar.problem.plan_cost_model`).
"""

from __future__ import annotations

import warnings

from torch import nn

from .calibrate import calibrated, load_calibration, measured_cluster
from .config import TrainingConfig
from .cost.params import CostParams
from .errors import AutoparError, InvalidPlanFile
from .frameworks import with_edits
from .hardware import Cluster
# moved to the problem layer; importable from here as before
from .problem import TORCH_DTYPES, config_graph  # noqa: F401
from .problem import plan_cost_model as cost_model

_HOW = "Fix: run `autopar estimate --plan FILE` to see what the cost model says of the plan"


def plan_calibration(spec: str, train: TrainingConfig, calibration, *,
                     cluster: Cluster | None = None,
                     params: CostParams | None = None) -> tuple[Cluster, CostParams]:
    """The cluster and constants a plan priced with ``calibration`` was priced on: ``cluster``
    (default: the plan's ``spec`` read as a spec, else the calibration's
    :func:`~autopar.calibrate.measured_cluster` when the plan's cluster is its name) with the
    calibration's fits (:func:`~autopar.calibrate.calibrated`; its notes and warnings are
    issued as ``UserWarning``, as when planning).

    Raises:
        InvalidCalibration: an invalid file, or one of another device or precision.
        InvalidPlanFile: the plan's cluster is neither a spec nor the calibration's machine.
    """
    cal = load_calibration(calibration)
    if cluster is None:
        try:
            cluster = Cluster.from_spec(spec)
        except AutoparError:
            measured = measured_cluster(cal) if cal.gemm and cal.memory else None
            if measured is None or measured.name != spec:
                raise InvalidPlanFile(
                    f"the plan's cluster {spec!r:.80} is neither a spec autopar can read nor the "
                    f"machine this calibration measured "
                    f"({measured.name if measured else 'none: it has no GEMM or copy timings'}"
                    "). Fix: pass the calibration the plan was priced with, or the cluster "
                    "(cluster= / --cluster SPEC).") from None
            cluster = measured
    c = calibrated(cluster, params, cal, train.precision)
    for text in (*(f"calibration: {n}" for n in c.notes),
                 *(f"calibration warning: {w}" for w in c.warnings)):
        # frames up: plan_calibration, reestimate, its hook (autopar/__init__.py), hooks.call,
        # Plan.from_dict, then Plan.from_json (or from_dict's caller)
        warnings.warn(text, UserWarning, stacklevel=6)
    return c.cluster, c.params


def reestimate(kw: dict, *, model: nn.Module | None = None, cluster: Cluster | None = None,
               params: CostParams | None = None, calibration=None) -> dict:
    """``kw`` (the checked fields of a plan file, :func:`autopar.io.planfile.check_plan`) with
    ``estimate``, ``alternatives`` and ``pareto`` recomputed from their configurations;
    with ``calibration`` (a path, dict or :class:`~autopar.calibrate.Calibration`), on the
    cluster and constants of :func:`plan_calibration`.

    Raises:
        InvalidPlanFile: the problem cannot be rebuilt (see
            :func:`autopar.problem.plan_cost_model`), or the cost model
            refuses a configuration of the file (the message names it).
        InvalidCalibration: see :func:`plan_calibration`.
    """
    if calibration is not None:
        cluster, params = plan_calibration(kw["cluster"], kw["train"], calibration,
                                           cluster=cluster, params=params)
    cm = cost_model(kw["model_config"], kw["cluster"], kw["train"], model=model,
                    cluster_obj=cluster, params=params, name=kw.get("model"),
                    profile=with_edits(kw["train"].framework, kw.get("profile_edits")))
    c = kw["config"]
    if c.tp * c.pp * c.cp * c.dp != cm.cluster.world_size:
        raise InvalidPlanFile(f"the cluster passed has {cm.cluster.world_size} GPUs; the plan's "
                              f"degrees multiply to {c.tp * c.pp * c.cp * c.dp}. Fix: pass the "
                              "plan's cluster.")

    def again(config, where):
        try:
            return cm.estimate(config)
        except AutoparError as exc:
            raise InvalidPlanFile(f"invalid plan file: {where} cannot be estimated: {exc}. "
                                  f"{_HOW}.") from exc

    best = again(kw["config"], "config")
    # the plan's configuration is the resolved one the estimate is for: a field the file left
    # out (placement, schedule...) takes the value the cost model chose, so plan.config and
    # plan.estimate.config never disagree
    return {**kw, "config": best.config, "estimate": best,
            "alternatives": tuple(again(e.config, f"alternatives[{i}].config")
                                  for i, e in enumerate(kw["alternatives"])),
            "pareto": tuple(again(e.config, f"pareto[{i}].config")
                            for i, e in enumerate(kw["pareto"]))}
