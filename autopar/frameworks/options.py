"""Named stack options: the sourced variants of a framework's stock profile that a run can
choose (a version, a flag, the model's own code), each a change of cost fields only, so a plan
file records it (:func:`autopar.frameworks.profile_edits`). The CLI's ``--stack-option`` selects
them by these names; the validation corpus applies the same functions where a record's text
states the variant (``benchmarks.validation.record_profile``); each function holds its source.

Memory-only variants (:func:`autopar.frameworks.with_pure_bf16`, ``with_inplace_loss``, the
chunked loss, Hugging Face Trainer's torch AdamW) change memory conventions, which a plan file
cannot record: they are for ``CostModel(..., framework=profile)`` from Python.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InvalidTrainingConfig
from .choices import CUDA_GRAPHS, FLASH_ATTN_3, TORCH_COMPILE, with_choice
from .profiles import FrameworkProfile
from .stacks import deepspeed, inhouse, megatron, pytorch, shard_within, torchtitan
from .stacks.pithtrain import PITHTRAIN_FSDP, PITHTRAIN_FUSION

#: Where torchao's float8nocompile prototype is chosen (a torchtitan job's float8 converter).
_FLOAT8NOCOMPILE = ("torchao prototype/float8nocompile with torchtitan's float8 converter "
                    "(--stack-option float8nocompile)")


@dataclass(frozen=True)
class StackOption:
    """One named variant of stock profiles.

    Attributes:
        name: the option's name (``--stack-option NAME``).
        frameworks: the stock profiles' names it applies to (a prefix match: "torchtitan"
            covers "torchtitan-0.3"); empty = every framework.
        summary: what it changes, in a line.
        apply: ``(profile, gpus_per_node) -> profile``.
    """

    name: str
    frameworks: tuple[str, ...]
    summary: str
    apply: Callable[[FrameworkProfile, int], FrameworkProfile]

    def applies_to(self, framework: str) -> bool:
        """Whether ``framework`` (a profile name) takes this option."""
        return not self.frameworks or framework.startswith(self.frameworks)


STACK_OPTIONS: dict[str, StackOption] = {o.name: o for o in (
    StackOption("torch-compile", (), "torch.compile's fused point-wise chains "
                "(autopar.frameworks.choices.TORCH_COMPILE)",
                lambda p, _: with_choice(p, TORCH_COMPILE)),
    StackOption("flash-attn-3", (), "FlashAttention-3 on Hopper instead of the stack's own "
                "attention kernel (autopar.frameworks.choices.FLASH_ATTN_3)",
                lambda p, _: with_choice(p, FLASH_ATTN_3)),
    StackOption("cuda-graphs", (), "forward and backward replayed as CUDA graphs: no per-kernel "
                "host time (autopar.frameworks.choices.CUDA_GRAPHS)",
                lambda p, _: with_choice(p, CUDA_GRAPHS)),
    StackOption("hsdp", ("fsdp1", "llm-foundry", "tinyllama", "internevo"),
                "ZeRO/FSDP sharding within a node, replicated across nodes (FSDP's "
                "HYBRID_SHARD, InternEvo's zero1=GPUs per node: autopar.frameworks.shard_within)",
                lambda p, gpn: shard_within(p, gpn)),
    StackOption("fp32-reduce", ("torch", "fsdp1", "tinyllama"), "data-parallel gradients "
                "reduced in fp32 (FSDP MixedPrecisionPolicy reduce_dtype=torch.float32: "
                "pytorch.with_fp32_reduce)", lambda p, _: pytorch.with_fp32_reduce(p)),
    StackOption("foreach-adamw", ("torchtitan",), "torchtitan's optimizer step before its fused "
                "AdamW default (torchtitan.with_foreach_adamw)",
                lambda p, _: torchtitan.with_foreach_adamw(p)),
    StackOption("replicated-qk-norm", ("torchtitan",), "torchtitan's Qwen3 TP plan before "
                "2025-10-14: query/key norms on whole heads, queries and keys all-gathered "
                "over TP (torchtitan.with_replicated_qk_norm)",
                lambda p, _: torchtitan.with_replicated_qk_norm(p)),
    StackOption("sac-redispatch", ("torchtitan",), "op-level selective recomputation that "
                "re-runs the MoE all-to-alls in backward: torchtitan before 2025-09-06, and "
                "its Qwen3 before 2026-03-23 (torchtitan.with_sac_redispatch)",
                lambda p, _: torchtitan.with_sac_redispatch(p)),
    StackOption("float8nocompile", ("torchtitan",), "FP8 casts by torchao's float8nocompile "
                "prototype kernels (torchtitan.with_float8nocompile)",
                lambda p, _: torchtitan.with_float8nocompile(p, _FLOAT8NOCOMPILE)),
    StackOption("alltoall-2024", ("megatron", "nemo"), "Megatron-Core's all-to-all dispatcher of "
                "2024-03 to 2024-09, TP all-to-alls around the MoE layer "
                "(megatron.with_alltoall_seq_2024)",
                lambda p, _: megatron.with_alltoall_seq_2024(p)),
    StackOption("deepspeed-0.3", ("deepspeed",), "DeepSpeed 0.3's ZeRO-1 (deepspeed."
                "with_deepspeed_030)", lambda p, _: deepspeed.with_deepspeed_030(p)),
    StackOption("megatron-v1-model", ("deepspeed",), "DeepSpeedExamples' Megatron-LM v1 GPT-2 "
                "attention ops (deepspeed.with_megatron_v1_model)",
                lambda p, _: deepspeed.with_megatron_v1_model(p)),
    StackOption("llama3-fsdp", ("inhouse",), "the data parallelism the Llama 3 paper states "
                "(inhouse.with_llama3_fsdp)", lambda p, _: inhouse.with_llama3_fsdp(p)),
    # the cost fields of stacks.pithtrain only: what its DualPipeV loop keeps unsharded is a
    # memory convention (stacks.pithtrain.with_pithtrain_fsdp, from Python)
    StackOption("pithtrain", ("fsdp1",), "PithTrain's FSDP2 under its DualPipeV loop and its "
                "compiled decoder layer (stacks.pithtrain.PITHTRAIN_FSDP, PITHTRAIN_FUSION)",
                lambda p, _: with_choice(with_choice(p, PITHTRAIN_FSDP), PITHTRAIN_FUSION)),
)}


def with_options(profile: FrameworkProfile, names, gpus_per_node: int) -> FrameworkProfile:
    """``profile`` with the named :data:`STACK_OPTIONS` applied in order.

    Raises:
        InvalidTrainingConfig: an unknown name, or one that does not apply to the framework,
            naming the options that do.
    """
    for name in names:
        option = STACK_OPTIONS.get(name)
        fits = [o.name for o in STACK_OPTIONS.values() if o.applies_to(profile.name)]
        if option is None:
            near = difflib.get_close_matches(str(name), list(STACK_OPTIONS), n=1)
            guess = f"Did you mean {near[0]!r}? " if near else ""
            raise InvalidTrainingConfig(
                f"stack option {name!r} is not one autopar knows. {guess}Fix: one of "
                f"{sorted(STACK_OPTIONS)} ({profile.name} takes {fits}).")
        if not option.applies_to(profile.name):
            raise InvalidTrainingConfig(
                f"stack option {name!r} is for {', '.join(option.frameworks)}, not "
                f"{profile.name}. Fix: drop it, or one that {profile.name} takes: {fits}.")
        profile = option.apply(profile, gpus_per_node)
    return profile
