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
   otherwise). Under a time limit the best so far is returned with its gap to the smallest
   bound left unexplored.
Ties break on memory, then on the configuration's text: the same input gives the same plan.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable

from ..config import ParallelConfig
from ..cost.model import CostModel
from ..cost.types import Estimate
from ..errors import AutoparError, InfeasibleError, InvalidParallelConfig
from . import space
from .stages import best_recompute, cut_candidates

Progress = Callable[[str, int, int, "Estimate | None"], None]


@dataclass(frozen=True)
class SearchResult:
    """What a search found.

    Attributes:
        best: the fastest fitting estimate.
        top: up to ``top_k`` fitting estimates, fastest first (``top[0] is best``).
        pareto: fitting estimates not beaten in both step time and memory, by step time.
        evaluated: configurations estimated.
        meshes: (tp, cp, pp, dp, micro-batch, SP) groups in the space.
        wall_s: search wall time (seconds).
        complete: False when a time limit or Ctrl-C stopped the search (best so far returned).
        gap: relative optimality gap of ``best``: 0 when complete, else
            (best - smallest lower bound left unexplored) / best.
    """

    best: Estimate
    top: tuple[Estimate, ...]
    pareto: tuple[Estimate, ...]
    evaluated: int
    meshes: int
    wall_s: float
    complete: bool
    gap: float = 0.0


def _key(e: Estimate):
    return (e.step_time_s, e.memory_per_gpu_bytes, repr(e.config))


class _Run:
    """State of one search: the candidates kept, the bound to beat, the deadline."""

    def __init__(self, cm: CostModel, time_limit_s: float | None, progress: Progress | None,
                 require_fit: bool, top_k: int):
        self.cm = cm
        self.require_fit = require_fit
        self.top_k = max(1, top_k)
        self.deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        self.progress = progress
        self.kept: dict[str, Estimate] = {}
        self.smallest: Estimate | None = None   # least memory seen, for infeasibility reports
        self.evaluated = 0
        self.complete = True
        self.best: Estimate | None = None
        self._ranked: list[Estimate] = []
        self.groups_done = 0

    def expired(self) -> bool:
        # before any plan exists the limit binds only once the most promising group has been
        # searched, so a short limit still returns a plan when one is easy to find
        if self.best is None and self.groups_done == 0:
            return False
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.complete = False
            return True
        return False

    def threshold(self) -> float:
        """Step time a candidate must beat to enter the top-k (inf until k are kept)."""
        if len(self._ranked) < self.top_k:
            return math.inf
        return self._ranked[self.top_k - 1].step_time_s

    def estimate(self, cfg: ParallelConfig) -> Estimate | None:
        try:
            e = self.cm.estimate(cfg)
        except InvalidParallelConfig:
            return None
        self.evaluated += 1
        if self.smallest is None or e.memory_per_gpu_bytes < self.smallest.memory_per_gpu_bytes:
            self.smallest = e
        if e.fits or not self.require_fit:
            key = repr(e.config)
            if key not in self.kept:
                self.kept[key] = e
                self._ranked.append(e)
                self._ranked.sort(key=_key)
                del self._ranked[self.top_k:]
            if self.best is None or _key(e) < _key(self.best):
                self.best = e
        return e


def search(cm: CostModel, fixed: dict | None = None, *, time_limit_s: float | None = None,
           top_k: int = 5, progress: Progress | None = None,
           limits: space.SpaceLimits | None = None, require_fit: bool = True) -> SearchResult:
    """Find the fastest configurations that fit, under the cost model ``cm``.

    Args:
        cm: cost model of the model, cluster and training config.
        fixed: choices to pin (keys of :data:`autopar.search.space.FIXABLE`).
        time_limit_s: stop after this many seconds and return the best so far with its gap
            (the limit binds once a first fitting plan is found).
        top_k: how many distinct plans to keep (the bound prunes against the k-th best).
        progress: called as ``progress(stage, done, total, best_so_far)``.
        limits: bounds of the enumeration.
        require_fit: keep only configurations that fit in memory (False ranks everything by
            time: for judging published runs the memory model disagrees with).

    Raises:
        InvalidParallelConfig: ``fixed`` has unknown keys or bad values.
        InfeasibleError: nothing fits; the message names the binding constraint and a fix.
    """
    t0 = time.monotonic()
    fixed = space.check_fixed(fixed)
    limits = limits or space.SpaceLimits()
    run = _Run(cm, time_limit_s, progress, require_fit, top_k)
    groups = _groups(cm, fixed, limits)
    if not groups:
        raise _no_mesh(cm, fixed)
    open_bound = math.inf
    allowed = space.recompute_modes(fixed)
    coarse: list = []
    try:
        for i, (bound, _key_g, base) in enumerate(groups):
            if progress:
                progress("search", i, len(groups), run.best)
            if bound >= run.threshold():
                break  # every remaining group is bounded above the top-k
            if run.expired():
                open_bound = bound
                break
            coarse.extend(_coarse(run, base, fixed, limits, allowed))
            run.groups_done += 1
        coarse.sort(key=lambda x: (x[0], repr(x[3])))
        small = len(coarse) <= limits.exhaustive_below
        for i, (t, _v, _zero, c) in enumerate(coarse):
            if progress:
                progress("refine", i, len(coarse), run.best)
            best = run.best.step_time_s if run.best is not None else math.inf
            if not small and t > best * (1 + limits.refine_within):
                break
            if run.expired():
                break
            _refine(run, c, fixed, allowed)
    except KeyboardInterrupt:
        # Ctrl-C: keep what was found; an empty result re-raises so the caller can stop
        if run.best is None:
            raise
        run.complete = False
        open_bound = 0.0
    if progress:
        progress("search", len(groups), len(groups), run.best)
    if run.best is None and not run.complete:
        raise InfeasibleError(
            f"no fitting plan found within time_limit_s={time_limit_s} ({run.groups_done} of "
            f"{len(groups)} candidate meshes searched, {run.evaluated} configurations). Fix: "
            "raise time_limit_s, or pin choices with fixed= to shrink the space.")
    if run.best is None:
        raise _infeasible(cm, run, fixed)
    ranked = sorted(run.kept.values(), key=_key)
    pareto, best_mem = [], math.inf
    for e in ranked:
        if e.memory_per_gpu_bytes < best_mem:
            pareto.append(e)
            best_mem = e.memory_per_gpu_bytes
    best = ranked[0]
    gap = 0.0 if run.complete else max(0.0, (best.step_time_s - open_bound) / best.step_time_s)
    return SearchResult(best=best, top=tuple(ranked[:top_k]), pareto=tuple(pareto),
                        evaluated=run.evaluated, meshes=len(groups),
                        wall_s=time.monotonic() - t0, complete=run.complete,
                        gap=gap if math.isfinite(gap) else 1.0)


def _layer_sum(cm: CostModel, c: ParallelConfig) -> float:
    """Sum over all layers of one micro-batch's forward + backward without recomputation."""
    total = 0.0
    counts: dict[str, list] = {}
    for layer in cm.graph.layers:
        counts.setdefault(layer.signature, [layer.index, 0])[1] += 1
    for li, n in counts.values():
        bc = cm.block_cost(li, "none", c)
        total += n * (bc.fwd_s + bc.bwd_s)
    return total


def _bound(cm: CostModel, c: ParallelConfig) -> float:
    """Lower bound on the step time of any completion of the resolved config ``c``."""
    m = cm.train.global_batch_size // (c.dp * c.micro_batch_size)
    return m * _layer_sum(cm, c) / c.pp


def _groups(cm: CostModel, fixed: dict, limits) -> list[tuple[float, tuple, dict]]:
    """(bound, tie-break key, base fields) of every (mesh, micro-batch, SP, EP) group, best
    first."""
    train, g = cm.train, cm.graph
    out = []
    for tp, cp, pp, dp in space.meshes(g, cm.cluster, train, fixed, limits):
        sps = [fixed["sequence_parallel"]] if "sequence_parallel" in fixed else [tp > 1]
        for b, sp, ep in itertools.product(space.micro_batches(train, dp, fixed, limits), sps,
                                           space.ep_options(g, dp, fixed)):
            base = dict(tp=tp, cp=cp, pp=pp, dp=dp, micro_batch_size=b, sequence_parallel=sp,
                        ep=ep)
            bounds = []
            for placement in space.placements(base, fixed):
                for mode in space.cp_modes(g, base, fixed):
                    try:
                        c = cm.resolve(ParallelConfig(**base, placement=placement,
                                                      cp_mode=mode))
                    except InvalidParallelConfig:
                        continue
                    bounds.append(_bound(cm, c))
            if bounds:
                out.append((min(bounds), (tp, cp, pp, dp, b, sp, ep), base))
    out.sort(key=lambda x: (x[0], x[1]))
    return out


def _coarse(run: _Run, base: dict, fixed: dict, limits, allowed) -> list:
    """Phase 1 for one group: every interleaving and ZeRO stage with the default placement and
    CP mode and balanced cuts. Returns (time, v, zero) for phase 2."""
    cm = run.cm
    blocks = max(cm.graph.num_blocks, 1)
    m = cm.train.global_batch_size // (base["dp"] * base["micro_batch_size"])
    placement = space.placements(base, fixed)[0]
    mode = space.cp_modes(cm.graph, base, fixed)[0]
    out = []
    if run.require_fit:
        # the group's most frugal variant (most ZeRO sharding, most recomputation, no
        # interleaving): when even it is well over the GPU's memory, skip the whole group
        frugal = ParallelConfig(
            **base, placement=placement, cp_mode=mode,
            virtual_stages=fixed.get("virtual_stages", 1),
            zero_stage=max(space.zero_options(base["dp"], base["cp"], fixed)),
            recompute=allowed[-1], schedule=fixed.get("schedule"),
            stage_blocks=fixed.get("stage_blocks"))
        e = run.estimate(frugal)
        if e is not None and e.memory_per_gpu_bytes > 1.05 * cm.device.memory_bytes:
            return out
    for v in space.virtual_stage_options(base["pp"], blocks, m, fixed, limits):
        for zero in space.zero_options(base["dp"], base["cp"], fixed):
            if run.expired():
                return out
            cfg = ParallelConfig(**base, placement=placement, cp_mode=mode, virtual_stages=v,
                                 zero_stage=zero, schedule=fixed.get("schedule"),
                                 stage_blocks=fixed.get("stage_blocks"))
            try:
                c = cm.resolve(cfg)
            except InvalidParallelConfig:
                continue
            e = _evaluate(run, c, fixed, allowed)
            out.append((e.step_time_s if e is not None and (e.fits or not run.require_fit)
                        else math.inf, v, zero, c))
    return out


def _refine(run: _Run, c: ParallelConfig, fixed: dict, allowed) -> None:
    """Phase 2 for one candidate: other placements, CP modes and stage cuts."""
    cm = run.cm
    base = dict(tp=c.tp, cp=c.cp, pp=c.pp, dp=c.dp, ep=c.ep)
    seen = set()
    for placement in space.placements(base, fixed):
        links = tuple((d, cm.group(d, c.replace(placement=placement)).link,
                       cm.group(d, c.replace(placement=placement)).ranks)
                      for d in ("tp", "cp", "dp", "pp"))
        if links in seen:  # same groups on the same links: the same estimate
            continue
        seen.add(links)
        for mode in space.cp_modes(cm.graph, c.__dict__, fixed):
            cc = c.replace(placement=placement, cp_mode=mode)
            try:
                cc = cm.resolve(cc)
            except InvalidParallelConfig:
                continue
            cuts = [cc.stage_blocks] if "stage_blocks" in fixed else cut_candidates(
                max(cm.graph.num_blocks, 1), cc.pp * cc.virtual_stages)
            for cut in cuts:
                if run.expired():
                    return
                _evaluate(run, cc.replace(stage_blocks=cut), fixed, allowed)


def _evaluate(run: _Run, c: ParallelConfig, fixed: dict, allowed) -> Estimate | None:
    """Give each pipeline rank its fastest fitting recomputation and estimate the result."""
    if "recompute" in fixed and isinstance(fixed["recompute"], tuple):
        modes = fixed["recompute"]
    else:
        modes = best_recompute(run.cm, c, allowed)
    if modes is None:  # nothing fits: still estimated, for the infeasibility report
        return run.estimate(c.replace(recompute=allowed[-1]))
    rc = modes[0] if modes and len(set(modes)) == 1 else (modes or "none")
    return run.estimate(c.replace(recompute=rc))


def _no_mesh(cm: CostModel, fixed: dict) -> AutoparError:
    """No legal mesh: the binding divisibility rule and the smallest fix
    (:func:`autopar.search.diagnose.no_mesh_error`)."""
    from .diagnose import no_mesh_error
    return no_mesh_error(cm, fixed)


def _infeasible(cm: CostModel, run: _Run, fixed: dict | None = None) -> AutoparError:
    """Nothing fits in memory: the most frugal plan tried and the smallest changes that fit
    (:func:`autopar.search.diagnose.infeasible_error`)."""
    from .diagnose import infeasible_error
    return infeasible_error(cm, run.smallest, fixed or {}, run.deadline)

