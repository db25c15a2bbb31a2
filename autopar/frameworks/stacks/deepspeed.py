"""``deepspeed``: DeepSpeed 0.19.6 (edaa72212672): ``deepspeed/runtime/engine.py``,
``runtime/pipe/engine.py``, ``runtime/pipe/schedule.py``, ``runtime/zero/``."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Mapping

from ...errors import InvalidTrainingConfig
from ..choices import (ACTIVATION_DTYPE_DISPATCH, DTENSOR_TP, EAGER, FSDP2, FUSED_CP, SDPA_FLASH,
                       TORCH_PIPELINING, Choices, OptimizerStep, compose, with_choice)
from ..memory import DEEPSPEED_MEMORY
from ..seqrule import DEEPSPEED_RULE
from ..vocabulary import (DEEPSPEED_030_ZERO1_GRAD_COPY_PASSES, DEEPSPEED_030_ZERO1_STEP_BYTES,
                          DEEPSPEED_030_ZERO1_STEP_HOST_OPS_PER_TENSOR,
                          DEEPSPEED_ZERO3_PERSISTENCE_THRESHOLD,
                          DEEPSPEED_ZERO3_REDUCE_BUCKET_ELEMENTS,
                          DEEPSPEED_ZERO0_GRAD_COPY_PASSES, DEEPSPEED_ZERO0_STEP_BYTES,
                          DEEPSPEED_ZERO0_STEP_HOST_OPS_PER_TENSOR,
                          DEEPSPEED_ZERO12_GRAD_COPY_PASSES, DEFAULT_COST_SOURCES,
                          MIXED_FUSED_OPTIMIZER_STEP_BYTES, TORCH_OPTIMIZER_STEP_BYTES)

ALL_ZERO = (0, 1, 2, 3)

#: Where ZeRO-1/2 reduce gradients: DeepSpeed v0.14.2 (the version of the 2024 runs) and v0.16,
#: deepspeed/runtime/zero/stage_1_and_2.py ``average_tensor``.
_AVERAGE_TENSOR = ("deepspeed/runtime/zero/stage_1_and_2.py (v0.14.2, v0.16) average_tensor: "
                   "with the defaults reduce_scatter=True and use_multi_rank_bucket_allreduce="
                   "True (zero/config.py, since v0.12.4, PR #4695) every bucket's slices go to "
                   "allreduce_and_scatter -> allreduce_and_copy_with_multiple_ranks -> "
                   "allreduce_bucket, a dist.all_reduce of the whole bucket over the data-"
                   "parallel group, after which each rank copies back only its own slices")

#: DeepSpeed ZeRO: per-parameter ZeRO-3 gathers, reduction after backward (overlap_comm off),
#: ZeRO-1/2 buckets all-reduced, with their copies on the compute stream.
ZERO = replace(
    FSDP2, name="deepspeed-zero", zero3_gather="per_parameter", overlap_dp_grad_reduce=False,
    fsdp2_copies=False, zero1_grad_all_reduce=True, zero2_grad_all_reduce=True,
    zero12_grad_copy_passes=DEEPSPEED_ZERO12_GRAD_COPY_PASSES,
    zero0_grad_copy_passes=DEEPSPEED_ZERO0_GRAD_COPY_PASSES,
    zero0_step_bytes=DEEPSPEED_ZERO0_STEP_BYTES,
    zero0_step_host_ops_per_tensor=DEEPSPEED_ZERO0_STEP_HOST_OPS_PER_TENSOR,
    zero3_persistent_elements=DEEPSPEED_ZERO3_PERSISTENCE_THRESHOLD,
    zero3_reduce_bucket_elements=DEEPSPEED_ZERO3_REDUCE_BUCKET_ELEMENTS,
    summary="DeepSpeed ZeRO 1-3 (stage_1_and_2.py, stage3.py), overlap_comm off for ZeRO-1/2, "
            "gradient buckets all-reduced; without ZeRO the engine's reduction copies and "
            "FP16_Optimizer's per-tensor overflow check",
    sources={**FSDP2.sources,
             "zero1_grad_all_reduce": _AVERAGE_TENSOR + " (ZeRO-1: once, at the gradient "
                                      "accumulation boundary)",
             "zero2_grad_all_reduce": _AVERAGE_TENSOR + " (ZeRO-2: partition_gradients, every "
                                      "micro-batch's backward hooks)",
             "zero12_grad_copy_passes": "DEEPSPEED_ZERO12_GRAD_COPY_PASSES: stage_1_and_2.py "
                                        "bucket copy (contiguous_gradients), average_tensor "
                                        "div_, allreduce_bucket flatten; on the current "
                                        "stream as overlap_comm is False for ZeRO-1/2",
             "fsdp2_copies": "not FSDP2: partitioned_param_coordinator.py "
                             "fetch_sub_module waits on each gather (partition_parameters"
                             ".py AllGatherCoalescedHandle.wait, whose torch.cat of the "
                             "partitions is its copy-out) inside the allgather stream, "
                             "part of the per-parameter gather (zero3_gather); stage3.py "
                             "__add_grad_to_ipg_bucket copies gradients into the bucket "
                             "on reduce_and_partition_stream",
             "zero3_gather": "deepspeed/runtime/zero/partitioned_param_coordinator.py: "
                             "per-parameter all-gathers fetched through "
                             "stage3_prefetch_bucket_size (5e7 elements) with stream "
                             "synchronisation; costed as not overlapped (issue 13)",
             "zero0_grad_copy_passes": "DEEPSPEED_ZERO0_GRAD_COPY_PASSES: engine.py "
                                       "allreduce_bucket flatten and post-scale mul_, "
                                       "allreduce_and_copy copy_ back (0.3.0 7d4d742, "
                                       "0.19.6 edaa722)",
             "zero0_step_bytes": "DEEPSPEED_ZERO0_STEP_BYTES: fp16/fused_optimizer.py "
                                 "FP16_Optimizer.step has_overflow (x.float().sum()) and "
                                 "_flatten_dense_tensors of the fp32 casts (0.3.0, 0.19.6)",
             "zero0_step_host_ops_per_tensor": "DEEPSPEED_ZERO0_STEP_HOST_OPS_PER_TENSOR: "
                                               "runtime/utils.py CheckOverflow."
                                               "has_overflow_serial -> _has_inf_or_nan "
                                               "float(x.float().sum()) per gradient tensor "
                                               "(0.3.0, 0.19.6)",
             "zero3_persistent_elements": "DEEPSPEED_ZERO3_PERSISTENCE_THRESHOLD: zero/config.py "
                                          "stage3_param_persistence_threshold 1e5 (v0.14.2, "
                                          "v0.16); partition_parameters.py ds_persist",
             "zero3_reduce_bucket_elements": "DEEPSPEED_ZERO3_REDUCE_BUCKET_ELEMENTS: "
                                             "zero/config.py reduce_bucket_size 5e8; stage3.py "
                                             "__reduce_and_partition_ipg_grads -> "
                                             "reduce_scatter_coalesced, one per bucket",
             "overlap_dp_grad_reduce": "deepspeed/runtime/zero/config.py overlap_comm "
                                       "defaults to False (ZeRO-0..2: reduction after "
                                       "backward)"})

#: DeepSpeed 0.3.0 (7d4d742, 2020) ZeRO-1: ``deepspeed/runtime/zero/stage1.py``
#: ``FP16_DeepSpeedZeroOptimizer_Stage1``, replaced in 0.3.x-0.4 by stage_1_and_2.py (stage2.py).
#: Its gradients are reduce-scattered (engine.py ``allreduce_gradients`` asserts
#: ``zero_reduce_scatter``, default True, zero/constants.py, and calls ``reduce_scatter_gradients``)
#: with flatten and scale copies, and its step checks overflow and takes the norm of every fp16
#: gradient tensor one by one, each read back to the host, before updating its partition and
#: all-gathering the fp16 parameters (``dist.all_gather`` per communication interval of
#: ``reduce_bucket_size`` 5e8 elements, after the step). Swap it in with
#: :func:`with_deepspeed_030`.
ZERO_030 = replace(
    ZERO, name="deepspeed-0.3-zero", zero1_grad_all_reduce=False,
    zero12_grad_copy_passes=DEEPSPEED_030_ZERO1_GRAD_COPY_PASSES,
    zero1_step_bytes=DEEPSPEED_030_ZERO1_STEP_BYTES,
    zero1_step_host_ops_per_tensor=DEEPSPEED_030_ZERO1_STEP_HOST_OPS_PER_TENSOR,
    summary="DeepSpeed 0.3.0 ZeRO-1 (stage1.py): gradients reduce-scattered, every gradient "
            "tensor checked and normed from the host at the step",
    sources={**ZERO.sources,
             "zero1_grad_all_reduce": "DeepSpeed 0.3.0 engine.py allreduce_gradients: ZeRO-1 "
                                      "asserts zero_reduce_scatter (zero/constants.py "
                                      "ZERO_OPTIMIZATION_REDUCE_SCATTER_DEFAULT True) and calls "
                                      "stage1.py reduce_scatter_gradients (dist.reduce_scatter)",
             "zero12_grad_copy_passes": "DEEPSPEED_030_ZERO1_GRAD_COPY_PASSES: stage1.py "
                                        "reduce_scatter_gradients get_flat_sub_partitions "
                                        "(torch.cat) and mul_ (0.3.0); PyTorch 1.6 "
                                        "ProcessGroupNCCL.cpp list reduce_scatter copy-in and "
                                        "all_gather copy-out",
             "zero1_step_bytes": "DEEPSPEED_030_ZERO1_STEP_BYTES: stage1.py step "
                                 "overflow_checker.check() and get_grad_norm(group) over every "
                                 "fp16 gradient (0.3.0)",
             "zero1_step_host_ops_per_tensor": "DEEPSPEED_030_ZERO1_STEP_HOST_OPS_PER_TENSOR: "
                                               "runtime/utils.py _has_inf_or_nan float() and "
                                               "get_grad_norm param_norm.item() per tensor "
                                               "(0.3.0)"})


#: The DeepSpeedExamples Megatron-LM GPT-2 (the 2019 Megatron-LM v1 code at DeepSpeedExamples
#: a79272c, the model of the 2020 DeepSpeed runs): eager ops with the fp32 loss
#: (pretrain_gpt2.py ``mpu.vocab_parallel_cross_entropy(output.contiguous().float(), labels)``)
#: and an unfused attention that scales and masks its scores in three element-wise ops
#: (``separate_scale_mask``). Swap it in with :func:`with_megatron_v1_model`.
MEGATRON_V1_MODEL = replace(
    EAGER, name="dse-megatron-v1-eager",
    summary="DeepSpeedExamples Megatron-LM v1 GPT-2: eager ops, fp32 loss, attention scaled "
            "and masked in three element-wise ops",
    eager_parts=("fp32_cross_entropy", "separate_scale_mask"),
    sources={**EAGER.sources,
             "eager_parts": "DeepSpeedExamples a79272c Megatron-LM/pretrain_gpt2.py: "
                            "vocab_parallel_cross_entropy(output.contiguous().float(), "
                            "labels); Megatron-LM/mpu/transformer.py GPT2ParallelSelfAttention"
                            ".forward: 'attention_scores / math.sqrt(...)' then "
                            "'torch.mul(attention_scores, ltor_mask) - 10000.0 * (1.0 - "
                            "ltor_mask)'"})


def with_megatron_v1_model(profile):
    """``profile`` (DeepSpeed) running DeepSpeedExamples' Megatron-LM v1 GPT-2 model
    (:data:`MEGATRON_V1_MODEL`). A model-code option for runs whose framework text names
    DeepSpeedExamples' Megatron-LM, not the profile's default (which runs the model's own
    ops as the graph counts them)."""
    return with_choice(profile, MEGATRON_V1_MODEL)


def with_deepspeed_030(profile):
    """``profile`` (DeepSpeed) as DeepSpeed 0.3.0 (2020) runs ZeRO-1 (:data:`ZERO_030`); its
    ZeRO-0 path (engine.py buckets, FP16_Optimizer) is the profile's own, read at 0.3.0 and
    0.19.6 alike (``zero0_*`` sources). A version option, not the profile's default. ZeRO-2 at
    0.3.0 (stage2.py) was not read: under this option it keeps the profile's ZeRO-2 mechanisms
    with this choice's copy passes."""
    return with_choice(profile, ZERO_030)


#: DeepSpeed's documented defaults that decide step time, each with where it is set (DeepSpeed
#: v0.14.2, the 2024 runs' release, and v0.16: deepspeed/runtime/zero/config.py, runtime/
#: constants.py, engine.py) and how the profile prices it: {name: (default, source, priced as)}.
#: A run whose source states another value keeps its own; an open field takes this default.
DEFAULTS = MappingProxyType({
    "overlap_comm": ((False, False, False, True),
                     "zero/config.py overlap_comm: bool = None; validator overlap_comm_valid: "
                     "None -> stage == 3 (per ZeRO stage 0, 1, 2, 3)",
                     "ZeRO-0..2: overlap_dp_grad_reduce False (reduction after backward). "
                     "ZeRO-3: its reduce-scatter runs on reduce_and_partition_stream, but on "
                     "the same process group, hence the same NCCL stream, as the all-gathers "
                     "the compute waits on (priced not overlapped, issue 13): not credited"),
    "reduce_bucket_size": (DEEPSPEED_ZERO3_REDUCE_BUCKET_ELEMENTS,
                           "zero/config.py Field(pp_int(5e8))",
                           "ZeRO-1/2: buckets issued on the compute stream, all exposed, the "
                           "per-bucket latency (psi / 5e8 calls) not counted; ZeRO-3: "
                           "zero3_reduce_bucket_elements, one reduce-scatter per bucket. Its "
                           "copies on reduce_and_partition_stream (bucket copy, the "
                           "interleaving torch.cat and pre-divide div_ of "
                           "reduce_scatter_coalesced: 6 passes per micro-batch) run beside "
                           "backward and are not charged"),
    "allgather_bucket_size": (500_000_000, "zero/config.py Field(pp_int(5e8))",
                              "ZeRO-1/2 parameter all-gather after the step: one exposed "
                              "all-gather of the parameters (utils.py all_gather_dp_groups)"),
    "contiguous_gradients": (True, "zero/config.py contiguous_gradients: bool = True",
                             "zero12_grad_copy_passes (bucket copy)"),
    "reduce_scatter": (True, "zero/config.py reduce_scatter: bool = True",
                       "with use_multi_rank_bucket_allreduce True: zero1/zero2_grad_all_reduce"),
    "use_multi_rank_bucket_allreduce": (True, "zero/config.py (since v0.12.4, PR #4695)",
                                        "zero1_grad_all_reduce, zero2_grad_all_reduce"),
    "prescale_gradients": (False, "runtime/constants.py PRESCALE_GRADIENTS_DEFAULT",
                           "post-scale div_/mul_ in the copy passes"),
    "gradient_predivide_factor": (1.0, "runtime/constants.py GRADIENT_PREDIVIDE_FACTOR_DEFAULT",
                                  "one scaling pass in the copy passes"),
    "stage3_prefetch_bucket_size": (50_000_000, "zero/config.py Field(pp_int(5e7))",
                                    "time: not priced (ZeRO-3 gathers costed not overlapped); "
                                    "memory: MemoryConventions.zero3_prefetch_elements"),
    "stage3_max_live_parameters": (1_000_000_000, "zero/config.py Field(pp_int(1e9))",
                                   "time: not priced (gathers re-issued per module); memory: "
                                   "MemoryConventions.zero3_max_live_elements, the prefetch's cap"),
    "stage3_max_reuse_distance": (1_000_000_000, "zero/config.py Field(pp_int(1e9))",
                                  "not priced: the last modules' parameters kept for backward "
                                  "would save re-gathers (faster), not counted"),
    "stage3_param_persistence_threshold": (DEEPSPEED_ZERO3_PERSISTENCE_THRESHOLD,
                                           "zero/config.py Field(pp_int(1e5))",
                                           "zero3_persistent_elements: not gathered"),
    "sub_group_size": (1_000_000_000, "zero/config.py Field(pp_int(1e9))",
                       "time: not priced (one pass per sub-group); memory: MemoryConventions."
                       "zero3_sub_group_elements, the step's fp32 gradient copy per sub-group"),
    "gradient_clipping": (0.0, "runtime/constants.py GRADIENT_CLIPPING_DEFAULT",
                          "optimizer_step_bytes counts a norm pass (HF Trainer sets 1.0)"),
    "wall_clock_breakdown": (False, "runtime/constants.py WALL_CLOCK_BREAKDOWN_DEFAULT",
                             "no timer synchronisation priced"),
    "tput_timer_synchronize": (True, "utils/timer.py ThroughputTimer.start / stop: "
                                     "get_accelerator().synchronize() every micro-batch after "
                                     "step 2 (engine.py forward, when deepspeed.initialize got "
                                     "no training_data, and step)",
                               "not priced: two device syncs per micro-batch expose the host's "
                               "time between micro-batches (no public per-step figure)"),
})

FUSED_ADAM = OptimizerStep(
    name="deepspeed-fused-adam", summary="DeepSpeed FusedAdam on fp32 partitions",
    optimizer_step_bytes=MIXED_FUSED_OPTIMIZER_STEP_BYTES, step_fixed_s=0.0, sources={
        "optimizer_step_bytes": "deepspeed/ops/adam/fused_adam.py FusedAdam "
                                "(multi_tensor_adam); runtime/constants.py "
                                "GRADIENT_CLIPPING_DEFAULT = 0. (0.3.0, 0.14.2, 0.16.4), but "
                                "zero/stage_1_and_2.py step() takes scaled_global_norm every "
                                "step (the clip's scale pass, read 4 write 4, is charged "
                                "with it: HF Trainer sets clipping 1.0); step(): flat "
                                "gradient .to(fp32) and the bf16 "
                                "partition copied from the fp32 one: "
                                "MIXED_FUSED_OPTIMIZER_STEP_BYTES",
        "step_fixed_s": DEFAULT_COST_SOURCES["step_fixed_s"]})

#: The optimizer step when Hugging Face Trainer / Accelerate is the front end and the DeepSpeed
#: config has no "optimizer" section: transformers src/transformers/integrations/deepspeed.py
#: ``deepspeed_optim_sched`` then calls ``trainer.create_optimizer()`` (TrainingArguments ``optim``
#: default "adamw_torch": torch.optim.AdamW, foreach on CUDA) and sets
#: ``zero_allow_untested_optimizer``, so ZeRO steps its fp32 partitions with torch's AdamW. Not
#: the profile's default (a DeepSpeed config's own "optimizer" makes FusedAdam); swap it in with
#: ``with_choice(profile, HF_TRAINER_TORCH_ADAMW)``.
HF_TRAINER_TORCH_ADAMW = OptimizerStep(
    name="hf-trainer-torch-adamw", summary="torch AdamW (foreach) handed to DeepSpeed ZeRO by "
                                           "Hugging Face Trainer, on fp32 partitions",
    optimizer_step_bytes=TORCH_OPTIMIZER_STEP_BYTES + 12, step_fixed_s=0.0, sources={
        "optimizer_step_bytes": "transformers integrations/deepspeed.py deepspeed_optim_sched: "
                                "no 'optimizer' in the DeepSpeed config -> trainer."
                                "create_optimizer() (optim default 'adamw_torch'): "
                                "TORCH_OPTIMIZER_STEP_BYTES (foreach AdamW and clipping) plus "
                                "ZeRO's bf16 -> fp32 gradient cast (read 2, write 4) and fp32 "
                                "-> bf16 parameter copy (read 4, write 2) = 92 + 12",
        "step_fixed_s": DEFAULT_COST_SOURCES["step_fixed_s"]})

#: What :data:`HF_TRAINER_TORCH_ADAMW` allocates beside the states at the ZeRO-1/2 step, in
#: bytes per optimizer-held (partition) element: deepspeed/runtime/zero/stage_1_and_2.py step()
#: casts each group's flat bit16 gradient partition to fp32 (``single_grad_partition = self.
#: flatten_dense_tensors_aligned(self.averaged_gradients[i], ...).to(self.single_partition_of_
#: fp32_groups[i].dtype)``: + 4), then releases the bit16 gradients (``self.free_grad_in_param_
#: list(self.params_in_partition[i])``: - 2), then runs torch's AdamW on the one flat fp32
#: partition: torch/optim/adamw.py _single_tensor_adamw ``denom = (exp_avg_sq.sqrt() /
#: bias_correction2_sqrt).add_(eps)`` holds the sqrt and the quotient at once (+ 4 + 4; torch
#: 2.0's _multi_tensor_adamw likewise holds exp_avg_sq_sqrt and denom); every other update is
#: in place: 4 - 2 + 8 = 10 (the same count as InternEvo's HybridZero step, stacks/internevo.py).
HF_TRAINER_TORCH_ADAMW_STEP_TEMP_BYTES = 10
_HF_ADAMW_STEP_SOURCE = (
    "transformers integrations/deepspeed.py deepspeed_optim_sched (no 'optimizer' in the "
    "DeepSpeed config -> torch AdamW); deepspeed/runtime/zero/stage_1_and_2.py step(): fp32 "
    "copy of the flat gradient partition (+4), bit16 gradients freed (-2); torch/optim/adamw.py "
    "_single_tensor_adamw denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps): two "
    "fp32 temporaries on the flat partition (+8): 10")


#: What :data:`HF_TRAINER_TORCH_ADAMW` allocates beside the states at the ZeRO-3 step, in bytes
#: per element of the sub-group being stepped: deepspeed/runtime/zero/stage3.py step() ->
#: _prepare_fp32_grad_for_sub_group casts the sub-group's gradients to an fp32 copy (+ 4) while
#: the bit16 gradient partition (grad_partitions_flat_buffer) stays allocated, then torch's
#: AdamW runs on the one flat fp32 sub-group tensor with the two fp32 temporaries of
#: :data:`HF_TRAINER_TORCH_ADAMW_STEP_TEMP_BYTES` (+ 8): 12.
HF_TRAINER_TORCH_ADAMW_ZERO3_STEP_TEMP_BYTES = 12
_HF_ADAMW_ZERO3_STEP_SOURCE = (
    "transformers integrations/deepspeed.py deepspeed_optim_sched (no 'optimizer' in the "
    "DeepSpeed config -> torch AdamW); deepspeed/runtime/zero/stage3.py step(): per sub-group, "
    "_prepare_fp32_grad_for_sub_group's fp32 gradient copy (+4, the bit16 "
    "grad_partitions_flat_buffer kept), then torch/optim/adamw.py _single_tensor_adamw's two "
    "fp32 temporaries on the flat sub-group (+8): 12")


def with_hf_trainer_torch_adamw(profile):
    """``profile`` (DeepSpeed) as Hugging Face Trainer / Accelerate runs it when the DeepSpeed
    config has no "optimizer" section: the step costed as :data:`HF_TRAINER_TORCH_ADAMW` and its
    memory as :data:`HF_TRAINER_TORCH_ADAMW_STEP_TEMP_BYTES` per optimizer-held element beside
    the states (the fp32 gradient copy and torch AdamW's temporaries; under ZeRO-3
    :data:`HF_TRAINER_TORCH_ADAMW_ZERO3_STEP_TEMP_BYTES` per sub-group element), each with its
    source. A user's choice, not the profile's default (a config with its own "optimizer" gets FusedAdam,
    which steps in place)."""
    mem = profile.memory
    mem = replace(mem, optimizer_step_temp_bytes=HF_TRAINER_TORCH_ADAMW_STEP_TEMP_BYTES,
                  zero3_step_temp_bytes=HF_TRAINER_TORCH_ADAMW_ZERO3_STEP_TEMP_BYTES,
                  sources={**mem.sources, "optimizer_step_temp_bytes": _HF_ADAMW_STEP_SOURCE,
                           "zero3_step_temp_bytes": _HF_ADAMW_ZERO3_STEP_SOURCE})
    return replace(with_choice(profile, HF_TRAINER_TORCH_ADAMW), memory=mem)


#: The ``zero_optimization`` keys :func:`with_zero_config` reads, with DeepSpeed's defaults
#: (deepspeed/runtime/zero/config.py, DeepSpeed 0.19.8; the same at 0.14-0.16).
ZERO_CONFIG_DEFAULTS = MappingProxyType({
    "reduce_bucket_size": 500_000_000, "contiguous_gradients": True,
    "stage3_prefetch_bucket_size": 50_000_000, "stage3_max_live_parameters": 1_000_000_000,
    "stage3_param_persistence_threshold": DEEPSPEED_ZERO3_PERSISTENCE_THRESHOLD,
    "sub_group_size": 1_000_000_000, "allgather_bucket_size": 500_000_000,
})
#: What Hugging Face transformers fills in for ``"auto"`` (integrations/deepspeed.py
#: HfTrainerDeepSpeedConfig.trainer_config_finalize, from the model config's hidden_size h):
#: reduce_bucket_size h^2; under ZeRO-3 stage3_prefetch_bucket_size int(0.9 h^2) and
#: stage3_param_persistence_threshold 10 h. Other keys have no "auto".
HF_AUTO = MappingProxyType({
    "reduce_bucket_size": lambda h: h * h,
    "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h,
})
_HF_AUTO_SOURCE = ("transformers integrations/deepspeed.py HfTrainerDeepSpeedConfig."
                   "trainer_config_finalize: 'auto' reduce_bucket_size = hidden_size^2, "
                   "stage3_prefetch_bucket_size = 0.9 hidden_size^2, "
                   "stage3_param_persistence_threshold = 10 hidden_size")


def zero_config(block: Mapping | None = None, hidden_size: int | None = None) -> dict:
    """The ZeRO buffer settings of a DeepSpeed config's ``zero_optimization`` ``block`` (keys
    of :data:`ZERO_CONFIG_DEFAULTS`; others are ignored, as they do not size a buffer), each
    key the block leaves out at DeepSpeed's default, ``"auto"`` as Hugging Face Trainer fills
    it (:data:`HF_AUTO`, from ``hidden_size``). Returns {key: value}.

    Raises:
        InvalidTrainingConfig: an "auto" without ``hidden_size`` (only HF Trainer fills it), an
            "auto" on a key HF does not fill, or a value that is not a number >= 0 (a bool
            for contiguous_gradients).
    """
    out = dict(ZERO_CONFIG_DEFAULTS)
    for key, value in (block or {}).items():
        if key not in out:
            continue
        if value == "auto":
            if key not in HF_AUTO or not hidden_size:
                raise InvalidTrainingConfig(
                    f"zero_optimization.{key} = 'auto': only Hugging Face Trainer fills 'auto', "
                    f"and only for {sorted(HF_AUTO)} from the model's hidden_size. Fix: give "
                    "hidden_size (the config runs under HF Trainer) or a number")
            value = HF_AUTO[key](int(hidden_size))
        if key == "contiguous_gradients":
            if not isinstance(value, bool):
                raise InvalidTrainingConfig(f"zero_optimization.contiguous_gradients = {value!r}: "
                                            "must be true or false")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise InvalidTrainingConfig(f"zero_optimization.{key} = {value!r}: must be a number "
                                        f">= 0 (elements); fix: e.g. {ZERO_CONFIG_DEFAULTS[key]}")
        out[key] = value if key == "contiguous_gradients" else int(value)
    return out


def with_zero_config(profile, block: Mapping | None = None, hidden_size: int | None = None,
                     source: str = "the DeepSpeed config's zero_optimization block"):
    """``profile`` (DeepSpeed) with the ZeRO buffers a DeepSpeed config's ``zero_optimization``
    ``block`` sizes (:func:`zero_config`: DeepSpeed's defaults for keys it leaves out, HF
    Trainer's fill for "auto" given ``hidden_size``): the contiguous gradient (IPG) bucket of
    reduce_bucket_size elements (0 without contiguous_gradients; two under ZeRO-1/2 when the block
    sets overlap_comm true and its stage), ZeRO-3's prefetch bucket,
    live-parameter cap, persistence threshold (memory and gathers), sub-group size, and its
    reduce buckets. ``allgather_bucket_size`` sizes no buffer (ZeRO-1/2 gather into the flat
    bit16 groups' own views: deepspeed/runtime/utils.py all_gather_dp_groups ``narrow``).
    ``source`` names where the block comes from (kept in the sources)."""
    z = zero_config(block, hidden_size)
    auto = sorted(k for k, v in (block or {}).items() if v == "auto")
    why = f"{source}" + (f" ({', '.join(auto)} 'auto': {_HF_AUTO_SOURCE})" if auto else "")
    # ZeRO-1/2 with overlap_comm keep a second bucket (stage_1_and_2.py setup_buckets: 'Use
    # double buffers ... when overlap_comm is enabled': buf_1); ZeRO-3 keeps one per dtype
    # (stage3.py _setup_for_real_optimizer)
    buffers = 2 if (block or {}).get("overlap_comm") is True and \
        (block or {}).get("stage") in (1, 2) else 1
    mem = profile.memory
    mem = replace(
        mem, grad_bucket_elements=(buffers * z["reduce_bucket_size"] if z["contiguous_gradients"]
                                   else 0),
        zero3_prefetch_elements=z["stage3_prefetch_bucket_size"],
        zero3_max_live_elements=z["stage3_max_live_parameters"],
        zero3_sub_group_elements=z["sub_group_size"],
        sources={**mem.sources,
                 "grad_bucket_elements": f"reduce_bucket_size {z['reduce_bucket_size']} x "
                                         f"{buffers} buffer(s) (overlap_comm under ZeRO-1/2: 2) "
                                         f"x contiguous_gradients {z['contiguous_gradients']} "
                                         f"from {why}; " + mem.sources["grad_bucket_elements"],
                 "zero3_prefetch_elements": f"stage3_prefetch_bucket_size "
                                            f"{z['stage3_prefetch_bucket_size']} from {why}; "
                                            + mem.sources["zero3_prefetch_elements"],
                 "zero3_max_live_elements": f"stage3_max_live_parameters "
                                            f"{z['stage3_max_live_parameters']} from {why}; "
                                            + mem.sources["zero3_max_live_elements"],
                 "zero3_sub_group_elements": f"sub_group_size {z['sub_group_size']} from "
                                             f"{why}; " + mem.sources["zero3_sub_group_elements"]})
    profile = profile.with_costs(
        {"zero3_persistent_elements": f"stage3_param_persistence_threshold from {why}",
         "zero3_reduce_bucket_elements": f"reduce_bucket_size from {why}"},
        zero3_persistent_elements=z["stage3_param_persistence_threshold"],
        zero3_reduce_bucket_elements=z["reduce_bucket_size"])
    return replace(profile, memory=mem)


#: DeepSpeed-MoE: tokens in the activation dtype, each expert's input a padded buffer.
DEEPSPEED_MOE_DISPATCH = replace(
    ACTIVATION_DTYPE_DISPATCH, name="deepspeed-moe",
    summary="DeepSpeed-MoE: the [E, C, hidden] expert buffer, every expert padded to C",
    moe_capacity_rule="deepspeed",
    sources={**ACTIVATION_DTYPE_DISPATCH.sources, "moe_capacity_rule": (
        "deepspeed/moe/sharded_moe.py (0.19.8) MOELayer.forward places the routed rows in an "
        "[E, C, hidden] buffer (_sparse_encode; zero rows where an expert got fewer, as the "
        "one-hot einsum 'sec,sm->ecm' it replaced): C rows per expert; topkgating with "
        "drop_tokens=True sets C = _capacity(gates, capacity_factor * k, min_capacity) = "
        "max(ceil(T / E x capacity_factor x k), min_capacity), with drop_tokens=False C = "
        "torch.max(exp_counts) all-reduced with ReduceOp.MAX over the EP group; "
        "deepspeed/moe/layer.py MoE(capacity_factor=1.0, min_capacity=4, drop_tokens=True)")})

# the engine runs the model's own attention and ops, and its TP and pipeline sends as the
# defaults are costed (synchronous, waited on); the records keep the default sources
CHOICES = Choices(
    sharded_dp=ZERO, optimizer_step=FUSED_ADAM,
    attention=replace(SDPA_FLASH, name="model-sdpa-flash",
                      summary="the model's own SDPA attention (flash backend)"),
    fusion=replace(EAGER, name="model-eager", summary="the model's own eager ops"),
    tensor_parallel=replace(DTENSOR_TP, name="deepspeed-autotp",
                            summary="AutoTP: synchronous TP collectives"),
    pipeline=replace(TORCH_PIPELINING, name="deepspeed-pipe",
                     summary="PipelineEngine: sends waited on before the next step"),
    context_parallel=FUSED_CP, expert_dispatch=DEEPSPEED_MOE_DISPATCH)

PROFILE = compose(
    CHOICES,
    name="deepspeed", version="DeepSpeed 0.19.6 (edaa72212672)",
    zero_stages=ALL_ZERO, zero_stages_with_tp=ALL_ZERO, zero_stages_with_pp=(0, 1),
    zero_stages_with_ep=ALL_ZERO, schedules=("1f1b",), interleaved_chunks="none",
    stage_cuts="balanced", cp_modes=(), recompute_modes=("none", "full"),
    per_block_recompute=False, sequence_parallel=(False,), expert_parallel=True,
    moe_sequence_parallel=(False,), experts_tp_sharded=False, seq_rule=DEEPSPEED_RULE,
    memory=DEEPSPEED_MEMORY, placements=(("tp", "cp", "dp", "pp"),),
    sources={
        "placements": "deepspeed/runtime/pipe/topology.py PipeModelDataParallelTopology: axes "
                      "[pipe, data, model], outermost first, so model (tp) innermost, then "
                      "data, then pipe (no context parallelism)",
        "dispatchers": "deepspeed/moe/sharded_moe.py MOELayer: _AllToAll of the dispatched "
                       "tokens (no DeepEP, no all-gather dispatcher)",
        "kv_heads_below_tp": "no tensor-parallel attention of its own (Megatron-DeepSpeed "
                             "splits heads: tp divides the KV heads)",
        "per_block_reshard": "deepspeed/runtime/zero/config.py: stage3_param_persistence_"
                             "threshold keeps parameters by size, not per chosen layer",
        "zero_stages": "deepspeed/runtime/zero/config.py zero_optimization.stage 0-3",
        "zero_stages_with_tp": "deepspeed/runtime/engine.py: 'AutoTP + ZeRO stage 3 is "
                               "supported for both inference and training'",
        "zero_stages_with_pp": "deepspeed/runtime/pipe/engine.py: 'ZeRO-2 and ZeRO-3 are "
                               "incompatible with pipeline parallelism'",
        "zero_stages_with_ep": "deepspeed/moe/layer.py MoE(ep_size=...) under any ZeRO stage",
        "schedules": "deepspeed/runtime/pipe/schedule.py TrainSchedule (1F1B-like) only",
        "overlaps_ep_comm": "none: no DualPipe-style schedule",
        "interleaved_chunks": "deepspeed/runtime/pipe/module.py PipelineModule: one "
                              "contiguous partition per stage",
        "stage_cuts": "deepspeed/runtime/pipe/module.py partition_method 'uniform' / "
                      "'parameters' (no explicit cut list)",
        "cp_modes": "Ulysses (deepspeed/sequence/layer.py DistributedAttention) needs the "
                    "model's attention wrapped; the JSON config cannot express CP",
        "recompute_modes": "deepspeed/runtime/activation_checkpointing/checkpointing.py: whole "
                           "checkpointed layers (no selective attention-core recompute)",
        "per_block_recompute": "pipe/module.py activation_checkpoint_interval N: every layer "
                               "with parameters, checkpointed in runs of N (no per-layer choice)",
        "vp_group_tunable": "runtime/pipe/schedule.py TrainSchedule: 1F1B only, no "
                            "interleaved schedule to group",
        "zero3_split_backward": "no split-backward schedule (runtime/pipe/schedule.py TrainSchedule)",
        "recompute_first_n": "pipe/module.py activation_checkpoint_interval N checkpoints "
                             "every layer in runs of N, not the first N of a stage: False",
        "recompute_modules": "no per-submodule checkpointing: checkpointing.py checkpoints "
                             "whole layers",
        "sequence_parallel": "AutoTP (deepspeed/module_inject/auto_tp.py) has no Megatron-style "
                             "sequence parallelism",
        "moe_sequence_parallel": "deepspeed/moe/layer.py MoE gates each rank's whole sequences; "
                                 "no sequence parallelism to pair it with (sequence_parallel)",
        "experts_tp_sharded": "deepspeed/moe/layer.py MoE(enable_expert_tensor_parallelism="
                              "False), the documented default: experts are not cut by TP",
        "expert_parallel": "deepspeed/moe/layer.py MoE(ep_size=...)",
        "expert_tensor_parallel": "deepspeed/utils/groups.py _create_expert_data_and_model_"
                                  "parallel: expert_tensor_parallel_world_size = tensor_"
                                  "parallel_size_, ep must divide the dp world size; "
                                  "expert-parallel groups are carved out of the data-parallel "
                                  "group (no folding over the tensor-parallel ranks)",
        "stage_split": "deepspeed/runtime/pipe/module.py partition_method 'uniform': costed "
                       "as the cost model's balanced cut",
    })
