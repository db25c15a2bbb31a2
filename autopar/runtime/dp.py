"""Data parallelism by ZeRO stage, over the dp x cp ranks (CP ranks hold the same weights).

What each ``zero_stage`` of a plan becomes here:

- 0: parameters, gradients and optimizer states replicated; after backward the gradients are
  averaged over dp x cp with one coalesced all-reduce per dtype (DDP's arithmetic, without its
  overlap with backward).
- 1: gradients as 0; optimizer states sharded (:mod:`autopar.runtime.zero1`: each rank steps
  only the parameters it owns and broadcasts them; ZeRO-1 of Rajbhandari et al. 2020).
- 2: FSDP2 ``fully_shard`` with ``reshard_after_forward=False``: gradients and optimizer states
  sharded, parameters gathered once per step and kept until the step's last backward
  (ZeRO-2's memory: full parameters, 1/N of gradients and states).
- 3: FSDP2 ``fully_shard`` with ``reshard_after_forward=True``: parameters too (ZeRO-3).

Under ZeRO-2/3 gradients are reduce-scattered after *every* micro-batch (see
:func:`accumulate_sharded`): the plan's memory model counts 1/N of the gradients, and holding
them unsharded until the last micro-batch would keep full-size gradients (tens of GB for a 70B
model) the plan never counted. The cost: one reduce-scatter per micro-batch instead of one per
step, m times the DP gradient traffic (the same as Megatron-LM's distributed optimizer without
gradient accumulation fusion); the cost model's DP time assumes one, so a run with many
micro-batches spends more on DP than predicted when it is not overlapped.

The mesh may be 1-D (shard over the group) or 2-D (replicate x shard: HSDP, FSDP2's own
semantics for a 2-D mesh). FSDP units are the decoder blocks plus the chunk's root (embedding,
norm, head), as torchtitan; with expert parallelism the experts are their own units over the
ranks holding the same experts, their gradients divided by dp x cp (each expert's gradient sums
the contributions of the ep ranks that sent it tokens).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


def uses_fsdp(zero_stage: int, replicas: int) -> bool:
    """True when the DP dimension is sharded with FSDP2 (ZeRO 2 and 3 over more than one rank
    holding the same weights, ``replicas`` = dp x cp)."""
    return zero_stage >= 2 and replicas > 1


def _mp_policy(chunk: nn.Module, precision: str) -> MixedPrecisionPolicy:
    param_dtype = next(chunk.parameters()).dtype
    low = _DTYPES.get(precision)
    if low is not None and param_dtype == torch.float32:
        return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(chunk: nn.Module, blocks: nn.ModuleDict, mesh, zero_stage: int, precision: str,
               experts: list[nn.Module] = (), expert_mesh=None,
               expert_divide_factor: float | None = None,
               block_reshard: dict[int, bool] | None = None) -> list[nn.Module]:
    """``fully_shard`` the ``experts`` (over ``expert_mesh``), each block of ``chunk``, then
    ``chunk`` (over ``mesh``: 1-D = ZeRO over its ranks, 2-D = HSDP replicate x shard).

    Under ZeRO-3, ``block_reshard`` (block index -> bool; missing = True) sets each block's
    ``reshard_after_forward`` (the plan's ``reshard_after_forward``); experts, sharded apart,
    always reshard after forward (as the cost model prices them).

    For bf16/fp16/fp8 plans whose parameters are fp32 the blocks compute in the low precision
    and reduce gradients in fp32 (``MixedPrecisionPolicy``); otherwise in the parameters' dtype.

    Returns the FSDP units that reshard after forward ([] under ZeRO-2), which the split-
    backward pipeline stages reshard again after each weight pass
    (:class:`autopar.runtime.pipeline.ShardedGradStage`).
    """
    mp = _mp_policy(chunk, precision)
    reshard = zero_stage == 3
    resharded = list(experts) if reshard else []
    for e in experts:
        fully_shard(e, mesh=expert_mesh, reshard_after_forward=reshard, mp_policy=mp)
        if expert_divide_factor is not None:
            e.set_gradient_divide_factor(expert_divide_factor)
            # sum, then divide: a divisor other than the group size is NCCL's PREMUL_SUM,
            # which gloo lacks
            e.set_force_sum_reduction_for_comms(True)
    for key in list(blocks.keys()):
        own = reshard and (block_reshard or {}).get(int(key), True)
        fully_shard(blocks[key], mesh=mesh, reshard_after_forward=own, mp_policy=mp)
        if own:
            resharded.append(blocks[key])
    fully_shard(chunk, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    return resharded + [chunk] if reshard else []


def accumulate_sharded(modules: list[nn.Module], zero_stage: int, last: bool) -> None:
    """FSDP flags for one micro-batch under gradient accumulation: reduce-scatter its gradients
    now (they stay sharded between micro-batches); ZeRO-2 keeps the gathered parameters until
    the last micro-batch's backward, ZeRO-3 reshards after each backward."""
    for m in modules:
        if isinstance(m, FSDPModule):
            m.set_requires_gradient_sync(True)
            m.set_reshard_after_backward(zero_stage == 3 or last)


def allreduce_gradients(params: list[nn.Parameter], group, divisor: int) -> None:
    """Sum the gradients of ``params`` over ``group`` and divide by ``divisor``, in place.

    Tensor-parallel DTensor gradients are reduced through their local shards: the group's ranks
    hold the same shard of each. One flat buffer per dtype, so one collective each.
    """
    grads: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            continue
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        grads.setdefault(g.dtype, []).append(g)
    for tensors in grads.values():
        flat = _flatten_dense_tensors(tensors)
        dist.all_reduce(flat, group=group)
        flat /= divisor
        for g, avg in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
            g.copy_(avg)
