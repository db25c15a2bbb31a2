"""Data parallelism by ZeRO stage.

What each ``zero_stage`` of a plan becomes here:

- 0: parameters, gradients and optimizer states replicated; after backward the gradients are
  averaged over the DP group with one coalesced all-reduce per dtype (DDP's arithmetic, without
  its overlap with backward).
- 1: the same as 0. ZeRO-1's optimizer-state sharding is not applied (the states stay
  replicated: more memory than planned, the same numbers); the run says so in ``notes``.
- 2: FSDP2 ``fully_shard`` with ``reshard_after_forward=False``: gradients and optimizer states
  sharded, parameters gathered once per step and kept through backward (ZeRO-2's memory for
  gradients and states; parameters stay gathered between forward and backward).
- 3: FSDP2 ``fully_shard`` with ``reshard_after_forward=True``: parameters too (ZeRO-3).

FSDP units are the decoder blocks plus the chunk's root (embedding, norm, head), as torchtitan.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


def uses_fsdp(zero_stage: int, dp: int) -> bool:
    """True when the DP dimension is sharded with FSDP2 (ZeRO 2 and 3 over more than 1 rank)."""
    return zero_stage >= 2 and dp > 1


def apply_fsdp(chunk: nn.Module, blocks: nn.ModuleDict, dp_mesh, zero_stage: int,
               precision: str) -> None:
    """``fully_shard`` each block of ``chunk`` and then ``chunk`` over ``dp_mesh``.

    For bf16/fp16/fp8 plans whose parameters are fp32 the blocks compute in the low precision
    and reduce gradients in fp32 (``MixedPrecisionPolicy``); otherwise in the parameters' dtype.
    """
    param_dtype = next(chunk.parameters()).dtype
    low = _DTYPES.get(precision)
    mp = (MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
          if low is not None and param_dtype == torch.float32 else MixedPrecisionPolicy())
    reshard = zero_stage == 3
    for key in list(blocks.keys()):
        fully_shard(blocks[key], mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(chunk, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)


def set_gradient_sync(modules: list[nn.Module], enabled: bool) -> None:
    """Turn FSDP gradient reduction on or off (off for all but the last micro-batch of a step)."""
    for m in modules:
        if hasattr(m, "set_requires_gradient_sync"):
            m.set_requires_gradient_sync(enabled)


def allreduce_gradients(modules: list[nn.Module], group, size: int) -> None:
    """Average the gradients of ``modules`` over ``group`` (``size`` ranks) in place.

    Tensor-parallel DTensor gradients are reduced through their local shards: DP ranks hold the
    same shard of each. One flat buffer per dtype, so one collective each.
    """
    grads: dict[torch.dtype, list[torch.Tensor]] = {}
    for m in modules:
        for p in m.parameters():
            if p.grad is None:
                continue
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            grads.setdefault(g.dtype, []).append(g)
    for tensors in grads.values():
        flat = _flatten_dense_tensors(tensors)
        dist.all_reduce(flat, group=group)
        flat /= size
        for g, avg in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
            g.copy_(avg)
