"""ZeRO-1: optimizer states sharded over the ranks holding the same weights.

Each parameter is owned by one rank of the group (parameters dealt out greedily, largest first,
to the rank owning the fewest elements so far: the partition of DeepSpeed's stage 1 and of
``torch.distributed.optim.ZeroRedundancyOptimizer``). The optimizer holds states only for the
owned parameters (1/N of the states); after the step each owner broadcasts its updated
parameters. Gradients are all-reduced beforehand (:func:`autopar.runtime.dp.allreduce_gradients`),
as ZeRO-1 specifies (a reduce-scatter would do; the all-reduce moves the same bytes per rank in a
ring, 2 (N-1)/N of the gradients).

``torch.distributed.optim.ZeroRedundancyOptimizer`` is not used because it broadcasts
``param.data``, which for tensor-parallel DTensor parameters is a DTensor, not a tensor a
collective can send; here the broadcast goes through each parameter's local shard.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn


def partition(params: list[nn.Parameter], ranks: int) -> list[int]:
    """The owner rank of each of ``params`` (greedy by local element count, ties by order).

    Deterministic: every rank computes the same owners from the same parameter order.
    """
    load = [0] * ranks
    owner = [0] * len(params)
    order = sorted(range(len(params)), key=lambda i: (-_local(params[i]).numel(), i))
    for i in order:
        r = min(range(ranks), key=lambda k: (load[k], k))
        owner[i] = r
        load[r] += _local(params[i]).numel()
    return owner


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class ShardedStates:
    """Optimizer over this rank's owned parameters, and the broadcasts that follow its step.

    Args:
        groups: (parameters, process group) pairs: each list holds parameters replicated over
            its group (dense weights over dp x cp, experts over edp x cp), in the same order on
            every rank of the group.
        make_optimizer: ``make_optimizer(owned_params)`` -> torch optimizer.

    Attributes:
        optimizer: the torch optimizer over the owned parameters (states for those only).
        owned: the parameters this rank steps.
    """

    def __init__(self, groups: list[tuple[list[nn.Parameter], object]],
                 make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer]) -> None:
        self.groups = []
        self.owned: list[nn.Parameter] = []
        for params, group in groups:
            owners = partition(params, dist.get_world_size(group))
            me = dist.get_rank(group)
            self.owned += [p for p, o in zip(params, owners) if o == me]
            self.groups.append((params, owners, group))
        # an optimizer needs at least one parameter; a rank owning none gets a placeholder
        self.optimizer = make_optimizer(self.owned or [nn.Parameter(torch.zeros(()))])

    @torch.no_grad()
    def step(self) -> None:
        """Step the owned parameters, then give every rank of each group the updated values."""
        self.optimizer.step()
        for params, owners, group in self.groups:
            for p, owner in zip(params, owners):
                dist.broadcast(_local(p), group_src=owner, group=group)
