"""Rank placement: the process groups of each dimension of a parallel mesh.

The mesh is laid out with the first dimension innermost (consecutive global ranks), as Megatron-LM's
``RankGenerator`` does for the order string ``"tp-cp-ep-dp-pp"``: TP groups are blocks of consecutive
ranks (inside a node when tp <= gpus_per_node), PP the outermost stride.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from autopar.errors import InvalidParallelConfig

#: Conventional innermost-first order (Megatron-LM default ``tp-cp-ep-dp-pp``).
DEFAULT_ORDER: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")


def rank_groups(cluster_or_world, dims: Mapping[str, int]) -> dict[str, list[list[int]]]:
    """The process groups of every mesh dimension.

    Args:
        cluster_or_world: a ``Cluster`` (its ``world_size`` is used) or the world size as an int.
        dims: dimension name -> degree, **in nesting order, innermost first**, e.g.
            ``{"tp": 8, "cp": 1, "dp": 4, "pp": 2}``. Write the conventional order of
            :data:`DEFAULT_ORDER` (TP innermost) unless another placement is meant.

    Returns:
        name -> list of groups, each a sorted list of global ranks; groups listed by first rank. A
        dimension of degree d has world/d groups of d ranks; degree 1 gives singleton groups.

    Raises:
        InvalidParallelConfig: if a degree is not a positive int, or the degrees do not multiply to
            the world size (the message shows the product and the degrees).
    """
    world = getattr(cluster_or_world, "world_size", cluster_or_world)
    if not isinstance(world, (int, np.integer)) or isinstance(world, bool) or world < 1:
        raise InvalidParallelConfig(f"world size must be a positive int or a Cluster, got {cluster_or_world!r}")
    if not dims:
        raise InvalidParallelConfig("dims is empty; give at least one dimension, e.g. {'dp': world_size}")
    for name, d in dims.items():
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 1:
            raise InvalidParallelConfig(f"degree of {name!r} must be a positive int, got {d!r}")
    product = int(np.prod([int(d) for d in dims.values()]))
    if product != world:
        shown = " x ".join(f"{k}={v}" for k, v in dims.items())
        raise InvalidParallelConfig(
            f"parallel degrees {shown} = {product} do not match the world size {world}; "
            f"change a degree so the product is {world}"
        )
    names = list(dims)
    sizes = [int(dims[n]) for n in names]
    # C order: the last axis varies fastest, so reverse to make the first dim innermost.
    mesh = np.arange(world).reshape(sizes[::-1])
    out: dict[str, list[list[int]]] = {}
    for i, name in enumerate(names):
        axis = len(names) - 1 - i
        groups = np.moveaxis(mesh, axis, -1).reshape(-1, sizes[i])
        out[name] = sorted((sorted(int(r) for r in g) for g in groups), key=lambda g: g[0])
    return out
