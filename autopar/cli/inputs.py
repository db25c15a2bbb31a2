"""Reading command-line inputs: a model given as a preset name or a JSON file of a model dict,
the parallel choices of the flags, and the problem they describe (a model, cluster and training
configuration, from the flags, an imported Megatron-LM or torchtitan configuration, or a plan
file), with notes on what was imported or derived."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ..config import TrainingConfig
from ..errors import (AutoparError, InvalidClusterSpec, InvalidModelConfig, InvalidParallelConfig,
                      InvalidTrainingConfig)
from ..frameworks import get_profile
from ..hardware.devices import memory_ambiguity
from ..hardware.spec import parse_spec
from ..io.imported import Imported
from ..io.megatron_importer import from_megatron_args
from ..io.planfile import PLAN_FORMAT
from ..io.torchtitan_importer import from_torchtitan_toml
from ..io.titan_config import from_torchtitan_config
from ..problem import Problem, model_config_of
from .batch_notes import batch_divisibility_note, huge_batch_note


def model_arg(text: str | None):
    """A preset name, or the model dict of a JSON file (``*.json``).

    Raises:
        InvalidModelConfig: no model given, a JSON file that cannot be read, or a plan file
            (``autopar plan --out``'s, which ``--plan`` reads).
    """
    if text is None:
        raise InvalidModelConfig("--model is required (a preset name from `autopar models`, or "
                                 "a JSON file with a model dict).")
    if not text.endswith(".json"):
        return text
    try:
        with open(text) as f:
            model = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidModelConfig(f"cannot read model file {text}: {exc}. Fix: give a JSON "
                                 "file with a model dict, or a preset name.") from exc
    if not isinstance(model, dict):
        raise InvalidModelConfig(f"model file {text} holds a JSON {type(model).__name__}, not a "
                                 "model dict (an object such as {\"name\": ..., \"family\": "
                                 "\"llama\", ...}). Fix: give a JSON file with a model dict, or "
                                 "a preset name.")
    if model.get("format") == PLAN_FORMAT:   # its keys read as a model's were a page of typos
        raise InvalidModelConfig(f"model file {text} is a plan file (`autopar plan --out` wrote "
                                 "it), not a model dict. Fix: this is a plan file; use --plan "
                                 f"{text} (autopar estimate, explain), or give --model a preset "
                                 "name or a JSON file with a model dict.")
    return model


_PARALLEL = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "zero": "zero_stage",
             "recompute": "recompute", "sequence_parallel": "sequence_parallel",
             "virtual_stages": "virtual_stages", "micro_batch": "micro_batch_size", "ep": "ep",
             "expert_tp": "expert_tp", "schedule": "schedule", "dispatcher": "dispatcher",
             "vp_group": "vp_group"}


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


def check_imports(args) -> None:
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
    if not given:
        return None
    value = getattr(args, given[0])
    if given[0] == "megatron_args":
        value = megatron_args_text(value)
    return _IMPORT_FLAGS[given[0]](value)


def megatron_args_text(value: str) -> str | list[str]:
    """The Megatron-LM arguments ``--megatron-args`` gives: the string itself, or, when it is
    one word that is not a flag (a path), the words of that file (what ``--export megatron``
    writes, or a launch script: shell comments and line continuations are read as the shell
    reads them, and its words that are not flags are named as ignored by the importer).

    Raises:
        InvalidTrainingConfig: a path that names no readable text file.
    """
    word = value.strip()
    if word.startswith("-") or len(word.split()) != 1:
        return value
    path = Path(word).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidTrainingConfig(
            f"--megatron-args {word!r}: no such file, and not Megatron-LM flags (they start "
            "with --). Fix: the path of a file of Megatron-LM arguments (as --export megatron "
            "writes), or the flags as one string, e.g. \"--tensor-model-parallel-size 4\".") \
            from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidTrainingConfig(
            f"--megatron-args {word!r}: cannot read it as a text file "
            f"({type(exc).__name__}). Fix: the path of a text file of Megatron-LM arguments, "
            "or the flags as one string.") from None
    try:   # the shell's reading: comments dropped, backslash-newline joins lines
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise InvalidTrainingConfig(
            f"--megatron-args {word!r}: cannot split the file into arguments ({exc}). Fix: "
            "balance its quotes.") from None


#: The import flags of ``estimate`` and their readers.
_IMPORT_FLAGS = {"megatron_args": from_megatron_args, "torchtitan_toml": from_torchtitan_toml,
                 "torchtitan_config": from_torchtitan_config}


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


def _model_of(args, imp: Imported | None):
    """``--model``, else the model the imported file names (torchtitan's model name + flavor).

    Raises:
        InvalidModelConfig: ``--model`` unknown; or, without it, a file's model that is no
            preset (e.g. torchtitan's ``deepseek_v3`` + ``671B``), named as the file's.
    """
    if args.model or imp is None or imp.model is None:
        return model_arg(args.model)
    try:
        model_config_of(imp.model)   # raises for a name that is no preset
        return imp.model
    except InvalidModelConfig as exc:
        raise InvalidModelConfig(
            f"the imported file's model name and flavor give {imp.model!r}, which autopar does "
            f"not know ({str(exc).split(' Valid presets', 1)[0]}). Fix: name the model with "
            "--model (a preset, `autopar models`, or a model dict JSON)") from exc


def read_problem(args) -> tuple[Problem, dict, list[str]]:
    """The problem, the parallel choices the user gave, and notes on imported settings (a
    plan file's: :func:`autopar.cli.plan_input.plan_problem`)."""
    from .. import api
    check_imports(args)
    if args.cluster is None:
        raise InvalidClusterSpec("--cluster is required (a spec NODESxGPUSxGPU[+NICSxLINK], e.g. "
                                 "4x8xA100-80GB).")
    imp = _imported(args)
    model = _model_of(args, imp)
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
        if (mismatch := imp.shape_mismatch(cfg)) is not None:
            raise InvalidModelConfig(mismatch)
        # the flags override the import before Megatron-LM's layer split is applied
        par, tr = imp.complete(cluster.world_size, blocks, overrides=parallel_choices(args))
        moe_pins = ([f"ep={par['ep']}"] if par.get("ep", 1) > 1 else []) + (
            [f"expert_tp={par['expert_tp']}"] if par.get("expert_tp") is not None else [])
        if moe_pins and cfg is not None and not cfg.num_experts:
            # an import for a mixture of experts applied to a dense --model: said as the
            # import's, not as an --ep / --expert-tp the user never typed
            pins = ", ".join(moe_pins)
            raise InvalidParallelConfig(
                f"the imported configuration sets expert parallelism ({pins}) for "
                f"{imp.model or 'a mixture-of-experts model'}, but the model {args.model!r} is "
                f"dense. Fix: --model {imp.model or '<the imported model>'} (the file's), or "
                "import a dense model's configuration.")
        notes = list(imp.notes) + _overridden(args, imp, cluster.world_size, blocks, tr)
        if args.model and imp.model and args.model != imp.model:
            notes.append(f"the flags' model {args.model!r} replaces the imported {imp.model!r} "
                         "(the file's model name and flavor)")
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
        profile, option_notes = stack_options(args, profile or get_profile(train.framework),
                                               cluster)
        notes += option_notes
    return (Problem.build(model, cluster, train, params=params,
                          memory_margin=getattr(args, "memory_margin", None), framework=profile),
            par, notes)


def stack_options(args, profile, cluster):
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
