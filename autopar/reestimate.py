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

This module sits below :mod:`autopar.plan` and beside :mod:`autopar.api` (which imports
:mod:`autopar.plan`, so the plan cannot import it): it uses the stages directly.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import nn

from .calibrate import calibrated, load_calibration, measured_cluster
from .config import TrainingConfig
from .cost.model import CostModel
from .cost.params import CostParams
from .errors import AutoparError, InvalidPlanFile
from .frameworks import FrameworkProfile, with_edits
from .graph import extract, hf
from .graph.assemble import meta_copy
from .graph.positions import max_positions, with_position_warning
from .graph.types import ModelGraph
from .hardware import Cluster
from .models import ModelConfig, build

#: torch dtype a training precision computes in (fp8 plans are extracted in bf16: FlopCounterMode
#: and the meta device have no fp8 GEMMs; the cost model applies the fp8 peak).
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                "fp8": torch.bfloat16}

_HOW = "Fix: run `autopar estimate --plan FILE` to see what the cost model says of the plan"


@functools.lru_cache(maxsize=16)
def config_graph(cfg: ModelConfig, seq_len: int, precision: str,
                 flash_attention: bool) -> ModelGraph:
    """The measured graph of the built-in transformer of ``cfg`` at ``seq_len`` tokens, one
    sequence per micro-batch (cached: loading many plans of one model extracts it once; the
    graph is frozen data).

    Raises:
        InvalidModelConfig: ``cfg`` cannot be built.
    """
    built = cfg if cfg.seq_len >= seq_len else ModelConfig.from_dict(
        {**cfg.to_dict(), "seq_len": seq_len})
    dtype = TORCH_DTYPES[precision]
    graph = extract(build(built, dtype=dtype), seq_len, 1, dtype=dtype, name=cfg.name,
                    flash_attention=flash_attention)
    return with_position_warning(graph, cfg.seq_len, cfg.position, grown=True)


def _module_graph(module: nn.Module, train: TrainingConfig, name: str | None = None) -> ModelGraph:
    dtype = TORCH_DTYPES[train.precision]
    if any(t.is_floating_point() and t.dtype != dtype
           for t in [*module.parameters(), *module.buffers()]):
        # a meta copy in the training dtype, as autopar.api does (torch.export asserts dtypes)
        module = meta_copy(module).to(dtype)
    kw = {"name": name} if name else {}
    graph = extract(module, train.seq_len, 1, dtype=dtype, flash_attention=train.flash_attention,
                    **kw)
    return with_position_warning(graph, *max_positions(module))


def cost_model(model_config: dict | None, cluster: str, train: TrainingConfig, *,
               model: nn.Module | None = None, cluster_obj: Cluster | None = None,
               params: CostParams | None = None, name: str | None = None,
               profile: FrameworkProfile | None = None) -> CostModel:
    """The cost model of a plan file's problem.

    Args:
        model_config: the file's ``model_config`` (a model dict), or None for a module's plan.
        cluster: the file's cluster spec string.
        train: the file's training config.
        model: the module a plan without ``model_config`` was made for (ignored when the file
            has a ``model_config``).
        cluster_obj: the cluster, when ``cluster`` is a custom name rather than a spec.
        params: calibration constants (default ``CostParams()``).
        name: the file's ``model``; a Hugging Face preset name (``hf-*``) is rebuilt on meta
            when neither ``model_config`` nor ``model`` is given.
        profile: the framework profile to cost with (the file's ``profile_edits`` applied,
            :func:`autopar.frameworks.with_edits`); None = that of ``train.framework``.

    Raises:
        InvalidPlanFile: the file cannot say which model or cluster (the message says what to
            pass), or the model cannot be extracted.
    """
    try:
        if model_config is not None:
            graph = config_graph(ModelConfig.from_dict(model_config), train.seq_len,
                                 train.precision, train.flash_attention)
        elif model is not None:
            graph = _module_graph(model, train)
        elif name in hf.HF_PRESETS:
            graph = _module_graph(hf.build(name), train, name)
        else:
            raise InvalidPlanFile(
                "the plan is of an nn.Module (its model_config is null), so its estimate cannot "
                "be recomputed from the file, and loading never trusts a written estimate. Fix: "
                "pass the module: Plan.from_json(path, model=module).")
    except InvalidPlanFile:
        raise
    except AutoparError as exc:
        raise InvalidPlanFile(f"invalid plan file: its model cannot be rebuilt to re-estimate "
                              f"the plan: {exc}") from exc
    if cluster_obj is None:
        try:
            cluster_obj = Cluster.from_spec(cluster)
        except AutoparError as exc:
            raise InvalidPlanFile(
                f"the plan's cluster {cluster!r:.80} is a name, not a spec autopar can read, so "
                f"the plan cannot be re-estimated ({exc}). Fix: pass the cluster: "
                "Plan.from_json(path, cluster=autopar.Cluster.custom(...)); for a plan priced "
                "on autopar.calibrate.measured_cluster, pass its calibration: "
                "Plan.from_json(path, calibration=FILE) (`autopar measure --calibration "
                "FILE`).") from exc
    return CostModel(graph, cluster_obj, train, params, framework=profile)


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
        warnings.warn(text, UserWarning, stacklevel=4)
    return c.cluster, c.params


def reestimate(kw: dict, *, model: nn.Module | None = None, cluster: Cluster | None = None,
               params: CostParams | None = None, calibration=None) -> dict:
    """``kw`` (the checked fields of a plan file, :func:`autopar.io.planfile.check_plan`) with
    ``estimate``, ``alternatives`` and ``pareto`` recomputed from their configurations;
    with ``calibration`` (a path, dict or :class:`~autopar.calibrate.Calibration`), on the
    cluster and constants of :func:`plan_calibration`.

    Raises:
        InvalidPlanFile: the problem cannot be rebuilt (see :func:`cost_model`), or the cost model
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
