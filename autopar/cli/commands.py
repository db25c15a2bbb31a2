"""Command line: ``autopar plan`` searches a plan, ``autopar estimate`` judges a given one,
``autopar explain`` says why the best plan beats the usual alternatives, ``autopar models`` lists
presets.

    autopar plan --model llama2-70b --cluster 4x8xA100-80GB --global-batch 1024 --seq-len 4096
    autopar estimate --model llama2-70b --cluster 4x8xA100-80GB --global-batch 1024 \\
        --seq-len 4096 --tp 8 --pp 4 --recompute full
    autopar estimate --model llama2-70b --cluster 4x8xA800-80GB+4xroce-200g \\
        --megatron-args "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 ..."
    autopar explain --model llama2-70b --cluster 4x8xA100-80GB --global-batch 1024 --seq-len 4096

Every command takes ``--json`` (machine-readable output on stdout), ``--plot FILE.png`` and
``--tokens N --price-per-gpu-hour P`` (days and cost of the whole run). Errors autopar raises on
purpose are printed as one line (exit code 2, as argparse does for bad flags). Ctrl-C before a
search has started (while torch loads, during graph extraction, during an estimate) ends the
command with one line and exit code 130 (:func:`autopar.cli.main`); once a search runs, the first
Ctrl-C stops it at the best plan found so far, which is printed. The full flag reference is
docs/cli.md.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib.util
import os
import json
import signal
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from ..graph import hf
from ..report import tables
from ..hardware.devices import memory_ambiguity
from ..hardware.spec import parse_spec
from . import measure_cmds
from .inputs import model_arg
from ..config import (FRAMEWORKS, OPTIMIZER_STATE_DTYPES, RECOMPUTE_MODES, SCHEDULES,
                      ParallelConfig, TrainingConfig)
from ..errors import (AutoparError, InvalidClusterSpec, InvalidModelConfig, InvalidTrainingConfig,
                      MissingDependency, output_error)
from ..report.advice import fixes_to_fit, run_cost
from ..report.explain import UNREACHED, Problem, compare, named_alternatives, search_plan
from ..report.summary import plural, reshard_text, trust_lines
from ..io.importers import Imported, from_megatron_args, from_torchtitan_toml
from ..frameworks import edits_text, get_profile, with_edits

_PARALLEL = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "zero": "zero_stage",
             "recompute": "recompute", "sequence_parallel": "sequence_parallel",
             "virtual_stages": "virtual_stages", "micro_batch": "micro_batch_size", "ep": "ep",
             "expert_tp": "expert_tp", "schedule": "schedule"}


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number")
    return v


def _common(p: argparse.ArgumentParser, plot: str) -> None:
    p.add_argument("--model", default=None,
                   help="preset name (see `autopar models`) or a JSON file with a model dict")
    p.add_argument("--cluster", default=None,
                   help="cluster spec NODESxGPUSxGPU[+NICSxLINK] or TOTALxGPU, e.g. 4x8xA100-80GB "
                   "(required, except with estimate --plan)")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per optimizer step (default: ~4M tokens, a multiple of GPUs, "
                        "at most 16M tokens; a note states it)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sequence (default: the model's)")
    p.add_argument("--precision", default=None, choices=["bf16", "fp16", "fp32", "fp8"],
                   help="training precision (default bf16)")
    p.add_argument("--no-flash-attention", action="store_true",
                   help="model attention as the unfused path (stores s x s scores)")
    p.add_argument("--optimizer-offload", action="store_true",
                   help="optimizer states and step on the CPU (ZeRO-Offload): no GPU memory")
    p.add_argument("--optimizer-state-dtype", default=None, choices=list(OPTIMIZER_STATE_DTYPES),
                   help="dtype of Adam's moments (default fp32)")
    p.add_argument("--framework", default=None, choices=list(FRAMEWORKS),
                   help="what will run the plan (default torch: plan.apply; megatron with "
                   "--megatron-args, torchtitan with --torchtitan-toml); the search emits only "
                   "plans it can run, an estimate says when it cannot run the configuration")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help=f"also draw {plot} to a PNG (needs matplotlib)")
    p.add_argument("--tokens", type=_positive_float, default=None,
                   help="tokens of the whole training run, e.g. 2e12: prints days and GPU-hours")
    p.add_argument("--price-per-gpu-hour", type=_positive_float, default=None,
                   help="rental price of one GPU for one hour (with --tokens: cost of the run), "
                        "in --currency")
    p.add_argument("--currency", default="USD",
                   help="ISO 4217 code of --price-per-gpu-hour's currency, stated with the cost "
                        "(default USD; autopar converts nothing)")
    p.add_argument("--calibration", metavar="FILE", default=None,
                   help="calibration file from `autopar calibrate` on the cluster's GPUs: its "
                        "measurements replace the datasheet constants")


def _parallel_flags(p: argparse.ArgumentParser, prefix: str = "", what: str = "") -> None:
    dash = f"--{prefix}" if prefix else "--"
    dest = prefix.replace("-", "_")
    p.add_argument(f"{dash}tp", dest=f"{dest}tp", type=int, default=None,
                   help=f"tensor-parallel degree{what}")
    p.add_argument(f"{dash}pp", dest=f"{dest}pp", type=int, default=None,
                   help=f"pipeline-parallel degree{what}")
    p.add_argument(f"{dash}dp", dest=f"{dest}dp", type=int, default=None,
                   help=f"data-parallel degree{what}")
    p.add_argument(f"{dash}cp", dest=f"{dest}cp", type=int, default=None,
                   help=f"context-parallel degree{what}")
    p.add_argument(f"{dash}zero", dest=f"{dest}zero", type=int, default=None,
                   choices=[0, 1, 2, 3], help=f"ZeRO stage{what}")
    p.add_argument(f"{dash}recompute", dest=f"{dest}recompute", default=None,
                   choices=list(RECOMPUTE_MODES),
                   help=f"activation recomputation of every block{what}")
    p.add_argument(f"{dash}sp", dest=f"{dest}sequence_parallel",
                   action=argparse.BooleanOptionalAction, default=None,
                   help=f"sequence parallelism on (with tp > 1) or off{what}")
    p.add_argument(f"{dash}virtual-stages", dest=f"{dest}virtual_stages", type=int,
                   default=None, help=f"interleaved 1F1B chunks per pipeline rank{what}")
    p.add_argument(f"{dash}micro-batch", dest=f"{dest}micro_batch", type=int, default=None,
                   help=f"sequences per micro-batch{what}")
    p.add_argument(f"{dash}ep", dest=f"{dest}ep", type=int, default=None,
                   help=f"expert-parallel degree of MoE layers{what}")
    p.add_argument(f"{dash}expert-tp", dest=f"{dest}expert_tp", type=int, default=None,
                   help=f"expert-tensor-parallel degree of MoE layers (MoE parallel folding; "
                        f"default: tp){what}")
    p.add_argument(f"{dash}schedule", dest=f"{dest}schedule", default=None,
                   choices=list(SCHEDULES),
                   help=f"pipeline schedule (torch.distributed.pipelining's){what}")


def _int_at_least(low: int):
    """argparse type: an int >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {low}")
        return value
    return parse


_non_negative_int = _int_at_least(0)


class _Parser(argparse.ArgumentParser):
    """argparse with errors in one line: the problem, the closest option for a misspelt one,
    and where the full list is (argparse's default prints the whole usage, ~30 lines for
    ``plan``, before the one line that matters)."""

    def error(self, message):
        hint = ""
        if message.startswith("unrecognized arguments:"):
            known = _option_strings(self)
            close = [m for tok in message.split(":", 1)[1].split() if tok.startswith("-")
                     for m in difflib.get_close_matches(tok.split("=")[0], known, n=1)]
            if close:
                hint = f" Did you mean {', '.join(close)}?"
        self.exit(2, f"{self.prog}: error: {message}.{hint} Fix: see '{self.prog} --help' "
                     "for the options.\n")


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every --option of ``parser`` and its subcommands."""
    out = []
    for action in parser._actions:
        out += [o for o in action.option_strings if o.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _option_strings(sub)
    return sorted(set(out))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``autopar`` command."""
    ap = _Parser(prog="autopar", description="Plan parallel training of "
                 "transformers on GPU clusters.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="search the fastest plan that fits")
    _common(p, "the schedule of one step, memory per stage and the Pareto front")
    _parallel_flags(p, what=" (pinned; the rest is searched)")
    _search_flags(p)
    p.add_argument("--out", default=None, help="write the plan JSON to this file")
    p.add_argument("--export", nargs=2, metavar=("FRAMEWORK", "FILE"), default=None,
                   help=f"also write the plan for a framework ({', '.join(EXPORTERS)}: Megatron-LM"
                   " arguments, torchtitan TOML, DeepSpeed JSON) to FILE and print what that "
                   "file really runs (re-estimated; the nearest runnable plan when it does not "
                   "fit)")
    _parallel_flags(p, "compare-", " of a hand-tuned plan to set against the best")
    e = sub.add_parser("estimate", help="judge one configuration, with an OOM verdict and fixes")
    _common(e, "the schedule of one step and memory per stage")
    _parallel_flags(e, what=" (overrides --megatron-args / --torchtitan-toml)")
    e.add_argument("--placement", default=None, metavar="DIMS",
                   help="rank placement, innermost first, e.g. tp,cp,dp,pp (the default)")
    e.add_argument("--cp-mode", default=None, choices=["ring", "ulysses", "allgather"],
                   help="how context parallelism exchanges K/V (default ring)")
    e.add_argument("--megatron-args", default=None, metavar="ARGS",
                   help="Megatron-LM arguments as one string, e.g. \"--tensor-model-parallel-size 4 "
                   "--pipeline-model-parallel-size 2 --sequence-parallel\"")
    e.add_argument("--torchtitan-toml", default=None, metavar="FILE",
                   help="torchtitan job TOML ([parallelism], [activation_checkpoint], [training])")
    e.add_argument("--plan", default=None, metavar="FILE",
                   help="re-estimate a plan file's configuration (e.g. after editing it); its "
                   "model, cluster and training config are used unless flags are given")
    x = sub.add_parser("explain", help="why the best plan beats the usual alternatives")
    _common(x, "the step time of each compared plan by component")
    _parallel_flags(x, what=" (pinned in the searched best plan)")
    _search_flags(x)
    _parallel_flags(x, "compare-", " of a hand-tuned plan to explain too")
    mo = sub.add_parser("models", help="list model presets with their size and shape")
    mo.add_argument("--json", action="store_true", help="print the presets as JSON on stdout")
    measure_cmds.add_parsers(sub, _positive_float, _int_at_least)
    return ap


def _search_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--time-limit", type=_positive_float, default=None,
                   help="seconds to search before returning the best so far")
    p.add_argument("--top-k", type=_non_negative_int, default=5,
                   help="alternatives to show (default 5)")
    p.add_argument("--memory-margin", type=_margin, default=None, metavar="FRACTION",
                   help="keep this fraction of each GPU's memory free for the memory model's "
                   "error (0 to 0.5; default 0.12, the measured band: peaks were within 11%% of "
                   "their predictions for 68%% of 28 runs): plans use at most 1 - FRACTION of "
                   "it by prediction; 0 plans to the last byte")


def _margin(text: str) -> float:
    from ..search.margin import MAX_MEMORY_MARGIN
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_MEMORY_MARGIN:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a fraction in [0, {MAX_MEMORY_MARGIN}] (e.g. 0.1 keeps 10% free)")
    return value


def _parallel(args, prefix: str = "") -> dict:
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
    return "torch"


def _check_imports(args) -> None:
    """Refuse an empty ``--megatron-args`` or ``--torchtitan-toml``: either was read as absent
    (costed as plain torch, with no note), though the user meant to import something.

    Raises:
        InvalidTrainingConfig: naming the empty flag and the fix.
    """
    for flag, what in (("megatron_args", "Megatron-LM arguments as one string, e.g. "
                                         "\"--tensor-model-parallel-size 4\""),
                       ("torchtitan_toml", "the path of a torchtitan job TOML")):
        value = getattr(args, flag, None)
        if value is not None and not value.strip():
            raise InvalidTrainingConfig(
                f"--{flag.replace('_', '-')} is empty. Fix: give {what}, or drop the flag.")


def _imported(args) -> Imported | None:
    if getattr(args, "megatron_args", None) and getattr(args, "torchtitan_toml", None):
        raise InvalidTrainingConfig("give --megatron-args or --torchtitan-toml, not both. Fix: "
                                    "drop one; they would set the same choices.")
    if getattr(args, "megatron_args", None):
        return from_megatron_args(args.megatron_args)
    if getattr(args, "torchtitan_toml", None):
        return from_torchtitan_toml(args.torchtitan_toml)
    return None


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


def _plan_problem(args) -> tuple[Problem, dict, list[str]]:
    """``estimate --plan FILE``: the plan file's problem and choices, flags overriding them.

    The file is checked as :meth:`autopar.Plan.from_json` checks it (a missing choice is named),
    but its estimate is not read: the configuration is estimated again here.
    """
    from ..io.planfile import check_plan
    from ..plan import read_plan_json
    if args.megatron_args or args.torchtitan_toml:
        raise InvalidTrainingConfig("give --plan or --megatron-args/--torchtitan-toml, not both. "
                                    "Fix: drop one; they would set the same choices.")
    kw = check_plan(read_plan_json(args.plan))
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
             "optimizer_state_dtype": args.optimizer_state_dtype,
             "framework": getattr(args, "framework", None)}
    train = TrainingConfig(**{**kw["train"].__dict__,
                              **{k: v for k, v in given.items() if v is not None}})
    par = dict(kw["config"].__dict__)
    before = dict(par)
    flags = _parallel(args)
    if args.cluster and "dp" not in flags:
        # another cluster: dp is what its GPUs leave over (as with --tp/--pp/--cp edits)
        par["dp"] = None
    for key in flags:
        if flags[key] == before.get(key):
            continue   # the plan's own value: nothing derived from it changes
        for derived in _DERIVED.get(key, ()):
            if derived not in flags:
                par[derived] = None
    par.update(flags)
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
    problem = Problem.build(model, args.cluster or kw["cluster"], train,
                            memory_margin=getattr(args, "memory_margin", None),
                            framework=with_edits(train.framework, edits))
    world = problem.cost_model.cluster.world_size
    return problem, par, [*notes, *_derived_notes(before, par, world, bool(args.cluster))]


def free_fraction(e) -> float:
    """The share of the GPU's memory an estimate leaves free (negative when it does not fit)."""
    return 1.0 - e.memory_per_gpu_bytes / e.memory_limit_bytes


def _plan_command(args, train: TrainingConfig) -> str:
    """The ``autopar plan`` command that searches the problem ``estimate`` was given."""
    words = ["autopar plan", f"--model {args.model}" if args.model else "",
             f"--cluster {args.cluster}" if args.cluster else "",
             f"--global-batch {train.global_batch_size}", f"--seq-len {train.seq_len}",
             f"--precision {train.precision}" if train.precision != "bf16" else "",
             f"--framework {train.framework}" if train.framework != "torch" else "",
             "--no-flash-attention" if not train.flash_attention else "",
             "--optimizer-offload" if train.optimizer_offload else ""]
    return " ".join(w for w in words if w)


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


def _problem(args) -> tuple[Problem, dict, list[str]]:
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
        cfg = api._model_config(model)
        blocks = cfg.num_layers if cfg is not None else 0
        # the flags override the import before Megatron-LM's layer split is applied
        par, tr = imp.complete(cluster.world_size, blocks, overrides=_parallel(args))
        notes = list(imp.notes)
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
    par.update(_parallel(args))
    unit = _batch_unit(args, par, cluster.world_size)
    default = api.default_training(api._model_config(model), cluster,
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
        optimizer_state_dtype=args.optimizer_state_dtype or "fp32")
    if args.global_batch is None and not tr.get("global_batch_size"):
        notes.append(api.default_batch_note(train, cluster.world_size, unit))
    if args.calibration:
        from ..calibrate import calibrated, load_calibration
        cal = calibrated(cluster, None, load_calibration(args.calibration), train.precision)
        cluster, params = cal.cluster, cal.params
        notes += [f"calibration: {n}" for n in cal.notes]
        notes += [f"calibration warning: {w}" for w in cal.warnings]
        notes.append(f"calibrated from {args.calibration}: "
                     + ", ".join(sorted(k for k in cal.fitted if "." in k)))
    return (Problem.build(model, cluster, train, params=params,
                          memory_margin=getattr(args, "memory_margin", None), framework=profile),
            par, notes)


class _Progress:
    """The search's progress callback: stage, share done and the best step time so far
    (printed unless ``quiet``); after a first Ctrl-C it stops the search as soon as a plan
    exists, so the best plan so far is printed (see :class:`_Interrupt`). :meth:`stopped`
    says where a stopped search ended."""

    #: What each stage counts, as the lines name it (``search``: the mesh groups of
    #: :func:`autopar.search.phases.mesh_groups`, counted as ``meshes`` in the plan's summary).
    WHAT = {"search": "meshes", "refine": "refinement of the best candidates"}

    def __init__(self, console: Console, quiet: bool = False, interrupt: "_Interrupt | None" = None):
        self.console, self.last, self.quiet, self.interrupt = console, None, quiet, interrupt
        self.at: tuple[str, int, int] | None = None   # the last (stage, done, total) reported

    def __call__(self, stage, done, total, best):
        self.at = (stage, done, total)
        if self.interrupt is not None and self.interrupt.pressed and best is not None \
                and done < total:
            raise KeyboardInterrupt  # the search catches it and returns the best so far
        if self.quiet:
            return
        pct = 100 * done // max(total, 1)
        key = (stage, pct // 20)
        if key == self.last:
            return
        self.last = key
        msg = f"searching {self.WHAT.get(stage, stage)}: {done}/{total}"
        if best is not None:
            msg += (f", best so far {best.step_time_s:.3f} s/step (tp={best.config.tp} "
                    f"pp={best.config.pp} dp={best.config.dp} cp={best.config.cp})")
        self.console.print(msg, style="dim", highlight=False)

    def cause(self) -> str:
        """What stopped an incomplete search: ``"interrupt"`` (Ctrl-C) or ``"time limit"``."""
        return ("interrupt" if self.interrupt is not None and self.interrupt.pressed
                else "time limit")

    def why(self) -> str:
        """:meth:`cause` for a sentence: ``"the interrupt"`` or ``"the time limit"``."""
        return f"the {self.cause()}"

    def stopped(self, search) -> None:
        """After a search that did not finish (``search``: the plan's
        :class:`~autopar.plan.SearchStats`): the line that says where it stopped and why, e.g.
        ``search stopped by the interrupt at 12/210 meshes (35 configurations estimated)``."""
        if self.quiet or search.complete:
            return
        where = ""
        if self.at is not None:
            stage, done, total = self.at
            where = f" at {done}/{total} {self.WHAT.get(stage, stage)}"
        self.console.print(f"search stopped by {self.why()}{where} "
                           f"({plural(search.evaluated, 'configuration')} estimated): the plan "
                           "is the best found before it, not necessarily the best in the space",
                           style="yellow", highlight=False)


class _Interrupt:
    """SIGINT handling from the start of a search to the end of its output: the first Ctrl-C
    asks the search to stop at its best plan so far (it continues until it has one) and the plan
    is printed, even if the search had just finished; a second one aborts at once. Outside this
    context Python's default handler applies (KeyboardInterrupt, answered by
    :func:`autopar.cli.main`). A no-op outside the main thread."""

    def __init__(self, console: Console):
        self.console, self.pressed, self._old = console, False, None

    def _handler(self, signum, frame):
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True
        self.console.print("interrupt: stopping with the best plan found so far (Ctrl-C again "
                           "to abort)", style="yellow", highlight=False)

    def __enter__(self) -> "_Interrupt":
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _money(args, rows):
    if args.tokens is None:
        if args.price_per_gpu_hour is not None:
            raise InvalidTrainingConfig("--price-per-gpu-hour needs --tokens (the run's length). "
                                        "Fix: add e.g. --tokens 2e12.")
        return None
    currency = _currency(args)
    return [(name, e, run_cost(e, args.tokens, args.price_per_gpu_hour,
                               e.config.tp * e.config.pp * e.config.cp * e.config.dp,
                               currency=currency))
            for name, e in rows]


def _currency(args) -> str:
    """``--currency`` as an upper-case ISO 4217 code.

    Raises:
        InvalidTrainingConfig: not three letters.
    """
    code = str(getattr(args, "currency", None) or "USD")
    if not (len(code) == 3 and code.isascii() and code.isalpha()):
        raise InvalidTrainingConfig(f"--currency {code!r} is not an ISO 4217 currency code. Fix: "
                                    "three letters, e.g. --currency EUR (default USD)")
    return code.upper()


def json_units(currency: str) -> dict:
    """The ``units`` object of the JSON output: the unit of each field whose name carries none
    (top-level names end in ``_s``, ``_bytes``, ``_per_s``), wherever that field appears (a
    plan's estimate and alternatives, explain's best plan and comparisons)."""
    return {"time_breakdown": "s", "memory_breakdown": "bytes",
            "stage_memory_breakdown": "bytes", "mfu": "fraction of peak FLOP/s",
            "hfu": "fraction of peak FLOP/s",
            "error_band": {"half_width": "fraction of step_time_s", "bias": "fraction"},
            "free_memory_fraction": "fraction of memory_limit_bytes",
            "search_memory_margin": "fraction of memory_limit_bytes",
            "run_cost": {"seconds": "s", "days": "days of 86,400 s", "gpu_hours": "GPU-hours",
                         "cost": currency, "price_per_gpu_hour": f"{currency} per GPU-hour"}}


def _compare_estimate(args, problem: Problem):
    par = _parallel(args, "compare_")
    return problem.estimate(ParallelConfig(**par)) if par else None


#: ``--export`` targets: framework -> Plan method.
EXPORTERS = {"megatron": "to_megatron_args", "torchtitan": "to_torchtitan_toml",
             "deepspeed": "to_deepspeed_config"}


def _check_outputs(args) -> None:
    """Fail before any search on what would fail after it: an unknown ``--export`` framework,
    an output path in a folder that does not exist or cannot be written, ``--plot`` without
    matplotlib.

    Raises:
        InvalidTrainingConfig, OutputError, MissingDependency: as :func:`_export`, the plan
            writer and the plot would.
    """
    export = getattr(args, "export", None)
    if export and export[0] not in EXPORTERS:
        raise InvalidTrainingConfig(f"--export {export[0]!r}: autopar exports to "
                                    f"{', '.join(EXPORTERS)}. Fix: e.g. --export megatron args.txt")
    paths = [getattr(args, "out", None), export[1] if export else None,
             getattr(args, "plot", None)]
    for path in filter(None, paths):
        folder = Path(path).resolve().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise output_error(path, OSError(errno.ENOENT if not folder.is_dir() else errno.EACCES,
                                             "no such folder" if not folder.is_dir()
                                             else "folder not writable"))
    if getattr(args, "plot", None) and importlib.util.find_spec("matplotlib") is None:
        raise MissingDependency("--plot needs matplotlib, which is not installed. Fix: pip "
                                "install \"autopar[plot]\" (or pip install matplotlib).")


def _export(args, plan) -> dict | None:
    """Write ``--export FRAMEWORK FILE``; returns what was written and its verdict.

    Raises:
        InvalidTrainingConfig: an unknown framework; OutputError: FILE cannot be written.
    """
    if not args.export:
        return None
    framework, path = args.export
    if framework not in EXPORTERS:
        raise InvalidTrainingConfig(f"--export {framework!r}: autopar exports to "
                                    f"{', '.join(EXPORTERS)}. Fix: e.g. --export megatron args.txt")
    ex = getattr(plan, EXPORTERS[framework])()
    try:
        Path(path).write_text(ex.text())
    except OSError as exc:
        raise output_error(path, exc) from exc
    return {"framework": framework, "file": path, "fits": ex.fits, "warnings": list(ex.warnings)}


def _print_trust(out: Console, e) -> None:
    """The estimate's expected error band and plausibility warnings, under its step time."""
    for label, text in trust_lines(e):
        out.print(f"{label}: {text}", style="yellow" if label == "warning" else None,
                  highlight=False, markup=False)


def _cmd_plan(args, problem, fixed, out, err, interrupt=None) -> dict:
    progress = _Progress(err, args.json, interrupt)
    plan, result = search_plan(problem, fixed, time_limit_s=args.time_limit, top_k=args.top_k,
                               progress=progress)
    progress.stopped(plan.search)
    if args.out:
        plan.to_json(args.out)
    exported = _export(args, plan)
    ref = _compare_estimate(args, problem)
    money = _money(args, [("best", plan.estimate)]
                   + [(f"alternative {i + 1}", a) for i, a in enumerate(plan.alternatives[:3])]
                   + ([("hand-tuned", ref)] if ref is not None else []))
    if args.plot:
        from ..report.plots import plot_overview
        plot_overview(plan.estimate, args.plot, front=result.pareto,
                      alternatives=plan.alternatives, reference=ref)
    data = plan.to_dict()
    if ref is not None:
        data["compare"] = compare(plan.estimate, ref, "hand-tuned").to_dict()
    if money:
        data["run_cost"] = [{"plan": n, **m} for n, _, m in money]
    if exported:
        data["export"] = exported
    if args.json:
        return data
    e = plan.estimate
    tr = problem.train
    out.print(f"[bold]autopar plan[/bold]: {plan.model} on {plan.cluster} "
              f"({plural(plan.world_size, 'GPU')}), "
              f"global batch {tr.global_batch_size} x {tr.seq_len} tokens, {tr.precision}")
    for t in (tables.degrees_table(e), tables.stages_table(e), tables.performance_table(e)):
        out.print(t)
    _print_trust(out, e)
    for t in (tables.memory_table(e), tables.comm_table(e)):
        out.print(t)
    out.print(tables.alternatives_table(e, plan.alternatives))
    if ref is not None:
        out.print(compare(e, ref, "hand-tuned plan").sentence())
    if money:
        out.print(tables.money_table(money, args.tokens))
    s = plan.search
    # gap = (best - bound) / best, so the best plan left unseen is at most best / bound - 1
    # faster (a gap of 1: no bound)
    stopped = "" if s.complete else (
        f" (stopped by {progress.why()}: best so far, at most {s.gap / (1 - s.gap):.1%} slower "
        "than the best in the space)" if s.gap < 1 else f" (stopped by {progress.why()}: best "
        "so far; how far it is from the best in the space is not bounded)")
    margin = (f"; {s.memory_margin:.0%} of each GPU's memory kept free" if s.memory_margin
              else "")
    out.print(f"search: {plural(s.evaluated, 'configuration')}, "
              f"{plural(s.meshes, 'mesh', 'meshes')}, {s.wall_s:.1f} s{stopped}{margin}; MFU "
              f"convention: {e.flops_convention}", style="dim", highlight=False)
    if exported:
        out.print(f"[bold]export[/bold] to {exported['framework']}: wrote {exported['file']}"
                  + ("" if exported["fits"] is not False else
                     " [red](what it runs does not fit: see below)[/red]"))
        for w in exported["warnings"]:
            out.print(f"  - {w}", highlight=False, markup=False)
    return data


def _cmd_estimate(args, problem, par, notes, out) -> dict:
    est = problem.estimate(ParallelConfig(**par))
    if par.get("sequence_parallel") and est.config.tp == 1:
        notes = [*notes, "sequence parallelism shards the ops tensor parallelism replicates, so "
                         "it needs tp > 1: ignored at tp=1"]
    fixes = [] if est.fits else fixes_to_fit(problem, est.config)
    money = _money(args, [("yours" + ("" if est.fits else " (OOM)"), est)]
                   + [(t, e) for t, e in fixes if e.fits][:3])
    if args.plot:
        from ..report.plots import plot_overview
        plot_overview(est, args.plot)
    from ..search.margin import default_margin
    margin = default_margin()
    data = {**est.to_dict(), "notes": notes,
            "verdict": "fits" if est.fits else "out of memory",
            "fixes": [{"change": t, "fits": e.fits, "step_time_s": e.step_time_s, "mfu": e.mfu,
                       "hfu": e.hfu, "memory_per_gpu_bytes": e.memory_per_gpu_bytes,
                       "free_memory_fraction": free_fraction(e),
                       "below_search_margin": e.fits and free_fraction(e) < margin,
                       "config": e.config.to_dict()} for t, e in fixes]}
    if fixes:
        data["search_memory_margin"] = margin
        data["plan_command"] = _plan_command(args, problem.cost_model.train)
    if money:
        data["run_cost"] = [{"plan": n, **m} for n, _, m in money]
    if args.json:
        return data
    cm = problem.cost_model
    out.print(f"[bold]autopar estimate[/bold]: {cm.graph.name} on {cm.cluster.name} "
              f"({plural(cm.cluster.world_size, 'GPU')}), global batch "
              f"{cm.train.global_batch_size} x "
              f"{cm.train.seq_len} tokens, {cm.train.precision}")
    for n in notes:
        out.print(f"note: {n}", style="yellow", highlight=False, markup=False)
    for t in (tables.degrees_table(est), tables.stages_table(est), tables.performance_table(est)):
        out.print(t)
    _print_trust(out, est)
    for t in (tables.memory_table(est), tables.comm_table(est)):
        out.print(t)
    need, have = est.memory_per_gpu_bytes / 1e9, est.memory_limit_bytes / 1e9
    if est.fits:
        out.print(f"[green]Verdict: fits[/green] ({need:.1f} of {have:.1f} GB per GPU); "
                  f"MFU {est.mfu * 100:.1f}%, HFU {est.hfu * 100:.1f}%.")
    else:
        big = sorted(est.memory_breakdown.as_dict().items(), key=lambda kv: -kv[1])[:2]
        out.print(f"[red]Verdict: OUT OF MEMORY[/red]: {need:.1f} GB per GPU on pipeline rank "
                  f"{est.peak_stage}, {need - have:.1f} GB over the {have:.1f} GB GPU (largest: "
                  + ", ".join(f"{k} {v / 1e9:.1f} GB" for k, v in big) + "). Its MFU "
                  f"({est.mfu * 100:.1f}%) cannot be reached as configured.")
        out.print(tables.fixes_table(est, fixes, margin))
        fit = [(t, e) for t, e in fixes if e.fits]
        command = data["plan_command"]
        if fit:
            t, e = fit[0]
            out.print(f"Fastest change that fits: {t}: {e.step_time_s:.3f} s/step, MFU "
                      f"{e.mfu * 100:.1f}% (HFU {e.hfu * 100:.1f}%), "
                      f"{e.memory_per_gpu_bytes / 1e9:.1f} GB per GPU.", highlight=False)
            if free_fraction(e) < margin:
                out.print(f"[yellow]It leaves {free_fraction(e):.1%} of the GPU's memory free, "
                          f"less than the {margin:.0%} the search keeps for the memory model's "
                          "error[/yellow] (--memory-margin): it may not fit on the first try.",
                          highlight=False)
            out.print("These are one or two changes to your configuration; the search weighs "
                      "every mesh, recomputation and schedule and may find a faster plan that "
                      f"fits: {command}", highlight=False, markup=False)
        else:
            out.print("None of these single or paired changes fits; the search weighs every "
                      f"mesh and recomputation: {command}", highlight=False, markup=False)
    if money:
        out.print(tables.money_table(money, args.tokens))
    return data


def _cmd_explain(args, problem, fixed, out, err, interrupt=None) -> dict:
    progress = _Progress(err, args.json, interrupt)
    plan, _ = search_plan(problem, fixed, time_limit_s=args.time_limit, top_k=args.top_k,
                          progress=progress)
    progress.stopped(plan.search)
    best = plan.estimate
    ref = _compare_estimate(args, problem)
    comps, skipped = named_alternatives(problem, plan,
                                        [("hand-tuned plan", ref)] if ref is not None else [])
    money = _money(args, [("best", best)] + [(c.name, c.other) for c in comps])
    if args.plot:
        from ..report.plots import plot_comparison
        plot_comparison([("best", best)] + [(c.name, c.other) for c in comps], args.plot)
    s = plan.search
    data = {"best": best.to_dict(), "comparisons": [c.to_dict() for c in comps],
            "skipped": skipped,
            "search": {"complete": s.complete, "gap": s.gap, "evaluated": s.evaluated,
                       "meshes": s.meshes,
                       "stopped_by": None if s.complete else progress.cause()}}
    if money:
        data["run_cost"] = [{"plan": n, **m} for n, _, m in money]
    if args.json:
        return data
    c = best.config
    band = f" {best.error_band.text()}" if best.error_band else ""
    head = "Best plan" if s.complete else f"Best plan found before {progress.why()}"
    out.print(f"[bold]{head}[/bold]: tp={c.tp} pp={c.pp} dp={c.dp} cp={c.cp} zero="
              f"{c.zero_stage} recompute={c.recompute if isinstance(c.recompute, str) else 'mixed'}"
              f" mbs={c.micro_batch_size} v={c.virtual_stages} schedule={c.schedule}: "
              f"{best.step_time_s:.3f} s/step{band}, MFU {best.mfu * 100:.1f}%, "
              f"{best.memory_per_gpu_bytes / 1e9:.1f} GB per GPU.", highlight=False)
    for label, text in trust_lines(best):
        out.print(f"{label}: {text}", highlight=False, markup=False)
    if not s.complete:
        faster = [cmp.name for cmp in comps if UNREACHED in cmp.note]
        out.print(f"The search was stopped by {progress.why()}: this plan is the best it had "
                  "found, not necessarily the best in the space"
                  + (f"; faster layouts below it the search had not reached: {', '.join(faster)}"
                     if faster else "") + ". Run without the stop for the best plan.",
                  style="yellow", highlight=False, markup=False)
    out.print(tables.comparison_table(comps, s.complete))
    for cmp in comps:
        out.print("- " + cmp.sentence(), highlight=False)
    for s in skipped:
        out.print(f"- skipped {s}", style="dim", highlight=False)
    if money:
        out.print(tables.money_table(money, args.tokens))
    return data


def run(argv=None) -> int:
    """The commands behind :func:`autopar.cli.main`, which imports this module and answers a
    KeyboardInterrupt raised here (Ctrl-C before a search has started) with exit code 130.

    Returns:
        The exit code: 0 ok, 2 bad input.
    """
    args = build_parser().parse_args(argv)
    err = Console(stderr=True, soft_wrap=True)
    out = Console(width=None if sys.stdout.isatty() else 140)
    try:
        if args.command == "models":
            from ..models import PRESETS
            rows = [tables.model_row(name, p.config) for name, p in PRESETS.items()]
            try:
                hf_rows = [hf.describe(name) for name in hf.HF_PRESETS]
            except MissingDependency as exc:  # the built-in presets need no transformers
                hf_rows, hf_note = [], str(exc)
            else:
                hf_note = None
            if args.json:
                print(json.dumps({"models": rows, "hf_models": hf_rows}, indent=2,
                                 sort_keys=True))
            else:
                out.print(tables.models_table(rows))
                if hf_rows:
                    out.print(tables.hf_models_table(hf_rows))
                else:
                    out.print(f"note: {hf_note}", markup=False)
            return 0
        if args.command in ("calibrate", "measure"):
            run = (measure_cmds.cmd_calibrate if args.command == "calibrate"
                   else measure_cmds.cmd_measure)
            data = run(args, out, err)
            if data is not None:
                print(json.dumps(data, indent=2, sort_keys=True, default=str))
            return 0
        _check_outputs(args)
        problem, par, notes = _problem(args)  # graph extraction: Ctrl-C here ends the command
        if args.command == "estimate":
            _finish(args, _cmd_estimate(args, problem, par, notes, out), err)
            return 0
        for n in notes:  # estimate prints its notes with its tables
            err.print(f"note: {n}", style="yellow", highlight=False, markup=False)
        with _Interrupt(err) as interrupt:  # from here the first Ctrl-C keeps the best plan
            cmd = _cmd_plan if args.command == "plan" else _cmd_explain
            _finish(args, cmd(args, problem, par, out, err, interrupt), err)
        return 0
    except AutoparError as exc:
        err.print(f"autopar: {type(exc).__name__}: {exc}", style="red", markup=False,
                  soft_wrap=True, highlight=False)
        return 2


def _finish(args, data: dict, err: Console) -> None:
    """Print ``data`` as JSON with ``--json``; note the plot file otherwise."""
    if args.json:
        data = {**data, "units": json_units(_currency(args))}
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    if args.plot and not args.json:
        err.print(f"wrote {args.plot}", style="dim")
