"""Pipeline timing: per pipeline rank, one micro-batch's forward, backward and weight-gradient
seconds, the parts of the step they charge, activation and transient bytes and traffic; then the
pipelined step and its bubble (:class:`PipelineTiming`, built and cached by
:class:`PipelineTimer`). None of it reads the ZeRO stage.

Step time (Narayanan et al. 2021, section 2.2): with m micro-batches, per-micro-batch stage times
t_i and v virtual stages, ``T_pipe = m * max_i t_i + (sum_i t_i - max_i t_i) / v``
(:func:`autopar.cost.pipeline.schedule.pipeline_step_time`; the split-backward schedules replay
torch's own order).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from ...config import DUAL_PIPES, ParallelConfig
from ...hardware.collectives import NO_LOAD, LinkLoad
from ..blocks import BlockCosts, block_cost_fields
from ..context import CostInputs
from ..host import host_exposed_s
from ..ranks import RankLayers
from .schedule import pipeline_step_time


@dataclass(frozen=True)
class StageParts:
    """Seconds of one micro-batch on one pipeline rank by component (all its chunks): compute
    (forward, backward and recompute), and the exposed TP, CP, EP and pipeline-send seconds."""

    compute: float
    tp_comm: float
    cp_comm: float
    ep_comm: float
    pp_comm: float
    #: host issue seconds beyond the stream's (:mod:`autopar.cost.host`), forward + backward
    host: float = 0.0


@dataclass(frozen=True)
class RankSums:
    """One pipeline rank's per-micro-batch sums over its layers (:meth:`PipelineTimer._sums`),
    each accumulated from 0 in the order of the rank's (layer kind, mode) items.

    Attributes:
        compute, fwd, bwd, wgrad: compute, forward, backward and weight-gradient seconds.
        act: saved activation bytes; transient: the largest transient bytes of one layer.
        tp_s, cp_s, ep_s: TP, CP and EP seconds; tp_load, cp_load, ep_load: their link loads.
        recompute_flops: each item's recompute FLOPs per GPU (summed by the caller, in order).
        host_fwd_s, host_bwd_s: host seconds to issue the forward and the backward kernels
            (:mod:`autopar.cost.host`).
    """

    compute: float
    fwd: float
    bwd: float
    wgrad: float
    act: float
    transient: float
    tp_s: float
    cp_s: float
    ep_s: float
    tp_load: LinkLoad
    cp_load: LinkLoad
    ep_load: LinkLoad
    recompute_flops: tuple[float, ...]
    host_fwd_s: float
    host_bwd_s: float


@dataclass(frozen=True)
class PipelineTiming:
    """What a config's pipeline costs, per pipeline rank where a tuple (rank order).

    Attributes:
        stage_time: seconds of one micro-batch, forward + backward.
        stage_parts: :class:`StageParts` of one micro-batch.
        stage_fwd, stage_bwd, stage_wgrad: seconds of one micro-batch's forward, backward
            (with recompute and communication) and the weight-gradient part of backward.
        stage_act: saved activation bytes of one micro-batch.
        stage_transient: the largest transient bytes of any of the rank's layers.
        recompute_flops: FLOPs the recomputed forwards repeat, per GPU and micro-batch, summed
            over the ranks.
        rank_comm: per rank, one GPU's traffic per micro-batch as (mesh dimension, load).
        bottleneck: the rank with the largest ``stage_time``.
        overlap: per rank, seconds one DualPipeV pair hides of its expert-parallel all-to-alls
            (None where the framework does not overlap them).
        t_pipe: seconds of the pipelined step (compute and in-stage communication).
        bubble: pipeline idle seconds of it.
        stage_host: per rank, one micro-batch's (forward, backward) stream seconds before any
            host excess and (forward, backward) host seconds to issue its kernels
            (:mod:`autopar.cost.host`), for :func:`autopar.cost.notes.host_bound_notes`.
    """

    stage_time: tuple[float, ...]
    stage_parts: tuple[StageParts, ...]
    stage_fwd: tuple[float, ...]
    stage_bwd: tuple[float, ...]
    stage_wgrad: tuple[float, ...]
    stage_act: tuple[float, ...]
    stage_transient: tuple[float, ...]
    recompute_flops: float
    rank_comm: tuple[tuple[tuple[str, LinkLoad], ...], ...]
    bottleneck: int
    overlap: tuple[float, ...] | None
    t_pipe: float
    bubble: float
    stage_host: tuple[tuple[float, float, float, float], ...] = ()


class PipelineTimer:
    """:class:`PipelineTiming` of configs of one cost model, cached per config less its ZeRO
    fields (the search's estimates of one config under several ZeRO stages share it).

    Args:
        inputs: the cost model's :class:`~autopar.cost.context.CostInputs`.
        ranks, blocks: its rank layers and per-layer costs.
    """

    def __init__(self, inputs: CostInputs, ranks: RankLayers, blocks: BlockCosts):
        self.inputs, self.ranks, self.blocks = inputs, ranks, blocks
        self._pipelines: dict[tuple, PipelineTiming] = {}
        self._rank_sums: dict[tuple, RankSums] = {}
        self._signature = [layer.signature for layer in inputs.graph.layers]

    def pair_overlap(self, c: ParallelConfig, parts: list[dict], stage_time: list[float]
                     ) -> tuple[float, ...] | None:
        """Per pipeline rank, seconds one DualPipeV forward-backward pair (of one chunk each)
        saves by hiding expert-parallel all-to-alls behind the other half's compute, or None.

        Only where the target framework runs that overlap: torchtitan v0.2.2 registers
        ``overlap_callback`` for ``OVERLAP_F_B`` on ``ScheduleDualPipeV`` when
        ``pipeline_parallel_expert_parallel_overlap`` is on and ep > 1
        (torchtitan/distributed/pipeline_parallel.py ``build_pipeline_schedule``,
        distributed/dual_pipe_v.py), which refuses activation checkpointing
        (``get_dual_pipe_v_flag``); stock torch runs the pair's halves one after the other.
        DeepSeek-V3 (arXiv 2412.19437, section 3.2.1) hides all-to-all this way in DualPipe,
        recomputing RMSNorm and the MLA up-projections as it does (section 3.3.1), so the
        ``dualpipe`` overlap keeps recomputation. The hidden part is the pair's all-to-all
        seconds, at most the pair's other work.
        """
        if c.schedule not in DUAL_PIPES or c.ep == 1 or c.pp == 1:
            return None
        if c.schedule not in self.inputs.profile.overlaps_ep_comm:
            return None
        if c.schedule == "dualpipev" and any(
                mode != "none" for mode in c.block_recompute(len(self.inputs.blocks))):
            return None   # torchtitan's DualPipeV overlap refuses activation checkpointing
        v = c.virtual_stages
        out = []
        for part, total in zip(parts, stage_time):
            ep = part["ep_comm"] / v   # forward + backward all-to-alls of one chunk
            out.append(min(ep, total / v - ep))
        return tuple(max(0.0, x) for x in out)

    def _sums(self, c: ParallelConfig, st, rank_layers, uniform, rank_modes) -> RankSums:
        """One rank's per-micro-batch :class:`RankSums` over its layers (``st``: its
        StageLayout; ``uniform``: the config's one recompute mode, or None when per block, then
        ``rank_modes``: the mode of each of its layers)."""
        if uniform is not None:  # identical layers cost the same: count them once
            items = [(li, uniform, n) for li, n in rank_layers[2]]
        else:
            # (signature, mode) -> count in first-seen order, and the first layer of each
            # (a dict keeps the last value written: the reversed walk leaves the first)
            keys = list(zip(map(self._signature.__getitem__, st.layers), rank_modes))
            first = dict(zip(reversed(keys), reversed(st.layers)))
            items = [(first[k], k[1], n) for k, n in Counter(keys).items()]
        compute = fwd = bwd = wgrad = act = transient = host_f = host_b = 0.0
        tp_s = cp_s = ep_s = 0.0
        tp_l = cp_l = ep_l = NO_LOAD
        flops = []
        for li, mode, n in items:
            bc = self.blocks.block_cost(li, mode, c)
            compute += n * bc.compute_s
            fwd += n * bc.fwd_s
            bwd += n * bc.bwd_s
            host_f += n * bc.host_fwd_s
            host_b += n * bc.host_bwd_s
            wgrad += n * bc.wgrad_s
            tp_s += n * bc.tp_s
            cp_s += n * bc.cp_s
            ep_s += n * bc.ep_s
            tp_l += bc.tp_load.scaled(n)
            cp_l += bc.cp_load.scaled(n)
            ep_l += bc.ep_load.scaled(n)
            flops.append(n * bc.recompute_flops)
            act += n * bc.act_bytes
            transient = max(transient, bc.transient_bytes)
        return RankSums(compute, fwd, bwd, wgrad, act, transient, tp_s, cp_s, ep_s, tp_l, cp_l,
                        ep_l, tuple(flops), host_f, host_b)

    def timing(self, c: ParallelConfig, layout: tuple) -> PipelineTiming:
        """The :class:`PipelineTiming` of the resolved config ``c`` whose ranks hold ``layout``
        (:class:`~autopar.cost.layout.StageLayout` per rank).

        None of it reads the ZeRO stage or the kept-gathered flags: per-layer costs
        (:meth:`BlockCosts.block_cost`) and the pipeline traffic, layers and parameter counts of
        ``layout`` do not depend on them (only its model states do, which this part does not
        read). So it is cached per configuration less those two fields, and the search's
        estimates of one configuration under several ZeRO stages share it."""
        key = c.fields_except("zero_stage", "reshard_after_forward")
        hit = self._pipelines.get(key)
        if hit is not None:
            return hit
        pp, v = c.pp, c.virtual_stages
        m = self.inputs.train.global_batch_size // (c.dp * c.micro_batch_size)
        uniform = c.recompute if isinstance(c.recompute, str) else None
        blocks = self.inputs.blocks
        modes = None if uniform else dict(zip(blocks, c.block_recompute(len(blocks))))
        ranks = self.ranks.rank_layers(pp, c.stage_blocks, c.schedule)
        stage_time = [0.0] * pp
        stage_parts = [dict(compute=0.0, tp_comm=0.0, cp_comm=0.0, ep_comm=0.0, pp_comm=0.0,
                            host=0.0)
                       for _ in range(pp)]
        stage_fwd = [0.0] * pp
        stage_bwd = [0.0] * pp
        stage_wgrad = [0.0] * pp
        stage_act = [0.0] * pp
        stage_transient = [0.0] * pp
        recompute_flops = 0.0
        rank_comm: list[list[tuple]] = [[] for _ in range(pp)]  # one GPU's traffic per rank
        stage_host = []
        # a rank's sums depend on the configuration less its ZeRO fields and on the recompute
        # modes of that rank's own layers: variants that change one rank's modes reuse the rest
        base = c.fields_except("zero_stage", "reshard_after_forward", "recompute")
        # under one mode for all layers, the sums are those of the rank's (signature, count)
        # items in order, each priced by BlockCosts.block_cost (cached by the layer's
        # signature and these fields of the configuration): ranks and stage cuts whose items
        # agree share them (the middle ranks of an even cut)
        costs = block_cost_fields(c)
        sig = self._signature
        for rank, st in enumerate(layout):
            rank_modes = None if uniform is not None else tuple(
                map(modes.get, st.layers, itertools.repeat("none")))
            rank_key = (base, rank, rank_modes) if uniform is None else (
                costs, uniform, tuple((sig[li], n) for li, n in ranks[rank][2]))
            sums = self._rank_sums.get(rank_key)
            if sums is None:
                sums = self._rank_sums[rank_key] = self._sums(c, st, ranks[rank], uniform,
                                                              rank_modes)
            parts = stage_parts[rank]
            parts["compute"] += sums.compute
            stage_fwd[rank] += sums.fwd
            stage_bwd[rank] += sums.bwd
            stage_wgrad[rank] += sums.wgrad
            for term in sums.recompute_flops:   # in the order of the ranks' items, one running sum
                recompute_flops += term
            stage_act[rank] += sums.act
            stage_transient[rank] = max(stage_transient[rank], sums.transient)
            parts["tp_comm"] += sums.tp_s
            parts["cp_comm"] += sums.cp_s
            parts["ep_comm"] += sums.ep_s
            rank_comm[rank] += [("tp", sums.tp_load), ("cp", sums.cp_load), ("ep", sums.ep_load)]
            # pipeline sends block the stage unless the framework runs them beside compute
            p2p_exposed = 0.0 if c.schedule in self.inputs.profile.overlap_pp_p2p else st.p2p_s
            stage_parts[rank]["pp_comm"] += p2p_exposed
            stage_fwd[rank] += p2p_exposed / 2
            stage_bwd[rank] += p2p_exposed / 2
            # the ledger shows what this rank sends and how long sending it takes; the step time
            # charges each boundary's round trip to the rank before it (p2p_s above)
            rank_comm[rank].append(("pp", st.p2p_load))
            # the host issues each pass's kernels one by one: a pass takes at least their
            # issue time (autopar.cost.host); only the excess over the stream's seconds shows
            stage_host.append((stage_fwd[rank], stage_bwd[rank], sums.host_fwd_s,
                               sums.host_bwd_s))
            host_fx = host_exposed_s(stage_fwd[rank], sums.host_fwd_s)
            host_bx = host_exposed_s(stage_bwd[rank], sums.host_bwd_s)
            stage_fwd[rank] += host_fx
            stage_bwd[rank] += host_bx
            parts["host"] += host_fx + host_bx
            stage_time[rank] = stage_fwd[rank] + stage_bwd[rank]
        # pipeline
        t_max = max(stage_time)
        bottleneck = stage_time.index(t_max)
        overlap = self.pair_overlap(c, stage_parts, stage_time)
        t_pipe, bubble = pipeline_step_time(stage_fwd, stage_bwd, m, v, c.schedule,
                                            wgrad=stage_wgrad, overlap=overlap)
        hit = self._pipelines[key] = PipelineTiming(
            tuple(stage_time), tuple(StageParts(**p) for p in stage_parts), tuple(stage_fwd),
            tuple(stage_bwd), tuple(stage_wgrad), tuple(stage_act), tuple(stage_transient),
            recompute_flops, tuple(tuple(rc) for rc in rank_comm), bottleneck, overlap, t_pipe,
            bubble, tuple(stage_host))
        return hit
