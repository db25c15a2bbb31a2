"""The names the fields of a :class:`~autopar.frameworks.profiles.FrameworkProfile` take
(stage-cut, interleaving, expert-TP, fusion, gather, ZeRO-1 rules), the names of its cost
fields, the optimizer-step byte counts with their derivations, and the default cost sources
(plain PyTorch 2.x). Re-exported by :mod:`autopar.frameworks.profiles`; imports nothing of
autopar, so every module may use it.
"""

from __future__ import annotations

#: Stage-cut rules, most permissive first: any cut; only the first and last stage may differ
#: from the rest; balanced only (layer counts differ by at most one).
CUT_RULES = ("any", "first_last", "balanced")
#: Where an even split of decoder blocks over pipeline stages puts the remainder when no cut is
#: given (:attr:`FrameworkProfile.stage_split`): ``middle`` = the cost model's balanced cut
#: (:func:`autopar.cost.stages.balanced_stage_blocks`: extra blocks to the middle stages);
#: ``last`` = the last ``blocks % pp`` stages take one more (InternEvo's partition_uniform).
STAGE_SPLITS = ("middle", "last")
#: Interleaved-chunk rules: any chunk sizes; all chunks equal; no interleaving.
CHUNK_RULES = ("any", "equal", "none")
#: Expert-tensor-parallel rules (:attr:`FrameworkProfile.expert_tensor_parallel`): etp = tp only;
#: etp = 1 or tp; any etp with ep * etp dividing tp * cp * dp (MoE parallel folding).
ETP_RULES = ("tp", "one_or_tp", "one", "any")
#: Fusion levels of memory-bound (element-wise, norm) ops: ``eager`` = one kernel per PyTorch op
#: as the model's Python writes it (norms in the model's own ops); ``compile`` = TorchInductor
#: fuses each chain of consecutive point-wise ops into one kernel (Ansel et al. 2024, PyTorch 2,
#: section 4: "pointwise and reduction fusion"); ``fused`` = hand-fused kernels (Apex / Transformer
#: Engine fused norms, bias-GeLU, bias-dropout-add), costed as the graph counts them (fused norm).
FUSION_LEVELS = ("eager", "compile", "fused")
#: How the host issues a micro-batch's kernels (:attr:`FrameworkProfile.host_issue`; costed by
#: :mod:`autopar.cost.host`): ``per_kernel`` = the Python/C++ host dispatches and launches every
#: kernel one by one (eager PyTorch, torch.compile without CUDA graphs, Megatron-Core / Transformer
#: Engine modules without ``--enable-cuda-graph``), so a rank's micro-batch takes at least its
#: kernel count times the host's time per op; ``cuda_graph`` = the forward and backward are
#: captured and replayed as CUDA graphs (torch.cuda.graphs, ``mode="reduce-overhead"``,
#: Transformer Engine ``make_graphed_callables``): one launch per graph, no per-kernel host time.
HOST_ISSUES = ("per_kernel", "cuda_graph")
#: How ZeRO-3 / FSDP gathers parameters: ``per_block`` (FSDP / FSDP2: one all-gather per wrapped
#: block, the next block's prefetched while this one computes) or ``per_parameter`` (DeepSpeed
#: ZeRO-3: per-parameter gathers through small prefetch buckets with stream synchronisation,
#: costed as not overlapped).
ZERO3_GATHERS = ("per_block", "per_parameter")
#: How a context-parallel rank runs attention (:attr:`FrameworkProfile.cp_attention`; costed
#: by :func:`autopar.cost.compute.layer_time`).
CP_ATTENTION_PATHS = ("fused", "masked", "unfused")
#: The format a framework's MoE layer moves tokens in along the dispatch direction (the forward
#: dispatch and, in backward, the dispatch of the combine's gradient;
#: :attr:`FrameworkProfile.moe_dispatch_dtype`, costed by
#: :func:`autopar.cost.dispatch.dispatch_bytes_ratio`): ``activation`` = the training's
#: activation dtype (bf16 under mixed precision); ``fp8_1x128`` = under precision ``"fp8"``,
#: FP8 with one fp32 scale per 1x128 tile, ready for the experts' FP8 GEMM (DeepSeek-V3's
#: HAI-LLM), and the activation dtype under any other precision. The two combines always move
#: the activation dtype.
MOE_DISPATCH_DTYPES = ("activation", "fp8_1x128")
#: How a framework's MoE layer sizes each expert's input (:attr:`FrameworkProfile.
#: moe_capacity_rule`; costed by :func:`autopar.cost.capacity.routed_scale`): ``megatron`` =
#: dropless runs each expert's routed rows; a capacity factor caps each expert at
#: ``ceil(T x top_k / E x factor)`` rows of a router call and pads to it only with
#: ``moe_pad_to_capacity`` (Megatron-Core moe_utils.py ``get_capacity``; torchtitan and plan.apply
#: are dropless); ``deepspeed`` = every expert runs a buffer of C rows (the [E, C, hidden]
#: buffer of deepspeed/moe/sharded_moe.py ``MOELayer.forward``, ``_sparse_encode``): with a
#: capacity factor C = max(ceil(T / E x factor x top_k), min_capacity 4) (``topkgating``,
#: ``_capacity``; deepspeed/moe/layer.py ``MoE(min_capacity=4)``), always padded; dropless
#: (``MoE(drop_tokens=False)``) C = the largest expert's count, all-reduced (MAX) over the EP
#: group, so every expert is padded to the busiest one.
MOE_CAPACITY_RULES = ("megatron", "deepspeed")
#: DeepSpeed-MoE's smallest expert capacity (deepspeed/moe/layer.py ``MoE(min_capacity=4)``).
DEEPSPEED_MIN_CAPACITY = 4
#: Names of the cost fields (defaults in
#: :class:`~autopar.frameworks.profiles.FrameworkProfile`; sources in ``cost_sources``).
COST_FIELDS = ("attention_kernels", "fusion", "overlap_dp_grad_reduce", "zero3_gather",
               "zero3_regather_per_micro_batch", "zero3_pp_root_regather",
               "zero3_pp_reduce_after_flush", "overlap_tp_comm", "overlap_pp_p2p",
               "grad_reduce_bytes", "grad_reduce_fp16_in_fp16", "step_fixed_s",
               "zero1_param_sync", "zero1_group_size",
               "zero1_grad_all_reduce", "cp_attention", "optimizer_step_bytes", "eager_parts",
               "zero_grad_copy_passes", "zero1_partition", "sync_grad_bucket_elements",
               "fsdp2_copies", "tp_mlp_reduce_per_linear", "zero2_grad_all_reduce",
               "zero2_reduce_per_step", "zero12_grad_copy_passes", "host_issue",
               "host_op_s_published", "zero0_grad_copy_passes",
               "zero0_step_bytes", "zero0_step_host_ops_per_tensor", "zero1_step_bytes",
               "zero1_step_host_ops_per_tensor", "zero3_persistent_elements",
               "zero3_reduce_bucket_elements", "moe_dispatch_dtype", "moe_tp_token_alltoall",
               "moe_dispatch_sync_ops", "moe_probs_alltoall", "moe_counts_gather",
               "moe_sac_redispatch",
               "moe_capacity_rule", "ulysses_kv_repeat")
#: Parts of a block that run as plain eager PyTorch ops inside a stack that is otherwise fused
#: (:attr:`FrameworkProfile.eager_parts`; costed by :func:`autopar.cost.compute.layer_time`):
#: ``glu``: a gated linear unit's activation as its own kernel before the multiply
#: (``F.silu(a) * b``, implied by ``fusion="eager"``); ``norm_input_cast``: the residual stream
#: is cast to fp32 (``x.float()``) before each fused norm, which then reads fp32, and the cast
#: and norm are checkpointed (repeated in backward); ``fp32_cross_entropy``: the loss is torch's
#: ``F.cross_entropy(logits.float(), labels)`` as eager ATen kernels (the cast, log_softmax,
#: nll_loss and their backward: :data:`autopar.cost.compute.EAGER_CE_FWD_BYTES_PER_LOGIT`);
#: ``fp8_amax_casts``: under FP8 each Linear operand is cast by an amax pass then a cast kernel,
#: again in backward (torchao's float8nocompile prototype:
#: :data:`autopar.cost.compute.FP8_AMAX_CAST_BYTES`); ``separate_scale_mask``: an unfused
#: attention scales its scores and applies the causal mask as three element-wise ops (divide,
#: multiply, subtract: Megatron-LM v1 in DeepSpeedExamples,
#: :data:`autopar.cost.compute.SEPARATE_SCALE_MASK_BYTES_PER_SCORE`);
#: ``tp_replicated_qk_norm``: under tensor parallelism the per-head query/key norms run on the
#: whole heads, replicated on every TP rank: the head-sharded queries and keys are all-gathered
#: over TP before them and the ops between them and the attention (the rotary embedding) run on
#: the whole tensors too (torchtitan's Qwen3 TP plan before 2025-10-14:
#: :func:`autopar.frameworks.stacks.torchtitan.with_replicated_qk_norm`).
EAGER_PARTS = ("glu", "norm_input_cast", "fp32_cross_entropy", "fp8_amax_casts",
               "separate_scale_mask", "tp_replicated_qk_norm")
#: Bytes per parameter the optimizer step moves through HBM in the ``torch`` profile: torch.optim.
#: AdamW as constructed by default (foreach on CUDA since torch 2.0, ``_default_to_fused_or_foreach``
#: in torch/optim/optimizer.py), whose ``_multi_tensor_adam`` (torch/optim/adam.py, torch 2.13,
#: decoupled weight decay, not capturable) makes eight passes over fp32 tensors: params *= (1 - lr
#: wd) (read 4, write 4), exp_avg.lerp_(grad) (8, 4), exp_avg_sq *= beta2 (4, 4),
#: exp_avg_sq.addcmul_(grad, grad) (8, 4), sqrt(exp_avg_sq) (4, 4), /= bias_correction2_sqrt (4, 4),
#: += eps (4, 4), params.addcdiv_(exp_avg, denom) (12, 4): 80 bytes; plus gradient clipping by
#: norm (torch.nn.utils.clip_grad_norm_: a norm pass reading the fp32 gradient, 4, and
#: ``_foreach_mul_`` by the clip coefficient, 4 + 4): 92.
TORCH_OPTIMIZER_STEP_BYTES = 92
#: The same for a fused Adam (one multi-tensor kernel: torch ``fused=True``, apex / Transformer
#: Engine ``FusedAdam``, DeepSpeed ``FusedAdam``): read params, grad, exp_avg, exp_avg_sq (16),
#: write params, exp_avg, exp_avg_sq (12) = 28; plus clipping by norm as two multi-tensor passes
#: (norm: read 4; scale: read 4, write 4) = 40.
FUSED_OPTIMIZER_STEP_BYTES = 40
#: A fused Adam behind a mixed-precision optimizer that keeps fp32 main copies apart from the
#: bf16 model: :data:`FUSED_OPTIMIZER_STEP_BYTES` plus casting the bf16 gradient to the fp32
#: main gradient (read 2, write 4) and copying the updated fp32 main parameter back to bf16
#: (read 4, write 2) = 52.
MIXED_FUSED_OPTIMIZER_STEP_BYTES = 52

#: Passes over every parameter's gradient that FSDP1 (torch.distributed.fsdp.
#: FullyShardedDataParallel) adds to each backward on the compute stream: its modules' parameters
#: are autograd views of one flat parameter (torch/distributed/fsdp/_flat_param.py
#: ``_get_unflat_views_unaligned``: ``flat_param.split(...)`` then ``.view``), so autograd's
#: split backward (``split_with_sizes_backward``, derivatives.yaml) concatenates the views'
#: gradients into the flat gradient: one read and one write of every gradient element. (Its
#: gradient pre-divide, _runtime_utils.py ``_reduce_grad`` -> ``_div_if_needed``, runs on the
#: post-backward stream beside compute and is not charged.)
FSDP1_GRAD_COPY_PASSES = 2

#: Passes over every parameter's compute-dtype gradient that DeepSpeed ZeRO-1/2 adds to each
#: gradient reduction on the compute stream, at its defaults (deepspeed/runtime/zero/config.py:
#: contiguous_gradients True, reduce_scatter True, use_multi_rank_bucket_allreduce True,
#: overlap_comm False for stages 1-2, so stage_1_and_2.py average_tensor and reduce_ipg_grads run
#: on ``get_accelerator().current_stream()``). DeepSpeed v0.14.2 and v0.16
#: deepspeed/runtime/zero/stage_1_and_2.py: ``reduce_independent_p_g_buckets_and_remove_grads``
#: copies each gradient into the reduce bucket (``new_grad_tensor.copy_(grad_reduc.view(-1))``:
#: read and write, 2); ``average_tensor`` divides the bucket by the data-parallel size in place
#: (``tensor.div_``: 2); ``allreduce_and_scatter`` -> ``allreduce_bucket`` flattens the bucket's
#: slices into a new tensor before the all-reduce (``self.flatten(bucket)``, torch.cat: 2) = 6.
#: The owner's slice copied back after the all-reduce and into ``grads_in_partition``
#: (``copy_grads_in_partition``) touch 1/dp of the elements and are left out.
DEEPSPEED_ZERO12_GRAD_COPY_PASSES = 6

#: Passes over every parameter's compute-dtype gradient that DeepSpeed's engine adds on the compute
#: stream when it reduces gradients without ZeRO (stage 0, data-parallel size > 1), once per step,
#: at its defaults (deepspeed/runtime/constants.py PRESCALE_GRADIENTS_DEFAULT False,
#: GRADIENT_PREDIVIDE_FACTOR_DEFAULT 1.0; communication_data_type the fp16 / bf16 model dtype).
#: DeepSpeed 0.19.6 (edaa722) deepspeed/runtime/engine.py: ``_backward_epilogue`` ->
#: ``allreduce_gradients`` -> ``buffered_allreduce_fallback`` -> ``allreduce_no_retain`` (buckets
#: of 5e8 elements) -> ``allreduce_and_copy``: ``allreduce_bucket`` flattens the bucket
#: (``self.flatten(bucket)``, torch.cat: read and write, 2), all-reduces it and scales it after
#: (``tensor_to_allreduce.mul_(self.gradient_predivide_factor() / dp_world_size)``: 2), then
#: ``buf.copy_(synced)`` copies each gradient back from the flat result (2) = 6. The same three
#: copies in DeepSpeed 0.3.0 (7d4d742) engine.py ``allreduce_bucket`` / ``allreduce_and_copy``.
DEEPSPEED_ZERO0_GRAD_COPY_PASSES = 6
#: Bytes per parameter DeepSpeed's ZeRO-0 mixed-precision step adds to the fused optimizer's
#: (:data:`MIXED_FUSED_OPTIMIZER_STEP_BYTES`, which counts one fp32 cast of the gradient):
#: DeepSpeed 0.19.6 (edaa722) deepspeed/runtime/fp16/fused_optimizer.py ``FP16_Optimizer.step``
#: (the wrapper for fp16, and for bf16 without ZeRO: engine.py ``_do_optimizer_sanity_check``
#: returns FP16 or DDP_BFLOAT16, both ``_configure_fp16_optimizer``) first checks every gradient
#: for overflow (``self.overflow_checker.has_overflow(fp16_params)`` -> runtime/utils.py
#: ``CheckOverflow.has_overflow_serial`` -> ``_has_inf_or_nan``: ``float(x.float().sum())``: read
#: 2, write 4, read 4 = 10), then flattens the fp32 casts (``_flatten_dense_tensors([... p.grad.
#: to(data_type) ...])``: the cast is counted, the concatenation reads 4 and writes 4 = 8): 18.
#: The same in DeepSpeed 0.3.0 (7d4d742) fused_optimizer.py ``step`` and utils.py.
DEEPSPEED_ZERO0_STEP_BYTES = 18
#: Host-issued ops per gradient tensor of DeepSpeed's ZeRO-0 overflow check, each tensor's ending
#: in a device-to-host read the host waits on (so the queue drains and the host's issue time is
#: exposed, once per tensor): ``_has_inf_or_nan`` (runtime/utils.py, 0.3.0 and 0.19.6) issues
#: ``x.float()``, ``.sum()`` and the ``float(...)`` copy to the host: 3.
DEEPSPEED_ZERO0_STEP_HOST_OPS_PER_TENSOR = 3
#: Bytes per parameter of the whole model's gradients that DeepSpeed 0.3.0's ZeRO-1 step reads
#: before it updates its partition (deepspeed/runtime/zero/stage1.py, 0.3.0 7d4d742,
#: ``FP16_DeepSpeedZeroOptimizer_Stage1.step``): the overflow check over every fp16 gradient
#: (``self.overflow_checker.check()`` -> runtime/utils.py ``CheckOverflow.has_overflow_serial``
#: -> ``_has_inf_or_nan``: ``float(x.float().sum())``: read 2, write 4, read 4 = 10) and the
#: gradient norm over every fp16 gradient (``get_grad_norm(group, mpu)``: per tensor
#: ``p.grad.data.float().norm(2)``: read 2, write 4, read 4 = 10): 20. (DeepSpeed 0.14.2's
#: stage_1_and_2.py checks overflow only under fp16, on the device, and takes the norm of the
#: rank's partition: not this.)
DEEPSPEED_030_ZERO1_STEP_BYTES = 20
#: DeepSpeed ZeRO-3's ``stage3_param_persistence_threshold`` default, in elements: parameters of
#: this many elements or fewer are not partitioned and never gathered (deepspeed/runtime/zero/
#: config.py ``param_persistence_threshold: int = Field(pp_int(1e5), ...)``, v0.14.2 and v0.16;
#: partition_parameters.py ``Init`` (which sets ``apply_param_persistence = True``) marks
#: ``param.ds_numel <= Init.param_persistence_threshold`` as ``param.ds_persist = True``: kept
#: whole, not partitioned), up to ``stage3_model_persistence_threshold`` (default sys.maxsize:
#: no cap). Their bytes (norm weights, small biases) are not added to memory.
DEEPSPEED_ZERO3_PERSISTENCE_THRESHOLD = 100_000
#: DeepSpeed ZeRO-3's gradient bucket, in elements: ``reduce_bucket_size`` default 5e8
#: (deepspeed/runtime/zero/config.py ``Field(pp_int(5e8))``, v0.14.2 and v0.16). stage3.py
#: ``reduce_ready_partitions_and_remove_grads`` -> ``__add_grad_to_ipg_bucket`` collects each
#: gradient and ``__reduce_and_partition_ipg_grads`` runs when the next would overflow the
#: bucket (and at the end of backward, ``independent_gradient_partition_epilogue``): with the
#: defaults reduce_scatter True and contiguous_gradients True it calls ``__avg_scatter_grads``
#: -> runtime/comm/coalesced_collectives.py ``reduce_scatter_coalesced``, one reduce-scatter of
#: the whole bucket (persistent tensors' gradients included).
DEEPSPEED_ZERO3_REDUCE_BUCKET_ELEMENTS = 500_000_000
#: Host-issued ops per gradient tensor of that step, each tensor's ending in a read back to the
#: host the host waits on: ``_has_inf_or_nan`` (``x.float()``, ``.sum()``, ``float(...)``: 3)
#: and ``get_grad_norm`` (``.float()``, ``.norm(2)``, ``.item()``: 3): 6.
DEEPSPEED_030_ZERO1_STEP_HOST_OPS_PER_TENSOR = 6
#: Passes over each parameter's fp16 gradient that DeepSpeed 0.3.0's ZeRO-1 reduction adds on
#: the compute stream, once per step (stage1.py ``reduce_scatter_gradients``, called by
#: engine.py ``allreduce_gradients``, which asserts ``zero_reduce_scatter``): every rank's
#: sub-partitions flattened (``get_flat_sub_partitions``, torch.cat: read and write, 2), and,
#: after ``dist.reduce_scatter``, every sub-partition scaled (``partition.mul_(
#: gradient_predivide_factor / world_size)`` over all of ``single_comm_all_partitions``: 2) =
#: 4; the copy back of the rank's own parameters touches 1/dp of them and is left out. Both
#: collectives take lists of tensors, which PyTorch 1.6's ProcessGroupNCCL (torch/lib/c10d/
#: ProcessGroupNCCL.cpp, the release the runs used) copies through a flat buffer on the NCCL
#: stream: ``reduce_scatter`` copies its inputs in (``flatten_for_scatter_gather``: 2) and the
#: step's parameter ``all_gather`` copies its output out (``outputTensors[i][j].copy_(
#: outputFlattened[i][j])``: 2, over the fp16 parameters, once per step like the reduction):
#: 4 + 2 + 2 = 8.
DEEPSPEED_030_ZERO1_GRAD_COPY_PASSES = 8

#: How ZeRO-1 returns updated parameters after the optimizer step: one ``all_gather`` over the
#: ZeRO group, or ``broadcast``: each rank broadcasts its shard (one broadcast per rank, as
#: InternEvo's hybrid ZeRO and DeepSpeed's early ZeRO-1), exposed after the step.
ZERO1_PARAM_SYNCS = ("all_gather", "broadcast")
#: How ZeRO-1 splits the optimizer's parameters over its group: ``flat`` (equal slices of one
#: flat buffer: Megatron's distributed optimizer, DeepSpeed ZeRO) or ``per_tensor`` (whole
#: tensors dealt largest first to the least-loaded rank, :func:`autopar.cost.zero1.greedy_shares`:
#: InternEvo's hybrid ZeRO), which bounds the largest share below by the largest tensor and
#: leaves ranks beyond the tensor count without a share (and without a broadcast).
ZERO1_PARTITIONS = ("flat", "per_tensor")

#: Sources of the default cost fields (plain PyTorch 2.x training loops).
DEFAULT_COST_SOURCES = {
    "attention_kernels": "torch.nn.functional.scaled_dot_product_attention: the flash backend "
                         "is FlashAttention-2 (torch 2.2+ release notes) on Ampere and Hopper",
    "fusion": "eager PyTorch runs one kernel per op; norms as the model writes them",
    "overlap_dp_grad_reduce": "DDP / FSDP bucketed gradient reduction during backward "
                              "(torch.nn.parallel.DistributedDataParallel, fully_shard)",
    "zero3_gather": "FSDP2 fully_shard per block with implicit forward/backward prefetch",
    "zero3_regather_per_micro_batch": "plain gradient accumulation re-runs forward/backward, "
                                      "and FSDP re-gathers every micro-batch",
    "zero3_pp_root_regather": "under PP every ZeRO-3 module the framework keeps gathered "
                              "across micro-batches, the non-block layers too (torch."
                              "distributed.pipelining stage.py: set_reshard_after_backward(False) "
                              "on the whole stage module)",
    "zero3_pp_reduce_after_flush": "the last micro-batch's backward reduce-scatters the "
                                   "gradients as it runs (torch.distributed.pipelining stage.py: "
                                   "gradient sync enabled for the last backward)",
    "overlap_tp_comm": "DTensor TP collectives are synchronous on the compute stream",
    "overlap_pp_p2p": "torch.distributed.pipelining waits on its batched isend/irecv before "
                      "the next stage op, under every schedule",
    "grad_reduce_bytes": "the compute dtype unless a reduce dtype is set (CostParams.grad_bytes)",
    "grad_reduce_fp16_in_fp16": "the reduce dtype, when set, holds under fp16 training too",
    "step_fixed_s": "no sourced fixed per-step cost",
    "zero1_param_sync": "ZeroRedundancyOptimizer / FSDP: parameters return by all-gather",
    "zero1_group_size": "ZeRO shards over the whole data-parallel group",
    "zero1_grad_all_reduce": "ZeRO-1 reduce-scatters gradients (ZeroRedundancyOptimizer after "
                             "DDP all-reduce is the exception, not costed)",
    "cp_attention": "context parallelism runs the framework's fused attention kernel per "
                    "chunk (ring attention with flash kernels, load-balanced split)",
    "optimizer_step_bytes": "torch.optim.AdamW default foreach implementation and "
                            "clip_grad_norm_ (TORCH_OPTIMIZER_STEP_BYTES)",
    "eager_parts": "none beyond what the fusion level implies",
    "zero1_partition": "ZeRO-1 costed as equal slices of the parameters (flat buffer)",
    "sync_grad_bucket_elements": "DDP / FSDP keep several gradient buckets in flight without "
                                 "device-wide syncs: the reduction overlaps backward as a whole",
    "zero_grad_copy_passes": "FSDP2 (fully_shard) keeps each parameter a tensor of its own: "
                             "autograd writes each gradient in place, no flat-gradient concat "
                             "(its own copies are fsdp2_copies)",
    "zero2_grad_all_reduce": "ZeRO-2 reduce-scatters each gradient bucket (FSDP2 / FSDP "
                             "reduce_scatter_tensor)",
    "zero2_reduce_per_step": "ZeRO-2 reduce-scatters every micro-batch's gradients (sharded "
                             "gradients cannot accumulate locally: DeepSpeed stage 2, FSDP "
                             "without no_sync)",
    "zero12_grad_copy_passes": "no ZeRO-1/2 bucket copies on the compute stream (FSDP2 copies "
                               "are fsdp2_copies; DDP buckets are autograd's own views)",
    "zero0_grad_copy_passes": "no copies charged beside the ZeRO-0 all-reduce (none sourced "
                              "for this stack)",
    "zero0_step_bytes": "the step as optimizer_step_bytes counts it (no ZeRO-0 wrapper passes "
                        "sourced for this stack)",
    "zero0_step_host_ops_per_tensor": "no per-tensor host-synchronised check at the step "
                                      "sourced for this stack",
    "zero3_persistent_elements": "every parameter sharded and gathered under ZeRO-3 (FSDP2 "
                                 "fully_shard shards every parameter of the module)",
    "zero3_reduce_bucket_elements": "ZeRO-3 gradients reduced as they are gathered (FSDP2: "
                                    "one reduce-scatter per fully_shard unit)",
    "zero1_step_bytes": "the ZeRO-1 step as optimizer_step_bytes counts it (no whole-gradient "
                        "check sourced for this stack)",
    "zero1_step_host_ops_per_tensor": "no per-tensor host-synchronised check at the ZeRO-1 "
                                      "step sourced for this stack",
    "fsdp2_copies": "torch 2.13 torch/distributed/fsdp/_fully_shard: _fsdp_param_group.py "
                    "wait_for_unshard calls _fsdp_collectives.py foreach_all_gather_copy_out "
                    "(split_with_sizes_copy) and post_backward calls foreach_reduce, whose "
                    "foreach_reduce_scatter_copy_in (chunk_cat) runs before "
                    "reduce_scatter_stream.wait_stream(current_stream): both on the compute "
                    "stream",
    "host_issue": "no stock stack captures its training step in CUDA graphs by default "
                  "(torch.compile's default mode, torchtitan, Megatron-LM without "
                  "--enable-cuda-graph): the host issues every kernel",
    "host_op_s_published": "no published step time of this stack implies a host time per "
                           "kernel beyond the measured dispatch rate (CostParams.host_op_s): 0",
    "moe_dispatch_sync_ops": "no blocking host read in an MoE dispatcher is priced unless a "
                             "framework's dispatcher is read to make one (autopar.frameworks."
                             "stacks.megatron.ALLTOALL_SEQ_2024)",
    "moe_probs_alltoall": "no all-to-all of the router's probabilities beside the tokens' "
                          "unless a framework's dispatcher runs one (autopar.frameworks."
                          "stacks.megatron.MEGATRON_ALLTOALL_DISPATCH)",
    "ulysses_kv_repeat": "K and V cross the Ulysses all-to-all at their own (KV) head count, "
                         "so tp * cp must divide the KV heads as well as the query heads "
                         "(Transformer Engine context_parallel.py AttnFuncWithCPAndQKVOA2A."
                         "forward, 9c61cd7e: assert q.shape[-2] % cp_size == 0 and "
                         "k.shape[-2] % cp_size == 0)",
    "moe_capacity_rule": "each expert runs its routed rows (dropless) or min(rows, capacity), "
                         "padded only when asked, as Megatron-Core's get_capacity and "
                         "torchtitan's dropless MoE do, unless a framework's MoE layer is read "
                         "to size its buffers otherwise (autopar.frameworks.stacks.deepspeed)",
    "moe_sac_redispatch": "op-level selective recomputation keeps the all-to-all's outputs "
                          "(torchtitan's save list since 114151ad4, 2026-03-23, PR #2357; "
                          "DeepSeek-V3's and Llama 4's since c4e229115, 2025-09-06): no "
                          "dispatch runs again in backward",
    "moe_counts_gather": "no all-gather of the per-expert token counts in an MoE dispatch "
                         "unless a framework's dispatcher is read to run one (autopar."
                         "frameworks.stacks.megatron.MEGATRON_ALLTOALL_DISPATCH)",
    "moe_tp_token_alltoall": "no TP all-to-all of the tokens around an MoE layer unless a "
                             "framework's dispatcher runs one (autopar.frameworks.stacks."
                             "megatron.ALLTOALL_SEQ_2024)",
    "moe_dispatch_dtype": "the dispatch all-to-all carries the activation dtype unless a "
                          "framework says otherwise (autopar.frameworks.choices."
                          "ACTIVATION_DTYPE_DISPATCH gives the stacks' code)",
    "tp_mlp_reduce_per_linear": "Megatron-Core fuses the gated MLP's gate and up projections "
                                "into one linear_fc1, and DTensor TP reduces the input gradient "
                                "of a shared input once (the input's redistribution)",
}
