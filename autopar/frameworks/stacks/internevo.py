"""``internevo`` and ``internevo-fsdp``: InternEvo (InternLM's training framework, c18bec9 / tag
v0.2.1dev20231121). ``internevo`` runs its hybrid ZeRO optimizer (HybridZeroOptimizer, ZeRO-1,
the default); ``internevo-fsdp`` its FSDP mode (``parallel.zero1.fsdp=True``,
FSDPadaptOptimizer, ZeRO-3), which lays memory out differently. Both share the cost choices
below; pipeline stages are cut as InternEvo's partition_uniform (``stage_split="last"``); ZeRO
within fewer ranks (``parallel.zero1=N``) is :func:`autopar.frameworks.stacks.shard_within`.

Capabilities (and FSDP mode's copies, ``fsdp2_copies``, and ``zero3_regather_per_micro_batch``)
are the torch profile's, not read from InternEvo.
"""

from __future__ import annotations

from dataclasses import replace

from ..choices import (AttentionKernels, Choices, Fusion, OptimizerStep, TensorParallelComm,
                       compose)
from ..memory import (GRAPH_MOE_SOURCES, NO_DEEPSPEED_ZERO3_SOURCES, WHOLE_LOSS_SOURCES,
                      MemoryConventions)
from ..vocabulary import DEFAULT_COST_SOURCES
from . import pytorch

AT = "InternEvo at c18bec9 (the table's commit)"

HYBRID_ZERO = replace(
    pytorch.SHARDED_DP, name="internevo-hybrid-zero",
    summary="HybridZeroOptimizer: bucketed all-reduce overlapping backward one bucket at a "
            "time, per-tensor ZeRO-1 partition, parameters back by broadcast",
    overlap_dp_grad_reduce=True, sync_grad_bucket_elements=512 * 1024 * 1024,
    zero1_param_sync="broadcast", zero1_partition="per_tensor", zero1_grad_all_reduce=True,
    group_option=f"{AT} parallel.zero1=N (ZeRO within groups of N data-parallel ranks)",
    sources={
        **pytorch.SHARDED_DP.sources,
        "overlap_dp_grad_reduce":
            f"{AT} configs/7B_sft.py zero_overlap_communication=True, reduce_bucket_size 512 MB; "
            "hybrid_zero_optim.py __init__ (lines 243-249): reduction hooks and a separate "
            "_comm_stream when overlapping; _reduce_and_copy (lines 402-406): each 512 MB bucket "
            "is reduced on that stream during backward, torch.cuda.synchronize() before the next "
            "one only waits for the previous bucket (one bucket in flight), not a reduction "
            "after backward",
        "sync_grad_bucket_elements":
            f"{AT} configs/7B_sft.py hybrid_zero_optimizer reduce_bucket_size=512 * 1024 * 1024 "
            "(compared with numel: elements); hybrid_zero_optim.py _reduce_and_copy (L402-406) "
            "torch.cuda.synchronize() before each bucket's reduction, step() (L508-514) "
            "reduces the last bucket after backward and synchronizes",
        "zero1_param_sync": f"{AT} hybrid_zero_optim.py broadcast_params(overlap=False): "
        "one dist.broadcast per ZeRO rank after the step",
        "zero1_partition": f"{AT} hybrid_zero_optim.py _partition_param_list (L272-297): "
        "the one parameter group's tensors (train.py "
        "initialize_optimizer) sorted by numel, largest first, each "
        "to the rank with the fewest elements; broadcast_params "
        "(L629-649) skips ranks in param_group_no_params_ranks",
        "zero1_grad_all_reduce": f"{AT} hybrid_zero_optim.py: gradient hooks use "
        "reduce_rank=None, so utils.reduce_tensor all-reduces "
        "each 512 MB bucket over the data-parallel group"})

HYBRID_ZERO_STEP = OptimizerStep(
    name="internevo-hybrid-zero-step", summary="HybridZero's step: fp32 norm copies, flatten, "
                                               "cast, torch 1.13 single-tensor AdamW, copy back",
    optimizer_step_bytes=122, step_fixed_s=0.0, sources={
        "optimizer_step_bytes":
            f"{AT} hybrid_zero_optim.py _step() on the rank's shard: compute_norm (L737-784: "
            "g.data.float() per gradient, read 2 write 4, then its norm, read 4), flatten the "
            "bf16 gradients (L577: 2 + 2) and .to(fp32) (L580: 2 + 4), _unscale_and_clip_grads "
            "(L682 grad.mul_: 4 + 4), torch 1.13.1 (requirements/torch.txt) AdamW, whose default "
            "is the single-tensor path (_single_tensor_adamw: param.mul_ 8, exp_avg.mul_.add_ "
            "8 + 12, exp_avg_sq.mul_.addcmul_ 8 + 12, sqrt, /, add_ eps 8 x 3, param.addcdiv_ "
            "16: 88), and fp16_param.copy_(fp32_param) (L619: 4 + 2): 122 bytes per parameter",
        "step_fixed_s": DEFAULT_COST_SOURCES["step_fixed_s"]})

FLASH_ATTN_2 = AttentionKernels(
    name="flash-attn-2", summary="the flash_attn package's FlashAttention-2",
    attention_kernels={"*": "fa2"}, sources={
        "attention_kernels": f"{AT} internlm/model/multi_head_attention.py: flash_attn "
                             "(FlashAttention-2) attention"})

APEX_FLASH_FUSED = Fusion(
    name="internevo-fused", summary="apex fused RMSNorm, flash-attn rotary; eager SwiGLU and "
                                    "fp32 casts before each norm",
    fusion="fused", eager_parts=("glu", "norm_input_cast"), sources={
        "fusion": f"{AT} internlm/model/modeling_internlm.py: apex MixedFusedRMSNorm, "
        "flash-attn fused rotary embedding (embedding.py rotary_emb / "
        "ApplyRotaryEmbQKV_) and attention",
        "eager_parts":
            f"{AT}: the SwiGLU MLP is eager (internlm/model/linear.py FeedForward.forward: "
            "self.w3(F.silu(self.w1(x)) * self.w2(x)); flash-attn's ParallelFusedMLP is used only "
            "without use_swiglu); modeling_internlm.py casts the residual to fp32 before each "
            "apex norm (L188 self.norm1(_residual.float()), L204 self.norm2(...float())) and "
            "checkpoints dropout + cast + norm (L75 dropout_selective_checkpoint = True when "
            "checkpoint is False; L191-208 activation_checkpoint)"})

PER_LINEAR_TP = TensorParallelComm(
    name="flash-attn-fused-dense-tp", summary="flash-attn Column/RowParallelLinear: each MLP "
                                              "linear all-reduces its own input gradient",
    overlap_tp_comm=False, tp_mlp_reduce_per_linear=True, sources={
        "overlap_tp_comm": DEFAULT_COST_SOURCES["overlap_tp_comm"],
        "tp_mlp_reduce_per_linear":
            f"{AT} internlm/model/linear.py FeedForward: w1 and w2 are two flash-attn "
            "ColumnParallelLinear modules (w3 a RowParallelLinear), and the pinned flash-attn "
            "submodule (d2f4324, flash_attn/ops/fused_dense.py FusedDenseFunc.backward) "
            "all-reduces each linear's own input gradient (all_reduce_raw, sequence_parallel="
            "False); the attention's QKV is one fused Wqkv (multi_head_attention.py MHA). The "
            "all-reduce is issued async before the weight-gradient GEMM, but without "
            "CUDA_DEVICE_MAX_CONNECTIONS=1 (not set at c18bec9) the GEMM can take the SMs first "
            "and the all-reduce runs after it (Megatron-LM d98e8a6 core/tensor_parallel/"
            "layers.py LinearWithGradAccumulationAndAsyncCommunication: the ordering is "
            "'necessary for a speedup'; NVIDIA/Megatron-LM issue #533; NeMo PR #12875: 'the "
            "communication kernel will be pushed to the end of the GEMM kernel'; ColossalAI PR "
            "#5891: async_grad_allreduce under TP overlapped only once it was set), so TP "
            "collectives stay priced exposed (overlap_tp_comm False)"})

CHOICES: Choices = replace(pytorch.CHOICES, sharded_dp=HYBRID_ZERO,
                           optimizer_step=HYBRID_ZERO_STEP, attention=FLASH_ATTN_2,
                           fusion=APEX_FLASH_FUSED, tensor_parallel=PER_LINEAR_TP)

_AT_TAG = "InternEvo v0.2.1dev20231121 (the tag of its memory table)"
_COMMON = {
    **NO_DEEPSPEED_ZERO3_SOURCES,
    **WHOLE_LOSS_SOURCES,
    "weight_bytes": f"{_AT_TAG} configs/7B_sft.py model.dtype bfloat16",
    "grad_bytes": f"{_AT_TAG}: gradients in the bf16 model dtype (reduced in bf16 buckets)",
    "master_weight_bytes": f"{_AT_TAG} hybrid_zero_optim.py / fsdp_optimizer.py: fp32 copies "
                           "of the rank's parameters",
    "moment_bytes": f"{_AT_TAG} hybrid_zero_optim.py / fsdp_optimizer.py: Adam over the fp32 "
                    "copies: fp32 moments (the training config's optimizer_state_dtype)",
    "grad_bucket_elements": f"{_AT_TAG}: the reduction buckets are not modelled as held "
                         "through backward: 0",
    "pp_unsharded_bytes": "InternEvo's FSDP mode does not combine with pipeline parallelism",
    "pp_unsharded_forward_bytes": "as pp_unsharded_bytes: none",
    "unfused_score_saved_bytes": "flash attention only (the runs use flash-attn)",
    "unfused_score_work_bytes": "flash attention only (the runs use flash-attn)",
    "fp8_weight_cache_bytes": "bf16 runs",
    "fp8_input_saved_bytes": "bf16 runs: None",
    "fp8_shared_input_saved_bytes": "bf16 runs: None",
    "fp8_expert_glu_input_saved_bytes": "bf16 runs: None",
    "loss_work_bytes": f"{_AT_TAG} internlm/model/loss.py FlashGPTLMLoss: flash_attn "
                       "CrossEntropyLoss(inplace_backward=True)",
    "loss_saved_bytes": "as the graph measures (4 bytes per logit element): the dtype of the "
                        "logits FlashGPTLMLoss receives was not read, so not changed",
    "kv_repeat_saved": "flash-attn attention takes the kv heads themselves: 0",
    **GRAPH_MOE_SOURCES,
}
#: InternEvo's memory conventions, by optimizer (ZeRO-1 = HybridZeroOptimizer, ZeRO-3 =
#: FSDPadaptOptimizer), read at the table's tag v0.2.1dev20231121. Both wrap torch.optim.AdamW
#: (internlm/train/training_internlm.py L166). The FSDP rows ran on torch >= 2.0.1
#: (internlm/initialize/launch.py L94-97 asserts it for fsdp=True; requirements/torch.txt pins
#: 1.13.1 for the rest): torch 2.0's AdamW defaults to the multi-tensor path on CUDA
#: (adamw(): foreach from _default_to_fused_or_foreach), whose _multi_tensor_adamw allocates
#: exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs) and denom = _foreach_add(exp_avg_sq_sqrt, eps)
#: over every tensor of the group at once: 4 + 4 bytes per parameter. On HybridZero's one flat
#: fp32 tensor per group the single-tensor path (torch 1.13) holds the same two temporaries:
#: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps).
INTERNEVO_MEMORY = {
    # the bf16 gradients are flattened (hybrid_zero_optim.py L740 flatten), cast to one flat
    # fp32 gradient (L745, 4 bytes) and released (-2): with the Adam temporaries (8) 8 + 4 - 2
    # = 10 bytes per parameter beside the states at the step. Cached at that peak (freed
    # earlier, and each smaller than the step's flat requests): the per-parameter bf16
    # gradients (2, released at L741-742), the fp32 copy of every gradient the norm takes
    # (utils.py reduce_grads L233 g.data.float(), called from step() L619/L643 through
    # compute_norm: 4) and the flat bf16 gradient (2, released at L746): 8
    1: MemoryConventions(weight_bytes=2, grad_bytes=2, master_weight_bytes=4,
                         optimizer_step_temp_bytes=10, loss_work_bytes=0, step_cached_bytes=8,
                         sources={
                             **_COMMON,
                             "optimizer_step_temp_bytes": f"{_AT_TAG} hybrid_zero_optim.py "
                             "_step() L738-755: flatten(gradients), .to(fp32), release; Adam's "
                             "two fp32 temporaries on the flat group",
                             "step_cached_bytes": f"{_AT_TAG} hybrid_zero_optim.py L741-746 "
                             "(per-parameter bf16 grads and the flat bf16 copy released before "
                             "the flat fp32 requests) and solver/optimizer/utils.py reduce_grads "
                             "L233 (fp32 copy of each gradient for the norm): 2 + 2 + 4"}),
    # fsdp_optimizer.py L137 grad_fp32 = [p.grad.to(fp32) ...] beside the bf16 gradients (4)
    # and torch 2.0's multi-tensor AdamW temporaries over all parameters (8): 12. The norm's
    # fp32 gradient copies (compute_norm, L86) are per tensor and freed before L137 allocates
    # tensors of the same shapes, which reuse them: nothing cached at the step
    3: MemoryConventions(weight_bytes=2, grad_bytes=2, master_weight_bytes=4,
                         optimizer_step_temp_bytes=12, loss_work_bytes=0, sources={
                             **_COMMON,
                             "optimizer_step_temp_bytes": f"{_AT_TAG} fsdp_optimizer.py "
                             "step() L137: grad_fp32 beside the bf16 grads (4); torch 2.0.1 "
                             "_multi_tensor_adamw exp_avg_sq_sqrt and denom (4 + 4)",
                             "step_cached_bytes": f"{_AT_TAG} fsdp_optimizer.py: the norm's "
                             "per-tensor fp32 copies are reused by grad_fp32 (same shapes)"}),
}

_SPLIT = ("InternEvo v0.2.1dev20231121 internlm/solver/pipeline_utils.py partition_uniform "
          "(left = pipeline_parallel_size - partition_items % pipeline_parallel_size; stage p "
          "gets chunk_size + (p >= left)), used by internlm/model/modeling_internlm.py "
          "_build_generic_model_1d; the embedding goes to the first stage, the head to the "
          "last; no interleaving")


def _profile(name: str, version: str, memory: MemoryConventions):
    caps = pytorch.borrowed_capabilities()
    return compose(CHOICES, **{**caps, "memory": memory, "stage_split": "last",
                              "sources": {**caps["sources"], "stage_split": _SPLIT}},
                   name=name, version=version)


PROFILE = _profile("internevo", f"{AT}, hybrid ZeRO (HybridZeroOptimizer)",
                   INTERNEVO_MEMORY[1])
PROFILE_FSDP = _profile("internevo-fsdp", f"{AT}, FSDP mode (FSDPadaptOptimizer)",
                        INTERNEVO_MEMORY[3])
