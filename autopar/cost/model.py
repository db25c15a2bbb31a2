"""CostModel: one graph, one cluster, one training config -> an Estimate per ParallelConfig.

Step time (Narayanan et al. 2021, section 2.2): with m micro-batches, per-micro-batch stage times
t_i (forward + backward + recompute + TP/CP communication + pipeline sends) and v virtual stages,
``T_pipe = m * max_i t_i + (sum_i t_i - max_i t_i) / v``; for uniform stages this is
``(m + (p - 1) / v) * t``, the 1F1B bubble (p - 1) / (v m) of the ideal time. Then the exposed
data-parallel communication, the slowdown of the compute it runs beside (NCCL's thread blocks
hold SMs while a collective is in flight: :mod:`autopar.hardware.nccl`) and the optimizer step
are added.

The object caches per-layer results (keyed by layer signature and sharding), so a search calling
:meth:`CostModel.estimate` thousands of times pays for each distinct layer once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import DEFAULT_PLACEMENT, ParallelConfig, TrainingConfig
from ..errors import InvalidParallelConfig
from ..frameworks import FrameworkProfile, get_profile
from ..frameworks.memory import MemoryConventions
from ..graph.kernels import ATTENTION_BACKWARD_RATIO
from ..graph.types import ModelGraph
from . import memory as mem
from ..hardware.collectives import NO_LOAD, LinkLoad
from ..hardware.nccl import compute_share_taken, local_nics
from .comm import (Collectives, CommLedger, cp_layer_comm, overlapped_comm, split_expert_tp,
                   tp_layer_comm)
from .compute import LayerTime, layer_time
from .params import CostParams
from .regime import Regime, band_for, headroom_warnings, plausibility_warnings
from .resolve import resolve
from .pipeline_orders import V_SHAPED, chunk_counts_at_peak, held_chunks_at_peak, stage_rank
from .schedule import pipeline_step_time
from .stages import chunk_layers
from .types import Estimate
from .zero1 import greedy_shares, owners

#: Share of a causal attention op's counted (non-causal, FlopCounterMode) FLOPs that MFU and HFU
#: leave out: the masked upper triangle a causal kernel skips (the FLOPs convention of
#: :data:`autopar.cost.types.FLOPS_CONVENTION`; a convention, not a calibration constant).
CAUSAL_FLOPS_SHARE = 0.5


@dataclass(frozen=True)
class BlockCost:
    """One layer's cost per micro-batch on one GPU under one recompute mode.

    Times in seconds (fwd_s/bwd_s include TP and CP communication; bwd_s includes recompute;
    ``tp_s`` is the exposed TP time), communication per GPU and micro-batch as
    :class:`~autopar.hardware.collectives.LinkLoad` (bytes on the wire and the seconds each link
    carries them before overlap, see :mod:`autopar.cost.comm`), FLOPs per GPU.
    """

    fwd_s: float
    bwd_s: float
    compute_s: float
    tp_s: float
    cp_s: float
    tp_load: LinkLoad
    cp_load: LinkLoad
    recompute_flops: float
    act_bytes: float
    transient_bytes: float
    ep_s: float = 0.0
    ep_load: LinkLoad = NO_LOAD
    wgrad_s: float = 0.0

    @property
    def tp_bytes(self) -> float:
        """TP bytes on the wire per GPU and micro-batch, all links."""
        return self.tp_load.nbytes

    @property
    def cp_bytes(self) -> float:
        """CP bytes on the wire per GPU and micro-batch, all links."""
        return self.cp_load.nbytes

    @property
    def ep_bytes(self) -> float:
        """EP all-to-all bytes on the wire per GPU and micro-batch, all links."""
        return self.ep_load.nbytes


@dataclass(frozen=True)
class StageLayout:
    """What one pipeline rank holds, independent of recompute choices.

    Attributes:
        layers: graph layer indices on the rank (all its chunks), in model order.
        flight: micro-batch-chunk units of activations held at the peak divided by the rank's
            chunk count, i.e. the multiplier of one micro-batch's activations of its layers.
        p2p_s: pipeline send/recv seconds per micro-batch (forward + backward).
        p2p_load: what the rank sends per micro-batch, activations to the next chunk and input
            gradients to the previous one (send/recv: bytes on the wire = the message), and the
            seconds those sends take before overlap, on the link they cross (what the per-link
            ledger shows).
        params: parameter elements on the rank (after TP sharding).
        states: (weights, gradients, optimizer states) bytes after ZeRO sharding.
        gather_bytes: ZeRO-3 working memory: the gathered parameters of the largest layer and
            the next one being prefetched (2 x its unsharded bytes).
        edge_flight: (layer index, micro-batches) of the rank's non-block layers (embedding,
            head) whose chunk holds a count other than ``flight`` at the rank's peak (a rank
            with several chunks: :func:`autopar.cost.pipeline_orders.chunk_counts_at_peak`);
            the others take ``flight``.
    """

    layers: tuple[int, ...]
    flight: float
    p2p_s: float
    p2p_load: LinkLoad
    params: float
    states: tuple[float, float, float]
    gather_bytes: float = 0.0
    edge_flight: tuple[tuple[int, float], ...] = ()

    def flight_of(self, layer: int) -> float:
        """Micro-batches of graph layer ``layer``'s activations the rank holds at its peak
        (``edge_flight`` where it names the layer, else ``flight``)."""
        for li, f in self.edge_flight:
            if li == layer:
                return f
        return self.flight


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
        autopar.errors.InvalidTrainingConfig: the GPU lacks the training precision (e.g. fp8 on
            A100), raised by the device catalog.
    """

    def __init__(self, graph: ModelGraph, cluster, train: TrainingConfig,
                 params: CostParams | None = None, attention_kernel: str | None = None,
                 framework: FrameworkProfile | None = None,
                 conventions: MemoryConventions | None = None):
        self.graph, self.cluster, self.train = graph, cluster, train
        self._given = (params, attention_kernel, framework, conventions)   # for rebuilt()
        self.params = params or CostParams()
        self.device = cluster.device
        #: bytes/s memory-bound kernels move through HBM (CostParams.hbm_efficiency of the
        #: datasheet bandwidth)
        self.hbm_Bps = self.device.hbm_bandwidth_Bps * self.params.hbm_efficiency
        self.profile = framework or get_profile(train.framework)
        arch = getattr(self.device, "architecture", "ampere")
        attention_kernel = attention_kernel or self.profile.attention_kernel(arch)
        #: bytes per gradient element in the data-parallel reduction (the profile's dtype)
        self.reduce_bytes = self.profile.grad_reduce_bytes or self.params.grad_bytes
        # a power cap lowers the sustained tensor-core clock (Device.clock_scale)
        self.peak = self.device.peak(train.precision) * self.device.clock_scale
        # FP8 training runs only the Linear GEMMs in FP8 (Transformer Engine, torchao Float8):
        # attention, the output layer and element-wise work stay in BF16
        self.attention_kernel = attention_kernel
        # how the target framework lays out memory (bytes per state, PP, unfused attention)
        self.conventions = conventions or self.profile.memory
        self.compute_peak = (self.device.peak("bf16") * self.device.clock_scale
                             if train.precision == "fp8" else self.peak)
        self.blocks = [layer.index for layer in graph.layers if layer.kind == "block"]
        self._layer_times: dict[tuple, LayerTime] = {}
        self._groups: dict[tuple, Collectives] = {}
        self._block_costs: dict[tuple, BlockCost] = {}
        self._rank_layers: dict[tuple, tuple] = {}
        self._params: dict[tuple, float] = {}
        self._layouts: dict[tuple, tuple[StageLayout, ...]] = {}
        self._layouts_by_mesh: dict[tuple, tuple[StageLayout, ...]] = {}   # less the ZeRO stage
        self._estimates: dict[ParallelConfig, Estimate] = {}
        self._steps: dict[ParallelConfig, float] = {}
        self._pipelines: dict[tuple, tuple] = {}   # _pipeline, by config less ZeRO fields
        self._time_layouts: dict[tuple, tuple[StageLayout, ...]] = {}   # _time_layout, same
        self._gathers: dict[tuple, float] = {}
        self._layer_params: dict[tuple, float] = {}
        self._zero1_splits: dict[tuple, tuple[float, int]] = {}
        self._resolved: dict[ParallelConfig, ParallelConfig | InvalidParallelConfig] = {}
        self._flops_per_seq: float | None = None
        self._shares: dict[tuple, float] = {}

    # -- cached pieces -------------------------------------------------------------------------
    def layer_time(self, index: int, b: int, tp: int, cp: int, sp: bool,
                   cp_mode: str = "ulysses", etp: int | None = None) -> LayerTime:
        """Compute time of graph layer ``index`` (cached by signature and sharding).

        ``cp_mode`` picks how a CP rank runs attention (the profile's ``cp_attention``) and
        whether its causal work is balanced: a ring or all-gather split is load-balanced only
        when ``2 cp`` divides the sequence (autopar/runtime/cp.py ``layout``; Megatron-LM and
        torchtitan require it), else the last rank's queries see the most keys, (2 cp - 1) / cp
        times the average. The default (Ulysses: whole sequences, fused, balanced) is the least
        over the modes, the search's lower bound. ``etp``: expert tensor parallelism of the
        routed experts' GEMMs (None = tp; :func:`autopar.cost.compute.layer_time`)."""
        layer = self.graph.layers[index]
        path = self.profile.cp_attention.get(cp_mode, "fused") if cp > 1 else "fused"
        skew = (2 * cp - 1) / cp if (cp > 1 and cp_mode != "ulysses"
                                     and self.train.seq_len % (2 * cp)) else 1.0
        etp = None if etp == tp else etp
        key = (layer.signature, b, tp, cp, sp, path, skew, etp)
        t = self._layer_times.get(key)
        if t is None:
            t = layer_time(layer, micro_batch=b / self.graph.micro_batch_size, tp=tp, cp=cp,
                           sequence_parallel=sp, peak_flops=self.compute_peak,
                           fp8_peak_flops=self.peak if self.train.precision == "fp8" else None,
                           hbm_bandwidth=self.device.hbm_bandwidth_Bps, params=self.params,
                           architecture=getattr(self.device, "architecture", "ampere"),
                           attention_kernel=self.attention_kernel,
                           fusion=self.profile.fusion,
                           attention_dims=self._attention_dims(layer, cp),
                           cp_attention=path, cp_imbalance=skew, expert_tp=etp,
                           eager_parts=self.profile.eager_parts)
            self._layer_times[key] = t
        return t

    def _attention_dims(self, layer, cp: int) -> tuple[float, float]:
        """(head dim, keys per query block on one CP rank) of ``layer``'s fused attention:
        head dim from its counted FLOPs, 4 * b * heads * s * span * d; keys: the span (the
        window, or the sequence), at most the rank's s / cp (ring and load-balanced exchanges run
        the kernel on per-rank chunks)."""
        g = self.graph
        for op in layer.ops:
            if op.kind == "attention" and op.fused and layer.attention_heads:
                s = g.seq_len
                span = min(op.window, s) if op.window else s   # a window past s limits nothing
                d = op.fwd_flops / (4.0 * g.micro_batch_size * layer.attention_heads * s * span)
                return d, min(span, s / cp)
        return 0.0, 0.0

    def group(self, dim: str, c: ParallelConfig) -> Collectives:
        """The representative process group (the one holding rank 0) of mesh dimension ``dim``
        under the config's placement; "dp" means the dp x cp group, over which gradients are
        reduced and ZeRO shards (CP ranks hold the same weights); "pp" a pair of neighbours.

        "ep" is the expert-parallel group: without folding, the innermost ep ranks of the DP
        dimension; with MoE parallel folding (``c.expert_tp`` set), ep ranks ``etp`` apart among
        the ranks of one pipeline stage in placement order, and "etp" the first etp of them
        (the expert RankGenerator of Megatron-Core parallel_state.py: etp innermost, then ep,
        over the tp x cp x dp ranks of a stage)."""
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
            if dim in ("ep", "etp") and c.folded:
                # the stage's ranks in placement order (innermost fastest), then etp x ep
                stage = [0]
                for d in order:
                    if d != "pp":
                        stage = [r + k * strides[d] for k in range(getattr(c, d)) for r in stage]
                ranks = stage[:c.etp] if dim == "etp" else stage[:c.ep * c.etp:c.etp]
                dims = ()
            elif dim == "ep":  # experts split over the innermost ep ranks of the DP dimension
                ranks = [k * strides["dp"] for k in range(c.ep)]
                dims = ()
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

    def block_cost(self, index: int, mode: str, c: ParallelConfig) -> "BlockCost":
        """Per-micro-batch cost of graph layer ``index`` under recompute ``mode`` and the
        resolved config ``c`` (cached). Non-block layers ignore ``mode``."""
        layer = self.graph.layers[index]
        if layer.kind != "block":
            mode = "none"
        key = (layer.signature, mode, c.tp, c.cp, c.dp, c.pp, c.micro_batch_size,
               c.sequence_parallel, c.cp_mode, c.placement, c.ep, c.expert_tp)
        hit = self._block_costs.get(key)
        if hit is not None:
            return hit
        tp, cp, sp = c.tp, c.cp, c.sequence_parallel
        bscale = c.micro_batch_size / self.graph.micro_batch_size
        folded = c.folded and bool(layer.num_experts)
        lt = self.layer_time(index, c.micro_batch_size, tp, cp, sp, c.cp_mode,
                             c.etp if folded else None)
        attn_layer, expert_layer = split_expert_tp(layer) if folded else (layer, None)
        tf, tb, fb, bb = tp_layer_comm(attn_layer, self.group("tp", c), micro_batch=bscale,
                                       cp=cp, sequence_parallel=sp,
                                       mlp_per_linear=self.profile.tp_mlp_reduce_per_linear)
        if expert_layer is not None:
            # folded MoE: the routed tokens are all-gathered over the expert-TP group after the
            # dispatch all-to-all and reduce-scattered before the combine (Megatron-Core
            # token_dispatcher.py MoEAlltoAllTokenDispatcher: gather_from_sequence_parallel_
            # region / reduce_scatter_to_sequence_parallel_region over expt_tp), on the etp
            # ranks' share of the tokens: etp / tp of what one attention-TP group holds
            xf, xb, xfb, xbb = tp_layer_comm(expert_layer, self.group("etp", c),
                                             micro_batch=bscale * c.etp / tp, cp=cp,
                                             sequence_parallel=True)
            tf, tb, fb, bb = tf + xf, tb + xb, fb + xfb, bb + xbb
        if mode == "full":  # the recomputed forward repeats its collectives
            tb += tf
            bb += fb
        if self.profile.overlap_tp_comm and sp:
            # TP collectives split into chunks that run beside the GEMMs next to them
            # (Transformer Engine userbuffers, Wang et al. 2023 "Overlap communication with
            # dependent computation", ASPLOS): hidden up to dp_overlap of the GEMM time. Only
            # the all-gather / reduce-scatter of sequence parallelism is chunked so (Megatron-LM
            # arguments.py: "Tensor parallel communication/GEMM overlap can happen only when
            # sequence parallelism is enabled"; torch's async TP fuses the same pair)
            gemm_f = lt.fwd_s - lt.attention_fwd_s
            gemm_b = lt.bwd_s - ATTENTION_BACKWARD_RATIO * lt.attention_fwd_s
            if mode == "full":
                gemm_b += gemm_f
            tf = max(0.0, tf - self.params.dp_overlap * gemm_f)
            tb = max(0.0, tb - self.params.dp_overlap * gemm_b)
        cf, cb, cload = cp_layer_comm(layer, self.group("cp", c), micro_batch=bscale, tp=tp,
                                       attention_fwd_s=lt.attention_fwd_s, mode=c.cp_mode,
                                       overlap=self.params.dp_overlap)
        ef, eload = 0.0, NO_LOAD
        if c.ep > 1 and layer.num_experts:
            # dispatch and combine all-to-alls of the routed tokens (k copies of each) forward,
            # the same two backward (Lepikhin et al. 2020, GShard; Megatron-LM MoE)
            routed = (layer.output_bytes * bscale * max(1, layer.experts_per_token) / cp
                      / (tp if sp else 1))
            ep_g = self.group("ep", c)
            # four all-to-alls of the routed tokens: two forward, two backward (half each side
            # below); it was two in all, half the ledger's count of the same collectives
            ef = 4 * ep_g.time("all_to_all", routed)
            # the ledger's load: four all-to-alls, each on the link as long as it takes
            eload = ep_g.load("all_to_all", routed).scaled(4)
            if mode == "full":
                ef *= 1.5  # the recomputed forward dispatches again
                eload = eload.scaled(1.5)
        rec = lt.recompute_s(mode)
        # FLOPs the recomputed forward repeats (HFU), in MFU's convention: a causal attention
        # op at the half a causal kernel executes
        attn = [o for o in layer.ops if o.kind == "attention"]
        counted = sum(o.fwd_flops for o in attn) * bscale / (tp * cp)
        causal = sum(o.fwd_flops for o in attn if o.causal) * bscale / (tp * cp)
        rflops = {"full": lt.fwd_flops, "selective": counted}.get(mode, 0.0)
        if mode == "selective-op":  # the matmuls op-level SAC does not save
            saved = set(mem.op_sac_saved(layer))
            rflops = sum(o.fwd_flops for i, o in enumerate(layer.ops)
                         if o.kind == "matmul" and i not in saved) * bscale / (tp * cp)
        elif mode != "none":
            rflops -= CAUSAL_FLOPS_SHARE * causal
        conv = self.conventions
        act_none = mem.block_activation_bytes(layer, "none", micro_batch=bscale, tp=tp, cp=cp,
                                              sequence_parallel=sp)
        # unfused attention: the framework's softmax output beyond the 2 bytes per score the
        # graph saves, and its score-sized working tensors (MemoryConventions)
        scores = mem.unfused_score_elements(
            layer, tokens=self.graph.micro_batch_size * self.train.seq_len,
            dtype_bytes=self.train.dtype_bytes) * bscale / (tp * cp)
        act_none += (conv.unfused_score_saved_bytes - 2) * scores
        act = act_none if mode == "none" else mem.block_activation_bytes(
            layer, mode, micro_batch=bscale, tp=tp, cp=cp, sequence_parallel=sp)
        # recomputing a block re-materialises what it did not keep, one block at a time
        transient = act_none - act + conv.unfused_score_work_bytes * scores
        if layer.kind == "head":
            # the loss's backward: fp32 gradients of the logits beside the saved log-probs
            logits = sum(o.bytes_written for o in layer.ops if o.kind == "loss") / 4.0
            transient += conv.loss_work_bytes * logits * bscale / (tp * cp)
        if self.train.precision == "fp8" and layer.kind == "block":
            # the FP8 copy of the running layer's Linear weights and its transpose (1 byte each)
            transient += 2.0 * mem.layer_params_per_rank(layer, tp, ep=c.ep, etp=c.etp)
        # the weight-gradient GEMMs (lt.wgrad_s) run apart from the rest of backward under a
        # zero-bubble schedule; recomputation and communication stay with the input gradient
        bc = BlockCost(fwd_s=lt.fwd_s + tf + cf + ef / 2, bwd_s=lt.bwd_s + rec + tb + cb + ef / 2,
                       compute_s=lt.fwd_s + lt.bwd_s + rec, tp_s=tf + tb, cp_s=cf + cb,
                       tp_load=fb + bb, cp_load=cload, recompute_flops=rflops,
                       act_bytes=act, transient_bytes=transient, ep_s=ef, ep_load=eload,
                       wgrad_s=lt.wgrad_s)
        self._block_costs[key] = bc
        return bc

    def rank_layers(self, pp: int, stage_blocks: tuple[int, ...],
                    schedule: str = "1f1b") -> tuple[tuple, ...]:
        """Per pipeline rank: (layer indices, chunk indices, groups) where groups lists
        (representative layer index, count, is_block) per distinct layer signature (cached).
        Chunk ``ci`` runs on rank ``ci % pp``, or in a V for the V-shaped schedules
        (:func:`autopar.cost.pipeline_orders.stage_rank`)."""
        key = (pp, stage_blocks, schedule in V_SHAPED)
        hit = self._rank_layers.get(key)
        if hit is not None:
            return hit
        g = self.graph
        chunks = chunk_layers(len(g.layers), self.blocks, stage_blocks)
        out = []
        for rank in range(pp):
            mine = tuple(ci for ci in range(len(chunks))
                         if (stage_rank(ci, pp, schedule) if pp > 1 else 0) == rank)
            layers = tuple(i for ci in mine for i in chunks[ci])
            groups: dict[str, list] = {}
            for i in layers:
                entry = groups.setdefault(g.layers[i].signature, [i, 0])
                entry[1] += 1
            out.append((layers, mine, tuple((i, n) for i, n in groups.values()), chunks))
        self._rank_layers[key] = tuple(out)
        return self._rank_layers[key]

    def _rank_params(self, tp: int, ep: int, layers: tuple[int, ...],
                     etp: int | None = None) -> tuple[float, float]:
        """(all, expert) parameter elements on a rank holding ``layers`` (cached); ``etp``:
        expert tensor parallelism (None = tp)."""
        etp = None if etp == tp else etp
        key = (tp, ep, layers, etp)
        hit = self._params.get(key)
        if hit is None:
            g = self.graph
            kinds = {g.layers[i].kind for i in layers}
            total = sum(self._layer_params_per_rank(
                i, tp, not (g.layers[i].kind == "head" and "embedding" in kinds), ep, etp)
                for i in layers)
            experts = sum(mem.expert_params_per_rank(g.layers[i], tp, ep, etp) for i in layers)
            hit = self._params[key] = (total, experts)
        return hit

    def _largest_layer_params(self, tp: int, ep: int, layers: tuple[int, ...],
                              etp: int | None = None) -> float:
        """Parameter elements on a rank of the largest of ``layers`` (what ZeRO-3 gathers at
        once; cached: the search asks for the same ranks under many configurations)."""
        etp = None if etp == tp else etp
        key = (tp, ep, layers, etp)
        hit = self._gathers.get(key)
        if hit is None:
            hit = self._gathers[key] = max(
                self._layer_params_per_rank(i, tp, True, ep, etp) for i in layers)
        return hit

    def _layer_params_per_rank(self, index: int, tp: int, count_shared: bool, ep: int,
                               etp: int | None = None) -> float:
        """:func:`autopar.cost.memory.layer_params_per_rank` of graph layer ``index``
        (cached: it walks the layer's ops)."""
        etp = None if etp == tp else etp
        key = (index, tp, count_shared, ep, etp)
        hit = self._layer_params.get(key)
        if hit is None:
            hit = self._layer_params[key] = mem.layer_params_per_rank(
                self.graph.layers[index], tp, count_shared=count_shared, ep=ep, etp=etp)
        return hit

    @property
    def reserved_bytes(self) -> float:
        """Bytes per GPU the model cannot use (context, workspaces, fragmentation) of the memory
        the framework sees (:attr:`autopar.hardware.Device.visible_memory_bytes`)."""
        cap = self.device.visible_memory_bytes
        return cap - self.params.usable_memory(cap)

    def stage_layout(self, c: ParallelConfig) -> tuple[StageLayout, ...]:
        """Per pipeline rank of the resolved config ``c``: its layers, in-flight multiplier,
        pipeline communication and model states (cached)."""
        key = (c.tp, c.pp, c.cp, c.dp, c.micro_batch_size, c.sequence_parallel, c.zero_stage,
               c.schedule, c.virtual_stages, c.stage_blocks, c.placement, c.ep, c.expert_tp)
        hit = self._layouts.get(key)
        if hit is not None:
            return hit
        pp = c.pp
        # the layout under another ZeRO stage differs only in its model states (layers,
        # in-flight count, pipeline traffic and parameters do not read the stage)
        other = self._layouts_by_mesh.get(key[:6] + key[7:])
        if other is not None:
            out = []
            for rank, st in enumerate(other):
                experts = self._rank_params(c.tp, c.ep, st.layers)[1]
                states, gather = self._states(c, st.params, experts, st.layers, pp, rank)
                out.append(replace(st, states=states, gather_bytes=gather))
            self._layouts[key] = tuple(out)
            return self._layouts[key]
        out = []
        for rank, (layers, mine, _groups, chunks) in enumerate(
                self.rank_layers(pp, c.stage_blocks, c.schedule)):

            def remote(ci: int) -> bool:
                """Whether chunks ci and ci + 1 sit on different ranks (a V's turn does not)."""
                return stage_rank(ci, pp, c.schedule) != stage_rank(ci + 1, pp, c.schedule)

            parts = tuple(
                (tuple(chunks[ci]), ci < len(chunks) - 1 and bool(chunks[ci]) and remote(ci),
                 chunks[ci - 1][-1] if ci > 0 and chunks[ci - 1] and remote(ci - 1) else None)
                for ci in mine)
            out.append(self._rank_layout(c, rank, layers, parts))
        self._layouts[key] = self._layouts_by_mesh[key[:6] + key[7:]] = tuple(out)
        return self._layouts[key]

    def _time_layout(self, c: ParallelConfig) -> tuple[StageLayout, ...]:
        """What the step time reads of :meth:`stage_layout` (layers, pipeline communication,
        parameters; the search's time-only bound): none of it depends on the ZeRO stage or the
        kept-gathered flags, so the layout of any ZeRO stage of ``c`` serves (cached per
        configuration less those fields; its model states are not to be read)."""
        key = tuple(v for f, v in c.__dict__.items()
                    if f not in ("zero_stage", "reshard_after_forward"))
        hit = self._time_layouts.get(key)
        if hit is None:
            hit = self._time_layouts[key] = self.stage_layout(c)
        return hit

    def interval_layout(self, c: ParallelConfig, rank: int, start: int, end: int) -> StageLayout:
        """What pipeline rank ``rank`` of the resolved, non-interleaved config ``c`` holds when
        its stage is decoder blocks ``start`` to ``end - 1`` (positions among the blocks), the
        embedding on rank 0 and the head on the last rank; the other ranks' cuts do not matter
        (what the stage-cut dynamic programme of :mod:`autopar.search.cuts` prices).

        Raises:
            InvalidParallelConfig: an interleaved ``c``, or an empty or out-of-range stage.
        """
        n, pp = len(self.blocks), c.pp
        if (c.virtual_stages or 1) != 1 or not 0 <= start < end <= n or not 0 <= rank < pp \
                or (rank == 0) != (start == 0) or (rank == pp - 1) != (end == n):
            raise InvalidParallelConfig(
                f"interval_layout needs one chunk per rank and a non-empty stage of blocks that "
                f"starts at block 0 exactly on rank 0 and ends at the last block exactly on the "
                f"last rank; got rank {rank} of {pp}, blocks [{start}, {end}) of {n}, "
                f"virtual_stages={c.virtual_stages}. Fix: pass a cut of a 1F1B/GPipe pipeline.")
        nl = len(self.graph.layers)
        first, last = (self.blocks[0], self.blocks[-1]) if self.blocks else (nl, nl - 1)
        layers = tuple(self.blocks[start:end])
        if rank == 0:
            layers = tuple(range(0, first)) + layers
        if rank == pp - 1:
            layers = layers + tuple(range(last + 1, nl))
        prev = self.blocks[start - 1] if rank > 0 else None
        return self._rank_layout(c, rank, layers, ((layers, rank != pp - 1, prev),))

    def _rank_layout(self, c: ParallelConfig, rank: int, layers: tuple[int, ...],
                     parts: tuple) -> StageLayout:
        """One rank's :class:`StageLayout`; ``parts`` holds, per chunk of the rank, (its layer
        indices, whether it sends its output to another rank (not the model's last chunk, nor
        a V's turn), the last layer of the chunk before it when that chunk sits on another rank,
        else None)."""
        g, tp, pp, cp = self.graph, c.tp, c.pp, c.cp
        m = self.train.global_batch_size // (c.dp * c.micro_batch_size)
        pp_g = self.group("pp", c)
        bscale = c.micro_batch_size / g.micro_batch_size
        p2p_s, p2p_load = 0.0, NO_LOAD

        def boundary_bytes(layer: int) -> float:
            """Bytes of the activation a chunk ending in ``layer`` sends to the next one (its
            gradient crosses back the same size)."""
            return (g.layers[layer].output_bytes * bscale / cp
                    / (tp if c.sequence_parallel else 1))

        for chunk, sends, prev in parts:
            if pp > 1 and sends and chunk:
                nbytes = boundary_bytes(chunk[-1])
                p2p_s += 2 * pp_g.time("send_recv", nbytes)
                p2p_load += pp_g.load("send_recv", nbytes)  # this rank sends the activation forward
            if pp > 1 and prev is not None:
                # and the input's gradient backward
                p2p_load += pp_g.load("send_recv", boundary_bytes(prev))
        params, experts = self._rank_params(tp, c.ep, layers, c.etp)
        states, gather = self._states(c, params, experts, layers, pp, rank)
        flight = mem.in_flight(c.schedule, rank, pp, m, c.virtual_stages) / max(1, len(parts))
        edge = self._edge_flight(c, rank, layers, flight) if len(parts) > 1 and pp > 1 else ()
        return StageLayout(layers, flight, p2p_s, p2p_load, params, states, gather, edge)

    def _edge_flight(self, c: ParallelConfig, rank: int, layers: tuple[int, ...],
                     flight: float) -> tuple[tuple[int, float], ...]:
        """:attr:`StageLayout.edge_flight` of pipeline rank ``rank`` holding several chunks:
        each non-block layer at the micro-batches its own chunk holds at the rank's peak
        (:func:`autopar.cost.pipeline_orders.chunk_counts_at_peak`, the most at any instant of
        that peak), where that differs from the rank's mean ``flight``. Orders torch cannot
        build keep the mean."""
        m = self.train.global_batch_size // (c.dp * c.micro_batch_size)
        try:
            counts = chunk_counts_at_peak(c.schedule, c.pp, m, c.virtual_stages, rank)
        except ValueError:
            return ()
        _l, mine, _g, chunks = self.rank_layers(c.pp, c.stage_blocks, c.schedule)[rank]
        kinds = self.graph.layers
        out = []
        for ci in mine:
            for li in chunks[ci]:
                if li in layers and kinds[li].kind != "block" \
                        and float(counts.get(ci, 0)) != flight:
                    out.append((li, float(counts.get(ci, 0))))
        return tuple(out)

    def _pair_overlap(self, c: ParallelConfig, parts: list[dict], stage_time: list[float]
                      ) -> tuple[float, ...] | None:
        """Per pipeline rank, seconds one DualPipeV forward-backward pair (of one chunk each)
        saves by hiding expert-parallel all-to-alls behind the other half's compute, or None.

        Only where the target framework runs that overlap: torchtitan v0.2.2 registers
        ``overlap_callback`` for ``OVERLAP_F_B`` on ``ScheduleDualPipeV`` when
        ``pipeline_parallel_expert_parallel_overlap`` is on and ep > 1
        (torchtitan/distributed/pipeline_parallel.py ``build_pipeline_schedule``,
        distributed/dual_pipe_v.py), which refuses activation checkpointing
        (``get_dual_pipe_v_flag``); stock torch runs the pair's halves one after the other.
        DeepSeek-V3 (arXiv 2412.19437, section 3.2.1) hides all-to-all this way. The hidden part
        is the pair's all-to-all seconds, at most the pair's other work.
        """
        if c.schedule != "dualpipev" or c.ep == 1 or c.pp == 1:
            return None
        if c.schedule not in self.profile.overlaps_ep_comm:
            return None
        if any(mode != "none" for mode in c.block_recompute(len(self.blocks))):
            return None
        v = c.virtual_stages
        out = []
        for part, total in zip(parts, stage_time):
            ep = part["ep_comm"] / v   # forward + backward all-to-alls of one chunk
            out.append(min(ep, total / v - ep))
        return tuple(max(0.0, x) for x in out)

    def zero3_collective_s(self, c: ParallelConfig, rank: int, nbytes_per_element: float,
                           op: str) -> float:
        """Seconds of one ZeRO-3 pass of ``op`` ("all_gather" of parameters or
        "reduce_scatter" of gradients) over pipeline rank ``rank``'s layers, as the framework
        issues it (``zero3_gather`` of the profile): one collective per layer (FSDP wraps each
        block: ``per_block``) or one per parameter tensor (DeepSpeed ZeRO-3: ``per_parameter``),
        so the latency terms of every call count, not one ideal collective per pass.
        ``nbytes_per_element``: 2 for bf16 parameters, the reduce dtype's bytes for gradients."""
        dp_g = self.group("dp", c)
        total = 0.0
        for n, nbytes in self._zero3_messages(c, rank, nbytes_per_element):
            total += n * dp_g.time(op, nbytes)
        return total

    def zero3_collective_load(self, c: ParallelConfig, rank: int, nbytes_per_element: float,
                              op: str) -> LinkLoad:
        """The per-link :class:`LinkLoad` of the collectives :meth:`zero3_collective_s` times."""
        dp_g = self.group("dp", c)
        total = NO_LOAD
        for n, nbytes in self._zero3_messages(c, rank, nbytes_per_element):
            total += dp_g.load(op, nbytes).scaled(n)
        return total

    def _zero3_messages(self, c: ParallelConfig, rank: int, nbytes_per_element: float):
        """(count, message bytes) of each ZeRO-3 collective one pass over pipeline rank
        ``rank``'s layers issues (:meth:`zero3_collective_s`)."""
        g = self.graph
        per_param = self.profile.zero3_gather == "per_parameter"
        for li, n in self.rank_layers(c.pp, c.stage_blocks, c.schedule)[rank][2]:
            layer = g.layers[li]
            if per_param:
                for o in layer.ops:
                    if o.num_parameters > 0:
                        div = c.tp if o.tp_role in ("column", "row", "vocab") else 1
                        yield n, o.num_parameters / div * nbytes_per_element
            else:
                yield n, self._layer_params_per_rank(li, c.tp, True, c.ep,
                                                     c.etp) * nbytes_per_element

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
        z = max(1, min(c.dp * c.cp, self.profile.zero1_group_size or c.dp * c.cp))
        etp = None if c.etp == c.tp else c.etp
        if self.profile.zero1_partition == "flat":
            return params / z, z
        key = (z, c.tp, c.ep, etp, layers)
        hit = self._zero1_splits.get(key)
        if hit is None:
            sizes = []
            for li in layers:
                for o in self.graph.layers[li].ops:
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

    def _no_effect_notes(self, c: ParallelConfig) -> tuple[str, ...]:
        """Notes for a ZeRO stage that changes nothing in this plan (a hand-written plan can
        hold one; the search never emits it), for FlashAttention-3 priced off Hopper, and for a
        device whose missing SM count leaves the overlap slowdown uncharged. (A schedule at pp=1 is noted by :meth:`estimate`:
        resolving drops it.)"""
        notes = []
        if c.zero_stage and c.dp * c.cp == 1:
            notes.append(f"zero_stage={c.zero_stage} with dp x cp = 1: no rank shares weights, "
                         "so ZeRO shards nothing and changes nothing here; fix: zero_stage=0, "
                         "or dp > 1")
        if self.attention_kernel == "fa3" and self.device.architecture != "hopper":
            notes.append(f"attention kernel fa3 (FlashAttention-3) runs on Hopper GPUs only "
                         f"(Shah et al. 2024, FlashAttention-3: wgmma and TMA); "
                         f"{self.device.name!r} is {self.device.architecture}, so this estimate "
                         "prices a kernel it cannot run; fix: attention_kernels {'*': 'fa2'} for "
                         "it")
        if c.dp * c.cp > 1 and not self.device.sm_count:
            notes.append(f"device {self.device.name!r} has no sm_count: the compute slowdown "
                         "beside overlapped collectives (autopar.hardware.nccl) is not charged, "
                         "so this estimate is optimistic; fix: give the device's SM count "
                         "(dataclasses.replace(device, sm_count=...))")
        return tuple(notes)

    def sync_bucket_exposed_s(self, c: ParallelConfig, layers: tuple[int, ...], op: str,
                              nbytes_per_element: float, overlap: float = 1.0) -> float:
        """Exposed seconds of a data-parallel gradient reduction run as buckets of at most
        ``sync_grad_bucket_elements`` elements with one bucket in flight, over the last
        micro-batch's backward of a pipeline rank holding graph layers ``layers``.

        Source: InternEvo c18bec9 hybrid_zero_optim.py. Each parameter's gradient hook
        (``_store_and_try_reduce_grads_by_bucket``, L329-352) adds it to the bucket, and when
        the next one would overflow the bucket it reduces the stored one: ``_reduce_and_copy``
        (L402-418) first calls ``torch.cuda.synchronize()``, which waits for the compute issued
        so far and for the previous bucket's reduction, then launches this bucket's ``op`` on
        the communication stream. So a bucket's reduction hides only behind the backward
        compute up to the next bucket's launch (``overlap`` of it, 1 in the estimate, which
        charges the compute slowdown beside the buckets, :func:`overlapped_comm`), and ``step()`` (L508-514) reduces the
        last bucket after backward and synchronizes: fully exposed. Hooks fire in backward order (the layers reversed, each
        op's parameters one tensor, TP-sharded ones / tp); a layer's backward seconds
        (:meth:`block_cost`) are split over its tensors by their elements. ``op`` over the
        data-parallel group, ``nbytes_per_element``: the reduce dtype's bytes.
        """
        cap = self.profile.sync_grad_bucket_elements
        dp_g = self.group("dp", c)
        uniform = c.recompute if isinstance(c.recompute, str) else None
        modes = None if uniform else dict(zip(self.blocks, c.block_recompute(len(self.blocks))))
        fill = in_flight = since = exposed = 0.0
        for li in reversed(layers):
            layer = self.graph.layers[li]
            bwd = self.block_cost(li, uniform or modes.get(li, "none"), c).bwd_s
            sizes = [o.num_parameters / (c.tp if o.tp_role in ("column", "row", "vocab") else 1)
                     for o in reversed(layer.ops) if o.num_parameters > 0]
            total = sum(sizes)
            if not total:
                since += bwd
            for size in sizes:
                since += bwd * size / total
                if fill > 0 and fill + size > cap:
                    exposed += max(0.0, in_flight - overlap * since)
                    in_flight, since, fill = dp_g.time(op, fill * nbytes_per_element), 0.0, 0.0
                fill += size
        return exposed + max(0.0, in_flight - overlap * since) + dp_g.time(
            op, fill * nbytes_per_element)

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
                self.device, grp.link, local_nics(grp.ranks, cl.gpus_per_node, cl.nics_per_node))
        return hit

    def _zero1_broadcasts_s(self, c: ParallelConfig, nbytes: float, owners: int) -> float:
        """Seconds to return ``nbytes`` of updated parameters by one broadcast per ZeRO-1 rank
        that holds a share (``owners`` of them, :meth:`zero1_split`; InternEvo c18bec9
        hybrid_zero_optim.py ``broadcast_params`` skips the ranks without parameters) over the
        ZeRO group (the first z ranks of the data-parallel group, z = min(dp x cp,
        ``zero1_group_size``)), issued back to back on one communicator and waited on after the
        step. Each broadcast pays the group's chain latency (:mod:`autopar.hardware.collectives`:
        every rank of a ring broadcast that spans nodes is a network step), so the total grows
        as owners x z alpha at scale; the bytes cross the chain's bottleneck once in all."""
        grp = self._zero1_group(c)
        if grp is None or owners < 1:
            return 0.0
        return owners * grp.time("broadcast", nbytes / owners)

    def _zero1_broadcasts_load(self, c: ParallelConfig, nbytes: float, owners: int) -> LinkLoad:
        """The per-link :class:`LinkLoad` of the broadcasts :meth:`_zero1_broadcasts_s` times."""
        grp = self._zero1_group(c)
        if grp is None or owners < 1:
            return NO_LOAD
        return grp.load("broadcast", nbytes / owners).scaled(owners)

    def _zero1_group(self, c: ParallelConfig) -> Collectives | None:
        """The ZeRO group (the first z = min(dp x cp, ``zero1_group_size``) ranks of the
        data-parallel group), or None when it has one rank."""
        dp_g = self.group("dp", c)
        z = min(dp_g.size, self.profile.zero1_group_size or dp_g.size)
        if z <= 1:
            return None
        return dp_g if z == dp_g.size else Collectives(self.cluster, dp_g.ranks[:z])

    def _states(self, c: ParallelConfig, params: float, experts: float,
                layers: tuple[int, ...], pp: int, rank: int = 0
                ) -> tuple[tuple[float, float, float], float]:
        """((weights, gradients, optimizer states) bytes, working bytes) of a pipeline rank
        holding ``params`` parameter elements (``experts`` of them MoE experts) of ``layers``.

        Bytes per element follow the framework's :class:`MemoryConventions` (weights and
        gradients in their dtypes, K = master copy + moments, optimizer states on the CPU with
        ``optimizer_offload``); ZeRO shards them over dp x cp (Rajbhandari et al. 2020). Working
        bytes: ZeRO-3's gathered parameters of the largest layer and the one prefetched (2 x),
        or, under pipeline parallelism where the framework keeps them, the unsharded
        parameters and gradients its chunks hold at pipeline rank ``rank``'s activation peak
        (:meth:`_pp_unsharded_bytes`); plus cached FP8 weight copies.
        """
        train, conv, g = self.train, self.conventions, self.graph
        wb = conv.weight_bytes or train.dtype_bytes
        gb = conv.grad_bytes or self.params.grad_bytes
        k_opt = 0 if train.optimizer_offload else mem.optimizer_state_bytes_per_param(
            train.optimizer, conv.master_weight_bytes, train.optimizer_state_dtype)
        dense = mem.model_state_bytes(params - experts, c.zero_stage, c.dp * c.cp, wb, gb, k_opt)
        # each expert shard is replicated over the expert-data-parallel ranks, and ZeRO shards
        # it over those: dp * cp / ep, or with MoE parallel folding tp * cp * dp / (ep * etp)
        # (Megatron-Core parallel_state.py expert_data_parallel_size)
        moe = mem.model_state_bytes(experts, c.zero_stage,
                                    c.tp * c.dp * c.cp // (c.ep * c.etp), wb, gb, k_opt)
        states = tuple(a + b for a, b in zip(dense, moe))
        if c.zero_stage == 2 and wb > train.dtype_bytes and c.dp * c.cp > 1:
            # FSDP2 without resharding after forward: fp32 shards (the master copy) plus the
            # gathered compute-dtype parameters kept between forward and backward
            w = wb * params / (c.dp * c.cp) + train.dtype_bytes * params
            states = (w, states[1], states[2])
        work = 0.0
        if c.zero_stage == 3 and c.dp * c.cp > 1:
            work = 2 * train.dtype_bytes * max(
                self._layer_params_per_rank(i, c.tp, True, c.ep, c.etp) for i in layers)
            if pp > 1 and conv.pp_unsharded_bytes:
                work = max(self._pp_unsharded_bytes(c, rank, params), work)
        if train.precision == "fp8" and conv.fp8_weight_cache_bytes:
            work += conv.fp8_weight_cache_bytes * sum(
                self._layer_params_per_rank(i, c.tp, True, c.ep, c.etp) for i in layers
                if g.layers[i].kind == "block")
        return states, work

    def _pp_unsharded_bytes(self, c: ParallelConfig, rank: int, params: float) -> float:
        """Bytes of unsharded parameters and gradients pipeline rank ``rank`` (holding
        ``params`` elements over its chunks) keeps at the instants its activations peak, for a
        framework that keeps them across micro-batches under PP with ZeRO-3
        (``MemoryConventions.pp_unsharded_bytes``): each chunk holds
        ``pp_unsharded_forward_bytes`` per parameter from its first forward and the rest from
        its first backward, until its last backward reduces its gradients
        (:func:`autopar.cost.pipeline_orders.held_chunks_at_peak`, with torch's sources).

        Under 1F1B (one chunk) that is every byte, as the rank's activations peak at its first
        backward; under interleaved 1F1B a rank's earlier chunk has not begun its backward when
        its activations peak, so only the later chunk's gradients count. A chunk's parameters
        are its layers' (a tied embedding counted once per rank, shared in proportion).
        Orders torch cannot build (a micro-batch count it refuses) keep every byte.
        """
        conv = self.conventions
        m = self.train.global_batch_size // (c.dp * c.micro_batch_size)
        v = c.virtual_stages or 1
        if v == 1:
            per = {rank: params}
        else:
            _layers, mine, _groups, chunks = self.rank_layers(c.pp, c.stage_blocks,
                                                              c.schedule)[rank]
            raw = {ci: self._rank_params(c.tp, c.ep, tuple(chunks[ci]), c.etp)[0]
                   for ci in mine}
            total = sum(raw.values())
            per = {ci: params * x / total if total else 0.0 for ci, x in raw.items()}
        try:
            sets = held_chunks_at_peak(c.schedule, c.pp, m, v, rank)
        except ValueError:
            return conv.pp_unsharded_bytes * params
        fwd_b = conv.pp_unsharded_forward_bytes
        bwd_b = conv.pp_unsharded_bytes - fwd_b
        return max(sum(fwd_b * per.get(ci, 0.0) for ci in fwd)
                   + sum(bwd_b * per.get(ci, 0.0) for ci in bwd) for fwd, bwd in sets)

    def state_bytes_per_param(self) -> int:
        """Bytes of model states per parameter before any sharding: weights + gradients +
        optimizer states on the GPU, under the framework's :class:`MemoryConventions`."""
        train, conv = self.train, self.conventions
        k_opt = 0 if train.optimizer_offload else mem.optimizer_state_bytes_per_param(
            train.optimizer, conv.master_weight_bytes, train.optimizer_state_dtype)
        return ((conv.weight_bytes or train.dtype_bytes) + (conv.grad_bytes or self.params.grad_bytes)
                + k_opt)

    def optimizer_step_bytes(self, c: ParallelConfig, params: float) -> float:
        """Bytes the optimizer step allocates beside the states on a rank holding ``params``
        elements (the framework's ``optimizer_step_temp_bytes`` per optimizer-held element;
        none when the step runs on the CPU)."""
        if self.train.optimizer_offload:
            return 0.0
        held = params / (c.dp * c.cp) if c.zero_stage >= 1 else params
        return self.conventions.optimizer_step_temp_bytes * held

    def step_cached_bytes(self, c: ParallelConfig, params: float) -> float:
        """Bytes the caching allocator holds reserved at the optimizer step's peak beyond the
        allocated ones on a rank holding ``params`` elements (the framework's
        ``step_cached_bytes`` per optimizer-held element, :class:`MemoryConventions`; none
        when the step runs on the CPU)."""
        if self.train.optimizer_offload or not self.conventions.step_cached_bytes:
            return 0.0
        held = params / (c.dp * c.cp) if c.zero_stage >= 1 else params
        return self.conventions.step_cached_bytes * held

    @property
    def model_flops_per_sequence(self) -> float:
        """Model FLOPs of one sequence's forward + backward (no recomputation), causal
        attention at the half a causal kernel executes, forward and backward (the FLOPs
        convention of :data:`autopar.cost.types.FLOPS_CONVENTION`); computed once."""
        if self._flops_per_seq is None:
            g = self.graph
            causal = sum(o.fwd_flops for layer in g.layers for o in layer.ops
                         if o.kind == "attention" and o.causal)
            self._flops_per_seq = (g.forward_flops + g.backward_flops
                                   - CAUSAL_FLOPS_SHARE * (1 + ATTENTION_BACKWARD_RATIO) * causal
                                   ) / g.micro_batch_size
        return self._flops_per_seq

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
            try:
                hit = resolve(config, self.graph, self.cluster.world_size, self.train)
            except InvalidParallelConfig as exc:
                hit = exc
            self._resolved[config] = hit
            if isinstance(hit, ParallelConfig):
                self._resolved.setdefault(hit, hit)   # resolving a resolved config: itself
        if isinstance(hit, InvalidParallelConfig):
            raise type(hit)(*hit.args)
        return hit

    def rebuilt(self, cluster=None, train: TrainingConfig | None = None) -> "CostModel":
        """This cost model on another ``cluster`` and/or ``train`` (None = the same), with the
        same graph, constants, attention kernel, framework profile and memory conventions as
        given to this one (a copied and edited profile stays in force)."""
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
        if config.pp == 1 and config.schedule not in (None, "1f1b"):
            # resolving dropped the schedule (nothing to pipeline): say so, not silently
            hit = replace(hit, warnings=(*hit.warnings, (
                f"schedule {config.schedule!r} at pp=1: there is no pipeline, so the schedule "
                "changes nothing here; fix: drop it, or pp > 1")))
        if config.pp == 1 and (config.virtual_stages or 1) > 1:
            # resolving dropped the interleaving too (no pipeline ranks to give chunks to)
            hit = replace(hit, warnings=(*hit.warnings, (
                f"virtual_stages={config.virtual_stages} at pp=1: there is no pipeline to "
                "interleave, so it changes nothing here (costed as v=1); fix: drop it, or "
                "pp > 1")))
        return hit

    def step_without_dp_s(self, config: ParallelConfig) -> float:
        """``step_time_s - (time_breakdown["dp_comm_exposed"] +
        time_breakdown["overlap_slowdown"] + time_breakdown["dp_copies"])`` of :meth:`estimate`
        (seconds): the step less everything the data-parallel collectives cost, bitwise, without
        the memory model (what a search bound needs, the same for ZeRO stages 1-3; cached).

        Raises:
            InvalidParallelConfig: the configuration breaks a rule of the model or cluster.
        """
        c = self.resolve(config)
        e = self._estimates.get(c)
        if e is not None:
            tb = e.time_breakdown
            return e.step_time_s - (tb["dp_comm_exposed"] + tb["overlap_slowdown"]
                                    + tb["dp_copies"])
        hit = self._steps.get(c)
        if hit is None:
            step, dp_exposed = self._estimate(c, time_only=True)
            hit = self._steps[c] = step - dp_exposed
        return hit

    def _pipeline(self, c: ParallelConfig, layout: tuple[StageLayout, ...]) -> tuple:
        """The part of :meth:`_estimate` that the ZeRO stage cannot change: per pipeline rank
        its forward, backward and weight-gradient seconds, time parts, activation and transient
        bytes, and traffic, the recomputed FLOPs, the bottleneck rank, DualPipeV's hidden
        all-to-all, and the pipelined step and bubble seconds (:func:`pipeline_step_time`).

        None of it reads the ZeRO stage or the kept-gathered flags: per-layer costs
        (:meth:`block_cost`) and the pipeline traffic, layers and parameter counts of
        ``layout`` do not depend on them (only its model states do, which this part does not
        read). So it is cached per configuration less those two fields, and the search's
        estimates of one configuration under several ZeRO stages share it. Returned lists are
        shared between callers and never modified."""
        key = tuple(v for f, v in c.__dict__.items()
                    if f not in ("zero_stage", "reshard_after_forward"))
        hit = self._pipelines.get(key)
        if hit is not None:
            return hit
        pp, v = c.pp, c.virtual_stages
        m = self.train.global_batch_size // (c.dp * c.micro_batch_size)
        uniform = c.recompute if isinstance(c.recompute, str) else None
        modes = None if uniform else dict(zip(self.blocks, c.block_recompute(len(self.blocks))))
        ranks = self.rank_layers(pp, c.stage_blocks, c.schedule)
        stage_time = [0.0] * pp
        stage_parts = [dict(compute=0.0, tp_comm=0.0, cp_comm=0.0, ep_comm=0.0, pp_comm=0.0)
                       for _ in range(pp)]
        stage_fwd = [0.0] * pp
        stage_bwd = [0.0] * pp
        stage_wgrad = [0.0] * pp
        stage_act = [0.0] * pp
        stage_transient = [0.0] * pp
        recompute_flops = 0.0
        rank_comm: list[list[tuple]] = [[] for _ in range(pp)]  # one GPU's traffic per rank
        for rank, st in enumerate(layout):
            if uniform is not None:  # identical layers cost the same: count them once
                items = [(li, uniform, n) for li, n in ranks[rank][2]]
            else:
                counts: dict[tuple, int] = {}
                for li in st.layers:
                    key = (self.graph.layers[li].signature, modes.get(li, "none"))
                    counts.setdefault(key, [li, 0])
                    counts[key][1] += 1
                items = [(li, mode, n) for (_sig, mode), (li, n) in counts.items()]
            tp_s = cp_s = ep_s = 0.0
            tp_l = cp_l = ep_l = NO_LOAD
            parts = stage_parts[rank]
            for li, mode, n in items:
                bc = self.block_cost(li, mode, c)
                parts["compute"] += n * bc.compute_s
                stage_fwd[rank] += n * bc.fwd_s
                stage_bwd[rank] += n * bc.bwd_s
                stage_wgrad[rank] += n * bc.wgrad_s
                tp_s += n * bc.tp_s
                cp_s += n * bc.cp_s
                ep_s += n * bc.ep_s
                tp_l += bc.tp_load.scaled(n)
                cp_l += bc.cp_load.scaled(n)
                ep_l += bc.ep_load.scaled(n)
                recompute_flops += n * bc.recompute_flops
                stage_act[rank] += n * bc.act_bytes
                stage_transient[rank] = max(stage_transient[rank], bc.transient_bytes)
            parts["tp_comm"] += tp_s
            parts["cp_comm"] += cp_s
            parts["ep_comm"] += ep_s
            rank_comm[rank] += [("tp", tp_l), ("cp", cp_l), ("ep", ep_l)]
            # pipeline sends block the stage unless the framework runs them beside compute
            p2p_exposed = 0.0 if c.schedule in self.profile.overlap_pp_p2p else st.p2p_s
            stage_parts[rank]["pp_comm"] += p2p_exposed
            stage_fwd[rank] += p2p_exposed / 2
            stage_bwd[rank] += p2p_exposed / 2
            # the ledger shows what this rank sends and how long sending it takes; the step time
            # charges each boundary's round trip to the rank before it (p2p_s above)
            rank_comm[rank].append(("pp", st.p2p_load))
            stage_time[rank] = stage_fwd[rank] + stage_bwd[rank]
        # pipeline
        t_max = max(stage_time)
        bottleneck = stage_time.index(t_max)
        overlap = self._pair_overlap(c, stage_parts, stage_time)
        t_pipe, bubble = pipeline_step_time(stage_fwd, stage_bwd, m, v, c.schedule,
                                            wgrad=stage_wgrad, overlap=overlap)
        hit = self._pipelines[key] = (
            stage_time, stage_parts, stage_fwd, stage_bwd, stage_wgrad, stage_act,
            stage_transient, recompute_flops, rank_comm, bottleneck, overlap, t_pipe, bubble)
        return hit

    def _estimate(self, c: ParallelConfig, time_only: bool = False):
        """:meth:`estimate` of the resolved config ``c``, uncached; with ``time_only``, only
        (step seconds, exposed DP seconds)."""
        g, p, train = self.graph, self.params, self.train
        tp, cp, pp, dp, b, v = c.tp, c.cp, c.pp, c.dp, c.micro_batch_size, c.virtual_stages
        m = train.global_batch_size // (dp * b)
        tp_g, cp_g, pp_g, dp_g = (self.group(d, c) for d in ("tp", "cp", "pp", "dp"))
        ledger = CommLedger(*self.cluster.link_classes)

        layout = self._time_layout(c) if time_only else self.stage_layout(c)
        (stage_time, stage_parts, stage_fwd, stage_bwd, stage_wgrad, stage_act, stage_transient,
         recompute_flops, rank_comm, bottleneck, overlap, t_pipe, bubble) = self._pipeline(
            c, layout)
        stage_params = [st.params for st in layout]
        # blocks that keep their gathered parameters from forward to backward (FSDP2
        # reshard_after_forward=False): per rank, parameter elements held unsharded
        keep = [0.0] * pp
        # (under PP a framework that keeps every parameter gathered across the step's
        # micro-batches, zero3_regather_per_micro_batch False, has nothing left to keep)
        if c.zero_stage == 3 and c.reshard_after_forward is not None and dp * cp > 1 and (
                pp == 1 or self.profile.zero3_regather_per_micro_batch):
            kept = {li for li, f in zip(self.blocks, c.block_reshard(len(self.blocks))) if not f}
            keep = [sum(mem.kept_params_per_rank(g.layers[i], tp, c.ep)
                        for i in st.layers if i in kept) for st in layout]

        for kind, load in rank_comm[bottleneck]:  # per GPU: one rank's traffic
            ledger.add(kind, load, times=m)

        # data parallel and optimizer, on the rank with the most parameters
        psi = max(stage_params)
        wbytes = train.dtype_bytes
        dp_exposed = 0.0
        prof = self.profile
        gb = self.reduce_bytes
        # whether the framework runs the DP collectives beside compute: not when it issues them
        # after backward or gathers per parameter with syncs. Beside compute, a collective's
        # NCCL thread blocks hold their SMs while in flight and the compute slows
        # (overlapped_comm; autopar/hardware/nccl.py): ``dp_slow`` seconds
        ov_grad = prof.overlap_dp_grad_reduce
        ov_gather = prof.zero3_gather == "per_block"
        share = self.comm_share(dp_g)
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

        # sharded-DP all-gathers and reduce-scatters per step, for the copies around them
        gathers = reduces = 0.0
        if dp * cp > 1:
            fwd1, bwd1 = stage_fwd[bottleneck], stage_bwd[bottleneck]
            t_ag = dp_g.time("all_gather", psi * wbytes)
            t_rs = dp_g.time("reduce_scatter", psi * gb)
            # what those put on each link, for the ledger (not needed for the time alone)
            l_ag = l_rs = NO_LOAD
            if not time_only:
                l_ag = dp_g.load("all_gather", psi * wbytes)
                l_rs = dp_g.load("reduce_scatter", psi * gb)
            if c.zero_stage == 3:   # gathered and reduced per block or per parameter
                t_ag = self.zero3_collective_s(c, bottleneck, wbytes, "all_gather")
                t_rs = self.zero3_collective_s(c, bottleneck, gb, "reduce_scatter")
                if not time_only:
                    l_ag = self.zero3_collective_load(c, bottleneck, wbytes, "all_gather")
                    l_rs = self.zero3_collective_load(c, bottleneck, gb, "reduce_scatter")
            if c.zero_stage == 3 and (pp == 1 or prof.zero3_regather_per_micro_batch):
                # every micro-batch gathers the parameters for forward, and again for backward
                # those blocks resharded after forward (FSDP2 fully_shard reshard_after_forward,
                # per block; the share on the rank with the most parameters), and
                # reduce-scatters its gradients
                regather = (psi - keep[stage_params.index(psi)]) / psi if psi > 0 else 1.0
                per_mb = (1 + regather) * t_ag + t_rs
                gathers, reduces = m * (1 + regather), m
                dp_exposed = m * beside(per_mb, fwd1 + bwd1, ov_gather)
                dp_slow *= m
                ledger.add("dp", l_ag.scaled(1 + regather) + l_rs, times=m)
            elif c.zero_stage == 3:
                # under PP the framework keeps parameters gathered and gradients unsharded
                # across the step's micro-batches: one gather behind the first forward, one
                # reduce-scatter behind the last backward (memory pays, not time)
                dp_exposed = beside(t_ag, fwd1, ov_gather) + beside(t_rs, bwd1, ov_grad)
                gathers, reduces = 1, 1
                ledger.add("dp", l_ag + l_rs)
            elif c.zero_stage == 2:
                # sharded gradients cannot accumulate locally: reduce-scatter every micro-batch,
                # each hidden behind that micro-batch's backward; parameters gathered once
                dp_exposed = m * beside(t_rs, bwd1, ov_grad)
                dp_slow *= m
                dp_exposed += beside(t_ag, fwd1, ov_grad)
                gathers, reduces = 1, m
                ledger.add("dp", l_rs, times=m)
                ledger.add("dp", l_ag)
            else:
                if c.zero_stage == 0:
                    t_grad = dp_g.time("all_reduce", psi * gb)
                    t_param = 0.0
                    l_grad, l_param = dp_g.load("all_reduce", psi * gb), NO_LOAD
                elif prof.zero1_grad_all_reduce:   # full gradients all-reduced, then sharded
                    t_grad, t_param = dp_g.time("all_reduce", psi * gb), t_ag
                    l_grad, l_param = dp_g.load("all_reduce", psi * gb), l_ag
                else:
                    t_grad, t_param = t_rs, t_ag
                    l_grad, l_param = l_rs, l_ag
                ov_param = ov_grad
                if prof.zero1_param_sync == "broadcast" and c.zero_stage == 1:
                    owners = self.zero1_split(c, layout[stage_params.index(psi)].layers, psi)[1]
                    t_param, ov_param = self._zero1_broadcasts_s(c, psi * wbytes, owners), False
                    l_param = self._zero1_broadcasts_load(c, psi * wbytes, owners)
                if prof.sync_grad_bucket_elements and ov_grad:
                    # one bucket in flight, each launched after a device-wide sync, the last
                    # one after backward (FrameworkProfile.sync_grad_bucket_elements); the
                    # buckets' hidden seconds slow the compute beside them (overlapped_comm)
                    op = ("all_reduce" if c.zero_stage == 0 or prof.zero1_grad_all_reduce
                          else "reduce_scatter")
                    grad_exposed = self.sync_bucket_exposed_s(
                        c, layout[stage_params.index(psi)].layers, op, gb)
                    dp_slow += share * max(0.0, t_grad - grad_exposed)
                else:
                    grad_exposed = beside(t_grad, bwd1, ov_grad)
                dp_exposed = grad_exposed + beside(t_param, fwd1, ov_param)
                ledger.add("dp", l_grad + l_param)
        # the optimizer runs on the rank's ZeRO shard: over dp x cp, or over the framework's
        # smaller ZeRO group (zero1_group_size: InternEvo parallel.zero1, FSDP hybrid sharding);
        # the largest share paces the step (zero1_partition: whole tensors bound it below)
        if c.zero_stage >= 1:
            opt_params = self.zero1_split(c, layout[stage_params.index(psi)].layers, psi)[0]
        else:
            opt_params = psi
        if train.optimizer_offload:
            # ZeRO-Offload (Ren et al. 2021, USENIX ATC, sec. 4): gradients go to the host over
            # PCIe, the CPU runs Adam, the updated compute-dtype parameters come back; both
            # transfers at the GPU's host PCIe x16 bandwidth per direction (datasheet). The CPU
            # Adam step itself is not modelled (host memory bandwidth is not in the cluster
            # model): this is a lower bound on the offloaded step.
            gbytes = self.conventions.grad_bytes or p.grad_bytes
            optimizer_s = opt_params * (gbytes + train.dtype_bytes) / self.device.pcie_bandwidth_Bps
        else:
            # the framework's optimizer passes and gradient clipping, memory-bound
            # (FrameworkProfile.optimizer_step_bytes, sourced per framework)
            optimizer_s = opt_params * prof.optimizer_step_bytes / self.hbm_Bps
        # FSDP1's flat-parameter views: autograd concatenates the gradients into the flat
        # gradient in every micro-batch's backward, on the compute stream
        # (FrameworkProfile.zero_grad_copy_passes; memory-bound, rank with the most parameters)
        grad_copy_s = 0.0
        if c.zero_stage in (2, 3) and dp * cp > 1 and prof.zero_grad_copy_passes:
            grad_copy_s = m * prof.zero_grad_copy_passes * psi * wbytes / self.hbm_Bps
        # FSDP2's copies on the compute stream (FrameworkProfile.fsdp2_copies): each gather's
        # copy-out reads and writes the gathered parameters; each reduce-scatter's copy-in reads
        # the gradients and writes them in the reduce dtype
        if prof.fsdp2_copies and c.zero_stage in (2, 3):
            grad_copy_s += psi * (gathers * 2 * wbytes + reduces * (wbytes + gb)) / self.hbm_Bps
        step = (t_pipe + grad_copy_s + dp_exposed + dp_slow + optimizer_s
                + self.profile.step_fixed_s)
        if time_only:
            return step, dp_exposed + dp_slow + grad_copy_s

        # memory per pipeline rank
        stage_mem: list[mem.MemoryBreakdown] = []
        alloc_totals: list[float] = []
        for rank, st in enumerate(layout):
            w, gr, o = st.states
            w += keep[rank] * wbytes   # kept blocks' gathered parameters, forward to backward
            act = stage_act[rank] * st.flight + sum(
                self.block_cost(li, "none", c).act_bytes * (f - st.flight)
                for li, f in st.edge_flight)
            # the step runs after backward has freed the activations: its temporaries count
            # only where they exceed them
            step_extra = self.optimizer_step_bytes(c, st.params) - act
            transient = max(stage_transient[rank] + st.gather_bytes, step_extra)
            # outside the allocator, plus what it reserves beyond its allocated peak
            reserved = p.reserved_bytes + p.fragmentation * (w + gr + o + act + transient)
            allocated = w + gr + o + act + transient + reserved
            alloc_totals.append(allocated)
            # blocks the step freed and cannot reuse stay reserved (reported, never OOM: the
            # allocator releases them before it fails), up to the capacity
            cached = step_extra + self.step_cached_bytes(c, st.params) - transient
            if cached > 0:
                reserved += max(0.0, min(cached, self.device.visible_memory_bytes - allocated))
            stage_mem.append(mem.MemoryBreakdown(w, gr, o, act, transient, reserved))
        totals = [s.total for s in stage_mem]
        peak_rank = max(range(pp), key=lambda r: totals[r])

        # FLOPs
        # causal attention executes half of its counted (non-causal) FLOPs: count that half,
        # forward and backward, so utilisation never exceeds what the GPU can do
        model_flops = self.model_flops_per_sequence * train.global_batch_size
        hw_flops = model_flops + recompute_flops * m * dp * tp * cp
        world = self.cluster.world_size
        nominal = self.device.peak(train.precision)   # MFU against the datasheet peak
        mfu = model_flops / (step * world * nominal)
        hfu = hw_flops / (step * world * nominal)
        parts = dict(stage_parts[bottleneck])
        if overlap:  # the all-to-all seconds hidden inside DualPipeV's pairs are not exposed
            parts["ep_comm"] -= v * overlap[bottleneck]
        breakdown = {
            "compute": m * parts["compute"], "tp_comm": m * parts["tp_comm"],
            "cp_comm": m * parts["cp_comm"], "ep_comm": m * parts["ep_comm"],
            "pp_comm": m * parts["pp_comm"],
            "bubble": bubble, "dp_comm_exposed": dp_exposed, "overlap_slowdown": dp_slow,
            "dp_copies": grad_copy_s, "optimizer": optimizer_s,
            "fixed_step": self.profile.step_fixed_s,
        }
        regime = Regime.of(train, self.device.name, c)
        warns = plausibility_warnings(mfu, regime)
        path = self.profile.cp_attention.get(c.cp_mode, "fused") if c.cp > 1 else "fused"
        if path != "fused":
            how = ("in plain tensor ops (scores through memory)" if path == "unfused" else
                   "through SDPA with a mask (memory-efficient kernel, no causal skipping)")
            warns = (*warns, f"{self.profile.name} runs {c.cp_mode} context-parallel attention "
                             f"{how}, and this estimate prices that; cp_mode='ulysses' runs the "
                             "fused kernel (Megatron-LM and torchtitan run fused ring attention)")
        if self.graph.num_experts and c.etp > 1 and not self.profile.experts_tp_sharded:
            warns = (*warns, f"{self.profile.name} keeps experts whole on every TP rank "
                             f"({self.profile.sources.get('experts_tp_sharded', 'its profile')}); this estimate "
                             f"prices them split over tp={c.tp}, so its step time and memory "
                             "are optimistic. Fix: tp=1 (--tp 1) for MoE models under this "
                             "framework, or plan for a framework that splits experts "
                             "(--framework megatron or torchtitan)")
        refused = self.profile.unsupported(c, moe=self.graph.num_experts > 0)
        if refused:  # the search never returns such a plan; a hand-written one can be one
            warns = (*warns, f"{refused}: the framework cannot run this configuration as "
                             "estimated")
        warns = (*warns, *self._no_effect_notes(c))
        warns = (*self.graph.warnings, *warns,
                 *headroom_warnings(totals[peak_rank], self.device.visible_memory_bytes))
        return Estimate(
            error_band=band_for(regime), warnings=warns,
            config=c, step_time_s=step, mfu=mfu, hfu=hfu,
            tokens_per_s=train.tokens_per_step / step,
            memory_per_gpu_bytes=totals[peak_rank],
            memory_limit_bytes=self.device.visible_memory_bytes,
            fits=max(alloc_totals) <= self.device.visible_memory_bytes, num_micro_batches=m,
            model_flops_per_step=model_flops, time_breakdown=breakdown,
            memory_breakdown=stage_mem[peak_rank].as_dict(),
            stage_memory_bytes=tuple(totals), stage_time_s=tuple(stage_time),
            comm_bytes_by_link={k: v for k, v in sorted(ledger.bytes_by_link.items())
                                if k != "local"},
            comm_seconds_by_link={k: v for k, v in sorted(ledger.seconds_by_link.items())
                                  if k != "local"},
            comm_dims_by_link={k: tuple(v) for k, v in sorted(ledger.kinds_by_link.items())},
            peak_stage=peak_rank,
            stage_fwd_s=tuple(stage_fwd), stage_bwd_s=tuple(stage_bwd),
            stage_wgrad_s=tuple(stage_wgrad),
            stage_memory_breakdown=tuple(sm.as_dict() for sm in stage_mem),
            group_links={d: grp.link for d, grp in
                         (("tp", tp_g), ("cp", cp_g), ("pp", pp_g), ("dp", dp_g),
                          ("ep", self.group("ep", c)))
                         + ((("etp", self.group("etp", c)),) if c.folded else ())},
        )
