"""The MoE parts of a block's cost that read the framework and the plan: the 2024 dispatcher's
TP all-to-alls, the all-gather dispatcher's traffic, the dispatcher's blocking host reads and
the capacity factor's routed rows. A mixin of :class:`autopar.cost.blocks.BlockCosts` (it
uses that class's ``inputs`` and ``groups``)."""

from __future__ import annotations

from ..config import ParallelConfig
from ..hardware.collectives import NO_LOAD, LinkLoad
from . import capacity
from .dispatch import allgather_traffic


class MoEBlockCosts:
    """MoE cost helpers of :class:`autopar.cost.blocks.BlockCosts` (``self.inputs``:
    :class:`~autopar.cost.context.CostInputs`; ``self.groups``:
    :class:`~autopar.cost.groups.Groups`; ``self._routed_scales``: a dict it fills)."""

    def tp_token_alltoall(self, layer, c: ParallelConfig, bscale: float
                          ) -> tuple[float, LinkLoad]:
        """Forward seconds and link load, per micro-batch, of the TP collectives Megatron-Core's
        2024 all-to-all dispatcher adds to MoE ``layer`` under TP > 1
        (:attr:`autopar.frameworks.FrameworkProfile.moe_tp_token_alltoall`): two all-to-alls
        over TP of one rank's sequence shard, [S*B/tp, H] (sp2hp before the permutation, hp2sp
        after the combine; all-to-all bytes = what one rank sends plus keeps), and the
        all-gather of the router's logits, [S*B, experts] unsharded. Backward moves the same
        bytes the other way (the reverse all-to-alls, the logits' reduce-scatter), which
        :meth:`block_cost` charges at the forward's seconds."""
        tp_g = self.groups.group("tp", c)
        shard = layer.output_bytes * bscale / c.cp / c.tp
        logits = sum(o.bytes_written for o in layer.ops
                     if getattr(o, "moe_role", "") == "router") * bscale / c.cp
        t = 2 * tp_g.time("all_to_all", shard) + tp_g.time("all_gather", logits)
        load = (tp_g.load("all_to_all", shard).scaled(2) + tp_g.load("all_gather", logits))
        return t, load

    def allgather_traffic(self, layer, c: ParallelConfig, token_bytes: float):
        """:class:`autopar.cost.dispatch.AllGatherTraffic` of MoE ``layer`` under the all-gather
        dispatcher for a rank holding ``token_bytes`` of tokens, over the expert-TP x EP group
        (etp x ep ranks); probabilities in the activation dtype (Megatron-Core's
        ``moe_router_dtype`` default None, router.py lines 95-100)."""
        dt = self.inputs.train.dtype_bytes
        ntok = token_bytes / (self.inputs.graph.hidden_size * dt)
        return allgather_traffic(token_bytes, ntok, layer.num_experts, c.etp * c.ep, dt)

    def dispatch_sync_s(self, layer, c: ParallelConfig) -> float:
        """Seconds the GPU waits per MoE ``layer`` forward (ep > 1, all-to-all dispatcher)
        behind the dispatcher's blocking reads of the token counts
        (:attr:`autopar.frameworks.FrameworkProfile.moe_dispatch_sync_ops`): after each read
        the stream is empty, so the host's issue time of the ops up to the all-to-all
        (``moe_dispatch_sync_ops``, two more with the TP all-to-all of
        ``moe_tp_token_alltoall`` under TP > 1, each
        :attr:`autopar.cost.params.CostParams.host_op_s`) and the all-gather of the counts
        over EP between the reads (``ep x experts`` int64 counts) are exposed. 0 when the
        profile prices no such read. A lower bound: the host's time per op is torch's alone
        (no module or autograd overhead), and the reads' own round trips are not counted."""
        prof = self.inputs.profile
        if not (prof.moe_dispatch_sync_ops and layer.num_experts and c.ep > 1
                and c.dispatcher == "alltoall"):
            return 0.0
        ops = prof.moe_dispatch_sync_ops + (
            2 if prof.moe_tp_token_alltoall and c.tp > 1 and not c.folded else 0)
        counts = c.ep * layer.num_experts * 8
        return (ops * self.inputs.params.host_op_s
                + self.groups.group("ep", c).time("all_gather", counts))

    def alltoall_metadata_s(self, layer, c: ParallelConfig, routed_rows: float
                            ) -> tuple[float, LinkLoad, float, LinkLoad]:
        """(seconds of the probabilities' all-to-alls, forward + backward, and their link load;
        seconds of the counts' all-gather, forward, and its load) of MoE ``layer`` per micro-batch on one rank that
        routes ``routed_rows`` rows (its tokens x top-k, after any capacity factor), under the
        all-to-all dispatcher with ep > 1; zeros otherwise.

        * :attr:`autopar.frameworks.FrameworkProfile.moe_probs_alltoall`: the rows'
          probabilities, one element each in the activation dtype (Megatron-Core's
          ``moe_router_dtype`` default None), all-to-all'd over EP after the tokens, and their
          gradient back in backward: two all-to-alls of ``routed_rows x dtype bytes``
          (nccl-tests size: what a rank sends plus keeps, as the tokens' all-to-all counts it).
        * :attr:`~autopar.frameworks.FrameworkProfile.moe_counts_gather`: the all-gather of
          every rank's per-expert int64 counts over the expert-TP x EP group ("tpep", etp x ep
          ranks), output ``etp x ep x experts x 8`` bytes, forward only (no gradient).

        Both are messages of a few kB to a few hundred kB: their time is the collectives'
        per-call and per-peer latency on the EP group's links
        (:func:`autopar.hardware.collectives.algorithm_times`)."""
        prof = self.inputs.profile
        if not (layer.num_experts and c.ep > 1 and c.dispatcher == "alltoall"
                and (prof.moe_probs_alltoall or prof.moe_counts_gather)):
            return 0.0, NO_LOAD, 0.0, NO_LOAD
        a2a_s, a2a_load, gather_s, gather_load = 0.0, NO_LOAD, 0.0, NO_LOAD
        if prof.moe_probs_alltoall:
            ep_g = self.groups.group("ep", c)
            probs = routed_rows * self.inputs.train.dtype_bytes
            a2a_s = 2 * ep_g.time("all_to_all", probs)
            a2a_load = ep_g.load("all_to_all", probs).scaled(2)
        if prof.moe_counts_gather:
            g = self.groups.group("tpep", c)
            counts = g.size * layer.num_experts * 8
            gather_s = g.time("all_gather", counts)
            gather_load = g.load("all_gather", counts)
        return a2a_s, a2a_load, gather_s, gather_load

    def routed_scale(self, layer, b: int, tp: int, cp: int, sp: bool, ep: int | None = 1
                     ) -> float:
        """Rows the busiest EP rank runs in MoE ``layer`` over dropless balanced routing, under
        the training config's capacity factor and expert loads, by the framework's capacity
        rule (:func:`autopar.cost.capacity.routed_scale`), for a router call on one rank's share of
        a micro-batch of ``b`` sequences: / cp, and / tp under sequence parallelism; ``ep``
        None: 1 (the search's lower bound); 1 for a dense layer; balanced dropless MoE: the
        busiest rank's excess under random routing (1 at ep 1)."""
        train = self.inputs.train
        if not layer.num_experts:
            return 1.0
        tokens = b * train.seq_len / cp / (tp if sp else 1)
        # asked for every layer time and block cost of the search: kept per distinct input
        # (the expert loads are normalised and grouped by rank once per key)
        key = (tokens, layer.experts_per_token, layer.num_experts, ep or 1)
        if key not in self._routed_scales:
            self._routed_scales[key] = capacity.routed_scale(
                train, tokens, layer.experts_per_token, layer.num_experts, ep or 1,
                self.inputs.profile.moe_capacity_rule)
        return self._routed_scales[key]
