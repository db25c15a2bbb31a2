"""What each training framework can run: one frozen :class:`FrameworkProfile` per framework.

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
model reads them through ``TrainingConfig(framework=...)``; the physics (efficiencies, links)
stays in :class:`autopar.cost.params.CostParams` and the hardware catalog.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Mapping

from ..config import (ARCHITECTURES, ATTENTION_KERNELS, CP_MODES, FRAMEWORKS, RECOMPUTE_MODES,
                      SCHEDULES, ParallelConfig)
from ..errors import InvalidTrainingConfig
from .checks import FieldCheck, close_names
from .memory import (DEEPSPEED_MEMORY, MEGATRON_MEMORY, TORCH_MEMORY, TORCHTITAN_MEMORY,
                     MemoryConventions)
from .rules import moe_sp
from .seqrule import DEEPSPEED_RULE, MEGATRON_RULE, TORCHTITAN_RULE, SeqLenRule

#: Stage-cut rules, most permissive first: any cut; only the first and last stage may differ
#: from the rest; balanced only (layer counts differ by at most one).
CUT_RULES = ("any", "first_last", "balanced")
#: Interleaved-chunk rules: any chunk sizes; all chunks equal; no interleaving.
CHUNK_RULES = ("any", "equal", "none")
#: Expert-tensor-parallel rules (:attr:`FrameworkProfile.expert_tensor_parallel`): etp = tp only;
#: etp = 1 or tp; any etp with ep * etp dividing tp * cp * dp (MoE parallel folding).
ETP_RULES = ("tp", "one_or_tp", "any")
#: Fusion levels of memory-bound (element-wise, norm) ops: ``eager`` = one kernel per PyTorch op
#: as the model's Python writes it (norms in the model's own ops); ``compile`` = TorchInductor
#: fuses each chain of consecutive point-wise ops into one kernel (Ansel et al. 2024, PyTorch 2,
#: section 4: "pointwise and reduction fusion"); ``fused`` = hand-fused kernels (Apex / Transformer
#: Engine fused norms, bias-GeLU, bias-dropout-add), costed as the graph counts them (fused norm).
FUSION_LEVELS = ("eager", "compile", "fused")
#: How ZeRO-3 / FSDP gathers parameters: ``per_block`` (FSDP / FSDP2: one all-gather per wrapped
#: block, the next block's prefetched while this one computes) or ``per_parameter`` (DeepSpeed
#: ZeRO-3: per-parameter gathers through small prefetch buckets with stream synchronisation,
#: costed as not overlapped).
ZERO3_GATHERS = ("per_block", "per_parameter")
#: How a context-parallel rank runs attention (:attr:`FrameworkProfile.cp_attention`; costed
#: by :func:`autopar.cost.compute.layer_time`).
CP_ATTENTION_PATHS = ("fused", "masked", "unfused")
#: Names of the cost fields (defaults in :class:`FrameworkProfile`; sources in ``cost_sources``).
COST_FIELDS = ("attention_kernels", "fusion", "overlap_dp_grad_reduce", "zero3_gather",
               "zero3_regather_per_micro_batch", "overlap_tp_comm", "overlap_pp_p2p",
               "grad_reduce_bytes", "step_fixed_s", "zero1_param_sync", "zero1_group_size",
               "zero1_grad_all_reduce", "cp_attention", "optimizer_step_bytes", "eager_parts",
               "zero_grad_copy_passes", "zero1_partition", "sync_grad_bucket_elements",
               "fsdp2_copies", "tp_mlp_reduce_per_linear")
#: Parts of a block that run as plain eager PyTorch ops inside a stack that is otherwise fused
#: (:attr:`FrameworkProfile.eager_parts`; costed by :func:`autopar.cost.compute.layer_time`):
#: ``glu``: a gated linear unit's activation as its own kernel before the multiply
#: (``F.silu(a) * b``, implied by ``fusion="eager"``); ``norm_input_cast``: the residual stream
#: is cast to fp32 (``x.float()``) before each fused norm, which then reads fp32, and the cast
#: and norm are checkpointed (repeated in backward).
EAGER_PARTS = ("glu", "norm_input_cast")
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
_DEFAULT_COST_SOURCES = {
    "attention_kernels": "torch.nn.functional.scaled_dot_product_attention: the flash backend "
                         "is FlashAttention-2 (torch 2.2+ release notes) on Ampere and Hopper",
    "fusion": "eager PyTorch runs one kernel per op; norms as the model writes them",
    "overlap_dp_grad_reduce": "DDP / FSDP bucketed gradient reduction during backward "
                              "(torch.nn.parallel.DistributedDataParallel, fully_shard)",
    "zero3_gather": "FSDP2 fully_shard per block with implicit forward/backward prefetch",
    "zero3_regather_per_micro_batch": "plain gradient accumulation re-runs forward/backward, "
                                      "and FSDP re-gathers every micro-batch",
    "overlap_tp_comm": "DTensor TP collectives are synchronous on the compute stream",
    "overlap_pp_p2p": "torch.distributed.pipelining waits on its batched isend/irecv before "
                      "the next stage op, under every schedule",
    "grad_reduce_bytes": "the compute dtype unless a reduce dtype is set (CostParams.grad_bytes)",
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
    "fsdp2_copies": "torch 2.13 torch/distributed/fsdp/_fully_shard: _fsdp_param_group.py "
                    "wait_for_unshard calls _fsdp_collectives.py foreach_all_gather_copy_out "
                    "(split_with_sizes_copy) and post_backward calls foreach_reduce, whose "
                    "foreach_reduce_scatter_copy_in (chunk_cat) runs before "
                    "reduce_scatter_stream.wait_stream(current_stream): both on the compute "
                    "stream",
    "tp_mlp_reduce_per_linear": "Megatron-Core fuses the gated MLP's gate and up projections "
                                "into one linear_fc1, and DTensor TP reduces the input gradient "
                                "of a shared input once (the input's redistribution)",
}


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
            "one_or_tp" etp = 1 (ep may span the TP ranks) or tp, "any" any etp with ep * etp
            dividing tp * cp * dp (:attr:`autopar.config.ParallelConfig.expert_tp`).
        experts_tp_sharded: under tp > 1 the expert matrices are split over the expert-TP ranks
            (False: each TP rank holds its experts whole and runs them on every token it holds).
            The cost model prices experts as split; an estimate of a framework that replicates
            them says its time and memory are optimistic (not yet priced as it runs).
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
        overlap_tp_comm: tensor-parallel collectives overlap the GEMMs beside them (userbuffers
            ring exchange, Transformer Engine ``tp_comm_overlap``; or async TP).
        overlap_pp_p2p: the schedules (of :data:`autopar.config.SCHEDULES`) under which
            pipeline sends/receives run beside compute rather than blocking it; () for none.
        grad_reduce_bytes: bytes per gradient element in the data-parallel reduction; None = the
            cost model's :attr:`~autopar.cost.params.CostParams.grad_bytes`.
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
            backward (:meth:`autopar.cost.model.CostModel.sync_bucket_exposed_s`); 0 = the
            reduction overlaps backward as a whole.
        cp_attention: CP mode -> how a rank runs attention under it (:data:`CP_ATTENTION_PATHS`:
            "fused" kernel, "masked" = SDPA with an explicit mask (memory-efficient kernel, all
            pairs), "unfused" = plain tensor ops); a mode not listed runs "fused".
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
        cost_sources: cost field name -> its source (every cost field has one).

    Raises:
        InvalidTrainingConfig: at construction (also through ``dataclasses.replace`` and
            :meth:`with_costs`), one error naming every problem, each with the field, its value,
            the rule and a fix (:class:`~autopar.frameworks.checks.FieldCheck`): a name outside
            autopar's vocabulary (:mod:`autopar.config`, the rule tuples of this module;
            ``attention_kernels`` values from :data:`autopar.config.ATTENTION_KERNELS`), a
            bool field that is not a ``bool``, a number that is not finite or out of its range
            (``step_fixed_s`` >= 0 s; ``optimizer_step_bytes`` >= 1, ``zero1_group_size`` >= 1
            or None, ``sync_grad_bucket_elements`` and ``zero_grad_copy_passes`` >= 0, whole
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
    moe_sequence_parallel: tuple[bool, ...] = (True, False)
    per_block_reshard: bool = False
    expert_tensor_parallel: str = "tp"
    experts_tp_sharded: bool = True
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
    overlap_tp_comm: bool = False
    overlap_pp_p2p: tuple[str, ...] = ()
    grad_reduce_bytes: int | None = None
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
    cost_sources: Mapping[str, str] = field(default_factory=lambda: dict(_DEFAULT_COST_SOURCES))
    #: memory conventions (bytes per state, optimizer temporaries, what PP keeps unsharded...),
    #: sourced inside :class:`autopar.frameworks.memory.MemoryConventions`
    memory: MemoryConventions = field(default_factory=lambda: TORCH_MEMORY)

    def __post_init__(self) -> None:
        check = FieldCheck(f"framework profile {self.name!r}")
        values = _checked_fields({f.name: getattr(self, f.name) for f in fields(self)}, check,
                                 "cost_sources={{..., '{field}': 'where this value comes "
                                 "from'}}")
        check.raise_if_any()
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __hash__(self) -> int:
        return hash((self.name, self.version, tuple(sorted(self.attention_kernels.items())),
                     self.fusion, self.overlap_dp_grad_reduce, self.zero3_gather,
                     self.zero3_regather_per_micro_batch, self.overlap_tp_comm,
                     self.overlap_pp_p2p, self.grad_reduce_bytes, self.step_fixed_s,
                     self.zero1_param_sync, self.zero1_group_size, self.zero1_grad_all_reduce,
                     tuple(sorted(self.cp_attention.items())), self.optimizer_step_bytes,
                     tuple(sorted(self.eager_parts)), self.zero_grad_copy_passes,
                     self.zero1_partition, self.sync_grad_bucket_elements,
                     self.fsdp2_copies, self.tp_mlp_reduce_per_linear))

    @classmethod
    def capability_names(cls) -> tuple[str, ...]:
        """Names of the capability fields (every field but name, version, sources and the cost
        fields of :data:`COST_FIELDS`)."""
        return tuple(f.name for f in fields(cls) if f.name not in (
            "name", "version", "sources", "cost_sources", "seq_rule", "memory") + COST_FIELDS)

    def attention_kernel(self, architecture: str) -> str:
        """The fused attention kernel this framework runs on ``architecture`` (the ``"*"`` entry
        when the architecture has none of its own)."""
        return self.attention_kernels.get(architecture, self.attention_kernels["*"])

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
        _checked_fields({**{f.name: getattr(self, f.name) for f in fields(self)}, **known,
                         "cost_sources": merged}, check, "")
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
        if c.ep > 1 and not self.expert_parallel:
            return f"{fw} has no expert parallelism ({self._src('expert_parallel')})"
        rule = self.expert_tensor_parallel
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
        if len(set(modes)) > 1 and not self.per_block_recompute:
            return (f"{fw} sets one recompute policy for all blocks "
                    f"({self._src('per_block_recompute')})")
        if c.reshard_after_forward is not None and not self.per_block_reshard:
            return (f"{fw} sets one FSDP reshard-after-forward policy for all blocks "
                    f"({self._src('per_block_reshard')})")
        v = c.virtual_stages or 1
        if c.pp > 1:
            schedule = c.schedule or ("interleaved-1f1b" if v > 1 else None)
            if schedule is not None and schedule not in self.schedules:
                return (f"{fw} has no {schedule} schedule (it runs {list(self.schedules)}; "
                        f"{self._src('schedules')})")
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


_ZERO_STAGE_FIELDS = ("zero_stages", "zero_stages_with_tp", "zero_stages_with_pp",
                      "zero_stages_with_ep")
_BOOL_FIELDS = ("per_block_recompute", "expert_parallel", "per_block_reshard",
                "overlap_dp_grad_reduce", "zero3_regather_per_micro_batch", "overlap_tp_comm",
                "zero1_grad_all_reduce", "fsdp2_copies", "tp_mlp_reduce_per_linear",
                "experts_tp_sharded")


def _checked_fields(v: dict, check: FieldCheck, cost_fix: str) -> dict:
    """Every field of a :class:`FrameworkProfile` (``v``: name -> value) checked against its rule
    (the class's Attributes), problems recorded in ``check``; returns the values normalised
    (lists as tuples, mappings read-only, numbers as int/float). ``cost_fix`` is the fix for a
    missing cost source (``{field}`` formatted), empty when the caller reports those itself."""
    out = dict(v)
    out["name"] = check.text("name", v["name"], "torch")
    out["version"] = check.text("version", v["version"], "torch 2.13")
    for f in _ZERO_STAGE_FIELDS:
        out[f] = check.names(f, v[f], (0, 1, 2, 3), (0, 1, 2, 3), what="ZeRO stages")
    out["schedules"] = check.names("schedules", v["schedules"], SCHEDULES, ("1f1b",))
    out["overlaps_ep_comm"] = check.names("overlaps_ep_comm", v["overlaps_ep_comm"], SCHEDULES,
                                          ())
    if isinstance(out["overlaps_ep_comm"], tuple) and isinstance(out["schedules"], tuple):
        extra = [s for s in out["overlaps_ep_comm"] if s not in out["schedules"]]
        if extra and set(extra) <= set(SCHEDULES):
            check.bad("overlaps_ep_comm", out["overlaps_ep_comm"],
                      f"{extra} not among the schedules it runs {list(out['schedules'])}",
                      tuple(s for s in out["overlaps_ep_comm"] if s in out["schedules"]))
    out["overlap_pp_p2p"] = check.names("overlap_pp_p2p", v["overlap_pp_p2p"], SCHEDULES,
                                        ("interleaved-1f1b",), what="schedule names")
    out["cp_modes"] = check.names("cp_modes", v["cp_modes"], CP_MODES, CP_MODES,
                                  what="empty: no context parallelism")
    out["recompute_modes"] = check.names("recompute_modes", v["recompute_modes"],
                                         RECOMPUTE_MODES, ("none", "full"), nonempty=True)
    out["sequence_parallel"] = check.names("sequence_parallel", v["sequence_parallel"],
                                           (True, False), (True, False), nonempty=True,
                                           what="the values sequence_parallel may take")
    out["moe_sequence_parallel"] = check.names(
        "moe_sequence_parallel", v["moe_sequence_parallel"], (True, False), (True, False),
        nonempty=True, what="the values sequence_parallel may take on MoE layers")
    out["eager_parts"] = check.names("eager_parts", v["eager_parts"], EAGER_PARTS, ())
    for f, choices in (("interleaved_chunks", CHUNK_RULES), ("stage_cuts", CUT_RULES),
                       ("expert_tensor_parallel", ETP_RULES), ("fusion", FUSION_LEVELS),
                       ("zero3_gather", ZERO3_GATHERS), ("zero1_param_sync", ZERO1_PARAM_SYNCS),
                       ("zero1_partition", ZERO1_PARTITIONS)):
        out[f] = check.choice(f, v[f], choices, choices[0])
    for f in _BOOL_FIELDS:
        out[f] = check.boolean(f, v[f])
    out["grad_reduce_bytes"] = check.choice(
        "grad_reduce_bytes", v["grad_reduce_bytes"], (None, 1, 2, 4), 4,
        what="bytes per gradient element; None = the cost model's CostParams.grad_bytes")
    out["step_fixed_s"] = check.number("step_fixed_s", v["step_fixed_s"], 0, "seconds", 0.0)
    out["zero1_group_size"] = check.number(
        "zero1_group_size", v["zero1_group_size"], 1, "data-parallel ranks", 8, integer=True,
        none_means="the whole data-parallel group")
    out["sync_grad_bucket_elements"] = check.number(
        "sync_grad_bucket_elements", v["sync_grad_bucket_elements"], 0,
        "gradient elements per bucket; 0 = the reduction overlaps backward as a whole", 0,
        integer=True)
    out["optimizer_step_bytes"] = check.number(
        "optimizer_step_bytes", v["optimizer_step_bytes"], 1,
        "HBM bytes per optimizer-held parameter", FUSED_OPTIMIZER_STEP_BYTES, integer=True)
    out["zero_grad_copy_passes"] = check.number(
        "zero_grad_copy_passes", v["zero_grad_copy_passes"], 0,
        "passes over each gradient per backward", 0, integer=True)
    out["attention_kernels"] = check.mapping(
        "attention_kernels", v["attention_kernels"], ATTENTION_KERNELS, {"*": "fa2"},
        keys=("*", *(a for a in ARCHITECTURES if a)), required=("*",),
        what="GPU architecture -> attention kernel; '*' for any other")
    out["cp_attention"] = check.mapping(
        "cp_attention", v["cp_attention"], CP_ATTENTION_PATHS, {}, keys=CP_MODES,
        what="CP mode -> how a rank runs attention under it")
    out["seq_rule"] = check.instance("seq_rule", v["seq_rule"], SeqLenRule, "SeqLenRule()")
    out["memory"] = check.instance("memory", v["memory"], MemoryConventions,
                                   "autopar.frameworks.memory.TORCH_MEMORY")
    out["sources"] = check.sources(
        "sources", v["sources"], FrameworkProfile.capability_names(),
        "sources={{..., '{field}': 'the framework file and flag it was read from'}}")
    if cost_fix:
        out["cost_sources"] = check.sources("cost_sources", v["cost_sources"], COST_FIELDS,
                                            cost_fix)
    else:
        out["cost_sources"] = MappingProxyType(dict(v["cost_sources"]))
    return out


_ALL_ZERO = (0, 1, 2, 3)

TORCH = FrameworkProfile(
    name="torch", version="torch 2.13 torch.distributed (plan.apply)",
    zero_stages=_ALL_ZERO, zero_stages_with_tp=_ALL_ZERO, zero_stages_with_pp=_ALL_ZERO,
    zero_stages_with_ep=_ALL_ZERO, schedules=SCHEDULES, interleaved_chunks="any",
    stage_cuts="any", cp_modes=CP_MODES, recompute_modes=RECOMPUTE_MODES,
    per_block_recompute=True, sequence_parallel=(True, False), expert_parallel=True,
    moe_sequence_parallel=(False,), experts_tp_sharded=False,
    memory=TORCH_MEMORY,
    per_block_reshard=True,
    sources={
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
        "per_block_recompute": "checkpoint_wrapper is applied per module (autopar/runtime/"
                               "recompute.py)",
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
    },
    zero3_regather_per_micro_batch=False,
    cp_attention={"allgather": "masked", "ring": "unfused"},
    cost_sources={**_DEFAULT_COST_SOURCES,
                  "cp_attention": "autopar/runtime/cp.py (what plan.apply runs): all-gather CP "
                                  "calls SDPA with an explicit boolean mask (flash refuses masks, "
                                  "so the memory-efficient kernel runs over all pairs); ring CP "
                                  "computes each hop's scores in plain tensor ops; Ulysses runs "
                                  "SDPA is_causal on whole sequences (fused)",
                  "zero3_regather_per_micro_batch": "torch/distributed/pipelining/stage.py "
                  "backward_maybe_with_nosync: for an FSDP stage module, micro-batches before "
                  "the last set_requires_gradient_sync(False) and set_reshard_after_backward("
                  "False), so parameters stay gathered and gradients unsharded until the last"})

TORCHTITAN = FrameworkProfile(
    name="torchtitan", version="torchtitan v0.2.2 (73a0e6979dd1)",
    zero_stages=(0, 2, 3), zero_stages_with_tp=(2, 3), zero_stages_with_pp=(2, 3),
    zero_stages_with_ep=(2, 3), schedules=SCHEDULES, interleaved_chunks="any",
    stage_cuts="any", cp_modes=("ring", "allgather"),
    recompute_modes=("none", "selective-op", "full"),
    per_block_recompute=False, sequence_parallel=(True,), expert_parallel=True,
    moe_sequence_parallel=(True,), overlaps_ep_comm=("dualpipev",),
    expert_tensor_parallel="one_or_tp",
    seq_rule=TORCHTITAN_RULE,
    memory=TORCHTITAN_MEMORY,
    sources={
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
        "per_block_recompute": "job_config.py ActivationCheckpoint: one mode for all blocks "
                               "(selective_ac_option N = full every N-th block)",
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
    },
    zero3_regather_per_micro_batch=False, grad_reduce_bytes=4,
    cost_sources={**_DEFAULT_COST_SOURCES,
                  "fusion": "job_config.py Compile.enable defaults to False (eager); the "
                            "model's RMSNorm is torch.nn.RMSNorm",
                  "zero3_regather_per_micro_batch": "train.py runs the pipeline schedule "
                  "(torch.distributed.pipelining: FSDP stage modules keep parameters gathered "
                  "and gradients unsharded until the last micro-batch); apply_fsdp sets "
                  "reshard_after_forward False under PP ('default' policy)",
                  "grad_reduce_bytes": "job_config.py Training.mixed_precision_reduce = "
                                       "'float32' (FSDP MixedPrecisionPolicy reduce_dtype)",
                  "optimizer_step_bytes": "job_config.py Optimizer.implementation = 'fused' "
                                          "(torch's fused AdamW on fp32 FSDP shards) and "
                                          "Training.max_norm = 1.0 (clip_grad_norm_): "
                                          "FUSED_OPTIMIZER_STEP_BYTES"},
    optimizer_step_bytes=FUSED_OPTIMIZER_STEP_BYTES)

MEGATRON = FrameworkProfile(
    name="megatron", version="Megatron-LM main d98e8a64ddf3 (2026-08-22)",
    zero_stages=(0, 1, 3), zero_stages_with_tp=(0, 1, 3), zero_stages_with_pp=(0, 1),
    zero_stages_with_ep=(0, 1), schedules=("1f1b", "interleaved-1f1b"),
    interleaved_chunks="any", stage_cuts="any", cp_modes=CP_MODES,
    recompute_modes=("none", "selective", "full"), per_block_recompute=False,
    sequence_parallel=(True, False), expert_parallel=True, seq_rule=MEGATRON_RULE,
    moe_sequence_parallel=(True,),
    expert_tensor_parallel="any",
    memory=MEGATRON_MEMORY,
    sources={
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
        "per_block_recompute": "arguments.py --recompute-method uniform | block (the first N "
                               "layers of every stage), no per-layer list",
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
    },
    overlap_pp_p2p=("interleaved-1f1b",),
    attention_kernels={"*": "cudnn"}, fusion="fused", overlap_dp_grad_reduce=False,
    cost_sources={**_DEFAULT_COST_SOURCES,
                  "attention_kernels": "arguments.py --attention-backend auto: Transformer "
                                       "Engine's DotProductAttention, cuDNN fused attention "
                                       "(FlashAttention-2-class on Ampere)",
                  "fusion": "arguments.py --bias-gelu-fusion, --bias-dropout-fusion, "
                            "--masked-softmax-fusion default on; Transformer Engine / Apex "
                            "fused LayerNorm/RMSNorm",
                  "overlap_dp_grad_reduce": "arguments.py --overlap-grad-reduce is off by "
                                            "default: gradients are reduced after backward",
                  "overlap_tp_comm": "arguments.py --tp-comm-overlap is off by default",
                  "overlap_pp_p2p": "arguments.py --no-overlap-p2p-communication: "
                                    "overlap_p2p_comm is on by default (since 4eeff55d1f, "
                                    "2023-10-12), and validate_args turns it off unless the "
                                    "schedule is interleaved",
                  "grad_reduce_bytes": "CostParams.grad_bytes (bf16 reduction, as NeMo's "
                                       "distributed optimizer)",
                  "optimizer_step_bytes": "megatron/core/optimizer/__init__.py: Transformer "
                                          "Engine or apex FusedAdam; clip_grads.py "
                                          "multi_tensor_l2norm + multi_tensor_scale (clip_grad "
                                          "1.0); distrib_optimizer.py _copy_model_grads_to_"
                                          "main_grads (.float()) and _copy_main_params_to_model_"
                                          "params: MIXED_FUSED_OPTIMIZER_STEP_BYTES"},
    optimizer_step_bytes=MIXED_FUSED_OPTIMIZER_STEP_BYTES)

DEEPSPEED = FrameworkProfile(
    name="deepspeed", version="DeepSpeed 0.19.6 (edaa72212672)",
    zero_stages=_ALL_ZERO, zero_stages_with_tp=_ALL_ZERO, zero_stages_with_pp=(0, 1),
    zero_stages_with_ep=_ALL_ZERO, schedules=("1f1b",), interleaved_chunks="none",
    stage_cuts="balanced", cp_modes=(), recompute_modes=("none", "full"),
    per_block_recompute=False, sequence_parallel=(False,), expert_parallel=True,
    moe_sequence_parallel=(False,), experts_tp_sharded=False, seq_rule=DEEPSPEED_RULE,
    memory=DEEPSPEED_MEMORY,
    sources={
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
        "per_block_recompute": "pipe/module.py activation_checkpoint_interval: every N-th layer",
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
    },
    zero3_gather="per_parameter", overlap_dp_grad_reduce=False, fsdp2_copies=False,
    cost_sources={**_DEFAULT_COST_SOURCES,
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
                  "overlap_dp_grad_reduce": "deepspeed/runtime/zero/config.py overlap_comm "
                                            "defaults to False (ZeRO-0..2: reduction after "
                                            "backward)",
                  "optimizer_step_bytes": "deepspeed/ops/adam/fused_adam.py FusedAdam "
                                          "(multi_tensor_adam); runtime/constants.py "
                                          "GRADIENT_CLIPPING_DEFAULT = 1.0; zero/stage_1_and_2.py "
                                          "step(): flat gradient .to(fp32) and the bf16 "
                                          "partition copied from the fp32 one: "
                                          "MIXED_FUSED_OPTIMIZER_STEP_BYTES"},
    optimizer_step_bytes=MIXED_FUSED_OPTIMIZER_STEP_BYTES)

#: Every profile by framework name (read-only).
PROFILES: Mapping[str, FrameworkProfile] = MappingProxyType(
    {p.name: p for p in (TORCH, TORCHTITAN, MEGATRON, DEEPSPEED)})
assert tuple(PROFILES) == FRAMEWORKS, "autopar.config.FRAMEWORKS and PROFILES disagree"


def get_profile(framework: str | FrameworkProfile) -> FrameworkProfile:
    """The profile of a framework name (a profile passes through).

    Raises:
        InvalidTrainingConfig: an unknown framework name (the message lists the known ones).
    """
    if isinstance(framework, FrameworkProfile):
        return framework
    try:
        return PROFILES[framework]
    except (KeyError, TypeError):
        raise InvalidTrainingConfig(
            f"framework {framework!r} is not one of {list(PROFILES)}. Fix: use 'torch' "
            "(plan.apply), 'torchtitan', 'megatron' or 'deepspeed'.") from None
