"""The (mesh, micro-batch, SP, EP) groups of a search, best first by a lower bound on their
step time (:func:`mesh_groups`, :class:`MeshGroups`)."""

from __future__ import annotations

import heapq
import itertools
import math

from ..config import ParallelConfig
from ..cost.model import CostModel
from ..errors import InvalidParallelConfig
from ..hardware.collectives import layout_of
from . import space
from .bounds import compute_sum, layer_sum


class MeshGroups:
    """The (mesh, micro-batch, SP, EP) groups of a search, best first by their lower bound
    (:func:`lower_bound`, least over placements and CP modes), as (bound, tie-break key, base
    fields).

    The order is that of sorting every group by (bound, key), but a group's bound is computed
    only when it could come next: groups wait in a heap under a cheaper bound that never
    exceeds it (:func:`compute_sum` in place of :func:`layer_sum`); the least entry is
    replaced by its own bound until the least one is exact (best-first search with an
    admissible estimate, Hart, Nilsson and Raphael 1968). A search that stops at a bar never
    prices the groups beyond it. ``len()`` counts the groups with a valid configuration.
    """

    def __init__(self, cm: CostModel, fixed: dict, entries: list):
        self._cm, self._fixed, self._entries = cm, fixed, entries
        self._sums: dict[tuple, float] = {}
        self._layouts: dict[tuple, tuple] = {}

    def _bound(self, base: dict, modes: tuple[str, ...]) -> float:
        """The group's bound: least :func:`lower_bound` over placements and CP modes, each
        :func:`layer_sum` shared by configurations whose layers cost the same:
        :meth:`CostModel.block_cost` depends on the configuration only through tp, cp, SP,
        micro-batch, CP mode, ep and the TP, CP and EP process groups, and a group's collective
        times and link class only through where its ranks sit
        (:func:`autopar.hardware.collectives.layout_of`, what
        :meth:`autopar.hardware.Cluster.collective_time` prices), not on dp, pp or the
        placement as such. Where the ranks sit depends on the mesh and placement only
        (:meth:`CostModel.group`), so it is found once per (mesh, ep, placement) and a
        configuration is built and resolved only for a new layer sum (resolving keeps the
        degrees, micro-batch, SP, CP mode and a given placement)."""
        cm = self._cm
        per_node = cm.cluster.gpus_per_node
        tp, cp, pp, dp, ep = (base[k] for k in ("tp", "cp", "pp", "dp", "ep"))
        etp, disp = base.get("expert_tp"), base.get("dispatcher")
        b, sp = base["micro_batch_size"], base["sequence_parallel"]
        # the all-gather dispatcher's collectives run over the expert-TP x EP group
        dims = ("tp", "cp", "ep", "etp") + (("tpep",) if disp == "allgather" else ())
        m = cm.train.global_batch_size // (dp * b)
        best = math.inf
        for placement in space.placements(base, self._fixed, self._cm.profile):
            mesh = (tp, cp, dp, pp, ep, etp, placement, len(dims))
            where = self._layouts.get(mesh)
            if where is None:
                c0 = ParallelConfig(**base, placement=placement, cp_mode=modes[0])
                where = self._layouts[mesh] = tuple(
                    layout_of(cm.group(d, c0).ranks, per_node) for d in dims)
            for mode in modes:
                key = (tp, cp, sp, b, mode, ep, etp, disp, *where)
                total = self._sums.get(key)
                if total is None:
                    c = cm.resolve(ParallelConfig(**base, placement=placement, cp_mode=mode))
                    total = self._sums[key] = layer_sum(cm, c)
                best = min(best, m * total / pp)
        return best

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        heap = [(cheap, key, False, i) for i, (cheap, key, _base, _modes)
                in enumerate(self._entries)]
        heapq.heapify(heap)
        while heap:
            bound, key, exact, i = heapq.heappop(heap)
            _cheap, _key, base, modes = self._entries[i]
            if exact:
                yield bound, key, base
                continue
            heapq.heappush(heap, (self._bound(base, modes), key, True, i))


def mesh_groups(cm: CostModel, fixed: dict, limits) -> MeshGroups:
    """Every (mesh, micro-batch, SP, EP) group with a valid configuration, best first by a
    lower bound on its step time (:class:`MeshGroups`; a rank placement never makes a
    configuration invalid, so validity is checked over CP modes only)."""
    train, g = cm.train, cm.graph
    profile = cm.profile
    entries = []
    for tp, cp, pp, dp in space.meshes(g, cm.cluster, train, fixed, limits, profile):
        sps = space.sequence_parallel_options(tp, fixed, profile, train.seq_len, cp,
                                              moe=g.num_experts > 0)
        for b, sp, (ep, etp) in itertools.product(
                space.micro_batches(train, dp, fixed, limits, pp), sps,
                space.expert_options(g, tp, cp, dp, fixed, profile,
                                     cm.cluster.gpus_per_node)):
            if limits.max_dims is not None and sum(
                    1 for d in (tp, cp, pp, dp, ep) if d > 1) > limits.max_dims:
                continue   # more parallel dimensions than the search allows
            for disp in space.dispatchers(ep, fixed, profile):
                base = dict(tp=tp, cp=cp, pp=pp, dp=dp, micro_batch_size=b,
                            sequence_parallel=sp, ep=ep, expert_tp=etp, dispatcher=disp,
                            recompute_modules=fixed.get("recompute_modules"))
                placement = space.placements(base, fixed, profile)[0]
                modes, c = [], None
                for mode in space.cp_modes(g, base, fixed, profile):
                    try:
                        c = cm.resolve(ParallelConfig(**base, placement=placement,
                                                      cp_mode=mode))
                    except InvalidParallelConfig:
                        continue
                    modes.append(mode)
                if modes:
                    m = train.global_batch_size // (dp * b)
                    entries.append((m * compute_sum(cm, c) / pp,
                                    (tp, cp, pp, dp, b, sp, ep, etp or 0, disp), base,
                                    tuple(modes)))
    return MeshGroups(cm, fixed, entries)
