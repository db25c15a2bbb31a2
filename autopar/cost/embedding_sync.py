"""The all-reduce that keeps the copies of the embedding table equal across pipeline stages.

A pipeline rank that uses the embedding table without holding the embedding layer (a tied LM
head, an MTP module's lookup: ``Layer.shared_parameters``, stored there as a copy by
:meth:`autopar.cost.ranks.RankLayers.rank_params`) computes a gradient for its copy that the
embedding's rank does not see, and the copies must take the same update. Megatron-Core sums
them once per step: ``finalize_model_grads`` (megatron/core/distributed/finalize_model_grads.py)
first finishes each model chunk's data-parallel reduction, then ``_allreduce_word_embedding_grads``
all-reduces the word embedding's ``main_grad`` over the embedding group (parallel_state.py: the
first and last pipeline ranks; with MTP the stage that runs it, "Embedding for MTP layers is in
the last virtual pipeline model parallel stage"), after the pipeline's last backward, so no
compute runs beside it. Priced the same for every framework: whatever keeps a copy has to sum
its gradient with the original's. A schedule that puts the embedding and its users on one rank
(DualPipe, the V-shaped schedules) has no copy and pays nothing.

Size: the table's elements on one rank (vocabulary-parallel: / tp) in the gradient buffer's
dtype (:attr:`autopar.frameworks.memory.MemoryConventions.grad_bytes`: Megatron's fp32
``main_grad``). Group: the ranks of the stages involved that share rank 0's other
coordinates, on the links they cross (:meth:`autopar.cost.groups.Groups.stages`).
"""

from __future__ import annotations

from ..config import ParallelConfig
from ..hardware.collectives import NO_LOAD, LinkLoad


class EmbeddingSync:
    """Seconds and link load of the embedding-copy all-reduce of a config (module docstring).

    Args:
        inputs: the cost model's :class:`autopar.cost.context.CostInputs`.
        groups: its :class:`autopar.cost.groups.Groups`.
        ranks: its :class:`autopar.cost.ranks.RankLayers`.
    """

    def __init__(self, inputs, groups, ranks):
        self.inputs, self.groups, self.ranks = inputs, groups, ranks
        self._memo: dict[tuple, tuple[float, LinkLoad]] = {}

    def cost(self, c: ParallelConfig) -> tuple[float, LinkLoad]:
        """(seconds, link load per GPU) of the all-reduce for the resolved config ``c``, once
        per step; (0, nothing) at pp = 1 or when no rank holds a copy."""
        if c.pp == 1:
            return 0.0, NO_LOAD
        key = (c.pp, c.stage_blocks, c.schedule, c.tp, c.cp, c.dp, c.ep, c.placement,
               c.expert_tp)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._cost(c)
        return hit

    def _cost(self, c: ParallelConfig) -> tuple[float, LinkLoad]:
        g = self.inputs.graph
        holders, copies, shared = [], [], 0
        for stage, (layers, *_rest) in enumerate(
                self.ranks.rank_layers(c.pp, c.stage_blocks, c.schedule)):
            used = [g.layers[i].shared_parameters for i in layers
                    if g.layers[i].shared_parameters > 0]
            if any(g.layers[i].kind == "embedding" for i in layers):
                holders.append(stage)
            elif used:
                copies.append(stage)
                shared = max(shared, *used)
        if not holders or not copies:
            return 0.0, NO_LOAD
        conv = self.inputs.conventions
        nbytes = shared / c.tp * (conv.grad_bytes or self.inputs.params.grad_bytes)
        group = self.groups.stages(c, tuple(sorted(holders + copies)))
        return group.time("all_reduce", nbytes), group.load("all_reduce", nbytes)
