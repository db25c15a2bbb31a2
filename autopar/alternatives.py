"""Other plans than the one searched: the best plan under pinned choices, the usual layouts set
against a plan (what ``autopar explain`` prints), and the nearest plan a framework can run (what
an export says when the written configuration does not fit).

Each is a search, so it sits above the report and the runtime that show its results
(docs/design.md, "Layer order"); the comparisons themselves are :mod:`autopar.report.explain`'s.

    problem = Problem.build("llama2-70b", "4x8xA100-80GB", TrainingConfig(1024, 4096))
    plan, result = autopar.api.search_plan(problem)
    comparisons, skipped = named_alternatives(problem, plan)
"""

from __future__ import annotations

from dataclasses import replace

from .cost.model import CostModel
from .cost.types import Estimate
from .errors import AutoparError, InfeasibleError, InvalidParallelConfig
from .frameworks import get_profile
from .plan import Plan
from .problem import Problem
from .report.explain import (UNREACHED, Comparison, canonical_alternatives, compare,
                             left_out_notes, tp_across_nodes)
from .runtime.verdict import GB, describe, pct_text
from .search.margin import check_margin, search_with_margin
from .search.optimize import search
from .search.ranking import tied


def best_under(problem: Problem, fixed: dict) -> tuple[Estimate, str]:
    """The fastest fitting estimate with ``fixed`` choices pinned, and "" ; when nothing fits,
    the most memory-frugal estimate tried and why it does not fit.

    Raises:
        InvalidParallelConfig: no legal mesh at all for these choices.
    """
    cm = problem.cost_model
    try:
        return search_with_margin(cm, fixed, memory_margin=problem.memory_margin,
                                  top_k=1).best, ""
    except InfeasibleError as exc:
        try:
            res = search(cm, fixed, top_k=1, require_fit=False)
        except InfeasibleError:
            raise InvalidParallelConfig(str(exc)) from exc
        frugal = min(res.pareto, key=lambda e: e.memory_per_gpu_bytes)
        return frugal, "Nothing with these choices fits; shown: its most frugal variant."


def named_alternatives(problem: Problem, plan: Plan, extra=()) -> tuple[list[Comparison],
                                                                         list[str]]:
    """Compare ``plan`` with the canonical layouts
    (:func:`autopar.report.explain.canonical_alternatives`, each the best plan with those
    choices pinned: :func:`best_under`), TP laid across nodes, the plan's first three runners-up
    and ``extra`` ``(name, estimate)`` pairs. When ``plan``'s search was stopped
    (``plan.search.complete`` False), sentences name it "the plan found" and a fitting layout
    faster than it says so in its note (:data:`autopar.report.explain.UNREACHED`).

    Returns:
        (comparisons, skipped): the comparisons, and one sentence per layout left out and why.
    """
    best = plan.estimate
    complete = plan.search.complete
    comps: list[Comparison] = []
    skipped: list[str] = []
    seen: dict[str, str] = {}   # config repr -> the name it was first compared under

    def add(est: Estimate, name: str, note: str = "") -> None:
        key = repr(est.config)
        if key in seen:   # one row per plan: a runner-up can be a canonical layout's best
            skipped.append(f"{name}: the same plan as {seen[key]!r}.")
            return
        seen[key] = name
        comps.append(compare(best, est, name, note))

    for name, pins in canonical_alternatives(problem):
        try:
            est, note = best_under(problem, pins)
        except AutoparError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        if repr(est.config) == repr(best.config):
            skipped.append(f"{name}: it is the {'best ' if complete else ''}plan itself.")
        else:
            add(est, name, note)
        if name.startswith("TP=") and "inside" in name:
            wide = tp_across_nodes(problem, est)
            if wide is not None:
                add(wide[1], wide[0])
    skipped += left_out_notes(problem)
    for i, a in enumerate(plan.alternatives[:3]):
        add(a, f"alternative {i + 1}")
    for name, est in extra:   # asked for by name: always its own row
        comps.append(compare(best, est, name))
    if not complete:
        comps = [_stopped(c) for c in comps]
    return comps, skipped


def _stopped(c: Comparison) -> Comparison:
    """``c`` against the plan of a stopped search: its base named "the plan found", and
    :data:`~autopar.report.explain.UNREACHED` added to its note when its plan fits and is faster
    than the base (beyond :data:`autopar.search.ranking.TIE_RTOL`), which a sentence saying
    "faster" next to "the best plan" hid."""
    o, b = c.other, c.base
    c = replace(c, base_name="the plan found")
    if not o.fits or o.step_time_s >= b.step_time_s or tied(o.step_time_s, b.step_time_s):
        return c
    return replace(c, note=" ".join(filter(None, (c.note, UNREACHED))))


def nearest(cm: CostModel, framework: str, planned: Estimate,
            limits: dict | None = None, memory_margin: float | None = None) -> str:
    """The nearest plan ``framework`` can run, as one line: the best plan with the planned
    degrees (tp, pp, cp, dp) if one fits under the framework, else the best plan of a new
    search restricted to the framework (``optimize(..., TrainingConfig(framework=...))``).
    ``cm``: the cost model of the plan's problem under ``framework``'s profile; ``limits``:
    degrees the exported file's runner fixes whatever the profile allows (e.g. ``pp=1`` for
    Accelerate, which has no pipeline), kept in every search and named in the fix;
    ``memory_margin``: the fraction of each GPU's memory kept free, as in ``optimize`` (None:
    the default for the model's kind, :func:`autopar.search.margin.check_margin`), so the plan
    named is the one the command it prints finds (it filled memory to the last byte).

    Raises:
        InvalidSearchOption: a bad ``memory_margin``.
    """
    c = planned.config
    limits = dict(limits or {})
    moe = cm.graph.num_experts > 0
    margin = check_margin(memory_margin, moe)
    found = None
    tries = [limits or None]
    planned_mesh = dict(tp=c.tp, pp=c.pp, cp=c.cp, dp=c.dp)
    if (c.cp == 1 or get_profile(framework).cp_modes) and all(
            getattr(c, k) == v for k, v in limits.items()):   # a mesh it can run
        tries.insert(0, {**planned_mesh, **limits})
    for fixed in tries:
        try:
            found = search_with_margin(cm, fixed, memory_margin=margin, top_k=1).best
            break
        except AutoparError:
            continue
    flag = "" if margin == check_margin(None, moe) else f" --memory-margin {margin:g}"
    kwarg = "" if not flag else f", memory_margin={margin:g}"
    if found is None:
        return (f"no plan {framework} can run fits on this cluster with {margin:.0%} of each "
                f"GPU's memory kept free (autopar searched with framework={framework!r}"
                f"{_limits_text(limits, ', ')}). Fix: more or larger GPUs, a smaller batch, or "
                "a smaller --memory-margin")
    change = pct_text(found.step_time_s, planned.step_time_s)
    return (f"nearest plan {framework} can run{_limits_text(limits, ' with ')}: "
            f"{describe(found.config)}: "
            f"{found.step_time_s:.4g} s per step ({change} vs the plan), "
            f"{found.memory_per_gpu_bytes / GB:.1f} GB per GPU ({margin:.0%} kept free). Fix: "
            f"export that plan (autopar plan ... --framework {framework}"
            + "".join(f" --{k} {v}" for k, v in limits.items()) + flag
            + f", or autopar.optimize(..., TrainingConfig(..., framework={framework!r})"
            + (f", fixed={limits!r}" if limits else "") + kwarg + "))")


def _limits_text(limits: dict, sep: str) -> str:
    return sep + " ".join(f"{k}={v}" for k, v in limits.items()) if limits else ""
