"""The search's phases, as functions over one :class:`Run` (used by the driver in
:mod:`autopar.search.optimize` and by :mod:`autopar.search.diagnose`).

- :func:`autopar.search.groups.mesh_groups`: every (mesh, micro-batch, SP, EP) group with a
  lower bound on its step time, best first (re-exported here, as are the bounds of
  :mod:`autopar.search.bounds`).
- :func:`coarse` (phase 1): per group, every schedule, interleaving degree and ZeRO stage with
  the default placement, CP mode and balanced cuts.
- :func:`refine` (phase 2): per candidate, other placements, CP modes and stage cuts.
- :func:`first_fit`: phase 1 until one configuration fits (the diagnosis's probe).

Every rank's per-block recomputation goes through :func:`autopar.search.cuts.rank_recompute`
(CP-SAT where a rank's blocks differ and memory binds, deferred to the plans the search
returns: :func:`autopar.search.recompute.certify`); :attr:`Run.log` counts those solves.
"""

from __future__ import annotations

import math
import time
from typing import Callable

from ..config import V_SCHEDULES, ParallelConfig
from ..cost.model import CostModel
from ..cost.types import Estimate
from ..errors import AutoparError, InvalidParallelConfig
from ..frameworks import FrameworkProfile
from . import space
from .ranking import TIE_RTOL, better, kind_key, more_frugal, ranked
from .cuts import dp_cut, some_cut_fits
from .first_n import first_n_estimate
from .kept import dp_cost, keep_gathered
from .recompute import SolveLog
from .stages import best_recompute, cut_candidates
# the bounds and the groups live in their own modules; their names stay importable from here
from .bounds import (BOUND_RTOL, beyond, compute_bound, compute_sum, layer_sum,  # noqa: F401
                     lower_bound, recompute_free_bound)
from .groups import MeshGroups, mesh_groups  # noqa: F401

Progress = Callable[[str, int, int, "Estimate | None"], None]


class Run:
    """State of one search: the candidates kept, the bound to beat, the deadline.

    ``kept`` holds every fitting estimate by configuration; the bound to beat
    (:meth:`threshold`) is the step time of the ``top_k``-th fastest *kind* of plan
    (:func:`autopar.search.ranking.kind_key`), so runner-ups of other kinds are not pruned by
    placement variants of the best.
    """

    def __init__(self, cm: CostModel, time_limit_s: float | None, progress: Progress | None,
                 require_fit: bool, top_k: int):
        self.cm = cm
        self.profile: FrameworkProfile = cm.profile
        self.require_fit = require_fit
        self.top_k = max(1, top_k)
        self.deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        self.progress = progress
        self.kept: dict[ParallelConfig, Estimate] = {}
        self.smallest: Estimate | None = None   # most frugal seen, for infeasibility reports
        self.evaluated = 0
        self.complete = True
        self.best: Estimate | None = None
        self._kinds: list[tuple[float, tuple]] = []   # (fastest time, kind) of the top_k kinds
        self.groups_done = 0
        self.cut_memo: dict = {}   # stage-interval times shared by dp_cut calls
        # recompute_free_bound shared by ZeRO stages, and compute_bound by configuration less
        # its ZeRO and recompute fields (beyond)
        self.free_bounds: dict = {}
        self.layerwise = True      # per-block recompute and uneven cuts (SpaceLimits.layerwise)
        # the CP-SAT rank models solved (per-block recomputation): deferred to the plans
        # the search returns (autopar.search.recompute.certify)
        self.log = SolveLog(defer=True)

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
        """Step time (seconds) a candidate must reach to enter the top-k kinds: the k-th kind's
        time plus the tie tolerance (a tie may be simpler); inf until k kinds are kept."""
        if len(self._kinds) < self.top_k:
            return math.inf
        return self._kinds[self.top_k - 1][0] * (1 + TIE_RTOL)

    def _keep_kind(self, e: Estimate) -> None:
        kind = kind_key(e.config)
        for i, (t, k) in enumerate(self._kinds):
            if k == kind:
                if e.step_time_s >= t:
                    return
                del self._kinds[i]
                break
        self._kinds.append((e.step_time_s, kind))
        self._kinds.sort(key=lambda x: (x[0], repr(x[1])))
        del self._kinds[self.top_k:]

    def estimate(self, cfg: ParallelConfig) -> Estimate | None:
        """Estimate ``cfg`` and keep it; None when it is invalid or the target framework
        cannot run it (the search never returns such a plan)."""
        try:
            e = self.cm.estimate(cfg)
        except InvalidParallelConfig:
            return None
        if self.profile.unsupported(e.config, moe=self.cm.graph.num_experts > 0) is not None:
            return None
        self.evaluated += 1
        if self.smallest is None or more_frugal(e, self.smallest):
            self.smallest = e
        if e.fits or not self.require_fit:
            key = e.config   # frozen: equal fields, equal key (cheaper than its text)
            if key not in self.kept:
                self.kept[key] = e
                self._keep_kind(e)
            if self.best is None or better(e, self.best):
                self.best = e
        return e


def coarse(run: Run, base: dict, fixed: dict, limits, allowed) -> list:
    """Phase 1 for one group: every schedule and interleaving (:func:`space.schedule_options`)
    and ZeRO stage with the default placement, balanced cuts and the group's fastest CP mode
    (:func:`_group_cp_mode`). Returns (time, v, zero, config) for phase 2.

    A configuration whose :func:`recompute_free_bound` exceeds both the top-k bar
    (:meth:`Run.threshold`) and the phase-2 bar (``refine_within`` of the best so far) is not
    evaluated: it can neither enter the top-k nor be refined outside the exhaustive mode (the
    best only falls). It is returned with its bound as its time, which sorts it among the
    candidates phase 2 stops at; in the exhaustive mode phase 2 still refines it."""
    cm = run.cm
    blocks = max(cm.graph.num_blocks, 1)
    m = cm.train.global_batch_size // (base["dp"] * base["micro_batch_size"])
    placement = space.placements(base, fixed, run.profile)[0]
    mode = _group_cp_mode(cm, base, fixed, run.profile, placement)
    out = []
    if run.require_fit:
        # the group's most frugal variants (most recomputation, no interleaving, each ZeRO
        # stage: ZeRO-3's gathered layers can outweigh what it shards): when even they are
        # well over the GPU's memory under every stage cut, skip the whole group
        frugal = [run.estimate(ParallelConfig(
            **base, placement=placement, cp_mode=mode,
            virtual_stages=fixed.get("virtual_stages",
                                     2 if fixed.get("schedule") in V_SCHEDULES else 1),
            zero_stage=zero,
            recompute=allowed[-1], schedule=fixed.get("schedule"),
            stage_blocks=fixed.get("stage_blocks")))
            for zero in space.zero_options(base, fixed, run.profile)]
        frugal = [e for e in frugal if e is not None]
        if frugal and all(e.memory_per_gpu_bytes > 1.05 * cm.device.visible_memory_bytes
                          and not (run.layerwise
                                   and _uneven_cut_fits(run, e.config, fixed, allowed[-1:]))
                          for e in frugal):
            return out
    group = space.vp_group_option(base["pp"], m, fixed, run.profile)
    for schedule, v in space.schedule_options(base["pp"], blocks, m, fixed, limits, run.profile):
        for zero in space.zero_options(base, fixed, run.profile, schedule):
            if run.expired():
                return out
            cfg = ParallelConfig(**base, placement=placement, cp_mode=mode, virtual_stages=v,
                                 zero_stage=zero, schedule=schedule,
                                 stage_blocks=fixed.get("stage_blocks"),
                                 vp_group=group if v > 1 else None)
            try:
                c = cm.resolve(cfg)
            except InvalidParallelConfig:
                continue
            best = run.best.step_time_s if run.best is not None else math.inf
            skip, lb = beyond(run, c, max(run.threshold(), best * (1 + limits.refine_within)))
            if skip:
                out.append((lb, v, zero, c))
                continue
            e = evaluate(run, c, fixed, allowed)
            if (e is None or not e.fits) and v == 1 and "stage_blocks" not in fixed \
                    and run.layerwise:
                # the balanced cut does not fit: an uneven one may (fewer blocks where the
                # embedding, the head or more in-flight micro-batches take memory)
                cut = dp_cut(cm, c, allowed, run.cut_memo, run.log) if c.pp > 1 and some_cut_fits(
                    cm, c, allowed) else None
                if cut is not None and cut != c.stage_blocks:
                    e2 = evaluate(run, c.replace(stage_blocks=cut), fixed, allowed)
                    if e2 is not None and (e is None or e2.fits):
                        e, c = e2, c.replace(stage_blocks=cut)
            out.append((e.step_time_s if e is not None and (e.fits or not run.require_fit)
                        else math.inf, v, zero, c))
    return out


def _group_cp_mode(cm: CostModel, base: dict, fixed: dict, profile: FrameworkProfile,
                   placement: tuple) -> str:
    """The CP mode phase 1 costs a group under: of the legal modes
    (:func:`space.cp_modes`), the one whose layers take the least time per micro-batch
    (:func:`layer_sum`, the group bound's own figure, from cached layer costs), the first on a
    tie. Phase 2 tries the other modes only for the candidates phase 1 keeps, so a group
    judged by ring attention alone was dropped where Ulysses or the all-gather would have won."""
    modes = space.cp_modes(cm.graph, base, fixed, profile)
    if len(modes) == 1:
        return modes[0]
    sums = []
    for i, mode in enumerate(modes):
        try:
            c = cm.resolve(ParallelConfig(**base, placement=placement, cp_mode=mode))
        except InvalidParallelConfig:
            continue
        sums.append((layer_sum(cm, c), i, mode))
    return min(sums)[2] if sums else modes[0]


def refine(run: Run, c: ParallelConfig, fixed: dict, allowed) -> None:
    """Phase 2 for one candidate: other placements, CP modes and stage cuts; a variant whose
    :func:`recompute_free_bound` exceeds the top-k bar (:meth:`Run.threshold`) is not
    evaluated (it could not enter the top-k nor become the best)."""
    cm = run.cm
    base = dict(tp=c.tp, cp=c.cp, pp=c.pp, dp=c.dp, ep=c.ep)
    seen = set()
    for placement in space.placements(base, fixed, run.profile):
        placed = c.replace(placement=placement)
        links = tuple((d, cm.group(d, placed).link, cm.group(d, placed).ranks)
                      for d in ("tp", "cp", "dp", "pp"))
        if links in seen:  # same groups on the same links: the same estimate
            continue
        seen.add(links)
        for mode in space.cp_modes(cm.graph, c.__dict__, fixed, run.profile):
            cc = c.replace(placement=placement, cp_mode=mode)
            try:
                cc = cm.resolve(cc)
            except InvalidParallelConfig:
                continue
            if lower_bound(cm, cc) > run.threshold() * (1 + BOUND_RTOL):
                continue   # no cut or recomputation of this placement and mode can enter
            cuts = [cc.stage_blocks] if "stage_blocks" in fixed or not run.layerwise else \
                cut_candidates(max(cm.graph.num_blocks, 1), cc.pp * cc.virtual_stages)
            if "stage_blocks" not in fixed and cc.virtual_stages == 1 and cc.pp > 1 \
                    and run.layerwise:
                cut = dp_cut(cm, cc, allowed, run.cut_memo, run.log)
                if cut is not None and cut not in cuts:
                    cuts.append(cut)
            for cut in cuts:
                if run.expired():
                    return
                variant = cc.replace(stage_blocks=cut)
                if not beyond(run, variant, run.threshold())[0]:
                    evaluate(run, variant, fixed, allowed, keep=True)


def evaluate(run: Run, c: ParallelConfig, fixed: dict, allowed,
             keep: bool = False) -> Estimate | None:
    """Give each pipeline rank its fastest fitting recomputation and estimate the result;
    with ``keep`` (phase 2), also try ZeRO-3 blocks keeping their gathered parameters
    (:func:`autopar.search.kept.keep_gathered`)."""
    if "reshard_after_forward" in fixed:
        try:
            c = c.replace(reshard_after_forward=fixed["reshard_after_forward"])
        except InvalidParallelConfig:
            return None
    trail = None
    if "recompute" in fixed and isinstance(fixed["recompute"], tuple):
        modes = fixed["recompute"]
    else:
        # the ranks the enumeration answers in CP-SAT's place, for this plan's certificate
        run.log.trail = trail = []
        modes = best_recompute(run.cm, c, allowed, run.log)
        run.log.trail = None
    if modes is None:  # nothing fits: still estimated, for the infeasibility report
        return run.estimate(c.replace(recompute=allowed[-1]))
    rc = modes[0] if modes and len(set(modes)) == 1 else (modes or "none")
    if not isinstance(rc, str) and not (run.profile.per_block_recompute and run.layerwise):
        return _uniform_recompute(run, c, allowed)
    e = run.estimate(c.replace(recompute=rc))
    if e is not None and trail:
        run.log.used[e.config] = tuple(trail)
    if keep and e is not None and e.fits and c.zero_stage == 3 and c.dp * c.cp > 1 \
            and run.layerwise \
            and run.profile.per_block_reshard and dp_cost(e) > 0 \
            and not ("recompute" in fixed and isinstance(fixed["recompute"], tuple)) \
            and "reshard_after_forward" not in fixed:
        e = keep_gathered(run, e, modes, allowed)
    return e


def _uniform_recompute(run: Run, c: ParallelConfig, allowed) -> Estimate | None:
    """For frameworks with one recompute policy for all blocks: the fastest fitting one (the
    most frugal when none fits), Megatron-LM's first-N block recompute among them where the
    profile has it (:mod:`autopar.search.first_n`)."""
    results = [e for e in (run.estimate(c.replace(recompute=m)) for m in allowed)
               if e is not None]
    fitting = [e for e in results if e.fits]
    if results and not results[0].fits:
        # no recompute does not fit: Megatron-LM's block recompute of the fewest blocks may
        block = first_n_estimate(run, c, allowed)
        fitting += [block] if block is not None else []
    if fitting:
        return ranked(fitting)[0]
    return results[-1] if results else None




def _uneven_cut_fits(run: Run, c: ParallelConfig, fixed: dict, allowed) -> bool:
    """Whether some uneven stage cut of the resolved, non-interleaved ``c`` fits in memory
    (False when the cut is pinned or ``c`` has one stage)."""
    if "stage_blocks" in fixed or c.pp == 1 or c.virtual_stages != 1:
        return False
    return some_cut_fits(run.cm, c, allowed)


def first_fit(cm: CostModel, fixed: dict, deadline: float) -> Estimate | None:
    """A fitting estimate from phase 1 (groups best first), or None when none fits or the
    monotonic-clock ``deadline`` (seconds) passes."""
    run = Run(cm, None, None, True, 1)
    try:
        groups = mesh_groups(cm, fixed, space.SpaceLimits())
        allowed = space.recompute_modes(fixed, run.profile)
        for _bound, _key, base in groups:
            if run.best is not None or time.monotonic() > deadline:
                break
            coarse(run, base, fixed, space.SpaceLimits(), allowed)
    except AutoparError:
        return None
    return run.best
