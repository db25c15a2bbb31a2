"""How a ZeRO-1 optimizer that shards by whole parameter tensors splits a model; pure functions.

Some ZeRO-1 implementations do not cut one flat buffer into equal slices (Megatron's distributed
optimizer, DeepSpeed ZeRO-1/2): they hand each data-parallel rank whole parameter tensors.
InternEvo's ``HybridZeroOptimizer`` (InternEvo c18bec9 internlm/solver/optimizer/
hybrid_zero_optim.py ``_partition_param_list``, L272-297) sorts the tensors by size, largest
first, and gives each to the rank holding the fewest elements so far (longest-processing-time
greedy). Two consequences the cost model reads (:class:`autopar.cost.model.CostModel`):

* the rank with the largest share paces the optimizer step, and no share is below the largest
  tensor (the embedding or the LM head of a 7B model: 422 M elements), however many ranks;
* a rank given no tensor sends nothing: ``broadcast_params`` (L629-649) issues one broadcast per
  rank that owns tensors, so with more ranks than tensors the broadcasts number the tensors.
"""

from __future__ import annotations

import heapq
from functools import lru_cache

from autopar.errors import InvalidParallelConfig


@lru_cache(maxsize=4096)
def greedy_shares(sizes: tuple[float, ...], ranks: int) -> tuple[float, ...]:
    """Elements per rank when ``sizes`` (elements of each parameter tensor) are dealt, largest
    first, each to the rank with the fewest elements so far (the lowest rank on ties), as
    InternEvo c18bec9 ``HybridZeroOptimizer._partition_param_list`` does.

    Returns:
        ``ranks`` shares in rank order; they sum to ``sum(sizes)``. Ranks left without a tensor
        hold 0.

    Raises:
        InvalidParallelConfig: ``ranks`` < 1 or a negative size.
    """
    if ranks < 1:
        raise InvalidParallelConfig(f"a ZeRO group needs at least one rank, got {ranks}")
    if any(s < 0 for s in sizes):
        raise InvalidParallelConfig("parameter tensor sizes must be >= 0 elements; "
                                    "check the model graph's parameter counts")
    heap = [(0.0, r) for r in range(ranks)]
    for s in sorted(sizes, reverse=True):
        load, r = heapq.heappop(heap)
        heapq.heappush(heap, (load + s, r))
    shares = [0.0] * ranks
    for load, r in heap:
        shares[r] = load
    return tuple(shares)


def owners(sizes: tuple[float, ...], ranks: int) -> int:
    """Ranks that receive at least one tensor under :func:`greedy_shares`: min(ranks, tensors),
    since a rank with no tensor has the fewest elements and takes the next one.

    Raises:
        InvalidParallelConfig: as :func:`greedy_shares`.
    """
    return sum(1 for s in greedy_shares(sizes, ranks) if s > 0) if sizes else 0
