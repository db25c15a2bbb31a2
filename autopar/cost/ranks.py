"""Which graph layers each pipeline rank holds, and how many parameter elements they are on one
rank after tensor and expert sharding (:class:`RankLayers`, cached per mesh)."""

from __future__ import annotations

from ..graph.types import ModelGraph
from . import memory as mem
from .pipeline.orders import V_SHAPED, stage_rank
from .stages import chunk_layers


class RankLayers:
    """Layers and parameter counts per pipeline rank of one graph.

    Args:
        graph: the model graph.
        blocks: graph indices of its decoder blocks, in model order.
    """

    def __init__(self, graph: ModelGraph, blocks: tuple[int, ...]):
        self.graph, self.blocks = graph, blocks
        self._rank_layers: dict[tuple, tuple] = {}
        self._params: dict[tuple, float] = {}
        self._layer_params: dict[tuple, float] = {}

    def rank_layers(self, pp: int, stage_blocks: tuple[int, ...],
                    schedule: str = "1f1b") -> tuple[tuple, ...]:
        """Per pipeline rank: (layer indices, chunk indices, groups) where groups lists
        (representative layer index, count, is_block) per distinct layer signature (cached).
        Chunk ``ci`` runs on rank ``ci % pp``, or in a V for the V-shaped schedules
        (:func:`autopar.cost.pipeline.orders.stage_rank`)."""
        key = (pp, stage_blocks, schedule in V_SHAPED)
        hit = self._rank_layers.get(key)
        if hit is not None:
            return hit
        g = self.graph
        chunks = chunk_layers(len(g.layers), list(self.blocks), stage_blocks)
        out = []
        for rank in range(pp):
            mine = tuple(ci for ci in range(len(chunks))
                         if (stage_rank(ci, pp, schedule) if pp > 1 else 0) == rank)
            layers = tuple(i for ci in mine for i in chunks[ci])
            groups: dict[str, list] = {}
            for i in layers:
                entry = groups.setdefault(g.layers[i].signature, [i, 0])
                entry[1] += 1
            out.append((layers, mine, tuple((i, n) for i, n in groups.values()), chunks))
        self._rank_layers[key] = tuple(out)
        return self._rank_layers[key]

    def rank_params(self, tp: int, ep: int, layers: tuple[int, ...],
                     etp: int | None = None) -> tuple[float, float]:
        """(all, expert) parameter elements on a rank holding ``layers`` (cached); ``etp``:
        expert tensor parallelism (None = tp)."""
        etp = None if etp == tp else etp
        key = (tp, ep, layers, etp)
        hit = self._params.get(key)
        if hit is None:
            g = self.graph
            # the shared parameters are the embedding table (a tied head's weight, an MTP
            # block's lookup): stored once per rank, by the embedding layer when it is here,
            # else by the first layer here that uses them (the copy Megatron-Core keeps)
            table_here = any(g.layers[i].kind == "embedding" for i in layers)
            total = 0.0
            for i in layers:
                shared = g.layers[i].shared_parameters > 0
                total += self.layer_params_per_rank(i, tp, not (shared and table_here), ep, etp)
                table_here = table_here or shared
            experts = sum(mem.expert_params_per_rank(g.layers[i], tp, ep, etp) for i in layers)
            hit = self._params[key] = (total, experts)
        return hit

    def layer_params_per_rank(self, index: int, tp: int, count_shared: bool, ep: int,
                               etp: int | None = None) -> float:
        """:func:`autopar.cost.memory.layer_params_per_rank` of graph layer ``index``
        (cached: it walks the layer's ops)."""
        etp = None if etp == tp else etp
        key = (index, tp, count_shared, ep, etp)
        hit = self._layer_params.get(key)
        if hit is None:
            hit = self._layer_params[key] = mem.layer_params_per_rank(
                self.graph.layers[index], tp, count_shared=count_shared, ep=ep, etp=etp)
        return hit
