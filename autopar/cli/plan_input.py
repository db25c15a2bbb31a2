"""``estimate --plan FILE`` / ``explain --plan FILE``: the problem and choices of a plan file,
the flags overriding them (the fields a changed degree derives are derived again, said in
notes), and the error when the plan's mesh does not fill a new ``--cluster``."""

from __future__ import annotations

import re
from types import SimpleNamespace

from ..config import TrainingConfig
from ..errors import (AutoparError, InvalidClusterSpec, InvalidModelConfig, InvalidPlanFile,
                      InvalidTrainingConfig)
from ..frameworks import edits_text, with_edits
from ..graph import hf
from ..problem import Problem
from ..report.summary import plural, reshard_text
from .inputs import check_imports, model_arg, parallel_choices, stack_options


#: Choices a changed degree invalidates in a plan file's config: they are derived again
#: (FSDP's per-block reshard_after_forward exists only under ZeRO-3).
_DERIVED = {"tp": ("dp",), "pp": ("dp", "stage_blocks"), "cp": ("dp",),
            "virtual_stages": ("stage_blocks", "vp_group"),
            "zero_stage": ("reshard_after_forward",)}


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


def plan_problem(args) -> tuple[Problem, dict, list[str]]:
    """``estimate --plan FILE``: the plan file's problem and choices, flags overriding them.

    The file is checked as :meth:`autopar.Plan.from_json` checks it (a missing choice is named),
    but its estimate is not read: the configuration is estimated again here.
    """
    from .. import api
    from ..io.planfile import check_plan
    from ..plan import read_plan_json
    check_imports(args)
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
    profile, option_notes = stack_options(args, with_edits(train.framework, edits), cluster)
    notes += option_notes
    problem = Problem.build(model, cluster, train,
                            memory_margin=getattr(args, "memory_margin", None),
                            framework=profile)
    world = problem.cost_model.cluster.world_size
    fitted = (_fit_blocks(par, flags, problem.graph.num_blocks, args.model)
              if args.model is not None else [])
    derived = [n for n in _derived_notes(before, par, world, bool(args.cluster))
               if not (n.startswith("stage cuts") and fitted and fitted[0].startswith("stage"))]
    # what moved_plan_error needs when this plan does not resolve on the new cluster
    args.plan_mesh = {"config": before, "cluster": kw["cluster"], "model": kw["model"]}
    return problem, par, [*notes, *fitted, *derived]


def _fit_blocks(par: dict, flags: dict, blocks: int, model: str) -> list[str]:
    """``estimate --plan FILE --model M``: the plan's per-block choices (stage cuts, recompute
    and FSDP resharding per block) made for another block count than ``M``'s ``blocks`` are
    derived again in ``par`` (in place), unless a flag gives them: balanced cuts, the mode most
    of the plan's blocks take, every block resharded. They failed with "recompute has 80
    entries but the model has 32 blocks", which named no flag the user had given.

    Returns:
        a note per choice derived again, with its old and new value.
    """
    notes = []
    cuts = par.get("stage_blocks")
    if cuts is not None and sum(cuts) != blocks and "stage_blocks" not in flags:
        par["stage_blocks"] = None
        notes.append(f"stage cuts {'/'.join(map(str, cuts))} (the plan's {sum(cuts)} blocks) -> "
                     f"balanced over the {blocks} blocks of {model}")
    modes = par.get("recompute")
    if not isinstance(modes, str) and len(modes) != blocks and "recompute" not in flags:
        # the mode most of the plan's blocks take (the first of a tie, in block order)
        most = max(dict.fromkeys(modes), key=list(modes).count)
        par["recompute"] = most
        notes.append(f"recompute per block (the plan's {len(modes)} blocks) -> {most!r} on all "
                     f"{blocks} blocks of {model}, the mode most of the plan's blocks take "
                     "(--recompute sets another)")
    reshard = par.get("reshard_after_forward")
    if reshard is not None and len(reshard) != blocks and "reshard_after_forward" not in flags:
        par["reshard_after_forward"] = None
        notes.append(f"FSDP's per-block resharding (the plan's {len(reshard)} blocks) -> every "
                     f"block of {model} resharded after forward")
    return notes


def moved_plan_error(args, problem: Problem, par: dict, exc: AutoparError) -> AutoparError:
    """``exc`` (raised resolving or estimating ``par``, the choices of ``estimate --plan FILE``)
    said in the plan's terms when ``--cluster`` gave a cluster the plan's mesh does not fill
    (tp x pp x cp x dp of the file differs from its GPUs): dp was derived again for it, which the
    user never set, so the message names the plan's mesh, the derived dp, and fixes that work
    (re-plan with ``autopar plan``, the plan's own cluster, or degrees that fill the new one).
    ``exc`` itself otherwise. The result is of ``exc``'s type."""
    mesh = getattr(args, "plan_mesh", None)
    if not args.cluster or mesh is None:
        return exc
    c = mesh["config"]
    tp, pp, cp, dp = (c.get(k) or 1 for k in ("tp", "pp", "cp", "dp"))
    old, world = tp * pp * cp * dp, problem.cost_model.cluster.world_size
    if old == world:
        return exc
    rest = (par.get("tp") or 1) * (par.get("pp") or 1) * (par.get("cp") or 1)
    derived = (f"; for them dp was derived as {world // rest} (not in the plan or the flags), and "
               if "dp" not in parallel_choices(args) and world % rest == 0 else "; ")
    # the inner message's own fix names that derived dp: only its problem is kept
    why = re.split(r"[.;]?\s*\b[Ff]ix:", str(exc), maxsplit=1)[0].rstrip(". ")
    train = problem.cost_model.train
    replan = _plan_command_text(args, mesh["model"], train)
    return type(exc)(
        f"the plan {args.plan} is a mesh of {old} GPUs (tp x pp x cp x dp = {tp} x {pp} x {cp} "
        f"x {dp}), which does not fill the {world} GPUs of --cluster {args.cluster}{derived}"
        f"the plan cannot run there: {why}. Fix: re-plan for this cluster ({replan}); or "
        f"estimate the plan on its own cluster (--cluster {mesh['cluster']}); or give --dp "
        f"(with --tp/--pp/--cp) so that tp x pp x cp x dp = {world} and dp x micro-batch "
        f"divides the global batch {train.global_batch_size} (--micro-batch sets the latter)")


def in_plan_terms(args, problem: Problem, par: dict, call):
    """``call()``, an error it raises said in the plan's terms by :func:`moved_plan_error`
    (``estimate`` / ``explain --plan FILE`` on a cluster the plan's mesh does not fill)."""
    try:
        return call()
    except AutoparError as exc:
        moved = moved_plan_error(args, problem, par, exc)
        if moved is exc:
            raise
        raise moved from exc


def _plan_command_text(args, name: str, train: TrainingConfig) -> str:
    """``autopar plan`` with the model (``--model``, else the plan's model ``name`` when it is a
    preset, else a placeholder for its model dict file), ``--cluster``, batch and sequence of
    ``estimate --plan``."""
    from ..models import PRESETS
    model = args.model or (name if name in PRESETS or name in hf.HF_PRESETS else "MODEL.json")
    return (f"autopar plan --model {model} --cluster {args.cluster} --global-batch "
            f"{train.global_batch_size} --seq-len {train.seq_len}"
            + (f" --framework {train.framework}" if train.framework != "torch" else ""))
