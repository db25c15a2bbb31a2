"""Model states per pipeline rank: weights, gradients and optimizer states after ZeRO sharding,
ZeRO-3's working bytes, the optimizer step's temporaries, the largest ZeRO-1 share, and the
parameters FSDP keeps gathered from forward to backward (:class:`ModelStates`)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from ..config import PARAMETER_COPIES, ParallelConfig
from . import memory as mem
from . import offload
from .context import CostInputs
from .pipeline.held import held_chunks_at_peak
from .ranks import RankLayers
from .zero1 import greedy_shares, owners


@dataclass(frozen=True)
class RankStates:
    """Model-state bytes of one pipeline rank.

    Attributes:
        states: (weights, gradients, optimizer states) bytes after ZeRO sharding.
        working_bytes: ZeRO-3's gathered parameters of the largest layer and the one
            prefetched (per parameter tensor with a prefetch bucket where the framework gathers
            so: :meth:`ModelStates.per_parameter_gathered`; or, under PP where the framework
            keeps them, the unsharded parameters
            and gradients held at the rank's activation peak), plus cached FP8 weight copies.
    """

    states: tuple[float, float, float]
    working_bytes: float


class ModelStates:
    """Model-state bytes under one cost model's framework conventions.

    Args:
        inputs: the cost model's :class:`~autopar.cost.context.CostInputs`.
        ranks: its :class:`~autopar.cost.ranks.RankLayers`.
    """

    def __init__(self, inputs: CostInputs, ranks: RankLayers):
        self.inputs, self.ranks = inputs, ranks
        self._zero1_splits: dict[tuple, tuple[float, int]] = {}
        self._largest: dict[tuple, float] = {}   # a rank's largest layer, by its layers
        self._plain: dict[tuple, RankStates] = {}   # rank_states without working bytes

    def kept_gathered(self, c: ParallelConfig, layouts) -> tuple[float, ...]:
        """Per pipeline rank, parameter elements held unsharded from forward to backward by the
        blocks that keep their gathered parameters (FSDP2 ``reshard_after_forward=False``);
        ``layouts``: the ranks' :class:`~autopar.cost.layout.StageLayout`. Under PP a framework
        that keeps every parameter gathered across the step's micro-batches
        (``zero3_regather_per_micro_batch`` False) has nothing left to keep."""
        g, blocks = self.inputs.graph, self.inputs.blocks
        if c.zero_stage == 3 and c.reshard_after_forward is not None and c.dp * c.cp > 1 and (
                c.pp == 1 or self.inputs.profile.zero3_regather_per_micro_batch):
            kept = {li for li, f in zip(blocks, c.block_reshard(len(blocks))) if not f}
            return tuple(sum(mem.kept_params_per_rank(g.layers[i], c.tp, c.ep)
                             for i in st.layers if i in kept) for st in layouts)
        return (0.0,) * c.pp

    def rank_states(self, c: ParallelConfig, params: float, experts: float,
                    layers: tuple[int, ...], pp: int, rank: int = 0) -> RankStates:
        """The :class:`RankStates` of a pipeline rank
        holding ``params`` parameter elements (``experts`` of them MoE experts) of ``layers``.

        Bytes per element follow the framework's :class:`MemoryConventions` (weights and
        gradients in their dtypes, K = master copy + moments, optimizer states on the CPU with
        ``optimizer_offload``); ZeRO shards them over dp x cp (Rajbhandari et al. 2020). Working
        bytes: ZeRO-3's gathered parameters of the largest layer and the one prefetched (2 x;
        DeepSpeed's per-parameter fetch: :meth:`per_parameter_gathered`), or, under pipeline
        parallelism where the framework keeps them, the unsharded
        parameters and gradients its chunks hold at pipeline rank ``rank``'s activation peak
        (:meth:`pp_unsharded_bytes`); plus cached FP8 weight copies (of each copy of the parameters:
        :data:`autopar.config.PARAMETER_COPIES`). With ``param_offload`` the
        weight shards (and under FSDP the gradient shards) are on the host and the working
        bytes add the two units' shards copied in before their all-gathers
        (:mod:`autopar.cost.offload`).
        """
        train, conv = self.inputs.train, self.inputs.conventions
        if c.zero_stage != 3 and not (train.precision == "fp8" and conv.fp8_weight_cache_bytes):
            # no working bytes: the states read the layers only through their counts, so
            # ranks (the middle ranks of an even cut) and configurations with the same counts
            # and sharding share them
            key = (c.zero_stage, c.dp, c.cp, c.tp, c.ep, c.etp, params, experts)
            hit = self._plain.get(key)
            if hit is None:
                hit = self._plain[key] = self._rank_states(c, params, experts, layers, pp, rank)
            return hit
        return self._rank_states(c, params, experts, layers, pp, rank)

    def _rank_states(self, c: ParallelConfig, params: float, experts: float,
                     layers: tuple[int, ...], pp: int, rank: int) -> RankStates:
        """:meth:`rank_states`, uncached."""
        train, conv, g = self.inputs.train, self.inputs.conventions, self.inputs.graph
        wb = conv.weight_bytes or train.dtype_bytes
        gb = conv.grad_bytes or self.inputs.params.grad_bytes
        k_opt = 0 if train.optimizer_offload else mem.optimizer_state_bytes_per_param(
            train.optimizer, conv.master_weight_bytes, train.optimizer_state_dtype,
            conv.moment_bytes)
        # the states are sharded over the ZeRO group: dp x cp, or the smaller group a hybrid
        # sharding sets (FrameworkProfile.zero1_group_size: FSDP's HYBRID_SHARD, InternEvo's
        # zero1=N), replicated across groups
        z, z_e = self.zero_groups(c)
        dense = mem.model_state_bytes(params - experts, c.zero_stage, z, wb, gb, k_opt)
        moe = mem.model_state_bytes(experts, c.zero_stage, z_e, wb, gb, k_opt)
        states = tuple(a + b for a, b in zip(dense, moe))
        if c.zero_stage == 2 and wb > train.dtype_bytes and c.dp * c.cp > 1:
            # FSDP2 without resharding after forward: fp32 shards (the master copy) plus the
            # gathered compute-dtype parameters kept between forward and backward
            w = wb * params / z + train.dtype_bytes * params
            states = (w, states[1], states[2])
        if c.zero_stage == 2 and self.inputs.profile.zero2_reduce_per_step and c.dp * c.cp > 1:
            # gradients accumulated unsharded over the step's micro-batches, in the reduce
            # dtype, until the one reduce-scatter after the last backward
            # (FrameworkProfile.zero2_reduce_per_step)
            states = (states[0], self.inputs.reduce_bytes * params, states[2])
        # parameter offload: the shards leave the GPU (and under FSDP the gradient shards);
        # each unit's shard is copied in before its all-gather (autopar.cost.offload)
        states = offload.resident_states(train, states)
        work = 0.0
        if c.zero_stage == 3 and (c.dp * c.cp > 1 or train.param_offload):
            largest = self._largest.get((layers, c.tp, c.ep, c.etp))
            if largest is None:
                largest = self._largest[layers, c.tp, c.ep, c.etp] = max(
                    self.ranks.layer_params_per_rank(i, c.tp, True, c.ep, c.etp)
                    for i in layers)
            gathered = 2 * largest
            if conv.zero3_prefetch_elements and self.inputs.profile.zero3_gather == "per_parameter":
                gathered = self.per_parameter_gathered(c, layers)
            # the shard each gather copies in is the one this rank holds: over the ZeRO group
            # (dp x cp, or the hybrid sharding's smaller group: zero_groups)
            work = train.dtype_bytes * gathered + (conv.weight_bytes or train.dtype_bytes) \
                * offload.staging_elements(train, largest, self.zero_groups(c)[0])
            if pp > 1 and conv.pp_unsharded_bytes:
                work = max(self.pp_unsharded_bytes(c, rank, params), work)
        if train.precision == "fp8" and conv.fp8_weight_cache_bytes:
            # each copy of the parameters (DualPipe's two: PARAMETER_COPIES) is its own
            # modules, each caching its FP8 weights
            work += conv.fp8_weight_cache_bytes * PARAMETER_COPIES.get(c.schedule, 1) * sum(
                self.ranks.layer_params_per_rank(i, c.tp, True, c.ep, c.etp) for i in layers
                if g.layers[i].kind == "block")
        return RankStates(states, work)

    def per_parameter_gathered(self, c: ParallelConfig, layers: tuple[int, ...]) -> float:
        """Parameter elements (with gradient elements counted alike) a rank holding graph
        layers ``layers`` keeps unsharded at its ZeRO-3 peak when the framework gathers per
        parameter tensor with a prefetch bucket (DeepSpeed: ``MemoryConventions.
        zero3_prefetch_elements``, ``zero3_max_live_elements``; the profile's
        ``zero3_persistent_elements``), walked along the fetch trace (the ops in forward
        order, then in reverse for backward): at each op, its gathered parameters (and in
        backward its full gradient, until the reduce hook takes it) plus the tensors
        prefetched after it, whole tensors until min(prefetch bucket, max live) elements are
        reached; the largest such sum, plus every op small enough to persist (never
        partitioned: gathered once and kept, deepspeed/runtime/zero/partition_parameters.py
        ``ds_persist``). An op's parameters count together (a bias beside its weight),
        TP-sharded ones / tp, routed experts / (etp x ep). Not counted: parameters kept for
        reuse within ``stage3_max_reuse_distance`` (at the forward-backward turn they are the
        modules run next anyway). Sources: :mod:`autopar.frameworks.memory` ``_DS_Z3_PREFETCH``,
        ``_DS_Z3_LIVE`` (DeepSpeed 0.19.8 partitioned_param_coordinator.py)."""
        key = ("per-parameter", layers, c.tp, c.ep, c.etp)
        hit = self._largest.get(key)
        if hit is not None:
            return hit
        conv, prof = self.inputs.conventions, self.inputs.profile
        persist = prof.zero3_persistent_elements
        sizes, persistent = [], 0.0
        for li in sorted(layers):
            for o in self.inputs.graph.layers[li].ops:
                if o.num_parameters <= 0:
                    continue
                if o.moe_role == "expert":
                    n = o.num_parameters / ((c.etp or c.tp) * c.ep)
                elif o.tp_role in ("column", "row", "vocab"):
                    n = o.num_parameters / c.tp
                else:
                    n = float(o.num_parameters)
                if o.num_parameters <= persist:
                    persistent += n
                else:
                    sizes.append(n)
        trace = [(n, 1) for n in sizes] + [(n, 2) for n in reversed(sizes)]
        budget = min(conv.zero3_prefetch_elements, conv.zero3_max_live_elements or math.inf)
        prefix = [0.0]
        for n, _ in trace:
            prefix.append(prefix[-1] + n)
        peak = 0.0
        for i, (n, copies) in enumerate(trace):
            # the first j after i with prefix[j] - prefix[i + 1] >= budget: whole tensors
            j = bisect.bisect_left(prefix, prefix[i + 1] + budget, lo=i + 1)
            window = prefix[min(j, len(trace))] - prefix[i + 1]
            peak = max(peak, copies * n + window)
        self._largest[key] = peak + persistent
        return self._largest[key]

    def pp_unsharded_bytes(self, c: ParallelConfig, rank: int, params: float) -> float:
        """Bytes of unsharded parameters and gradients pipeline rank ``rank`` (holding
        ``params`` elements over its chunks) keeps at the instants its activations peak, for a
        framework that keeps them across micro-batches under PP with ZeRO-3
        (``MemoryConventions.pp_unsharded_bytes``): each chunk holds
        ``pp_unsharded_forward_bytes`` per parameter from its first forward and the rest from
        its first backward, until its last backward reduces its gradients
        (:func:`autopar.cost.pipeline.held.held_chunks_at_peak`, with torch's sources).

        Under 1F1B (one chunk) that is every byte, as the rank's activations peak at its first
        backward; under interleaved 1F1B a rank's earlier chunk has not begun its backward when
        its activations peak, so only the later chunk's gradients count. A chunk's parameters
        are its layers' (a tied embedding counted once per rank, shared in proportion).
        Orders torch cannot build (a micro-batch count it refuses) keep every byte.
        """
        conv = self.inputs.conventions
        m = self.inputs.train.global_batch_size // (c.dp * c.micro_batch_size)
        v = c.virtual_stages or 1
        if v == 1:
            per = {rank: params}
        else:
            _layers, mine, _groups, chunks = self.ranks.rank_layers(c.pp, c.stage_blocks,
                                                              c.schedule)[rank]
            raw = {ci: self.ranks.rank_params(c.tp, c.ep, tuple(chunks[ci]), c.etp)[0]
                   for ci in mine}
            total = sum(raw.values())
            per = {ci: params * x / total if total else 0.0 for ci, x in raw.items()}
        try:
            sets = held_chunks_at_peak(c.schedule, c.pp, m, v, rank, c.vp_group)
        except ValueError:
            return conv.pp_unsharded_bytes * params
        fwd_b = conv.pp_unsharded_forward_bytes
        bwd_b = conv.pp_unsharded_bytes - fwd_b
        return max(sum(fwd_b * per.get(ci, 0.0) for ci in fwd)
                   + sum(bwd_b * per.get(ci, 0.0) for ci in bwd) for fwd, bwd in sets)

    def state_bytes_per_param(self) -> int:
        """Bytes of model states per parameter before any sharding: weights + gradients +
        optimizer states on the GPU, under the framework's :class:`MemoryConventions` (less
        what the training config offloads)."""
        train, conv = self.inputs.train, self.inputs.conventions
        k_opt = 0 if train.optimizer_offload else mem.optimizer_state_bytes_per_param(
            train.optimizer, conv.master_weight_bytes, train.optimizer_state_dtype,
            conv.moment_bytes)
        w, g, _ = offload.resident_states(train, (
            conv.weight_bytes or train.dtype_bytes, conv.grad_bytes or self.inputs.params.grad_bytes,
            0))
        return int(w + g + k_opt)

    def optimizer_step_bytes(self, c: ParallelConfig, params: float) -> float:
        """Bytes the optimizer step allocates beside the states on a rank holding ``params``
        elements (the framework's ``optimizer_step_temp_bytes`` per optimizer-held element;
        none when the step runs on the CPU)."""
        if self.inputs.train.optimizer_offload:
            return 0.0
        conv = self.inputs.conventions
        held = params / self.zero_groups(c)[0] if c.zero_stage >= 1 else params
        if c.zero_stage == 3 and conv.zero3_step_temp_bytes is not None:
            # DeepSpeed's stage-3 step works one sub-group at a time (MemoryConventions.
            # zero3_step_temp_bytes, zero3_sub_group_elements: stage3.py step())
            sub = conv.zero3_sub_group_elements
            return conv.zero3_step_temp_bytes * (min(held, sub) if sub else held)
        return conv.optimizer_step_temp_bytes * held

    def step_cached_bytes(self, c: ParallelConfig, params: float) -> float:
        """Bytes the caching allocator holds reserved at the optimizer step's peak beyond the
        allocated ones on a rank holding ``params`` elements (the framework's
        ``step_cached_bytes`` per optimizer-held element, :class:`MemoryConventions`; none
        when the step runs on the CPU)."""
        if self.inputs.train.optimizer_offload or not self.inputs.conventions.step_cached_bytes:
            return 0.0
        held = params / self.zero_groups(c)[0] if c.zero_stage >= 1 else params
        return self.inputs.conventions.step_cached_bytes * held

    def zero_groups(self, c: ParallelConfig) -> tuple[int, int]:
        """(ranks the dense states are sharded over, ranks the routed experts' states are
        sharded over) under ZeRO: z = min(dp x cp, ``zero1_group_size``), and the experts'
        expert-data-parallel group, dp x cp / ep or, with MoE parallel folding, tp x dp x cp /
        (ep x etp) (Megatron-Core parallel_state.py expert_data_parallel_size); a smaller group
        holds z / ep copies of each expert (the EP ranks are inside it: PithTrain
        distributed.py "hsdp": "Shards within the inner mesh dimension (cp x ep for non-MoE; cp
        for MoE)"), at least one."""
        group = self.inputs.profile.zero1_group_size
        z = max(1, min(c.dp * c.cp, group or c.dp * c.cp))
        edp = max(1, c.tp * c.dp * c.cp // (c.ep * c.etp))
        return z, (edp if not group else max(1, min(edp, z // c.ep)))

    def zero1_split(self, c: ParallelConfig, layers: tuple[int, ...],
                    params: float) -> tuple[float, int]:
        """(elements of the largest ZeRO-1 share, ranks holding a share) when the ZeRO group
        (z = min(dp x cp, ``zero1_group_size``) ranks) splits the ``params`` parameter elements
        of a pipeline rank holding graph layers ``layers`` (cached).

        ``zero1_partition`` "flat": z equal slices of ``params``. "per_tensor": each op's
        parameters are one tensor (TP-sharded ones / tp, routed experts / (etp x ep)), dealt
        largest first to the least-loaded rank (:func:`autopar.cost.zero1.greedy_shares`,
        InternEvo c18bec9 hybrid_zero_optim.py ``_partition_param_list``): the largest share is
        at least the largest tensor, and at most as many ranks as tensors hold one."""
        z, z_e = self.zero_groups(c)
        etp = None if c.etp == c.tp else c.etp
        if self.inputs.profile.zero1_partition == "flat":
            if c.ep > 1 or c.folded:
                # the routed experts' states are sharded over their expert-data-parallel group,
                # as _rank_states keeps them (Megatron-Core ba773259 core/optimizer/__init__.py
                # get_megatron_optimizer: a separate optimizer for expert parameters, over the
                # data-modulo-expert group)
                experts = (self.ranks.rank_params(c.tp, c.ep, layers, c.etp)[1]
                           * PARAMETER_COPIES.get(c.schedule, 1))
                return (params - experts) / z + experts / z_e, z
            return params / z, z
        key = (z, c.tp, c.ep, etp, layers)
        hit = self._zero1_splits.get(key)
        if hit is None:
            sizes = []
            for li in layers:
                for o in self.inputs.graph.layers[li].ops:
                    if o.num_parameters <= 0:
                        continue
                    if o.moe_role == "expert":
                        sizes.append(o.num_parameters / ((etp or c.tp) * c.ep))
                    elif o.tp_role in ("column", "row", "vocab"):
                        sizes.append(o.num_parameters / c.tp)
                    else:
                        sizes.append(float(o.num_parameters))
            sizes_t = tuple(sizes)
            hit = self._zero1_splits[key] = (max(greedy_shares(sizes_t, z)), owners(sizes_t, z))
        return hit
