"""Activation checkpointing per decoder block, as the plan's ``recompute`` says.

- ``"full"``: the whole block is recomputed in backward; only its input is kept
  (``checkpoint_wrapper``, non-reentrant ``torch.utils.checkpoint``).
- ``"selective"``: the attention core (Korthikanti et al. 2022's selective recomputation:
  scores, softmax, dropout, weighted values) is recomputed, the linear layers' outputs are kept.
  Implemented with a ``create_selective_checkpoint_contexts`` policy that saves matmul outputs and
  collective results and recomputes every other op (torchtitan's op-level policy): saving the
  cheap elementwise ops too would be closer to Megatron-LM, but some of them are later mutated in
  place (RMSNorm's ``add_``), which selective checkpointing refuses. Collectives are never
  recomputed, so recomputation adds no communication.
- ``"selective-op"``: torchtitan's op-level selective checkpointing (v0.2.2
  ``distributed/activation_checkpoint.py``): the outputs of attention kernels, reduce-scatters
  and every second matmul of the block (the 1st, 3rd, ...) are kept, everything else is
  recomputed (the memory :func:`autopar.cost.memory.op_sac_bytes` counts).
- ``"none"``: nothing.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts


def _saved_ops() -> frozenset:
    """Ops whose outputs selective recompute keeps: the linear layers' GEMMs and the collectives.
    SDPA (fused, or its math fallback's bmm/softmax) is not among them, so attention is
    recomputed; linear layers lower to mm/addmm, never bmm."""
    aten, c10d = torch.ops.aten, torch.ops._c10d_functional
    ops = [aten.mm.default, aten.addmm.default, aten._scaled_mm.default]
    ops += [getattr(c10d, n).default for n in ("all_reduce", "reduce_scatter_tensor",
                                               "all_gather_into_tensor", "all_to_all_single")
            if hasattr(c10d, n)]
    return frozenset(ops)


_SAVED = _saved_ops()


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    return create_selective_checkpoint_contexts(_policy)


def _attention_ops() -> frozenset:
    aten = torch.ops.aten
    names = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
             "_scaled_dot_product_flash_attention_for_cpu")
    return frozenset(getattr(aten, n).default for n in names if hasattr(aten, n))


#: Ops op-level SAC always keeps (torchtitan's ``_op_sac_save_list`` less aten.mm, which
#: alternates): attention kernels, max (FP8 scaling amax) and reduce-scatter.
_OP_SAC_SAVED = _attention_ops() | frozenset(
    [torch.ops.aten.max.default] + [torch.ops._c10d_functional.reduce_scatter_tensor.default])


def _op_sac_context():
    """torchtitan's op-level policy: a fresh matmul count per block call, forward and
    recompute counted apart so both make the same choices."""
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if op == torch.ops.aten.mm.default:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            return (CheckpointPolicy.MUST_SAVE if counts[key] % 2 == 1
                    else CheckpointPolicy.PREFER_RECOMPUTE)
        return (CheckpointPolicy.MUST_SAVE if op in _OP_SAC_SAVED
                else CheckpointPolicy.PREFER_RECOMPUTE)

    return create_selective_checkpoint_contexts(policy)


def wrap_block(block: nn.Module, mode: str) -> nn.Module:
    """``block`` wrapped for recompute ``mode`` ("none" returns it unchanged)."""
    if mode == "full":
        return checkpoint_wrapper(block, preserve_rng_state=True)
    if mode == "selective":
        return checkpoint_wrapper(block, context_fn=_selective_context, preserve_rng_state=True)
    if mode == "selective-op":
        return checkpoint_wrapper(block, context_fn=_op_sac_context, preserve_rng_state=True)
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
