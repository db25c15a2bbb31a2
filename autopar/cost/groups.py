"""Process groups and links: which ranks a mesh dimension's collectives run over under a
config's placement, the link class they cross, and the share of a GPU's SMs a collective over
them holds (:class:`Groups`)."""

from __future__ import annotations

from ..config import DEFAULT_PLACEMENT, ParallelConfig
from ..hardware.nccl import (collective_ctas, compute_share_taken, gemm_share_taken,
                             local_nics)
from .comm import Collectives
from .types import GroupLinks


class Groups:
    """The representative process groups of one cluster, cached per mesh.

    Args:
        cluster: an :class:`autopar.hardware.Cluster`.
        profile: the framework profile (its ``zero1_group_size``).
    """

    def __init__(self, cluster, profile):
        self.cluster, self.profile = cluster, profile
        self._groups: dict[tuple, Collectives] = {}
        self._shares: dict[tuple, float] = {}

    def group(self, dim: str, c: ParallelConfig) -> Collectives:
        """The representative process group (the one holding rank 0) of mesh dimension ``dim``
        under the config's placement; "dp" means the dp x cp group, over which gradients are
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
            # rank r's coordinate along a dimension is (r // stride) % size, strides growing
            # outward in placement order (as autopar.hardware.rank_groups lays the mesh)
            order = c.placement or DEFAULT_PLACEMENT
            stride, strides = 1, {}
            for d in order:
                strides[d] = stride
                stride *= getattr(c, d)
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
            g = Collectives(self.cluster, tuple(ranks))
            self._groups[key] = g
        return g

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
