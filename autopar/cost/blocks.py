"""Per-layer compute: one layer's seconds, FLOPs and bytes per micro-batch on one GPU under one
recompute mode and sharding (:class:`BlockCost`, cached by :class:`BlockCosts` per layer
signature), and the model FLOPs of one sequence."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from ..config import ParallelConfig
from ..graph.kernels import ATTENTION_BACKWARD_RATIO
from ..hardware.collectives import NO_LOAD, LinkLoad
from . import memory as mem
from . import offload
from .comm import cp_layer_comm, split_expert_tp, tp_layer_comm
from .compute import LayerTime, layer_time
from .context import CostInputs
from .dispatch import allgather_time, dispatch_bytes_ratio, dispatch_cost
from .groups import Groups
from .host import HostTime, cached_host_time
from .moe_block import MoEBlockCosts
from .qk_norm import qk_norm_gather, whole_head_ops
from .saved_adjust import fp8_drop_restored
from .selective import is_default, module_recompute

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
    #: host seconds to issue the layer's forward / backward kernels (recompute included) for
    #: one micro-batch (:mod:`autopar.cost.host`); the pipeline timer charges what they exceed
    #: the stream's seconds by, per rank and pass
    host_fwd_s: float = 0.0
    host_bwd_s: float = 0.0

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


#: The fields of a resolved configuration that a layer's :meth:`BlockCosts.block_cost` reads,
#: as a tuple (with the layer's signature and mode, its cache key; PipelineTimer.timing shares
#: per-rank sums by the same tuple).
block_cost_fields = attrgetter("tp", "cp", "dp", "pp", "micro_batch_size", "sequence_parallel",
                               "cp_mode", "placement", "ep", "expert_tp", "dispatcher",
                               "recompute_modules")


class BlockCosts(MoEBlockCosts):
    """Per-layer costs of one cost model's graph, cached by layer signature and sharding.

    Args:
        inputs: the cost model's :class:`~autopar.cost.context.CostInputs`.
        groups: its process groups (TP, CP, EP and expert-TP collectives).
    """

    def __init__(self, inputs: CostInputs, groups: Groups):
        self.inputs, self.groups = inputs, groups
        self._layer_times: dict[tuple, LayerTime] = {}
        self._block_costs: dict[tuple, BlockCost] = {}
        self._routed_scales: dict[tuple, float] = {}
        self._host: dict[tuple, HostTime] = {}   # host.cached_host_time's
        self._flops_per_seq: float | None = None

    def layer_time(self, index: int, b: int, tp: int, cp: int, sp: bool,
                   cp_mode: str = "ulysses", etp: int | None = None,
                   ep: int | None = None) -> LayerTime:
        """Compute time of graph layer ``index`` (cached by signature and sharding).

        ``cp_mode`` picks how a CP rank runs attention (the profile's ``cp_attention``) and
        whether its causal work is balanced: a ring or all-gather split is load-balanced only
        when ``2 cp`` divides the sequence (autopar/runtime/cp.py ``layout``; Megatron-LM and
        torchtitan require it), else the last rank's queries see the most keys, (2 cp - 1) / cp
        times the average. The default (Ulysses: whole sequences, fused, balanced) is the least
        over the modes, the search's lower bound. ``etp``: expert tensor parallelism of the
        routed experts' GEMMs (None = tp; :func:`autopar.cost.compute.layer_time`). ``ep``:
        expert parallelism, which sets the experts a rank holds and so each expert GEMM's rows;
        None = one local expert, the fastest case (the search's bounds)."""
        inp = self.inputs
        layer = inp.graph.layers[index]
        local = max(1, layer.num_experts // ep) if (ep and layer.num_experts) else 1
        path = inp.profile.cp_attention.get(cp_mode, "fused") if cp > 1 else "fused"
        skew = (2 * cp - 1) / cp if (cp > 1 and cp_mode != "ulysses"
                                     and inp.train.seq_len % (2 * cp)) else 1.0
        etp = None if etp == tp else etp
        rows = self.routed_scale(layer, b, tp, cp, sp, ep)
        key = (layer.signature, b, tp, cp, sp, path, skew, etp, local, rows)
        t = self._layer_times.get(key)
        if t is None:
            t = layer_time(layer, micro_batch=b / inp.graph.micro_batch_size, tp=tp, cp=cp,
                           sequence_parallel=sp, peak_flops=inp.compute_peak,
                           fp8_peak_flops=inp.peak if inp.train.precision == "fp8" else None,
                           hbm_bandwidth=inp.device.hbm_bandwidth_Bps, params=inp.params,
                           architecture=getattr(inp.device, "architecture", "ampere"),
                           attention_kernel=inp.attention_kernel,
                           fusion=inp.profile.fusion,
                           attention_dims=self.attention_dims(layer, cp),
                           cp_attention=path, cp_imbalance=skew, expert_tp=etp,
                           eager_parts=inp.profile.eager_parts, local_experts=local,
                           routed_scale=rows)
            self._layer_times[key] = t
        return t

    def kv_gather_bytes(self, layer, tp: int) -> float:
        """Bytes of the fused QKV projection output of ``layer``'s graph micro-batch (unsharded,
        nccl-tests size) that TP all-gathers when tp exceeds its KV heads; 0 otherwise:
        tokens x (heads + 2 kv heads) x head dim x dtype bytes."""
        heads, kv = layer.attention_heads, layer.kv_heads
        if not (heads and kv) or tp <= kv:
            return 0.0
        g = self.inputs.graph
        head_dim = self.attention_dims(layer, 1)[0]
        return layer.output_bytes * (heads + 2 * kv) * head_dim / g.hidden_size

    def attention_dims(self, layer, cp: int) -> tuple[float, float]:
        """(head dim, keys per query block on one CP rank) of ``layer``'s fused attention:
        head dim from its counted FLOPs, 4 * b * heads * s * span * d; keys: the span (the
        window, or the sequence), at most the rank's s / cp (ring and load-balanced exchanges run
        the kernel on per-rank chunks)."""
        g = self.inputs.graph
        for op in layer.ops:
            if op.kind == "attention" and op.fused and layer.attention_heads:
                s = g.seq_len
                span = min(op.window, s) if op.window else s   # a window past s limits nothing
                d = op.fwd_flops / (4.0 * g.micro_batch_size * layer.attention_heads * s * span)
                return d, min(span, s / cp)
        return 0.0, 0.0

    def block_cost(self, index: int, mode: str, c: ParallelConfig) -> "BlockCost":
        """Per-micro-batch cost of graph layer ``index`` under recompute ``mode`` and the
        resolved config ``c`` (cached). Non-block layers ignore ``mode``."""
        layer = self.inputs.graph.layers[index]
        if layer.kind != "block":
            mode = "none"
        key = (layer.signature, mode, block_cost_fields(c))
        hit = self._block_costs.get(key)
        if hit is not None:
            return hit
        tp, cp, sp = c.tp, c.cp, c.sequence_parallel
        bscale = c.micro_batch_size / self.inputs.graph.micro_batch_size
        # Megatron-Core modules other than the attention core (autopar.cost.selective)
        modules = c.selective_modules
        mr = (module_recompute(layer, modules)
              if mode == "selective" and not is_default(modules) else None)
        folded = c.folded and bool(layer.num_experts)
        lt = self.layer_time(index, c.micro_batch_size, tp, cp, sp, c.cp_mode,
                             c.etp if folded else None, c.ep)
        # DeepEP's flex group is tp x ep: it sends each token to every expert-TP shard itself
        # (autopar.cost.dispatch), with no all-gather over the expert-TP group after it; the
        # all-gather dispatcher gathers over the expert-TP x EP group, which takes the experts'
        # TP collectives with it (priced below with the dispatch)
        gathered = bool(layer.num_experts) and c.dispatcher == "allgather" and c.ep > 1
        attn_layer, expert_layer = (split_expert_tp(layer) if folded or gathered
                                    else (layer, None))
        tf, tb, fb, bb = tp_layer_comm(attn_layer, self.groups.group("tp", c), micro_batch=bscale,
                                       cp=cp, sequence_parallel=sp,
                                       mlp_per_linear=self.inputs.profile.tp_mlp_reduce_per_linear)
        kvg = self.kv_gather_bytes(layer, tp) * bscale / cp
        if kvg:
            # tp above the KV heads (Megatron-Core attention.py get_query_key_value_tensors,
            # 'num_query_groups < world_size'): each rank computes 1/tp of the fused QKV
            # projection, all-gathers it over TP and keeps its query group's K/V; backward
            # reduce-scatters the gradient (all_gather_last_dim_from_tensor_parallel_region)
            tp_g = self.groups.group("tp", c)
            tf, fb = tf + tp_g.time("all_gather", kvg), fb + tp_g.load("all_gather", kvg)
            tb, bb = tb + tp_g.time("reduce_scatter", kvg), bb + tp_g.load("reduce_scatter", kvg)
        if whole_head_ops(layer, tp, self.inputs.profile.eager_parts):   # qk_norm.py
            g_s, g = qk_norm_gather(layer, self.groups.group("tp", c), bscale, cp)
            tf, tb, fb, bb = tf + g_s, tb + g_s, fb + g, bb + g
        if expert_layer is not None and (c.dispatcher == "alltoall" or c.ep == 1):
            # folded MoE: the routed tokens are all-gathered over the expert-TP group after the
            # dispatch all-to-all and reduce-scattered before the combine (DeepEP sends them to
            # every expert-TP shard itself, priced with its dispatch, which runs only with
            # ep > 1: at ep = 1 the tokens still reach the shards this way) (Megatron-Core
            # token_dispatcher.py MoEAlltoAllTokenDispatcher: gather_from_sequence_parallel_
            # region / reduce_scatter_to_sequence_parallel_region over expt_tp), on the etp
            # ranks' share of the tokens: etp / tp of what one attention-TP group holds
            xf, xb, xfb, xbb = tp_layer_comm(expert_layer, self.groups.group("etp", c),
                                             micro_batch=bscale * c.etp / tp, cp=cp,
                                             sequence_parallel=True)
            tf, tb, fb, bb = tf + xf, tb + xb, fb + xfb, bb + xbb
        if (self.inputs.profile.moe_tp_token_alltoall and layer.num_experts and tp > 1
                and c.dispatcher == "alltoall" and not folded):
            xf, xfb = self.tp_token_alltoall(layer, c, bscale)
            # each all-to-all's gradient is the reverse all-to-all of the same bytes, and the
            # logits' all-gather's a reduce-scatter of them (FrameworkProfile.
            # moe_tp_token_alltoall)
            tf, tb, fb, bb = tf + xf, tb + xf, fb + xfb, bb + xfb
        if mode == "full":  # the recomputed forward repeats its collectives
            tb += tf
            bb += fb
        if self.inputs.profile.overlap_tp_comm and sp:
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
            tf = max(0.0, tf - self.inputs.params.dp_overlap * gemm_f)
            tb = max(0.0, tb - self.inputs.params.dp_overlap * gemm_b)
        cf, cb, cload = cp_layer_comm(layer, self.groups.group("cp", c), micro_batch=bscale, tp=tp,
                                       attention_fwd_s=lt.attention_fwd_s, mode=c.cp_mode,
                                       overlap=self.inputs.params.dp_overlap,
                                       kv_repeat=self.inputs.profile.ulysses_kv_repeat)
        ef, eload = 0.0, NO_LOAD
        if c.ep > 1 and layer.num_experts:
            # dispatch and combine of the rank's tokens forward, the same two backward (half
            # each side below), as the plan's dispatcher moves them (autopar.cost.dispatch);
            # a capacity factor drops or pads the routed rows (routed_scale); the dispatch
            # direction in the framework's format (FP8 under FP8: dispatch_ratio)
            tokens = layer.output_bytes * bscale / cp / (tp if sp else 1)
            train = self.inputs.train
            scale = self.routed_scale(layer, c.micro_batch_size, tp, cp, sp, c.ep)
            if gathered:
                d = allgather_time(self.allgather_traffic(layer, c, tokens),
                                   self.groups.group("tpep", c))
            else:
                d = dispatch_cost(c.dispatcher, tokens, layer.num_experts,
                                  layer.experts_per_token, self.groups.group("ep", c),
                                  etp=c.etp if folded else 1, routed_scale=scale,
                                  dispatch_ratio=dispatch_bytes_ratio(
                                      self.inputs.profile.moe_dispatch_dtype, train.precision,
                                      train.dtype_bytes))
            ef, eload = d.seconds, d.load
            # the all-to-all dispatcher's side collectives: the probabilities' all-to-all each
            # way and the counts' all-gather in forward (FrameworkProfile.moe_probs_alltoall,
            # moe_counts_gather)
            probs_s, pload, gather_s, gload = 0.0, NO_LOAD, 0.0, NO_LOAD
            if not gathered:
                probs_s, pload, gather_s, gload = self.alltoall_metadata_s(
                    layer, c, tokens / (self.inputs.graph.hidden_size * train.dtype_bytes)
                    * max(1, layer.experts_per_token) * scale)
            ef, eload = ef + probs_s, eload + pload
            # the recomputed forward dispatches again (op-level SAC: moe_sac_redispatch)
            redispatch = mode == "full" or (mr is not None and mr.dispatch) or (
                mode == "selective-op" and self.inputs.profile.moe_sac_redispatch)
            if redispatch:
                ef *= 1.5
                eload = eload.scaled(1.5)
            # the dispatcher's blocking reads of the token counts drain the stream; charged
            # with the dispatch (FrameworkProfile.moe_dispatch_sync_ops), once per forward run,
            # as the counts' all-gather
            sync = self.dispatch_sync_s(layer, c) + gather_s
            ef += sync * (2 if redispatch else 1)
            eload = eload + gload.scaled(2 if redispatch else 1)
        rec = lt.recompute_s(mode, mr.ops if mr is not None else None)
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
        elif mr is not None:   # the forward of the recomputed modules' ops
            again = [layer.ops[i] for i in mr.ops]
            rflops = (sum(o.fwd_flops for o in again) - CAUSAL_FLOPS_SHARE * sum(
                o.fwd_flops for o in again if o.kind == "attention" and o.causal)
                      ) * bscale / (tp * cp)
        elif mode != "none":
            rflops -= CAUSAL_FLOPS_SHARE * causal
        conv = self.inputs.conventions
        act_none = mem.block_activation_bytes(layer, "none", micro_batch=bscale, tp=tp, cp=cp,
                                              sequence_parallel=sp)
        # unfused attention: the framework's softmax output beyond the 2 bytes per score the
        # graph saves, and its score-sized working tensors (MemoryConventions)
        scores = mem.unfused_score_elements(
            layer, tokens=self.inputs.graph.micro_batch_size * self.inputs.train.seq_len,
            dtype_bytes=self.inputs.train.dtype_bytes) * bscale / (tp * cp)
        score_extra = (conv.unfused_score_saved_bytes - 2) * scores
        act_none += score_extra
        # the loss's saved tensors: the graph measures torch's fp32 log-probabilities (4 bytes
        # per logit element); a fused loss keeps what MemoryConventions.loss_saved_bytes says
        logits = (sum(o.bytes_written for o in layer.ops if o.kind == "loss") / 4.0
                  * bscale / (tp * cp) if layer.kind == "head" else 0.0)
        loss_saved = (conv.loss_saved_bytes - 4) * logits
        act_none += loss_saved
        # norms and GLU activations run as eager ops keep more than the graph's fused kernels
        # (and repeated K / V below), in a block kept whole ("none"); every recompute mode
        # re-materialises them one block at a time (full; op-level SAC and the selective
        # policy of autopar/runtime/recompute.py save matmul, attention and collective outputs
        # only; Megatron-LM's selective recompute runs fused kernels, which add nothing here)
        eager = mem.eager_saved_bytes(
            layer, fusion=self.inputs.profile.fusion, eager_parts=self.inputs.profile.eager_parts,
            dtype_bytes=self.inputs.train.dtype_bytes, micro_batch=bscale, tp=tp, cp=cp,
            sequence_parallel=sp)
        # grouped-query K and V repeated to every head before the kernel, which keeps them
        kv_repeat = (mem.kv_repeat_bytes(layer, micro_batch=bscale, tp=tp, cp=cp)
                     if conv.kv_repeat_saved else 0.0)
        eager += kv_repeat
        act_none += eager
        # an MoE block as the framework's expert layer keeps it (MemoryConventions
        # moe_combine_saved, expert_input_gathered): kept whole without recompute and under
        # selective recompute (which drops the attention core only), re-materialised one
        # block at a time under full recompute
        moe = mem.moe_saved_delta(
            layer, combine_saved=bool(conv.moe_combine_saved),
            input_gathered=bool(conv.expert_input_gathered), micro_batch=bscale, tp=tp,
            etp=c.etp, cp=cp, sequence_parallel=sp, dtype_bytes=self.inputs.train.dtype_bytes)
        fp8_copies = (self.inputs.train.precision == "fp8" and layer.kind == "block"
                      and conv.fp8_input_saved_bytes is not None)
        if conv.moe_router_input_saved:
            # the router keeps its input as passed and its weight, not the graph's cast copies
            # (MemoryConventions.moe_router_input_saved); part of the MoE layer as above
            moe += mem.router_saved_delta(
                layer, fp8_linear_copies=fp8_copies, micro_batch=bscale, tp=tp, cp=cp,
                sequence_parallel=sp, dtype_bytes=self.inputs.train.dtype_bytes)
        # routed rows an expert capacity adds (padding) or removes (dropping): their saved
        # tensors, kept by every mode but full recompute, which re-makes them one block at a time
        padded = (self.routed_scale(layer, c.micro_batch_size, tp, cp, sp, c.ep) - 1.0) * \
            mem.routed_saved_bytes(layer, micro_batch=bscale, tp=tp, cp=cp, etp=c.etp)
        if gathered:
            # the all-gather dispatcher keeps the local experts' columns of the gathered routing
            # map (bool) and the permutation's int32 row map, [G T, E / ep] each
            # (token_dispatcher.py MoEAllGatherTokenDispatcher.dispatch_postprocess, unpermute)
            moe += self.allgather_traffic(layer, c, layer.output_bytes * bscale / cp /
                                          (tp if sp else 1)).routing_map / c.ep * 5.0
        act_none += moe + padded
        # FP8 training: Linear inputs and routed experts' gated-unit inputs kept in FP8
        # (MemoryConventions fp8_input_saved_bytes, fp8_shared_input_saved_bytes,
        # fp8_expert_glu_input_saved_bytes), in every mode that keeps them
        # (none, selective: the attention core holds no Linear input); full recompute
        # re-materialises them one block at a time
        fp8_in = 0.0
        if self.inputs.train.precision == "fp8" and layer.kind == "block":
            fp8_in = mem.fp8_input_delta(
                layer, input_bytes=conv.fp8_input_saved_bytes,
                shared_bytes=conv.fp8_shared_input_saved_bytes,
                expert_glu_bytes=conv.fp8_expert_glu_input_saved_bytes,
                dtype_bytes=self.inputs.train.dtype_bytes, micro_batch=bscale, tp=tp, cp=cp,
                sequence_parallel=sp)
        act_none += fp8_in
        if mr is not None:
            # the modules' dropped tensors (counted at the graph's dtype; a checkpointed
            # Linear's input kept in FP8 is restored below to its FP8 count, a norm output
            # only Linears keep to its FP8 copies: memory.fp8_input_delta);
            # the attention core takes the framework's extra score and repeated K / V bytes
            # with it, a recomputed MoE layer its framework delta and capacity rows with the
            # graph's tensors they adjust
            act = act_none - mr.dropped_bytes(micro_batch=bscale, tp=tp, cp=cp,
                                              sequence_parallel=sp)
            if fp8_in and conv.fp8_input_saved_bytes is not None:
                act += fp8_drop_restored(mr, conv.fp8_input_saved_bytes,
                                         self.inputs.train.dtype_bytes, micro_batch=bscale,
                                         tp=tp, cp=cp, sequence_parallel=sp)
            if "core_attn" in modules:
                act -= score_extra + kv_repeat
            if "moe" in modules:
                act -= moe + padded
        else:
            act = act_none if mode == "none" else mem.block_activation_bytes(
                layer, mode, micro_batch=bscale, tp=tp, cp=cp, sequence_parallel=sp) + \
                loss_saved + (padded if mode != "full" else 0.0)
            if mode == "selective":
                act += moe + fp8_in
        # recomputing a block re-materialises what it did not keep, one block at a time
        transient = act_none - act + conv.unfused_score_work_bytes * scores
        if gathered:
            # the all-gather dispatcher's gathered tokens (Megatron's global memory buffer) and
            # the unpermuted expert output before its reduce-scatter, [G T, H] each, live
            # through the layer (token_dispatcher.py token_dispatch, combine_preprocess)
            transient += 2.0 * self.allgather_traffic(
                layer, c, layer.output_bytes * bscale / cp / (tp if sp else 1)).tokens
        # the loss's backward: gradients of the logits beside what it saved
        transient += conv.loss_work_bytes * logits
        if layer.kind == "head" and conv.loss_chunks > 1 and logits:
            # a chunked loss (MemoryConventions.loss_chunks): the logit-sized tensors one chunk
            # at a time inside the loss call; the head keeps its input's gradient
            act, transient = mem.chunked_loss_bytes(
                layer, chunks=conv.loss_chunks, loss_saved_bytes=conv.loss_saved_bytes,
                loss_work_bytes=conv.loss_work_bytes, kept_extra=eager, micro_batch=bscale,
                tp=tp, cp=cp, sequence_parallel=sp)
        if self.inputs.train.precision == "fp8" and layer.kind == "block":
            # the FP8 copy of the running layer's Linear weights and its transpose (1 byte each)
            transient += 2.0 * mem.layer_params_per_rank(layer, tp, ep=c.ep, etp=c.etp)
        # activation offload: a decoder block's saved tensors go to the host in forward and
        # come back for its backward, copied on the compute stream (autopar.cost.offload):
        # the copies' seconds count as the stream's, in compute_s too
        kept, copy_s = offload.activation_copy(self.inputs.train, layer.kind, act,
                                               self.inputs.device.pcie_bandwidth_Bps)
        transient += act - kept
        act = kept
        host = cached_host_time(self._host, layer, self.inputs.profile,
                                self.inputs.kernel_host_s, mode, mr.ops if mr else None)
        # the weight-gradient GEMMs (lt.wgrad_s) run apart from the rest of backward under a
        # zero-bubble schedule; recomputation and communication stay with the input gradient
        bc = BlockCost(fwd_s=lt.fwd_s + tf + cf + ef / 2 + copy_s,
                       bwd_s=lt.bwd_s + rec + tb + cb + ef / 2 + copy_s,
                       compute_s=lt.fwd_s + lt.bwd_s + rec + 2 * copy_s,
                       tp_s=tf + tb, cp_s=cf + cb,
                       tp_load=fb + bb, cp_load=cload, recompute_flops=rflops,
                       act_bytes=act, transient_bytes=transient, ep_s=ef, ep_load=eload,
                       wgrad_s=lt.wgrad_s, host_fwd_s=host.fwd_s, host_bwd_s=host.bwd_s)
        self._block_costs[key] = bc
        return bc

    def model_flops_per_sequence(self) -> float:
        """Model FLOPs of one sequence's forward + backward (no recomputation), causal
        attention at the half a causal kernel executes, forward and backward (the FLOPs
        convention of :data:`autopar.cost.types.FLOPS_CONVENTION`); computed once."""
        if self._flops_per_seq is None:
            g = self.inputs.graph
            causal = sum(o.fwd_flops for layer in g.layers for o in layer.ops
                         if o.kind == "attention" and o.causal)
            self._flops_per_seq = (g.forward_flops + g.backward_flops
                                   - CAUSAL_FLOPS_SHARE * (1 + ATTENTION_BACKWARD_RATIO) * causal
                                   ) / g.micro_batch_size
        return self._flops_per_seq
