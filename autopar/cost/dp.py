"""Data-parallel cost: the gradient reductions and parameter gathers of (sharded) data
parallelism, how much of them no compute hides, the compute slowdown beside the hidden part,
the framework's copies around them and the optimizer step (:class:`DPCost`, from
:class:`DataParallel`).

Which mechanisms apply is the framework profile's: overlap of the gradient reduce
(``overlap_dp_grad_reduce``), how ZeRO-3 gathers (``zero3_gather``, per block or per
parameter; ``zero3_regather_per_micro_batch`` under PP, and there the layers outside the
blocks gathered every micro-batch, ``zero3_pp_root_regather``, and the reductions issued after
the pipeline's last operation, ``zero3_pp_reduce_after_flush``), FSDP1's flat-gradient copies
(``zero_grad_copy_passes``), FSDP2's copy-in/out (``fsdp2_copies``), ZeRO-1 with full
all-reduce (``zero1_grad_all_reduce``) or broadcast parameter sync (``zero1_param_sync``),
bucketed reduction with device syncs (``sync_grad_bucket_elements``), the ZeRO group and
partition (``zero1_group_size``, ``zero1_partition``), ZeRO-2 buckets all-reduced rather than
reduce-scattered (``zero2_grad_all_reduce``) and ZeRO-1/2 bucket copies on the compute stream
(``zero12_grad_copy_passes``), both DeepSpeed's, and DeepSpeed's engine without ZeRO: its
reduction copies and its mixed-precision step's overflow check (``zero0_grad_copy_passes``,
``zero0_step_bytes``, ``zero0_step_host_ops_per_tensor``). Per-block ZeRO-3 (FSDP) run beside
compute exposes each micro-batch's first gathers and last reductions, which have no compute
beside them (:meth:`DataParallel.zero3_edges_s`, from PyTorch's FSDP notes).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import PARAMETER_COPIES, ParallelConfig
from ..hardware.collectives import NO_LOAD, LinkLoad
from . import offload
from .blocks import BlockCosts
from .buckets import bucketed_exposed_s
from ..hardware.nccl import mixed_share
from .comm import overlapped_comm
from .context import CostInputs
from .groups import Groups
from .ranks import RankLayers
from .states import ModelStates
from .zero3 import Zero3Passes


@dataclass(frozen=True)
class ReductionGroups:
    """A rank's data-parallel collectives split by the group they run over: ``dense``
    parameter elements over ``dp_g`` (the dp x cp group), ``experts`` over ``edp_g`` (the
    expert-data-parallel group; None when it is ``dp_g``). The two run one after the other
    (Megatron-Core starts each buffer's reduction in turn: distributed_data_parallel.py
    ``for buffer in self.buffers + self.expert_parallel_buffers``), so their seconds add; a
    group of one rank moves nothing."""

    dp_g: object
    dense: float
    edp_g: object | None
    experts: float

    def time(self, op: str, nbytes: float) -> float:
        """Seconds of collective ``op`` over ``nbytes`` bytes per parameter element."""
        t = self.dp_g.time(op, self.dense * nbytes)
        if self.edp_g is not None and self.edp_g.size > 1 and self.experts > 0:
            t += self.edp_g.time(op, self.experts * nbytes)
        return t

    def load(self, op: str, nbytes: float) -> LinkLoad:
        """What :meth:`time`'s collectives put on each link."""
        ld = self.dp_g.load(op, self.dense * nbytes)
        if self.edp_g is not None and self.edp_g.size > 1 and self.experts > 0:
            ld = ld + self.edp_g.load(op, self.experts * nbytes)
        return ld


@dataclass(frozen=True)
class DPCost:
    """Seconds per step of data parallelism and the optimizer on the rank with the most
    parameters.

    Attributes:
        exposed_s: collective seconds no compute hides.
        slowdown_s: what the collectives run beside compute cost it by holding SMs
            (:func:`autopar.cost.comm.overlapped_comm`).
        copies_s: the sharded-DP implementation's memory-bound copies on the compute stream.
        optimizer_s: the optimizer step (or, offloaded, the PCIe transfers around it).
        loads: what one GPU puts on the links, as (load, times) in booking order (empty when
            only the time was asked for).
    """

    exposed_s: float
    slowdown_s: float
    copies_s: float
    optimizer_s: float
    loads: tuple[tuple[LinkLoad, float], ...] = ()


#: Fields of a configuration the ZeRO-3 passes do not read (their cache key leaves them out).
class DataParallel(Zero3Passes):
    """The :class:`DPCost` of configs of one cost model.

    Args:
        inputs: the cost model's :class:`~autopar.cost.context.CostInputs`.
        groups, ranks, states, blocks: its process groups, rank layers, model states and
            per-layer costs.
    """

    def __init__(self, inputs: CostInputs, groups: Groups, ranks: RankLayers,
                 states: ModelStates, blocks: BlockCosts):
        self.inputs, self.groups, self.ranks = inputs, groups, ranks
        self.states, self.blocks = states, blocks
        # ZeRO-3 passes by (layout, rank, bytes per element, op): the search prices one
        # layout under many recompute and kept-gathered choices (zero3._NOT_IN_ZERO3), not read here
        self._zero3: dict[tuple, object] = {}
        self._shares: dict[tuple, float] = {}   # overlap_share by layers and layout fields
        self._param_tensors: list[int] | None = None   # per graph layer (param_tensors)

    def cost(self, c: ParallelConfig, layout: tuple, bottleneck: int, fwd1: float,
             bwd1: float, keep: tuple[float, ...], with_loads: bool = True) -> DPCost:
        """The :class:`DPCost` of the resolved config ``c`` whose pipeline ranks hold
        ``layout``; ``bottleneck``: the slowest pipeline rank (whose layers ZeRO-3's
        collectives are issued over), ``fwd1``/``bwd1``: one micro-batch's forward and backward
        seconds on it (what the collectives hide behind); ``keep``: per rank, parameter
        elements kept gathered (:meth:`ModelStates.kept_gathered`). With ``with_loads`` False
        the link loads are not built (the search's time-only bound)."""
        inp = self.inputs
        train, prof = inp.train, inp.profile
        dp, cp, pp = c.dp, c.cp, c.pp
        m = inp.micro_batches(c)
        dp_g = self.groups.group("dp", c)
        stage_params = [st.params for st in layout]
        psi = max(stage_params)
        rank = stage_params.index(psi)
        # bytes per element: of the gathered compute-dtype parameters, of the gradient reduction
        wbytes = train.dtype_bytes
        rbytes = inp.reduce_bytes
        loads: list[tuple[LinkLoad, float]] = []
        dp_exposed = 0.0
        # whether the framework runs the DP collectives beside compute: not when it issues them
        # after backward or gathers per parameter with syncs. Beside compute, a collective's
        # NCCL thread blocks hold their SMs while in flight and the compute slows
        # (overlapped_comm; autopar/hardware/nccl.py): ``dp_slow`` seconds
        ov_grad = prof.overlap_dp_grad_reduce
        ov_gather = prof.zero3_gather == "per_block"
        share = self.overlap_share(c, layout[rank].layers, dp_g)
        dp_slow = 0.0

        def beside(comm_s: float, window_s: float, overlapped: bool) -> float:
            """Exposed seconds of a collective run beside ``window_s`` of compute (all of it
            when not overlapped); adds its compute slowdown to ``dp_slow``."""
            nonlocal dp_slow
            if not overlapped:
                return comm_s
            exposed, slow = overlapped_comm(comm_s, window_s, share)
            dp_slow += slow
            return exposed

        def beside_copies(comm_s: float, copy_s: float, window_s: float,
                          overlapped: bool) -> float:
            """:func:`beside` of a collective followed on its side stream by ``copy_s``
            seconds of host copies (copy engines: no SMs held, so no slowdown of their own):
            the side path ends ``comm_s + copy_s`` after it starts, the slowed compute
            ``window_s + slowdown`` (with ``copy_s`` 0 this is :func:`beside`)."""
            if not overlapped or copy_s == 0.0:
                return beside(comm_s, window_s, overlapped) + (0.0 if overlapped else copy_s)
            before = dp_slow
            beside(comm_s, window_s, True)
            return max(0.0, comm_s + copy_s - window_s - (dp_slow - before))

        # parameter offload: each ZeRO-3 gather first copies the shard in, each reduction
        # copies the gradient shard out, on FSDP's side streams with the collectives
        # (autopar.cost.offload); 0 without it. The shard is the rank's: psi over the ZeRO
        # group (dp x cp, or a hybrid sharding's smaller group, ModelStates.zero_groups)
        h2d, d2h = offload.param_copy_s(train, psi / self.states.zero_groups(c)[0],
                                        inp.conventions.weight_bytes or wbytes, rbytes,
                                        inp.device.pcie_bandwidth_Bps)
        # sharded-DP all-gathers and reduce-scatters per step, for the copies around them
        gathers = reduces = 0.0
        root_copies = 0.0   # elements of the per-micro-batch gathers outside the blocks
        if dp * cp > 1:
            coll = self.reduction_groups(c, layout[rank].layers, psi)
            t_ag = coll.time("all_gather", wbytes)
            t_rs = coll.time("reduce_scatter", rbytes)
            # what those put on each link, for the ledger (not needed for the time alone)
            l_ag = l_rs = NO_LOAD
            if with_loads:
                l_ag = coll.load("all_gather", wbytes)
                l_rs = coll.load("reduce_scatter", rbytes)
            if c.zero_stage == 3:   # gathered and reduced per block or per parameter
                t_ag = self.zero3_collective_s(c, bottleneck, wbytes, "all_gather")
                t_rs = self.zero3_collective_s(c, bottleneck, rbytes, "reduce_scatter")
                if with_loads:
                    l_ag = self.zero3_collective_load(c, bottleneck, wbytes, "all_gather")
                    l_rs = self.zero3_collective_load(c, bottleneck, rbytes, "reduce_scatter")
            if c.zero_stage == 3 and (pp == 1 or prof.zero3_regather_per_micro_batch):
                # every micro-batch gathers the parameters for forward, and again for backward
                # those blocks resharded after forward (FSDP2 fully_shard reshard_after_forward,
                # per block; the share on the rank with the most parameters), and
                # reduce-scatters its gradients
                regather = (psi - keep[rank]) / psi if psi > 0 else 1.0
                per_mb = (1 + regather) * t_ag + t_rs
                gathers, reduces = m * (1 + regather), m
                # the micro-batch's first gathers and last reductions have no compute beside
                # them (zero3_edges_s): exposed whole, the rest hidden behind the compute
                edge_comm, edge_exposed = 0.0, 0.0
                if ov_gather and pp == 1:
                    edge_comm, edge_exposed = self.zero3_edges_s(c, bottleneck, wbytes, rbytes)
                dp_exposed = m * (beside_copies(max(0.0, per_mb - edge_comm),
                                                (1 + regather) * h2d + d2h, fwd1 + bwd1, ov_gather)
                                  + edge_exposed)
                dp_slow *= m
                loads.append((l_ag.scaled(1 + regather) + l_rs, m))
            elif c.zero_stage == 3:
                # under PP the framework keeps parameters gathered and gradients unsharded
                # across the step's micro-batches: one gather behind the first forward, one
                # reduce-scatter behind the last backward (memory pays, not time), or, where
                # the framework issues the reductions after the pipeline's last operation
                # (FrameworkProfile.zero3_pp_reduce_after_flush), with nothing beside them
                if prof.zero3_pp_reduce_after_flush:
                    rs_exposed = t_rs + d2h
                else:
                    rs_exposed = beside_copies(t_rs, d2h, bwd1, ov_grad)
                dp_exposed = beside_copies(t_ag, h2d, fwd1, ov_gather) + rs_exposed
                gathers, reduces = 1, 1
                loads.append((l_ag + l_rs, 1.0))
                if prof.zero3_pp_root_regather:
                    # the layers outside the blocks reshard after every forward: m gathers more,
                    # the compute waiting on each (FrameworkProfile.zero3_pp_root_regather)
                    t_root, l_root, root_elems = self.zero3_root_gather(c, bottleneck, wbytes)
                    dp_exposed, root_copies = dp_exposed + m * t_root, m * root_elems
                    loads += [(l_root, m)] if with_loads and t_root > 0 else []
            elif c.zero_stage == 2 and prof.zero2_reduce_per_step:
                # unsharded gradients accumulated over the step's micro-batches: one
                # reduce-scatter behind the last backward, one gather behind the first forward
                # (FrameworkProfile.zero2_reduce_per_step; memory pays, ModelStates)
                dp_exposed = beside(t_rs, bwd1, ov_grad) + beside(t_ag, fwd1, ov_grad)
                gathers, reduces = 1, 1
                loads.append((l_rs + l_ag, 1.0))
            elif c.zero_stage == 2:
                # sharded gradients cannot accumulate locally: reduce-scatter every micro-batch,
                # each hidden behind that micro-batch's backward; parameters gathered once.
                # DeepSpeed all-reduces each bucket instead, every rank keeping its slice
                # (FrameworkProfile.zero2_grad_all_reduce)
                if prof.zero2_grad_all_reduce:
                    t_rs = coll.time("all_reduce", rbytes)
                    l_rs = coll.load("all_reduce", rbytes) if with_loads else NO_LOAD
                dp_exposed = m * beside(t_rs, bwd1, ov_grad)
                dp_slow *= m
                dp_exposed += beside(t_ag, fwd1, ov_grad)
                gathers, reduces = 1, m
                loads.append((l_rs, m))
                loads.append((l_ag, 1.0))
            else:
                if c.zero_stage == 0:
                    t_grad = coll.time("all_reduce", rbytes)
                    t_param = 0.0
                    l_grad, l_param = coll.load("all_reduce", rbytes), NO_LOAD
                elif prof.zero1_grad_all_reduce:   # full gradients all-reduced, then sharded
                    t_grad, t_param = coll.time("all_reduce", rbytes), t_ag
                    l_grad, l_param = coll.load("all_reduce", rbytes), l_ag
                else:
                    t_grad, t_param = t_rs, t_ag
                    l_grad, l_param = l_rs, l_ag
                ov_param = ov_grad
                if prof.zero1_param_sync == "broadcast" and c.zero_stage == 1:
                    owners = self.states.zero1_split(c, layout[rank].layers, psi)[1]
                    t_param, ov_param = self.zero1_broadcasts_s(c, psi * wbytes, owners), False
                    l_param = self.zero1_broadcasts_load(c, psi * wbytes, owners)
                if prof.sync_grad_bucket_elements and ov_grad:
                    # one bucket in flight, each launched after a device-wide sync, the last
                    # one after backward (FrameworkProfile.sync_grad_bucket_elements); the
                    # buckets' hidden seconds slow the compute beside them (overlapped_comm)
                    op = ("all_reduce" if c.zero_stage == 0 or prof.zero1_grad_all_reduce
                          else "reduce_scatter")
                    grad_exposed = bucketed_exposed_s(self, c, layout[rank].layers, op, rbytes)
                    dp_slow += share * max(0.0, t_grad - grad_exposed)
                else:
                    grad_exposed = beside(t_grad, bwd1, ov_grad)
                dp_exposed = grad_exposed + beside(t_param, fwd1, ov_param)
                loads.append((l_grad + l_param, 1.0))
        elif c.zero_stage == 3 and train.param_offload:
            # one rank: no collectives, but FSDP still copies each unit in before its forward
            # (and backward, when resharded) and its gradients out, beside compute
            regather = (psi - keep[rank]) / psi if psi > 0 else 1.0
            dp_exposed = m * beside_copies(0.0, (1 + regather) * h2d + d2h, fwd1 + bwd1,
                                           ov_gather)
        optimizer_s = self.optimizer_step_s(c, layout[rank].layers, psi)
        grad_copy_s = self.compute_stream_copies_s(c, m, psi, gathers, reduces)
        if prof.fsdp2_copies and root_copies:
            # FSDP2's copy-out of each of those gathers, on the compute stream (fsdp2_copies)
            grad_copy_s += root_copies * 2 * wbytes / inp.hbm_Bps
        return DPCost(dp_exposed, dp_slow, grad_copy_s, optimizer_s, tuple(loads))

    def overlap_share(self, c: ParallelConfig, layers: tuple[int, ...], dp_g) -> float:
        """The share of :func:`autopar.cost.comm.overlapped_comm` for the DP collectives over
        ``dp_g`` beside the compute of graph ``layers`` under the resolved config ``c``: the
        SMs NCCL holds (:meth:`autopar.cost.groups.Groups.comm_share`) for every kernel, and on
        GPUs with persistent GEMMs the second wave those SMs force on each GEMM
        (:meth:`~autopar.cost.groups.Groups.gemm_share`) for the GEMMs' part of the layers'
        forward and backward seconds (:attr:`autopar.cost.compute.LayerTime.gemm_fwd_s`, three
        times over: forward and two backward GEMMs), mixed by
        :func:`autopar.hardware.nccl.mixed_share`."""
        other, gemm_share = self.groups.comm_share(dp_g), self.groups.gemm_share(dp_g)
        if gemm_share <= other:
            return other
        g = self.inputs.graph
        key = (layers, c.micro_batch_size, c.tp, c.cp, c.sequence_parallel, c.cp_mode,
               c.etp, c.ep, c.folded, dp_g.ranks)
        hit = self._shares.get(key)
        if hit is None:
            gemm = total = 0.0
            for li in layers:
                folded = c.folded and bool(g.layers[li].num_experts)
                lt = self.blocks.layer_time(li, c.micro_batch_size, c.tp, c.cp,
                                            c.sequence_parallel, c.cp_mode,
                                            c.etp if folded else None, c.ep)
                gemm += 3.0 * lt.gemm_fwd_s
                total += lt.fwd_s + lt.bwd_s
            hit = self._shares[key] = mixed_share(min(1.0, gemm / total) if total > 0 else 0.0,
                                                 gemm_share, other)
        return hit

    def reduction_groups(self, c: ParallelConfig, layers: tuple[int, ...],
                         psi: float) -> "ReductionGroups":
        """The groups a rank's ``psi`` parameter elements (of graph ``layers``) are reduced and
        gathered over: the dense ones over the dp x cp group, the routed experts' over the
        expert-data-parallel group (:meth:`autopar.cost.groups.Groups.group` "edp": Megatron-
        Core's separate expert gradient buffers), one collective when the two groups are the
        same (no expert parallelism, or no experts on the rank)."""
        dp_g = self.groups.group("dp", c)
        experts = 0.0
        if c.ep > 1 or c.folded:
            experts = (self.ranks.rank_params(c.tp, c.ep, layers, c.etp)[1]
                       * PARAMETER_COPIES.get(c.schedule, 1))
        edp_g = self.groups.group("edp", c) if experts > 0 else dp_g
        if edp_g.ranks == dp_g.ranks:
            return ReductionGroups(dp_g, psi, None, 0.0)
        return ReductionGroups(dp_g, psi - experts, edp_g, experts)

    def optimizer_step_s(self, c: ParallelConfig, layers: tuple[int, ...], psi: float) -> float:
        """Seconds of the optimizer step of the resolved config ``c`` on the pipeline rank
        holding graph layers ``layers`` and ``psi`` parameters: memory-bound over its ZeRO
        shard, or the PCIe transfers around a step offloaded to the CPU (whose CPU seconds are
        not priced: 0 under parameter offload with the step on the CPU)."""
        inp = self.inputs
        train, prof, p = inp.train, inp.profile, inp.params
        wbytes = train.dtype_bytes
        # the optimizer runs on the rank's ZeRO shard: over dp x cp, or over the framework's
        # smaller ZeRO group (zero1_group_size: InternEvo parallel.zero1, FSDP hybrid sharding);
        # the largest share paces the step (zero1_partition: whole tensors bound it below)
        if c.zero_stage >= 1:
            opt_params = self.states.zero1_split(c, layers, psi)[0]
        else:
            opt_params = psi
        if offload.grads_on_host(train):
            # parameter offload with the step on the CPU: the shards' copies ride with the
            # ZeRO-3 collectives (cost); the CPU step is not priced (autopar.cost.offload)
            optimizer_s = 0.0
        elif train.optimizer_offload:
            # ZeRO-Offload (Ren et al. 2021, USENIX ATC, sec. 4): gradients go to the host over
            # PCIe, the CPU runs Adam, the updated compute-dtype parameters come back; both
            # transfers at the GPU's host PCIe x16 bandwidth per direction (datasheet). The CPU
            # Adam step itself is not modelled (host memory bandwidth is not in the cluster
            # model): this is a lower bound on the offloaded step.
            gbytes = inp.conventions.grad_bytes or p.grad_bytes
            optimizer_s = opt_params * (gbytes + train.dtype_bytes) / inp.device.pcie_bandwidth_Bps
        else:
            # the framework's optimizer passes and gradient clipping, memory-bound
            # (FrameworkProfile.optimizer_step_bytes, sourced per framework)
            optimizer_s = opt_params * prof.optimizer_step_bytes / inp.hbm_Bps
            if train.param_offload:
                # DeepSpeed offload_param alone: the step updates the fp32 partition on the GPU
                # and writes the compute-dtype partition back to the host
                optimizer_s += opt_params * wbytes / inp.device.pcie_bandwidth_Bps
        if c.zero_stage == 0 and not train.optimizer_offload:
            # DeepSpeed's engine without ZeRO (FrameworkProfile.zero0_*): the mixed-precision
            # step's overflow check and flatten, whose per-tensor reads back to the host drain
            # the queue, so the host's time to issue each check is exposed
            optimizer_s += psi * prof.zero0_step_bytes / inp.hbm_Bps
            optimizer_s += (self.param_tensors(layers)
                            * prof.zero0_step_host_ops_per_tensor * p.host_op_s)
        elif c.zero_stage == 1 and not train.optimizer_offload:
            # a ZeRO-1 step that checks and measures every gradient of the rank's model, not
            # its shard, each tensor read back to the host (FrameworkProfile.zero1_step_*:
            # DeepSpeed 0.3.0 stage1.py)
            optimizer_s += psi * prof.zero1_step_bytes / inp.hbm_Bps
            optimizer_s += (self.param_tensors(layers)
                            * prof.zero1_step_host_ops_per_tensor * p.host_op_s)
        return optimizer_s

    def compute_stream_copies_s(self, c: ParallelConfig, m: int, psi: float, gathers: float,
                                reduces: float) -> float:
        """Seconds of one step's memory-bound copies that the sharded-DP implementation runs on
        the compute stream, for the resolved config ``c`` with ``m`` micro-batches on the rank
        holding ``psi`` parameters, which runs ``gathers`` all-gathers and ``reduces``
        reductions of them per step (:attr:`DPCost.copies_s`)."""
        inp = self.inputs
        prof = inp.profile
        wbytes, rbytes = inp.train.dtype_bytes, inp.reduce_bytes
        sharded = c.dp * c.cp > 1
        # FSDP1's flat-parameter views: autograd concatenates the gradients into the flat
        # gradient in every micro-batch's backward, on the compute stream
        # (FrameworkProfile.zero_grad_copy_passes; memory-bound, rank with the most parameters)
        grad_copy_s = 0.0
        if c.zero_stage in (2, 3) and sharded and prof.zero_grad_copy_passes:
            grad_copy_s = m * prof.zero_grad_copy_passes * psi * wbytes / inp.hbm_Bps
        # DeepSpeed ZeRO-1/2's bucket copies on the compute stream, per gradient reduction:
        # every micro-batch under ZeRO-2, once per step under ZeRO-1
        # (FrameworkProfile.zero12_grad_copy_passes, DEEPSPEED_ZERO12_GRAD_COPY_PASSES)
        if c.zero_stage in (1, 2) and sharded and prof.zero12_grad_copy_passes:
            reductions = m if c.zero_stage == 2 else 1
            grad_copy_s += (reductions * prof.zero12_grad_copy_passes * psi * wbytes
                            / inp.hbm_Bps)
        # FSDP2's copies on the compute stream (FrameworkProfile.fsdp2_copies): each gather's
        # copy-out reads and writes the gathered parameters; each reduce-scatter's copy-in reads
        # the gradients and writes them in the reduce dtype
        if prof.fsdp2_copies and c.zero_stage in (2, 3):
            grad_copy_s += psi * (gathers * 2 * wbytes + reduces * (wbytes + rbytes)) / inp.hbm_Bps
        # DeepSpeed's engine without ZeRO (FrameworkProfile.zero0_grad_copy_passes): the
        # reduction's flatten, post-scale and copy-back, once per step
        if c.zero_stage == 0 and sharded and prof.zero0_grad_copy_passes:
            grad_copy_s += prof.zero0_grad_copy_passes * psi * wbytes / inp.hbm_Bps
        return grad_copy_s

    def param_tensors(self, layers: tuple[int, ...]) -> int:
        """Gradient tensors on a rank holding graph layers ``layers``: one per op that owns
        parameters (a bias counted with its weight, so a lower bound; a tied weight's second use
        owns none)."""
        counts = self._param_tensors
        if counts is None:   # per layer, counted once
            counts = self._param_tensors = [sum(1 for op in layer.ops if op.num_parameters > 0)
                                            for layer in self.inputs.graph.layers]
        return sum(map(counts.__getitem__, layers))

    def zero1_broadcasts_s(self, c: ParallelConfig, nbytes: float, owners: int) -> float:
        """Seconds to return ``nbytes`` of updated parameters by one broadcast per ZeRO-1 rank
        that holds a share (``owners`` of them, :meth:`ModelStates.zero1_split`; InternEvo c18bec9
        hybrid_zero_optim.py ``broadcast_params`` skips the ranks without parameters) over the
        ZeRO group (the first z ranks of the data-parallel group, z = min(dp x cp,
        ``zero1_group_size``)), issued back to back on one communicator and waited on after the
        step. Each broadcast pays the group's chain latency (:mod:`autopar.hardware.collectives`:
        every rank of a ring broadcast that spans nodes is a network step), so the total grows
        as owners x z alpha at scale; the bytes cross the chain's bottleneck once in all."""
        grp = self.groups.zero1_group(c)
        if grp is None or owners < 1:
            return 0.0
        return owners * grp.time("broadcast", nbytes / owners)

    def zero1_broadcasts_load(self, c: ParallelConfig, nbytes: float, owners: int) -> LinkLoad:
        """The per-link :class:`LinkLoad` of the broadcasts :meth:`zero1_broadcasts_s` times."""
        grp = self.groups.zero1_group(c)
        if grp is None or owners < 1:
            return NO_LOAD
        return grp.load("broadcast", nbytes / owners).scaled(owners)
