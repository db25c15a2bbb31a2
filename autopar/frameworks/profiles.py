"""What a training framework can run and what it costs: the frozen :class:`FrameworkProfile`.

The profiles themselves, one module per framework, are in :mod:`autopar.frameworks.stacks`
(:data:`autopar.frameworks.PROFILES`, :func:`autopar.frameworks.get_profile`); their cost
fields are built from named, sourced implementation choices (:mod:`autopar.frameworks.choices`).

A profile lists the parallel layouts a framework executes (ZeRO stages and what they combine
with, pipeline schedules, interleaving and stage-cut rules, context-parallel exchanges, recompute
policies, sequence and expert parallelism). The search emits only plans the target framework can
run (:meth:`FrameworkProfile.unsupported`), and the exporters read the same profile.

Every capability has its source (a file and flag of that framework) in ``sources``. The sources
were read at these commits:

- torchtitan v0.2.2 (``73a0e6979dd10b6b1904098eb3c8f62c18ab87ce``, the last release with TOML job
  files): ``torchtitan/config/job_config.py``, ``torchtitan/train.py``,
  ``torchtitan/distributed/pipeline_parallel.py``, ``torchtitan/models/llama3/``.
- Megatron-LM main at ``d98e8a64ddf34856e74b24714e3bedb2f5a39553`` (2026-08-22):
  ``megatron/training/arguments.py``, ``megatron/core/transformer/transformer_config.py``.
- DeepSpeed 0.19.6 (``edaa7221267243c7be7fb49c5d5f5c4fb97b4641``): ``deepspeed/runtime/engine.py``,
  ``deepspeed/runtime/pipe/engine.py``, ``deepspeed/runtime/pipe/schedule.py``.
- torch 2.13 ``torch.distributed`` (FSDP2 ``fully_shard``, DTensor TP,
  ``torch.distributed.pipelining``, ``torch.distributed.tensor.experimental.context_parallel``).

Besides capabilities, a profile carries the framework's **cost fields** (issue 13): which fused
attention kernel it runs per GPU generation, how far it fuses memory-bound ops, which
communication it overlaps with compute, the dtype it reduces gradients in, and a fixed cost per
step. They have defaults (:data:`COST_FIELDS`), their own sources in ``cost_sources``, and the cost
model reads them through ``TrainingConfig(framework=...)``. The field vocabularies and constants
are in :mod:`autopar.frameworks.vocabulary` (re-exported here); the physics (efficiencies, links)
stays in :class:`autopar.cost.params.CostParams` and the hardware catalog.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Mapping

from ..config import DEFAULT_PLACEMENT, SPLIT_BACKWARD, ParallelConfig
from ..errors import InvalidParallelConfig
from .checks import FieldCheck, close_names
from .fieldrules import checked_fields
from .memory import TORCH_MEMORY, MemoryConventions
from .rules import first_n_full, moe_sp
from .seqrule import SeqLenRule
# the vocabularies and constants live in .vocabulary; re-exported here, where callers import them
from .vocabulary import (CHUNK_RULES, COST_FIELDS, CP_ATTENTION_PATHS, CUT_RULES,  # noqa: F401
                         DEEPSPEED_ZERO0_GRAD_COPY_PASSES, DEEPSPEED_ZERO0_STEP_BYTES,
                         DEEPSPEED_ZERO0_STEP_HOST_OPS_PER_TENSOR,
                         DEEPSPEED_ZERO12_GRAD_COPY_PASSES, DEFAULT_COST_SOURCES, EAGER_PARTS,
                         ETP_RULES, FSDP1_GRAD_COPY_PASSES, FUSED_OPTIMIZER_STEP_BYTES,
                         FUSION_LEVELS, HOST_ISSUES,
                         MIXED_FUSED_OPTIMIZER_STEP_BYTES, MOE_CAPACITY_RULES,
                         MOE_DISPATCH_DTYPES, STAGE_SPLITS,
                         TORCH_OPTIMIZER_STEP_BYTES, ZERO1_PARAM_SYNCS, ZERO1_PARTITIONS,
                         ZERO3_GATHERS)


@dataclass(frozen=True)
class FrameworkProfile:
    """The parallel layouts one framework can run.

    Attributes:
        name: the framework's name, one of :data:`autopar.config.FRAMEWORKS`.
        version: the version (or commit) the capabilities were read from.
        zero_stages: ZeRO stages (autopar's 0-3, :class:`autopar.ParallelConfig`) it runs with
            data parallelism alone.
        zero_stages_with_tp: ZeRO stages it runs together with tensor or context parallelism.
        zero_stages_with_pp: ZeRO stages it runs together with pipeline parallelism.
        zero_stages_with_ep: ZeRO stages it runs together with expert parallelism.
        schedules: pipeline schedules (:data:`autopar.config.SCHEDULES`) it runs.
        interleaved_chunks: how interleaved model chunks may be sized (:data:`CHUNK_RULES`).
        stage_cuts: how non-interleaved pipeline stages may be cut (:data:`CUT_RULES`).
        cp_modes: context-parallel exchanges (:data:`autopar.config.CP_MODES`); empty = no CP.
        recompute_modes: activation recompute policies (:data:`autopar.config.RECOMPUTE_MODES`).
        per_block_recompute: a different policy per decoder block is expressible.
        recompute_first_n: beside one policy for all blocks, the framework's flags can
            recompute the first N blocks of every pipeline chunk fully and the others not at
            all (Megatron-LM ``--recompute-method block --recompute-num-layers N``;
            :func:`autopar.frameworks.rules.first_n_full`).
        vp_group_tunable: under interleaved 1F1B the micro-batches per model-chunk group can
            be set (Megatron-LM ``--microbatch-group-size-per-virtual-pipeline-stage``; a plan's
            :attr:`~autopar.config.ParallelConfig.vp_group`); False: the schedule picks its own.
        zero3_split_backward: ZeRO-3 (FSDP) trains correctly under the split-backward
            schedules (:data:`autopar.cost.pipeline.orders.SPLIT_BACKWARD`); False where it was
            measured not to or is not verified (stacks borrowing the torch profile's
            capabilities: :func:`autopar.frameworks.stacks.pytorch.borrowed_capabilities`).
        recompute_modules: the Megatron-Core submodules a "selective" block may recompute
            (:data:`autopar.config.RECOMPUTE_MODULES`; a plan's
            :attr:`~autopar.config.ParallelConfig.recompute_modules`); empty = only the
            attention core, "selective" as autopar always priced it.
        per_block_reshard: under FSDP (ZeRO-3), each decoder block may keep or free its gathered
            parameters between forward and backward
            (:attr:`autopar.config.ParallelConfig.reshard_after_forward`).
        sequence_parallel: the values ``sequence_parallel`` may take under tensor parallelism.
        moe_sequence_parallel: the values ``sequence_parallel`` may take under tensor
            parallelism on a model with MoE layers, as the framework's MoE layer takes
            sequence-sharded tokens (True), whole sequences (False) or either
            (:meth:`sequence_parallel_values`, :meth:`moe_sp_violation`).
        expert_parallel: expert parallelism for MoE layers is supported.
        expert_tensor_parallel: which expert-tensor-parallel degrees it runs
            (:data:`ETP_RULES`): "tp" only etp = tp with ep inside dp (no MoE parallel folding),
            "one_or_tp" etp = 1 (ep may span the TP ranks) or tp, "one" etp = 1 only (experts
            never tensor-parallel, ep over dp x cp x tp), "any" any etp with ep * etp
            dividing tp * cp * dp (:attr:`autopar.config.ParallelConfig.expert_tp`).
        experts_tp_sharded: under tp > 1 the expert matrices are split over the expert-TP ranks
            (False: each TP rank holds its experts whole and runs them on every token it holds).
            The cost model prices experts as split; an estimate of a framework that replicates
            them says its time and memory are optimistic (not yet priced as it runs).
        dispatchers: the MoE token dispatchers it runs (:data:`autopar.config.DISPATCHERS`;
            :attr:`autopar.config.ParallelConfig.dispatcher`).
        kv_heads_below_tp: tensor parallelism may exceed the KV heads (tp a multiple of them,
            each KV head's projection gathered to the tp / kv ranks that share it); False: tp
            divides the KV heads (:func:`autopar.frameworks.rules.tp_heads`).
        overlaps_ep_comm: schedules under which the framework hides expert-parallel all-to-alls
            behind the compute of another micro-batch (DualPipe-style forward-backward pairs);
            the cost model reads it (:meth:`autopar.cost.model.CostModel.estimate`).
        sources: for every capability field above (name -> text), the file and flag of the
            framework it was read from.
        seq_rule: the sequence-length divisibility it needs for CP and SP
            (:class:`~autopar.frameworks.seqrule.SeqLenRule`, which carries its own source).

    Cost fields (:data:`COST_FIELDS`, read by :class:`autopar.cost.model.CostModel`):
        attention_kernels: GPU architecture -> the fused attention kernel the framework runs there
            (a key of :data:`autopar.cost.params.ATTENTION_KERNELS`); ``"*"`` for any other.
        fusion: fusion level of memory-bound ops (:data:`FUSION_LEVELS`).
        overlap_dp_grad_reduce: the gradient reduction (or reduce-scatter) of data parallelism
            runs during backward (bucketed, as DDP / FSDP / Megatron --overlap-grad-reduce).
        zero3_gather: how ZeRO-3 gathers parameters (:data:`ZERO3_GATHERS`).
        zero3_regather_per_micro_batch: under pipeline parallelism, ZeRO-3 parameters are
            gathered (and gradients reduce-scattered) for every micro-batch; False when the
            framework keeps them unsharded across a step's micro-batches (a memory cost, not time).
        zero3_pp_root_regather: with ``zero3_regather_per_micro_batch`` False, the rank's
            layers outside the blocks (embedding, final norm, head) are still resharded after
            every forward: each micro-batch gathers them again over the ZeRO group (one more
            all-gather of them per micro-batch), and the compute waits on each gather (no
            compute beside it: exposed whole).
        zero3_pp_reduce_after_flush: with ``zero3_regather_per_micro_batch`` False, the step's
            gradient reduce-scatters are issued after the pipeline's last operation, with no
            compute left beside them (exposed whole), instead of behind the last backward.
        overlap_tp_comm: tensor-parallel collectives overlap the GEMMs beside them (userbuffers
            ring exchange, Transformer Engine ``tp_comm_overlap``; or async TP).
        overlap_pp_p2p: the schedules (of :data:`autopar.config.SCHEDULES`) under which
            pipeline sends/receives run beside compute rather than blocking it; () for none.
        grad_reduce_bytes: bytes per gradient element in the data-parallel reduction; None = the
            cost model's :attr:`~autopar.cost.params.CostParams.grad_bytes`.
        grad_reduce_fp16_in_fp16: ``grad_reduce_bytes`` is the framework's bf16 rule only:
            under precision "fp16" the reduction runs in fp16 (Megatron-LM turns
            ``accumulate_allreduce_grads_in_fp32`` on for ``--bf16`` alone).
        step_fixed_s: a sourced fixed cost per optimizer step (seconds); 0 when none is sourced.
        zero1_param_sync: how ZeRO-1 returns updated parameters (:data:`ZERO1_PARAM_SYNCS`).
        zero1_group_size: ZeRO-1 shards over at most this many data-parallel ranks (e.g.
            InternEvo ``parallel.zero1=8``: within a node); None = the whole data-parallel group.
        zero1_grad_all_reduce: ZeRO-1 all-reduces the full gradients (each rank then keeps its
            shard) instead of reduce-scattering them: twice the volume on the wire.
        zero1_partition: how ZeRO-1 splits the parameters over its group
            (:data:`ZERO1_PARTITIONS`): the optimizer step runs on the largest share, and a
            ``broadcast`` parameter sync issues one broadcast per rank that holds a share.
        sync_grad_bucket_elements: when > 0 (and ``overlap_dp_grad_reduce``), ZeRO-0/1
            gradients are reduced in buckets of at most this many elements, one in flight:
            each bucket is launched after a device-wide synchronize, so it hides only behind
            the backward compute until the next launch, and the last bucket is reduced after
            backward (:func:`autopar.cost.buckets.bucketed_exposed_s`); 0 = the
            reduction overlaps backward as a whole.
        cp_attention: CP mode -> how a rank runs attention under it (:data:`CP_ATTENTION_PATHS`:
            "fused" kernel, "masked" = SDPA with an explicit mask (memory-efficient kernel, all
            pairs), "unfused" = plain tensor ops); a mode not listed runs "fused".
        ulysses_kv_repeat: under Ulysses CP the framework repeats the KV heads to the query
            head count (heads / kv heads copies of each, Hugging Face ``repeat_kv``) before the
            all-to-all: tp * cp need divide only the query heads
            (:func:`autopar.frameworks.rules.ulysses_heads`), and K and V cross the all-to-all
            and reach the attention kernel at the query heads' width
            (:func:`autopar.cost.comm.cp_layer_comm`); False: at their own head count.
        optimizer_step_bytes: HBM bytes per optimizer-held parameter of one optimizer step
            (the optimizer's passes and gradient clipping), costed at the HBM bandwidth on the
            parameters of the rank's ZeRO shard (:data:`TORCH_OPTIMIZER_STEP_BYTES`,
            :data:`FUSED_OPTIMIZER_STEP_BYTES`).
        eager_parts: parts of a block run as eager ops in an otherwise fused stack
            (:data:`EAGER_PARTS`).
        tp_mlp_reduce_per_linear: under tensor parallelism, each column-parallel linear of the
            MLP is a module that reduces its own input gradient in backward, so a gated MLP's
            separate gate and up projections reduce the MLP input twice instead of once
            (:func:`autopar.cost.comm.mlp_linear_reductions`); the attention's projections
            still reduce their shared input once.
        zero_grad_copy_passes: under ZeRO-2/3, passes (reads + writes) over each parameter's
            compute-dtype gradient that the sharded-DP implementation adds to every backward on
            the compute stream (:data:`FSDP1_GRAD_COPY_PASSES`); 0 for none.
        fsdp2_copies: under ZeRO-2/3 the framework shards with FSDP2 (``fully_shard``), which
            copies on the compute stream around every collective: after each all-gather the
            gathered flat buffer into the unsharded parameters (read and write the gathered
            dtype, :func:`~torch.distributed.fsdp` ``foreach_all_gather_copy_out``), before
            each reduce-scatter the unsharded gradients into one buffer of the reduce dtype
            (read the gradient dtype, write the reduce dtype, ``foreach_reduce_scatter_copy_in``);
            costed at the HBM bandwidth on the rank's parameters, per gather and per
            reduce-scatter of the step. False for FSDP1 (gathers into its flat parameter in
            place) and DeepSpeed ZeRO.
        zero2_grad_all_reduce: under ZeRO-2 each gradient bucket is all-reduced over the
            data-parallel group and every rank keeps its own slice (DeepSpeed
            ``use_multi_rank_bucket_allreduce``), instead of reduce-scattered: twice the volume
            on the wire, every micro-batch.
        zero2_reduce_per_step: under ZeRO-2 with several micro-batches per step, each rank
            accumulates its unsharded gradients (in the reduce dtype) over the step's
            micro-batches and reduce-scatters them once, after the last backward (memory pays
            the unsharded gradients, at ``grad_reduce_bytes`` per element), instead of
            reduce-scattering every micro-batch; the parameters are gathered once either way.
        zero12_grad_copy_passes: under ZeRO-1/2, passes (reads + writes) over each parameter's
            compute-dtype gradient that the implementation adds to every gradient reduction on
            the compute stream (every micro-batch under ZeRO-2, once per step under ZeRO-1;
            :data:`DEEPSPEED_ZERO12_GRAD_COPY_PASSES`); 0 for none.
        zero0_grad_copy_passes: under ZeRO-0 with data parallelism, passes (reads + writes)
            over each parameter's compute-dtype gradient that the implementation adds to the
            step's gradient reduction on the compute stream, once per step
            (:data:`DEEPSPEED_ZERO0_GRAD_COPY_PASSES`); 0 for none.
        zero0_step_bytes: under ZeRO-0, HBM bytes per parameter that the mixed-precision
            wrapper adds to the optimizer step beyond ``optimizer_step_bytes``
            (:data:`DEEPSPEED_ZERO0_STEP_BYTES`); 0 for none.
        zero0_step_host_ops_per_tensor: under ZeRO-0, host-issued ops per gradient tensor of a
            check at the step that reads each tensor's result back to the host: the host waits
            on every tensor, so their issue time (times the host's seconds per op) is exposed
            (:data:`DEEPSPEED_ZERO0_STEP_HOST_OPS_PER_TENSOR`); 0 for none.
        zero1_step_bytes, zero1_step_host_ops_per_tensor: the same two under ZeRO-1, over
            every gradient tensor of the rank's model (not its partition): a step that checks
            and measures the whole gradient before updating its shard
            (:data:`DEEPSPEED_030_ZERO1_STEP_BYTES`,
            :data:`DEEPSPEED_030_ZERO1_STEP_HOST_OPS_PER_TENSOR`); 0 for none.
        zero3_persistent_elements: under ZeRO-3 gathered per parameter, parameter tensors of
            at most this many elements stay whole on every rank and are never gathered
            (:data:`DEEPSPEED_ZERO3_PERSISTENCE_THRESHOLD`); 0: every tensor is gathered.
        zero3_reduce_bucket_elements: under ZeRO-3 gathered per parameter, gradients are
            reduce-scattered in buckets of this many elements, one collective per bucket
            (:data:`DEEPSPEED_ZERO3_REDUCE_BUCKET_ELEMENTS`); 0: one per gathered tensor.
        host_issue: how the host issues a micro-batch's kernels (:data:`HOST_ISSUES`):
            ``per_kernel`` charges each rank's micro-batch at least its kernel count times the
            host's time per op (:mod:`autopar.cost.host`); ``cuda_graph`` charges none.
        host_op_s_published: seconds of host time per counted kernel this stack's own module
            code takes, inverted from published step times of host-bound runs (not a
            measurement of host time; 0 = none published). Priced where it exceeds the
            measured dispatch rate (:attr:`autopar.cost.context.CostInputs.kernel_host_s`);
            an estimate whose exposed host time reaches 10% of the step says so
            (:func:`autopar.cost.notes.host_bound_notes`).
        moe_dispatch_dtype: the format MoE tokens travel in along the dispatch direction
            (:data:`MOE_DISPATCH_DTYPES`): the forward dispatch and the backward dispatch of the
            combine's gradient; ``fp8_1x128`` moves FP8 with per-tile scales there under
            precision ``"fp8"`` (:func:`autopar.cost.dispatch.dispatch_bytes_ratio`). The
            combines move the activation dtype. Time only: no buffer is priced in memory.
        moe_tp_token_alltoall: under TP > 1 the all-to-all dispatcher first turns each TP
            rank's sequence shard of the tokens into all of the TP group's tokens with 1/tp of
            the hidden size (an all-to-all over TP), and back after the combine, and gathers the
            router's logits over TP (Megatron-Core's dispatcher of 2024-03-27 to 2024-09-10:
            :data:`autopar.frameworks.stacks.megatron.ALLTOALL_SEQ_2024`); priced by
            :meth:`autopar.cost.blocks.BlockCosts.block_cost`. Time only.
        moe_dispatch_sync_ops: under expert parallelism the all-to-all dispatcher reads the
            token counts back to the host with blocking copies before its all-to-all, so the
            stream drains and the GPU waits while the host issues the ops that follow them up
            to the all-to-all: this many per MoE layer's forward (two more under
            ``moe_tp_token_alltoall`` with TP > 1: the sp2hp cat and all-to-all), each at
            :attr:`autopar.cost.params.CostParams.host_op_s`, plus the all-gather of the
            counts over EP that runs between the reads; 0: not priced
            (:meth:`autopar.cost.blocks.BlockCosts.dispatch_sync_s`). Time only.
        moe_probs_alltoall: under expert parallelism the all-to-all dispatcher sends each routed
            row's router probability in an all-to-all of its own after the tokens' (one
            element per row, the activation dtype), and its gradient back in backward
            (Megatron-Core since 2659630721, core 0.13:
            :data:`autopar.frameworks.stacks.megatron.MEGATRON_ALLTOALL_DISPATCH`); priced by
            :meth:`autopar.cost.moe_block.MoEBlockCosts.alltoall_metadata_s`. Time only.
        moe_counts_gather: under expert parallelism the all-to-all dispatcher all-gathers
            each rank's per-expert token counts (int64) over the expert-TP x EP group in
            forward, on the compute stream, before the permutation; priced with
            ``moe_probs_alltoall``. Time only.
        moe_sac_redispatch: under op-level selective recomputation ("selective-op") the
            framework's save list lacks the all-to-all, so a recomputed MoE layer dispatches
            and combines its tokens again in backward, as under full recompute (priced by
            :meth:`autopar.cost.blocks.BlockCosts.block_cost`). Time only.
        moe_capacity_rule: how the MoE layer sizes each expert's input
            (:data:`MOE_CAPACITY_RULES`): ``megatron`` runs the routed rows (dropless) or caps
            them at a capacity; ``deepspeed`` runs a padded buffer per expert, of the busiest
            expert's count when dropless (priced by :func:`autopar.cost.capacity.routed_scale`).
        stage_split: where an even split of the decoder blocks over pipeline stages puts the
            remainder when the plan gives no cut (:data:`STAGE_SPLITS`,
            :meth:`split_stages`).
        placements: the rank orders the framework builds its device mesh in, each innermost
            first over all of :data:`autopar.config.MESH_DIMS` (the convention of
            :attr:`autopar.config.ParallelConfig.placement`); only the dimensions of degree
            > 1 decide, so orders that differ in where degree-1 dimensions sit are one. ``()``:
            any order (the framework lays the mesh out as the plan says, as ``plan.apply``
            does). The search tries only these (:func:`autopar.search.space.placements`) and
            :meth:`unsupported` refuses others (:meth:`placement_violation`).
        cost_sources: cost field name -> its source (every cost field has one).

    Raises:
        InvalidTrainingConfig: at construction (also through ``dataclasses.replace`` and
            :meth:`with_costs`), one error naming every problem, each with the field, its value,
            the rule and a fix (:class:`~autopar.frameworks.checks.FieldCheck`): a name outside
            autopar's vocabulary (:mod:`autopar.config`, the rule tuples of this module;
            ``attention_kernels`` values from :data:`autopar.config.ATTENTION_KERNELS`), a
            bool field that is not a ``bool``, a number that is not finite or out of its range
            (``step_fixed_s`` >= 0 s; ``optimizer_step_bytes`` >= 1, ``zero1_group_size`` >= 1
            or None, ``sync_grad_bucket_elements``, ``zero_grad_copy_passes``,
            ``zero12_grad_copy_passes`` and the three ``zero0_*`` counts >= 0, whole
            numbers; ``grad_reduce_bytes`` None, 1, 2 or 4), a capability or cost field without
            a source, a source for no field. Lists given for tuple fields become tuples.
    """

    name: str
    version: str
    zero_stages: tuple[int, ...]
    zero_stages_with_tp: tuple[int, ...]
    zero_stages_with_pp: tuple[int, ...]
    zero_stages_with_ep: tuple[int, ...]
    schedules: tuple[str, ...]
    interleaved_chunks: str
    stage_cuts: str
    cp_modes: tuple[str, ...]
    recompute_modes: tuple[str, ...]
    per_block_recompute: bool
    sequence_parallel: tuple[bool, ...]
    expert_parallel: bool
    overlaps_ep_comm: tuple[str, ...] = ()
    dispatchers: tuple[str, ...] = ("alltoall",)
    kv_heads_below_tp: bool = False
    moe_sequence_parallel: tuple[bool, ...] = (True, False)
    per_block_reshard: bool = False
    expert_tensor_parallel: str = "tp"
    experts_tp_sharded: bool = True
    stage_split: str = "middle"
    recompute_modules: tuple[str, ...] = ()
    placements: tuple[tuple[str, ...], ...] = ()
    recompute_first_n: bool = False
    vp_group_tunable: bool = False
    zero3_split_backward: bool = True
    sources: Mapping[str, str] = field(default_factory=dict)
    # -- sequence-length divisibility for CP and SP (issue 13); sourced inside the rule --------
    seq_rule: SeqLenRule = SeqLenRule()
    # -- cost fields (issue 13): defaults are plain PyTorch's; each profile sources its own ---
    attention_kernels: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({"*": "fa2"}))
    fusion: str = "eager"
    overlap_dp_grad_reduce: bool = True
    zero3_gather: str = "per_block"
    zero3_regather_per_micro_batch: bool = True
    zero3_pp_root_regather: bool = False
    zero3_pp_reduce_after_flush: bool = False
    overlap_tp_comm: bool = False
    overlap_pp_p2p: tuple[str, ...] = ()
    grad_reduce_bytes: int | None = None
    grad_reduce_fp16_in_fp16: bool = False
    step_fixed_s: float = 0.0
    zero1_param_sync: str = "all_gather"
    zero1_group_size: int | None = None
    zero1_grad_all_reduce: bool = False
    zero1_partition: str = "flat"
    sync_grad_bucket_elements: int = 0
    cp_attention: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    optimizer_step_bytes: int = TORCH_OPTIMIZER_STEP_BYTES
    eager_parts: tuple[str, ...] = ()
    zero_grad_copy_passes: int = 0
    fsdp2_copies: bool = True
    tp_mlp_reduce_per_linear: bool = False
    zero2_grad_all_reduce: bool = False
    zero2_reduce_per_step: bool = False
    zero12_grad_copy_passes: int = 0
    host_issue: str = "per_kernel"
    host_op_s_published: float = 0.0
    zero0_grad_copy_passes: int = 0
    zero0_step_bytes: int = 0
    zero0_step_host_ops_per_tensor: int = 0
    zero1_step_bytes: int = 0
    zero1_step_host_ops_per_tensor: int = 0
    zero3_persistent_elements: int = 0
    zero3_reduce_bucket_elements: int = 0
    moe_dispatch_dtype: str = "activation"
    moe_tp_token_alltoall: bool = False
    moe_dispatch_sync_ops: int = 0
    moe_probs_alltoall: bool = False
    moe_counts_gather: bool = False
    moe_sac_redispatch: bool = False
    moe_capacity_rule: str = "megatron"
    ulysses_kv_repeat: bool = False
    cost_sources: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_COST_SOURCES))
    #: memory conventions (bytes per state, optimizer temporaries, what PP keeps unsharded...),
    #: sourced inside :class:`autopar.frameworks.memory.MemoryConventions`
    memory: MemoryConventions = field(default_factory=lambda: TORCH_MEMORY)

    def __post_init__(self) -> None:
        check = FieldCheck(f"framework profile {self.name!r}")
        values = checked_fields({f.name: getattr(self, f.name) for f in fields(self)}, check,
                                "cost_sources={{..., '{field}': 'where this value comes "
                                "from'}}", self.capability_names())
        check.raise_if_any()
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __hash__(self) -> int:
        return hash((self.name, self.version, tuple(sorted(self.attention_kernels.items())),
                     self.fusion, self.overlap_dp_grad_reduce, self.zero3_gather,
                     self.zero3_regather_per_micro_batch, self.zero3_pp_root_regather,
                     self.zero3_pp_reduce_after_flush, self.overlap_tp_comm,
                     self.overlap_pp_p2p, self.grad_reduce_bytes, self.grad_reduce_fp16_in_fp16,
                     self.step_fixed_s,
                     self.zero1_param_sync, self.zero1_group_size, self.zero1_grad_all_reduce,
                     tuple(sorted(self.cp_attention.items())), self.optimizer_step_bytes,
                     tuple(sorted(self.eager_parts)), self.zero_grad_copy_passes,
                     self.zero1_partition, self.sync_grad_bucket_elements,
                     self.fsdp2_copies, self.tp_mlp_reduce_per_linear,
                     self.zero2_grad_all_reduce, self.zero2_reduce_per_step,
                     self.zero12_grad_copy_passes,
                     self.host_issue, self.host_op_s_published,
                     self.zero0_grad_copy_passes, self.zero0_step_bytes,
                     self.zero0_step_host_ops_per_tensor, self.zero1_step_bytes,
                     self.zero1_step_host_ops_per_tensor, self.zero3_persistent_elements,
                     self.zero3_reduce_bucket_elements, self.moe_dispatch_dtype,
                     self.moe_tp_token_alltoall, self.moe_dispatch_sync_ops,
                     self.moe_probs_alltoall, self.moe_counts_gather,
                     self.moe_sac_redispatch, self.moe_capacity_rule,
                     self.ulysses_kv_repeat))

    @classmethod
    def capability_names(cls) -> tuple[str, ...]:
        """Names of the capability fields (every field but name, version, sources and the cost
        fields of :data:`COST_FIELDS`)."""
        return tuple(f.name for f in fields(cls) if f.name not in (
            "name", "version", "sources", "cost_sources", "seq_rule", "memory") + COST_FIELDS)

    def placement_violation(self, c: ParallelConfig) -> str | None:
        """Why this framework cannot lay ``c``'s ranks out in its placement (None: the
        default :data:`autopar.config.DEFAULT_PLACEMENT`), with the rule's source and a fix, or
        None when it can (``placements`` empty, or the order of ``c``'s dimensions of degree
        > 1, an open degree counted as > 1, is one of ``placements``)."""
        if not self.placements:
            return None
        want = tuple(c.placement or DEFAULT_PLACEMENT)

        def real(order):
            return tuple(d for d in order if getattr(c, d) is None or getattr(c, d) > 1)

        if any(real(order) == real(want) for order in self.placements):
            return None
        orders = " or ".join("-".join(o) for o in self.placements)
        return (f"{self.name} builds its device mesh only in the rank order {orders} "
                f"(innermost first; {self._src('placements')}), not placement "
                f"{'-'.join(want)} (its {'-'.join(real(want))} over the dimensions of degree "
                f"> 1); fix: placement={self.placements[0]!r} (--placement "
                f"{','.join(self.placements[0])}), or leave placement unset")

    def attention_kernel(self, architecture: str) -> str:
        """The fused attention kernel this framework runs on ``architecture`` (the ``"*"`` entry
        when the architecture has none of its own)."""
        return self.attention_kernels.get(architecture, self.attention_kernels["*"])

    def split_stages(self, num_blocks: int, pp: int, virtual_stages: int | None = 1
                     ) -> tuple[int, ...] | None:
        """Decoder blocks per pipeline stage as this framework cuts them when no cut is given,
        or None where that is the cost model's own balanced cut (``stage_split`` "middle",
        interleaved chunks, or pp = 1). ``last``: every stage ``num_blocks // pp`` blocks, the
        last ``num_blocks % pp`` stages one more (source in ``sources["stage_split"]``).

        Raises:
            InvalidParallelConfig: fewer blocks than stages.
        """
        if self.stage_split == "middle" or pp == 1 or virtual_stages not in (None, 1):
            return None
        base, extra = divmod(num_blocks, pp)
        if base == 0:
            raise InvalidParallelConfig(
                f"{num_blocks} decoder blocks cannot fill {pp} pipeline stages under "
                f"{self.name} ({self._src('stage_split')}). Fix: use pp <= {num_blocks}.")
        return tuple(base + (p >= pp - extra) for p in range(pp))

    def with_costs(self, sources: Mapping[str, str], **changes) -> "FrameworkProfile":
        """A copy with cost fields changed, each change with its source (``sources``: field ->
        text), e.g. a framework version or recipe that differs from the profile's defaults.

        A list given for a tuple field (``overlap_pp_p2p``, ``eager_parts``) becomes a tuple;
        the changed values are checked as at construction.

        Raises:
            InvalidTrainingConfig: one error naming every problem, each with its fix: a change
                that is not a cost field (capabilities change with ``dataclasses.replace`` and
                their source in ``sources``), a change without a source, a source keyed by a
                name that is not a cost field, a value that breaks its field's rule (see the
                class's Raises).
        """
        check = FieldCheck(f"framework profile {self.name!r}")
        if not isinstance(sources, Mapping):
            check.add(f"sources={sources!r}: must be a mapping cost field -> where its value "
                      "comes from; fix: e.g. with_costs({'fusion': 'the recipe flag that sets "
                      "it'}, fusion='fused')")
            sources = {}
        own = {f.name for f in fields(self)}
        for k in changes:
            if k in self.capability_names():
                check.add(f"{k} is a capability, not a cost field; fix: dataclasses.replace("
                          f"profile, {k}=..., sources={{**profile.sources, {k!r}: 'the "
                          "framework file and flag it was read from'})")
            elif k in own and k not in COST_FIELDS:
                check.add(f"{k} is not a cost field; fix: dataclasses.replace(profile, {k}=...)")
            elif k not in COST_FIELDS:
                check.add(f"{k} is not a field of FrameworkProfile"
                          f"{close_names(k, COST_FIELDS)}; fix: change only cost fields "
                          f"({', '.join(COST_FIELDS)})")
        for k in sources:
            if k not in COST_FIELDS and k not in changes:
                check.add(f"sources has {k!r}, which is not a cost field"
                          f"{close_names(k, COST_FIELDS)}; fix: key each source by the cost "
                          "field it sources")
        known = {k: v for k, v in changes.items() if k in COST_FIELDS}
        for k, v in known.items():
            src = sources.get(k)
            if not isinstance(src, str) or not src.strip():
                check.add(f"{k} needs a source: with_costs({{{k!r}: 'where this value comes "
                          f"from'}}, {k}={v!r})")
        merged = {**self.cost_sources, **{k: s for k, s in sources.items() if k in COST_FIELDS
                                          and isinstance(s, str) and s.strip()}}
        checked_fields({**{f.name: getattr(self, f.name) for f in fields(self)}, **known,
                        "cost_sources": merged}, check, "", self.capability_names())
        check.raise_if_any()
        return replace(self, cost_sources=merged, **known)

    def seq_violation(self, seq_len: int, tp: int, cp: int, sequence_parallel: bool) -> str | None:
        """Why this framework cannot cut sequences of ``seq_len`` tokens over tp x cp with
        ``sequence_parallel`` (the rule, its source and a fix), or None when it can
        (:meth:`SeqLenRule.violation`)."""
        return self.seq_rule.violation(self.name, seq_len, tp, cp, sequence_parallel,
                                       sp_optional=False in self.sequence_parallel)

    def sequence_parallel_values(self, moe: bool = False) -> tuple[bool, ...]:
        """The values ``sequence_parallel`` may take under tensor parallelism, in the order the
        search tries them; on a model with MoE layers (``moe``) only those its MoE layers take
        too (:attr:`moe_sequence_parallel`); () when none."""
        return tuple(v for v in self.sequence_parallel
                     if not moe or v in self.moe_sequence_parallel)

    def moe_sp_violation(self, tp: int, sequence_parallel: bool) -> str | None:
        """Why this framework's MoE layers cannot run under tp with ``sequence_parallel`` (the
        rule, its source and a fix), or None when they can. The one place of the rule: the
        search (:meth:`sequence_parallel_values`) and :meth:`unsupported` read it; the rule is
        :func:`autopar.frameworks.rules.moe_sp`."""
        v = moe_sp(self, tp, sequence_parallel)
        return None if v is None else f"{v.problem}; fix: {v.fix}"

    def zero_options(self, tp: int, pp: int, cp: int, ep: int) -> tuple[int, ...]:
        """ZeRO stages this framework runs on a mesh with these degrees, ascending."""
        allowed = set(self.zero_stages)
        if tp > 1 or cp > 1:
            allowed &= set(self.zero_stages_with_tp)
        if pp > 1:
            allowed &= set(self.zero_stages_with_pp)
        if ep > 1:
            allowed &= set(self.zero_stages_with_ep)
        return tuple(sorted(allowed))

    def unsupported(self, c: ParallelConfig, moe: bool = False) -> str | None:
        """Why this framework cannot run ``c`` (on a model with MoE layers when ``moe``), or
        None when it can.

        ``c`` may have ``None`` fields (choices left open); only the chosen ones are checked.
        Stage cuts are checked against the rule when ``c.stage_blocks`` is set.
        """
        fw = self.name
        shares_weights = c.dp is None or c.dp * c.cp > 1   # ZeRO means nothing on one replica
        if shares_weights and c.zero_stage not in self.zero_options(c.tp, c.pp, c.cp, c.ep):
            if c.zero_stage not in self.zero_stages:   # on no mesh: cite that, not a degree
                return (f"{fw} does not run ZeRO-{c.zero_stage} (it runs "
                        f"{list(self.zero_stages)}; {self._src('zero_stages')})")
            # the first degree whose capability refuses the stage, and that capability's source
            refusing = next(name for name, on in (
                ("zero_stages_with_tp", c.tp > 1 or c.cp > 1), ("zero_stages_with_pp", c.pp > 1),
                ("zero_stages_with_ep", c.ep > 1)) if on and c.zero_stage not in getattr(self, name))
            return (f"{fw} does not run ZeRO-{c.zero_stage} with tp={c.tp}, pp={c.pp}, cp={c.cp}, "
                    f"ep={c.ep} (it runs {list(self.zero_options(c.tp, c.pp, c.cp, c.ep))}; "
                    f"{self._src(refusing)})")
        if c.cp > 1 and c.cp_mode not in self.cp_modes:
            return (f"{fw} has no context-parallel mode {c.cp_mode!r} (it has "
                    f"{list(self.cp_modes) or 'no context parallelism'}; {self._src('cp_modes')})")
        if (why := self.placement_violation(c)) is not None:
            return why
        if c.ep > 1 and not self.expert_parallel:
            return f"{fw} has no expert parallelism ({self._src('expert_parallel')})"
        if c.dispatcher not in self.dispatchers:
            return (f"{fw} has no {c.dispatcher!r} token dispatcher (it runs "
                    f"{list(self.dispatchers)}; {self._src('dispatchers')}). Fix: "
                    f"dispatcher={self.dispatchers[0]!r}")
        rule = self.expert_tensor_parallel
        if (c.ep > 1 or moe) and rule == "one" and c.etp != 1:
            return (f"{fw} has no expert tensor parallelism (expert_tp 1 only), not "
                    f"expert_tp={c.etp} ({self._src('expert_tensor_parallel')})")
        if c.folded and (rule == "tp" or rule == "one_or_tp" and c.etp != 1):
            return (f"{fw} runs expert tensor parallelism "
                    f"{'equal to tp only' if rule == 'tp' else 'of 1 or tp only'}, not "
                    f"expert_tp={c.etp} beside tp={c.tp} "
                    f"({self._src('expert_tensor_parallel')})")
        if c.tp > 1 and c.sequence_parallel not in self.sequence_parallel:
            return (f"{fw} runs tensor parallelism only with sequence_parallel="
                    f"{self.sequence_parallel[0]} ({self._src('sequence_parallel')})")
        if moe and c.tp > 1 and (why := self.moe_sp_violation(c.tp, c.sequence_parallel)):
            return why
        modes = (c.recompute,) if isinstance(c.recompute, str) else tuple(c.recompute)
        if not set(modes) <= set(self.recompute_modes):
            return (f"{fw} has no recompute policy {sorted(set(modes) - set(self.recompute_modes))}"
                    f" (it has {list(self.recompute_modes)}; {self._src('recompute_modes')})")
        if c.recompute_modules is not None and not set(c.recompute_modules) <= set(
                self.recompute_modules):
            return (f"{fw} does not recompute the modules "
                    f"{sorted(set(c.recompute_modules) - set(self.recompute_modules))} (it "
                    f"recomputes {list(self.recompute_modules) or 'the attention core only'} "
                    f"under 'selective'; {self._src('recompute_modules')})")
        if len(set(modes)) > 1 and not self.per_block_recompute and not (
                self.recompute_first_n and first_n_full(modes, c.stage_blocks) is not None):
            return (f"{fw} sets one recompute policy for all blocks "
                    f"({self._src('per_block_recompute')})")
        if c.reshard_after_forward is not None and not self.per_block_reshard:
            return (f"{fw} sets one FSDP reshard-after-forward policy for all blocks "
                    f"({self._src('per_block_reshard')})")
        v = c.virtual_stages or 1
        if c.vp_group is not None and not self.vp_group_tunable:
            return (f"{fw} sets the micro-batch groups of its interleaved schedule itself, not "
                    f"vp_group={c.vp_group} ({self._src('vp_group_tunable')}). Fix: "
                    "vp_group=None")
        if c.pp > 1:
            schedule = c.schedule or ("interleaved-1f1b" if v > 1 else None)
            if schedule is not None and schedule not in self.schedules:
                return (f"{fw} has no {schedule} schedule (it runs {list(self.schedules)}; "
                        f"{self._src('schedules')})")
            if c.zero_stage == 3 and schedule in SPLIT_BACKWARD and not self.zero3_split_backward:
                return (f"{fw} is not known to train ZeRO-3 correctly under {schedule} "
                        f"({self._src('zero3_split_backward')})")
            if v > 1 and self.interleaved_chunks == "none":
                return f"{fw} has no interleaved schedule ({self._src('interleaved_chunks')})"
            blocks = c.stage_blocks
            if blocks and v > 1 and self.interleaved_chunks == "equal" and len(set(blocks)) > 1:
                return (f"{fw} gives every interleaved chunk the same layers; cuts {blocks} "
                        f"differ ({self._src('interleaved_chunks')})")
            if blocks and v == 1:
                why = _cut_violation(self.stage_cuts, blocks)
                if why:
                    return f"{fw} {why} ({self._src('stage_cuts')})"
        return None

    def _src(self, name: str) -> str:
        return self.sources[name]


def _cut_violation(rule: str, blocks: tuple[int, ...]) -> str | None:
    if rule == "first_last" and len(set(blocks[1:-1])) > 1:
        return f"sets only the first and last stage's layers; middle stages of {blocks} differ"
    if rule == "balanced" and max(blocks) - min(blocks) > 1:
        return f"cuts stages only evenly; {blocks} is not balanced"
    return None
