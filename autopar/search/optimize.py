"""The search driver: enumerate meshes and choices, estimate, refine recomputation with CP-SAT.

1. Meshes (tp, cp, pp, dp) from :mod:`autopar.search.space`; a mesh whose most memory-frugal
   variant (ZeRO-3, full recompute, smallest micro-batch) does not fit is dropped at once.
2. For each micro-batch size, interleaving degree and ZeRO stage, uniform recompute modes are
   tried from cheapest to most frugal and the first that fits is kept (more recomputation only
   adds time).
3. The best candidates that needed recomputation get a per-block mix from CP-SAT
   (:mod:`autopar.search.recompute`), re-estimated by the same cost model.
Ties break on memory, then on the configuration's text, so the same input gives the same plan.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from ..config import ParallelConfig
from ..cost.model import CostModel
from ..cost.types import Estimate
from ..errors import AutoparError, InfeasibleError, InvalidParallelConfig
from . import space
from .recompute import solve_recompute

Progress = Callable[[str, int, int, "Estimate | None"], None]


@dataclass(frozen=True)
class SearchResult:
    """What a search found.

    Attributes:
        best: the fastest fitting estimate.
        top: up to ``top_k`` fitting estimates, fastest first (``top[0] is best``).
        pareto: fitting estimates not beaten in both step time and memory, by step time.
        evaluated: configurations estimated.
        meshes: meshes considered.
        wall_s: search wall time (seconds).
        complete: False when the time limit stopped the search early (best so far returned).
    """

    best: Estimate
    top: tuple[Estimate, ...]
    pareto: tuple[Estimate, ...]
    evaluated: int
    meshes: int
    wall_s: float
    complete: bool


def _key(e: Estimate):
    return (e.step_time_s, e.memory_per_gpu_bytes, repr(e.config))


class _Run:
    """State of one search: the candidates kept and the deadline."""

    def __init__(self, cm: CostModel, time_limit_s: float | None, progress: Progress | None,
                 require_fit: bool = True):
        self.cm = cm
        self.require_fit = require_fit
        self.deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        self.progress = progress
        self.fitting: dict[str, Estimate] = {}
        self.smallest: Estimate | None = None   # least memory seen, for infeasibility reports
        self.evaluated = 0
        self.complete = True
        self.best: Estimate | None = None

    def expired(self) -> bool:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.complete = False
            return True
        return False

    def estimate(self, cfg: ParallelConfig) -> Estimate | None:
        try:
            e = self.cm.estimate(cfg)
        except InvalidParallelConfig:
            return None
        self.evaluated += 1
        if self.smallest is None or e.memory_per_gpu_bytes < self.smallest.memory_per_gpu_bytes:
            self.smallest = e
        if e.fits or not self.require_fit:
            self.fitting[repr(e.config)] = e
            if self.best is None or _key(e) < _key(self.best):
                self.best = e
        return e


def search(cm: CostModel, fixed: dict | None = None, *, time_limit_s: float | None = None,
           top_k: int = 5, progress: Progress | None = None,
           limits: space.SpaceLimits | None = None, refine: int = 8,
           require_fit: bool = True) -> SearchResult:
    """Find the fastest configuration that fits, under the cost model ``cm``.

    Args:
        cm: cost model of the model, cluster and training config.
        fixed: choices to pin (keys of :data:`autopar.search.space.FIXABLE`).
        time_limit_s: stop after this many seconds and return the best so far.
        top_k: how many distinct plans to keep.
        progress: called as ``progress(stage, done, total, best_so_far)``.
        limits: bounds of the enumeration.
        refine: how many of the best recomputing candidates CP-SAT refines per block.
        require_fit: keep only configurations that fit in memory (False ranks everything by
            time: for judging published runs the memory model disagrees with).

    Raises:
        InvalidParallelConfig: ``fixed`` has unknown keys or bad values.
        InfeasibleError: nothing fits; the message names the binding constraint and a fix.
    """
    t0 = time.monotonic()
    fixed = space.check_fixed(fixed)
    limits = limits or space.SpaceLimits()
    run = _Run(cm, time_limit_s, progress, require_fit)
    g, train = cm.graph, cm.train
    meshes = space.meshes(g, cm.cluster, train, fixed, limits)
    if not meshes:
        raise _no_mesh(cm, fixed)
    blocks = max(g.num_blocks, 1)
    try:
        for i, (tp, cp, pp, dp) in enumerate(meshes):
            if progress:
                progress("meshes", i, len(meshes), run.best)
            if run.expired():
                break
            sps = [fixed["sequence_parallel"]] if "sequence_parallel" in fixed else [tp > 1]
            base = dict(tp=tp, cp=cp, pp=pp, dp=dp)
            for sp in sps:
                _search_mesh(run, base, sp, fixed, limits, blocks)
        if progress:
            progress("meshes", len(meshes), len(meshes), run.best)
        _refine(run, fixed, refine)
    except KeyboardInterrupt:
        # Ctrl-C: keep what was found; an empty result re-raises so the caller can stop
        if run.best is None:
            raise
        run.complete = False
    if run.best is None:
        raise _infeasible(cm, run)
    ranked = sorted(run.fitting.values(), key=_key)
    pareto, best_mem = [], math.inf
    for e in ranked:
        if e.memory_per_gpu_bytes < best_mem:
            pareto.append(e)
            best_mem = e.memory_per_gpu_bytes
    return SearchResult(best=ranked[0], top=tuple(ranked[:top_k]), pareto=tuple(pareto),
                        evaluated=run.evaluated, meshes=len(meshes),
                        wall_s=time.monotonic() - t0, complete=run.complete)


def _search_mesh(run: _Run, base: dict, sp: bool, fixed: dict, limits, blocks: int) -> None:
    train = run.cm.train
    dp = base["dp"]
    zeros = space.zero_options(dp, base["cp"], fixed)
    mbs_list = space.micro_batches(train, dp, fixed, limits)
    rcs = space.recompute_options(fixed)
    schedule = fixed.get("schedule")
    stage_blocks = fixed.get("stage_blocks")
    for b in mbs_list:
        if run.expired():
            return
        m = train.global_batch_size // (dp * b)
        # the most frugal variant of this micro-batch; if it does not fit, nothing larger will
        frugal = run.estimate(ParallelConfig(
            **base, sequence_parallel=sp, micro_batch_size=b, zero_stage=max(zeros),
            recompute=rcs[-1], virtual_stages=1 if "virtual_stages" not in fixed
            else fixed["virtual_stages"], schedule=schedule, stage_blocks=stage_blocks))
        if frugal is not None and not frugal.fits and run.require_fit:
            return
        for v in space.virtual_stage_options(base["pp"], blocks, m, fixed, limits):
            for zero in zeros:  # each stage overlaps its traffic differently: try all
                for rc in rcs:
                    e = run.estimate(ParallelConfig(
                        **base, sequence_parallel=sp, micro_batch_size=b, zero_stage=zero,
                        recompute=rc, virtual_stages=v, schedule=schedule,
                        stage_blocks=stage_blocks))
                    if e is not None and (e.fits or not run.require_fit):
                        break  # more recomputation only adds time


def _refine(run: _Run, fixed: dict, count: int) -> None:
    """CP-SAT per-block recompute for the best candidates that recomputed uniformly."""
    if "recompute" in fixed or count <= 0:
        return
    ranked = sorted(run.fitting.values(), key=_key)
    todo = [e for e in ranked if e.config.recompute != "none"][:count]
    for i, e in enumerate(todo):
        if run.expired():
            return
        if run.progress:
            run.progress("recompute", i, len(todo), run.best)
        modes = solve_recompute(run.cm, e.config, time_limit_s=2.0)
        if modes is None:
            continue
        if len(set(modes)) == 1:
            cfg = e.config.replace(recompute=modes[0])
        else:
            cfg = e.config.replace(recompute=modes)
        run.estimate(cfg)


def _no_mesh(cm: CostModel, fixed: dict) -> AutoparError:
    g, world = cm.graph, cm.cluster.world_size
    return InfeasibleError(
        f"no legal (tp, cp, pp, dp) for {world} GPUs with fixed={fixed}: tp must divide the "
        f"{g.attention_heads} heads and {g.kv_heads} KV heads and stay within a node of "
        f"{cm.cluster.gpus_per_node} GPUs, pp <= {g.num_blocks} blocks, and dp must divide the "
        f"global batch {cm.train.global_batch_size}. Fix: relax fixed=, or use a global batch "
        f"that is a multiple of more of the divisors of {world}.")


def _infeasible(cm: CostModel, run: _Run) -> AutoparError:
    e = run.smallest
    dev = cm.device
    usable = cm.params.usable_memory(dev.memory_bytes)
    states = 16 * cm.graph.num_parameters
    need = math.ceil(states / usable)
    if e is None:
        return InfeasibleError("no configuration could be evaluated; check fixed= choices.")
    return InfeasibleError(
        f"infeasible: no plan fits in {dev.memory_bytes / 1e9:.0f} GB per {dev.name}. The most "
        f"frugal configuration tried ({_short(e.config)}) needs "
        f"{e.memory_per_gpu_bytes / 1e9:.1f} GB per GPU. Model states alone are "
        f"{states / 1e9:.0f} GB (16 bytes per parameter with Adam), so at least {need} GPUs of "
        f"this kind are needed even with full sharding (got {cm.cluster.world_size}). Fix: use "
        f"more GPUs, a smaller micro-batch or sequence, or unpin fixed= choices.")


def _short(c: ParallelConfig) -> str:
    rc = c.recompute if isinstance(c.recompute, str) else "mixed"
    return (f"tp={c.tp} pp={c.pp} dp={c.dp} cp={c.cp} zero={c.zero_stage} recompute={rc} "
            f"mbs={c.micro_batch_size}")
