"""``megatron``: Megatron-LM main at d98e8a64ddf3 (2026-08-22): ``megatron/training/arguments.py``,
``megatron/core/transformer/transformer_config.py``; and ``megatron-2023``, the same code path
as released before 4eeff55d1f (2023-10-12), when pipeline P2P overlap was off by default."""

from __future__ import annotations

from dataclasses import replace

from ...config import CP_MODES, RECOMPUTE_MODULES
from ..choices import (ACTIVATION_DTYPE_DISPATCH, FSDP2, FUSED_CP, AttentionKernels, Choices,
                       ExpertDispatch, Fusion, HostIssue, OptimizerStep, PipelineComm,
                       TensorParallelComm, compose, with_choice)
from ..memory import MEGATRON_MEMORY
from ..seqrule import MEGATRON_RULE
from ..vocabulary import DEFAULT_COST_SOURCES, MIXED_FUSED_OPTIMIZER_STEP_BYTES

#: The distributed optimizer (ZeRO-1) and DDP with Megatron-LM's defaults: reduction after
#: backward, in fp32 under bf16 (fp16 under fp16); ZeRO-3 is torch FSDP2 (--use-torch-fsdp2).
DISTRIBUTED_OPTIMIZER = replace(
    FSDP2, name="megatron-distributed-optimizer", overlap_dp_grad_reduce=False,
    grad_reduce_bytes=4, grad_reduce_fp16_in_fp16=True,
    summary="Megatron-Core DDP / distributed optimizer, --overlap-grad-reduce off, gradients "
            "reduced in fp32 under bf16; ZeRO-3 through --use-torch-fsdp2",
    sources={**FSDP2.sources,
             "overlap_dp_grad_reduce": "arguments.py --overlap-grad-reduce is off by "
                                       "default: gradients are reduced after backward",
             "grad_reduce_bytes": "arguments.py: under --bf16 accumulate_allreduce_grads_in_"
                                  "fp32 is set (d98e8a64 lines 1209-1216, unless --grad-reduce-"
                                  "in-bf16; ba773259 (2024-04) lines 282-288, 'accumulate and "
                                  "all-reduce gradients in fp32 for bfloat16 data type'), and "
                                  "core/distributed/distributed_data_parallel.py reduces gradient "
                                  "buffers of torch.float then (ba773259 line 105): 4",
             "grad_reduce_fp16_in_fp16": "arguments.py sets accumulate_allreduce_grads_in_fp32 "
                                         "for --bf16 only (--accumulate-allreduce-grads-in-fp32 "
                                         "default off): under --fp16 the buffers, and their "
                                         "reduction, are fp16"})

#: Transformer Engine / apex FusedAdam behind fp32 main parameters.
MIXED_FUSED_ADAM = OptimizerStep(
    name="megatron-fused-adam", summary="TE / apex FusedAdam on fp32 main copies, "
                                        "multi-tensor clipping",
    optimizer_step_bytes=MIXED_FUSED_OPTIMIZER_STEP_BYTES, step_fixed_s=0.0, sources={
        "optimizer_step_bytes": "megatron/core/optimizer/__init__.py: Transformer "
                                "Engine or apex FusedAdam; clip_grads.py "
                                "multi_tensor_l2norm + multi_tensor_scale (clip_grad "
                                "1.0); distrib_optimizer.py _copy_model_grads_to_"
                                "main_grads (.float()) and _copy_main_params_to_model_"
                                "params: MIXED_FUSED_OPTIMIZER_STEP_BYTES",
        "step_fixed_s": DEFAULT_COST_SOURCES["step_fixed_s"]})

TE_CUDNN = AttentionKernels(
    name="te-cudnn", summary="Transformer Engine DotProductAttention, cuDNN fused attention",
    attention_kernels={"*": "cudnn"}, sources={
        "attention_kernels": "arguments.py --attention-backend auto: Transformer "
                             "Engine's DotProductAttention, cuDNN fused attention "
                             "(FlashAttention-2-class on Ampere)"})

TE_FUSED = Fusion(
    name="te-apex-fused", summary="hand-fused kernels (bias-GeLU, bias-dropout-add, softmax, "
                                  "norms)",
    fusion="fused", eager_parts=(), sources={
        "fusion": "arguments.py --bias-gelu-fusion, --bias-dropout-fusion, "
                  "--masked-softmax-fusion default on; Transformer Engine / Apex "
                  "fused LayerNorm/RMSNorm",
        "eager_parts": DEFAULT_COST_SOURCES["eager_parts"]})

MEGATRON_TP = TensorParallelComm(
    name="megatron-tp", summary="Megatron-Core TP, --tp-comm-overlap off, fused gate/up fc1",
    overlap_tp_comm=False, tp_mlp_reduce_per_linear=False, sources={
        "overlap_tp_comm": "arguments.py --tp-comm-overlap is off by default",
        "tp_mlp_reduce_per_linear": DEFAULT_COST_SOURCES["tp_mlp_reduce_per_linear"]})

#: P2P overlap as Megatron-LM runs it since 4eeff55d1f (2023-10-12).
OVERLAP_P2P = PipelineComm(
    name="megatron-overlap-p2p", summary="overlap_p2p_comm on under the interleaved schedule",
    overlap_pp_p2p=("interleaved-1f1b",), sources={
        "overlap_pp_p2p": "arguments.py --no-overlap-p2p-communication: "
                          "overlap_p2p_comm is on by default (since 4eeff55d1f, "
                          "2023-10-12), and validate_args turns it off unless the "
                          "schedule is interleaved"})

#: P2P as Megatron-LM ran it before 4eeff55d1f.
P2P_2023 = PipelineComm(
    name="megatron-p2p-2023", summary="no P2P overlap unless --overlap-p2p-communication",
    overlap_pp_p2p=(), sources={
        "overlap_pp_p2p": "Megatron-LM before 4eeff55d1f (2023-10-12, 'Make "
                          "overlap_p2p_comm the default') overlapped pipeline sends only under "
                          "--overlap-p2p-communication, off by default"})

_TD17 = "Megatron-Core core_v0.17.1 megatron/core/transformer/moe/token_dispatcher.py "
_COUNTS_GATHER = (
    _TD17 + "MoEAlltoAllTokenDispatcher.preprocess (dropless, ep or expert-TP > 1): "
    "num_local_tokens_per_expert = routing_map.sum(dim=0).long(), then "
    "gather_from_sequence_parallel_region(num_local_tokens_per_expert, group=self.tp_ep_group) "
    "for the output splits: an all-gather of experts x int64 per rank over the expert-TP x EP "
    "group, issued on the compute stream before the permutation (the same gather at ba773259 "
    "over EP, where ALLTOALL_SEQ_2024 prices it with the blocking reads)")
_PROBS_A2A = (
    _TD17 + "MoEAlltoAllTokenDispatcher.token_dispatch: after all_to_all(self.ep_group, "
    "permutated_local_input_tokens, ...) a second all_to_all(self.ep_group, permuted_probs, "
    "self.output_splits, self.input_splits) of the routed rows' probabilities (one element "
    "per row); tensor_parallel/mappings.py _AllToAll.backward sends the gradient back the "
    "reverse way. Added by 2659630721 (2025-04-09, 'perf(MoE): Memory efficient token "
    "permutation', first tagged core_v0.13.0rc0), which moved the probabilities into the "
    "experts' activation (before it, token_unpermutation weighted the output locally); the "
    "expert-TP all-gather of the probabilities it also adds under etp > 1 is not priced")

#: Megatron-Core's all-to-all dispatcher since core 0.13 (2659630721): tokens in the activation
#: dtype, the router's probabilities in an all-to-all of their own beside them, and the
#: per-expert counts all-gathered over the expert-TP x EP group before each dispatch.
MEGATRON_ALLTOALL_DISPATCH = ExpertDispatch(
    name="megatron-alltoall-0.13",
    summary="Megatron-Core's all-to-all dispatcher since core 0.13: the tokens' all-to-all, "
            "the probabilities' all-to-all and the counts' all-gather per MoE layer",
    moe_dispatch_dtype="activation", moe_probs_alltoall=True, moe_counts_gather=True,
    sources={**ACTIVATION_DTYPE_DISPATCH.sources, "moe_probs_alltoall": _PROBS_A2A,
             "moe_counts_gather": _COUNTS_GATHER})

#: The same dispatcher before 2659630721: no probabilities' all-to-all.
MEGATRON_ALLTOALL_DISPATCH_BEFORE_0_13 = replace(
    MEGATRON_ALLTOALL_DISPATCH, name="megatron-alltoall-before-0.13",
    summary="Megatron-Core's all-to-all dispatcher from 2024-09 to core 0.13: the tokens' "
            "all-to-all and the counts' all-gather per MoE layer",
    moe_probs_alltoall=False,
    sources={**MEGATRON_ALLTOALL_DISPATCH.sources, "moe_probs_alltoall": (
        "Megatron-Core before 2659630721 (read at its parent): token_permutation all-to-alls "
        "the tokens only and token_unpermutation weights the experts' output by "
        "self.local_probs on the rank that computed it: no probabilities' all-to-all")})

#: Megatron-Core with Transformer Engine issues every kernel from the host, through its own and
#: Transformer Engine's module code: a per-kernel host rate fitted to its published runs is priced
#: (docs/cost-model.md, Host issue time; benchmarks/host_rate.py).
TE_HOST = HostIssue(
    name="te-per-kernel-launch",
    summary="the host issues every kernel (no CUDA graphs) through Megatron-Core's and "
            "Transformer Engine's module code: ~115 us of host time per counted kernel",
    host_issue="per_kernel", host_op_s_published=115e-6, sources={
        "host_issue": DEFAULT_COST_SOURCES["host_issue"],
        "host_op_s_published": (
            "the per-kernel host rate (0-300 us, 5 us steps) with the least mean over 17 public "
            "sources of Megatron-Core/NeMo runs of each source's step-time MAPE, every measured "
            "run of the development split priced (benchmarks/data/host/stack_host_rates.json, "
            "python -m benchmarks.host_rate): fitted so, not measured. A total per counted "
            "kernel (module code, the dispatcher's host reads, launches), not a measurement of "
            "host time")})

CHOICES = Choices(sharded_dp=DISTRIBUTED_OPTIMIZER, optimizer_step=MIXED_FUSED_ADAM,
                  attention=TE_CUDNN, fusion=TE_FUSED, tensor_parallel=MEGATRON_TP,
                  pipeline=OVERLAP_P2P, context_parallel=FUSED_CP,
                  expert_dispatch=MEGATRON_ALLTOALL_DISPATCH, host=TE_HOST)

PROFILE = compose(
    CHOICES,
    name="megatron", version="Megatron-LM main d98e8a64ddf3 (2026-08-22)",
    zero_stages=(0, 1, 3), zero_stages_with_tp=(0, 1, 3), zero_stages_with_pp=(0, 1),
    zero_stages_with_ep=(0, 1), schedules=("1f1b", "interleaved-1f1b"),
    interleaved_chunks="any", stage_cuts="any", cp_modes=CP_MODES,
    recompute_modes=("none", "selective", "full"), per_block_recompute=False,
    recompute_first_n=True, vp_group_tunable=True, recompute_modules=RECOMPUTE_MODULES,
    sequence_parallel=(True, False), expert_parallel=True, seq_rule=MEGATRON_RULE,
    moe_sequence_parallel=(True,),
    expert_tensor_parallel="any",
    dispatchers=("alltoall", "deepep", "allgather"), kv_heads_below_tp=True,
    memory=MEGATRON_MEMORY,
    placements=(("tp", "cp", "dp", "pp"), ("tp", "cp", "pp", "dp")),
    sources={
        "placements": "megatron/training/arguments.py --use-tp-pp-dp-mapping ('changes the "
                      "order from tp-cp-ep-dp-pp to tp-cp-ep-pp-dp'; "
                      "core/parallel_state.py initialize_model_parallel(order=...)): those two "
                      "orders only, tp and cp innermost",
        "dispatchers": "core/transformer/transformer_config.py moe_token_dispatcher_type "
                       "'allgather' | 'alltoall' | 'flex' and moe_flex_dispatcher_backend "
                       "'deepep' (default) | 'hybridep' | 'ncclep'; 'flex' + 'deepep' runs "
                       "DeepEP over the tp x ep group (moe/token_dispatcher.py "
                       "MoEFlexTokenDispatcher, moe/fused_a2a.py). autopar prices alltoall, "
                       "deepep and allgather (the default: moe_token_dispatcher_type = "
                       "'allgather', megatron-core 0.16.1 transformer_config.py line 675, and "
                       "since the dispatcher's first commit 20383240c5, 2024-01-20; "
                       "MoEAllGatherTokenDispatcher gathers over the expert-TP x EP group). "
                       "hybridep and ncclep are not priced",
        "kv_heads_below_tp": "core/transformer/attention.py (since f7dfb99795, 2025-12-06, "
                             "'Support TP greater than num_kv_heads'): 'if "
                             "self.config.num_query_groups < world_size' each rank keeps one "
                             "query group, all-gathers the QKV projection output over TP "
                             "(all_gather_last_dim_from_tensor_parallel_region) and slices its "
                             "group's K/V and its own query heads (get_query_key_value_tensors)",
        "per_block_reshard": "arguments.py --use-torch-fsdp2: one fully_shard policy for the "
                             "model, no per-layer flag",
        "zero_stages": "arguments.py --use-distributed-optimizer (ZeRO-1; gradients are "
                       "reduce-scattered into a full buffer, so no ZeRO-2), --use-torch-fsdp2 "
                       "(ZeRO-3)",
        "zero_stages_with_tp": "arguments.py: --use-torch-fsdp2 has no TP assertion",
        "zero_stages_with_pp": "arguments.py: '--use-torch-fsdp2 is not supported with "
                               "pipeline parallelism'",
        "zero_stages_with_ep": "arguments.py: '--use-torch-fsdp2 is not supported with expert "
                               "parallelism'",
        "schedules": "megatron/core/pipeline_parallel/schedules.py: "
                     "forward_backward_pipelining_without_interleaving (1F1B) and "
                     "_with_interleaving; no GPipe, no zero-bubble or V-shaped schedule "
                     "(--delay-wgrad-compute defers weight gradients inside 1F1B only)",
        "overlaps_ep_comm": "not modelled: combined_1f1b.py overlaps MoE all-to-all inside "
                            "interleaved 1F1B only under --overlap-moe-expert-parallel-comm "
                            "(off by default)",
        "interleaved_chunks": "arguments.py --pipeline-model-parallel-layout (any layers per "
                              "chunk; megatron/core/transformer/"
                              "pipeline_parallel_layer_layout.py)",
        "stage_cuts": "arguments.py --pipeline-model-parallel-layout (any cut)",
        "cp_modes": "arguments.py --cp-comm-type p2p | a2a | all_gather | a2a+p2p",
        "recompute_modes": "arguments.py --recompute-granularity full | selective",
        "recompute_modules": "arguments.py --recompute-modules; megatron/core/transformer/"
                             "transformer_config.py recompute_modules (line 560; checked in "
                             "__post_init__, line 1940: default ['core_attn'])",
        "per_block_recompute": "arguments.py --recompute-method uniform | block (the first N "
                               "layers of every stage), no per-layer list",
        "vp_group_tunable": ("megatron/core/model_parallel_config.py "
                             "microbatch_group_size_per_vp_stage (default pp, __post_init__), "
                             "set by --microbatch-group-size-per-virtual-pipeline-stage; core/"
                             "pipeline_parallel/schedules.py get_schedule_table groups the "
                             "micro-batches by it and forward_backward_pipelining_with_"
                             "interleaving checks pp <= N <= M and M % N 0 or >= pp (added "
                             "4295be1a6c, 2024-11-01)"),
        "zero3_split_backward": "no split-backward schedule (schedules.py: 1F1B, interleaved)",
        "recompute_first_n": "arguments.py --recompute-granularity full --recompute-method "
                             "block --recompute-num-layers N: core/transformer/"
                             "transformer_block.py _checkpointed_forward checkpoints layers "
                             "0..N-1 of each TransformerBlock (one per pipeline chunk) and runs "
                             "the rest without recompute",
        "sequence_parallel": "arguments.py --sequence-parallel (optional)",
        "moe_sequence_parallel": "megatron/core/transformer/moe/moe_layer.py MoELayer.forward "
                                 "raises in training when the TP group has > 1 rank and "
                                 "sequence_parallel is off (read at 001199898c4b)",
        "experts_tp_sharded": "arguments.py --expert-tensor-parallel-size (default: "
                              "--tensor-model-parallel-size): expert GEMMs split over etp ranks",
        "expert_parallel": "arguments.py --expert-model-parallel-size",
        "expert_tensor_parallel": "arguments.py --expert-tensor-parallel-size (default tp); "
                                  "core/parallel_state.py initialize_model_parallel: expert "
                                  "grid etp x ep x edp x pp, world_size % (etp * ep * pp) == 0 "
                                  "(MoE parallel folding, transformer/moe/README.md)",
        "stage_split": "arguments.py: no layout flag builds layers % pp == 0 stages "
                       "(autopar.frameworks.layersplit); an uneven cut is given explicitly",
    })

#: The first Megatron-Core release that folds the router's probabilities into the experts'
#: activation (2659630721, 2025-04-09, "perf(MoE): Memory efficient token permutation", first
#: tagged core_v0.13.0rc0 on 2025-06-27): runs dated before it kept the expert output in the
#: combine (:func:`with_moe_probs_at_combine`).
MOE_PROBS_IN_ACTIVATION_SINCE = "2025-06-27"

#: Megatron's memory conventions before :data:`MOE_PROBS_IN_ACTIVATION_SINCE`.
MEMORY_BEFORE_CORE_0_13 = replace(MEGATRON_MEMORY, moe_combine_saved=1, sources={
    **MEGATRON_MEMORY.sources,
    "moe_combine_saved": "Megatron-Core before 2659630721 (read at its parent, and at "
                         "core_v0.12.0): moe_utils.py unpermute(..., probs) runs "
                         "'permuted_tokens = permuted_tokens * permuted_probs.unsqueeze(-1)' on "
                         "the experts' output, which the multiply keeps for backward (at "
                         "ba773259, 2024-04: 'unpermuted_tokens * probs.unsqueeze(-1)' on the "
                         "index-copied [tokens, topk, hidden] output, the same size): 1"})


#: The first Megatron-LM release whose all-to-all dispatcher keeps each TP rank's sequence
#: shard through the permutation (a11077467a, 2024-08-22, "MoE alltoall token dispatcher
#: optimizations", first tagged 24.09-alpha.rc0 on 2024-09-10): runs dated before it moved the
#: tokens between sequence and hidden sharding with TP all-to-alls (:data:`ALLTOALL_SEQ_2024`).
ALLTOALL_TOKEN_LEVEL_SINCE = "2024-09-10"

_BA77 = "Megatron-LM ba773259 (2024-04-04) megatron/core/transformer/moe/"

#: Megatron-Core's all-to-all dispatcher as merged in 9208adbdc7 (2024-03-27) until
#: a11077467a: under TP > 1, all_to_all_sp2hp before the permutation and all_to_all_hp2sp
#: after the combine, and the router's logits gathered over TP.
ALLTOALL_SEQ_2024 = ExpertDispatch(
    name="megatron-alltoall-seq-2024",
    summary="Megatron-Core's 2024 all-to-all dispatcher: TP all-to-alls sp2hp / hp2sp around "
            "the MoE layer and the router logits gathered over TP",
    moe_dispatch_dtype="activation", moe_tp_token_alltoall=True, moe_dispatch_sync_ops=9,
    sources={"moe_dispatch_dtype": ACTIVATION_DTYPE_DISPATCH.sources["moe_dispatch_dtype"],
             "moe_capacity_rule": ACTIVATION_DTYPE_DISPATCH.sources["moe_capacity_rule"],
             "moe_probs_alltoall": MEGATRON_ALLTOALL_DISPATCH_BEFORE_0_13.sources[
                 "moe_probs_alltoall"],
             "moe_sac_redispatch": ACTIVATION_DTYPE_DISPATCH.sources["moe_sac_redispatch"],
             "moe_counts_gather": (
                 _BA77 + "token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess line 337: "
                 "the counts' all-gather over EP runs between the two blocking reads, priced "
                 "with them (moe_dispatch_sync_ops), so not again here"),
             "moe_tp_token_alltoall": (
                 _BA77 + "token_dispatcher.py MoEAlltoAllTokenDispatcher.token_permutation "
                 "lines 401-404 ('hidden_states: [S*B/TP, H] -> [S*B, H/TP]': "
                 "tensor_parallel.all_to_all_sp2hp when the TP world size > 1) and "
                 "token_unpermutation lines 482-485 (all_to_all_hp2sp, '[S*B, H/TP] -> "
                 "[S*B/TP, H]'); router.py TopKRouter.routing lines 235-240 "
                 "(gather_from_sequence_parallel_region(logits) when tensor_model_parallel_size "
                 "> 1 and the dispatcher is alltoall). The all-gather / reduce-scatter of the "
                 "routed tokens over TP after / before the experts (lines 426-431, 452-457) "
                 "move what the later dispatcher's expert-TP gather moves, priced as before"),
             "moe_dispatch_sync_ops": (
                 _BA77 + "token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess under ep > "
                 "1: input_splits read with a blocking .to(torch.device('cpu')).numpy() (lines "
                 "331-336), then the counts all-gathered over EP (_gather_along_first_dim_"
                 "expert_parallel, line 337), indexed (340) and summed and read back blocking "
                 "again (output_splits, 343-345); after that the sum and non-blocking copy of "
                 "the local counts (346-348) and token_permutation's argsort, floor division "
                 "and index_select (moe_utils.py permute, lines 119-121) before the EP "
                 "all_to_all_single (token_dispatcher.py 413): kernel-launching ops 3 between "
                 "the two reads (all-gather, index, sum) + 1 (the second read) + 5 after it = "
                 "9, views and allocations not counted (a lower bound); the all-gather's own "
                 "seconds run between the reads on an idle stream")})


def with_alltoall_seq_2024(profile):
    """``profile`` (the Megatron-LM or NeMo :class:`~autopar.frameworks.FrameworkProfile`) with
    the all-to-all dispatcher Megatron-Core ran before :data:`ALLTOALL_TOKEN_LEVEL_SINCE`
    (:data:`ALLTOALL_SEQ_2024`). A version option (time only), not the profile's default."""
    return with_choice(profile, ALLTOALL_SEQ_2024)


def with_moe_probs_at_combine(profile):
    """``profile`` (the Megatron-LM or NeMo :class:`~autopar.frameworks.FrameworkProfile`) as
    Megatron-Core ran MoE before :data:`MOE_PROBS_IN_ACTIVATION_SINCE`: the combine weights the
    experts' output by the router's probabilities and keeps it
    (:data:`MEMORY_BEFORE_CORE_0_13`), and its all-to-all dispatcher sends no probabilities
    (:data:`MEGATRON_ALLTOALL_DISPATCH_BEFORE_0_13`; the same commit added their all-to-all).
    A version option, not the profile's default."""
    profile = replace(profile, memory=replace(profile.memory, moe_combine_saved=1, sources={
        **profile.memory.sources,
        "moe_combine_saved": MEMORY_BEFORE_CORE_0_13.sources["moe_combine_saved"]}))
    if not profile.moe_probs_alltoall:
        return profile
    return profile.with_costs({"moe_probs_alltoall": MEGATRON_ALLTOALL_DISPATCH_BEFORE_0_13
                               .sources["moe_probs_alltoall"]}, moe_probs_alltoall=False)


#: (Megatron-LM before 2023-10 had no expert-parallel dispatcher of Megatron-Core's: the stock
#: activation-dtype dispatch, no counts' gather or probabilities' all-to-all.)
# before Transformer Engine (apex fused kernels): no published per-kernel figure
CHOICES_2023 = replace(CHOICES, pipeline=P2P_2023, expert_dispatch=ACTIVATION_DTYPE_DISPATCH,
                       host=None)

#: What Megatron-LM could run before 4eeff55d1f, where it differs from main: read from that
#: commit's tree (``megatron/arguments.py``, ``megatron/model/transformer.py``). A search under
#: this profile proposes only plans that release could have run.
CAPABILITIES_2023 = dict(
    zero_stages=(0, 1), zero_stages_with_tp=(0, 1), zero_stages_with_pp=(0, 1),
    zero_stages_with_ep=(0, 1), cp_modes=(), interleaved_chunks="equal", stage_cuts="balanced",
    expert_tensor_parallel="tp", dispatchers=("alltoall",), kv_heads_below_tp=False,
    recompute_modules=(), vp_group_tunable=False)
SOURCES_2023 = {
    "dispatchers": "4eeff55d1f: no flex dispatcher (DeepEP was published in 2025-02)",
    "kv_heads_below_tp": "4eeff55d1f megatron/model/transformer.py: "
                         "num_query_groups_per_partition = divide(num_query_groups, world_size) "
                         "(tp divides the query groups); tp > groups arrived in f7dfb99795",
    "recompute_modules": "4eeff55d1f megatron/arguments.py: --recompute-granularity only, no "
                         "--recompute-modules (selective recomputes the attention core)",
    "zero_stages": "4eeff55d1f megatron/arguments.py: --use-distributed-optimizer (ZeRO-1) "
                   "only; --use-torch-fsdp2 arrived in e1993fa6f7 (2024-11-13)",
    "cp_modes": "4eeff55d1f megatron/arguments.py has no --context-parallel-size (context "
                "parallelism merged after it; --cp-comm-type in 645c329d07, 2024-11-15)",
    "interleaved_chunks": "4eeff55d1f megatron/arguments.py --num-layers-per-virtual-pipeline-"
                          "stage: every chunk the same number of layers (validate_args asserts "
                          "divisibility)",
    "stage_cuts": "4eeff55d1f megatron/model/transformer.py _get_num_layers: 'num_layers must be "
                  "divisible by transformer_pipeline_model_parallel_size'; no layout flag",
    "expert_tensor_parallel": "4eeff55d1f megatron/arguments.py: no "
                              "--expert-tensor-parallel-size; experts split over the TP group",
    "vp_group_tunable": "the micro-batch group flag came with 4295be1a6c (2024-11-01), after "
                        "4eeff55d1f: interleaved 1F1B groups the micro-batches by pp",
}

#: Megatron-LM as released through 2023 (before 4eeff55d1f): main's cost path without P2P
#: overlap, and only what that release could run (:data:`CAPABILITIES_2023`).
PROFILE_2023 = compose(
    CHOICES_2023,
    **{"seq_rule": PROFILE.seq_rule, "memory": MEMORY_BEFORE_CORE_0_13,
       **{k: getattr(PROFILE, k) for k in PROFILE.capability_names()},
       **CAPABILITIES_2023, "sources": {**PROFILE.sources, **SOURCES_2023}},
    name="megatron-2023", version="Megatron-LM before 4eeff55d1f (2023-10-12)")


_ODO = ("alibaba/Megatron-LLaMA megatron/optimizer/overlapped_dist_optimizer.py (25306de, "
        "2023-10-09): ")

#: Megatron-LLaMA's OverlappedDistributedOptimizer (``--overlapped-distributed-optimizer``,
#: alibaba's 2023 fork of Megatron-LM): parameters replicated, gradients and optimizer states
#: sharded over the data-parallel group (ZeRO-2 in autopar's plan terms). Each parameter's
#: gradient hook copies the gradient into a bucket on a side stream and reduce-scatters the
#: bucket as soon as it is full, in every micro-batch's backward: with several micro-batches a
#: step moves the gradients over the network that many times. The parameter all-gather after
#: the optimizer step is waited for in forward pre-hooks (from 25306de; before it the gather
#: was not overlapped, about 1-2% of the Megatron-LLaMA reports' steps, not priced).
OVERLAPPED_DISTRIBUTED_OPTIMIZER = replace(
    DISTRIBUTED_OPTIMIZER, name="megatron-llama-overlapped-distributed-optimizer",
    overlap_dp_grad_reduce=True, grad_reduce_bytes=4, grad_reduce_fp16_in_fp16=False,
    zero2_grad_all_reduce=False, zero2_reduce_per_step=False,
    summary="Megatron-LLaMA's OverlappedDistributedOptimizer: fp32 gradient buckets "
            "reduce-scattered on a side stream in every micro-batch's backward",
    sources={**DISTRIBUTED_OPTIMIZER.sources,
             "overlap_dp_grad_reduce": _ODO + "_grad_hook runs _collect_grad under "
             "torch.cuda.stream(self._reduction_stream); a full bucket is reduce-scattered "
             "there (Bucket.reduce_scatter_grad), beside the backward on the default stream",
             "grad_reduce_bytes": _ODO + "BucketAssignment: grad dtype torch.float32 if "
             "args.accumulate_allreduce_grads_in_fp32 (set under --bf16 by arguments.py): 4",
             "grad_reduce_fp16_in_fp16": _ODO + "the bucket dtype follows "
             "accumulate_allreduce_grads_in_fp32 only",
             "zero2_grad_all_reduce": _ODO + "dist.reduce_scatter_tensor per bucket",
             "zero2_reduce_per_step": _ODO + "the gradient hooks fire in every backward; "
             "the reduced shard is accumulated (accumulate_reduced_grad), the unsharded "
             "gradient is dropped (param.grad = None after the copy)"})


def with_overlapped_distributed_optimizer(profile):
    """``profile`` (``megatron-2023``) running Megatron-LLaMA's OverlappedDistributedOptimizer
    (:data:`OVERLAPPED_DISTRIBUTED_OPTIMIZER`): ZeRO-2 allowed, with TP (the fork's LLaMA
    scripts), not with PP (the fork took it to pipelines in its PR #38 of 2023-10-07, after
    the reports this was built for; not read) or EP; its gradients reduce-scattered in fp32
    in every micro-batch. A capability change as well as a cost edit, so not a stack option
    (a plan file cannot record it): from Python, ``CostModel(..., framework=profile)``.

    Raises:
        InvalidTrainingConfig: an unknown framework name.
    """
    from . import get_profile
    p = with_choice(get_profile(profile), OVERLAPPED_DISTRIBUTED_OPTIMIZER)
    src = (_ODO + "the optimizer shards gradients and states over the data-parallel group "
           "(ZeRO-2); the fork's LLaMA scripts run it with TP and SP, PP 1")
    return replace(p, zero_stages=tuple(sorted({*p.zero_stages, 2})),
                   zero_stages_with_tp=tuple(sorted({*p.zero_stages_with_tp, 2})),
                   sources={**p.sources, "zero_stages": src, "zero_stages_with_tp": src})
