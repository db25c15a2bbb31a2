"""``torchtitan``: torchtitan v0.2.2 (73a0e6979dd1), the last release with TOML job files
(``torchtitan/config/job_config.py``, ``train.py``, ``distributed/``, ``models/llama3/``);
``torchtitan-0.3``: torchtitan 0.3.0, its Python config release (:data:`PROFILE_03`)."""

from __future__ import annotations

from dataclasses import replace

from ...config import TORCH_SCHEDULES
from ..choices import (DTENSOR_TP, EAGER, FSDP2, FUSED_CP, SDPA_FLASH, TORCH_PIPELINING, Choices,
                       OptimizerStep, compose, with_choice)
from ..memory import TORCHTITAN_MEMORY
from ..seqrule import TORCHTITAN_03_RULE, TORCHTITAN_RULE
from ..vocabulary import FUSED_OPTIMIZER_STEP_BYTES, TORCH_OPTIMIZER_STEP_BYTES

#: FSDP2 as torchtitan applies it: fp32 gradient reduction, parameters kept gathered under PP.
SHARDED_DP = replace(
    FSDP2, name="fsdp2-torchtitan", zero3_regather_per_micro_batch=False, grad_reduce_bytes=4,
    summary="torch FSDP2 (apply_fsdp) with MixedPrecisionPolicy reduce_dtype float32",
    sources={**FSDP2.sources,
             "zero3_regather_per_micro_batch": "train.py runs the pipeline schedule "
             "(torch.distributed.pipelining: FSDP stage modules keep parameters gathered "
             "and gradients unsharded until the last micro-batch); apply_fsdp sets "
             "reshard_after_forward False under PP ('default' policy)",
             "grad_reduce_bytes": "job_config.py Training.mixed_precision_reduce = "
                                  "'float32' (FSDP MixedPrecisionPolicy reduce_dtype)"})

#: torch's fused AdamW on the fp32 FSDP shards, with clip_grad_norm_.
FUSED_ADAMW = OptimizerStep(
    name="torch-adamw-fused", summary="torch.optim.AdamW(fused=True) with clip_grad_norm_",
    optimizer_step_bytes=FUSED_OPTIMIZER_STEP_BYTES, step_fixed_s=0.0, sources={
        "optimizer_step_bytes": "job_config.py Optimizer.implementation = 'fused' "
                                "(torch's fused AdamW on fp32 FSDP shards) and "
                                "Training.max_norm = 1.0 (clip_grad_norm_): "
                                "FUSED_OPTIMIZER_STEP_BYTES",
        "step_fixed_s": TORCH_PIPELINING.sources and EAGER.sources and
        "no sourced fixed per-step cost"})

#: torchtitan before commit 6e4988550 (2025-02-24, PR #881 "use Fused AdamW as default"): the
#: ``--optimizer.fused`` flag was ``action="store_true"`` (default False; torchtitan/
#: config_manager.py at d9898423e, 2025-01) and optimizer.py built ``torch.optim.AdamW(...,
#: fused=fused, foreach=not fused)``: the foreach AdamW, with ``utils.clip_grad_norm_(...,
#: max_norm=1.0, foreach=True)`` (train.py). PR #881 itself measured the fused default 2.24%
#: faster on Llama 3 8B with FSDP, eager. Swap it in with :func:`with_foreach_adamw`.
FOREACH_ADAMW_2024 = OptimizerStep(
    name="torch-adamw-foreach-torchtitan-2024",
    summary="torch.optim.AdamW(foreach=True) with clip_grad_norm_ (torchtitan before 2025-02-24)",
    optimizer_step_bytes=TORCH_OPTIMIZER_STEP_BYTES, step_fixed_s=0.0, sources={
        "optimizer_step_bytes": "torchtitan before 6e4988550 (2025-02-24, PR #881): "
                                "config_manager.py --optimizer.fused store_true (default "
                                "False), optimizer.py AdamW(fused=fused, foreach=not fused); "
                                "train.py clip_grad_norm_(max_norm=1.0, foreach=True): "
                                "TORCH_OPTIMIZER_STEP_BYTES",
        "step_fixed_s": "no sourced fixed per-step cost"})
#: The first date (ISO) at which torchtitan's default optimizer is the fused AdamW (PR #881).
FUSED_ADAMW_SINCE = "2025-02-24"


#: The first date (ISO) from which torchtitan compiles its loss whenever compile is on
#: (bbb1b616e, 2025-04-02, PR #1033: ``components/loss.py`` ``build_cross_entropy_loss`` wraps
#: ``cross_entropy_loss`` in ``torch.compile`` when ``training.compile``; later when
#: ``compile.enable`` and "loss" in ``compile.components``, default ``["model", "loss"]``,
#: job_config.py at 1bd2548b1). Before it the compiled loss was a comment. A compiled run from
#: then on keeps the loss's memory as :func:`autopar.frameworks.stacks.with_compiled_loss` says.
COMPILED_LOSS_SINCE = "2025-04-02"
#: Where torchtitan's compiled loss is read (the ``source`` of ``with_compiled_loss``).
COMPILED_LOSS = ("torchtitan components/loss.py build_cross_entropy_loss, compiled with the "
                 "model since bbb1b616e (2025-04-02, PR #1033)")


#: The first date (ISO) from which torchtitan's Qwen3 TP plan shards the per-head query/key
#: norms over the heads (8c1d1c5fc, 2025-10-14, PR #1870 "Remove unnecessary all-gather qwen3":
#: ``"attention.q_norm"``/``"attention.k_norm"``: ``SequenceParallel(sequence_dim=2)``). Before
#: it they were ``NoParallel(use_local_output=False)`` (torchtitan/experiments/qwen3/infra/
#: parallelize.py at d66b72a6a, 2025-09-17; models/qwen3 from d880de214, 2025-10-12), whose
#: ``desired_input_layout`` is ``Replicate()``: the head-sharded DTensor from the column-parallel
#: ``wq``/``wk`` is redistributed to Replicate (an all-gather over TP) and the norm, then the
#: rotary embedding (model.py ``apply_rotary_emb`` on the norms' Replicate outputs), run on every
#: head on every rank; the attention takes its heads back as a local slice.
QK_NORM_SHARDED_SINCE = "2025-10-14"


def with_replicated_qk_norm(profile):
    """``profile`` (torchtitan) with the query/key norms replicated under TP, as torchtitan's
    Qwen3 ran them before :data:`QK_NORM_SHARDED_SINCE`: the ``eager_parts`` entry
    "tp_replicated_qk_norm" (:func:`autopar.cost.compute.layer_time` prices the norms and the
    ops between them and the attention on whole heads; :meth:`autopar.cost.blocks.BlockCosts.
    block_cost` the all-gather of the queries and keys forward and of their gradients backward).
    Changes nothing at tp 1 or for a model without per-head norms.

    Raises:
        InvalidTrainingConfig: as :meth:`autopar.frameworks.FrameworkProfile.with_costs`.
    """
    parts = tuple(dict.fromkeys((*profile.eager_parts, "tp_replicated_qk_norm")))
    return profile.with_costs(
        {"eager_parts": "torchtitan Qwen3 TP plan before 8c1d1c5fc (2025-10-14, PR #1870): "
                        "attention.q_norm / attention.k_norm as NoParallel(use_local_output="
                        "False), input redistributed to Replicate (QK_NORM_SHARDED_SINCE)"},
        eager_parts=parts)


#: The first dates (ISO) from which torchtitan's op-level selective recomputation keeps the
#: all-to-all's outputs (``torch.ops._c10d_functional.all_to_all_single.default`` in the save
#: list): DeepSeek-V3 and Llama 4 from c4e229115 (2025-09-06, PR #1672, which measured tps 708
#: -> 803 on DeepSeek-V3 16B with EP 4 from not re-running it), every model from 114151ad4
#: (2026-03-23, PR #2357: one central list). Before them, and for Qwen3 in between
#: (models/qwen3/infra/parallelize.py ``_op_sac_save_list`` at v0.2.2, 73a0e6979dd1, has no
#: all_to_all_single), the recomputed forward dispatches and combines again.
SAC_SAVES_ALLTOALL_SINCE = {"deepseek": "2025-09-06", "llama4": "2025-09-06", "*": "2026-03-23"}


def with_sac_redispatch(profile):
    """``profile`` (torchtitan) whose op-level selective recomputation re-runs the MoE
    all-to-alls (:data:`SAC_SAVES_ALLTOALL_SINCE`): the ``moe_sac_redispatch`` cost field,
    priced as full recompute's second dispatch (:meth:`autopar.cost.blocks.BlockCosts.
    block_cost`). Changes nothing without experts or expert parallelism, or under other modes.

    Raises:
        InvalidTrainingConfig: as :meth:`autopar.frameworks.FrameworkProfile.with_costs`.
    """
    return profile.with_costs(
        {"moe_sac_redispatch": "torchtitan's op-level save list without all_to_all_single "
                               "(before SAC_SAVES_ALLTOALL_SINCE; models/qwen3 at v0.2.2)"},
        moe_sac_redispatch=True)


def with_foreach_adamw(profile):
    """``profile`` (torchtitan) with the optimizer step of torchtitan before
    :data:`FUSED_ADAMW_SINCE` (:data:`FOREACH_ADAMW_2024`): a version option, not the profile's
    default (v0.2.2 runs the fused AdamW)."""
    return with_choice(profile, FOREACH_ADAMW_2024)


def with_float8nocompile(profile, source: str):
    """``profile`` with its FP8 casts run by torchao's float8nocompile prototype (eager Triton
    kernels, an amax pass then a cast per Linear operand, recast in backward:
    :data:`autopar.cost.compute.FP8_AMAX_CAST_BYTES`), the ``eager_parts`` entry
    "fp8_amax_casts"; ``source``: where the run states it. Costs only FP8 runs.

    Raises:
        InvalidTrainingConfig: as :meth:`autopar.frameworks.FrameworkProfile.with_costs`.
    """
    parts = tuple(dict.fromkeys((*profile.eager_parts, "fp8_amax_casts")))
    return profile.with_costs(
        {"eager_parts": f"{source}: torchao prototype/float8nocompile (float8nocompile_linear.py "
                        "matmul_with_args_in_hp; kernels/fp8_dynamic_tensorwise.py _amax_atomic "
                        "before each _to_fp8_* cast)"}, eager_parts=parts)


def with_chunked_loss(profile, chunks: int, source: str):
    """``profile`` with its LM head and cross-entropy run over ``chunks`` sequence chunks inside
    the loss call (:attr:`autopar.frameworks.MemoryConventions.loss_chunks`): torchtitan's
    ``ChunkedCELoss`` (torchtitan/components/loss.py, ``Config.num_chunks`` = 8 by default, at
    6b9602339 on the graph_trainer/dsv3_scaling branch), chosen per job in its config, not the
    profile's default (v0.2.2's loss runs on the whole sequence). ``source``: where the run
    states it. A memory option only.

    Raises:
        InvalidTrainingConfig: ``chunks`` not a whole number >= 0 (from
            :class:`~autopar.frameworks.MemoryConventions`).
    """
    mem = profile.memory
    return replace(profile, memory=replace(
        mem, loss_chunks=chunks, sources={
            **mem.sources, "loss_chunks": f"{source}: ChunkedCELoss over {chunks} chunks "
            "(torchtitan components/loss.py ChunkedCELoss.__call__: lm_head and "
            "cross_entropy_loss forward and backward per chunk)"}))


CHOICES = Choices(
    sharded_dp=SHARDED_DP, optimizer_step=FUSED_ADAMW, attention=SDPA_FLASH,
    fusion=replace(EAGER, sources={**EAGER.sources, "fusion": "job_config.py Compile.enable "
                                   "defaults to False (eager); the model's RMSNorm is "
                                   "torch.nn.RMSNorm"}),
    tensor_parallel=DTENSOR_TP, pipeline=TORCH_PIPELINING, context_parallel=FUSED_CP)

PROFILE = compose(
    CHOICES,
    name="torchtitan", version="torchtitan v0.2.2 (73a0e6979dd1)",
    zero_stages=(0, 2, 3), zero_stages_with_tp=(2, 3), zero_stages_with_pp=(2, 3),
    zero_stages_with_ep=(2, 3), schedules=TORCH_SCHEDULES, interleaved_chunks="any",
    stage_cuts="any", cp_modes=("ring", "allgather"),
    recompute_modes=("none", "selective-op", "full"),
    per_block_recompute=False, sequence_parallel=(True,), expert_parallel=True,
    moe_sequence_parallel=(True,), overlaps_ep_comm=("dualpipev",),
    expert_tensor_parallel="one_or_tp",
    seq_rule=TORCHTITAN_RULE,
    memory=TORCHTITAN_MEMORY,
    dispatchers=("alltoall", "deepep"),
    placements=(("tp", "cp", "dp", "pp"),),
    sources={
        "placements": "distributed/parallel_dims.py ParallelDims.build_mesh: the world mesh "
                      "as [pp, dp_replicate, dp_shard, cp, tp], outermost first, with no "
                      "option to reorder (tp innermost, then cp, dp, pp)",
        "dispatchers": "job_config.py Parallelism.expert_parallel_comm_backend 'standard' "
                       "(all-to-all, distributed/expert_parallel.py) | 'deepep' "
                       "(distributed/deepep/deepep.py; models/llama4/infra/parallelize.py "
                       "refuses it with ep = 1 or expert_tensor_parallel_degree > 1); no "
                       "all-gather dispatcher (torchtitan 0.3.0 models/common/token_dispatcher.py: "
                       "all-to-all and DeepEP dispatchers only)",
        "kv_heads_below_tp": "models/llama3/infra/parallelize.py apply_tp: wk / wv are "
                             "ColwiseParallel, so tp divides n_kv_heads",
        "per_block_reshard": "job_config.py Parallelism.fsdp_reshard_after_forward: one policy "
                             "('default', 'always', 'never') for every block",
        "zero_stages": "job_config.py Parallelism.data_parallel_replicate_degree (DDP) / "
                       "data_parallel_shard_degree with fsdp_reshard_after_forward "
                       "'always' (ZeRO-3) or 'never' (ZeRO-2); no optimizer-only sharding",
        "zero_stages_with_tp": "models/llama3/infra/parallelize.py: DDP raises 'DDP has not "
                               "supported > 1D parallelism'; FSDP/HSDP combine with TP/CP",
        "zero_stages_with_pp": "models/llama3/infra/parallelize.py ('DDP has not supported > 1D "
                               "parallelism'); apply_fsdp(pp_enabled=...)",
        "zero_stages_with_ep": "models/llama4/infra/parallelize.py: experts under FSDP (efsdp mesh)",
        "schedules": "job_config.py Parallelism.pipeline_parallel_schedule, resolved by "
                     "torch's get_schedule_class (distributed/pipeline_parallel.py): GPipe, "
                     "1F1B, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV",
        "overlaps_ep_comm": "distributed/pipeline_parallel.py build_pipeline_schedule registers "
                            "dual_pipe_v.overlap_callback for OVERLAP_F_B on ScheduleDualPipeV "
                            "when Parallelism.pipeline_parallel_expert_parallel_overlap (default "
                            "true) and ep > 1; it refuses activation checkpointing "
                            "(dual_pipe_v.get_dual_pipe_v_flag)",
        "interleaved_chunks": "job_config.py Parallelism.module_fqns_per_model_part",
        "stage_cuts": "job_config.py Parallelism.module_fqns_per_model_part",
        "cp_modes": "job_config.py Parallelism.context_parallel_rotate_method: 'alltoall' "
                    "(KV passed round the ring) or 'allgather'; no Ulysses",
        "recompute_modes": "job_config.py ActivationCheckpoint.mode: none, selective (with "
                           "selective_ac_option 'op': op-level SAC, "
                           "distributed/activation_checkpoint.py _custom_policy), full",
        "recompute_modules": "job_config.py ActivationCheckpoint: no per-submodule choice "
                             "(selective is op-level or every N-th layer)",
        "per_block_recompute": "job_config.py ActivationCheckpoint: one mode for all blocks "
                               "(selective_ac_option N = full every N-th block)",
        "vp_group_tunable": ("torch.distributed.pipelining ScheduleInterleaved1F1B sets its "
                             "own rounds (n_microbatches // max(1, n_microbatches // pp)); "
                             "job_config.py Parallelism has no group size"),
        "zero3_split_backward": ("torchtitan/distributed/fsdp.py get_fsdp_reshard_after_"
                                 "forward_policy: 'default' -> not pp_enabled, so under PP no "
                                 "unit reshards after forward, the setting under which ZeRO-3 "
                                 "with ZBV matched one process in plan.apply's runtime; the "
                                 "'always' policy was not measured"),
        "recompute_first_n": "job_config.py ActivationCheckpoint: selective_ac_option N "
                             "recomputes every N-th block, not the first N of a stage",
        "sequence_parallel": "models/llama3/infra/parallelize.py apply_tp: norms always "
                             "SequenceParallel under TP",
        "moe_sequence_parallel": "models/llama4/infra/parallelize.py apply_moe_ep_tp: the "
                                 "'moe' module's input layout is Shard(1) (sequence-sharded, "
                                 "all-gathered in, reduce-scattered out)",
        "experts_tp_sharded": "models/llama4/infra/parallelize.py apply_moe_ep_tp: the "
                              "experts are tensor-parallel over the TP mesh (etp = tp)",
        "expert_parallel": "job_config.py Parallelism.expert_parallel_degree (MoE models)",
        "expert_tensor_parallel": "job_config.py Parallelism.expert_tensor_parallel_degree "
                                  "and distributed/parallel_dims.py _validate: 'Currently we "
                                  "only support ETP=TP or ETP=1'; the sparse mesh pp x "
                                  "dp_replicate x efsdp x ep x etp with efsdp = dp_shard * cp * "
                                  "tp / (etp * ep)",
        "stage_split": "job_config.py Parallelism.module_fqns_per_model_part, else "
                       "pipeline_parallel.py generate_llm_fqn_per_model_part: costed as the cost "
                       "model's balanced cut",
    })

#: torchtitan 0.3.0 (PyPI, 2026), what changed from v0.2.2 for the layouts autopar plans. The
#: rest (FSDP2, batch arithmetic, schedules, recompute policies, the one reshard policy) reads
#: as v0.2.2's in 0.3.0's config/configs.py, trainer.py and distributed/; SP off
#: (ParallelismConfig.enable_sequence_parallel) and replicate-only beside TP
#: (models/llama3/parallelize.py always applies apply_fsdp_to_decoder) are runnable in 0.3 but
#: kept out of the profile, as the exporter writes neither.
CAPABILITIES_03 = dict(expert_tensor_parallel="one", cp_modes=("allgather",), overlaps_ep_comm=())
SOURCES_03 = {
    "expert_tensor_parallel": "torchtitan 0.3.0 (#3167) config/configs.py ParallelismConfig has "
                              "no expert_tensor_parallel_degree; distributed/parallel_dims.py "
                              "build_mesh: the sparse mesh is pp x dp_replicate x efsdp x ep with "
                              "efsdp = dp_shard * cp * tp / ep (experts never tensor-parallel)",
    "cp_modes": "torchtitan 0.3.0 models/common/attention.py ('CP all-gathers k/v') and "
                "distributed/context_parallel/api.py flex_cp_allgather (llama3's default flex "
                "attention); ParallelismConfig has no context_parallel_rotate_method",
    "placements": "torchtitan 0.3.0 distributed/parallel_dims.py ParallelDims.build_mesh "
                  "unflattens the world mesh as ('pp', 'batch', 'cp', 'tp') and ('pp', "
                  "'dp_replicate', 'dp_shard' (or 'fsdp'), 'cp', 'tp'), outermost first, with "
                  "no option to reorder (tp innermost, then cp, dp, pp)",
    "overlaps_ep_comm": "torchtitan 0.3.0 distributed/pipeline_parallel.py registers no "
                        "DualPipeV overlap callback (only experiments/graph_trainer has one)",
    "dispatchers": "torchtitan 0.3.0 models/common/config_utils.py make_token_dispatcher_config: "
                   "moe_comm_backend 'standard' (all-to-all) | 'deepep' (| 'hybridep', "
                   "'minimal_async_ep', which autopar does not price); models/common/"
                   "token_dispatcher.py has AllToAllTokenDispatcher, TorchAOTokenDispatcher "
                   "(all-to-all) and DeepEPTokenDispatcher: no all-gather dispatcher",
}

PROFILE_03 = compose(
    CHOICES,
    **{"seq_rule": TORCHTITAN_03_RULE, "memory": PROFILE.memory,
       **{k: getattr(PROFILE, k) for k in PROFILE.capability_names()},
       **CAPABILITIES_03, "sources": {**PROFILE.sources, **SOURCES_03}},
    name="torchtitan-0.3", version="torchtitan 0.3.0 (PyPI)")
