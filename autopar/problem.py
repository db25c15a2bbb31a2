"""The problem: a model turned into its measured graph and a cost model for one cluster, training
configuration and framework, written once for every caller (the api, a plan file's re-estimate,
an export's verdict, explain, calibration).

    problem = Problem.build("llama2-70b", "4x8xA100-80GB", TrainingConfig(1024, 4096))
    problem.estimate(ParallelConfig(tp=8, pp=4))

A model is an ``nn.Module`` (meta device preferred), a preset name (``autopar.models``), a Hugging
Face preset name (``autopar.graph.hf.HF_PRESETS``, built on meta from its transformers class), a
model dict or a ``ModelConfig``. This layer sits above search and below plan, report, runtime,
calibrate and api (docs/design.md, "Layer order"); applying a calibration is left to the callers
above (:func:`autopar.api.with_calibration`), which pass the calibrated cluster and constants.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from .config import ParallelConfig, TrainingConfig
from .cost.model import CostModel
from .cost.params import CostParams
from .cost.types import Estimate
from .errors import AutoparError, InvalidClusterSpec, InvalidModelConfig, InvalidPlanFile, \
    UntraceableModelError
from .frameworks import FrameworkProfile
from .graph import extract, hf
from .graph.mtp import with_mtp_layers
from .graph.router import with_router_losses
from .graph.assemble import meta_copy
from .graph.needs import LM_FIX, LM_NEEDS
from .graph.positions import max_positions, with_position_warning
from .graph.types import ModelGraph
from .hardware import Cluster
from .models import ModelConfig, build, get_config
from .models.presets import PRESETS
from .models.hf_equivalent import preset_for_config
from .search.margin import check_margin

#: torch dtype a training precision computes in (fp8 plans are extracted in bf16: FlopCounterMode
#: and the meta device have no fp8 GEMMs; the cost model applies the fp8 peak).
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                "fp8": torch.bfloat16}


def as_cluster(cluster: Cluster | str) -> Cluster:
    """A :class:`Cluster` from a cluster or a spec string.

    Raises:
        InvalidClusterSpec: an unreadable spec or another type.
    """
    if isinstance(cluster, Cluster):
        return cluster
    if isinstance(cluster, str):
        return Cluster.from_spec(cluster)
    raise InvalidClusterSpec(
        f"cluster must be an autopar.Cluster or a spec string; got {type(cluster).__name__}. "
        "Fix: e.g. '4x8xA100-80GB' or autopar.Cluster.from_spec('4x8xA100-80GB').")


def model_config_of(model) -> ModelConfig | None:
    """The hyperparameters of ``model`` when it names or holds them (a preset name, a model dict,
    a ``ModelConfig``); None for an ``nn.Module`` or a Hugging Face preset name (its graph is
    traced from the module).

    Raises:
        InvalidModelConfig: an unknown preset name, an invalid dict, or another type.
    """
    if isinstance(model, nn.Module) or (isinstance(model, str) and model in hf.HF_PRESETS):
        return None
    if (isinstance(model, str) and model.strip().lower() not in PRESETS
            and f"hf-{model.strip().lower()}" in hf.HF_PRESETS):
        # the model autopar has only as a Hugging Face preset (gpt-oss, Llama 4): say that
        # name, not the closest built-in one by spelling
        raise InvalidModelConfig(
            f"unknown model preset {model!r}. Did you mean 'hf-{model.strip().lower()}' (the "
            "Hugging Face preset, built from its transformers class; needs transformers)? "
            "`autopar models` lists every preset.")
    if isinstance(model, (str, dict, ModelConfig)):
        return get_config(model)
    if hasattr(model, "to_dict") and hasattr(model, "model_type"):
        # a transformers PretrainedConfig: hyperparameters without a module to trace
        raise InvalidModelConfig(
            f"model is a transformers {type(model).__name__}, not a model: autopar traces the "
            "nn.Module. Fix: build it on the meta device (no memory, no weights): `with "
            "torch.device('meta'): model = transformers.AutoModelForCausalLM.from_config(cfg)`, "
            "then pass model.")
    raise InvalidModelConfig(
        f"model must be an nn.Module, a preset name, a model dict or a ModelConfig; got "
        f"{type(model).__name__}. Fix: e.g. autopar.optimize('llama2-70b', ...).")


@functools.lru_cache(maxsize=16)
def config_graph(cfg: ModelConfig, seq_len: int, precision: str,
                 flash_attention: bool) -> ModelGraph:
    """The measured graph of the built-in transformer of ``cfg`` (or of its transformers
    equivalent, :func:`autopar.models.hf_equivalent.preset_for_config`, for latent attention
    without experts: :attr:`ModelConfig.needs_transformers`) at ``seq_len`` tokens, one
    sequence per micro-batch (cached: planning and loading many plans of one model extract it
    once; the graph is frozen data). A ``cfg`` shorter than ``seq_len`` is built grown to it,
    with the position warning of :func:`autopar.graph.positions.with_position_warning`. A MoE
    router's training-only losses are added as ``cfg`` sets them
    (:func:`autopar.graph.router.with_router_losses`).

    Raises:
        InvalidModelConfig: ``cfg`` cannot be built.
        MissingDependency: ``cfg`` needs transformers, which is not installed.
    """
    built = cfg if cfg.seq_len >= seq_len else ModelConfig.from_dict(
        {**cfg.to_dict(), "seq_len": seq_len})
    dtype = TORCH_DTYPES[precision]
    module = (hf.build_preset(preset_for_config(built), dtype=dtype)
              if built.needs_transformers else build(built, dtype=dtype))
    graph = with_mtp_layers(extract(module, seq_len, 1, dtype=dtype, name=cfg.name,
                                    flash_attention=flash_attention), cfg.mtp_layers)
    graph = with_router_losses(graph, score_function=cfg.router_score_function,
                               aux_loss=cfg.router_aux_loss is not None,
                               z_loss=cfg.router_z_loss_coeff is not None)
    return with_position_warning(graph, cfg.seq_len, cfg.position, grown=True)


def model_graph(model, train: TrainingConfig) -> tuple[ModelGraph, ModelConfig | None]:
    """The measured graph of ``model`` for ``train``'s sequence length and precision, and the
    model's hyperparameters when known (:func:`model_config_of`).

    Raises:
        InvalidModelConfig: a bad preset name or dict.
        MissingDependency: an ``hf-*`` preset without transformers installed.
        UntraceableModelError: a module that is not a decoder language model (no token
            embedding, no repeated blocks; the message says what autopar needs,
            :data:`autopar.graph.needs.LM_NEEDS`, and what to pass instead), or one neither
            torch.fx nor torch.export can capture.
    """
    dtype = TORCH_DTYPES[train.precision]
    if isinstance(model, str) and model in hf.HF_PRESETS:
        # a transformers model class on meta: its own modules are traced, not our builder's
        module = hf.build(model, dtype=dtype)
        graph = extract(module, train.seq_len, 1, dtype=dtype, name=model,
                        flash_attention=train.flash_attention)
        return with_position_warning(graph, *max_positions(module)), None
    cfg = model_config_of(model)
    if cfg is not None:
        return config_graph(cfg, train.seq_len, train.precision, train.flash_attention), cfg
    if not any(isinstance(m, nn.Embedding) for m in model.modules()):
        # no token embedding: not a language model; tracing it would only fail deep in torch
        raise UntraceableModelError(
            f"{type(model).__name__} is not a language model autopar can plan: it has no "
            f"nn.Embedding to take token ids. {LM_NEEDS}. {LM_FIX}.")
    graph = with_position_warning(
        extract(in_dtype(model, dtype), train.seq_len, 1, flash_attention=train.flash_attention),
        *max_positions(model))
    if graph.num_blocks == 0:
        raise UntraceableModelError(
            f"found no repeated decoder blocks in {type(model).__name__}. {LM_NEEDS}. {LM_FIX}; "
            "for your own decoder, keep its blocks in one nn.ModuleList (nn.TransformerEncoder "
            "is not a decoder LM).")
    return graph, None


def in_dtype(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``model`` with floating parameters and buffers in the training dtype: a meta-device copy
    when it is not (the user's module is never changed; torch.export asserts dtypes, so casting
    inside the extractor is not enough for Hugging Face models built in fp32)."""
    tensors = list(model.parameters()) + list(model.buffers())
    if all(t.dtype == dtype for t in tensors if t.is_floating_point()):
        return model
    return meta_copy(model).to(dtype)


@dataclass(frozen=True)
class Problem:
    """One model, cluster, training configuration and framework, with its cost model built once.

    Attributes:
        model: what the user passed (preset name, dict, ModelConfig, module).
        cost_model: the :class:`CostModel`; :attr:`graph`, :attr:`cluster`, :attr:`train`,
            :attr:`params` and :attr:`profile` are its own.
        model_config: the model's hyperparameters when known (dict), else None.
        memory_margin: fraction of each GPU's memory searches keep free
            (:mod:`autopar.search.margin`; :meth:`build`'s None is its default).
    """

    model: object
    cost_model: CostModel
    model_config: dict | None = None
    memory_margin: float = 0.0

    @classmethod
    def build(cls, model, cluster: Cluster | str, train: TrainingConfig,
              params: CostParams | None = None, memory_margin: float | None = None,
              framework: FrameworkProfile | None = None) -> "Problem":
        """Extract the graph (:func:`model_graph`) and build the cost model (``params``: its
        constants, default :class:`CostParams`; ``framework``: a
        :class:`~autopar.frameworks.FrameworkProfile` to cost with, default that of
        ``train.framework``).

        Raises:
            AutoparError subclasses: an invalid model, cluster or training config;
                InvalidSearchOption for a bad ``memory_margin``.
        """
        check_margin(memory_margin)   # a bad value fails before the graph is extracted
        cl = as_cluster(cluster)
        graph, cfg = model_graph(model, train)
        margin = check_margin(memory_margin, moe=graph.num_experts > 0)
        return cls(model, CostModel(graph, cl, train, params, framework=framework),
                   cfg.to_dict() if cfg else None, margin)

    @property
    def graph(self) -> ModelGraph:
        """The model's measured :class:`~autopar.graph.types.ModelGraph`."""
        return self.cost_model.graph

    @property
    def cluster(self) -> Cluster:
        """The :class:`autopar.Cluster`."""
        return self.cost_model.cluster

    @property
    def train(self) -> TrainingConfig:
        """The :class:`TrainingConfig`."""
        return self.cost_model.train

    @property
    def params(self) -> CostParams:
        """The cost model's constants."""
        return self.cost_model.params

    @property
    def profile(self) -> FrameworkProfile:
        """The framework profile the problem is costed with."""
        return self.cost_model.profile

    def estimate(self, config: ParallelConfig | dict) -> Estimate:
        """The cost model's estimate of one configuration.

        Raises:
            InvalidParallelConfig: the configuration breaks a rule of the model or cluster.
        """
        if isinstance(config, dict):
            config = ParallelConfig(**config)
        return self.cost_model.estimate(config)


def plan_cost_model(model_config: dict | None, cluster: str, train: TrainingConfig, *,
                    model: nn.Module | None = None, cluster_obj: Cluster | None = None,
                    params: CostParams | None = None, name: str | None = None,
                    profile: FrameworkProfile | None = None) -> CostModel:
    """The cost model of a plan file's problem (the re-estimate of a loaded plan, an export's
    verdict).

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
            graph, _ = model_graph(ModelConfig.from_dict(model_config), train)
        elif model is not None:
            graph, _ = model_graph(model, train)
        elif name in hf.HF_PRESETS:
            graph, _ = model_graph(name, train)
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
