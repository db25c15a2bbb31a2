"""``torch``: stock torch.distributed as :func:`autopar.runtime.apply` runs a plan (FSDP2,
DTensor TP, torch.distributed.pipelining, autopar's own CP), torch 2.13."""

from __future__ import annotations

from dataclasses import replace

from ...config import CP_MODES, RECOMPUTE_MODES, TORCH_SCHEDULES
from ..choices import (ACTIVATION_DTYPE_DISPATCH, DTENSOR_TP, EAGER, FSDP2, SDPA_FLASH,
                       TORCH_FOREACH_ADAMW, TORCH_PIPELINING, Choices, ContextParallelAttention,
                       capabilities_of, compose)
from ..memory import TORCH_MEMORY

ALL_ZERO = (0, 1, 2, 3)

#: FSDP2 as plan.apply runs it: under pipelining, parameters stay gathered across micro-batches.
SHARDED_DP = replace(FSDP2, name="fsdp2-pipelining", zero3_regather_per_micro_batch=False, sources={
    **FSDP2.sources,
    "zero3_regather_per_micro_batch": "torch/distributed/pipelining/stage.py "
    "backward_maybe_with_nosync: for an FSDP stage module, micro-batches before "
    "the last set_requires_gradient_sync(False) and set_reshard_after_backward("
    "False), so parameters stay gathered and gradients unsharded until the last"})

#: autopar/runtime/cp.py: the attention each CP exchange runs.
PLAN_APPLY_CP = ContextParallelAttention(
    name="plan-apply-cp", summary="autopar/runtime/cp.py: masked SDPA (all-gather), plain ops "
                                  "(ring), fused SDPA (Ulysses)",
    cp_attention={"allgather": "masked", "ring": "unfused"}, sources={
        "cp_attention": "autopar/runtime/cp.py (what plan.apply runs): all-gather CP "
                        "calls SDPA with an explicit boolean mask (flash refuses masks, "
                        "so the memory-efficient kernel runs over all pairs); ring CP "
                        "computes each hop's scores in plain tensor ops; Ulysses runs "
                        "SDPA is_causal on whole sequences (fused)",
        "ulysses_kv_repeat": "autopar/runtime/cp.py _ulysses all-to-alls K and V at their "
                             "own head count and refuses KV heads that tp * cp does not "
                             "divide: False"})

#: autopar/runtime/ep.py's dispatch: under op-level recomputation the all-to-alls run again.
PLAN_APPLY_DISPATCH = replace(
    ACTIVATION_DTYPE_DISPATCH, name="plan-apply-dispatch", moe_sac_redispatch=True,
    summary="autopar/runtime/ep.py: tokens all-to-all'd in the activation dtype, dispatched "
            "again when a block is recomputed",
    sources={**ACTIVATION_DTYPE_DISPATCH.sources,
             "moe_sac_redispatch": "autopar/runtime/recompute.py _OP_SAC_SAVED (attention, "
             "max, reduce_scatter_tensor) holds no all_to_all_single, so the recomputed "
             "forward runs autopar/runtime/ep.py's all_to_all_single_autograd dispatch and "
             "combine again (PREFER_RECOMPUTE re-executes every op it does not keep)"})

CHOICES = Choices(sharded_dp=SHARDED_DP, optimizer_step=TORCH_FOREACH_ADAMW,
                  attention=SDPA_FLASH, fusion=EAGER, tensor_parallel=DTENSOR_TP,
                  pipeline=TORCH_PIPELINING, context_parallel=PLAN_APPLY_CP,
                  expert_dispatch=PLAN_APPLY_DISPATCH)

PROFILE = compose(
    CHOICES,
    name="torch", version="torch 2.13 torch.distributed (plan.apply)",
    zero_stages=ALL_ZERO, zero_stages_with_tp=ALL_ZERO, zero_stages_with_pp=ALL_ZERO,
    zero_stages_with_ep=ALL_ZERO, schedules=TORCH_SCHEDULES, interleaved_chunks="any",
    stage_cuts="any", cp_modes=CP_MODES, recompute_modes=RECOMPUTE_MODES,
    per_block_recompute=True, sequence_parallel=(True, False), expert_parallel=True,
    moe_sequence_parallel=(False,), experts_tp_sharded=False,
    memory=TORCH_MEMORY,
    per_block_reshard=True, zero3_split_backward=True,
    sources={
        "zero3_split_backward": (
            "autopar/runtime/pipeline.py ShardedGradStage gathers an FSDP chunk (public "
            "FSDPModule.unshard) before torch's input- and weight-gradient passes, which read "
            "the weights from submod.parameters(); measured (2026-12-07): plan.apply of "
            "tiny-llama in fp32 on 4 gloo ranks, pp 2 x dp 2, 3 Adam steps, ZeRO-3 under "
            "zbv-zero-bubble, interleaved zero bubble and dualpipev matches one process as "
            "ZeRO-1 does (loss 5.5556517, parameters to 3e-7; tests/test_runtime.py); without "
            "the gather a unit resharded after forward listed its sharded parameters and lost "
            "its weight gradients (loss 5.5563536)"),
        "placements": "any order: autopar/runtime/mesh.py builds the DeviceMesh in the plan's "
                      "placement (ParallelConfig.placement, innermost first)",
        "dispatchers": "autopar/runtime/ep.py: routed tokens go to their experts' ranks with "
                       "all_to_all_single (no DeepEP, no all-gather dispatcher)",
        "kv_heads_below_tp": "autopar/runtime/tp.py shards the K/V projections' heads over TP: "
                             "tp divides the KV heads",
        "per_block_reshard": "torch.distributed.fsdp.fully_shard(block, reshard_after_forward=...)"
                             " is called per block module (autopar/runtime/dp.py apply_fsdp)",
        "zero_stages": "torch.distributed.fsdp.fully_shard (reshard_after_forward=True: ZeRO-3, "
                       "False: ZeRO-2) and DDP / ZeroRedundancyOptimizer (ZeRO-0/1)",
        "zero_stages_with_tp": "fully_shard over a DeviceMesh dim beside DTensor TP "
                               "(torch.distributed.tensor.parallel)",
        "zero_stages_with_pp": "fully_shard per torch.distributed.pipelining stage module",
        "zero_stages_with_ep": "fully_shard on the expert and non-expert parameter groups",
        "schedules": "torch/distributed/pipelining/schedules.py (torch 2.13): ScheduleGPipe, "
                     "Schedule1F1B, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, "
                     "ScheduleZBVZeroBubble, ScheduleDualPipeV (autopar/runtime/pipeline.py "
                     "maps each)",
        "overlaps_ep_comm": "none: _PipelineScheduleRuntime runs an OVERLAP_F_B action's "
                            "sub-actions one after the other unless a custom function is "
                            "registered (schedules.py), and plan.apply registers none",
        "interleaved_chunks": "pipelining.PipelineStage takes any module per stage",
        "stage_cuts": "pipelining.PipelineStage takes any module per stage",
        "cp_modes": "autopar/runtime/cp.py: all-gather, ring and Ulysses CP from plain "
                    "collectives (torch.distributed.tensor.experimental.context_parallel "
                    "needs CUDA's attention ops); Ulysses: two all_to_all_single calls "
                    "(Jacobs et al. 2023, arXiv 2309.14509)",
        "recompute_modes": "torch.utils.checkpoint (full) and selective checkpointing "
                           "(torch.utils.checkpoint.create_selective_checkpoint_contexts: "
                           "attention core, and torchtitan's op-level policy; "
                           "autopar/runtime/recompute.py)",
        "recompute_modules": "autopar/runtime/recompute.py: the selective policy saves all but "
                             "the attention core; no Megatron-Core module checkpoints",
        "per_block_recompute": "checkpoint_wrapper is applied per module (autopar/runtime/"
                               "recompute.py)",
        "vp_group_tunable": ("torch/distributed/pipelining/schedules.py "
                             "ScheduleInterleaved1F1B: microbatches_per_round = "
                             "n_microbatches // max(1, n_microbatches // pp), no argument"),
        "recompute_first_n": "per_block_recompute covers any per-block mix: no flag of "
                             "its own",
        "sequence_parallel": "torch.distributed.tensor.parallel.SequenceParallel is optional",
        "moe_sequence_parallel": "autopar/runtime/tp.py shards nn.Linear layers only: the "
                                 "stacked experts stay whole on each TP rank and route whole "
                                 "sequences (runtime/apply.py check_moe)",
        "expert_parallel": "all_to_all_single token dispatch over a DeviceMesh dim",
        "expert_tensor_parallel": "autopar/runtime/mesh.py lays ep inside the DP dimension "
                                  "and runtime/ep.py splits whole experts (etp = tp only)",
        "experts_tp_sharded": "autopar/runtime/tp.py shards nn.Linear layers only and "
                              "runtime/ep.py keeps each rank's stacked experts whole, so under "
                              "tp > 1 every TP rank runs its experts on all the TP group's tokens",
        "stage_split": "autopar/runtime/apply.py: stage_blocks as planned, else the cost "
                       "model's balanced cut (autopar.cost.stages.balanced_stage_blocks)",
    })


#: torch's own mixed-precision policies with an fp32 reduction: FSDP2 ``MixedPrecisionPolicy(
#: param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`` (torch 2.13 torch/distributed/fsdp/
#: _fully_shard/_fsdp_collectives.py ``foreach_reduce``: the reduce-scatter's input and output
#: are allocated in ``reduce_dtype`` and the unsharded gradients copied in), FSDP1
#: ``MixedPrecision(reduce_dtype=torch.float32)``: 4 bytes per gradient element on the wire.
FP32_REDUCE = ("torch MixedPrecisionPolicy / MixedPrecision reduce_dtype=torch.float32: the "
               "reduce-scatter runs on fp32 buffers (torch/distributed/fsdp/_fully_shard/"
               "_fsdp_collectives.py foreach_reduce allocates its input and output in "
               "reduce_dtype): 4 bytes per element (--stack-option fp32-reduce)")


def with_fp32_reduce(profile):
    """``profile`` reducing its data-parallel gradients in fp32 (:data:`FP32_REDUCE`): the
    ``grad_reduce_bytes`` cost field set to 4, an edit that travels with a plan.

    Raises:
        InvalidTrainingConfig: as :meth:`autopar.frameworks.FrameworkProfile.with_costs`.
    """
    return profile.with_costs({"grad_reduce_bytes": FP32_REDUCE}, grad_reduce_bytes=4)


#: Source of ``zero3_split_backward`` for stacks that borrow the torch profile's capabilities
#: but run their own training loop.
_SPLIT_UNVERIFIED = (
    "not verified for this stack's own runtime: plan.apply trains ZeRO-3 under split-backward "
    "schedules only because autopar/runtime/pipeline.py ShardedGradStage gathers each FSDP "
    "chunk before torch's input/weight passes; torch's stock PipelineStage with units that "
    "reshard after forward loses those weight gradients (measured in plan.apply before that "
    "gather: tiny-llama pp 2 x dp 2, ZBV, loss 5.5563536 against 5.5556517)")


def borrowed_capabilities() -> dict:
    """The torch profile's capabilities (:func:`~autopar.frameworks.choices.capabilities_of`)
    for a stack that runs the same layouts with its own runtime: as :data:`PROFILE` but
    ``zero3_split_backward`` False, since what makes it True is plan.apply's own stage
    (:class:`autopar.runtime.pipeline.ShardedGradStage`), not verified in that stack."""
    caps = capabilities_of(PROFILE)
    return {**caps, "zero3_split_backward": False,
            "sources": {**caps["sources"], "zero3_split_backward": _SPLIT_UNVERIFIED}}
