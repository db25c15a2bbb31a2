"""What one pipeline rank's recomputation choice reads of the cost model: the per-rank problem
that both per-rank solvers take (the exact enumeration of :mod:`autopar.search.rank_dp` and
the CP-SAT model of :mod:`autopar.search.recompute`; :func:`autopar.search.cuts.rank_recompute`
chooses between them).

A rank's blocks each take one of the recompute modes the framework runs. Identical blocks (one
layer signature) are interchangeable in the cost model (:meth:`CostModel.estimate` prices a
rank by (signature, mode) counts), so the problem is one count per (signature, mode). The rank's
time is its fixed layers' and pipeline sends' plus the sum of its blocks' forward + backward;
its peak memory is what :meth:`CostModel.estimate` counts: fixed bytes (states, reserve, ZeRO-3
gathers, cuBLAS workspaces, non-block activations), the blocks' activations times the in-flight
multiplier, and the largest transient of any of its layers; the optimizer step's temporaries
must fit beside the states.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

from ..config import RECOMPUTE_MODES, ParallelConfig
from ..cost.blocks import block_cost_fields
from ..cost.memory import cublas_workspace_bytes
from ..cost.model import CostModel, StageLayout

#: Every recompute mode, weakest first (:data:`autopar.config.RECOMPUTE_MODES`): the default of
#: ``allowed``; the search passes the target framework's own subset.
MODES = RECOMPUTE_MODES
#: Position of each mode in :data:`MODES` (higher: recomputes more).
STRENGTH = {m: i for i, m in enumerate(RECOMPUTE_MODES)}


def slots(allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The modes of ``allowed`` in :data:`autopar.config.RECOMPUTE_MODES` order, weakest first
    (the order of the counts both solvers work with)."""
    return tuple(m for m in RECOMPUTE_MODES if m in allowed)


@dataclass(frozen=True)
class RankCosts:
    """One rank's recomputation problem.

    Attributes:
        fixed_bytes: bytes that do not depend on recomputation (states, reserve, ZeRO-3
            gathers, non-block activations times their in-flight multiplier).
        fixed_s: seconds per micro-batch likewise (pipeline sends, non-block layers).
        floor_bytes: the largest transient of the rank's non-block layers.
        by_sig: graph layer indices of the rank's decoder blocks, per signature (model order).
        sigs: per signature (blocks, {mode: seconds}, {mode: activation bytes x in-flight},
            {mode: transient bytes}), in ``by_sig`` order.
        step_fits: whether the optimizer step's temporaries fit beside the states.
        limit_bytes: the GPU's memory as the framework sees it.
        derived: what the solvers derive from ``floor_bytes`` and ``sigs`` alone (the caps,
            each cap's mode chains and hulls), kept by them and shared by every rank problem
            built from the same layers' costs (:func:`rank_costs`): ranks of a search differ
            mostly in their fixed bytes and budget. Not part of equality.
    """

    fixed_bytes: float
    fixed_s: float
    floor_bytes: float
    by_sig: OrderedDict
    sigs: list
    step_fits: bool
    limit_bytes: float
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def budget_bytes(self) -> float:
        """Bytes left for the blocks' activations and the largest transient."""
        return self.limit_bytes - self.fixed_bytes

    def caps(self) -> tuple[float, ...]:
        """Candidate values of the rank's largest transient: the non-block layers' and each
        (signature, mode)'s above it, rising."""
        got = self.derived.get("caps")
        if got is None:
            floor = self.floor_bytes
            got = self.derived["caps"] = tuple(sorted(
                {floor} | {tr for _k, _t, _a, trs in self.sigs for tr in trs.values()
                           if tr > floor}))
        return got

    def modes_of(self, by_mode) -> dict[int, str]:
        """Mode by graph layer index of each block, from ``by_mode`` ({mode: count} per
        signature): the strongest modes on the first blocks of each signature."""
        out: dict[int, str] = {}
        for idx, n in zip(self.by_sig.values(), by_mode):
            order = [m for m in reversed(RECOMPUTE_MODES) for _ in range(n.get(m, 0))]
            out.update(zip(idx, order))
        return out


#: Per cost model: what :func:`rank_costs` reads of the layers of a rank, by the configuration
#: fields :meth:`CostModel.block_cost` keys on, the rank's layers and in-flight multiplier and
#: the modes (a rank's ZeRO stage and states change none of it).
_LAYER_COSTS: "weakref.WeakKeyDictionary[CostModel, dict]" = weakref.WeakKeyDictionary()


def _layer_costs(cm: CostModel, c: ParallelConfig, st: StageLayout, modes: tuple[str, ...]):
    """(per non-block layer (activation bytes x in-flight, forward + backward seconds), the
    largest non-block transient in bytes, block indices per signature, per signature (blocks,
    {mode: seconds}, {mode: activation bytes x in-flight}, {mode: transient bytes}), the
    solvers' :attr:`RankCosts.derived` of them) of one rank, cached per cost model
    (:data:`_LAYER_COSTS`)."""
    memo = _LAYER_COSTS.get(cm)
    if memo is None:
        memo = _LAYER_COSTS[cm] = {}
    key = (c.tp, c.cp, c.dp, c.pp, c.micro_batch_size, c.sequence_parallel, c.cp_mode,
           c.placement, c.ep, c.expert_tp, c.dispatcher, c.recompute_modules, st.layers,
           st.flight, st.edge_flight, modes)
    hit = memo.get(key)
    if hit is not None:
        return hit
    layers = cm.graph.layers
    fixed = []
    floor = 0.0
    by_sig: OrderedDict[str, list[int]] = OrderedDict()
    for li in st.layers:
        if layers[li].kind == "block":
            by_sig.setdefault(layers[li].signature, []).append(li)
        else:
            bc = cm.block_cost(li, "none", c)
            fixed.append((bc.act_bytes * st.flight_of(li), bc.fwd_s + bc.bwd_s))
            floor = max(floor, bc.transient_bytes)
    costs = []
    fields = block_cost_fields(c)
    for sig, idx in by_sig.items():
        # per signature and configuration fields, shared by the ranks and layouts that hold it
        skey = ("sig", sig, fields, modes)
        per = memo.get(skey)
        if per is None:
            bcs = {mode: cm.block_cost(idx[0], mode, c) for mode in modes}
            per = memo[skey] = ({m: b.fwd_s + b.bwd_s for m, b in bcs.items()},
                                {m: b.act_bytes for m, b in bcs.items()},
                                {m: b.transient_bytes for m, b in bcs.items()})
        secs, acts, trans = per
        costs.append((len(idx), secs, {m: a * st.flight for m, a in acts.items()}, trans))
    # the solvers' derived data reads the costs' values only: ranks of other layers with the
    # same values (another stretch of identical blocks) share it
    sigs = costs_key(costs)
    derived = memo.setdefault(("derived", floor, modes, sigs), {"key": sigs})
    hit = memo[key] = (tuple(fixed), floor, by_sig, costs, derived)
    return hit


def costs_key(costs: list) -> tuple:
    """The per-signature costs of :attr:`RankCosts.sigs` as a hashable key (blocks, then each
    mode's seconds, activation and transient bytes): what a rank's problem reads of its layers,
    not their indices."""
    return tuple((k, tuple(t.items()), tuple(a.items()), tuple(tr.items()))
                 for k, t, a, tr in costs)


def rank_costs(cm: CostModel, c: ParallelConfig, st: StageLayout,
               modes: tuple[str, ...]) -> RankCosts:
    """The recomputation problem of the rank laid out as ``st`` under the resolved ``c``, its
    blocks taking the modes ``modes`` (weakest first, :func:`slots`)."""
    fixed, floor, by_sig, costs, derived = _layer_costs(cm, c, st, modes)
    states = sum(st.states)
    # torch's cuBLAS workspaces, held through the whole step (autopar.cost.rank_memory)
    workspace = cublas_workspace_bytes(cm.device.architecture)
    fixed_mem = states + cm.reserved_bytes + st.gather_bytes + workspace
    fixed_time = st.p2p_s
    for act, time in fixed:
        fixed_mem += act
        fixed_time += time
    # CostModel.estimate: the step's temporaries replace the activations at the step's peak
    limit = cm.device.visible_memory_bytes
    step_fits = (states + cm.reserved_bytes + cm.optimizer_step_bytes(c, st.params) + workspace
                 <= limit)
    return RankCosts(fixed_mem, fixed_time, floor, by_sig, costs, step_fits, limit, derived)
