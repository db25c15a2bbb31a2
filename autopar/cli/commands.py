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
purpose are printed as one line (exit code 2, as argparse does for bad flags); with ``--json``
as one JSON object on stdout, ``{"error": {"type", "message"}}``. Ctrl-C before a
search has started (while torch loads, during graph extraction, during an estimate) ends the
command with one line and exit code 130 (:func:`autopar.cli.main`); once a search runs, the first
Ctrl-C stops it at the best plan found so far, which is printed. The full flag reference is
docs/cli.md.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from rich.console import Console

from .. import alternatives
from ..api import search_plan
from ..cost.capacity import capacity_text
from ..cost.offload import offload_text
from ..search.robust import objective_text, passed_over
from ..config import ParallelConfig
from ..errors import AutoparError, InvalidPlanFile, MissingDependency
from ..graph import hf
from ..problem import Problem
from ..report import tables
from ..report.advice import fixes_to_fit
from ..report.explain import UNREACHED, compare
from ..report.summary import plural, trust_lines
from . import measure_cmds
from .plan_command import plan_command
from .choice_notes import (SP_AT_TP1, default_choices_note, ignored_choice_notes,
                           sp_only_default)
from .exports import check_outputs, export_plans
from .inputs import parallel_choices, read_problem
from .plan_input import in_plan_terms, plan_problem
from .output import (Interrupt, Progress, finish, print_error_json, print_trust,
                     run_costs)
from .flagwords import flag_words
from .parser import build_parser


def free_fraction(e) -> float:
    """The share of the GPU's memory an estimate leaves free (negative when it does not fit)."""
    return 1.0 - e.memory_per_gpu_bytes / e.memory_limit_bytes


def _compare_estimate(args, problem: Problem):
    """The ``--compare-*`` plan's estimate (None without them), made before the search.

    Raises:
        AutoparError: the estimate's, its message naming the ``--compare-*`` flags.
    """
    par = parallel_choices(args, "compare_")
    if not par:
        return None
    try:
        return problem.estimate(ParallelConfig(**par))
    except AutoparError as exc:
        raise type(exc)("the hand-tuned plan of the --compare-* flags: "
                        + flag_words(str(exc), pins="--compare-", given=frozenset(par))) from None


def _cmd_plan(args, problem, fixed, out, err, interrupt=None) -> dict:
    ref = _compare_estimate(args, problem)
    progress = Progress(err, args.json, interrupt)
    plan, result = search_plan(problem, fixed, time_limit_s=args.time_limit, top_k=args.top_k,
                               progress=progress, objective=args.objective)
    progress.stopped(plan.search)
    if args.out:
        plan.to_json(args.out)
    exported = export_plans(args, plan)
    money = run_costs(args, [("best", plan.estimate)]
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
    if exported:   # "export": the first (as before --export could be repeated); "exports": all
        data["export"], data["exports"] = exported[0], exported
    if args.json:
        return data
    e = plan.estimate
    tr = problem.train
    out.print(f"[bold]autopar plan[/bold]: {plan.model} on {plan.cluster} "
              f"({plural(plan.world_size, 'GPU')}), "
              f"global batch {tr.global_batch_size} x {tr.seq_len} tokens, {tr.precision}"
              f"{offload_text(tr)}{capacity_text(tr)}")
    s = plan.search
    out.print(f"objective: {objective_text(e, plan.alternatives, s.objective)}",
              highlight=False, markup=False)
    for t in (tables.degrees_table(e, problem.cost_model.cluster), tables.stages_table(e),
              tables.performance_table(e)):
        out.print(t)
    print_trust(out, e)
    for t in (tables.memory_table(e), tables.comm_table(e)):
        out.print(t)
    out.print(tables.alternatives_table(e, plan.alternatives, objective=s.objective))
    if ref is not None:
        out.print(compare(e, ref, "hand-tuned plan").sentence())
    if money:
        out.print(tables.money_table(money, args.tokens))
    # gap = (best - bound) / best, so the best plan left unseen is at most best / bound - 1
    # faster (a gap of 1: no bound)
    stopped = "" if s.complete else (
        f" (stopped by {progress.why()}: best so far, at most {s.gap / (1 - s.gap):.1%} slower "
        "than the best in the space)" if s.gap < 1 else f" (stopped by {progress.why()}: best "
        "so far; how far it is from the best in the space is not bounded)")
    margin = (f"; {s.memory_margin:.0%} of each GPU's memory kept free" if s.memory_margin
              else "")
    # the meshes of the space, not those searched (a stopped search reached fewer)
    out.print(f"search: {plural(s.evaluated, 'configuration')}, "
              f"{plural(s.meshes, 'mesh', 'meshes')} in the space, {s.wall_s:.1f} s{stopped}"
              f"{margin}; MFU "
              f"convention: {e.flops_convention}", style="dim", highlight=False)
    if args.out:   # as each --export says what it wrote
        out.print(f"[bold]plan file[/bold]: wrote {args.out}", highlight=False)
    for ex in exported:
        out.print(f"[bold]export[/bold] to {ex['framework']}: wrote {ex['file']}"
                  + ("" if ex["fits"] is not False else
                     " [red](what it runs does not fit: see below)[/red]"))
        for w in ex["warnings"]:
            out.print(f"  - {w}", highlight=False, markup=False)
    return data


def sp_off_note(problem: Problem, par: dict, est) -> list[str]:
    """The note ``estimate`` prints when sequence parallelism is off only by default: ``est``
    (of the choices ``par``) has tp > 1 and SP off, ``par`` does not give ``sequence_parallel``
    (no ``--sp``/``--no-sp``, no plan file, no imported ``--sequence-parallel``), and the
    framework profile allows SP (its ``sequence_parallel`` values include True). Says the step
    time (s) and memory per GPU (GB = 1e9 bytes) of the same configuration with SP on (one more
    estimate); [] otherwise, or when that estimate raises."""
    c = est.config
    moe = problem.graph.num_experts > 0
    if c.tp == 1 or c.sequence_parallel or "sequence_parallel" in par \
            or True not in problem.profile.sequence_parallel_values(moe=moe):
        return []
    try:
        sp = problem.estimate(replace(c, sequence_parallel=True))
    except AutoparError:
        return []
    return [f"sequence parallelism is off (the default without --sp); with --sp: "
            f"{sp.step_time_s:.1f} s/step, MFU {sp.mfu * 100:.1f}%, "
            f"{sp.memory_per_gpu_bytes / 1e9:.1f} GB per GPU{'' if sp.fits else ' (does not fit)'} "
            f"(now {est.step_time_s:.1f} s, {est.memory_per_gpu_bytes / 1e9:.1f} GB)"]


def _cmd_estimate(args, problem, par, notes, out) -> dict:
    par, sp_on = sp_only_default(args, problem.profile, problem.graph.num_experts > 0, par)
    dense_dispatcher = []
    if not problem.graph.num_experts and par.get("dispatcher") not in (None, "alltoall", "auto"):
        # plan refuses it (autopar.search.optimize); an estimate prices no dispatch either way,
        # so it is dropped before estimating: kept, it made every fix one the framework cannot
        # run (a dense model's fix table came out empty)
        dense_dispatcher = [f"dispatcher {par['dispatcher']!r} ignored: the model is dense (no "
                            "routed experts to dispatch)"]
        par = {k: v for k, v in par.items() if k != "dispatcher"}
    # estimate --plan on a cluster its mesh does not fill: said in the plan's terms
    est = in_plan_terms(args, problem, par, lambda: problem.estimate(ParallelConfig(**par)))
    notes = [*notes, *sp_on, *ignored_choice_notes(args, par, est.config.tp, est.config.cp),
             *sp_off_note(problem, par, est), *default_choices_note(args, par, est.config),
             *dense_dispatcher]
    fixes = [] if est.fits else fixes_to_fit(problem, est.config)
    cant_run = problem.profile.unsupported(est.config, moe=problem.graph.num_experts > 0)
    money = run_costs(args, [("yours" + ("" if est.fits else " (OOM)"), est)]
                      + [(t, e) for t, e in fixes if e.fits][:3])
    if args.plot:
        from ..report.plots import plot_overview
        plot_overview(est, args.plot)
    from ..search.margin import default_margin
    margin = default_margin(moe=problem.graph.num_experts > 0)
    data = {**est.to_dict(), "notes": notes,
            "verdict": "fits" if est.fits else "out of memory",
            "fixes": [{"change": t, "fits": e.fits, "step_time_s": e.step_time_s, "mfu": e.mfu,
                       "hfu": e.hfu, "memory_per_gpu_bytes": e.memory_per_gpu_bytes,
                       "free_memory_fraction": free_fraction(e),
                       "below_search_margin": e.fits and free_fraction(e) < margin,
                       "config": e.config.to_dict()} for t, e in fixes]}
    if not est.fits:
        if cant_run:
            data["fixes_unavailable"] = (f"{problem.profile.name} cannot run this "
                                         f"configuration: {cant_run}")
        # the search command is offered whether or not a single change was found
        data["search_memory_margin"] = margin
        data["plan_command"] = plan_command(args, problem)
    if money:
        data["run_cost"] = [{"plan": n, **m} for n, _, m in money]
    if args.json:
        return data
    cm = problem.cost_model
    out.print(f"[bold]autopar estimate[/bold]: {cm.graph.name} on {cm.cluster.name} "
              f"({plural(cm.cluster.world_size, 'GPU')}), global batch "
              f"{cm.train.global_batch_size} x "
              f"{cm.train.seq_len} tokens, {cm.train.precision}{offload_text(cm.train)}"
              f"{capacity_text(cm.train)}")
    for n in notes:
        out.print(f"note: {n}", style="yellow", highlight=False, markup=False)
    for t in (tables.degrees_table(est, cm.cluster), tables.stages_table(est),
              tables.performance_table(est)):
        out.print(t)
    print_trust(out, est)
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
        if fixes:
            out.print(tables.fixes_table(est, fixes, margin))
        else:
            out.print("No change of one or two settings in reach (recomputation, ZeRO, SP, "
                      "micro-batch, doubling tp, pp or cp) lowers this peak: it needs more "
                      "GPUs or another layout.", highlight=False)
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
        elif cant_run:
            # every fix keeps what the framework cannot run, so none is offered for it
            out.print(f"No change is offered: {problem.profile.name} cannot run this "
                      f"configuration ({cant_run}); the search weighs every mesh and "
                      f"recomputation it can run: {command}", highlight=False, markup=False)
        else:
            out.print("None of these single or paired changes fits; the search weighs every "
                      f"mesh and recomputation: {command}", highlight=False, markup=False)
    if money:
        out.print(tables.money_table(money, args.tokens))
    return data


def _cmd_explain(args, problem, fixed, out, err, interrupt=None) -> dict:
    ref = _compare_estimate(args, problem)
    progress = Progress(err, args.json, interrupt)
    plan, _ = in_plan_terms(args, problem, fixed, lambda: search_plan(
        problem, fixed, time_limit_s=args.time_limit, top_k=args.top_k, progress=progress,
        objective=args.objective))
    progress.stopped(plan.search)
    best = plan.estimate
    comps, skipped = alternatives.named_alternatives(problem, plan,
                                        [("hand-tuned plan", ref)] if ref is not None else [])
    money = run_costs(args, [("best", best)] + [(c.name, c.other) for c in comps])
    if args.plot:
        from ..report.plots import plot_comparison
        plot_comparison([("best", best)] + [(c.name, c.other) for c in comps], args.plot)
    s = plan.search
    data = {"best": best.to_dict(), "comparisons": [c.to_dict() for c in comps],
            "skipped": skipped,
            "search": {"complete": s.complete, "gap": s.gap, "evaluated": s.evaluated,
                       "meshes": s.meshes, "objective": s.objective,
                       "stopped_by": None if s.complete else progress.cause()}}
    if money:
        data["run_cost"] = [{"plan": n, **m} for n, _, m in money]
    if args.json:
        return data
    c = best.config
    band = f" {best.error_band.text()}" if best.error_band else ""
    # the robust objective may pass over a faster plan: then the plan is "chosen", not "best"
    chosen = passed_over(best, plan.alternatives, s.objective) is not None
    head = ("Chosen plan" if chosen else "Best plan") if s.complete else \
        f"Best plan found before {progress.why()}"
    if getattr(args, "plan", None):   # explain --plan: the file's configuration, pinned
        head = f"Plan of {args.plan}"
    out.print(f"[bold]{head}[/bold]: tp={c.tp} pp={c.pp} dp={c.dp} cp={c.cp} zero="
              f"{c.zero_stage} recompute={c.recompute if isinstance(c.recompute, str) else 'mixed'}"
              f" mbs={c.micro_batch_size} v={c.virtual_stages} schedule={c.schedule}"
              f"{f' vp_group={c.vp_group}' if c.vp_group else ''}: "
              f"{best.step_time_s:.3f} s/step{band}, MFU {best.mfu * 100:.1f}%, "
              f"{best.memory_per_gpu_bytes / 1e9:.1f} GB per GPU.", highlight=False)
    for label, text in trust_lines(best):
        out.print(f"{label}: {text}", highlight=False, markup=False)
    out.print(f"objective: {objective_text(best, plan.alternatives, s.objective)}",
              highlight=False, markup=False)   # the line plan prints
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
        The exit code: 0 ok, 2 bad input, 1 when ``calibrate --check`` finds a short link.
    """
    args = build_parser().parse_args(argv)
    err = Console(stderr=True, soft_wrap=True)
    out = Console(width=None if sys.stdout.isatty() else 140)
    try:
        if args.command == "models":
            from ..models import PRESETS
            rows = [tables.model_row(name, p.config, p.source) for name, p in PRESETS.items()]
            try:
                hf_rows = [hf.describe(name) for name in hf.HF_PRESETS]
            except MissingDependency as exc:  # the built-in presets need no transformers
                hf_rows, hf_note = [], (f"{exc}. With it, the Hugging Face presets: "
                                        f"{', '.join(hf.HF_PRESETS)}")
            else:
                hf_note = None
            if args.json:
                print(json.dumps({"models": rows, "hf_models": hf_rows,
                                  "hf_preset_names": list(hf.HF_PRESETS)}, indent=2,
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
            return 1 if getattr(args, "short_links", 0) else 0  # calibrate --check's verdict
        check_outputs(args)
        # graph extraction: Ctrl-C ends the command
        problem, par, notes = (plan_problem if getattr(args, "plan", None) else read_problem)(args)
        if args.command == "estimate":
            finish(args, _cmd_estimate(args, problem, par, notes, out), err)
            return 0
        # --sp --tp 1: as estimate
        notes = [*notes, *ignored_choice_notes(args, par, par.get("tp"), par.get("cp"))]
        cpar = parallel_choices(args, "compare_")   # --compare-sp at --compare-tp 1 likewise
        if cpar.get("sequence_parallel") and cpar.get("tp", 1) == 1:
            notes.append(f"--compare-sp: {SP_AT_TP1}")
        for n in notes:  # estimate prints its notes with its tables
            err.print(f"note: {n}", style="yellow", highlight=False, markup=False)
        with Interrupt(err) as interrupt:  # from here the first Ctrl-C keeps the best plan
            cmd = _cmd_plan if args.command == "plan" else _cmd_explain
            finish(args, cmd(args, problem, par, out, err, interrupt), err)
        return 0
    except AutoparError as exc:
        # a plan file's fields are fixed in the file (it is checked before flags apply): its
        # message keeps their names, where "--dp 4" read as a flag that would help and did not
        text = str(exc) if isinstance(exc, InvalidPlanFile) else flag_words(
            str(exc), given=frozenset(parallel_choices(args)))
        if getattr(args, "json", False):   # a script reading stdout gets JSON either way
            print_error_json(type(exc).__name__, text)
        else:
            err.print(f"autopar: {type(exc).__name__}: {text}", style="red",
                      markup=False, soft_wrap=True, highlight=False)
        return 2
