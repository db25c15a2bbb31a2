"""Every framework profile autopar knows, one module per framework, and the registry.

=============================  ===================================================================
name                           what runs the plan
=============================  ===================================================================
``torch``                      stock torch.distributed as ``plan.apply`` runs it (:mod:`.pytorch`)
``torchtitan``                 torchtitan v0.2.2 (:mod:`.torchtitan`)
``megatron``                   Megatron-LM main d98e8a64ddf3 (:mod:`.megatron`)
``deepspeed``                  DeepSpeed 0.19.6 (:mod:`.deepspeed`)
``megatron-2023``              Megatron-LM before 4eeff55d1f (2023-10-12): no P2P overlap,
                               no FSDP, no CP
``nemo``                       NeMo 2.0 on Megatron-Core (:mod:`.nemo`)
``inhouse-2024``               an unnamed in-house stack of 2024, costed as Megatron-LM with
                               overlapped DP reduction (:mod:`.inhouse`)
``fsdp1``                      torch FSDP1 (flat parameters) loops such as fms-fsdp (:mod:`.fsdp1`)
``llm-foundry``                llm-foundry on Composer FSDP1 (:mod:`.llm_foundry`)
``tinyllama``                  TinyLlama's fused lit-gpt on Fabric FSDP1 (:mod:`.tinyllama`)
``flash-attention-training``   flash-attention's 2022 training code (:mod:`.flash_attention`)
``internevo``                  InternEvo, hybrid ZeRO (:mod:`.internevo`)
``internevo-fsdp``             InternEvo, FSDP mode (:mod:`.internevo`)
``torchtitan-0.3``             torchtitan 0.3.0: no expert TP, CP all-gathers K/V (:mod:`.torchtitan`)
=============================  ===================================================================

The first four have exporters, and ``torchtitan-0.3`` (torchtitan's Python config); all are
selectable with ``TrainingConfig(framework=...)``, ``--framework`` and in plan files. Options
on top of a profile: :func:`shard_within` (HSDP, InternEvo ``parallel.zero1``) and
:func:`autopar.frameworks.choices.with_choice` (e.g. ``TORCH_COMPILE``); XTuner 0.1's
attention on the ``deepspeed`` profile is :func:`autopar.frameworks.stacks.xtuner.
with_xtuner_attention`.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Mapping

from ...config import FRAMEWORKS
from ...errors import InvalidTrainingConfig
from ..choices import Choices
from ..memory import pure_bf16
from ..profiles import FrameworkProfile
from . import (deepspeed, flash_attention, fsdp1, inhouse, internevo, llm_foundry, megatron,
               nemo, pytorch, tinyllama, torchtitan)

_BUILT = ((pytorch.PROFILE, pytorch.CHOICES), (torchtitan.PROFILE, torchtitan.CHOICES),
          (megatron.PROFILE, megatron.CHOICES), (deepspeed.PROFILE, deepspeed.CHOICES),
          (megatron.PROFILE_2023, megatron.CHOICES_2023), (nemo.PROFILE, nemo.CHOICES),
          (inhouse.PROFILE, inhouse.CHOICES), (fsdp1.PROFILE, fsdp1.CHOICES),
          (llm_foundry.PROFILE, llm_foundry.CHOICES), (tinyllama.PROFILE, tinyllama.CHOICES),
          (flash_attention.PROFILE, flash_attention.CHOICES),
          (internevo.PROFILE, internevo.CHOICES), (internevo.PROFILE_FSDP, internevo.CHOICES),
          (torchtitan.PROFILE_03, torchtitan.CHOICES))

#: Every profile by framework name (read-only).
PROFILES: Mapping[str, FrameworkProfile] = MappingProxyType({p.name: p for p, _ in _BUILT})
#: The implementation choices each profile's cost fields are built from, by framework name.
CHOICES: Mapping[str, Choices] = MappingProxyType({p.name: c for p, c in _BUILT})
assert tuple(PROFILES) == FRAMEWORKS, "autopar.config.FRAMEWORKS and PROFILES disagree"

#: The framework whose published runs give a profile its error band and MFU ceiling
#: (:mod:`autopar.cost.published`, :class:`autopar.cost.regime.Regime`). A stack that runs
#: another's code path counts with it: Megatron-LM's releases and NeMo are Megatron-Core; the
#: FSDP1 trainers (fms-fsdp, llm-foundry's Composer, TinyLlama's Fabric) are PyTorch FSDP, as
#: ``plan.apply`` is. A stack whose code path autopar does not target (the unnamed in-house
#: stacks, InternEvo, flash-attention's 2022 training code) has no cells of its own: "*", the
#: cells pooled over frameworks.
BAND_FRAMEWORK: Mapping[str, str] = MappingProxyType({
    "torch": "torch", "torchtitan": "torchtitan", "megatron": "megatron",
    "deepspeed": "deepspeed", "megatron-2023": "megatron", "nemo": "megatron",
    "inhouse-2024": "*", "fsdp1": "torch", "llm-foundry": "torch", "tinyllama": "torch",
    "flash-attention-training": "*", "internevo": "*", "internevo-fsdp": "*",
    "torchtitan-0.3": "torchtitan"})
assert tuple(BAND_FRAMEWORK) == FRAMEWORKS, "every profile needs its BAND_FRAMEWORK entry"


def band_framework(framework: str | FrameworkProfile) -> str:
    """The framework whose published runs a plan for ``framework`` (a name or a profile) is
    banded with (:data:`BAND_FRAMEWORK`); "*" (pooled over frameworks) for a name it lacks."""
    name = framework.name if isinstance(framework, FrameworkProfile) else framework
    return BAND_FRAMEWORK.get(name, "*")


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
            "(plan.apply), 'torchtitan', 'megatron', 'deepspeed', or a profile of a published "
            "stack listed here.") from None


def with_host_rate(profile: str | FrameworkProfile, seconds: float,
                   source: str) -> FrameworkProfile:
    """``profile`` with its own host seconds per counted kernel set to ``seconds``
    (:attr:`~autopar.frameworks.FrameworkProfile.host_op_s_published`, priced where it exceeds
    the measured dispatch rate; 0 prices that rate alone), ``source`` saying where the figure
    comes from (the estimate's host note quotes it): e.g. a rate inverted from one's own
    host-bound runs, or a leave-one-source-out refit (``benchmarks/host_rate.py``). Pass the
    result as ``profile=`` to :func:`autopar.estimate` / :func:`autopar.optimize`, or as
    ``framework=`` to :class:`autopar.cost.model.CostModel`.

    Raises:
        InvalidTrainingConfig: an unknown framework, a rate that is not a finite number >= 0, or
            an empty ``source``.
    """
    if not isinstance(source, str) or not source.strip():
        raise InvalidTrainingConfig(
            f"with_host_rate: source={source!r} must say where the rate comes from. Fix: e.g. "
            "with_host_rate('megatron', 1.2e-4, 'nsys trace of our 8-GPU run, 2026-12')")
    # the rate is checked as every cost field is (fieldrules: a finite number >= 0)
    return get_profile(profile).with_costs({"host_op_s_published": source},
                                           host_op_s_published=seconds)


def with_pure_bf16(profile: str | FrameworkProfile) -> FrameworkProfile:
    """``profile`` training in pure bf16: parameters, gradients and the optimizer's moments in
    bf16 with no fp32 master copy (:func:`autopar.frameworks.memory.pure_bf16`, each figure
    sourced there). A memory option only: the step's time is the profile's. Like every
    profile that differs from its stock one outside the cost fields, it is estimated with
    ``CostModel(..., framework=profile)`` (a plan file cannot record it, and
    :func:`autopar.estimate` refuses it).

    Raises:
        InvalidTrainingConfig: an unknown framework.
    """
    p = get_profile(profile)
    return replace(p, memory=pure_bf16(p.memory))


def with_inplace_loss(profile: str | FrameworkProfile, source: str,
                      logit_bytes: int = 2) -> FrameworkProfile:
    """``profile`` whose loss is a fused cross entropy that writes the logits' gradient into the
    logits in its forward and keeps only them for backward: ``logit_bytes`` per logit element
    saved (the logits' dtype, 2 in bf16) and no work beside them in backward
    (:attr:`autopar.frameworks.MemoryConventions.loss_saved_bytes`, ``loss_work_bytes`` 0).
    ``source``: the stack's loss that does so. A memory option only.

    Raises:
        InvalidTrainingConfig: an unknown framework; ``logit_bytes`` not a whole number >= 0.
    """
    return _with_loss(profile, logit_bytes, 0,
                      f"{source}: the logits, overwritten with their gradient ({logit_bytes} "
                      "bytes)", f"{source}: backward scales the saved gradient in place: 0")


def _with_loss(profile: str | FrameworkProfile, saved: int, work: int, saved_source: str,
               work_source: str) -> FrameworkProfile:
    """``profile`` whose loss keeps ``saved`` bytes per logit element for backward and allocates
    ``work`` beside them in it (MemoryConventions ``loss_saved_bytes``, ``loss_work_bytes``),
    each with its source."""
    p = get_profile(profile)
    mem = p.memory
    return replace(p, memory=replace(
        mem, loss_saved_bytes=saved, loss_work_bytes=work,
        sources={**mem.sources, "loss_saved_bytes": saved_source,
                 "loss_work_bytes": work_source}))


def with_compiled_loss(profile: str | FrameworkProfile, source: str,
                       logit_bytes: int = 2) -> FrameworkProfile:
    """``profile`` whose cross entropy on the upcast logits runs under ``torch.compile``: it keeps
    the logits in their dtype for backward (``logit_bytes`` per logit element, 2 in bf16; two
    fp32 numbers per row left out) where eager keeps the fp32 log-probabilities (4), and its
    backward writes one gradient in the logits' dtype (``logit_bytes``) where eager allocates
    fp32 ones (:attr:`autopar.frameworks.MemoryConventions.loss_saved_bytes`,
    ``loss_work_bytes``). Measured here on the CPU with torch 2.13's Inductor
    (``python -m benchmarks.compiled_loss``, ``benchmarks/data/memory/compiled_loss_cpu.json``:
    2.0 against 4.0 bytes kept per logit, one bf16 logit-sized buffer in the compiled code);
    what is kept is AOTAutograd's partitioner's choice, the same on every device. ``source``:
    the stack that compiles its loss. A memory option only.

    Raises:
        InvalidTrainingConfig: an unknown framework.
    """
    what = ("torch.compile'd cross entropy (benchmarks/compiled_loss.py, measured on the CPU, "
            "torch 2.13 Inductor)")
    return _with_loss(profile, logit_bytes, logit_bytes,
                      f"{source}: {what}: the logits in their dtype ({logit_bytes} bytes)",
                      f"{source}: {what}: one gradient in the logits' dtype ({logit_bytes} "
                      "bytes)")


def shard_within(profile: str | FrameworkProfile, ranks: int) -> FrameworkProfile:
    """``profile`` with ZeRO sharding over groups of ``ranks`` data-parallel ranks, replicated
    across groups (HSDP with ``ranks`` = GPUs per node; InternEvo ``parallel.zero1=ranks``), as
    its sharded data parallelism sets it (``CHOICES[name].sharded_dp.group_option``, the source).

    Raises:
        InvalidTrainingConfig: an unknown framework; one whose sharded data parallelism has no
            such option; ``ranks`` not a whole number >= 1.
    """
    p = get_profile(profile)
    option = CHOICES[p.name].sharded_dp.group_option
    if not option:
        with_option = [n for n, c in CHOICES.items() if c.sharded_dp.group_option]
        raise InvalidTrainingConfig(
            f"{p.name} ({CHOICES[p.name].sharded_dp.name}) has no option to shard within fewer "
            f"ranks than the data-parallel group. Fix: use one of {with_option}, or "
            "profile.with_costs({'zero1_group_size': 'where it comes from'}, "
            "zero1_group_size=N).")
    return p.with_costs({"zero1_group_size": f"{option}: {ranks} ranks"},
                        zero1_group_size=ranks)
