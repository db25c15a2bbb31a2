"""Activation checkpointing per decoder block, as the plan's ``recompute`` says.

- ``"full"``: the whole block is recomputed in backward; only its input is kept
  (``checkpoint_wrapper``, non-reentrant ``torch.utils.checkpoint``).
- ``"selective"``: Korthikanti et al. 2022's selective recomputation: only the attention core
  (scores, softmax, dropout, weighted values) is recomputed, every other op's output is kept.
  Implemented with a ``create_selective_checkpoint_contexts`` policy; collectives are never
  recomputed (their outputs are saved), so recomputation adds no communication.
- ``"none"``: nothing.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten


def _attention_core_ops() -> frozenset:
    """ATen ops of the attention core: the fused SDPA kernels and, for SDPA's math fallback
    (CPU with grouped-query attention), the batched matmuls and softmax it decomposes into.
    Linear layers lower to mm/addmm, never bmm, so bmm is attention-only in these models."""
    names = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_attention_math", "_softmax", "_safe_softmax", "bmm",
             "native_dropout")
    return frozenset(getattr(_aten, n).default for n in names if hasattr(_aten, n))


_CORE = _attention_core_ops()


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.PREFER_RECOMPUTE if op in _CORE else CheckpointPolicy.MUST_SAVE


def _selective_context():
    return create_selective_checkpoint_contexts(_policy)


def wrap_block(block: nn.Module, mode: str) -> nn.Module:
    """``block`` wrapped for recompute ``mode`` ("none" returns it unchanged)."""
    if mode == "full":
        return checkpoint_wrapper(block, preserve_rng_state=True)
    if mode == "selective":
        return checkpoint_wrapper(block, context_fn=_selective_context, preserve_rng_state=True)
    return block


def apply_recompute(blocks: nn.ModuleDict, modes: dict[int, str]) -> None:
    """Wrap each block of ``blocks`` (keys: block index as str) by its mode in ``modes``."""
    for key in list(blocks.keys()):
        blocks[key] = wrap_block(blocks[key], modes[int(key)])


#: Prefix checkpoint_wrapper adds to parameter names; :func:`clean_name` removes it.
WRAPPER_PREFIX = "_checkpoint_wrapped_module."


def clean_name(name: str) -> str:
    """A parameter name as in the unwrapped model."""
    return name.replace(WRAPPER_PREFIX, "")
