"""Lower bounds on a configuration's step time that let the search skip work: per mesh group
(:func:`lower_bound`, :func:`compute_sum`, used to visit groups best first) and per resolved
configuration under any recomputation (:func:`compute_bound`, :func:`recompute_free_bound`,
combined by :func:`beyond`). Each is admissible: never above the step time an estimate gives
(tests/test_search_bounds.py, tests/test_search_speed_caches.py).
"""

from __future__ import annotations

import math
import weakref

from ..config import ParallelConfig
from ..cost.blocks import block_cost_fields
from ..cost.model import CostModel
from ..errors import InvalidParallelConfig


#: Per cost model: :func:`layer_sum` by the configuration fields the layers' costs read
#: (:data:`autopar.cost.blocks.block_cost_fields`): a group's bound, phase 1's CP mode and
#: refine's skip test ask for the same sums.
_LAYER_SUMS: "weakref.WeakKeyDictionary[CostModel, dict]" = weakref.WeakKeyDictionary()
#: Per cost model: :func:`_signature_counts`.
_SIGNATURE_COUNTS: "weakref.WeakKeyDictionary[CostModel, list]" = weakref.WeakKeyDictionary()


def layer_sum(cm: CostModel, c: ParallelConfig) -> float:
    """Sum over all layers of one micro-batch's forward + backward without recomputation
    (without the expert-parallel all-to-alls where the framework can hide them, see
    :attr:`autopar.frameworks.FrameworkProfile.overlaps_ep_comm`), once per cost model and
    set of the fields the layers' costs read."""
    memo = _LAYER_SUMS.get(cm)
    if memo is None:
        memo = _LAYER_SUMS[cm] = {}
    key = block_cost_fields(c)
    if key not in memo:
        memo[key] = _layer_sum(cm, c)
    return memo[key]


def _signature_counts(cm: CostModel) -> list:
    """[first layer index, count] per layer signature of ``cm``'s graph, in first-seen order
    (layers of one signature cost the same), once per cost model."""
    got = _SIGNATURE_COUNTS.get(cm)
    if got is None:
        counts: dict[str, list] = {}
        for layer in cm.graph.layers:
            counts.setdefault(layer.signature, [layer.index, 0])[1] += 1
        got = _SIGNATURE_COUNTS[cm] = list(counts.values())
    return got


def _layer_sum(cm: CostModel, c: ParallelConfig) -> float:
    """:func:`layer_sum`, computed."""
    total = 0.0
    hide = c.ep > 1 and bool(cm.profile.overlaps_ep_comm)
    for li, n in _signature_counts(cm):
        bc = cm.block_cost(li, "none", c)
        total += n * (bc.fwd_s + bc.bwd_s - (bc.ep_s if hide else 0.0))
    return total


def lower_bound(cm: CostModel, c: ParallelConfig) -> float:
    """Lower bound on the step time of any completion of the resolved config ``c``."""
    m = cm.train.global_batch_size // (c.dp * c.micro_batch_size)
    return m * layer_sum(cm, c) / c.pp


def compute_sum(cm: CostModel, c: ParallelConfig) -> float:
    """Sum over all layers of one micro-batch's forward + backward compute (no communication,
    no recomputation): at most :func:`layer_sum` (which adds non-negative collective times
    to the same per-layer compute), and independent of placement and CP mode."""
    total = 0.0
    for li, n in _signature_counts(cm):
        lt = cm.layer_time(li, c.micro_batch_size, c.tp, c.cp, c.sequence_parallel)
        total += n * (lt.fwd_s + lt.bwd_s)
    return total


#: Relative margin by which a lower bound must exceed the bar before a configuration is skipped
#: (covers the rounding of ``step - dp_exposed`` and of the closed-form/simulated pipeline
#: switch; far above float noise, far below any difference the search acts on).
BOUND_RTOL = 1e-6


def recompute_free_bound(cm: CostModel, c: ParallelConfig) -> float:
    """Lower bound (seconds) on the step time of the resolved config ``c`` under any
    recomputation: the pipelined time without recomputation plus the optimizer step.

    Recomputation only adds time to a block (its recomputed forward, and the repeated TP
    collectives under full recomputation: :meth:`CostModel.block_cost`), the pipeline is
    monotone in every stage duration (closed form of Narayanan et al. 2021, section 2.2, and
    the max-plus event simulation of :func:`autopar.cost.pipeline.schedule.simulate_pipeline`), exposed
    DP communication and the slowdown of the compute it overlaps are >= 0 and the optimizer
    step does not depend on recomputation. So ``step(none) - dp_cost(none)`` (``dp_cost``:
    exposed DP seconds plus that slowdown) bounds ``step(any recompute)`` from below. It costs the
    time part of one estimate (:meth:`CostModel.step_without_dp_s`) where :func:`evaluate`
    costs :func:`best_recompute` and an estimate. -inf when the configuration cannot be
    estimated (the caller then evaluates it).
    """
    try:
        return cm.step_without_dp_s(c if c.recompute == "none" else c.replace(recompute="none"))
    except InvalidParallelConfig:
        return -math.inf


def compute_bound(cm: CostModel, c: ParallelConfig) -> float:
    """Lower bound (seconds) on the step time of the resolved config ``c`` under any
    recomputation: ``m`` times the busiest pipeline rank's forward + backward per micro-batch
    without recomputation, the exposed TP and CP collectives included
    (:meth:`CostModel.block_cost`), the expert all-to-alls (which a schedule may hide) and
    pipeline sends left out. Each of the ``m``
    micro-batches passes every rank once and a rank runs its work one piece after another, so
    the pipelined time is at least this (Narayanan et al. 2021, section 2.2: ``m * max_i t_i``
    is the steady state). Cheaper than :func:`recompute_free_bound`: cached per-layer costs
    only, no estimate."""
    m = cm.train.global_batch_size // (c.dp * c.micro_batch_size)
    busiest = 0.0
    # the ranks as the schedule lays the chunks (a V for ZBV / DualPipeV): the round-robin
    # layout put other chunks together, and its busiest rank could exceed the step time
    for _layers, _chunks, groups, _all in cm.rank_layers(c.pp, c.stage_blocks, c.schedule):
        rank = 0.0
        for li, n in groups:
            bc = cm.block_cost(li, "none", c)
            rank += n * (bc.fwd_s + bc.bwd_s - bc.ep_s)
        busiest = max(busiest, rank)
    return m * busiest


def beyond(run, c: ParallelConfig, bar: float) -> tuple[bool, float]:
    """(True, bound) when no recomputation can bring the resolved ``c`` to ``bar`` seconds
    or below (:func:`compute_bound`, then :func:`recompute_free_bound`), so evaluating it
    cannot change the result; (False, bound) otherwise (bound -inf when not computed: ``bar``
    is inf). ``run``: the search's :class:`autopar.search.phases.Run` (its cost model and its
    cache of recomputation-free bounds)."""
    if not math.isfinite(bar):
        return False, -math.inf
    base = c.fields_except(*_NOT_IN_FREE_BOUND)
    # compute_bound reads none of those fields either (no ZeRO stage, recomputation "none")
    lb = run.free_bounds.get(base)
    if lb is None:
        lb = run.free_bounds[base] = compute_bound(run.cm, c)
    if lb > bar * (1 + BOUND_RTOL):
        return True, lb
    key = (base, min(c.zero_stage, 1))
    lb = run.free_bounds.get(key)
    if lb is None:
        lb = run.free_bounds[key] = recompute_free_bound(run.cm, c)
    return lb > bar * (1 + BOUND_RTOL), lb


#: Fields of a configuration that :func:`recompute_free_bound` does not read (it prices no
#: recomputation and no exposed DP traffic), or reads only as "ZeRO-0 or not": the pipelined
#: time does not depend on them (:meth:`CostModel.step_without_dp_s`) and the optimizer step
#: updates ``params / (dp * cp)`` elements under every ZeRO stage >= 1 (Rajbhandari et al.
#: 2020: the optimizer states are sharded from stage 1 on), all ``params`` under ZeRO-0. So
#: :func:`beyond` computes the bound once for ZeRO-0 and once for stages 1-3 of a
#: configuration; the stages' values differ by rounding only (``step - dp_exposed`` with
#: different ``dp_exposed``, the sharded-DP copies counted in it), far inside
#: :data:`BOUND_RTOL` (tests/test_search_speed_caches.py).
_NOT_IN_FREE_BOUND = ("zero_stage", "recompute", "reshard_after_forward")
