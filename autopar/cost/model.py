"""CostModel: one graph, one cluster, one training config -> an Estimate per ParallelConfig.

A thin composition of the parts that each answer one question (each caching its own results,
so a search calling :meth:`CostModel.estimate` thousands of times pays for each distinct layer
once):

- per-layer compute (:mod:`.blocks`), per-rank layers and parameters (:mod:`.ranks`),
- model states (:mod:`.states`) and the per-rank layout (:mod:`.layout`),
- process groups and links (:mod:`.groups`), data-parallel cost (:mod:`.dp`),
- pipeline timing (:mod:`.pipeline.timing`), memory per rank (:mod:`.rank_memory`) and the
  estimate's warnings (:mod:`.notes`).

Step time: the pipelined step (Narayanan et al. 2021, section 2.2), then the exposed
data-parallel communication, the slowdown of the compute it runs beside (NCCL's thread blocks
hold SMs while a collective is in flight: :mod:`autopar.hardware.nccl`), the sharded-DP copies,
the optimizer step and the framework's fixed step cost.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from ..config import ParallelConfig, TrainingConfig
from ..errors import InvalidParallelConfig
from ..frameworks import FrameworkProfile, get_profile
from ..frameworks.memory import MemoryConventions
from ..graph.types import ModelGraph
from . import capacity, offload
from .blocks import CAUSAL_FLOPS_SHARE, BlockCost, BlockCosts
from .buckets import bucketed_exposed_s
from .comm import Collectives, CommLedger
from .compute import LayerTime
from .context import CostInputs, check_seq_len
from .dp import DataParallel
from .embedding_sync import EmbeddingSync
from .groups import Groups
from .layout import Layouts, StageLayout
from .notes import estimate_notes, host_bound_notes, resolve_notes
from .params import CostParams
from .pipeline.timing import PipelineTimer
from .rank_memory import rank_memory
from .ranks import RankLayers
from .regime import (ErrorBand, Regime, band_for, headroom_warnings, plausibility_warnings,
                     sharding_kind)
from .resolve import resolve
from .states import ModelStates
from .types import Estimate, LinkComm, TimeBreakdown

#: Fields :func:`autopar.cost.resolve.resolve` copies unchanged, reading the last two only for
#: their per-block lengths (:meth:`CostModel._resolve_new`).
_COPIED_BY_RESOLVE = ("zero_stage", "recompute", "reshard_after_forward")

__all__ = ["CAUSAL_FLOPS_SHARE", "BlockCost", "CostModel", "StageLayout"]


class CostModel:
    """Estimates training steps of ``graph`` on ``cluster`` under ``train``.

    Args:
        graph: the extracted model, measured at ``graph.micro_batch_size`` sequences of
            ``train.seq_len`` tokens.
        cluster: an :class:`autopar.hardware.Cluster`.
        train: the training configuration.
        params: calibration constants (defaults documented in :class:`CostParams`).
        attention_kernel: the fused attention kernel; None = the framework profile's kernel for
            the GPU's architecture.
        framework: the framework profile whose cost fields apply (attention kernel, fusion,
            which communication overlaps compute, gradient-reduce dtype, fixed step cost);
            None = the profile of ``train.framework``
            (:func:`autopar.frameworks.get_profile`).
        conventions: how memory is laid out (:class:`autopar.frameworks.memory.MemoryConventions`);
            None = those of the framework profile.

    Raises:
        autopar.errors.InvalidTrainingConfig: the graph was extracted at another sequence
            length than ``train.seq_len`` (:func:`autopar.cost.context.check_seq_len`), or the
            GPU lacks the training precision (e.g. fp8 on A100), raised by the device catalog;
            or an offload kind the framework does not run
            (:func:`autopar.cost.offload.check_framework`), or an MoE capacity factor the
            framework or the model does not have (:mod:`autopar.cost.capacity`).
    """

    def __init__(self, graph: ModelGraph, cluster, train: TrainingConfig,
                 params: CostParams | None = None, attention_kernel: str | None = None,
                 framework: FrameworkProfile | None = None,
                 conventions: MemoryConventions | None = None):
        check_seq_len(graph, train)
        offload.check_framework(train)
        capacity.check_model(train, graph.num_experts,   # a dense model first: no framework
                             max((ly.experts_per_token for ly in graph.layers), default=0))
        capacity.check_framework(train)                  # would make its capacity factor run
        self._given = (params, attention_kernel, framework, conventions)   # for rebuilt()
        self.inputs = inp = CostInputs.build(graph, cluster, train, params, attention_kernel,
                                             framework or get_profile(train.framework),
                                             conventions)
        self.graph, self.cluster, self.train = graph, cluster, train
        self.params, self.device, self.profile = inp.params, cluster.device, inp.profile
        self.conventions, self.attention_kernel = inp.conventions, inp.attention_kernel
        self.peak, self.compute_peak, self.hbm_Bps = inp.peak, inp.compute_peak, inp.hbm_Bps
        self.reduce_bytes = inp.reduce_bytes
        self.blocks = list(inp.blocks)
        # the parts, each answering one question (module docstring)
        self.groups = Groups(cluster, inp.profile)
        self.ranks = RankLayers(graph, inp.blocks)
        self.states = ModelStates(inp, self.ranks)
        self.blocks_cost = BlockCosts(inp, self.groups)
        self.layouts = Layouts(inp, self.groups, self.ranks, self.states)
        self.dp = DataParallel(inp, self.groups, self.ranks, self.states, self.blocks_cost)
        self.pipeline = PipelineTimer(inp, self.ranks, self.blocks_cost)
        self.embedding_sync = EmbeddingSync(inp, self.groups, self.ranks)
        self._estimates: dict[ParallelConfig, Estimate] = {}
        self._regimes: dict[str, tuple[Regime, ErrorBand]] = {}   # by sharding kind (_regime)
        self._steps: dict[ParallelConfig, float] = {}
        self._noted: dict[ParallelConfig, tuple[Estimate, Estimate]] = {}
        self._resolved: dict[ParallelConfig, ParallelConfig | InvalidParallelConfig] = {}
        # a resolved configuration by its fields less those resolving only copies
        # (_resolve_new)
        self._resolved_keys: dict[tuple, ParallelConfig] = {}

    # -- the parts' answers, under the names callers use ----------------------------------------
    def layer_time(self, index: int, b: int, tp: int, cp: int, sp: bool,
                   cp_mode: str = "ulysses", etp: int | None = None,
                   ep: int | None = None) -> LayerTime:
        """:meth:`autopar.cost.blocks.BlockCosts.layer_time`."""
        return self.blocks_cost.layer_time(index, b, tp, cp, sp, cp_mode, etp, ep)

    def block_cost(self, index: int, mode: str, c: ParallelConfig) -> BlockCost:
        """:meth:`autopar.cost.blocks.BlockCosts.block_cost`."""
        return self.blocks_cost.block_cost(index, mode, c)

    def group(self, dim: str, c: ParallelConfig) -> Collectives:
        """:meth:`autopar.cost.groups.Groups.group`."""
        return self.groups.group(dim, c)

    def comm_share(self, grp: Collectives) -> float:
        """:meth:`autopar.cost.groups.Groups.comm_share`."""
        return self.groups.comm_share(grp)

    def rank_layers(self, pp: int, stage_blocks: tuple[int, ...],
                    schedule: str = "1f1b") -> tuple[tuple, ...]:
        """:meth:`autopar.cost.ranks.RankLayers.rank_layers`."""
        return self.ranks.rank_layers(pp, stage_blocks, schedule)

    def stage_layout(self, c: ParallelConfig) -> tuple[StageLayout, ...]:
        """:meth:`autopar.cost.layout.Layouts.stage_layout`."""
        return self.layouts.stage_layout(c)

    def interval_layout(self, c: ParallelConfig, rank: int, start: int, end: int) -> StageLayout:
        """:meth:`autopar.cost.layout.Layouts.interval_layout`."""
        return self.layouts.interval_layout(c, rank, start, end)

    def zero1_split(self, c: ParallelConfig, layers: tuple[int, ...],
                    params: float) -> tuple[float, int]:
        """:meth:`autopar.cost.states.ModelStates.zero1_split`."""
        return self.states.zero1_split(c, layers, params)

    def state_bytes_per_param(self) -> int:
        """:meth:`autopar.cost.states.ModelStates.state_bytes_per_param`."""
        return self.states.state_bytes_per_param()

    def optimizer_step_bytes(self, c: ParallelConfig, params: float) -> float:
        """:meth:`autopar.cost.states.ModelStates.optimizer_step_bytes`."""
        return self.states.optimizer_step_bytes(c, params)

    def sync_bucket_exposed_s(self, c: ParallelConfig, layers: tuple[int, ...], op: str,
                              nbytes_per_element: float, overlap: float = 1.0) -> float:
        """:func:`autopar.cost.buckets.bucketed_exposed_s`."""
        return bucketed_exposed_s(self.dp, c, layers, op, nbytes_per_element, overlap)

    @property
    def model_flops_per_sequence(self) -> float:
        """:meth:`autopar.cost.blocks.BlockCosts.model_flops_per_sequence`."""
        return self.blocks_cost.model_flops_per_sequence()

    @property
    def reserved_bytes(self) -> float:
        """Bytes per GPU the model cannot use (context, workspaces, fragmentation) of the memory
        the framework sees (:attr:`autopar.hardware.Device.visible_memory_bytes`)."""
        cap = self.device.visible_memory_bytes
        return cap - self.params.usable_memory(cap)

    # -- the estimate --------------------------------------------------------------------------
    def resolve(self, config: ParallelConfig) -> ParallelConfig:
        """``config`` with every open field chosen by default and checked (see resolve.py).

        Cached per configuration (a pure function of it for this model, cluster and training
        config; the search resolves the same configurations many times).

        Raises:
            InvalidParallelConfig: the configuration breaks a rule (message names it and a fix).
        """
        hit = self._resolved.get(config)
        if hit is None:
            hit = self._resolved[config] = self._resolve_new(config)
            if isinstance(hit, ParallelConfig):
                self._resolved.setdefault(hit, hit)   # resolving a resolved config: itself
        if isinstance(hit, InvalidParallelConfig):   # a copy (a fresh traceback), .rule kept
            raise copy.copy(hit)
        return hit

    def _resolve_new(self, config: ParallelConfig) -> ParallelConfig | InvalidParallelConfig:
        """:func:`autopar.cost.resolve.resolve` of ``config`` (its error, returned), without
        its rules where a configuration that differs only in ZeRO stage, recomputation and
        kept-gathered flags resolved: resolving reads those three only to check the lengths of
        the per-block tuples (it copies them, and reads no ZeRO stage); every other choice and
        check is a function of the remaining fields. So ``config`` resolves to that one's
        resolution with its own three fields, once its tuples have the model's block count
        (the search asks for each mesh under many recomputations and ZeRO stages); to itself,
        not a copy, where resolving changes nothing else."""
        key = config.fields_except(*_COPIED_BY_RESOLVE)
        done = self._resolved_keys.get(key)
        if done is None:
            try:
                hit = resolve(config, self.graph, self.cluster.world_size, self.train,
                              self.cluster.gpus_per_node, self.profile,
                              getattr(self.cluster.inter_link, "kind", None))
            except InvalidParallelConfig as exc:
                return exc
            self._resolved_keys[key] = hit
            # a resolved configuration resolves to itself (resolve fills open fields only)
            self._resolved_keys.setdefault(hit.fields_except(*_COPIED_BY_RESOLVE), hit)
            return hit
        blocks = self.graph.num_blocks
        try:
            config.block_recompute(blocks)   # resolve's own length checks, in its order
            config.block_reshard(blocks)
        except InvalidParallelConfig as exc:
            return exc
        if done.fields_except(*_COPIED_BY_RESOLVE) == key:
            return config
        return done.replace(zero_stage=config.zero_stage, recompute=config.recompute,
                            reshard_after_forward=config.reshard_after_forward)

    def rebuilt(self, cluster=None, train: TrainingConfig | None = None) -> "CostModel":
        """This cost model on another ``cluster`` and/or ``train`` (None = the same), with the
        same graph, constants, attention kernel, framework profile and memory conventions as
        given to this one (a copied and edited profile stays in force).

        Raises:
            InvalidTrainingConfig: ``train`` has another sequence length than the graph."""
        return CostModel(self.graph, cluster or self.cluster, train or self.train, *self._given)

    def estimate(self, config: ParallelConfig) -> Estimate:
        """Predict step time, MFU, memory and communication of one configuration.

        Raises:
            InvalidParallelConfig: the configuration breaks a rule of the model or cluster.
        """
        c = self.resolve(config)
        hit = self._estimates.get(c)
        if hit is None:   # a pure function of the resolved config (the search asks twice)
            hit = self._estimates[c] = self._estimate(c)
        notes = resolve_notes(config)
        if notes:   # the noted estimate is cached too: one object per configuration asked
            noted = self._noted.get(config)
            if noted is None or noted[0] is not hit:
                noted = self._noted[config] = (hit, replace(
                    hit, warnings=(*hit.warnings, *notes)))
            hit = noted[1]
        return hit

    def step_without_dp_s(self, config: ParallelConfig) -> float:
        """``step_time_s - (dp_comm_exposed + overlap_slowdown + dp_copies)`` of
        :meth:`estimate`'s time breakdown (seconds): the step less everything the data-parallel
        collectives cost, bitwise, without the memory model (what a search bound needs, the same
        for ZeRO stages 1-3; cached).

        Raises:
            InvalidParallelConfig: the configuration breaks a rule of the model or cluster.
        """
        c = self.resolve(config)
        e = self._estimates.get(c)
        if e is not None:
            tb = e.time_breakdown
            return e.step_time_s - (tb.dp_comm_exposed + tb.overlap_slowdown + tb.dp_copies)
        hit = self._steps.get(c)
        if hit is None:
            step, dp_cost = self._step(c, time_only=True)[:2]
            hit = self._steps[c] = step - (dp_cost.exposed_s + dp_cost.slowdown_s
                                           + dp_cost.copies_s)
        return hit

    def step_time_s(self, config: ParallelConfig) -> float:
        """:meth:`estimate`'s ``step_time_s`` (seconds), bitwise, without the memory model,
        the traffic ledger and the notes (a search's screen before a full estimate; not
        cached: the estimate's cache is used when it has the configuration).

        Raises:
            InvalidParallelConfig: the configuration breaks a rule of the model or cluster.
        """
        c = self.resolve(config)
        e = self._estimates.get(c)
        if e is not None:
            return e.step_time_s
        return self._step(c, time_only=True)[0]

    def _step(self, c: ParallelConfig, time_only: bool = False):
        """(step seconds, :class:`~autopar.cost.dp.DPCost`, pipeline timing, layout, kept
        gathered elements per rank) of the resolved config ``c``.

        Raises:
            InvalidParallelConfig: parameter offload without ZeRO-3
                (:func:`autopar.cost.offload.check_plan`; not a rule of the mesh, so not in
                :meth:`resolve`, which the search asks of mesh skeletons).
        """
        offload.check_plan(self.train, c)
        layout = self.layouts.time_layout(c) if time_only else self.layouts.stage_layout(c)
        pt = self.pipeline.timing(c, layout)
        keep = self.states.kept_gathered(c, layout)
        b = pt.bottleneck
        dpc = self.dp.cost(c, layout, b, pt.stage_fwd[b], pt.stage_bwd[b], keep,
                           with_loads=not time_only)
        # the embedding copies' all-reduce, after the DP reduction with nothing beside it
        sync_s, sync_load = self.embedding_sync.cost(c)
        if sync_s > 0:
            dpc = replace(dpc, exposed_s=dpc.exposed_s + sync_s,
                          loads=dpc.loads + (((sync_load, 1.0),) if not time_only else ()))
        step = (pt.t_pipe + dpc.copies_s + dpc.exposed_s + dpc.slowdown_s + dpc.optimizer_s
                + self.profile.step_fixed_s)
        return step, dpc, pt, layout, keep

    def _regime(self, c: ParallelConfig) -> tuple[Regime, ErrorBand]:
        """The :class:`Regime` of the resolved config ``c`` and its error band
        (:func:`autopar.cost.regime.band_for`): for one model, cluster and training config a
        function of the plan's sharding kind only (:meth:`Regime.of`), so cached by it (both
        are frozen)."""
        kind = sharding_kind(c.tp, c.pp, c.cp, c.zero_stage)
        hit = self._regimes.get(kind)
        if hit is None:
            regime = Regime.of_kind(self.train, self.cluster, self.graph, kind)
            hit = self._regimes[kind] = (regime, band_for(regime))
        return hit

    def _estimate(self, c: ParallelConfig) -> Estimate:
        """:meth:`estimate` of the resolved config ``c``, uncached."""
        train, device = self.train, self.device
        m = train.global_batch_size // (c.dp * c.micro_batch_size)
        step, dpc, pt, layout, keep = self._step(c)
        ledger = CommLedger(*self.cluster.link_classes)
        for kind, load in pt.rank_comm[pt.bottleneck]:  # per GPU: one rank's traffic
            ledger.add(kind, load, times=m)
        for load, times in dpc.loads:
            ledger.add("dp", load, times=times)
        mem = rank_memory(self.inputs, c, layout, pt, keep, self.blocks_cost, self.states)
        totals = mem.totals
        peak_rank = max(range(c.pp), key=lambda r: totals[r])

        # FLOPs: causal attention executes half of its counted (non-causal) FLOPs: count that
        # half, forward and backward, so utilisation never exceeds what the GPU can do
        model_flops = self.model_flops_per_sequence * train.global_batch_size
        hw_flops = model_flops + pt.recompute_flops * m * c.dp * c.tp * c.cp
        world = self.cluster.world_size
        nominal = device.peak(train.precision)   # MFU against the datasheet peak
        mfu = model_flops / (step * world * nominal)
        hfu = hw_flops / (step * world * nominal)
        parts = pt.stage_parts[pt.bottleneck]
        ep_comm = parts.ep_comm
        if pt.overlap:  # the all-to-all seconds hidden inside DualPipeV's pairs are not exposed
            ep_comm -= c.virtual_stages * pt.overlap[pt.bottleneck]
        breakdown = TimeBreakdown(
            compute=m * parts.compute, tp_comm=m * parts.tp_comm, cp_comm=m * parts.cp_comm,
            ep_comm=m * ep_comm, pp_comm=m * parts.pp_comm, bubble=pt.bubble,
            dp_comm_exposed=dpc.exposed_s, overlap_slowdown=dpc.slowdown_s,
            dp_copies=dpc.copies_s, optimizer=dpc.optimizer_s,
            fixed_step=self.profile.step_fixed_s, host_exposed=m * parts.host)
        regime, band = self._regime(c)
        warns = (*self.graph.warnings, *plausibility_warnings(mfu, regime),
                 *estimate_notes(self.inputs, c),
                 *host_bound_notes(self.inputs, pt.stage_host, breakdown.host_exposed, step),
                 *headroom_warnings(totals[peak_rank], device.visible_memory_bytes,
                                    moe=self.graph.num_experts > 0))
        return Estimate(
            error_band=band, warnings=warns,
            config=c, step_time_s=step, mfu=mfu, hfu=hfu,
            tokens_per_s=train.tokens_per_step / step,
            memory_per_gpu_bytes=totals[peak_rank],
            memory_limit_bytes=device.visible_memory_bytes,
            fits=max(mem.allocated) <= device.visible_memory_bytes, num_micro_batches=m,
            model_flops_per_step=model_flops, time_breakdown=breakdown,
            memory_breakdown=mem.breakdowns[peak_rank],
            stage_memory_bytes=totals, stage_time_s=pt.stage_time,
            comm_by_link=tuple(
                LinkComm(k, nbytes, ledger.seconds_by_link[k], tuple(ledger.kinds_by_link[k]))
                for k, nbytes in sorted(ledger.bytes_by_link.items()) if k != "local"),
            peak_stage=peak_rank,
            stage_fwd_s=pt.stage_fwd, stage_bwd_s=pt.stage_bwd, stage_wgrad_s=pt.stage_wgrad,
            stage_memory_breakdown=mem.breakdowns,
            group_links=self.groups.links(c),
        )
