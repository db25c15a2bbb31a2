"""The plan file schema: strict checks that turn a parsed JSON object into a :class:`Plan`.

Layout (version 5; :meth:`Plan.to_dict` writes it)::

    {"format": "autopar-plan", "version": 5, "model": str, "model_config": {...} | null,
     "cluster": spec str, "train": {TrainingConfig fields}, "config": {ParallelConfig fields},
     "estimate": {Estimate fields}, "alternatives": [estimate...], "pareto": [estimate...],
     "search": {"evaluated": int, "meshes": int, "complete": bool, "gap": float,
                "objective": "robust" | "fastest"}}

Rules: no unknown keys (``compare``, ``run_cost`` and ``units``, which ``autopar plan --json``
adds, are ignored); every value of the right JSON type; the config states every choice (a missing
``zero_stage`` is an error naming it, not the default: a plan is every choice made); the plan's
degrees multiply to the GPU count of its cluster; the stage cuts give one block count per
pipeline chunk and sum to the model's blocks; the global batch is a multiple of dp x micro-batch.
Fields added after version 1 was first written (placement, cp_mode, ep, per-stage times, the
Pareto front, the gap, the search's ``objective``: "fastest" when missing, the only objective
there was) take their defaults when missing. Version 2 adds the per-block
``config.reshard_after_forward`` (null or one bool per block); a version-1 file is migrated by
setting it to null (every block reshards, as version 1 meant). Version 3 adds
``config.expert_tp`` (null = the MoE layers' expert tensor parallelism equals tp, as version 2
meant; an int = MoE parallel folding); a version-2 file is migrated by setting it to null.
``config.dispatcher`` (the MoE token dispatcher) takes "alltoall" when missing.
Version 4 adds ``config.recompute_modules`` (null = a selective block recomputes the attention
core, as version 3 meant; a list = Megatron-Core's --recompute-modules); a version-3 file is
migrated by setting it to null. Version 5 adds ``config.vp_group`` (null = interleaved 1F1B
groups its micro-batches as the schedule does by default, as version 4 meant; an int =
Megatron-LM's --microbatch-group-size-per-virtual-pipeline-stage); a version-4 file is migrated
by setting it to null. A version this autopar does not know is
refused; an older known one is migrated by :data:`MIGRATIONS`. Nothing here executes code from
the file.

The estimates are checked for form only (keys, types, finite numbers): their values are not
trusted. :meth:`autopar.Plan.from_dict` recomputes every one from its configuration with the cost
model (:mod:`autopar.reestimate`), so a consistently edited config loads with its own numbers
and an edited number is replaced. This module knows the file, not the cost model (it cannot
import :mod:`autopar.plan` or :mod:`autopar.api`: see tests/test_layout.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, fields
from typing import Any, Callable

from ..config import ParallelConfig, TrainingConfig
from ..cost.types import (Estimate, GroupLinks, LinkComm, TimeBreakdown,
                          memory_breakdown_from_dict)
from ..errors import AutoparError, InvalidPlanFile
from ..frameworks import get_profile, rules, with_edits
from ..search.robust import OBJECTIVES

PLAN_FORMAT = "autopar-plan"
#: Version of the plan file layout this autopar writes; older ones it knows are migrated by
#: :data:`MIGRATIONS`.
PLAN_VERSION = 5

#: Top-level keys ``autopar plan --json`` adds to a plan; accepted and ignored when loading.
ANNOTATIONS = ("compare", "run_cost", "units")
def _v1_to_v2(d: dict) -> dict:
    """Version 1 -> 2: per-block FSDP resharding appeared; a version-1 plan reshards every
    block (null)."""
    d = dict(d, version=2)
    if isinstance(d.get("config"), dict):
        d["config"] = dict(d["config"])
        d["config"].setdefault("reshard_after_forward", None)
    return d


def _v2_to_v3(d: dict) -> dict:
    """Version 2 -> 3: MoE parallel folding (``config.expert_tp``) appeared; a version-2 plan's
    expert tensor parallelism is its tp (null)."""
    d = dict(d, version=3)
    if isinstance(d.get("config"), dict):
        d["config"] = dict(d["config"])
        d["config"].setdefault("expert_tp", None)
    return d


def _v3_to_v4(d: dict) -> dict:
    """Version 3 -> 4: Megatron-Core recompute modules (``config.recompute_modules``)
    appeared; a version-3 plan's selective blocks recompute the attention core (null)."""
    d = dict(d, version=4)
    if isinstance(d.get("config"), dict):
        d["config"] = dict(d["config"])
        d["config"].setdefault("recompute_modules", None)
    return d


def _v4_to_v5(d: dict) -> dict:
    """Version 4 -> 5: interleaved 1F1B's micro-batch group (``config.vp_group``) appeared; a
    version-4 plan's is the schedule's own (null)."""
    d = dict(d, version=5)
    if isinstance(d.get("config"), dict):
        d["config"] = dict(d["config"])
        d["config"].setdefault("vp_group", None)
    return d


#: version -> function upgrading a plan dict of that version to the next one.
MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4,
                                                 4: _v4_to_v5}

_FIX = "Fix: regenerate the plan with plan.to_json() or `autopar plan --out plan.json`."
#: An example value per config key, for the message naming a missing one.
_EXAMPLE = {"tp": 8, "pp": 4, "dp": 8, "cp": 1, "zero_stage": 1, "recompute": '"selective"',
            "sequence_parallel": "true", "micro_batch_size": 1, "virtual_stages": 1,
            "schedule": '"1f1b"', "stage_blocks": "[20, 20, 20, 20]"}
_TOP_REQUIRED = ("format", "version", "model", "cluster", "train", "config", "estimate")
_TOP_OPTIONAL = ("model_config", "alternatives", "pareto", "search", "world_size",
                 "profile_edits")
_SEARCH = {"evaluated": int, "meshes": int, "complete": bool, "gap": float, "wall_s": float,
           "memory_margin": float, "objective": str}
#: Estimate scalars that must be finite, non-negative numbers.
_FINITE = ("step_time_s", "mfu", "hfu", "tokens_per_s", "memory_per_gpu_bytes",
           "memory_limit_bytes", "model_flops_per_step")


def _fail(where: str, rule: str) -> InvalidPlanFile:
    rule = rule.rstrip().rstrip(".")
    if "fix:" in rule.lower():  # a nested error already says how to fix it (ModelConfig's
        # "; fix: ..." or "Fix: ..."): one fix, one full stop
        return InvalidPlanFile(f"invalid plan file: {where} {rule}.")
    return InvalidPlanFile(f"invalid plan file: {where} {rule}. {_FIX}")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def _keys(d: Any, where: str, required, optional=(), ignored=()) -> dict:
    if not isinstance(d, dict):
        raise _fail(where, f"must be a JSON object; got {type(d).__name__}")
    unknown = sorted(str(k) for k in d if k not in required and k not in optional
                     and k not in ignored)
    if unknown:
        raise _fail(where, f"has unknown key(s) {unknown} (allowed: "
                           f"{sorted(set(required) | set(optional))})")
    missing = [k for k in required if k not in d]
    if missing:
        raise _fail(where, f"lacks required key(s) {missing}")
    return d


def _dataclass_keys(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
    req = tuple(f.name for f in fields(cls) if f.init and f.default is MISSING
                and f.default_factory is MISSING)
    opt = tuple(f.name for f in fields(cls) if f.init and f.name not in req)
    return req, opt


#: ParallelConfig fields added after plan version 1 was first written: they take their defaults
#: when a file lacks them. Every other field is a choice the plan must state.
_CONFIG_LATER = ("placement", "cp_mode", "ep", "reshard_after_forward", "expert_tp",
                 "dispatcher", "recompute_modules", "vp_group")


def _config(d: Any, where: str) -> ParallelConfig:
    """A resolved ParallelConfig: every degree, micro-batch and stage cut given."""
    req, opt = _dataclass_keys(ParallelConfig)
    choices = req + tuple(k for k in opt if k not in _CONFIG_LATER)
    if isinstance(d, dict):
        missing = [k for k in choices if k not in d]
        if missing:
            raise InvalidPlanFile(
                f"invalid plan file: {where} lacks {missing}: a plan states every choice, and a "
                f"missing one is not taken as its default. Fix: add it (e.g. \"{missing[0]}\": "
                f"{_EXAMPLE.get(missing[0], '...')}), then check the edited plan with `autopar "
                "estimate --plan FILE`; or regenerate the plan with `autopar plan --out plan.json`.")
    d = dict(_keys(d, where, choices, _CONFIG_LATER))
    # placement may be missing (a version-1 file: the default order) but not null: a written
    # plan states its order, and a null read as the default would load another plan than written
    resolved = ("dp", "micro_batch_size", "virtual_stages", "schedule", "stage_blocks")
    for key in resolved + ("placement",):
        if key in d and d[key] is None:
            raise _fail(f"{where}.{key}", "is null; a plan has every choice made")
    for key in ("recompute", "stage_blocks", "placement", "reshard_after_forward",
                "recompute_modules"):
        if isinstance(d.get(key), list):
            d[key] = tuple(d[key])
    try:
        return ParallelConfig(**d)
    except AutoparError as exc:
        raise _fail(where, f"is not a valid ParallelConfig: {exc}") from exc


def _floats(v: Any, where: str, length: int | None = None) -> tuple:
    if not isinstance(v, list) or any(not _number(x) for x in v):
        raise _fail(where, f"must be a list of numbers; got {v!r:.80}")
    if length is not None and len(v) != length:
        raise _fail(where, f"has {len(v)} entries; the plan has {length} pipeline ranks")
    return tuple(v)


def _number_map(v: Any, where: str) -> dict:
    if not isinstance(v, dict) or any(not _number(x) for x in v.values()):
        raise _fail(where, f"must be an object of numbers; got {v!r:.80}")
    return v


#: Keys of a stored estimate (:meth:`Estimate.to_dict`) every version has written; the others
#: (:data:`Estimate.JSON_KEYS` less these) were added later or are recomputed.
_ESTIMATE_REQUIRED = ("config", "step_time_s", "mfu", "hfu", "tokens_per_s",
                      "memory_per_gpu_bytes", "memory_limit_bytes", "fits", "num_micro_batches",
                      "model_flops_per_step", "time_breakdown", "memory_breakdown",
                      "stage_memory_bytes", "stage_time_s", "comm_bytes_by_link",
                      "comm_seconds_by_link")


def _records(d: dict, where: str) -> dict:
    """``d``'s breakdown dicts (checked for form) as the records :class:`Estimate` holds."""
    def read(key, make, value):
        try:
            return make(value)
        except InvalidPlanFile as exc:   # name where in the file
            raise _fail(f"{where}.{key}", re.sub(r"^invalid plan file: \S+ ", "", str(exc))) from exc

    d["time_breakdown"] = read("time_breakdown", TimeBreakdown.from_dict, d["time_breakdown"])
    d["memory_breakdown"] = read("memory_breakdown", memory_breakdown_from_dict,
                                 d["memory_breakdown"])
    d["stage_memory_breakdown"] = tuple(read("stage_memory_breakdown", memory_breakdown_from_dict,
                                             x) for x in d["stage_memory_breakdown"])
    if d.get("group_links") is not None:
        d["group_links"] = read("group_links", GroupLinks.from_dict, d["group_links"])
    nbytes, seconds = d.pop("comm_bytes_by_link"), d.pop("comm_seconds_by_link")
    dims = d.pop("comm_dims_by_link", None)
    d["comm_by_link"] = tuple(
        LinkComm(k, v, seconds.get(k, 0.0), None if dims is None else dims.get(k, ()))
        for k, v in nbytes.items())
    return d


def _estimate(d: Any, where: str, world: int) -> Estimate:
    req = _ESTIMATE_REQUIRED
    opt = tuple(k for k in Estimate.JSON_KEYS if k not in req)
    d = dict(_keys(d, where, req, opt))
    c = d["config"] = _config(d["config"], f"{where}.config")
    _check_world(c, world, f"{where}.config")
    for key in _FINITE:
        if not _number(d[key]) or not 0 <= d[key] < math.inf:
            raise _fail(f"{where}.{key}", f"must be a finite number >= 0; got {d[key]!r:.80}")
    if not isinstance(d["fits"], bool):
        raise _fail(f"{where}.fits", f"must be true or false; got {d['fits']!r:.80}")
    for key in ("num_micro_batches", "peak_stage"):
        if isinstance(d.get(key), bool) or not isinstance(d.get(key, 0), int) or d.get(key, 0) < 0:
            raise _fail(f"{where}.{key}", f"must be an int >= 0; got {d.get(key)!r:.80}")
    for key in ("time_breakdown", "memory_breakdown", "comm_bytes_by_link",
                "comm_seconds_by_link"):
        _number_map(d[key], f"{where}.{key}")
    d["stage_memory_bytes"] = _floats(d["stage_memory_bytes"], f"{where}.stage_memory_bytes",
                                      c.pp)
    for key in ("stage_time_s", "stage_fwd_s", "stage_bwd_s", "stage_wgrad_s"):
        d[key] = _floats(d.get(key, []), f"{where}.{key}", c.pp if d.get(key) else None)
    smb = d.get("stage_memory_breakdown", [])
    if not isinstance(smb, list) or (smb and len(smb) != c.pp):
        raise _fail(f"{where}.stage_memory_breakdown", f"must be a list of {c.pp} objects")
    d["stage_memory_breakdown"] = tuple(_number_map(x, f"{where}.stage_memory_breakdown[]")
                                        for x in smb)
    if d.get("peak_stage", 0) >= c.pp:
        raise _fail(f"{where}.peak_stage", f"= {d['peak_stage']} is not a pipeline rank of pp="
                                           f"{c.pp}")
    links = d.get("group_links")
    if links is not None and (not isinstance(links, dict)
                              or any(not isinstance(x, str) for x in links.values())):
        raise _fail(f"{where}.group_links", f"must be an object of link names; got {links!r:.80}")
    dims = d.get("comm_dims_by_link")
    if dims is not None:
        if not isinstance(dims, dict) or any(
                not isinstance(x, list) or not all(isinstance(y, str) for y in x)
                for x in dims.values()):
            raise _fail(f"{where}.comm_dims_by_link",
                        f"must be an object of lists of dimension names; got {dims!r:.80}")
        d["comm_dims_by_link"] = {k: tuple(v) for k, v in dims.items()}
    if not isinstance(d.get("flops_convention", ""), str):
        raise _fail(f"{where}.flops_convention", "must be a string")
    # derived from the regime, recomputed with the estimate (autopar.reestimate)
    d.pop("error_band", None)
    d.pop("warnings", None)
    return Estimate(**_records(d, where))


def _broken(where: str, v: rules.Violation | None) -> None:
    """Raise a broken layout rule (:mod:`autopar.frameworks.rules`) as a plan-file error: the
    rule's problem and fix, or regenerating the plan."""
    if v is not None:
        exc = _fail(f"{where}:", f"{v.problem}. Fix: {v.fix}, or {_FIX[len('Fix: '):]}")
        exc.rule = v.rule
        raise exc


def _check_world(c: ParallelConfig, world: int, where: str) -> None:
    _broken(where, rules.mesh_size(world, c.tp, c.pp, c.cp, c.dp))
    _broken(where, rules.stage_cuts(c.stage_blocks, c.pp, c.virtual_stages))


def _check_model(c: ParallelConfig, model_config, train: TrainingConfig) -> None:
    """The rules of the cost model's resolve() that the file alone can check (the same
    functions of :mod:`autopar.frameworks.rules`)."""
    blocks = sum(c.stage_blocks)
    if model_config is not None:
        _broken("config", rules.stage_cuts(c.stage_blocks, c.pp, c.virtual_stages,
                                           model_config.num_layers))
        _broken("config", rules.tp_heads(c.tp, model_config.num_heads, model_config.num_kv_heads,
                                           get_profile(train.framework).kv_heads_below_tp))
    if not isinstance(c.recompute, str) and len(c.recompute) != blocks:
        raise _fail("config.recompute", f"has {len(c.recompute)} per-block modes for {blocks} "
                                        "blocks")
    if c.reshard_after_forward is not None and len(c.reshard_after_forward) != blocks:
        raise _fail("config.reshard_after_forward", f"has {len(c.reshard_after_forward)} "
                                                    f"per-block flags for {blocks} blocks")
    _broken("config", rules.batch_split(train.global_batch_size, c.dp, c.micro_batch_size))
    _broken("config", rules.cp_seq(c.cp, train.seq_len))


def _version(d: dict) -> dict:
    if not isinstance(d, dict) or d.get("format") != PLAN_FORMAT:
        got = type(d).__name__ if not isinstance(d, dict) else f"format={d.get('format')!r:.40}"
        raise InvalidPlanFile(
            f"not an autopar plan: expected a JSON object with format={PLAN_FORMAT!r}; got "
            f"{got}. Fix: load a file written by plan.to_json() or `autopar plan --out`.")
    v = d.get("version")
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidPlanFile(f"plan version must be an int; got {v!r:.40}. {_FIX}")
    if v > PLAN_VERSION:
        raise InvalidPlanFile(
            f"plan version {v} was written by a newer autopar; this one reads versions up to "
            f"{PLAN_VERSION}. Fix: upgrade autopar (pip install -U autopar), or regenerate the "
            "plan with this version.")
    while v < PLAN_VERSION:
        if v not in MIGRATIONS:
            raise InvalidPlanFile(
                f"plan version {v} is older than any this autopar can migrate (it reads versions "
                f"{min(MIGRATIONS, default=PLAN_VERSION)} to {PLAN_VERSION}). {_FIX}")
        d = MIGRATIONS[v](d)
        v = d["version"]
    return d


def check_plan(d: Any) -> dict:
    """The keyword arguments of a :class:`~autopar.plan.Plan` from a parsed plan file, after every
    check of the module docstring (``search`` stays a dict of :class:`SearchStats` fields: this
    module knows the file, not the plan class). The estimates are as written, checked for form
    only: :func:`autopar.reestimate.reestimate` recomputes them.

    Raises:
        InvalidPlanFile: naming the field, the rule it breaks, and how to fix it.
    """
    from ..hardware import Cluster
    from ..models import ModelConfig
    d = _keys(_version(d), "the plan", _TOP_REQUIRED, _TOP_OPTIONAL, ANNOTATIONS)
    for key in ("model", "cluster"):
        if not isinstance(d[key], str) or not d[key]:
            raise _fail(key, f"must be a non-empty string; got {d[key]!r:.80}")
    # the GPU count: written by this autopar; else read from the cluster spec (a custom-named
    # cluster, e.g. Cluster.custom(..., name="lab"), needs the written count)
    world = d.get("world_size")
    if world is not None and (not isinstance(world, int) or isinstance(world, bool) or world < 1):
        raise _fail("world_size", f"must be a positive int; got {world!r:.80}")
    try:
        spec_world = Cluster.from_spec(d["cluster"]).world_size
    except AutoparError as exc:
        if world is None:
            raise _fail("cluster", f"{d['cluster']!r:.80} is not a cluster spec autopar can "
                                   f"read and the plan has no world_size, so its GPU count is "
                                   f"unknown ({exc})") from exc
        spec_world = world
    if world is not None and spec_world != world:
        raise _fail("cluster", f"{d['cluster']!r:.80} has {spec_world} GPUs but world_size is "
                               f"{world}; the plan's degrees must multiply to it")
    world = spec_world
    mc = d.get("model_config")
    model_config = None
    if mc is not None:
        try:
            model_config = ModelConfig.from_dict(mc)
        except AutoparError as exc:
            raise _fail("model_config", f"is not a valid model: {exc}") from exc
        if model_config.name != d["model"]:
            # the plan is of model_config; a hand edit of the name alone would be ignored
            raise _fail("model", f"{d['model']!r:.80} but model_config describes "
                                 f"{model_config.name!r:.80}: the plan is of model_config. "
                                 "Fix: edit both, or replan the other model (autopar plan "
                                 "--model ...)")
    req, opt = _dataclass_keys(TrainingConfig)
    try:
        train = TrainingConfig(**_keys(d["train"], "train", req, opt))
    except AutoparError as exc:
        raise _fail("train", f"is not a valid TrainingConfig: {exc}") from exc
    config = _config(d["config"], "config")
    _check_world(config, world, "config")
    _check_model(config, model_config, train)
    # the written estimate is checked for form; Plan.from_dict replaces it by a re-estimate of
    # ``config`` (it may be of the config before a hand edit)
    estimate = _estimate(d["estimate"], "estimate", world)
    blocks = sum(config.stage_blocks)

    def same_model(e: Estimate, where: str) -> Estimate:
        # every estimate is of the plan's model: its cuts cover the same blocks
        if sum(e.config.stage_blocks) != blocks:
            raise _fail(f"{where}.config.stage_blocks", f"{list(e.config.stage_blocks)} cover "
                                                       f"{sum(e.config.stage_blocks)} blocks but "
                                                       f"the plan's cuts cover {blocks}")
        return e

    same_model(estimate, "estimate")
    others = {}
    for key in ("alternatives", "pareto"):
        items = d.get(key, [])
        if not isinstance(items, list):
            raise _fail(key, f"must be a list of estimates; got {type(items).__name__}")
        others[key] = tuple(same_model(_estimate(e, f"{key}[{i}]", world), f"{key}[{i}]")
                            for i, e in enumerate(items))
    s = _keys(d.get("search", {}), "search", (), tuple(_SEARCH))
    if "objective" in s and s["objective"] not in OBJECTIVES:
        raise _fail("search.objective", f"must be one of {list(OBJECTIVES)}; got "
                                        f"{s['objective']!r:.80}")
    for key, kind in _SEARCH.items():
        if kind is str:
            continue
        if key in s and not (isinstance(s[key], bool) if kind is bool else
                             (_number(s[key]) and s[key] >= 0 and (kind is float or (
                                 isinstance(s[key], int) and not isinstance(s[key], bool))))):
            raise _fail(f"search.{key}", f"must be a {'bool' if kind is bool else 'number >= 0'}"
                                         f"{' (int)' if kind is int else ''}; got {s[key]!r:.80}")
    edits = d.get("profile_edits", {})
    try:
        with_edits(train.framework, edits if isinstance(edits, dict) else {"?": edits})
    except AutoparError as exc:
        raise _fail("profile_edits", f"are not edits of the {train.framework!r} profile: "
                                     f"{exc}") from exc
    return dict(config=config, estimate=estimate, model=d["model"], cluster=d["cluster"],
                train=train, model_config=mc, alternatives=others["alternatives"],
                pareto=others["pareto"], search=s, profile_edits=edits)
