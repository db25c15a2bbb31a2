"""Out-of-sample validation of the cost model over published runs (issue 13's honest metrics).

Three questions, each over every record of the corpus (``benchmarks/data/*.json``):

- ``loso``: leave one source out. Constants fitted to records would be refitted without the
  source's records and the source predicted with them; autopar fits none
  (:data:`FITTED_CONSTANTS` is empty: every constant comes from a datasheet, a paper or an
  assumption named in :mod:`autopar.cost.params`), so each source's prediction is already out of
  sample. Per source: signed bias (mean of (predicted - measured) / measured) and MAPE.
- ``pairs``: runs of the same model, cluster and batch that differ in the plan; a pair is right
  when the predicted order of step times is the measured one (pairs whose measured times are
  within :data:`PAIR_TIE` of each other are not counted).
- ``memory``: predicted vs published peak memory per GPU (GiB, as frameworks report it).

Unpublished plan fields take the framework's documented default (:func:`framework_defaults`), never
the cost model's own fastest choice; the fastest legal choice is printed beside as the spread.
A record autopar cannot estimate is refused with a one-line reason (:func:`refusal`), never
dropped. The sources of the locked validation split (:data:`LOCKED_SPLIT`) are held out of the
development split (:func:`split_corpus`, :func:`dev_corpus`).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import autopar
from autopar.api import model_graph
from autopar.config import V_SCHEDULES
from autopar.cost.model import CostModel
from autopar.cost.notes import HOST_NOTE_SHARE
from autopar.frameworks import (FrameworkProfile, MemoryConventions, get_profile, shard_within,
                                with_compiled_loss, with_inplace_loss, with_pure_bf16)
from autopar.frameworks.choices import FLASH_ATTN_3, TORCH_COMPILE, with_choice
from autopar.frameworks.stacks.deepspeed import (HF_AUTO, with_deepspeed_030,
                                                 with_hf_trainer_torch_adamw,
                                                 with_megatron_v1_model, with_zero_config)
from autopar.frameworks.stacks.inhouse import with_llama3_fsdp
from autopar.frameworks.stacks.pithtrain import with_pithtrain_fsdp, with_pithtrain_kernels
from autopar.frameworks.stacks.pytorch import with_fp32_reduce
from autopar.frameworks.stacks.megatron import (ALLTOALL_TOKEN_LEVEL_SINCE,
                                                MOE_PROBS_IN_ACTIVATION_SINCE,
                                                with_alltoall_seq_2024,
                                                with_moe_probs_at_combine,
                                                with_overlapped_distributed_optimizer)
from autopar.frameworks.stacks.torchtitan import (COMPILED_LOSS, COMPILED_LOSS_SINCE,
                                                  FUSED_ADAMW_SINCE, with_chunked_loss,
                                                  QK_NORM_SHARDED_SINCE,
                                                  SAC_SAVES_ALLTOALL_SINCE,
                                                  with_float8nocompile, with_foreach_adamw,
                                                  with_replicated_qk_norm, with_sac_redispatch)
from autopar.frameworks.stacks.xtuner import with_xtuner_attention
from autopar.search.optimize import search

from .records import Record, RecordError, parse, source_key
from . import host_rate as host_rates

DATA_DIR = Path(__file__).resolve().parent / "data"
#: Names of cost-model constants fitted to published records (refitted per left-out source).
FITTED_CONSTANTS: tuple[str, ...] = (
    "host_op_s_published of megatron and nemo (benchmarks.host_rate)",)
#: Measured step times closer than this (relative) are a tie: no order to get right.
PAIR_TIE = 0.01
GIB = 2 ** 30


#: The locked validation split: ``{"rule": how the sources were chosen, "sources": [source
#: keys (:func:`benchmarks.records.source_key`)]}``. Its sources are held out of every figure of
#: the development split (``--cv source``, the error bands) and evaluated only with
#: ``--split locked`` (or ``all``).
LOCKED_SPLIT = DATA_DIR / "locked_split.json"
#: Files of :data:`DATA_DIR` that hold no records.
NOT_RECORDS = frozenset({LOCKED_SPLIT.name})


def corpus_files() -> list[Path]:
    """The record files of the corpus: every ``*.json`` of :data:`DATA_DIR` but
    :data:`NOT_RECORDS`, sorted."""
    return sorted(f for f in DATA_DIR.glob("*.json") if f.name not in NOT_RECORDS)


def load_corpus(paths: list[str | Path] | None = None) -> list[dict]:
    """Raw records of every corpus file (default: :func:`corpus_files`)."""
    files = [Path(p) for p in paths] if paths else corpus_files()
    out = []
    for f in files:
        out.extend(json.loads(f.read_text()))
    return out


def locked_sources(path: Path | None = None) -> frozenset[str]:
    """The source keys of the locked validation split (:data:`LOCKED_SPLIT`; none when the
    file is absent)."""
    path = LOCKED_SPLIT if path is None else Path(path)
    if not path.exists():
        return frozenset()
    return frozenset(json.loads(path.read_text()).get("sources", []))


def split_corpus(raw: list[dict], locked: frozenset[str] | None = None
                 ) -> tuple[list[dict], list[dict]]:
    """(development records, locked records) of ``raw``, in corpus order: a record is locked
    when its :func:`benchmarks.records.source_key` is in ``locked`` (default
    :func:`locked_sources`)."""
    locked = locked_sources() if locked is None else locked
    dev = [r for r in raw if source_key(r) not in locked]
    held = [r for r in raw if source_key(r) in locked]
    return dev, held


def dev_corpus() -> list[dict]:
    """The development split: every corpus record whose source is not locked (what the error
    bands and ``--cv source`` are computed from)."""
    return split_corpus(load_corpus())[0]


def _kind(framework: str) -> str:
    f = framework.lower()
    for key in ("torchtitan", "nemo", "deepspeed", "llm-foundry", "fsdp", "megatron",
                "internevo"):
        if key in f:
            return key
    return "unknown"


def framework_kind(framework: str) -> str:
    """The software family of a record's ``training.framework`` text: torchtitan, nemo,
    deepspeed, llm-foundry, fsdp, megatron or unknown (first match in that order)."""
    return _kind(framework)


#: Each framework's documented default for plan fields a source leaves open, with its source.
#: Fields no framework defaults (the micro-batch must be given to Megatron-LM) take the smallest
#: legal value; the printed spread shows what the fastest legal choice would give.
_DEFAULTS = {
    # megatron/training/arguments.py: no --use-distributed-optimizer, no recompute, no SP, no
    # virtual pipeline (one chunk per stage: 1F1B)
    "megatron": dict(zero_stage=0, recompute="none", sequence_parallel=False, virtual_stages=1,
                     cp=1, micro_batch_size=1),
    # NeMo 2.0 pretraining recipes (llm/recipes/*.py): distributed optimizer and SP on, mbs 1
    "nemo": dict(zero_stage=1, recompute="none", sequence_parallel=True, virtual_stages=1, cp=1,
                 micro_batch_size=1),
    # deepspeed/runtime/constants.py: ZeRO stage 0, micro-batch 1; no activation checkpointing
    "deepspeed": dict(zero_stage=0, recompute="none", sequence_parallel=False, virtual_stages=1,
                      cp=1, micro_batch_size=1),
    # torchtitan/config/job_config.py: FSDP (dp_shard=-1), selective AC (selective_ac_option
    # "op": op-level SAC), pipeline mbs 1
    "torchtitan": dict(zero_stage=3, recompute="selective-op", sequence_parallel=True,
                       virtual_stages=1, cp=1, micro_batch_size=1),
    # FSDP FULL_SHARD is the default ShardingStrategy (torch.distributed.fsdp)
    "fsdp": dict(zero_stage=3, recompute="none", sequence_parallel=False, virtual_stages=1, cp=1,
                 micro_batch_size=1),
    "llm-foundry": dict(zero_stage=3, recompute="none", sequence_parallel=False,
                        virtual_stages=1, cp=1, micro_batch_size=1),
    # InternEvo: no documented default taken (as an unnamed stack)
    "internevo": dict(zero_stage=0, recompute="none", sequence_parallel=False,
                      virtual_stages=1, cp=1, micro_batch_size=1),
    "unknown": dict(zero_stage=0, recompute="none", sequence_parallel=False, virtual_stages=1,
                    cp=1, micro_batch_size=1),
}


def profile_name(rec: Record) -> str:
    """The library profile (:data:`autopar.frameworks.PROFILES`) of the stack a record names in
    its ``training.framework`` text: NeMo -> ``nemo``; Megatron-LM of 2023 or before ->
    ``megatron-2023``, later -> ``megatron``; an unnamed in-house stack -> ``inhouse-2024``;
    DeepSpeed stacks -> ``deepspeed``; TinyLlama -> ``tinyllama``; llm-foundry ->
    ``llm-foundry``; a trainer the text says runs FSDP2 -> ``torch`` (stock ``fully_shard``;
    PithTrain apart, whose FSDP2 loop is its own option); other FSDP trainers (fms-fsdp,
    fairscale FSDP) -> ``fsdp1``; InternEvo /
    InternLM -> ``internevo``, or ``internevo-fsdp`` for its ZeRO-3 (FSDP) runs; flash-attention's
    FlashAttention-v1 training code -> ``flash-attention-training``; else ``torch`` or
    ``torchtitan``."""
    kind = _kind(rec.framework)
    f = rec.framework.lower().replace(" ", "").replace("-", "")
    intern = "internevo" in f or "internlm" in f
    if kind == "nemo":
        return "nemo"
    if kind == "megatron":
        year = re.search(r"(20\d\d)", rec.framework)
        return "megatron-2023" if year and int(year.group(1)) <= 2023 else "megatron"
    if kind == "unknown" and not intern and "lightning" not in f:
        return "inhouse-2024"
    if kind in ("deepspeed", "torchtitan", "llm-foundry"):
        return kind
    if kind == "fsdp":
        if "fsdp2" in f and "pithtrain" not in f:
            return "torch"   # a trainer on stock FSDP2 (fully_shard), not FSDP1's flat params
        return "tinyllama" if "tinyllama" in f else "fsdp1"
    if intern:
        return "internevo-fsdp" if rec.fixed.get("zero_stage", 1) == 3 else "internevo"
    return "flash-attention-training" if "flashattentionv1" in f else "torch"


#: PithTrain's cross entropy (mlc-ai/pith-train 093a9e4, 2026-05): every run's criterion.
PITHTRAIN_LOSS = ("pith-train 093a9e4 pithtrain/tasks/pretrain_language_model.py criterion -> "
                  "pithtrain/operators/cross_entropy.py CrossEntropy: cross_entropy_fwd "
                  "overwrites the logits with (softmax - onehot) / N in their dtype, "
                  "ctx.save_for_backward(inp.detach()), backward inp.mul_(grad_output)")


def sac_saves_alltoall_since(rec: Record) -> str:
    """The first date from which torchtitan's op-level selective recomputation keeps the
    all-to-all's outputs for this record's model
    (:data:`autopar.frameworks.stacks.torchtitan.SAC_SAVES_ALLTOALL_SINCE`: DeepSeek and Llama 4
    models by their name, every other model from the central save list)."""
    name = rec.model.name.lower().replace("-", "").replace("_", "")
    key = next((k for k in SAC_SAVES_ALLTOALL_SINCE if k != "*" and k in name), "*")
    return SAC_SAVES_ALLTOALL_SINCE[key]


def dated_before(text: str, iso: str) -> bool:
    """Whether the first date in a framework text ("2024", "2024-11", "~2025-01") lies wholly
    before the ISO date ``iso`` (a year alone: before its year; a year and month: before its
    month); False when the text names no date."""
    m = re.search(r"(20\d\d)(?:-(\d\d))?", text)
    if not m:
        return False
    year, month = int(m.group(1)), m.group(2)
    y, mo = int(iso[:4]), int(iso[5:7])
    if month is None:
        return year < y
    return (year, int(month)) < (y, mo)


def record_profile(rec: Record) -> FrameworkProfile:
    """The record's library profile (:func:`profile_name`) with the options its record states:
    torch.compile (:data:`autopar.frameworks.choices.TORCH_COMPILE`: ``training.torch_compile``,
    else "torch.compile" in the framework text), FlashAttention-3 (``training.attention_kernel``
    "fa3": :data:`autopar.frameworks.choices.FLASH_ATTN_3`), FSDP's HYBRID_SHARD in the
    notes or ``plan.hybrid_shard`` (HSDP within a node) or InternEvo's ``zero1=N`` (:func:`autopar.frameworks.
    shard_within`), "full bf16" / "pure bf16" in the framework text (:func:`autopar.frameworks.
    with_pure_bf16`); a torchtitan run dated before torchtitan's fused-AdamW default
    (:data:`autopar.frameworks.stacks.torchtitan.FUSED_ADAMW_SINCE`) steps with the foreach
    AdamW (:func:`autopar.frameworks.stacks.torchtitan.with_foreach_adamw`), and before
    :data:`~autopar.frameworks.stacks.torchtitan.QK_NORM_SHARDED_SINCE` its query/key norms
    replicated under TP (:func:`autopar.frameworks.stacks.torchtitan.with_replicated_qk_norm`),
    and before :func:`sac_saves_alltoall_since` its op-level recomputation re-running the MoE
    all-to-alls (:func:`autopar.frameworks.stacks.torchtitan.with_sac_redispatch`);
    a Megatron-LM or
    NeMo run dated before :data:`autopar.frameworks.stacks.megatron.
    MOE_PROBS_IN_ACTIVATION_SINCE` keeps the MoE combine's expert output
    (:func:`autopar.frameworks.stacks.megatron.with_moe_probs_at_combine`), and one dated
    before :data:`autopar.frameworks.stacks.megatron.ALLTOALL_TOKEN_LEVEL_SINCE` runs the 2024
    all-to-all dispatcher with its TP all-to-alls (:func:`autopar.frameworks.stacks.megatron.
    with_alltoall_seq_2024`); a record's ``training.loss_chunks`` runs its loss in that many
    sequence chunks (:func:`autopar.frameworks.stacks.torchtitan.with_chunked_loss`); an
    eager FP8 run whose ``training.fp8_recipe`` names float8nocompile casts with torchao's
    prototype kernels (:func:`autopar.frameworks.stacks.torchtitan.with_float8nocompile`); a
    PithTrain run's loss writes the logits' gradient in place (:data:`PITHTRAIN_LOSS`,
    :func:`autopar.frameworks.stacks.with_inplace_loss`) and its data parallelism is FSDP2
    under its DualPipeV loop (:func:`autopar.frameworks.stacks.pithtrain.with_pithtrain_fsdp`),
    its decoder layers compiled (:func:`autopar.frameworks.stacks.pithtrain.
    with_pithtrain_kernels`);
    a Megatron-LLaMA run (2023) with ZeRO-2 runs that fork's OverlappedDistributedOptimizer
    (:func:`autopar.frameworks.stacks.megatron.with_overlapped_distributed_optimizer`);
    Meta's in-house stack ("meta internal" in the framework text: the Llama 3 runs) runs the
    data parallelism the Llama 3 paper states
    (:func:`autopar.frameworks.stacks.inhouse.with_llama3_fsdp`); a DeepSpeed run of
    DeepSpeedExamples' Megatron-LM GPT-2 runs that model's own attention ops
    (:func:`autopar.frameworks.stacks.deepspeed.with_megatron_v1_model`); an XTuner 0.1 run
    ("XTuner 0.1." in a DeepSpeed framework text) runs XTuner's attention, KV heads repeated
    before its sequence-parallel all-to-all (:func:`autopar.frameworks.stacks.xtuner.
    with_xtuner_attention`)."""
    profile = get_profile(profile_name(rec))
    f = rec.framework.lower().replace(" ", "").replace("-", "")
    compiled = rec.torch_compile   # the run's own statement (training.torch_compile) first
    if compiled is None:
        compiled = "torch.compile" in rec.framework.lower() and "nocompile" not in f
    if compiled:
        profile = with_choice(profile, TORCH_COMPILE)
    if rec.attention_kernel == "fa3":   # the run calls FlashAttention-3 itself
        profile = with_choice(profile, FLASH_ATTN_3)
    if (compiled and _kind(rec.framework) == "torchtitan"
            and not dated_before(rec.framework, COMPILED_LOSS_SINCE)):
        # torchtitan compiles its loss with the model (from COMPILED_LOSS_SINCE on)
        profile = with_compiled_loss(profile, COMPILED_LOSS)
    elif rec.loss_compiled and not compiled:
        # the model runs eager, its loss under torch.compile (training.loss_compiled:
        # torchtitan's compile.components = ["loss"])
        profile = with_compiled_loss(profile, f"record {rec.id}: compile components ['loss']")
    if "pithtrain" in f:
        # PithTrain's FSDP2 under its DualPipeV loop (before its HSDP shard group, below)
        profile = with_pithtrain_fsdp(profile)
    if (_kind(rec.framework) == "fsdp" and "HYBRID_SHARD" in rec.raw.get("notes", "")) or \
            rec.raw.get("plan", {}).get("hybrid_shard") is True:
        # sharded within a node, replicated across nodes (the --stack-option hsdp)
        profile = shard_within(profile, rec.cluster.gpus_per_node)
    z = re.search(r"zero1[=_](-?\d+)", rec.id + " " + rec.raw.get("notes", ""))
    if profile.name.startswith("internevo") and z and int(z.group(1)) > 1:
        profile = shard_within(profile, int(z.group(1)))
    if _kind(rec.framework) == "deepspeed" and re.search(r"deepspeed 0\.[0-3]\.",
                                                          rec.framework.lower()):
        # the framework text names DeepSpeed 0.3 or before: its ZeRO-1 is stage1.py
        profile = with_deepspeed_030(profile)
    if _kind(rec.framework) == "deepspeed" and "deepspeedexamplesmegatronlm" in f:
        # DeepSpeedExamples' Megatron-LM v1 GPT-2: its attention scales and masks in 3 ops
        profile = with_megatron_v1_model(profile)
    if _kind(rec.framework) == "deepspeed":
        profile = _deepspeed_options(rec, profile)
    if _kind(rec.framework) == "deepspeed" and re.search(r"\bxtuner 0\.1\.", rec.framework.lower()):
        # XTuner 0.1.x on DeepSpeed: its attention repeats the KV heads before the sequence-
        # parallel all-to-all and flash-attn keeps them (autopar.frameworks.stacks.xtuner)
        profile = with_xtuner_attention(profile)
    if _kind(rec.framework) == "torchtitan" and dated_before(rec.framework, FUSED_ADAMW_SINCE):
        # the framework text dates the run before torchtitan made the fused AdamW its default
        profile = with_foreach_adamw(profile)
    if _kind(rec.framework) == "torchtitan" and dated_before(rec.framework,
                                                             QK_NORM_SHARDED_SINCE):
        # the framework text dates the run before torchtitan's Qwen3 TP plan sharded the
        # query/key norms: they ran on whole heads (nothing changes without them or at tp 1)
        profile = with_replicated_qk_norm(profile)
    if _kind(rec.framework) == "torchtitan" and dated_before(rec.framework,
                                                             sac_saves_alltoall_since(rec)):
        # the framework text dates the run before torchtitan's op-level save list kept this
        # model's all-to-alls: a recomputed MoE layer dispatches again (nothing changes
        # without experts, expert parallelism or op-level recomputation)
        profile = with_sac_redispatch(profile)
    if (_kind(rec.framework) in ("megatron", "nemo")
            and dated_before(rec.framework, MOE_PROBS_IN_ACTIVATION_SINCE)):
        # the framework text dates the run before Megatron-Core folded the router's
        # probabilities into the experts' activation: its combine kept the expert output
        profile = with_moe_probs_at_combine(profile)
    if (_kind(rec.framework) in ("megatron", "nemo")
            and dated_before(rec.framework, ALLTOALL_TOKEN_LEVEL_SINCE)):
        # the framework text dates the run before Megatron-Core's token-level all-to-all
        # dispatcher: under TP its dispatcher ran all-to-alls over TP around the MoE layer
        profile = with_alltoall_seq_2024(profile)
    if profile.name == "megatron-2023" and "megatronllama" in f and rec.fixed.get("zero_stage") == 2:
        # Megatron-LLaMA's ZeRO-2 is its OverlappedDistributedOptimizer (its only sharding of
        # gradients): fp32 buckets reduce-scattered in every micro-batch's backward
        profile = with_overlapped_distributed_optimizer(profile)
    if profile.name.startswith("inhouse") and "metainternal" in f:
        # Meta's Llama 3 stack: the data parallelism its paper states (fp32 gradients
        # accumulated over the micro-batches, one fp32 reduce-scatter per step)
        profile = with_llama3_fsdp(profile)
    if "pithtrain" in f:
        # PithTrain's loss writes the logits' gradient into them in its forward; its decoder
        # layers run compiled regions and fused ops
        profile = with_inplace_loss(profile, PITHTRAIN_LOSS)
        profile = with_pithtrain_kernels(profile)
    if rec.grad_reduce_dtype == "fp32" and profile.grad_reduce_bytes != 4:
        # the run's FSDP mixed precision reduces in fp32 (training.grad_reduce_dtype)
        profile = with_fp32_reduce(profile)
    recipe = str((rec.raw.get("training") or {}).get("fp8_recipe") or "").lower()
    if rec.train.precision == "fp8" and not compiled and "float8nocompile" in recipe:
        # an eager FP8 run whose recipe names torchao's float8nocompile prototype: its casts
        # are that prototype's amax-then-cast Triton kernels
        profile = with_float8nocompile(profile, f"record {rec.id}")
    chunks = (rec.raw.get("training") or {}).get("loss_chunks")
    if chunks:
        # the run's loss computes the LM head and cross entropy per sequence chunk
        # (training.loss_chunks: torchtitan's ChunkedCELoss)
        profile = with_chunked_loss(profile, chunks, f"record {rec.id}")
    if re.search(r"\b(?:full|pure) bf16\b", rec.framework.lower()):
        # the stack trains in pure bf16 (torchtune's ``dtype: bf16``): a memory option only
        profile = with_pure_bf16(profile)
    return profile


#: A DeepSpeed record run under Hugging Face's Trainer (its ``training.framework`` text).
_HF_TRAINER = re.compile(r"\btransformers\b[\w\s.]*\btrainer\b", re.I)


def _deepspeed_options(rec: Record, profile: FrameworkProfile) -> FrameworkProfile:
    """A DeepSpeed record's ZeRO buffers and optimizer as its record states them
    (benchmarks/data/README.md ``training.zero_optimization``, ``training.optimizer``): the
    published ``zero_optimization`` block; else, under Hugging Face's Trainer, its "auto" fill
    of the three hidden-size keys (an assumption: HF's example configs set them "auto"); else
    DeepSpeed's defaults (the profile's). torch's AdamW where the optimizer text says HF Trainer
    handed it over."""
    t = rec.raw.get("training") or {}
    block = t.get("zero_optimization")
    hidden = rec.model.hidden_size
    if block is not None:
        profile = with_zero_config(profile, block, hidden, source=f"record {rec.id}")
    elif _HF_TRAINER.search(rec.framework):
        profile = with_zero_config(profile, dict.fromkeys(HF_AUTO, "auto"), hidden,
                                   source=f"record {rec.id} (HF Trainer, 'auto' assumed)")
    if re.search(r"torch\.optim\.adamw from hf trainer", (t.get("optimizer") or "").lower()):
        profile = with_hf_trainer_torch_adamw(profile)
    return profile


def conventions(rec: Record) -> MemoryConventions:
    """The memory conventions the record is scored with: its profile's
    (:attr:`autopar.frameworks.FrameworkProfile.memory`)."""
    return record_profile(rec).memory


def training(rec: Record) -> "autopar.TrainingConfig":
    """The record's training config naming its library profile (:func:`profile_name`)."""
    return replace(rec.train, framework=profile_name(rec))


def attention_kernel(rec: Record) -> str:
    """The fused attention kernel the record's framework ran on its GPU (from
    :func:`record_profile`)."""
    arch = getattr(rec.cluster.device, "architecture", "ampere")
    return record_profile(rec).attention_kernel(arch)


def block_level_recompute(rec: Record, num_blocks: int) -> tuple[str, ...] | None:
    """fms-fsdp's "selective" AC as per-block modes, or None for any other record.

    fms-fsdp's selective activation checkpointing is block-level: full checkpointing on a
    fraction p of the blocks, evenly spaced (fms_fsdp/policies/ac_handler.py
    apply_fsdp_checkpointing: block i (from 1) is checkpointed when i * p reaches the next
    half-integer). The records do not publish p; their published HFU / MFU does: the recomputed
    forward adds one third of a block's training FLOPs (forward : backward = 1 : 2), so
    HFU / MFU = 1 + p / 3 and p = 3 (HFU / MFU - 1), clamped to [0, 1] (read from the record,
    not fitted).
    """
    if "fms" not in rec.framework.lower() or rec.fixed.get("recompute") != "selective":
        return None
    m = rec.raw.get("measured", {})
    if not m.get("mfu") or not m.get("hfu"):
        return None
    p = min(1.0, max(0.0, 3.0 * (m["hfu"] / m["mfu"] - 1.0)))
    modes, cut = [], 0.5
    for i in range(1, num_blocks + 1):
        if p > 0 and i * p >= cut:
            cut += 1
            modes.append("full")
        else:
            modes.append("none")
    return tuple(modes)


def default_dispatcher(rec: Record) -> str:
    """The MoE token dispatcher a record's framework runs when the record names none:
    Megatron-LM and NeMo run Megatron-Core's default, ``allgather`` (transformer_config.py
    ``moe_token_dispatcher_type = "allgather"`` and arguments.py ``--moe-token-dispatcher-type``
    default 'allgather' at every commit from the dispatcher's first, 20383240c5 of 2024-01-20,
    through 9208adbdc7 (2024-03-27), ac0474d26e (2024-10-29), 9e3adb5334 (2025-06-09) and
    megatron-core 0.16.1 line 675); ms-swift's Megatron-SWIFT sets its own, ``alltoall``
    (swift/megatron/argument/megatron_args.py MegatronArguments.moe_token_dispatcher_type =
    'alltoall'); a profile that runs no all-gather dispatcher (Megatron-LM of 2023, torchtitan,
    DeepSpeed, torch) takes ``alltoall``."""
    f = rec.framework.lower()
    if _kind(rec.framework) in ("megatron", "nemo") and "swift" not in f and \
            "allgather" in record_profile(rec).dispatchers:
        return "allgather"
    return "alltoall"


def framework_defaults(rec: Record) -> dict:
    """Values for the record's open plan fields: its framework's defaults (see :data:`_DEFAULTS`);
    an interleaved schedule with an unpublished chunk count takes the smallest interleaving, 2."""
    d = dict(_DEFAULTS[_kind(rec.framework)])
    fixed = rec.fixed
    if (_kind(rec.framework) == "torchtitan" and "2024" in rec.framework
            and fixed.get("pp", 1) > 1 and fixed.get("dp")):
        # torchtitan 2024-12 (config_manager.py --experimental.pipeline_parallel_microbatches,
        # default None -> pipelining_utils.build_pipeline_schedule: the pipeline degree): the
        # local batch is split into pp micro-batches
        local = rec.train.global_batch_size // fixed["dp"]
        if local % fixed["pp"] == 0:
            d["micro_batch_size"] = local // fixed["pp"]
    if fixed.get("schedule") == "interleaved-1f1b" or fixed.get("schedule") in V_SCHEDULES:
        # a V-shaped schedule holds two chunks per rank by definition
        d["virtual_stages"] = 2
    if fixed.get("tp", 1) == 1:
        d["sequence_parallel"] = False
    d["dispatcher"] = default_dispatcher(rec)
    out = {k: v for k, v in d.items() if k in rec.open_fields}
    if "dp" in rec.open_fields:
        out.pop("dp", None)
    return out


@dataclass(frozen=True)
class Row:
    """One evaluated record: predicted step time under the framework defaults and under the
    fastest legal choice, and memory."""

    rec: Record
    predicted_s: float
    fastest_s: float
    memory_gib: float
    fits: bool
    chosen: dict
    mfu: float = 0.0
    band: float | None = None   # the estimate's stated error band (half-width, a fraction)
    #: GiB predicted as each published counter reports it: {(kind, rank): GiB} for kind in
    #: allocated/active/reserved/device (:meth:`autopar.cost.memory.MemoryBreakdown.counted`)
    #: and rank "peak" (the largest rank) or "last" (the last pipeline rank)
    memory_kinds: tuple = ()
    #: the estimate's regime key (:meth:`autopar.cost.regime.Regime.key`, as the cost model
    #: computes it: the cell its band is looked up in); () when not estimated here
    regime: tuple = ()
    #: share of the predicted step that is host issue time no GPU work hides (the time
    #: breakdown's ``host_exposed`` over the step)
    host_share: float = 0.0

    def memory_as_published(self) -> float:
        """Predicted GiB of the counter the record publishes (its ``memory_kind`` on its
        ``memory_rank``); :attr:`memory_gib` (the whole device) when the row has no per-kind
        figures."""
        kinds = dict(self.memory_kinds)
        return kinds.get((self.rec.memory_kind or "device", self.rec.memory_rank),
                         self.memory_gib)

    @property
    def error(self) -> float | None:
        """Signed relative error of the step time, (predicted - measured) / measured."""
        m = self.rec.measured_step_s
        return None if not m else (self.predicted_s - m) / m


def scored_profile(rec: Record, host_rate: float | None = None) -> FrameworkProfile:
    """:func:`record_profile` with a stack's per-kernel host rate (megatron, nemo) set to
    ``host_rate`` seconds when given, else to the rate set without the record's source
    (:func:`benchmarks.host_rate.loso_rate`; the profile's own where its source set none): the
    profile every benchmark prices the record with."""
    profile = record_profile(rec)
    if host_rate is None and profile.host_op_s_published > 0:
        host_rate = host_rates.loso_rate(source_key(rec.raw))
    if host_rate is not None:
        profile = host_rates.with_rate(profile, host_rate)
    return profile


def evaluate(rec: Record, spread: bool = True, host_rate: float | None = None) -> Row:
    """Predict one record under its framework's defaults for open fields; with ``spread`` also
    the fastest legal choice of the open fields (a search), else ``fastest_s`` is the prediction.
    A stack with a per-kernel host rate (megatron, nemo) is priced at ``host_rate`` seconds
    when given, else at the rate set without the record's source
    (:func:`benchmarks.host_rate.loso_rate`; the profile's own where its source set none).

    Raises:
        autopar.AutoparError: the published plan is not one autopar can represent.
    """
    train = training(rec)
    graph, _ = model_graph(rec.model, train)
    profile = scored_profile(rec, host_rate)
    cm = CostModel(graph, rec.cluster, train, framework=profile)
    chosen = framework_defaults(rec)
    fixed = dict(rec.fixed)
    blocks = block_level_recompute(rec, len(cm.blocks))
    if blocks is not None:
        fixed["recompute"] = blocks
        chosen = {**chosen, "recompute": f"{blocks.count('full')}/{len(blocks)} blocks full"}
    cfg = autopar.ParallelConfig(**{**chosen, **fixed} if blocks is None else
                                 {**framework_defaults(rec), **fixed})
    cut = profile.split_stages(len(cm.blocks), cfg.pp, cfg.virtual_stages)
    if cut is not None:   # the framework's own even split (InternEvo: extra blocks last)
        cfg = replace(cfg, stage_blocks=cut)
    e = cm.estimate(cfg)
    fastest = e.step_time_s
    if spread and rec.open_fields:
        try:
            fastest = search(cm, fixed, top_k=1, require_fit=False).best.step_time_s
        except autopar.AutoparError:
            pass
    outside = cm.inputs.params.reserved_bytes
    kinds = tuple(((kind, rank), b.counted(kind, outside) / GIB)
                  for rank, b in (("peak", e.memory_breakdown),
                                  ("last", e.stage_memory_breakdown[-1]))
                  for kind in ("allocated", "active", "reserved", "device"))
    return Row(rec, e.step_time_s, fastest, e.memory_per_gpu_bytes / GIB, e.fits, chosen, e.mfu,
               e.error_band.half_width if e.error_band is not None else None, kinds,
               e.error_band.cell if e.error_band is not None else (),
               e.time_breakdown.host_exposed / e.step_time_s if e.step_time_s else 0.0)


def host_lines(rows: list[Row]) -> list[str]:
    """How the runs of the stacks with a per-kernel host rate (:func:`benchmarks.host_rate.
    loso_rate`) split: those whose priced step is :data:`autopar.cost.notes.HOST_NOTE_SHARE`
    or more exposed host time, and the others, each with n, signed bias and MAPE."""
    profiles = {id(r): record_profile(r.rec) for r in rows if r.error is not None}
    mine = [r for r in rows if id(r) in profiles and profiles[id(r)].host_op_s_published > 0]
    if not mine:
        return ["host-bound runs: no run of a stack with a per-kernel host rate"]
    bound = [r.error for r in mine if r.host_share >= HOST_NOTE_SHARE]
    rest = [r.error for r in mine if r.host_share < HOST_NOTE_SHARE]

    def fig(errs):
        return (f"n {len(errs)}, bias {100 * sum(errs) / len(errs):+.1f}%, "
                f"MAPE {_mape(errs):.1f}%") if errs else "n 0"

    names = ", ".join(sorted({profiles[id(r)].name for r in mine}))
    return [f"host-bound runs ({names}: the stack's per-kernel host rate, set without each "
            "run's source):",
            f"  host >= {HOST_NOTE_SHARE:.0%} of the priced step: {fig(bound)}",
            f"  the other runs of those stacks:   {fig(rest)}"]


#: What a record autopar cannot estimate raises (it is refused with :func:`refusal`).
REFUSED = (RecordError, autopar.AutoparError, KeyError, TypeError, ValueError)


def refusal(exc: Exception) -> str:
    """One line saying why a record is refused: "<reason>: <detail>", the reason first (the
    part before the first ": " is what :func:`refusal_counts` counts)."""
    text = " ".join(str(exc).split())
    if "vocab_size must be an int, got NoneType" in text:
        return "vocab_size not published: the model's vocabulary size is null in the record"
    m = re.search(r"unknown GPU '([^']+)'", text)
    if m:
        return f"unknown GPU: {m.group(1)!r} is not in autopar's GPU catalog"
    if isinstance(exc, RecordError) and text.startswith("precision not published"):
        return text
    if isinstance(exc, KeyError):
        return f"field missing: {text}"
    return f"{type(exc).__name__}: {text[:160]}"


def refusal_counts(refused: list[tuple[str, str]]) -> list[str]:
    """Lines: ``refused (N): reason counts``, then each reason with its count (most first)
    and each refused record with its reason."""
    counts: dict[str, int] = defaultdict(int)
    for _, why in refused:
        counts[why.split(": ", 1)[0]] += 1
    lines = [f"refused ({len(refused)}): reason counts"]
    lines += [f"  {n:4d}  {why}" for why, n in sorted(counts.items(), key=lambda x: (-x[1], x[0]))]
    lines += [f"  refused {rid}: {why}" for rid, why in refused]
    return lines


def evaluate_all(raw: list[dict], estimate=None) -> tuple[list[Row], list[tuple[str, str]]]:
    """(evaluated rows, (id, one-line reason) of records refused), in corpus order: every
    record is in one or the other. ``estimate``: the evaluation of a parsed record (default
    :func:`evaluate`)."""
    estimate = evaluate if estimate is None else estimate
    rows, refused = [], []
    for r in raw:
        try:
            rows.append(estimate(parse(r)))
        except REFUSED as exc:
            refused.append((r.get("id", "?") if isinstance(r, dict) else "?", refusal(exc)))
    return rows, refused


def _mape(errs) -> float:
    return 100 * sum(abs(e) for e in errs) / len(errs) if errs else math.nan


def source_errors(rows: list[Row]) -> dict[str, list[float]]:
    """Source key -> the step-time errors of its rows with a measured step time."""
    by: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.error is not None:
            by[r.rec.source_key].append(r.error)
    return by


def macro_pooled(by: dict[str, list[float]]) -> tuple[tuple[float, float], tuple[float, float]]:
    """((macro MAPE, macro bias), (pooled MAPE, pooled bias)) in percent of errors grouped by
    source: macro = the mean over sources of each source's MAPE and bias (each source weighs
    the same), pooled = over all runs (each run weighs the same)."""
    if not by:
        return (math.nan, math.nan), (math.nan, math.nan)
    macro = (sum(_mape(e) for e in by.values()) / len(by),
             100 * sum(sum(e) / len(e) for e in by.values()) / len(by))
    allerr = [x for e in by.values() for x in e]
    return macro, (_mape(allerr), 100 * sum(allerr) / len(allerr))


#: A source's signed step-time bias beyond this (a fraction) is named in :func:`kind_macro_lines`:
#: issue 26's bound for a mixture-of-experts source (done-when 1), and shown for dense beside it.
MOE_SOURCE_BIAS = 0.15


def kind_macro_lines(rows: list[Row]) -> list[str]:
    """Lines: the macro and pooled step-time figures (:func:`macro_pooled`) over the runs of
    mixture-of-experts models (``model.num_experts`` set: :attr:`autopar.ModelConfig.is_moe`)
    and over the dense ones, each with its count of sources whose signed bias lies beyond
    :data:`MOE_SOURCE_BIAS`. A source with runs of both kinds counts in both, with its runs of
    each kind."""
    lines = []
    for name, moe in (("MoE", True), ("dense", False)):
        by = source_errors([r for r in rows if r.rec.model.is_moe == moe])
        if not by:
            lines.append(f"{name}: no run with a measured step time")
            continue
        (mm, mb), (pm, pb) = macro_pooled(by)
        beyond = sum(abs(sum(e) / len(e)) > MOE_SOURCE_BIAS for e in by.values())
        runs = sum(len(e) for e in by.values())
        lines.append(f"{name}: macro over {len(by)} sources MAPE {mm:.1f}% bias {mb:+.1f}%; "
                     f"pooled over {runs} runs MAPE {pm:.1f}% bias {pb:+.1f}%; sources with "
                     f"bias beyond +-{100 * MOE_SOURCE_BIAS:.0f}%: {beyond}")
    return lines


def loso(rows: list[Row], held_out: bool = False) -> list[str]:
    """Lines: per source its signed bias and MAPE, the macro and pooled figures, then the
    pooled leave-one-source-out line (``held_out``: the rows of the locked split, predicted by
    the model as it stands; the last line then starts ``locked split MAPE``)."""
    by = source_errors(rows)
    lines = [f"{'source':70s} {'n':>3s} {'bias':>7s} {'MAPE':>6s}"]
    worst, allerr = ("", 0.0), []
    for src in sorted(by):
        errs = by[src]
        bias = 100 * sum(errs) / len(errs)
        lines.append(f"{src[:70]:70s} {len(errs):3d} {bias:+6.1f}% {_mape(errs):5.1f}%")
        if abs(bias) >= abs(worst[1]):
            worst = (src, bias)
        allerr += errs
    if held_out:
        lines.append("locked split: not leave-one-source-out; no constant is fitted to any "
                     "source, so these sources are predicted by a model fitted to none of them")
    else:
        lines.append(f"fitted constants refitted per left-out source: {len(FITTED_CONSTANTS)} "
                     f"({', '.join(FITTED_CONSTANTS) or 'none are fitted to records'})")
    lines.append(f"worst source: {worst[0]} (bias {worst[1]:+.1f}%)")
    (mm, mb), (pm, pb) = macro_pooled(by)
    lines.append(f"macro (mean over {len(by)} sources of each source's figure): "
                 f"MAPE {mm:.1f}% bias {mb:+.1f}%")
    lines.append(f"pooled (over all {len(allerr)} runs): MAPE {pm:.1f}% bias {pb:+.1f}%")
    lines += kind_macro_lines(rows)
    lines.append(f"{'locked split' if held_out else 'LOSO'} MAPE {_mape(allerr):.1f}% max "
                 f"{100 * max(map(abs, allerr), default=0):.1f}% "
                 f"worst source {abs(worst[1]):.1f}% over {len(allerr)} records, {len(by)} sources")
    return lines


def _problem(rec: Record) -> tuple:
    """What two runs must share to be a plan pair: the model, GPUs, batch, precision, the
    framework that ran them (two frameworks running one plan at different speeds is a
    comparison of frameworks, not of plans: the search chooses among one framework's plans)
    and the MoE routing (``training.router_load_balancing``: a run with Megatron-Core's
    ``--moe-router-force-load-balancing`` spreads tokens evenly, one with the trained router
    does not, so their times differ by the routing, which no plan field holds). The experts
    and top-k are part of the model: a dense model and an MoE model of the same shape are two
    problems."""
    m, t = rec.model, rec.train
    return (m.num_layers, m.hidden_size, m.num_heads, m.vocab_size, m.num_experts, m.top_k,
            rec.cluster.device.name,
            rec.cluster.world_size, t.global_batch_size, t.seq_len, t.precision, rec.framework,
            (rec.raw.get("training") or {}).get("router_load_balancing"))


def _plan(rec: Record) -> tuple:
    p = rec.raw.get("plan", {})
    return tuple(sorted((k, str(v)) for k, v in p.items())) + (
        ("micro_batch_size", rec.train.micro_batch_size),)


def pairs(rows: list[Row]) -> list[str]:
    """Lines: each same-problem pair of measured runs of one framework that differ in the plan,
    right or wrong, then the accuracy over all pairs, over the pairs of MoE runs, and over the
    pairs neither of whose runs is host-bound (:attr:`Row.host_share` below
    :data:`autopar.cost.notes.HOST_NOTE_SHARE`: the order of runs the host time decides rests on
    one fitted rate). Runs
    with the same plan (e.g. with and without torch.compile) are not a plan pair; a predicted
    tie counts as wrong (the planner could not tell them apart)."""
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        if r.rec.measured_step_s:
            groups[_problem(r.rec)].append(r)
    lines = []
    # (right, total) over all pairs, over pairs of MoE runs, over pairs neither of whose runs
    # is host-bound
    tally = {"all": [0, 0], "moe": [0, 0], "quiet": [0, 0]}
    for g in groups.values():
        for i, a in enumerate(g):
            for b in g[i + 1:]:
                ma, mb = a.rec.measured_step_s, b.rec.measured_step_s
                if abs(ma - mb) / max(ma, mb) < PAIR_TIE or _plan(a.rec) == _plan(b.rec):
                    continue
                pa, pb = a.predicted_s, b.predicted_s
                ok = abs(pa - pb) > 1e-9 * max(pa, pb) and (pa < pb) == (ma < mb)
                kinds = ["all"] + ["moe"] * a.rec.model.is_moe + ["quiet"] * (
                    max(a.host_share, b.host_share) < HOST_NOTE_SHARE)
                for k in kinds:
                    tally[k][0] += ok
                    tally[k][1] += 1
                lines.append(f"{'ok   ' if ok else 'WRONG'} {a.rec.id} vs {b.rec.id}: measured "
                             f"{ma:.3f} vs {mb:.3f} s, predicted {a.predicted_s:.3f} vs "
                             f"{b.predicted_s:.3f} s")

    def share(k: str) -> str:
        right, total = tally[k]
        return f"{right} of {total} ({100 * right / total if total else math.nan:.1f}%)"

    lines.append(f"pairs ordered as measured: {share('all')}")
    lines.append(f"MoE pairs ordered as measured: {share('moe')}")
    lines.append(f"pairs neither of whose runs is host-bound ordered as measured: "
                 f"{share('quiet')}")
    return lines


GPU_SWEEP = DATA_DIR / "gpu" / "h200_sweep.json"


def measured_plans_memory(path: Path = GPU_SWEEP) -> list[tuple[str, float, float]]:
    """(name, predicted GiB, measured GiB) of the single-GPU plans measured through
    ``plan.apply`` (benchmarks/data/gpu/README.md): measured = ``torch.cuda.max_memory_reserved``,
    predicted = the estimate less :attr:`autopar.CostParams.reserved_bytes` (memory outside
    torch's allocator, which max_memory_reserved does not count). None when the file is absent."""
    if not path.exists():
        return []
    from .gpu_sweep import MODELS
    out = []
    for r in json.loads(path.read_text()).get("plans", []):
        if "max_reserved_bytes" not in r:
            continue
        train = autopar.TrainingConfig(global_batch_size=r["global_batch"],
                                       seq_len=r["seq_len"], micro_batch_size=r["micro_batch"])
        cfg = autopar.ParallelConfig(tp=1, pp=1, dp=1, cp=1, micro_batch_size=r["micro_batch"],
                                     recompute=r["recompute"], zero_stage=0)
        e = autopar.estimate(dict(MODELS[r["model"]]), "1x1xH200", train, cfg)
        pred = e.memory_per_gpu_bytes - autopar.CostParams().reserved_bytes
        out.append((f"h200 {r['model']} s{r['seq_len']} mb{r['micro_batch']} {r['recompute']}",
                    pred / GIB, r["max_reserved_bytes"] / GIB))
    return out


def memory(rows: list[Row], measured: list[tuple[str, float, float]] | None = None,
           refused: list[tuple[str, str]] | None = None, raw: list[dict] | None = None
           ) -> list[str]:
    """Lines: predicted vs published peak memory (GiB), each compared with the counter the
    record publishes (:meth:`Row.memory_as_published`: peak reserved, allocated, active, or the
    whole device when not stated), and the MAPE, over all of them, over the MoE ones and over
    those on Hopper GPUs (issue 25's Hopper count); then, when given, the measured plans of
    :func:`measured_plans_memory` and the MAPE over both; then :func:`oom_lines` (``refused``
    and ``raw``: the refused records and the raw records, to name refused OOM cases)."""
    lines, errs, used = [], [], []
    for r in rows:
        m = r.rec.measured_memory_gib
        if not m or r.rec.oom:
            continue
        pred = r.memory_as_published()
        err = (pred - m) / m
        errs.append(err)
        used.append(r)
        kind = r.rec.memory_kind or "device (kind not stated)"
        rank = "" if r.rec.memory_rank == "peak" else f", {r.rec.memory_rank} rank"
        lines.append(f"{r.rec.id:44s} predicted {pred:6.1f} GiB measured {m:6.1f} GiB "
                     f"{100 * err:+6.1f}% ({kind}{rank})")
    lines.append(f"memory MAPE {_mape(errs):.1f}% over {len(errs)} runs")
    for name, sub in (("MoE", [e for e, r in zip(errs, used) if r.rec.model.is_moe]),
                      ("Hopper", [e for e, r in zip(errs, used)
                                  if r.rec.cluster.device.architecture == "hopper"])):
        bias = 100 * sum(sub) / len(sub) if sub else math.nan
        lines.append(f"memory MAPE of {name} runs {_mape(sub):.1f}% bias {bias:+.1f}% over "
                     f"{len(sub)} runs")
    if measured:
        own = []
        for name, pred, meas in measured:
            own.append((pred - meas) / meas)
            lines.append(f"{name:44s} predicted {pred:6.1f} GiB measured {meas:6.1f} GiB "
                         f"{100 * own[-1]:+6.1f}% (max_memory_reserved)")
        lines.append(f"memory MAPE {_mape(own):.1f}% over {len(own)} measured plan.apply runs; "
                     f"{_mape(errs + own):.1f}% over all {len(errs) + len(own)}")
    return lines + oom_lines(rows, refused, raw)


def oom_lines(rows: list[Row], refused: list[tuple[str, str]] | None = None,
              raw: list[dict] | None = None) -> list[str]:
    """Lines: every published out-of-memory case (``measured.oom``) predicted out of memory or
    not, and every published run that ran (a step time or a peak memory) predicted to fit or
    not, both at margin 0 (:attr:`Row.fits`: the allocated peak of every rank within the
    device's visible memory); OOM cases that were refused are named with the reason. Ends with
    ``OOM cases predicted out of memory: <k> of <n> (<r> refused)`` and ``runs that ran
    predicted to fit at margin 0: <k> of <n>``."""
    lines = []
    oom = [r for r in rows if r.rec.oom]
    hit = 0
    for r in oom:
        hit += not r.fits
        at = (f", {r.rec.memory_at_oom_gib} GiB allocated at the OOM"
              if r.rec.memory_at_oom_gib else "")
        lines.append(f"{'ok   ' if not r.fits else 'WRONG'} OOM {r.rec.id}: predicted "
                     f"{r.memory_as_published():.1f} GiB "
                     f"({'does not fit' if not r.fits else 'fits'} in "
                     f"{r.rec.cluster.device.visible_memory_bytes / GIB:.1f} GiB{at})")
    oom_ids = {x.get("id") for x in raw or [] if x.get("measured", {}).get("oom") is True}
    ref = [(rid, why) for rid, why in refused or [] if rid in oom_ids]
    lines += [f"refused OOM {rid}: {why}" for rid, why in ref]
    lines.append(f"OOM cases predicted out of memory: {hit} of {len(oom)} ({len(ref)} refused)")
    ran = [r for r in rows if r.rec.ran]
    fit = 0
    for r in ran:
        fit += r.fits
        if not r.fits:
            lines.append(f"WRONG ran {r.rec.id}: predicted not to fit at margin 0 "
                         f"({r.memory_gib:.1f} GiB, {r.rec.cluster.device.visible_memory_bytes / GIB:.1f}"
                         " GiB visible)")
    lines.append(f"runs that ran predicted to fit at margin 0: {fit} of {len(ran)}")
    return lines
