"""The two inputs a user writes by hand: how to train (TrainingConfig) and how to parallelise
(ParallelConfig). Pure data, validated at birth (the torchtitan ``ParallelDims`` pattern)."""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import InvalidParallelConfig, InvalidTrainingConfig

PRECISIONS = ("bf16", "fp16", "fp32", "fp8")
OPTIMIZERS = ("adam", "adamw", "sgd")
#: Recompute modes, weakest first: "selective" is Korthikanti et al. 2022's attention-core
#: recomputation (Megatron-LM --recompute-granularity selective); "selective-op" is torchtitan's
#: op-level selective checkpointing (ActivationCheckpoint.mode "selective", selective_ac_option
#: "op": every op's output recomputed except attention, reduce-scatter and every second matmul).
RECOMPUTE_MODES = ("none", "selective", "selective-op", "full")
#: Megatron-Core's selective-recompute submodules autopar prices (``--recompute-modules``; the
#: names and their meaning: megatron/core/transformer/transformer_config.py ``recompute_modules``
#: at d98e8a64, line 560), in that file's order. What each drops and repeats on autopar's op
#: graph: :mod:`autopar.cost.selective`. Not priced: the Mamba / GatedDelta / hyper-connection
#: modules.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")
#: What a "selective" block recomputes when no modules are named: Megatron-Core's default
#: (transformer_config.py ``__post_init__``: ``recompute_modules = ["core_attn"]``), Korthikanti
#: et al. 2022's selective recomputation.
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
#: Why sequence parallelism needs tp > 1 (Korthikanti et al. 2022: it shards over the TP group
#: the activations TP leaves replicated); the CLI's note on ``--sp`` at tp=1 and the Python
#: API's refusal of ``sequence_parallel=True`` at tp=1 both say it.
SP_NEEDS_TP = ("sequence parallelism shards the ops tensor parallelism replicates, so it needs "
               "tp > 1")
#: dtypes the optimizer's moment estimates (Adam's m and v) may be kept in.
OPTIMIZER_STATE_DTYPES = ("fp32", "bf16")
#: Pipeline schedules, as ``torch.distributed.pipelining`` (torch 2.13) names its classes:
#: ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble (ZB-H1 of
#: Qi et al. 2023 over v chunks per rank), ScheduleZBVZeroBubble (ZB-V: exactly 2 chunks per
#: rank in a V) and ScheduleDualPipeV (DeepSeek-V3's DualPipe folded into a V: 2 chunks per rank).
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zero-bubble", "zbv-zero-bubble",
             "dualpipev", "dualpipe")
#: Other spellings accepted for :data:`SCHEDULES` (normalised at construction): torch's class
#: names without "Schedule" (case-insensitive, as torchtitan's ``pipeline_parallel_schedule``)
#: and short forms.
SCHEDULE_ALIASES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved1f1b": "interleaved-1f1b",
                    "interleavedzerobubble": "interleaved-zero-bubble",
                    "interleaved-zb": "interleaved-zero-bubble",
                    "zbvzerobubble": "zbv-zero-bubble", "zbv": "zbv-zero-bubble",
                    "zb-v": "zbv-zero-bubble", "dualpipev": "dualpipev", "dualpipe": "dualpipe"}
#: Schedules whose ranks hold exactly two chunks each, in a V (chunk c < pp on rank c, chunk
#: c >= pp on rank 2 pp - 1 - c). DualPipe's rank r holds stage r of one direction and stage
#: pp - 1 - r of the other (DeepSeek-V3, arXiv 2412.19437, section 3.2.1): the same V of
#: chunks, each a whole stage of a model kept twice (:data:`PARAMETER_COPIES`).
V_SCHEDULES = ("zbv-zero-bubble", "dualpipev", "dualpipe")
#: DeepSeek's schedules (DualPipe and its V): a forward chunk paired with a backward chunk in
#: the steady state, at least a micro-batch per chunk (2 pp).
DUAL_PIPES = ("dualpipev", "dualpipe")
#: Schedules that split a backward into input- and weight-gradient passes
#: (:mod:`autopar.cost.pipeline.orders`).
SPLIT_BACKWARD = ("interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev", "dualpipe")
#: The schedules ``torch.distributed.pipelining`` (torch 2.13) has a class for (all but DeepSeek's
#: bidirectional DualPipe): what plain PyTorch and torchtitan run.
TORCH_SCHEDULES = tuple(s for s in SCHEDULES if s != "dualpipe")
#: Copies of the model's parameters a schedule keeps over the pipeline: DualPipe feeds
#: micro-batches from both ends, so each stage lives on two ranks (DeepSeek-V3 section 3.2.1,
#: "DualPipe requires keeping two copies of the model parameters").
PARAMETER_COPIES = {"dualpipe": 2}
MESH_DIMS = ("tp", "cp", "dp", "pp")
#: How MoE layers move routed tokens to their experts' ranks and back (the token dispatcher):
#: "alltoall" = NCCL all-to-alls of every routed copy (Megatron-Core
#: ``--moe-token-dispatcher-type alltoall``, torchtitan's and plan.apply's EP); "deepep" =
#: DeepSeek's DeepEP normal kernels, which send a token once per destination node over RDMA and
#: forward it over NVLink (Megatron-Core ``--moe-token-dispatcher-type flex
#: --moe-flex-dispatcher-backend deepep``); "allgather" = every rank of the expert-TP x EP group
#: gathers the group's tokens and reduce-scatters the experts' output back (Megatron-Core's
#: default, ``--moe-token-dispatcher-type allgather``). Priced in :mod:`autopar.cost.dispatch`.
DISPATCHERS = ("alltoall", "deepep", "allgather")
CP_MODES = ("ring", "ulysses", "allgather")
#: Fused attention kernels the cost model knows (:attr:`autopar.cost.params.CostParams.
#: attention_efficiency` is keyed by them; a framework profile's ``attention_kernels`` names them):
#: FlashAttention 1/2/3, cuDNN's fused attention and SDPA's memory-efficient kernel. Here, beside
#: the other names, so that :mod:`autopar.frameworks` checks them without importing the cost model.
ATTENTION_KERNELS = ("fa1", "fa2", "fa3", "cudnn", "efficient")
#: GPU architectures (:attr:`autopar.hardware.Device.arch` names one; "" = read it from the
#: device name; :func:`autopar.hardware.gpu.architecture` returns one), here for the same reason: a
#: profile's ``attention_kernels`` is keyed by them.
ARCHITECTURES = ("", "ampere", "ada", "hopper", "blackwell", "volta", "cdna3", "cdna4", "unknown")
#: The architectures of compute capability 9.0 and later (Hopper sm_90; Blackwell sm_100, sm_120),
#: where kernels and libraries switch defaults by capability (e.g. torch's cuBLAS workspace)
CC9_ARCHITECTURES = ("hopper", "blackwell")
#: Frameworks a plan may target (each has a profile in :mod:`autopar.frameworks.stacks`):
#: ``torch`` is stock torch.distributed as ``plan.apply`` runs it; the first four have exporters,
#: the others are published stacks (a release, a recipe or a trainer built on one of them).
FRAMEWORKS = ("torch", "torchtitan", "megatron", "deepspeed", "megatron-2023", "nemo",
              "inhouse-2024", "fsdp1", "llm-foundry", "tinyllama", "flash-attention-training",
              "internevo", "internevo-fsdp", "torchtitan-0.3")
#: Default rank placement, innermost first: TP on consecutive ranks (inside a node), then CP, DP,
#: and PP outermost (Megatron-LM's default order "tp-cp-ep-dp-pp").
DEFAULT_PLACEMENT = MESH_DIMS

#: Bytes per element of the compute dtype (fp8 training keeps bf16 weights and activations
#: between GEMMs, as Transformer Engine does; only the GEMM inputs are 8-bit).
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}

#: Largest global batch (sequences) and sequence length (tokens) accepted: 2**24, far beyond any
#: published run (GPT-3: 1536 x 2048; Llama 3: 16M tokens per step, 128K context). Larger values
#: are almost surely typos, and the search enumerates divisors of the batch.
MAX_GLOBAL_BATCH = 2 ** 24
MAX_SEQ_LEN = 2 ** 24


def _positive_int(cls_name: str, name: str, value: Any, allow_none: bool = False,
                  maximum: int | None = None) -> None:
    if value is None and allow_none:
        return
    err = InvalidTrainingConfig if cls_name == "TrainingConfig" else InvalidParallelConfig
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise err(f"{cls_name}.{name} must be a positive integer; got {value!r}. "
                  f"Fix: pass an int >= 1{' or None to let autopar choose' if allow_none else ''}.")
    if maximum is not None and value > maximum:
        raise err(f"{cls_name}.{name} = {value} exceeds the largest value autopar plans for "
                  f"({maximum}). Fix: pass an int between 1 and {maximum}.")


def _recompute_modules(value: Any) -> tuple[str, ...] | None:
    """``ParallelConfig.recompute_modules`` checked and in its one spelling: a tuple in
    :data:`RECOMPUTE_MODULES` order, or None for the default.

    Raises:
        InvalidParallelConfig: not a sequence of names, empty, or a name autopar does not price.
    """
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names or any(
            not isinstance(m, str) or m not in RECOMPUTE_MODULES for m in names):
        raise InvalidParallelConfig(
            f"recompute_modules must be a non-empty sequence of {RECOMPUTE_MODULES} (Megatron-"
            f"Core's --recompute-modules that autopar prices); got {value!r}. Fix: e.g. "
            "recompute_modules=('moe_act', 'layernorm'), or None for the attention core.")
    ordered = tuple(m for m in RECOMPUTE_MODULES if m in names)
    return None if ordered == DEFAULT_RECOMPUTE_MODULES else ordered


def _expert_load(value: Any) -> tuple[float, ...]:
    """``TrainingConfig.moe_expert_load`` checked, as a tuple of floats.

    Raises:
        InvalidTrainingConfig: not a sequence of at least two finite numbers >= 0 with a
            positive sum.
    """
    ok = isinstance(value, (list, tuple)) and len(value) >= 2 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
        for x in value) and sum(value) > 0
    if not ok:
        raise InvalidTrainingConfig(
            f"moe_expert_load must list each routed expert's load (at least two finite numbers "
            f">= 0, not all 0; e.g. per-expert token counts); got {value!r:.120}. Fix: pass one "
            "number per expert, or None for balanced routing.")
    return tuple(float(x) for x in value)


def _bool(cls_name: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        err = InvalidTrainingConfig if cls_name == "TrainingConfig" else InvalidParallelConfig
        raise err(f"{cls_name}.{name} must be True or False; got {value!r}. "
                  f"Fix: pass {name}=True or {name}=False.")


@dataclass(frozen=True)
class TrainingConfig:
    """What is trained: batch, sequence length, precision, optimizer.

    Attributes:
        global_batch_size: sequences per optimizer step (all data-parallel ranks together).
        seq_len: tokens per sequence.
        micro_batch_size: sequences per micro-batch per rank, or None to let autopar choose.
        precision: compute precision, one of :data:`PRECISIONS`; weights and activations are kept
            in 2 bytes for bf16/fp16/fp8 (mixed precision, Micikevicius et al. 2018).
        optimizer: one of :data:`OPTIMIZERS`; Adam keeps fp32 master weights, momentum and
            variance: K = 12 bytes per parameter (Rajbhandari et al. 2020, section 3.1).
        flash_attention: attention runs as a fused kernel (no s x s activations are stored).
        framework: what will run the plan, one of :data:`FRAMEWORKS` (default "torch",
            ``plan.apply``); the search emits only layouts that framework can run
            (:mod:`autopar.frameworks`).
        optimizer_offload: keep the optimizer states (fp32 master weights and moments) in CPU
            memory and run the step there (ZeRO-Offload, Ren et al. 2021; DeepSpeed
            ``zero_optimization.offload_optimizer``): they take no GPU memory.
        param_offload: keep the ZeRO-3 / FSDP parameter shards in CPU memory, copying each
            unit's shard to the GPU before its all-gather (FSDP ``CPUOffload(offload_params=
            True)``, FSDP2 ``CPUOffloadPolicy``, DeepSpeed ``zero_optimization.offload_param``).
            Needs ``zero_stage=3``; under FSDP the gradients and the optimizer step go to the CPU
            too (:mod:`autopar.cost.offload`, which also says which frameworks run it).
        activation_offload: keep the activations each decoder block saves for backward in CPU
            memory, copied back for its backward (``torch.autograd.graph.save_on_cpu``, as
            FSDP's ``checkpoint_wrapper(offload_to_cpu=True)``); with ``recompute="full"`` these
            are the blocks' checkpointed inputs (:mod:`autopar.cost.offload`).
        optimizer_state_dtype: dtype of the moment estimates, one of
            :data:`OPTIMIZER_STATE_DTYPES` ("bf16" halves them, as Megatron-LM's
            ``--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16`` with the precision-aware optimizer).
        moe_capacity_factor: token dropping in the MoE layers: each expert takes at most
            ceil(tokens x top_k / experts x factor) of the tokens one router call sees, the rest
            are dropped (Megatron-Core ``--moe-expert-capacity-factor``; moe_utils.py
            ``get_capacity``). None (default): dropless, every routed token is computed. Priced
            by :mod:`autopar.cost.capacity`; a framework without it is refused there.
        moe_pad_to_capacity: every expert runs exactly its capacity of rows, padding what it
            was not sent (Megatron-Core ``--moe-pad-expert-input-to-capacity``): the all-to-all,
            the expert GEMMs and their saved activations are sized by the capacity, not by the
            routed tokens. Needs ``moe_capacity_factor``.
        moe_expert_load: how the router spreads the routed rows over the experts, one number per
            routed expert in expert order (shape [E]; any scale: each is read as its share of
            the sum), e.g. per-expert token counts logged from a run. None (default): balanced
            in expectation, as Megatron-Core's ``--moe-router-force-load-balancing`` routes
            (random top-k; the busiest EP rank's excess priced). Under expert
            parallelism the EP rank holding the busiest contiguous block of E / ep experts sets
            the pace of the dispatch, the expert GEMMs and their saved activations
            (:func:`autopar.cost.capacity.routed_scale`, which also applies a capacity factor
            expert by expert).

    Raises:
        InvalidTrainingConfig: a non-positive size or an unknown precision/optimizer/framework;
            a capacity factor that is not a positive finite number, or padding without one;
            an expert load that is not a sequence of at least two finite numbers >= 0 with a
            positive sum.
    """

    global_batch_size: int
    seq_len: int
    micro_batch_size: int | None = None
    precision: str = "bf16"
    optimizer: str = "adam"
    flash_attention: bool = True
    framework: str = "torch"
    optimizer_offload: bool = False
    optimizer_state_dtype: str = "fp32"
    param_offload: bool = False
    activation_offload: bool = False
    moe_capacity_factor: float | None = None
    moe_pad_to_capacity: bool = False
    moe_expert_load: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _positive_int("TrainingConfig", "global_batch_size", self.global_batch_size,
                      maximum=MAX_GLOBAL_BATCH)
        _positive_int("TrainingConfig", "seq_len", self.seq_len, maximum=MAX_SEQ_LEN)
        _positive_int("TrainingConfig", "micro_batch_size", self.micro_batch_size, allow_none=True)
        _bool("TrainingConfig", "flash_attention", self.flash_attention)
        _bool("TrainingConfig", "optimizer_offload", self.optimizer_offload)
        _bool("TrainingConfig", "param_offload", self.param_offload)
        _bool("TrainingConfig", "activation_offload", self.activation_offload)
        _bool("TrainingConfig", "moe_pad_to_capacity", self.moe_pad_to_capacity)
        cf = self.moe_capacity_factor
        if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float))
                               or not math.isfinite(cf) or cf <= 0):
            raise InvalidTrainingConfig(
                f"moe_capacity_factor must be a positive number (expert capacity = ceil(tokens "
                f"x top_k / experts x factor)); got {cf!r}. Fix: pass e.g. 1.0, or None for "
                "dropless MoE.")
        if self.moe_pad_to_capacity and cf is None:
            raise InvalidTrainingConfig(
                "moe_pad_to_capacity=True pads each expert's input to its capacity, which "
                "needs moe_capacity_factor (Megatron-Core: 'moe_expert_capacity_factor must be "
                "set to use moe_pad_expert_input_to_capacity'). Fix: set moe_capacity_factor, "
                "or drop moe_pad_to_capacity.")
        if self.moe_expert_load is not None:
            # one spelling (a tuple of floats): plan files bring it back as a JSON list
            object.__setattr__(self, "moe_expert_load", _expert_load(self.moe_expert_load))
        if not isinstance(self.optimizer_state_dtype, str) \
                or self.optimizer_state_dtype not in OPTIMIZER_STATE_DTYPES:
            raise InvalidTrainingConfig(
                f"optimizer_state_dtype {self.optimizer_state_dtype!r} is not one of "
                f"{OPTIMIZER_STATE_DTYPES}. Fix: use 'fp32' (default) or 'bf16'.")
        if self.micro_batch_size is not None and self.micro_batch_size > self.global_batch_size:
            raise InvalidTrainingConfig(
                f"micro_batch_size {self.micro_batch_size} exceeds global_batch_size "
                f"{self.global_batch_size} (--micro-batch, --global-batch on the command "
                "line). Fix: use a micro-batch <= the global batch.")
        if not isinstance(self.precision, str) or self.precision not in PRECISIONS:
            raise InvalidTrainingConfig(
                f"precision {self.precision!r} is not one of {PRECISIONS}. Fix: use 'bf16'.")
        if not isinstance(self.optimizer, str) or self.optimizer not in OPTIMIZERS:
            raise InvalidTrainingConfig(
                f"optimizer {self.optimizer!r} is not one of {OPTIMIZERS}. Fix: use 'adam'.")
        if not isinstance(self.framework, str) and hasattr(self.framework, "host_issue"):
            # a FrameworkProfile object (its repr runs to pages): say where it goes instead
            raise InvalidTrainingConfig(
                f"framework must be a framework name, got a FrameworkProfile "
                f"({getattr(self.framework, 'name', '?')!r}). Fix: keep framework="
                f"{getattr(self.framework, 'name', 'torch')!r} here and pass the profile as "
                "profile= to autopar.estimate / autopar.optimize (or framework= to CostModel).")
        if not isinstance(self.framework, str) or self.framework not in FRAMEWORKS:
            raise InvalidTrainingConfig(
                f"framework {self.framework!r} is not one of {FRAMEWORKS}. Fix: use 'torch' "
                "(plan.apply, the default), 'torchtitan', 'megatron', 'deepspeed' or another "
                "of those names.")

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step."""
        return self.global_batch_size * self.seq_len

    @property
    def dtype_bytes(self) -> int:
        """Bytes per weight/activation element in the compute precision."""
        return DTYPE_BYTES[self.precision]


def _distinct(items: tuple) -> tuple:
    """The distinct elements of ``items`` (all of them when some are unhashable)."""
    try:
        return tuple(set(items))
    except TypeError:
        return items


#: :meth:`ParallelConfig.fields_except`'s getter per (class, names left out).
_EXCEPT_GETTERS: dict[tuple, Any] = {}

#: Every valid ``placement`` (an order of :data:`MESH_DIMS`), for the check's common case.
_PLACEMENTS = frozenset(itertools.permutations(MESH_DIMS))

#: ``stage_blocks`` tuples ParallelConfig has checked, each mapped to itself: a configuration
#: holding that very object (``replace`` passes it on) skips the per-element check; an equal
#: tuple of other element types (bools) is another object and is checked. Emptied when large.
_CHECKED_BLOCKS: dict[tuple, tuple] = {}


def _checked(known, value) -> bool:
    """Whether ``value`` is a plain tuple that ``known`` holds (a dict: holds that very object);
    False for anything else, unhashable values included (those take the full check)."""
    if type(value) is not tuple:
        return False
    try:
        if isinstance(known, dict):
            return known.get(value) is value
        return value in known
    except TypeError:
        return False


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees and choices of a parallel layout; ``None`` means "let autopar choose".

    Attributes:
        tp: tensor-parallel degree (Megatron-LM column/row sharding of each block).
        pp: pipeline-parallel degree (stages).
        dp: data-parallel degree; None = world size / (tp * pp * cp).
        cp: context-parallel degree (ring attention over the sequence).
        ep: expert-parallel degree for MoE models: experts are split over ep ranks of the
            data-parallel group (Megatron-LM's expert parallelism); 1 for dense models.
        zero_stage: 0 (replicated), 1 (optimizer states sharded; Megatron's distributed
            optimizer), 2 (+ gradients), 3 (+ parameters; FSDP) over the DP group.
        recompute: "none", "selective" (attention core, Korthikanti et al. 2022, or the
            Megatron-Core modules of ``recompute_modules``), "selective-op" (torchtitan's
            op-level selective checkpointing), "full" (only block inputs kept), or a tuple with
            one of those per decoder block.
        recompute_modules: the Megatron-Core submodules a "selective" block recomputes
            (``--recompute-granularity selective --recompute-modules ...``), a subset of
            :data:`RECOMPUTE_MODULES`; None (default) = :data:`DEFAULT_RECOMPUTE_MODULES`, the
            attention core. Kept in :data:`RECOMPUTE_MODULES` order, the default stored as
            None (one plan, one spelling); read only for "selective" blocks (the search keeps a
            pinned set while it tries other modes).
        sequence_parallel: shard the TP-replicated activations over the sequence (Korthikanti);
            needs tp > 1 (:data:`SP_NEEDS_TP`): at tp=1 it is turned off here, and
            :func:`autopar.estimate` / :func:`autopar.optimize` refuse such a config.
        micro_batch_size: sequences per micro-batch; None = choose.
        virtual_stages: model chunks per pipeline rank (interleaved 1F1B); None = choose, 1 = none.
        schedule: one of :data:`SCHEDULES` ("gpipe", "1f1b", "interleaved-1f1b",
            "interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev", "dualpipe"; spellings
            in :data:`SCHEDULE_ALIASES` are normalised); None = 1F1B, interleaved when
            virtual_stages > 1. The V-shaped ones need virtual_stages 2 (None becomes 2).
            "dualpipe" (DeepSeek's bidirectional DualPipe) is priced as DualPipeV's order on
            the same ranks with the parameters kept twice (:data:`PARAMETER_COPIES`).
        stage_blocks: decoder blocks per pipeline chunk, in model order (pp * virtual_stages
            entries); None = balanced.
        cp_mode: how context parallelism exchanges attention inputs: "ring" (ring attention,
            K/V passed around the ring, overlapped), "ulysses" (all-to-all to head-sharding;
            needs heads divisible by tp * cp) or "allgather" (K/V all-gathered, as Llama 3).
        placement: order in which mesh dimensions are laid on consecutive ranks, innermost
            first (a permutation of "tp", "cp", "dp", "pp"); None = :data:`DEFAULT_PLACEMENT`.
        reshard_after_forward: with ``zero_stage=3`` only, one bool per decoder block: True
            frees the block's gathered parameters after its forward (FSDP2 ``fully_shard(block,
            reshard_after_forward=True)``: gathered again for backward), False keeps them until
            its backward (one all-gather per micro-batch instead of two, the block's full
            parameters resident). None = every block reshards (plain ZeRO-3).
        expert_tp: expert-tensor-parallel degree (etp) of the MoE layers' routed experts, for
            Megatron-Core's "MoE parallel folding" (megatron/core/transformer/moe/README.md
            "MoE Parallel Folding"; Liu et al. 2025, arXiv 2504.14960): the MoE layers get their
            own mapping of the same GPUs, etp x ep x expert-dp over the attention's tp x cp x dp
            ranks of a pipeline stage, etp innermost, then ep (parallel_state.py
            ``initialize_model_parallel``: the expert RankGenerator over ``tp=
            expert_tensor_parallel_size, ep, dp=expert_data_parallel_size, cp=1``). ep x etp
            must divide tp x cp x dp (world_size % (etp * ep * pp) == 0, the same file); the
            expert-data-parallel group is tp x cp x dp / (ep x etp). None (default) = equal to
            tp, with ep carved out of dp (the mapping autopar used before; a value equal to tp
            is stored as None, so both spellings are one plan). :attr:`etp` is the degree.
        dispatcher: the MoE token dispatcher, one of :data:`DISPATCHERS` ("alltoall", the
            default, "deepep" or "allgather"); only frameworks that run it accept "deepep" or
            "allgather" (:attr:`autopar.frameworks.FrameworkProfile.dispatchers`). The search
            keeps a pinned dispatcher and uses "alltoall" when none is pinned; pinning "auto"
            (``fixed={"dispatcher": "auto"}``, ``--dispatcher auto``) lets it choose between
            "alltoall" and "allgather" for ep > 1 where the framework runs both
            (:func:`autopar.search.space.dispatchers`; DeepEP is never searched).
        vp_group: under interleaved 1F1B, the micro-batches each pipeline rank runs through one
            model chunk before it moves to the next (Megatron-LM's
            ``--microbatch-group-size-per-virtual-pipeline-stage`` N, in [pp, micro-batches],
            the last group of the step holding the remainder, which must be 0 or at least pp:
            megatron/core/pipeline_parallel/schedules.py ``get_schedule_table``,
            ``forward_backward_pipelining_with_interleaving``). A larger N holds more
            micro-batches in flight (warm-up ``2 (pp - rank - 1) + (v - 1) N``) and lets the
            micro-batch count be any multiple-free value N allows. None (default) = the
            schedule's own: pp under Megatron-LM; torch's ``ScheduleInterleaved1F1B`` takes
            ``m / max(1, m // pp)`` and has no such knob. Needs virtual_stages > 1.

    Raises:
        InvalidParallelConfig: a degree below 1, an unknown mode, or inconsistent choices.
    """

    tp: int = 1
    pp: int = 1
    dp: int | None = None
    cp: int = 1
    zero_stage: int = 0
    recompute: str | tuple[str, ...] = "none"
    sequence_parallel: bool = False
    micro_batch_size: int | None = None
    virtual_stages: int | None = None
    schedule: str | None = None
    stage_blocks: tuple[int, ...] | None = None
    placement: tuple[str, ...] | None = None
    cp_mode: str = "ring"
    ep: int = 1
    reshard_after_forward: tuple[bool, ...] | None = None
    expert_tp: int | None = None
    dispatcher: str = "alltoall"
    recompute_modules: tuple[str, ...] | None = None
    vp_group: int | None = None

    # the hash, once computed, in a slot beside the instance dict (so neither a field nor
    # copied by replace(), pickled or compared): a search hashes each configuration many
    # times as a cache key, its per-block tuples included
    # ``_sp_at_tp1``: set (in the same way, outside the fields) when the caller asked for
    # sequence parallelism at tp=1 and __post_init__ turned it off, so that the public entry
    # points can refuse the request rather than drop it silently (:func:`check_sp_request`)
    __slots__ = ("__dict__", "__weakref__", "_hash", "_sp_at_tp1")

    def __hash__(self) -> int:
        """The dataclass's own hash (of the field values in order), computed once."""
        try:
            return self._hash
        except AttributeError:
            h = hash(self.fields_except())
            object.__setattr__(self, "_hash", h)
            return h

    def __getstate__(self) -> dict:
        """The fields only (a cached hash is not carried to another process, whose string
        hashes differ)."""
        return dict(self.__dict__)

    def __post_init__(self) -> None:
        # the usual case (plain ints >= 1, or None where allowed) passes without the per-field
        # calls below, which give the error messages
        tp, pp, cp, ep, dp, mb, v = (self.tp, self.pp, self.cp, self.ep, self.dp,
                                     self.micro_batch_size, self.virtual_stages)
        if not (type(tp) is int and type(pp) is int and type(cp) is int and type(ep) is int
                and tp >= 1 and pp >= 1 and cp >= 1 and ep >= 1
                and (dp is None or type(dp) is int and dp >= 1)
                and (mb is None or type(mb) is int and mb >= 1)
                and (v is None or type(v) is int and v >= 1)):
            for name in ("tp", "pp", "cp", "ep"):
                _positive_int("ParallelConfig", name, getattr(self, name))
            for name in ("dp", "micro_batch_size", "virtual_stages"):
                _positive_int("ParallelConfig", name, getattr(self, name), allow_none=True)
        if isinstance(self.zero_stage, bool) or not isinstance(self.zero_stage, int) \
                or self.zero_stage not in (0, 1, 2, 3):
            raise InvalidParallelConfig(
                f"zero_stage must be the int 0, 1, 2 or 3; got {self.zero_stage!r}. Fix: e.g. "
                "zero_stage=1 (optimizer states sharded over DP).")
        _bool("ParallelConfig", "sequence_parallel", self.sequence_parallel)
        if isinstance(self.recompute, list):
            object.__setattr__(self, "recompute", tuple(self.recompute))
        modes = (self.recompute,) if isinstance(self.recompute, str) else self.recompute
        # per-block tuples repeat a few modes: check each distinct element once
        if not isinstance(modes, tuple) or not modes or any(
                not isinstance(m, str) or m not in RECOMPUTE_MODES for m in _distinct(modes)):
            raise InvalidParallelConfig(
                f"recompute must be one of {RECOMPUTE_MODES} or a tuple of them per block; got "
                f"{self.recompute!r}. Fix: e.g. recompute='selective'.")
        if isinstance(self.schedule, str) and self.schedule not in SCHEDULES:
            object.__setattr__(self, "schedule",
                               SCHEDULE_ALIASES.get(self.schedule.lower(), self.schedule))
        if self.schedule is not None and (not isinstance(self.schedule, str)
                                          or self.schedule not in SCHEDULES):
            raise InvalidParallelConfig(
                f"schedule {self.schedule!r} is not one of {SCHEDULES}. Fix: use one of them, or "
                "None to let autopar choose.")
        if self.schedule in ("gpipe", "1f1b") and (self.virtual_stages or 1) > 1:
            raise InvalidParallelConfig(
                f"schedule {self.schedule!r} has one chunk per stage; virtual_stages="
                f"{self.virtual_stages} needs schedule 'interleaved-1f1b'. Fix: use "
                "schedule='interleaved-1f1b' or virtual_stages=1.")
        if self.schedule in V_SCHEDULES:
            if self.virtual_stages not in (None, 2):
                raise InvalidParallelConfig(
                    f"schedule {self.schedule!r} places exactly 2 chunks on each pipeline rank "
                    f"(a V); virtual_stages={self.virtual_stages}. Fix: virtual_stages=2 (or "
                    "None), or schedule 'interleaved-zero-bubble' for other chunk counts.")
        if self.sequence_parallel and self.tp == 1:
            object.__setattr__(self, "sequence_parallel", False)
            object.__setattr__(self, "_sp_at_tp1", True)
        if not isinstance(self.cp_mode, str) or self.cp_mode not in CP_MODES:
            raise InvalidParallelConfig(
                f"cp_mode {self.cp_mode!r} is not one of {CP_MODES}. Fix: use 'ring' (default).")
        if self.placement is not None and not _checked(_PLACEMENTS, self.placement):
            if not isinstance(self.placement, (list, tuple)):
                raise InvalidParallelConfig(
                    f"placement must be a sequence of {MESH_DIMS} (innermost first); got "
                    f"{self.placement!r}. Fix: e.g. placement=('tp', 'cp', 'dp', 'pp').")
            object.__setattr__(self, "placement", tuple(self.placement))
            if any(not isinstance(d, str) for d in self.placement) \
                    or sorted(self.placement) != sorted(MESH_DIMS):
                raise InvalidParallelConfig(
                    f"placement must order all of {MESH_DIMS} (innermost first); got "
                    f"{self.placement!r}. Fix: e.g. placement=('tp', 'cp', 'dp', 'pp').")
        if self.stage_blocks is not None and not _checked(_CHECKED_BLOCKS,
                                                          self.stage_blocks):
            blocks = self.stage_blocks
            plain = isinstance(blocks, (list, tuple)) and blocks and set(map(type, blocks)) == {
                int} and min(blocks) >= 0   # the usual case, checked without a Python loop
            if not plain and (not isinstance(blocks, (list, tuple)) or not blocks or any(
                    isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in blocks)):
                raise InvalidParallelConfig(
                    f"stage_blocks must be a non-empty sequence of non-negative ints (decoder "
                    f"blocks per pipeline chunk); got {self.stage_blocks!r}. Fix: e.g. "
                    "stage_blocks=(16, 16) for pp=2, or None for balanced cuts.")
            object.__setattr__(self, "stage_blocks", tuple(self.stage_blocks))
            if type(blocks) is tuple:
                if len(_CHECKED_BLOCKS) > 4096:
                    _CHECKED_BLOCKS.clear()
                _CHECKED_BLOCKS[blocks] = blocks
        if self.reshard_after_forward is not None:
            r = self.reshard_after_forward
            # bool cannot be subclassed: the set of element types is {bool} exactly when
            # every element is a bool (checked without a Python loop over 100+ blocks)
            if not isinstance(r, (list, tuple)) or not r or set(map(type, r)) != {bool}:
                raise InvalidParallelConfig(
                    f"reshard_after_forward must be None or a non-empty sequence of bools (one "
                    f"per decoder block); got {r!r}. Fix: e.g. (True, False, True, True), or "
                    "None.")
            object.__setattr__(self, "reshard_after_forward", tuple(r))
            if self.zero_stage != 3 and not all(r):
                raise InvalidParallelConfig(
                    f"reshard_after_forward {tuple(r)} keeps some blocks' gathered parameters, "
                    f"which only FSDP (zero_stage=3) gathers; zero_stage={self.zero_stage}. "
                    "Fix: zero_stage=3, or reshard_after_forward=None.")
            if all(r):   # every block reshards: plain ZeRO-3, written one way only
                object.__setattr__(self, "reshard_after_forward", None)
        if self.dispatcher != "alltoall" and self.dispatcher not in DISPATCHERS:
            raise InvalidParallelConfig(
                f"dispatcher {self.dispatcher!r} is not one of {DISPATCHERS}. Fix: use "
                "'alltoall' (default), 'deepep' or 'allgather'.")
        if self.expert_tp is not None:
            _positive_int("ParallelConfig", "expert_tp", self.expert_tp)
            if self.expert_tp == self.tp:   # today's mapping, written one way only
                object.__setattr__(self, "expert_tp", None)
        if self.recompute_modules is not None:
            object.__setattr__(self, "recompute_modules",
                               _recompute_modules(self.recompute_modules))
        if self.vp_group is not None:
            _positive_int("ParallelConfig", "vp_group", self.vp_group)
            if self.virtual_stages == 1 or self.schedule not in (None, "interleaved-1f1b"):
                raise InvalidParallelConfig(
                    f"vp_group={self.vp_group} groups the micro-batches of interleaved 1F1B's "
                    f"model chunks; schedule={self.schedule!r}, virtual_stages="
                    f"{self.virtual_stages} has none. Fix: vp_group=None, or schedule="
                    "'interleaved-1f1b' with virtual_stages > 1.")

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """The Megatron-Core submodules a "selective" block recomputes:
        :attr:`recompute_modules`, or :data:`DEFAULT_RECOMPUTE_MODULES` when it is None."""
        return self.recompute_modules or DEFAULT_RECOMPUTE_MODULES

    @property
    def etp(self) -> int:
        """Expert-tensor-parallel degree: :attr:`expert_tp`, or tp when it is None."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def folded(self) -> bool:
        """Whether the MoE layers have their own mapping (:attr:`expert_tp` differs from tp:
        MoE parallel folding), rather than ep carved out of dp with etp = tp."""
        return self.expert_tp is not None

    @property
    def model_parallel_size(self) -> int:
        """GPUs one model replica spans: tp * pp * cp."""
        return self.tp * self.pp * self.cp

    def block_recompute(self, num_blocks: int) -> tuple[str, ...]:
        """The recompute mode of each decoder block.

        Raises:
            InvalidParallelConfig: a per-block tuple of the wrong length.
        """
        if isinstance(self.recompute, str):
            return (self.recompute,) * num_blocks
        if len(self.recompute) != num_blocks:
            raise InvalidParallelConfig(
                f"recompute has {len(self.recompute)} entries but the model has {num_blocks} "
                "blocks. Fix: give one mode per block, or a single mode.")
        return tuple(self.recompute)

    def block_reshard(self, num_blocks: int) -> tuple[bool, ...]:
        """Whether each decoder block reshards its parameters after forward (all True unless
        ``reshard_after_forward`` says otherwise).

        Raises:
            InvalidParallelConfig: a per-block tuple of the wrong length.
        """
        if self.reshard_after_forward is None:
            return (True,) * num_blocks
        if len(self.reshard_after_forward) != num_blocks:
            raise InvalidParallelConfig(
                f"reshard_after_forward has {len(self.reshard_after_forward)} entries but the "
                f"model has {num_blocks} blocks. Fix: give one bool per block, or None.")
        return self.reshard_after_forward

    def replace(self, **changes) -> "ParallelConfig":
        """A copy with some fields changed (validated again).

        Raises:
            TypeError: a name that is not a field (as :func:`dataclasses.replace`).
            InvalidParallelConfig: the changed configuration breaks a rule.
        """
        # every field is an init field: this is dataclasses.replace without its field walk,
        # and, for this class, without the generated __init__'s one setattr per field: the
        # fields in the same order, then the same __post_init__
        if type(self) is not ParallelConfig or not changes.keys() <= _FIELD_NAMES:
            return type(self)(**{**self.__dict__, **changes})
        new = object.__new__(ParallelConfig)
        d = new.__dict__
        d.update(self.__dict__)
        d.update(changes)
        new.__post_init__()
        return new

    def fields_except(self, *names: str) -> tuple:
        """The field values in order, less those of ``names``: the cache key of a cost that
        does not read those fields (e.g. a pipeline timing shared by every ZeRO stage)."""
        get = _EXCEPT_GETTERS.get((type(self), names))
        if get is None:   # the fields kept, in order, read by one C call (a hot search key)
            keep = [f for f in self.__dict__ if f not in names]
            pick = operator.itemgetter(*keep)
            get = _EXCEPT_GETTERS[type(self), names] = pick if len(keep) > 1 else (
                lambda d: (pick(d),))
        return get(self.__dict__)

    def to_dict(self) -> dict:
        """Plain-JSON form (tuples become lists)."""
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of the fields, in order."""
        return tuple(f.name for f in fields(cls))


#: ParallelConfig's field names (:meth:`ParallelConfig.replace`'s fast path).
_FIELD_NAMES = frozenset(f.name for f in fields(ParallelConfig))


def check_sp_request(config: "ParallelConfig | dict", name: str) -> None:
    """Refuse a request for sequence parallelism at tp=1, which :class:`ParallelConfig` turns
    off (:data:`SP_NEEDS_TP`): ``config`` is a ParallelConfig built with
    ``sequence_parallel=True, tp=1``, or a dict of pins (``optimize``'s ``fixed=``) with
    ``sequence_parallel`` true and ``tp`` 1 (a dict without ``tp`` leaves it to the search,
    which uses SP only where tp > 1). ``name`` names the argument in the message.

    Raises:
        InvalidParallelConfig: the request, with the rule and the fix.
    """
    if isinstance(config, ParallelConfig):
        asked = getattr(config, "_sp_at_tp1", False)
    else:
        asked = bool(config.get("sequence_parallel")) and config.get("tp") == 1
    if asked:
        raise InvalidParallelConfig(
            f"{name} asks for sequence_parallel=True at tp=1, but {SP_NEEDS_TP} (the CLI "
            "ignores --sp at --tp 1 with a note). Fix: sequence_parallel=False (or leave it "
            "out), or tp > 1, e.g. tp=2.")


def check_micro_batch(train: TrainingConfig, given: "ParallelConfig | dict", name: str) -> None:
    """Refuse two different micro-batch sizes: ``train.micro_batch_size`` and the
    ``micro_batch_size`` of ``given`` (a ParallelConfig, or ``optimize``'s ``fixed=`` dict),
    where the latter would silently win. ``name`` names ``given`` in the message.

    Raises:
        InvalidParallelConfig: both set and different, with the fix.
    """
    other = given.get("micro_batch_size") if isinstance(given, dict) \
        else given.micro_batch_size
    if None not in (other, train.micro_batch_size) and other != train.micro_batch_size:
        raise InvalidParallelConfig(
            f"two micro-batch sizes: TrainingConfig.micro_batch_size={train.micro_batch_size} "
            f"and {name} micro_batch_size={other}; the second would be used and the first "
            "ignored. Fix: set it in one place (or give both the same value).")
