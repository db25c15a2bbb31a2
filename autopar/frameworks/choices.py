"""How a framework implements each costed mechanism, as named, sourced choices.

A framework profile's cost fields (:data:`autopar.frameworks.profiles.COST_FIELDS`) fall into
nine mechanisms; each framework picks one implementation of each, a frozen :class:`Choice`
record with a name, a one-line summary and a source for every value:

- :class:`ShardedDataParallel`: how data parallelism fetches (ZeRO-3 all-gathers), reduces and
  overlaps gradients, how ZeRO-1 shards and returns parameters, and the copies it adds;
- :class:`OptimizerStep`: HBM bytes per parameter of the optimizer step, fixed per-step cost;
- :class:`AttentionKernels`: the fused attention kernel per GPU architecture;
- :class:`Fusion`: how far memory-bound ops are fused, and parts left eager;
- :class:`TensorParallelComm`, :class:`PipelineComm`, :class:`ContextParallelAttention`: which
  TP and pipeline communication overlaps compute, and how a CP rank runs attention;
- :class:`HostIssue`: whether the host issues every kernel (:data:`PER_KERNEL_LAUNCH`, the
  stock stacks) or replays CUDA graphs (:data:`CUDA_GRAPHS`), costed by :mod:`autopar.cost.host`;
- :class:`ExpertDispatch`: the format MoE tokens are dispatched in
  (:data:`ACTIVATION_DTYPE_DISPATCH`, the stock stacks; DeepSeek-V3's FP8 in
  :mod:`autopar.frameworks.stacks.inhouse`), costed by :mod:`autopar.cost.dispatch`.

:class:`Choices` bundles one of each; :func:`compose` builds a
:class:`~autopar.frameworks.profiles.FrameworkProfile` from them and the framework's
capabilities, and :func:`with_choice` swaps one choice of a profile (e.g. :data:`TORCH_COMPILE`).
The records shared by several frameworks are here; a framework's own are in its module of
:mod:`autopar.frameworks.stacks`. Values are checked when the profile is built.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Mapping

from .checks import FieldCheck
from .profiles import COST_FIELDS, TORCH_OPTIMIZER_STEP_BYTES, FrameworkProfile
from .profiles import DEFAULT_COST_SOURCES as _D

#: Fields of a choice that are not cost fields.
_META = ("name", "summary", "sources", "group_option")


@dataclass(frozen=True, kw_only=True)
class Choice:
    """One named implementation of a mechanism: its cost fields (those of the subclass, named
    as :class:`~autopar.frameworks.profiles.FrameworkProfile`'s), each with a source.

    Attributes:
        name: the implementation's name, e.g. ``"fsdp2"``.
        summary: one line saying what it is and where it runs.
        sources: cost field -> where its value comes from (a file and flag, a paper).

    Raises:
        InvalidTrainingConfig: an empty name or summary, a cost field without a source, a
            source for no field of this kind (one error naming each, with its fix).
    """

    KIND: ClassVar[str] = "mechanism"
    name: str
    summary: str
    sources: Mapping[str, str]

    def __post_init__(self) -> None:
        check = FieldCheck(f"{self.KIND} choice {self.name!r}")
        check.text("name", self.name, "fsdp2")
        check.text("summary", self.summary, "what it is, in one line")
        object.__setattr__(self, "sources", check.sources(
            "sources", self.sources, self.cost_fields(),
            "sources={{..., '{field}': 'the framework file and flag it was read from'}}"))
        check.raise_if_any()

    @classmethod
    def cost_fields(cls) -> tuple[str, ...]:
        """The profile cost fields this kind of choice sets."""
        return tuple(f.name for f in fields(cls) if f.name not in _META)

    def costs(self) -> dict:
        """Cost field -> value."""
        return {f: getattr(self, f) for f in self.cost_fields()}


@dataclass(frozen=True, kw_only=True)
class ShardedDataParallel(Choice):
    """How data parallelism runs: ZeRO-3 gathers, gradient reduction and its overlap, ZeRO-1's
    shard group, partition and parameter return, and the copies on the compute stream. Each
    field means what the profile field of that name means (:class:`FrameworkProfile`).

    ``group_option``: how a user limits the shard group to fewer ranks than the data-parallel
    group in this implementation (HSDP, InternEvo ``parallel.zero1``), "" when it cannot
    (:func:`autopar.frameworks.stacks.shard_within`)."""

    KIND: ClassVar[str] = "sharded data parallel"
    overlap_dp_grad_reduce: bool
    zero3_gather: str
    zero3_regather_per_micro_batch: bool
    zero3_pp_root_regather: bool = False
    zero3_pp_reduce_after_flush: bool = False
    grad_reduce_bytes: int | None
    grad_reduce_fp16_in_fp16: bool = False
    zero1_param_sync: str
    zero1_group_size: int | None
    zero1_grad_all_reduce: bool
    zero1_partition: str
    sync_grad_bucket_elements: int
    zero_grad_copy_passes: int
    fsdp2_copies: bool
    zero2_grad_all_reduce: bool = False
    zero2_reduce_per_step: bool = False
    zero12_grad_copy_passes: int = 0
    zero0_grad_copy_passes: int = 0
    zero0_step_bytes: int = 0
    zero0_step_host_ops_per_tensor: int = 0
    zero1_step_bytes: int = 0
    zero1_step_host_ops_per_tensor: int = 0
    zero3_persistent_elements: int = 0
    zero3_reduce_bucket_elements: int = 0
    group_option: str = ""


@dataclass(frozen=True, kw_only=True)
class OptimizerStep(Choice):
    """How the optimizer step runs: HBM bytes per optimizer-held parameter (its passes and
    gradient clipping) and a sourced fixed cost per step (seconds)."""

    KIND: ClassVar[str] = "optimizer step"
    optimizer_step_bytes: int
    step_fixed_s: float


@dataclass(frozen=True, kw_only=True)
class AttentionKernels(Choice):
    """The fused attention kernel per GPU architecture (``"*"`` for any other)."""

    KIND: ClassVar[str] = "attention kernel"
    attention_kernels: Mapping[str, str]


@dataclass(frozen=True, kw_only=True)
class Fusion(Choice):
    """How far memory-bound ops fuse (:data:`~autopar.frameworks.profiles.FUSION_LEVELS`) and
    the parts of a block left eager in an otherwise fused stack."""

    KIND: ClassVar[str] = "fusion"
    fusion: str
    eager_parts: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class TensorParallelComm(Choice):
    """Whether TP collectives overlap the GEMMs beside them, and whether each MLP linear
    reduces its own input gradient."""

    KIND: ClassVar[str] = "tensor-parallel communication"
    overlap_tp_comm: bool
    tp_mlp_reduce_per_linear: bool


@dataclass(frozen=True, kw_only=True)
class PipelineComm(Choice):
    """The pipeline schedules whose send/receive overlaps compute."""

    KIND: ClassVar[str] = "pipeline communication"
    overlap_pp_p2p: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ContextParallelAttention(Choice):
    """CP mode -> how a rank runs attention under it (a mode not listed: fused), and whether
    Ulysses CP repeats the KV heads to the query heads before its all-to-all."""

    KIND: ClassVar[str] = "context-parallel attention"
    cp_attention: Mapping[str, str]
    ulysses_kv_repeat: bool = False


@dataclass(frozen=True, kw_only=True)
class HostIssue(Choice):
    """How the host issues a micro-batch's kernels (:data:`~autopar.frameworks.profiles.
    HOST_ISSUES`): one by one, each paying the host's time per op, or as CUDA graph replays."""

    KIND: ClassVar[str] = "host issue"
    host_issue: str
    host_op_s_published: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ExpertDispatch(Choice):
    """The format MoE tokens travel in along the dispatch direction (the forward dispatch and the
    backward dispatch of the combine's gradient; :data:`~autopar.frameworks.profiles.
    MOE_DISPATCH_DTYPES`); the combines move the activation dtype."""

    KIND: ClassVar[str] = "expert dispatch"
    moe_dispatch_dtype: str
    moe_tp_token_alltoall: bool = False
    moe_dispatch_sync_ops: int = 0
    moe_probs_alltoall: bool = False
    moe_counts_gather: bool = False
    moe_sac_redispatch: bool = False
    moe_capacity_rule: str = "megatron"


@dataclass(frozen=True)
class Choices:
    """One choice per mechanism: what a framework profile's cost fields are built from
    (``host`` None: :data:`PER_KERNEL_LAUNCH`; ``expert_dispatch`` None:
    :data:`ACTIVATION_DTYPE_DISPATCH`)."""

    sharded_dp: ShardedDataParallel
    optimizer_step: OptimizerStep
    attention: AttentionKernels
    fusion: Fusion
    tensor_parallel: TensorParallelComm
    pipeline: PipelineComm
    context_parallel: ContextParallelAttention
    host: HostIssue | None = None
    expert_dispatch: ExpertDispatch | None = None

    def each(self) -> tuple[Choice, ...]:
        """The choices, in field order (a mechanism left None: its default record)."""
        return tuple(self._get(f.name) for f in fields(self))

    def _get(self, mechanism: str) -> Choice:
        return getattr(self, mechanism) or _DEFAULT_CHOICES[mechanism]

    def costs(self) -> dict:
        """Every cost field -> its value."""
        return {k: v for c in self.each() for k, v in c.costs().items()}

    def cost_sources(self) -> dict[str, str]:
        """Every cost field -> its source."""
        return {k: v for c in self.each() for k, v in c.sources.items()}

    def names(self) -> dict[str, str]:
        """Mechanism -> the chosen implementation's name."""
        return {f.name: self._get(f.name).name for f in fields(self)}


def compose(choices: Choices, **profile) -> FrameworkProfile:
    """A framework profile with the cost fields of ``choices`` and the other fields (name,
    version, capabilities, sources, seq_rule, memory) given.

    Raises:
        InvalidTrainingConfig: as :class:`FrameworkProfile` (a value breaking its rule).
    """
    return FrameworkProfile(**profile, **choices.costs(), cost_sources=choices.cost_sources())


def with_choice(profile: FrameworkProfile, choice: Choice) -> FrameworkProfile:
    """``profile`` with the cost fields of one choice swapped in, each with its source (an edit
    of the stock profile, so it travels with a plan: :func:`autopar.frameworks.profile_edits`).

    Raises:
        InvalidTrainingConfig: as :meth:`FrameworkProfile.with_costs`.
    """
    return profile.with_costs(dict(choice.sources), **choice.costs())


def capabilities_of(profile: FrameworkProfile) -> dict:
    """The fields of ``profile`` that are not cost fields (capabilities, their sources, the
    sequence rule, memory), for a framework that runs the same layouts as ``profile``."""
    cost = set(COST_FIELDS) | {"cost_sources", "name", "version"}
    return {f.name: getattr(profile, f.name) for f in fields(profile) if f.name not in cost}


# -- choices shared by several frameworks (plain PyTorch 2.x unless said) --------------------

FSDP2 = ShardedDataParallel(
    name="fsdp2", summary="torch FSDP2 (fully_shard) per block, DDP / ZeroRedundancyOptimizer "
                          "for ZeRO-0/1, reduction overlapping backward",
    overlap_dp_grad_reduce=True, zero3_gather="per_block", zero3_regather_per_micro_batch=True,
    grad_reduce_bytes=None, zero1_param_sync="all_gather", zero1_group_size=None,
    zero1_grad_all_reduce=False, zero1_partition="flat", sync_grad_bucket_elements=0,
    zero_grad_copy_passes=0, fsdp2_copies=True,
    sources={k: _D[k] for k in ShardedDataParallel.cost_fields()})

TORCH_FOREACH_ADAMW = OptimizerStep(
    name="torch-adamw-foreach", summary="torch.optim.AdamW, default foreach path, with "
                                        "clip_grad_norm_",
    optimizer_step_bytes=TORCH_OPTIMIZER_STEP_BYTES, step_fixed_s=0.0,
    sources={k: _D[k] for k in OptimizerStep.cost_fields()})

SDPA_FLASH = AttentionKernels(
    name="sdpa-flash", summary="torch SDPA's flash backend (FlashAttention-2)",
    attention_kernels={"*": "fa2"}, sources={"attention_kernels": _D["attention_kernels"]})

#: FlashAttention-3 called directly (flash_attn_interface, or the kernels-community
#: "vllm-flash-attn3" hub kernel): a Hopper-only kernel; any other GPU keeps SDPA's FA2.
FLASH_ATTN_3 = AttentionKernels(
    name="flash-attn-3", summary="FlashAttention-3 on Hopper (FlashAttention-2 elsewhere)",
    attention_kernels={"hopper": "fa3", "*": "fa2"},
    sources={"attention_kernels": "Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608): "
                                  "kernels for Hopper (sm90) only, Dao-AILab/flash-attention "
                                  "hopper/; elsewhere SDPA's flash backend (FlashAttention-2)"})

EAGER = Fusion(name="eager", summary="eager PyTorch, one kernel per op", fusion="eager",
               eager_parts=("fp32_cross_entropy",), sources={
                   "fusion": _D["fusion"],
                   "eager_parts": "the loss is F.cross_entropy(logits.float(), labels) (the "
                                  "stack's own loss, as its memory conventions' loss_work_bytes "
                                  "source states): eager ATen cast, log_softmax and nll_loss"})

#: Eager PyTorch whose loss is not torch's F.cross_entropy on fp32-upcast logits (a fused loss
#: kernel, or the cross entropy on the bf16 logits): the loss priced as the graph counts it.
EAGER_MODEL_LOSS = Fusion(
    name="eager-model-loss", summary="eager PyTorch, the model's own loss", fusion="eager",
    eager_parts=(), sources={"fusion": _D["fusion"], "eager_parts": _D["eager_parts"]})

TORCH_COMPILE = Fusion(
    name="torch.compile", summary="torch.compile: TorchInductor fuses point-wise chains",
    fusion="compile", eager_parts=(),
    sources={"fusion": "torch.compile (TorchInductor) fuses each chain of consecutive "
                       "point-wise ops into one kernel (Ansel et al. 2024, PyTorch 2, section 4)",
             "eager_parts": _D["eager_parts"]})

DTENSOR_TP = TensorParallelComm(
    name="dtensor-tp", summary="DTensor tensor parallelism, synchronous collectives",
    overlap_tp_comm=False, tp_mlp_reduce_per_linear=False,
    sources={k: _D[k] for k in TensorParallelComm.cost_fields()})

TORCH_PIPELINING = PipelineComm(
    name="torch-pipelining", summary="torch.distributed.pipelining, P2P waited on",
    overlap_pp_p2p=(), sources={"overlap_pp_p2p": _D["overlap_pp_p2p"]})

FUSED_CP = ContextParallelAttention(
    name="fused-per-chunk", summary="the framework's fused attention kernel per CP chunk",
    cp_attention={}, sources={"cp_attention": _D["cp_attention"],
                              "ulysses_kv_repeat": _D["ulysses_kv_repeat"]})

PER_KERNEL_LAUNCH = HostIssue(
    name="per-kernel-launch", summary="the host dispatches and launches every kernel of a "
                                      "micro-batch (no CUDA graphs)",
    host_issue="per_kernel", sources={"host_issue": _D["host_issue"],
                                      "host_op_s_published": _D["host_op_s_published"]})

CUDA_GRAPHS = HostIssue(
    name="cuda-graphs", summary="forward and backward captured once and replayed as CUDA graphs",
    host_issue="cuda_graph",
    sources={"host_issue": "CUDA graphs replay a captured sequence of kernels with one launch "
                           "(CUDA C++ Programming Guide, 'CUDA Graphs'; torch.cuda.graphs and "
                           "torch.compile(mode='reduce-overhead'); Transformer Engine "
                           "make_graphed_callables, Megatron-LM --enable-cuda-graph)",
             "host_op_s_published": "a captured step replays without per-kernel host work: 0"})

#: Every stock stack's MoE dispatch, in the activation dtype.
ACTIVATION_DTYPE_DISPATCH = ExpertDispatch(
    name="activation-dtype-dispatch",
    summary="MoE tokens dispatched and combined in the activation dtype (bf16 under mixed "
            "precision)",
    moe_dispatch_dtype="activation",
    sources={"moe_dispatch_dtype": (
        "the stacks all-to-all the routed hidden states as the layer holds them: Megatron-Core "
        "(d98e8a6) megatron/core/transformer/moe/token_dispatcher.py:705 "
        "MoEAlltoAllTokenDispatcher.token_dispatch all_to_all(self.ep_group, "
        "permutated_local_input_tokens, ...) and :1320 _DeepepManager.dispatch "
        "fused_dispatch(hidden_states, ...) (its moe_dispatch_fwd_dtype / moe_combine_bwd_dtype "
        "'mxfp8', default 'bf16', run on the 'ncclep' flex backend only, which autopar does not "
        "price); torchtitan v0.2.2 torchtitan/distributed/expert_parallel.py:138 "
        "ExpertParallel._token_dispatch all_to_all_single_autograd(routed_input, ...) and "
        "distributed/deepep/deepep.py:446 dispatch_tokens torch.ops.deepep.dispatch("
        "hidden_states, ...); DeepSpeed deepspeed/moe/sharded_moe.py MOELayer.forward "
        "_AllToAll.apply(self.ep_group, dispatched_input) on einsum('sec,sm->ecm', "
        "dispatch_mask.type_as(input[0]), reshaped_input), the input's dtype"),
        "moe_tp_token_alltoall": (
        "Megatron-Core since a11077467a (2024-08-22, first tagged 24.09-alpha.rc0 on "
        "2024-09-10) keeps each TP rank's sequence shard through the permutation and gathers "
        "the routed tokens over the expert-TP group after the all-to-all (d98e8a6 "
        "token_dispatcher.py MoEAlltoAllTokenDispatcher.dispatch_postprocess); torchtitan and "
        "DeepSpeed route without a TP all-to-all: False"),
        "moe_dispatch_sync_ops": (
        "not priced: Megatron-Core since a11077467a reads the token counts on a side stream "
        "and waits on one event at its cuda_sync_point (d98e8a6 token_dispatcher.py "
        "_maybe_dtoh_and_synchronize), with work queued behind it; torchtitan's and "
        "DeepSpeed's host syncs are not read: 0"),
        "moe_probs_alltoall": (
        "torchtitan v0.2.2 (distributed/expert_parallel.py ExpertParallel._token_dispatch) and "
        "DeepSpeed (moe/sharded_moe.py MOELayer.forward) move only the tokens in their "
        "all-to-alls; Megatron-Core's own dispatcher is "
        "autopar.frameworks.stacks.megatron.MEGATRON_ALLTOALL_DISPATCH: False"),
        "moe_capacity_rule": (
        "Megatron-Core runs each expert's routed rows (dropless, its default) or caps them at "
        "ceil(T x top_k / E x factor) with --moe-expert-capacity-factor, padding only with "
        "--moe-pad-expert-input-to-capacity (moe_utils.py get_capacity, router.py "
        "apply_router_token_dropping); torchtitan's MoE is dropless (models/moe/moe.py MoEArgs "
        "has no capacity); DeepSpeed's buffers: autopar.frameworks.stacks.deepspeed"),
        "moe_sac_redispatch": (
        "torchtitan keeps the all-to-all's outputs under op-level selective recomputation "
        "(distributed/activation_checkpoint.py save list, all_to_all_single, since 114151ad4, "
        "2026-03-23, PR #2357; models/deepseek_v3 and llama4 since c4e229115, 2025-09-06, "
        "PR #1672); Megatron-Core and DeepSpeed have no op-level policy: False"),
        "moe_counts_gather": (
        "not priced for a stack whose dispatcher is not read for it (torchtitan's all-to-all "
        "of the counts is not priced); Megatron-Core's: autopar.frameworks.stacks.megatron."
        "MEGATRON_ALLTOALL_DISPATCH: False")})

_DEFAULT_CHOICES = {"host": PER_KERNEL_LAUNCH, "expert_dispatch": ACTIVATION_DTYPE_DISPATCH}
