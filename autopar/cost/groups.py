"""Process groups and links: which ranks a mesh dimension's collectives run over under a
config's placement, the link class they cross, and the share of a GPU's SMs a collective over
them holds (:class:`Groups`)."""

from __future__ import annotations

import numpy as np

from ..config import DEFAULT_PLACEMENT, ParallelConfig
from ..hardware.nccl import (collective_ctas, compute_share_taken, gemm_share_taken,
                             local_nics)
from .comm import Collectives
from .types import GroupLinks


class Groups:
    """The process groups that price each mesh dimension on one cluster (the slowest group
    of the dimension), cached per mesh.

    Args:
        cluster: an :class:`autopar.hardware.Cluster`.
        profile: the framework profile (its ``zero1_group_size``).
    """

    def __init__(self, cluster, profile):
        self.cluster, self.profile = cluster, profile
        self._groups: dict[tuple, Collectives] = {}
        self._shares: dict[tuple, float] = {}

    def group(self, dim: str, c: ParallelConfig) -> Collectives:
        """The process group that prices mesh dimension ``dim`` under the config's placement:
        rank 0's, unless another group of the dimension is slower (:meth:`_worst`: the step
        waits for the slowest); "dp" means the dp x cp group, over which gradients are
        reduced and ZeRO shards (CP ranks hold the same weights); "pp" a pair of neighbours.

        "ep" is the expert-parallel group: without folding, the innermost ep ranks of the DP
        dimension; with MoE parallel folding (``c.expert_tp`` set), ep ranks ``etp`` apart among
        the ranks of one pipeline stage in placement order, and "etp" the first etp of them
        (the expert RankGenerator of Megatron-Core parallel_state.py: etp innermost, then ep,
        over the tp x cp x dp ranks of a stage).

        "tpep" is the expert-TP x EP group (the TP ranks of each "ep" rank; with folding the
        stage's first etp x ep ranks), over
        which Megatron-Core's all-gather dispatcher gathers (token_dispatcher.py
        ``tp_ep_group``).

        "edp" is the expert-data-parallel group, over which the routed experts' gradients are
        reduced and ZeRO-1 shards them: dp * cp / ep ranks without folding (the DP ranks ep
        apart, with the CP ranks), tp * cp * dp / (ep * etp) with folding (the stage's ranks
        etp * ep apart). Megatron-Core keeps expert gradients in their own buffers, reduced
        over that group: at ba773259 (2024-04) distributed_data_parallel.py lines 81-92 and
        142-145 (params with ``allreduce`` False, set on expert weights by experts.py line
        135) over parallel_state.py's data-modulo-expert group (lines 508-517: ranks
        tp * ep apart among the tp * dp ranks); at d98e8a64 the expt_dp group of the expert
        RankGenerator."""
        key = (dim, c.tp, c.cp, c.dp, c.pp, c.ep, c.placement, c.expert_tp)
        g = self._groups.get(key)
        if g is None:
            order = c.placement or DEFAULT_PLACEMENT
            strides = _strides(c)
            dims = ("cp", "dp") if dim == "dp" else (dim,)
            ranks = [0]
            if dim == "etp" and not c.folded:   # expert TP is the attention's TP group
                dim, dims = "tp", ("tp",)
            if dim == "tpep" and not c.folded:
                # the expert-TP x EP group (Megatron-Core pg_collection.tp_ep, over which the
                # all-gather dispatcher gathers): the TP ranks of each EP rank
                ranks = [k * strides["dp"] for k in range(c.ep)]
                dims = ("tp",)
            elif dim in ("ep", "etp", "edp", "tpep") and c.folded:
                # the stage's ranks in placement order (innermost fastest), then etp x ep x edp
                stage = [0]
                for d in order:
                    if d != "pp":
                        stage = [r + k * strides[d] for k in range(getattr(c, d)) for r in stage]
                ranks = (stage[:c.etp] if dim == "etp" else stage[:c.ep * c.etp:c.etp]
                         if dim == "ep" else stage[:c.ep * c.etp] if dim == "tpep"
                         else stage[::c.ep * c.etp])
                dims = ()
            elif dim == "ep":  # experts split over the innermost ep ranks of the DP dimension
                ranks = [k * strides["dp"] for k in range(c.ep)]
                dims = ()
            elif dim == "edp":   # the DP ranks ep apart, and the CP ranks
                ranks = [k * c.ep * strides["dp"] for k in range(max(1, c.dp // c.ep))]
                dims = ("cp",)
            for d in dims:
                ranks = [r + k * strides[d] for r in ranks for k in range(getattr(c, d))]
            ranks = sorted(ranks)
            if dim == "pp" and len(ranks) > 2:
                # stage boundaries: the slowest hop between neighbouring pipeline ranks paces
                # every send (some hops may stay inside a node while others cross the network)
                pairs = [(ranks[i], ranks[i + 1]) for i in range(len(ranks) - 1)]
                ranks = list(max(pairs, key=lambda pr: (
                    self.cluster.collective_time("send_recv", 1e8, pr), -pr[0])))
            g = Collectives(self.cluster, self._worst(dim, c, tuple(ranks)))
            self._groups[key] = g
        return g

    def stages(self, c: ParallelConfig, stages: tuple[int, ...]) -> Collectives:
        """The group of the ranks at pipeline stages ``stages`` that share rank 0's other
        coordinates (Megatron-Core's embedding group: the first and last stages), under the
        config's placement."""
        key = ("stages", stages, c.tp, c.cp, c.dp, c.pp, c.ep, c.placement, c.expert_tp)
        g = self._groups.get(key)
        if g is None:
            stride = _strides(c)["pp"]
            g = self._groups[key] = Collectives(self.cluster, tuple(s * stride for s in stages))
        return g

    def _worst(self, dim: str, c: ParallelConfig, first: tuple[int, ...]) -> tuple[int, ...]:
        """The group of ``dim`` (for "pp", the neighbouring pair) whose collective is slowest
        over all the groups of that dimension; ``first`` (rank 0's, found by :meth:`group`)
        unless another group is slower.

        Every rank of a dimension runs its collectives together and the step waits for the
        slowest group, so where node boundaries cut the groups unevenly (a 48-rank replica on
        2 x 72 GPUs: replica 0 on node 0, replica 1 over nodes 0 and 1) that group prices the
        dimension. Groups are compared by (crosses nodes, seconds of one 100 MB collective:
        all-to-all for "ep"/"tpep", send/recv for "pp", all-reduce otherwise); groups whose
        ranks are the same up to a shift by whole nodes cost the same and are timed once.
        The groups are :func:`all_groups`'s."""
        gpn = self.cluster.gpus_per_node
        if len(first) <= 1 or self.cluster.world_size <= 1 or _node_aligned(dim, c, gpn):
            return first
        rows = all_groups(dim, c)
        if rows is None:
            return first
        if dim == "pp":   # every hop between neighbouring stages of every pipeline
            rows = np.stack([rows[:, :-1], rows[:, 1:]], axis=-1).reshape(-1, 2)
        if rows.size == 0 or int(rows.max()) >= self.cluster.world_size:
            return first
        base = (rows[:, :1] // gpn) * gpn
        index = _distinct_rows(rows - base)
        if len(index) == 1:   # every group is a node-shift of one: rank 0's prices them all
            return first
        op = "all_to_all" if dim in ("ep", "tpep") else "send_recv" if dim == "pp" \
            else "all_reduce"
        cl = self.cluster

        def cost(ranks):
            return (cl.link_class(ranks) != cl.link_classes[0],
                    cl.collective_time(op, 1e8, ranks))

        worst, worst_cost = first, cost(first)
        for i in index.tolist():
            ranks = tuple(int(r) for r in rows[i])
            k = cost(ranks)
            if k > worst_cost:
                worst, worst_cost = ranks, k
        return worst

    def links(self, c: ParallelConfig) -> GroupLinks:
        """The link class each mesh dimension's groups cross (``etp`` only under folding)."""
        order = ("tp", "cp", "pp", "dp", "ep") + (("etp",) if c.folded else ())
        return GroupLinks(**{d: self.group(d, c).link for d in order}, order=order)

    def comm_share(self, grp: Collectives) -> float:
        """Share of this GPU's SMs a collective over ``grp`` holds while in flight
        (:func:`autopar.hardware.nccl.compute_share_taken`: NCCL's CTAs for the group's link
        class over the device's SM count); compute beside it runs at ``1 - share`` of its
        rate. An inter-node group's channels are those of the NICs local to its ranks on a
        node (:func:`autopar.hardware.nccl.local_nics`; NCCL's channel count follows the
        communicator's topology, not the bandwidth share other groups leave it)."""
        cl = self.cluster
        if grp.size <= 1:
            return 0.0
        hit = self._shares.get(grp.ranks)
        if hit is None:
            hit = self._shares[grp.ranks] = compute_share_taken(
                cl.device, grp.link, local_nics(grp.ranks, cl.gpus_per_node, cl.nics_per_node))
        return hit

    def gemm_share(self, grp: Collectives) -> float:
        """Share of a persistent GEMM's rate a collective over ``grp`` takes while in flight
        (:func:`autopar.hardware.nccl.gemm_share_taken`: its CTAs push the GEMM's one-CTA-per-SM
        grid into a second wave on Hopper); 0 on GPUs whose GEMMs are not persistent."""
        cl = self.cluster
        if grp.size <= 1:
            return 0.0
        key = ("gemm", grp.ranks)
        hit = self._shares.get(key)
        if hit is None:
            ctas = collective_ctas(grp.link, local_nics(grp.ranks, cl.gpus_per_node,
                                                        cl.nics_per_node))
            hit = self._shares[key] = gemm_share_taken(cl.device, ctas)
        return hit

    def zero1_group(self, c: ParallelConfig) -> Collectives | None:
        """The ZeRO group (the first z = min(dp x cp, ``zero1_group_size``) ranks of the
        data-parallel group), or None when it has one rank."""
        dp_g = self.group("dp", c)
        z = min(dp_g.size, self.profile.zero1_group_size or dp_g.size)
        if z <= 1:
            return None
        return dp_g if z == dp_g.size else Collectives(self.cluster, dp_g.ranks[:z])


def _strides(c: ParallelConfig) -> dict[str, int]:
    """Each mesh dimension's stride in the global rank: rank r's coordinate along a dimension
    is (r // stride) % size, strides growing outward in placement order (as
    :func:`autopar.hardware.rank_groups` lays the mesh)."""
    stride, strides = 1, {}
    for d in c.placement or DEFAULT_PLACEMENT:
        strides[d] = stride
        stride *= getattr(c, d)
    return strides


def _node_aligned(dim: str, c: ParallelConfig, gpn: int) -> bool:
    """Whether every group of ``dim`` (tp, cp, pp; dp without cp) lies on the nodes as rank 0's
    does, read from the placement alone: each prefix product of the placement's degrees
    (innermost first) divides the node's GPUs or is a multiple of them, so a node boundary
    falls only between whole digits of the rank and a group either stays in its node's
    aligned block or takes one rank per node step, alike for every group. False (look at
    every group) for the expert dimensions and a dp x cp group."""
    if dim not in ("tp", "cp", "pp") and not (dim == "dp" and c.cp == 1):
        return False
    prefix = 1
    for d in tuple(c.placement or DEFAULT_PLACEMENT):
        prefix *= getattr(c, d)
        if prefix % gpn and gpn % prefix:
            return False
    return True


#: Fixed odd 64-bit weights hashing a row of ranks to one integer (:func:`_distinct_rows`).
_ROW_WEIGHTS = np.random.default_rng(0).integers(1, 2**62, size=4096, dtype=np.int64) | 1


def _distinct_rows(rows: np.ndarray) -> np.ndarray:
    """Indices of the first row of each distinct row of the int array ``rows`` (groups, size),
    in row order: ``np.unique(rows, axis=0, return_index=True)[1]`` sorted, by a 1-D unique of
    one wrapping 64-bit hash per row (a search asks this of 16,384-rank meshes a thousand
    times; the 2-D unique sorts the rows themselves), checked row by row against its
    representative, and the 2-D unique where two rows share a hash."""
    n = rows.shape[1]
    if n > len(_ROW_WEIGHTS):
        return np.sort(np.unique(rows, axis=0, return_index=True)[1])
    with np.errstate(over="ignore"):
        h = (rows.astype(np.int64) * _ROW_WEIGHTS[:n]).sum(axis=1)
    _, index, inverse = np.unique(h, return_index=True, return_inverse=True)
    if not (rows == rows[index[inverse.ravel()]]).all():   # a collision: the exact way
        return np.sort(np.unique(rows, axis=0, return_index=True)[1])
    return np.sort(index)


def all_groups(dim: str, c: ParallelConfig) -> np.ndarray | None:
    """Every process group of mesh dimension ``dim`` (the names of :meth:`Groups.group`) under
    the config's placement, as an int array (groups, group size) of sorted global ranks; None
    where the degrees do not split evenly (ep not dividing dp without folding, etp x ep not
    dividing a stage's ranks with it).

    The mesh is laid as :func:`autopar.hardware.rank_groups` lays it (the placement's first
    dimension on consecutive ranks); with MoE parallel folding the expert groups cut each
    pipeline stage's tp x cp x dp ranks, in placement order, etp innermost, then ep, then
    expert-dp (Megatron-Core parallel_state.py, the expert RankGenerator)."""
    order = tuple(c.placement or DEFAULT_PLACEMENT)
    sizes = [getattr(c, d) for d in order]
    mesh = np.arange(int(np.prod(sizes))).reshape(sizes[::-1])   # outermost axis first
    axis = {d: len(order) - 1 - i for i, d in enumerate(order)}

    def over(arr, axes):
        """Groups spanning ``axes`` of ``arr``: those axes last, the rest flattened."""
        rest = [a for a in range(arr.ndim) if a not in axes]
        moved = np.transpose(arr, rest + list(axes))
        return moved.reshape(-1, int(np.prod([arr.shape[a] for a in axes])))

    if dim == "etp" and not c.folded:
        dim = "tp"
    if dim in ("tp", "cp", "pp"):
        out = over(mesh, [axis[dim]])
    elif dim == "dp":
        out = over(mesh, [axis["cp"], axis["dp"]])
    elif not c.folded:   # ep carved out of dp: dp coordinate m * ep + k, k the ep rank
        if c.dp % c.ep:
            return None
        a = axis["dp"]
        split = mesh.reshape(mesh.shape[:a] + (c.dp // c.ep, c.ep) + mesh.shape[a + 1:])
        def shift(b):   # axes after dp move one along
            return b + 1 if b > a else b
        groups = {"ep": [a + 1], "edp": [shift(axis["cp"]), a],
                  "tpep": [shift(axis["tp"]), a + 1]}
        if dim not in groups:
            return None
        out = over(split, groups[dim])
    else:   # folded: cut each stage's ranks, in placement order (innermost fastest)
        stage = np.moveaxis(mesh, axis["pp"], 0).reshape(c.pp, -1)
        n, block = stage.shape[1], c.ep * c.etp
        if n % block:
            return None
        cut = stage.reshape(c.pp, n // block, c.ep, c.etp)
        if dim == "etp":
            out = cut.reshape(-1, c.etp)
        elif dim == "ep":
            out = over(cut, [2])
        elif dim == "tpep":
            out = cut.reshape(-1, block)
        elif dim == "edp":
            out = over(cut, [1])
        else:
            return None
    return np.sort(out, axis=1)
