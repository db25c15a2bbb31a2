"""The search driver: branch and bound over the whole space, best-first by a step-time bound.

1. Groups (tp, cp, pp, dp, micro-batch, SP) from :mod:`autopar.search.space`, each with a lower
   bound on its step time: the pipeline takes at least ``m * (sum of layer times) / pp`` (the
   slowest rank is no faster than the average; recomputation, bubbles and DP traffic only add).
   Groups are visited in order of that bound.
2. Phase 1, per group: every interleaving degree v and ZeRO stage, with the default placement and
   CP mode and balanced stage cuts; every pipeline rank takes its fastest fitting recomputation
   (:func:`best_recompute`) and the cost model estimates the result. Groups are skipped once
   their bound cannot enter the top-k.
3. Phase 2: candidates of phase 1 within ``refine_within`` of the best (all of them when the
   space is small) try every distinct rank placement, CP mode and stage cut
   (:func:`cut_candidates`: exhaustive for few cuts, a neighbourhood of the balanced cut
   otherwise, plus for one chunk per rank the dynamic-programming cut of
   :func:`autopar.search.cuts.dp_cut`, which phase 1 also tries when the balanced cut does not
   fit). Under a time limit the best so far is returned with its gap to the smallest bound left
   unexplored.
Step times within :data:`autopar.search.ranking.TIE_RTOL` are equal; ties go to the simpler plan
(fewer parallel dimensions, no CP, less memory, then the configuration's text), so the same input
gives the same plan; runner-ups are one per kind of plan (:mod:`autopar.search.ranking`).
"""

from __future__ import annotations

import gc
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter

from ..cost.model import CostModel
from ..cost.offload import check_plan
from ..cost.types import Estimate
from ..config import ParallelConfig
from ..errors import AutoparError, InfeasibleError, InvalidParallelConfig
from . import space
from .diagnose import infeasible_error, no_mesh_error
from .bounds import lower_bound
from .groups import mesh_groups
from .phases import Progress, Run, coarse, refine
from .ranking import one_per_kind, ranked
from .recompute import certify

__all__ = ["SearchResult", "search", "Progress"]


@dataclass(frozen=True)
class SearchResult:
    """What a search found.

    Attributes:
        best: the fastest fitting estimate.
        top: up to ``top_k`` fitting estimates, fastest first (``top[0] is best``), one per kind
            of plan (:func:`autopar.search.ranking.kind_key`: runner-ups differ from the best and
            from each other in degrees, ZeRO stage, recomputation, micro-batch or interleaving).
        pareto: fitting estimates not beaten in both step time and memory, by step time.
        evaluated: configurations estimated.
        meshes: (tp, cp, pp, dp, micro-batch, SP) groups in the space.
        wall_s: search wall time (seconds).
        complete: False when a time limit or Ctrl-C stopped the search (best so far returned).
        gap: relative optimality gap of ``best``: 0 when complete, else
            (best - smallest lower bound left unexplored) / best.
        assignments: per-rank recomputations solved by the OR-Tools CP-SAT model
            (:mod:`autopar.search.recompute`: the ranks of mixed blocks where memory binds of
            the plans returned, each distinct problem once; the exact enumeration answered
            them during the search, :func:`autopar.search.recompute.certify`).
        assignment_gap: the largest relative gap (found - bound) / found of those assignments
            when CP-SAT's work limit ended one before it proved it optimal; 0 when all were.
    """

    best: Estimate
    top: tuple[Estimate, ...]
    pareto: tuple[Estimate, ...]
    evaluated: int
    meshes: int
    wall_s: float
    complete: bool
    gap: float = 0.0
    assignments: int = 0
    assignment_gap: float = 0.0


def search(cm: CostModel, fixed: dict | None = None, *, time_limit_s: float | None = None,
           top_k: int = 5, progress: Progress | None = None,
           limits: space.SpaceLimits | None = None, require_fit: bool = True) -> SearchResult:
    """Find the fastest configurations that fit, under the cost model ``cm``.

    Args:
        cm: cost model of the model, cluster and training config.
        fixed: choices to pin (keys of :data:`autopar.search.space.FIXABLE`); with
            ``cm.train.param_offload`` an open ZeRO stage is pinned to 3.
        time_limit_s: stop after this many seconds and return the best so far with its gap
            (the limit binds once a first fitting plan is found or the most promising mesh
            group has been searched; :class:`InfeasibleError` when it runs out before any plan
            fits).
        top_k: how many distinct plans to keep (the bound prunes against the k-th best).
        progress: called as ``progress(stage, done, total, best_so_far)`` as the search goes
            (stage ``"search"``: mesh groups, then ``"refine"``: phase-2 candidates), in that
            order; the last call says where it ended: ``done == total`` when that stage
            finished (what it left was bounded out), ``done < total`` (groups or candidates
            searched) when a time limit or a KeyboardInterrupt stopped it. A callback may raise
            KeyboardInterrupt to stop the search at its best so far.
        limits: bounds of the enumeration.
        require_fit: keep only configurations that fit in memory (False ranks everything by
            time: for judging published runs the memory model disagrees with).

    Raises:
        InvalidParallelConfig: ``fixed`` has unknown keys or bad values, or pins a ZeRO stage
            other than 3 under ``param_offload``, or per-block ``recompute`` modes whose
            count is not the model's blocks.
        InfeasibleError: nothing fits; the message names the binding constraint and a fix.
    """
    if cm.train.param_offload:
        # parameter offload runs under ZeRO-3 only (autopar.cost.offload.check_plan): the
        # user's offload choice pins the stage; the search never turns offload on itself. A
        # pinned other stage is refused now, not after a search that can evaluate nothing.
        if (fixed or {}).get("zero_stage", 3) != 3:
            check_plan(cm.train, ParallelConfig(zero_stage=fixed["zero_stage"]))
        fixed = {**(fixed or {}), "zero_stage": 3}
    with _collector_paused():
        return _search(cm, fixed, time_limit_s=time_limit_s, top_k=top_k, progress=progress,
                       limits=limits, require_fit=require_fit)


@contextmanager
def _collector_paused():
    """Pause Python's cyclic garbage collector for the duration (restored after, also on
    errors). A search allocates millions of short-lived objects beside its large caches; each
    automatic collection of the oldest generation traverses every tracked object of the process
    (CPython ``gc`` module documentation: collection is triggered by allocation counts, and a
    full collection examines all tracked objects), and the search leaves no reference cycles to
    free (tests/test_search_speed_caches.py), so those collections only cost time (about a sixth
    of the GPT-3 175B benchmark's search). Reference counting still frees everything at once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if gc.get_freeze_count() == 0:
                # the search's survivors all sit in the youngest generation, which the next
                # allocation would traverse whole (a quarter second after a large search);
                # freeze + unfreeze moves them to the oldest one without a traversal (CPython
                # gc docs: unfreeze puts the permanent generation back into the oldest). Not
                # done when the process froze objects of its own: unfreeze would release them
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _search(cm: CostModel, fixed: dict | None, *, time_limit_s: float | None, top_k: int,
            progress: Progress | None, limits: space.SpaceLimits | None,
            require_fit: bool) -> SearchResult:
    """:func:`search` itself (with the collector paused by the caller)."""
    t0 = time.monotonic()
    fixed = space.check_fixed(fixed)
    if "recompute" in fixed:
        ParallelConfig(recompute=fixed["recompute"]).block_recompute(cm.graph.num_blocks)
    limits = limits or space.SpaceLimits()
    run = Run(cm, time_limit_s, progress, require_fit, top_k)
    run.layerwise = limits.layerwise
    _pins_the_framework_runs(run.profile, fixed, moe=cm.graph.num_experts > 0)
    groups = mesh_groups(cm, fixed, limits)
    if not groups:
        raise no_mesh_error(cm, fixed)
    open_bound = math.inf
    allowed = space.recompute_modes(fixed, run.profile)
    candidates: list = []
    # the last progress report: the stage the search was in and how far it got (a report of
    # the end claimed every group searched after an interrupt, and came after phase 2's)
    stage, refined = "search", 0
    try:
        for i, (bound, _key_g, base) in enumerate(groups):
            if progress:
                progress("search", i, len(groups), run.best)
            if bound > run.threshold():
                break  # every remaining group is bounded above the top-k
            if run.expired():
                open_bound = bound
                break
            candidates.extend(coarse(run, base, fixed, limits, allowed))
            run.groups_done += 1
        if run.complete:
            if progress:  # every group searched or bounded out
                progress("search", len(groups), len(groups), run.best)
            stage = "refine"
        _sort_by_time_then_text(candidates)
        small = len(candidates) <= limits.exhaustive_below
        for i, (t, _v, _zero, c) in enumerate(candidates):
            best = run.best.step_time_s if run.best is not None else math.inf
            if not small and t > best * (1 + limits.refine_within):
                break
            if run.expired():
                # the candidates left unrefined: any refinement of one is bounded by its
                # lower bound (a stop here used to claim a gap of 0)
                open_bound = min([open_bound] + [lower_bound(cm, cc)
                                                 for _t, _v2, _z2, cc in candidates[i:]])
                break
            if progress:
                progress("refine", i, len(candidates), run.best)
            refine(run, c, fixed, allowed)
            refined = i + 1
    except KeyboardInterrupt:
        # Ctrl-C: keep what was found; an empty result re-raises so the caller can stop
        if run.best is None:
            raise
        run.complete = False
        open_bound = 0.0
    if progress:
        total = len(groups) if stage == "search" else len(candidates)
        # stopped: how far the stage got; finished: all of it (the rest bounded out)
        done = (run.groups_done if stage == "search" else refined) if not run.complete \
            else total
        try:
            progress(stage, done, total, run.best)
        except KeyboardInterrupt:
            # a callback stops a search by raising it (the CLI's first Ctrl-C); this one has
            # stopped: keep its result
            if run.best is None:
                raise
    if run.best is None and not run.complete:
        raise InfeasibleError(
            f"no fitting plan found within time_limit_s={time_limit_s} ({run.groups_done} of "
            f"{len(groups)} candidate meshes searched, {run.evaluated} configurations). Fix: "
            "raise time_limit_s, or pin choices with fixed= to shrink the space.")
    if run.best is None:
        raise infeasible_error(cm, run.smallest, fixed, run.deadline)
    order = ranked(run.kept.values())
    pareto, best_mem = [], math.inf
    for e in order:
        if e.memory_per_gpu_bytes < best_mem:
            pareto.append(e)
            best_mem = e.memory_per_gpu_bytes
    best = order[0]
    top = tuple(one_per_kind(order)[:top_k])
    # CP-SAT on the mixed, memory-bound ranks of the plans returned (the enumeration answered
    # them while searching; both are exact)
    certify(run.log, [e.config for e in (best, *top, *pareto)])
    gap = 0.0 if run.complete else max(0.0, (best.step_time_s - open_bound) / best.step_time_s)
    return SearchResult(best=best, top=top, pareto=tuple(pareto),
                        evaluated=run.evaluated, meshes=len(groups),
                        wall_s=time.monotonic() - t0, complete=run.complete,
                        gap=gap if math.isfinite(gap) else 1.0,
                        assignments=run.log.solves, assignment_gap=run.log.gap)




def _sort_by_time_then_text(candidates: list) -> None:
    """Sort phase 1's (time, v, zero, config) in place by time, equal times by the
    configuration's text: the order of the key ``(time, repr(config))``, with the text built
    only for the configurations whose time ties another's (a search has thousands of
    candidates, each text a few hundred characters, and few ties). Both sorts are stable, so
    entries equal in both keep their order as under the one key."""
    candidates.sort(key=itemgetter(0))
    i, n = 0, len(candidates)
    while i < n:
        t, j = candidates[i][0], i + 1
        while j < n and candidates[j][0] == t:
            j += 1
        if j - i > 1:
            candidates[i:j] = sorted(candidates[i:j], key=lambda x: repr(x[3]))
        i = j


def _pins_the_framework_runs(profile, fixed: dict, moe: bool = False) -> None:
    """Refuse at once a pinned choice the target framework cannot run on the model (with MoE
    layers when ``moe``): the search would only find nothing, slowly, and could not say why.

    Raises:
        InvalidParallelConfig: the reason from :meth:`FrameworkProfile.unsupported` and a fix;
            first, MoE-only pins (a dispatcher other than the default, an expert-TP degree other
            than tp) on a dense model, which no framework would make runnable.
    """
    if not moe:
        # judged before the framework: blaming it sent users to another framework, where the
        # dense model fails the same way
        moe_only = {"dispatcher": "--dispatcher",
                    "expert_tp": "--expert-tp"}
        given = [k for k in moe_only if fixed.get(k) is not None and not (
            k == "dispatcher" and fixed[k] in ("auto", "alltoall")) and not (
            k == "expert_tp" and fixed[k] == fixed.get("tp", 1))]
        if given:
            pins = " and ".join(f"{k}={fixed[k]!r}" for k in given)
            raise InvalidParallelConfig(
                f"the pinned {pins} only appl{'ies' if len(given) == 1 else 'y'} to "
                "mixture-of-experts layers, but the model is "
                f"dense (no routed experts). Fix: drop "
                f"{' and '.join(moe_only[k] for k in given)}, or use a mixture-of-experts model.")
    keys = {k: v for k, v in fixed.items() if k in ParallelConfig.__dataclass_fields__
            and k not in ("stage_blocks",) and not (k == "dispatcher" and v == "auto")}
    if not keys:
        return
    if "zero_stage" not in keys:  # an open ZeRO stage: one the framework runs on this mesh
        options = profile.zero_options(keys.get("tp", 1), keys.get("pp", 1), keys.get("cp", 1),
                                       keys.get("ep", 1))
        if not options:
            return
        keys = {**keys, "zero_stage": options[0]}
    # open choices take a value the framework runs, so only the pins are judged
    keys.setdefault("sequence_parallel", (profile.sequence_parallel_values(moe)
                                          or profile.sequence_parallel)[0])
    keys.setdefault("recompute", profile.recompute_modes[0])
    if profile.cp_modes:
        keys.setdefault("cp_mode", profile.cp_modes[0])
    try:
        partial = ParallelConfig(**{"dp": None, **keys})
    except AutoparError:
        return  # inconsistent pins are refused later with their own message
    why = profile.unsupported(partial, moe)
    if why:
        other = ("drop or change that pin, or plan for another framework (--framework / "
                 "TrainingConfig(framework=...))")
        # a rule that names its own fix gets the others after it, not a second "Fix:"
        fix = f"; or {other}" if "fix:" in why.lower() else f". Fix: {other}"
        raise InvalidParallelConfig(f"the pinned {sorted(k for k in keys if k in fixed)} cannot "
                                    f"run under {profile.name}: {why}{fix}.")
