"""Per-block recomputation chosen by OR-Tools CP-SAT under each pipeline rank's memory.

Not the search's own solver (that is :func:`autopar.search.cuts.rank_recompute`, exact, with
every layer's transient and the optimizer step's temporaries, which this model leaves out): a
CP-SAT formulation kept for its determinism test. Given a resolved configuration, choose for
every decoder block one of ``modes`` (any of :data:`autopar.config.RECOMPUTE_MODES`; by default
none / selective / full) so as to minimise the pipelined step time
``m * max_i t_i + (sum_i t_i - max_i t_i) / v`` (see :mod:`autopar.cost.model`) subject to every
rank's peak memory fitting the GPU. Identical blocks on a rank are interchangeable, so the model
uses one integer per (rank, block signature, mode) counting how many blocks take that mode
instead of one boolean per block: repeated layers are solved once.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from ortools.sat.python import cp_model

from ..config import ParallelConfig
from ..cost.model import CostModel

MODES = ("none", "selective", "full")
_US = 1e6       # time unit of the integer model: microseconds (keeps sums far below 2**63)
_KIB = 1024.0   # memory unit: KiB (rounded against us: activations up, budget down)


def solve_recompute(cm: CostModel, c: ParallelConfig, *, time_limit_s: float = 5.0,
                    workers: int = 1, modes: tuple[str, ...] = MODES) -> tuple[str, ...] | None:
    """Per-block recompute modes for the resolved config ``c``, or None if none fits.

    Args:
        cm: the cost model (supplies per-block costs and per-rank layouts).
        c: a resolved configuration (its own ``recompute`` field is ignored).
        time_limit_s: CP-SAT wall-clock limit.
        workers: CP-SAT search workers; 1 keeps the search deterministic.
        modes: the modes blocks may take, weakest first ("none", a partial mode, "full").

    Returns:
        One mode per decoder block in model order, or None when even full recomputation of
        every block does not fit.
    """
    layout = cm.stage_layout(c)
    m = cm.train.global_batch_size // (c.dp * c.micro_batch_size)
    v = c.virtual_stages
    p = cm.params
    limit = cm.device.visible_memory_bytes
    reserved = limit - p.usable_memory(limit)
    if any(_fixed_memory(cm, c, st, reserved) > limit for st in layout):
        return None   # a rank's states and fixed layers alone exceed the GPU (no model needed)
    model = cp_model.CpModel()
    rank_time = []
    horizons: list[int] = []
    groups: list[tuple[int, str, list[int], dict]] = []  # (rank, sig, block indices, vars)
    for rank, st in enumerate(layout):
        fixed_time = st.p2p_s
        fixed_mem = _fixed_memory(cm, c, st, reserved)
        by_sig: OrderedDict[str, list[int]] = OrderedDict()
        for li in st.layers:
            layer = cm.graph.layers[li]
            if layer.kind == "block":
                by_sig.setdefault(layer.signature, []).append(li)
            else:
                bc = cm.block_cost(li, "none", c)
                fixed_time += bc.fwd_s + bc.bwd_s
        time_terms, mem_terms = [], []
        transient = 0.0
        any_rc = model.NewBoolVar(f"rc{rank}")
        for gi, (sig, idx) in enumerate(by_sig.items()):
            n = {mode: model.NewIntVar(0, len(idx), f"n{rank}_{gi}_{mode}") for mode in modes}
            model.Add(sum(n.values()) == len(idx))
            model.Add(sum(n[x] for x in modes if x != "none") <= len(idx) * any_rc)
            for mode in modes:
                bc = cm.block_cost(idx[0], mode, c)
                time_terms.append(round((bc.fwd_s + bc.bwd_s) * _US) * n[mode])
                mem_terms.append(math.ceil(bc.act_bytes * st.flight / _KIB) * n[mode])
                transient = max(transient, bc.transient_bytes)
            groups.append((rank, sig, idx, n))
        budget = math.floor((limit - fixed_mem) / _KIB)
        if budget < 0:
            return None
        model.Add(sum(mem_terms) + math.ceil(transient / _KIB) * any_rc <= budget)
        horizon = round(fixed_time * _US) + sum(
            len(idx) * round(max(cm.block_cost(idx[0], mode, c).fwd_s
                                 + cm.block_cost(idx[0], mode, c).bwd_s for mode in modes) * _US)
            for _r, _s, idx, _n in groups if _r == rank)
        horizons.append(horizon)
        t = model.NewIntVar(0, horizon, f"t{rank}")
        model.Add(t == round(fixed_time * _US) + sum(time_terms))
        rank_time.append(t)
    t_max = model.NewIntVar(0, max(1, sum(horizons)), "tmax")
    model.AddMaxEquality(t_max, rank_time)
    # v * T_pipe = (m v - 1) * t_max + sum_i t_i : minimising it minimises the step time
    model.Minimize((m * v - 1) * t_max + sum(rank_time))
    solver = cp_model.CpSolver()
    # a deterministic work limit (not wall-clock) keeps the answer independent of machine load
    solver.parameters.max_deterministic_time = float(time_limit_s)
    solver.parameters.num_search_workers = workers
    solver.parameters.random_seed = 0
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    chosen = {}
    for _rank, _sig, idx, n in groups:
        counts = {mode: solver.Value(n[mode]) for mode in modes}
        order = [x for x in reversed(modes) for _ in range(counts[x])]  # strongest first
        for li, mode in zip(idx, order):
            chosen[li] = mode
    return tuple(chosen[li] for li in cm.blocks)


def _fixed_memory(cm: CostModel, c: ParallelConfig, st, reserved: float) -> float:
    """Bytes a pipeline rank holds whatever its blocks recompute: model states, the reserve,
    ZeRO-3's gathered layers and the activations of its non-block layers (embedding, head)."""
    fixed_mem = sum(st.states) + reserved + st.gather_bytes
    for li in st.layers:
        if cm.graph.layers[li].kind != "block":
            fixed_mem += cm.block_cost(li, "none", c).act_bytes * st.flight_of(li)
    return fixed_mem
