"""Reading command-line inputs: a model given as a preset name or a JSON file of a model dict,
the parallel choices of the flags, and the problem they describe (a model, cluster and training
configuration, from the flags, an imported Megatron-LM or torchtitan configuration, or a plan
file), with notes on what was imported or derived."""

from __future__ import annotations

import json
from types import SimpleNamespace

from ..config import TrainingConfig
from ..errors import (AutoparError, InvalidClusterSpec, InvalidModelConfig, InvalidPlanFile,
                      InvalidTrainingConfig)
from ..frameworks import edits_text, get_profile, with_edits
from ..graph import hf
from ..hardware.devices import memory_ambiguity
from ..hardware.spec import parse_spec
from ..io.imported import Imported
from ..io.megatron_importer import from_megatron_args
from ..io.torchtitan_importer import from_torchtitan_toml
from ..io.titan_config import from_torchtitan_config
from ..problem import Problem, model_config_of
from ..report.summary import plural, reshard_text
from .batch_notes import batch_divisibility_note, huge_batch_note


def model_arg(text: str | None):
    """A preset name, or the model dict of a JSON file (``*.json``).

    Raises:
        InvalidModelConfig: no model given, or a JSON file that cannot be read.
    """
    if text is None:
        raise InvalidModelConfig("--model is required (a preset name from `autopar models`, or "
                                 "a JSON file with a model dict).")
    if not text.endswith(".json"):
        return text
    try:
        with open(text) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidModelConfig(f"cannot read model file {text}: {exc}. Fix: give a JSON "
                                 "file with a model dict, or a preset name.") from exc


_PARALLEL = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "zero": "zero_stage",
             "recompute": "recompute", "sequence_parallel": "sequence_parallel",
             "virtual_stages": "virtual_stages", "micro_batch": "micro_batch_size", "ep": "ep",
             "expert_tp": "expert_tp", "schedule": "schedule", "dispatcher": "dispatcher"}


def parallel_choices(args, prefix: str = "") -> dict:
    """The ``ParallelConfig`` fields the flags give (``prefix``: ``"compare_"`` for the
    ``--compare-*`` flags), by field name; flags not given are left out."""
    out = {dst: getattr(args, prefix + src) for src, dst in _PARALLEL.items()
           if getattr(args, prefix + src, None) is not None}
    if not prefix and getattr(args, "placement", None):
        out["placement"] = tuple(d.strip() for d in args.placement.split(","))
    if not prefix and getattr(args, "cp_mode", None):
        out["cp_mode"] = args.cp_mode
    return out


def _framework(args) -> str:
    """--framework, else the framework whose arguments were imported (they are its settings:
    an import costed as plain torch read as another plan), else torch."""
    if getattr(args, "framework", None):
        return args.framework
    if getattr(args, "megatron_args", None):
        return "megatron"
    if getattr(args, "torchtitan_toml", None):
        return "torchtitan"
    if getattr(args, "torchtitan_config", None):
        return "torchtitan-0.3"
    return "torch"


def _check_imports(args) -> None:
    """Refuse an empty ``--megatron-args`` or ``--torchtitan-toml``: either was read as absent
    (costed as plain torch, with no note), though the user meant to import something.

    Raises:
        InvalidTrainingConfig: naming the empty flag and the fix.
    """
    for flag, what in (("megatron_args", "Megatron-LM arguments as one string, e.g. "
                                         "\"--tensor-model-parallel-size 4\""),
                       ("torchtitan_toml", "the path of a torchtitan job TOML"),
                       ("torchtitan_config", "the path of a torchtitan >= 0.3 Python config")):
        value = getattr(args, flag, None)
        if value is not None and not value.strip():
            raise InvalidTrainingConfig(
                f"--{flag.replace('_', '-')} is empty. Fix: give {what}, or drop the flag.")


def _imported(args) -> Imported | None:
    given = [f for f in _IMPORT_FLAGS if getattr(args, f, None)]
    if len(given) > 1:
        raise InvalidTrainingConfig(
            f"give one of {', '.join('--' + f.replace('_', '-') for f in given)}, not "
            f"{len(given)}. Fix: drop all but one; they would set the same choices.")
    return _IMPORT_FLAGS[given[0]](getattr(args, given[0])) if given else None


#: The import flags of ``estimate`` and their readers.
_IMPORT_FLAGS = {"megatron_args": from_megatron_args, "torchtitan_toml": from_torchtitan_toml,
                 "torchtitan_config": from_torchtitan_config}


#: Choices a changed degree invalidates in a plan file's config: they are derived again
#: (FSDP's per-block reshard_after_forward exists only under ZeRO-3).
_DERIVED = {"tp": ("dp",), "pp": ("dp", "stage_blocks"), "cp": ("dp",),
            "virtual_stages": ("stage_blocks",), "zero_stage": ("reshard_after_forward",)}


def _derived_notes(before: dict, after: dict, world: int, new_cluster: bool) -> list[str]:
    """What ``estimate --plan`` derives again (``after``'s None where ``before``, the plan
    file's config, had a value), as notes naming the old and new value: dp from the GPUs left
    over by tp x cp x pp on ``world`` GPUs, the stage cuts, FSDP's per-block resharding."""
    notes = []
    if before.get("dp") is not None and after.get("dp") is None:
        tp, cp, pp = (after.get(k) or 1 for k in ("tp", "cp", "pp"))
        dp = world // (tp * cp * pp) if world % (tp * cp * pp) == 0 else None
        if dp is not None and dp != before["dp"]:   # else resolving names the problem
            notes.append(f"dp {before['dp']} -> {dp} for the {plural(world, 'GPU')}"
                         f"{' of the new cluster' if new_cluster else ''} (tp x cp x pp = "
                         f"{tp} x {cp} x {pp})")
    if before.get("stage_blocks") is not None and after.get("stage_blocks") is None:
        notes.append(f"stage cuts {'/'.join(map(str, before['stage_blocks']))} (blocks per "
                     f"pipeline chunk) -> balanced for pp={after.get('pp') or 1}")
    if before.get("reshard_after_forward") is not None and after.get(
            "reshard_after_forward") is None:
        kept = reshard_text(SimpleNamespace(zero_stage=3,
                                            reshard_after_forward=before["reshard_after_forward"]))
        notes.append(f"zero {before.get('zero_stage')} -> {after.get('zero_stage')}: the plan's "
                     f"per-block FSDP resharding ({kept}) is dropped; only ZeRO-3 gathers "
                     "parameters to keep")
    return notes


def _with_flags(config: dict, flags: dict) -> dict:
    """A plan file's ``config`` dict with the flags' ``ParallelConfig`` fields set and the
    fields they derive (:data:`_DERIVED`) cleared unless a flag gives them too."""
    out = dict(config)
    for key, value in flags.items():
        if out.get(key) != value:
            for derived in _DERIVED.get(key, ()):
                if derived not in flags and derived in out:
                    out[derived] = None
        out[key] = value
    return out


def _plan_problem(args) -> tuple[Problem, dict, list[str]]:
    """``estimate --plan FILE``: the plan file's problem and choices, flags overriding them.

    The file is checked as :meth:`autopar.Plan.from_json` checks it (a missing choice is named),
    but its estimate is not read: the configuration is estimated again here.
    """
    from .. import api
    from ..io.planfile import check_plan
    from ..plan import read_plan_json
    if (getattr(args, "megatron_args", None) or getattr(args, "torchtitan_toml", None)
            or getattr(args, "torchtitan_config", None)):
        raise InvalidTrainingConfig("give --plan or --megatron-args/--torchtitan-toml/"
                                    "--torchtitan-config, not both. "
                                    "Fix: drop one; they would set the same choices.")
    raw = read_plan_json(args.plan)
    try:
        kw = check_plan(raw)
    except InvalidPlanFile:
        # a hand edit the flags repair (the docs: flags override the file): check the file
        # with them applied, and their derived fields (dp, cuts) left to derive again
        flags = parallel_choices(args)
        if not flags or not isinstance(raw, dict) or not isinstance(raw.get("config"), dict):
            raise
        kw = check_plan({**raw, "config": _with_flags(raw["config"], flags)})
    if kw["model_config"] is None and args.model is None and kw.get("model") in hf.HF_PRESETS:
        args.model = kw["model"]   # a Hugging Face preset's plan: rebuilt from its name
    if kw["model_config"] is None and args.model is None:
        raise InvalidModelConfig(
            f"the plan {args.plan} is of an nn.Module (its model_config is null); the CLI can "
            "rebuild presets and model dicts only. Fix: pass --model with a preset name (e.g. an "
            "hf-* preset) or a model dict JSON, or from Python autopar.Plan.from_json(path, "
            "model=module).")
    model = model_arg(args.model) if args.model is not None else kw["model_config"]
    given = {"global_batch_size": args.global_batch, "seq_len": args.seq_len,
             "precision": args.precision,
             "flash_attention": False if args.no_flash_attention else None,
             "optimizer_offload": True if args.optimizer_offload else None,
             "param_offload": True if getattr(args, "param_offload", False) else None,
             "activation_offload": True if getattr(args, "activation_offload", False) else None,
             "optimizer_state_dtype": args.optimizer_state_dtype,
             "moe_capacity_factor": getattr(args, "moe_capacity_factor", None),
             "moe_pad_to_capacity": True if getattr(args, "moe_pad_to_capacity", False) else None,
             "moe_expert_load": getattr(args, "moe_expert_load", None),
             "framework": getattr(args, "framework", None)}
    train = TrainingConfig(**{**kw["train"].__dict__,
                              **{k: v for k, v in given.items() if v is not None}})
    par = dict(kw["config"].__dict__)
    before = dict(par)
    flags = parallel_choices(args)
    if args.cluster and "dp" not in flags:
        # another cluster: dp is what its GPUs leave over (as with --tp/--pp/--cp edits)
        par["dp"] = None
    par = _with_flags(par, flags)
    written = kw["estimate"]
    note = (f"re-estimating the configuration of {args.plan}; the file's own estimate "
            f"({written.step_time_s:.3f} s/step, {written.memory_per_gpu_bytes / 1e9:.1f} GB per GPU"
            f"{'' if written.config == kw['config'] else ', of the configuration before an edit'})"
            " is not used")
    notes, edits = [note], kw.get("profile_edits") or {}
    if edits and train.framework != kw["train"].framework:
        notes.append(f"the plan's edits of the {kw['train'].framework} profile "
                     f"({edits_text(edits)}) do not apply to {train.framework}")
        edits = {}
    elif edits:
        notes.append(f"costed with the plan's edited {train.framework} profile fields: "
                     f"{edits_text(edits)}")
    try:
        cluster = api.as_cluster(args.cluster or kw["cluster"])
    except InvalidClusterSpec as exc:
        if args.cluster:
            raise
        raise InvalidPlanFile(f"{args.plan}: its 'cluster' field: {exc}. Or give --cluster SPEC "
                              "to estimate the plan on another cluster") from exc
    profile, option_notes = _stack_options(args, with_edits(train.framework, edits), cluster)
    notes += option_notes
    problem = Problem.build(model, cluster, train,
                            memory_margin=getattr(args, "memory_margin", None),
                            framework=profile)
    world = problem.cost_model.cluster.world_size
    return problem, par, [*notes, *_derived_notes(before, par, world, bool(args.cluster))]


def _batch_unit(args, par: dict, world: int) -> int | None:
    """What a defaulted global batch must be a multiple of: dp x micro-batch when the user fixed
    dp, or, for ``estimate``, when the degrees given leave it (dp = the GPUs over tp x pp x cp);
    None when the search picks dp (:func:`autopar.api.default_global_batch`)."""
    dp = par.get("dp")
    if dp is None and args.command == "estimate":
        rest = par.get("tp", 1) * par.get("pp", 1) * par.get("cp", 1)
        dp = world // rest if rest > 0 and world % rest == 0 else None
    if dp is None:
        return None
    return dp * (par.get("micro_batch_size") or 1)


def _mtp_on_last_stage(par: dict, cfg) -> list[str]:
    """Put the model's multi-token-prediction (MTP) blocks on the last stage of an imported cut
    that lists the decoder layers only (torchtitan's ``module_fqns_per_model_part``: its
    pipelined models build no MTP module, and autopar's torchtitan exports leave it out), so
    the cut covers the model autopar estimates; returns the note saying so (none otherwise)."""
    mtp = getattr(cfg, "mtp_layers", 0) if cfg is not None else 0
    cut = par.get("stage_blocks")
    if not mtp or not cut or sum(cut) != cfg.num_layers:
        return []
    par["stage_blocks"] = (*cut[:-1], cut[-1] + mtp)
    return [f"stage cuts: the file lists the model's {cfg.num_layers} decoder layers only; its "
            f"{mtp} multi-token-prediction block(s) are estimated on the last stage (the file's "
            "framework may train without them, e.g. torchtitan under pipelining: an upper bound "
            "on time and memory)"]


def _overridden(args, imp: Imported, world: int, blocks: int, tr: dict) -> list[str]:
    """Notes for flags whose values differ from the imported configuration's (the flags win;
    said, not silently)."""
    try:
        par0 = imp.complete(world, blocks, overrides={})[0]
    except AutoparError:   # the import alone breaks a rule the flags mend: no value to compare
        par0 = {}
    given = {**{k: (v, k) for k, v in parallel_choices(args).items()},
             "global_batch_size": (args.global_batch, "global batch"),
             "seq_len": (args.seq_len, "sequence length"),
             "precision": (args.precision, "precision")}
    out = []
    for key, (value, name) in given.items():
        was = par0.get(key, tr.get(key))
        if value is not None and was is not None and value != was:
            out.append(f"the flags' {name} {value!r} replaces the imported {was!r}")
    return out


def read_problem(args) -> tuple[Problem, dict, list[str]]:
    """The problem, the parallel choices the user gave, and notes on imported settings."""
    from .. import api
    _check_imports(args)
    if getattr(args, "plan", None):
        return _plan_problem(args)
    if args.cluster is None:
        raise InvalidClusterSpec("--cluster is required (a spec NODESxGPUSxGPU[+NICSxLINK], e.g. "
                                 "4x8xA100-80GB).")
    imp = _imported(args)
    model = model_arg(args.model or (imp.model if imp else None))
    cluster = api.as_cluster(args.cluster)
    par, tr, notes, params, profile = {}, {}, [], None, None
    ambiguous = memory_ambiguity(parse_spec(args.cluster).gpu_name)
    if ambiguous:
        notes.append(ambiguous)
    if imp is not None:
        cfg = model_config_of(model)
        if imp.model_fields and cfg is not None:
            # Megatron-LM's router flags set the model's router (ModelConfig validates them)
            model = {**cfg.to_dict(), **imp.model_fields}
            cfg = model_config_of(model)
        elif imp.model_fields:
            notes.append("ignored for a traced module or Hugging Face preset (no ModelConfig): "
                         + ", ".join(f"{k}={v}" for k, v in imp.model_fields.items()))
        blocks = cfg.num_layers if cfg is not None else 0
        # the flags override the import before Megatron-LM's layer split is applied
        par, tr = imp.complete(cluster.world_size, blocks, overrides=parallel_choices(args))
        notes = list(imp.notes) + _overridden(args, imp, cluster.world_size, blocks, tr)
        notes += _mtp_on_last_stage(par, cfg)
        if not args.framework:
            notes.append(f"costed as {_framework(args)} runs it (the imported arguments' "
                         "framework); --framework changes that")
        if imp.costs and _framework(args) == "megatron":
            profile = get_profile("megatron").with_costs(imp.cost_sources, **imp.costs)
            notes.append("costed with Megatron-LM's overlaps as imported: "
                         + ", ".join(sorted(imp.cost_sources.values())))
        elif imp.costs:
            notes.append(f"ignored for {_framework(args)}: Megatron-LM's "
                         + ", ".join(sorted(imp.cost_sources.values())))
    par.update(parallel_choices(args))
    unit = _batch_unit(args, par, cluster.world_size)
    default = api.default_training(model_config_of(model), cluster,
                                   seq_len=args.seq_len or tr.get("seq_len"), model=model,
                                   unit=unit)
    mbs = par.get("micro_batch_size", tr.get("micro_batch_size"))
    train = TrainingConfig(
        global_batch_size=(args.global_batch if args.global_batch is not None
                           else tr.get("global_batch_size") or default.global_batch_size),
        seq_len=(args.seq_len if args.seq_len is not None
                 else tr.get("seq_len") or default.seq_len),
        micro_batch_size=mbs, precision=args.precision or tr.get("precision", "bf16"),
        flash_attention=not args.no_flash_attention, framework=_framework(args),
        optimizer_offload=args.optimizer_offload,
        param_offload=getattr(args, "param_offload", False),
        activation_offload=getattr(args, "activation_offload", False),
        optimizer_state_dtype=args.optimizer_state_dtype or "fp32",
        # the CLI's flags, else what --megatron-args set (autopar.io.megatron_importer)
        moe_capacity_factor=(getattr(args, "moe_capacity_factor", None)
                             or tr.get("moe_capacity_factor")),
        moe_pad_to_capacity=(getattr(args, "moe_pad_to_capacity", False)
                             or tr.get("moe_pad_to_capacity", False)),
        moe_expert_load=getattr(args, "moe_expert_load", None))
    if args.seq_len is None and not tr.get("seq_len"):
        # a long-context preset would otherwise be planned at its full context unannounced
        notes.append(f"sequence length: {train.seq_len} tokens, the model's context length "
                     "(--seq-len sets it)")
    if args.global_batch is None and not tr.get("global_batch_size"):
        notes.append(api.default_batch_note(train, cluster.world_size, unit))
    elif args.global_batch is not None:
        notes += batch_divisibility_note(args.global_batch, cluster.world_size)
        notes += huge_batch_note(args.global_batch, train.seq_len, cluster.world_size,
                                  default.global_batch_size)
    if args.calibration:
        from ..calibrate import calibrated, load_calibration
        cal = calibrated(cluster, None, load_calibration(args.calibration), train.precision)
        cluster, params = cal.cluster, cal.params
        notes += [f"calibration: {n}" for n in cal.notes]
        notes += [f"calibration warning: {w}" for w in cal.warnings]
        notes.append(f"calibrated from {args.calibration}: "
                     + ", ".join(sorted(k for k in cal.fitted if "." in k)))
    if getattr(args, "stack_option", None):
        profile, option_notes = _stack_options(args, profile or get_profile(train.framework),
                                               cluster)
        notes += option_notes
    return (Problem.build(model, cluster, train, params=params,
                          memory_margin=getattr(args, "memory_margin", None), framework=profile),
            par, notes)


def _stack_options(args, profile, cluster):
    """(``profile`` with ``--stack-option``'s named options, notes naming them); ``profile``
    unchanged without the flag.

    Raises:
        InvalidTrainingConfig: as :func:`autopar.frameworks.options.with_options`.
    """
    names = getattr(args, "stack_option", None) or []
    if not names:
        return profile, []
    from ..frameworks.options import STACK_OPTIONS, with_options
    profile = with_options(profile, names, cluster.gpus_per_node)
    return profile, [f"stack option {n}: {STACK_OPTIONS[n].summary}" for n in names]
