"""The public entry points: ``optimize`` and ``estimate``.

Both accept the model as an ``nn.Module`` (meta device preferred), a preset name
(``autopar.models.list_presets()``), a ``published_plans.json``-style model dict, or a
``ModelConfig``; and the cluster as a :class:`Cluster` or a spec string (``"4x8xA100-80GB"``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any, Callable

from .calibrate.fit import calibrated
from .calibrate.schema import Calibration, load_calibration
from .config import ParallelConfig, TrainingConfig, check_micro_batch, check_sp_request
from .cost.model import CostModel
from .cost.params import CostParams
from .cost.types import Estimate
from .errors import InvalidParallelConfig, InvalidSearchOption, InvalidTrainingConfig
from .frameworks import FrameworkProfile, profile_edits
from .graph import hf
from .hardware import Cluster
from .models import ModelConfig
from .plan import Plan, SearchStats
# as_cluster and model_graph were defined here before the problem layer: importable as before
from .problem import Problem, as_cluster, model_config_of, model_graph  # noqa: F401
from .search.margin import check_margin, search_with_margin
from .search.optimize import SearchResult
from .search.robust import check_objective, robust_result

#: Tokens per step of the default global batch when none is given (about 4M, the order of
#: GPT-3's and Llama 2's batches: Brown et al. 2020 Table 2.1; Touvron et al. 2023).
DEFAULT_TOKENS_PER_STEP = 2 ** 22

#: Most tokens per step of a default global batch: 16M (2**24), the batch Llama 3 405B reached
#: on 16,384 H100 (Dubey et al. 2024, arXiv 2407.21783, section 3.4.1: "we double the batch
#: size again to 16M"). Rounding ~4M tokens up to a multiple of the GPU count gave 100,000 GPUs
#: 819M tokens per step; past this cap the default is a multiple of a divisor of the GPU count
#: (a data-parallel degree the search can pick) of at most 16M tokens.
MAX_DEFAULT_TOKENS_PER_STEP = 2 ** 24


#: Longest default sequence taken from a Hugging Face config: ``max_position_embeddings`` is
#: the context after long-context extension (DeepSeek-V3 163840, Qwen3-Next 262144), while
#: pretraining runs far shorter sequences (DeepSeek-V3 4096, arXiv 2412.19437 section 4.2;
#: Llama 3 8192, arXiv 2407.21783 section 3.4).
MAX_DEFAULT_SEQ_LEN = 8192


def default_training(model_cfg: ModelConfig | None, cluster: Cluster, seq_len: int | None = None,
                     model=None, unit: int | None = None) -> TrainingConfig:
    """The training config used when none is given: ``seq_len`` when given, else the model's
    sequence length (a Hugging Face preset's ``max_position_embeddings`` up to
    :data:`MAX_DEFAULT_SEQ_LEN`; 2048 for a module), and a global batch of about
    :data:`DEFAULT_TOKENS_PER_STEP` tokens at that length, rounded up to a multiple of the GPU
    count, or, where that would exceed :data:`MAX_DEFAULT_TOKENS_PER_STEP` tokens, the largest
    multiple of the largest divisor of the GPU count that stays within it
    (:func:`default_batch_note` says which). ``unit``: as :func:`default_global_batch`."""
    if seq_len is not None:
        seq = seq_len
    elif model_cfg is not None:
        seq = model_cfg.seq_len
    elif isinstance(model, str) and model in hf.HF_PRESETS:
        positions = hf.describe(model).get("positions")
        seq = min(positions, MAX_DEFAULT_SEQ_LEN) if positions else 2048
    else:
        seq = 2048
    return TrainingConfig(global_batch_size=default_global_batch(cluster.world_size, seq, unit),
                          seq_len=seq)


def default_global_batch(world: int, seq_len: int, unit: int | None = None) -> int:
    """Sequences per step when none is given, for ``world`` GPUs and ``seq_len`` tokens per
    sequence (:func:`default_training`): about :data:`DEFAULT_TOKENS_PER_STEP` tokens rounded up
    to a multiple of ``unit`` (default ``world``), at most :data:`MAX_DEFAULT_TOKENS_PER_STEP`
    tokens unless one ``unit`` of sequences is more. ``unit``: the data-parallel degree times
    the micro-batch when the user fixed them (the batch must be a multiple of it); left None,
    past the cap the batch is a multiple of the largest divisor of ``world`` within it, so a
    searched data-parallel degree divides it."""
    base = max(1, DEFAULT_TOKENS_PER_STEP // seq_len)
    cap = max(1, MAX_DEFAULT_TOKENS_PER_STEP // seq_len)
    step = unit or world
    gbs = -(-base // step) * step
    if gbs <= cap:
        return gbs
    if unit is not None:
        return max(unit, cap // unit * unit)
    d = max(k for k in range(1, min(world, cap) + 1) if world % k == 0)
    return cap // d * d


def default_batch_note(train: TrainingConfig, world: int, unit: int | None = None) -> str:
    """A note stating a defaulted global batch (:func:`default_global_batch` of ``world`` GPUs
    and ``unit``), why it has that size, and how to set it."""
    gbs, seq = train.global_batch_size, train.seq_len
    tokens = gbs * seq
    step = unit or world
    of = f"the {world:,} GPUs" if unit is None else f"dp x micro-batch = {unit:,}"
    # every count in millions of tokens as the batch is written (2**24 as "16M" read as exceeded
    # beside a "16.8M tokens per step" batch that met it), the power of two named beside it
    why = (f"{_mtokens(DEFAULT_TOKENS_PER_STEP)} = 2^22 tokens rounded up to a multiple "
           f"of {of}")
    cap = (f"{_mtokens(MAX_DEFAULT_TOKENS_PER_STEP)} = 2^24 tokens, the batch Llama 3 405B "
           f"reached on 16,384 H100 (arXiv 2407.21783, sec. 3.4.1)")
    if tokens > MAX_DEFAULT_TOKENS_PER_STEP:
        why += f"; above the default's cap of {cap}: one sequence per data-parallel replica"
    elif -(-max(1, DEFAULT_TOKENS_PER_STEP // seq) // step) * step != gbs:
        why = (f"capped at {cap}; a multiple of "
               + ("the largest divisor of the " + f"{world:,} GPUs" if unit is None else of)
               + " within it")
    return (f"no global batch given: using {gbs:,} sequences x {seq:,} tokens = "
            f"{_mtokens(tokens)} tokens per step ({why}); set it with --global-batch "
            "(TrainingConfig(global_batch_size=...) in Python)")


def _mtokens(tokens: int) -> str:
    """``tokens`` in millions (10**6), one decimal: 16,777,216 as "16.8M"."""
    return f"{tokens / 1e6:,.1f}M"


def _from_dict(cls, d: dict, err):
    """``cls(**d)`` with unknown keys reported as ``err`` (naming the valid keys)."""
    valid = [f.name for f in fields(cls)]
    unknown = sorted(str(k) for k in d if k not in valid)
    if unknown:
        raise err(f"{cls.__name__} has no field(s) {unknown}. Fix: use only {valid}.")
    missing = [f.name for f in fields(cls) if f.init and _required(f) and f.name not in d]
    if missing:
        raise err(f"{cls.__name__} needs {missing}. Fix: add them, e.g. "
                  "{'global_batch_size': 1024, 'seq_len': 4096}.")
    return cls(**d)


def _required(f) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _train(train, model_cfg, cluster, model=None) -> TrainingConfig:
    if train is None:
        return default_training(model_cfg, cluster, model=model)
    if isinstance(train, dict):
        # a dict may leave out the batch or the length: they take what train=None would
        # (the model's length, about 4M tokens per step), as the CLI's flags do
        if not {"global_batch_size", "seq_len"} <= set(train):
            seq = train.get("seq_len")
            default = default_training(model_cfg, cluster, seq_len=seq if isinstance(seq, int)
                                       and not isinstance(seq, bool) and seq > 0 else None,
                                       model=model)
            train = {"global_batch_size": default.global_batch_size,
                     "seq_len": default.seq_len, **train}
        return _from_dict(TrainingConfig, train, InvalidTrainingConfig)
    if not isinstance(train, TrainingConfig):
        raise InvalidTrainingConfig(
            f"train must be an autopar.TrainingConfig or a dict; got {type(train).__name__}. "
            "Fix: e.g. autopar.TrainingConfig(global_batch_size=1024, seq_len=4096).")
    return train


def _parallel(config) -> ParallelConfig:
    if isinstance(config, dict):
        return _from_dict(ParallelConfig, config, InvalidParallelConfig)
    if not isinstance(config, ParallelConfig):
        raise InvalidParallelConfig(
            f"config must be an autopar.ParallelConfig or a dict; got {type(config).__name__}. "
            "Fix: e.g. autopar.ParallelConfig(tp=8, pp=4).")
    return config


def _search_options(fixed, time_limit_s, top_k, progress) -> None:
    """Check optimize()'s keyword arguments (types and ranges)."""
    if fixed is not None and not isinstance(fixed, dict):
        raise InvalidParallelConfig(
            f"fixed must be a dict of choices to pin or None; got {type(fixed).__name__}. "
            "Fix: e.g. fixed={'tp': 8}.")
    if time_limit_s is not None and (isinstance(time_limit_s, bool)
                                     or not isinstance(time_limit_s, (int, float))
                                     or not 0 < time_limit_s < math.inf):
        raise InvalidSearchOption(
            f"time_limit_s must be a positive finite number of seconds or None; got "
            f"{time_limit_s!r}. Fix: e.g. time_limit_s=60, or None for no limit.")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise InvalidSearchOption(
            f"top_k must be an int >= 0 (runner-up plans to keep); got {top_k!r}. Fix: e.g. "
            "top_k=5.")
    if progress is not None and not callable(progress):
        raise InvalidSearchOption(
            f"progress must be callable as progress(stage, done, total, best) or None; got "
            f"{type(progress).__name__}. Fix: pass a function or None.")


def with_calibration(cluster: Cluster, params: CostParams | None,
                     calibration: Calibration | str | Path | dict | None,
                     precision: str) -> tuple[Cluster, CostParams | None]:
    """``cluster`` and ``params`` with a calibration's measured constants in place of the
    datasheet ones (:func:`autopar.calibrate.calibrated`); unchanged for ``None``. What the
    calibration does not cover, or covers by extrapolation, and each fit that misses its own
    measurements (``Calibrated.warnings``), is issued as a ``UserWarning``.

    Raises:
        InvalidCalibration: an unreadable or invalid file, or one measured on another device
            (a CPU, another GPU) or at another precision than the plan's.
    """
    if calibration is None:
        return cluster, params
    cal = calibrated(cluster, params, load_calibration(calibration), precision)
    for note in cal.notes:
        warnings.warn(f"calibration: {note}", UserWarning, stacklevel=3)
    for warning in cal.warnings:
        warnings.warn(f"calibration warning: {warning}", UserWarning, stacklevel=3)
    return cal.cluster, cal.params


def estimate(model: Any, cluster: Cluster | str, train: TrainingConfig | dict,
             config: ParallelConfig | dict, *, params: CostParams | None = None,
             calibration: Calibration | str | Path | dict | None = None,
             profile: FrameworkProfile | None = None) -> Estimate:
    """Predict one configuration's step time, MFU, memory per GPU and communication.

    Args:
        model: module, preset name, model dict or ModelConfig.
        cluster: :class:`Cluster` or spec string.
        train: :class:`TrainingConfig` (or its fields as a dict; a missing
            ``global_batch_size`` or ``seq_len`` takes :func:`default_training`'s).
        config: :class:`ParallelConfig` (or its fields as a dict); ``None`` fields are filled
            with defaults (dp from the GPU count, micro-batch 1, no interleaving).
        params: cost-model calibration constants.
        calibration: a calibration file (path), its dict or a loaded
            :class:`autopar.calibrate.Calibration` (``autopar calibrate``): its measured
            constants replace the datasheet ones (docs/calibrate.md).
        profile: a copied and edited framework profile to cost with
            (:meth:`autopar.frameworks.FrameworkProfile.with_costs`, or the CLI's
            ``--stack-option`` names through :func:`autopar.frameworks.options.with_options`,
            e.g. ``with_options(get_profile("megatron"), ["cuda-graphs"], 8)``); it names the
            framework (``train.framework`` becomes its name). Default: ``train.framework``'s own.

    Returns:
        :class:`Estimate` (``fits`` tells whether it fits in memory).

    Raises:
        AutoparError subclasses: invalid model, cluster, training or parallel config
            (InvalidParallelConfig for ``sequence_parallel=True`` at tp=1, which the config
            would drop);
            InvalidCalibration for a calibration that is invalid or of other hardware.
    """
    cl = as_cluster(cluster)
    cfg_model = model_config_of(model)
    tr = _with_profile(_train(train, cfg_model, cl, model), profile)
    cl, params = with_calibration(cl, params, calibration, tr.precision)
    config = _parallel(config)
    check_sp_request(config, "config")
    check_micro_batch(tr, config, "the config's")
    return Problem.build(model, cl, tr, params, framework=profile).estimate(config)


def _with_profile(train: TrainingConfig, profile) -> TrainingConfig:
    """``train`` naming ``profile``'s framework (unchanged when ``profile`` is None). A
    ``train`` left at the default framework ("torch") takes the profile's; one naming another
    framework is a conflict.

    Raises:
        InvalidTrainingConfig: ``profile`` is not a FrameworkProfile, names another framework
            than a non-default ``train.framework``, or differs from its stock profile outside
            the cost fields (:func:`autopar.frameworks.profile_edits`).
    """
    if profile is None:
        return train
    if not isinstance(profile, FrameworkProfile):
        raise InvalidTrainingConfig(
            f"profile must be a FrameworkProfile, got {type(profile).__name__}. Fix: e.g. "
            "autopar.frameworks.get_profile('megatron').with_costs({'overlap_tp_comm': 'why'}, "
            "overlap_tp_comm=True), or name a framework in TrainingConfig(framework=...).")
    profile_edits(profile)   # only cost-field edits travel with a plan
    if train.framework == profile.name:
        return train
    if train.framework != "torch":
        raise InvalidTrainingConfig(
            f"TrainingConfig(framework={train.framework!r}) and a {profile.name!r} profile "
            f"disagree on what runs the plan. Fix: framework={profile.name!r}, or a profile "
            f"of {train.framework!r} (get_profile({train.framework!r}).with_costs(...)).")
    return replace(train, framework=profile.name)


def optimize(model: Any, cluster: Cluster | str, train: TrainingConfig | dict | None = None, *,
             fixed: dict | None = None, time_limit_s: float | None = None, top_k: int = 5,
             progress: Callable | None = None, params: CostParams | None = None,
             calibration: Calibration | str | Path | dict | None = None,
             memory_margin: float | None = None,
             profile: FrameworkProfile | None = None, objective: str = "robust") -> Plan:
    """Search the fastest parallel plan that fits in memory, or under the default ``"robust"``
    objective a simpler one the model cannot tell apart from it.

    Args:
        model: module (meta device is fine), preset name, model dict or ModelConfig.
        cluster: :class:`Cluster` or spec string, e.g. ``"4x8xA100-80GB"``.
        train: :class:`TrainingConfig` (or its fields as a dict; one without
            ``global_batch_size`` or ``seq_len`` takes the defaults for them); default: the
            model's sequence length and a ~4M-token global batch (:func:`default_training`).
        fixed: choices to pin, e.g. ``{"tp": 8}``; the rest is searched.
        time_limit_s: return the best plan found within this many seconds (it binds once a
            first plan fits or the most promising mesh has been searched).
        top_k: how many runner-up plans to keep in ``Plan.alternatives`` (plus the best).
        progress: ``progress(stage, done, total, best_estimate_or_None)`` callback.
        params: cost-model calibration constants.
        calibration: a calibration file, dict or :class:`autopar.calibrate.Calibration`
            measured on the cluster's GPUs (``autopar calibrate``), used in place of the
            datasheet constants.
        memory_margin: fraction of each GPU's memory to keep free for the memory model's error
            (0 to 0.5): every plan returned uses at most (1 - memory_margin) of it by
            prediction (:mod:`autopar.search.margin`). Default None: the measured band
            (:func:`autopar.search.margin.default_margin`: room for the growth over
            prediction that 68% of the measured peaks stayed within,
            :data:`autopar.cost.published.MEMORY_BAND`); 0 plans to the last byte.
        profile: a copied and edited framework profile to search and cost with (see
            :func:`estimate`); the plan records its framework's name only.
        objective: ``"robust"`` (default) or ``"fastest"`` (:mod:`autopar.search.robust`).
            A plan is *simpler* when it uses fewer parallel dimensions of degree > 1 (tp, cp,
            pp, dp, ep) and *validated* when its error band is its regime's validated band.
            Under ``"robust"``, when the fastest plan's advantage over a simpler validated plan
            (step time ratio - 1) is inside the fastest plan's band (its validated half-width;
            for an unvalidated regime the corpus-wide half-width, over every development
            run: :func:`autopar.search.robust.stand_in_half_width`), the simpler plan
            is returned (the fewest dimensions, then the fastest) and the fastest is
            ``alternatives[0]``, noted "X% faster by the model, inside its band (± Y%): not
            trusted over a simpler, validated plan". Candidates: the plans the search kept
            (top and Pareto front) and those of one extra search of meshes with fewer
            dimensions (``time_limit_s`` bounds each of the two searches; that search runs
            only when the fastest plan uses two or more dimensions and some regime of its
            framework, precision and GPU is validated). ``"fastest"``: the model's fastest
            plan, as before. Recorded in
            ``plan.search.objective``; the same input gives the same plan under either.

    Returns:
        :class:`Plan` whose ``config`` has every field chosen and whose ``estimate`` fits.

    Raises:
        InfeasibleError: nothing fits (the message says what binds and what to change), or
            ``time_limit_s`` ran out before any plan fitted (the message says how far it got).
        AutoparError subclasses: invalid model, cluster, training config or fixed= choices
            (InvalidParallelConfig for ``sequence_parallel`` pinned on at ``tp`` 1);
            InvalidSearchOption for a bad ``time_limit_s``, ``top_k``, ``progress``,
            ``memory_margin`` or ``objective``;
            InvalidCalibration for a calibration that is invalid or of other hardware.
    """
    _search_options(fixed, time_limit_s, top_k, progress)
    check_sp_request(fixed or {}, "fixed")
    check_objective(objective)
    check_margin(memory_margin)   # None stays None: the model's kind picks the default
    cl = as_cluster(cluster)
    tr = _with_profile(_train(train, model_config_of(model), cl, model), profile)
    check_micro_batch(tr, fixed or {}, "fixed=")
    cl, params = with_calibration(cl, params, calibration, tr.precision)
    problem = Problem.build(model, cl, tr, params, memory_margin=memory_margin,
                            framework=profile)
    return search_plan(problem, fixed, time_limit_s=time_limit_s, top_k=top_k,
                       progress=progress, objective=objective)[0]


def search_plan(problem: Problem, fixed: dict | None = None, *, time_limit_s: float | None = None,
                top_k: int = 5, progress: Callable | None = None,
                objective: str = "robust") -> tuple[Plan, SearchResult]:
    """Search ``problem`` as :func:`optimize` does (``fixed``, ``time_limit_s``, ``top_k``,
    ``progress``, ``objective``: see there; the memory margin is ``problem.memory_margin``),
    and also return the :class:`SearchResult` (its time/memory Pareto front feeds the plots;
    under the robust objective its ``best`` and ``top`` are the plan's and its alternatives).

    Raises:
        InfeasibleError: nothing fits. InvalidParallelConfig: bad ``fixed`` choices.
        InvalidSearchOption: an unknown ``objective``.
    """
    check_objective(objective)
    cm, margin = problem.cost_model, problem.memory_margin
    result = search_with_margin(cm, fixed, memory_margin=margin,
                                time_limit_s=time_limit_s, top_k=top_k + 1, progress=progress)
    if objective == "robust":
        result = robust_result(cm, result, fixed, memory_margin=margin,
                               time_limit_s=time_limit_s, top_k=top_k + 1)
    return build_plan(cm, result, problem.model_config, margin, objective), result


def build_plan(cm: CostModel, result: SearchResult, model_config: dict | None,
               memory_margin: float | None = None, objective: str = "fastest") -> Plan:
    """The :class:`Plan` of a search result: its best estimate, runners-up and Pareto front
    (``memory_margin``: the one the search kept free, and ``objective``: the one that chose
    ``result.best``, both recorded in ``Plan.search``)."""
    best = result.best
    return Plan(
        config=best.config, estimate=best, model=cm.graph.name, cluster=cm.cluster.name,
        train=cm.train, model_config=model_config,
        alternatives=tuple(result.top[1:]), pareto=tuple(result.pareto),
        profile_edits=profile_edits(cm.profile),
        search=SearchStats(evaluated=result.evaluated, meshes=result.meshes,
                           wall_s=round(result.wall_s, 3), complete=result.complete,
                           gap=round(result.gap, 6), memory_margin=memory_margin,
                           objective=objective),
    )
