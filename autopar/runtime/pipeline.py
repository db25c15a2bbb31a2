"""Pipeline stages and schedules from ``torch.distributed.pipelining``.

Chunk ``c`` (``stage_blocks[c]`` blocks, in model order) runs on pipeline rank ``c % pp``: with
``virtual_stages = v`` each rank holds ``v`` chunks, as Megatron-LM's interleaved schedule
(Narayanan et al. 2021); the V-shaped schedules (ZBV zero bubble, DualPipeV) place chunk ``c``
on rank ``c`` for ``c < pp`` and ``2 pp - 1 - c`` after (torch's ``style="v"`` mapping). Losses
are per micro-batch means; the schedule scales gradients by 1 / micro-batches
(``scale_grads=True``), so a step's gradient is that of the mean loss. The schedules' rules on
micro-batch counts are in :mod:`autopar.runtime.validate`.

Under ZeRO-2/3 a chunk's gradients are reduce-scattered after each micro-batch's backward
(:class:`ShardedGradStage`), not accumulated unsharded until the last one as torch's stage does
by default: see :mod:`autopar.runtime.dp` for why and what it costs. Split backwards keep
torch's single reduction, and gather the FSDP chunk before each input and weight pass (the
pass reads the weights it differentiates from the module, see :class:`ShardedGradStage`).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining._backward import stage_backward

from .validate import MULTI_CHUNK, check_schedule

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
              "interleaved-1f1b": ScheduleInterleaved1F1B,
              "interleaved-zero-bubble": ScheduleInterleavedZeroBubble,
              "zbv-zero-bubble": ScheduleZBVZeroBubble, "dualpipev": ScheduleDualPipeV}
#: Schedules placing chunks in a V (rank r holds chunks r and 2 pp - 1 - r).
V_SHAPED = ("zbv-zero-bubble", "dualpipev")
#: Schedules running backward as separate input- and weight-gradient passes (zero bubble).
SPLIT_BACKWARD = ("interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev")


def local_chunk_ids(pp: int, pp_rank: int, chunks: int, schedule: str = "1f1b") -> list[int]:
    """Chunk indices that pipeline rank ``pp_rank`` runs: ``pp_rank, pp_rank + pp, ...``, or
    ``pp_rank, 2 pp - 1 - pp_rank`` for a V-shaped schedule."""
    if schedule in V_SHAPED:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return list(range(pp_rank, chunks, pp))


class ShardedGradStage(PipelineStage):
    """A ``PipelineStage`` whose FSDP chunk reduce-scatters its gradients after every
    micro-batch (full backward); ``reshard_each``: reshard parameters after every backward
    (ZeRO-3) rather than after the last (ZeRO-2).

    Split backwards (zero-bubble input/weight passes) keep torch's reduction (gradients held
    unsharded and reduce-scattered once, after the last micro-batch: ``perform_reduce_grad``),
    but gather the chunk's parameters first (public ``FSDPModule.unshard``). Torch's stage
    finds the weights of each pass from ``submod.parameters()``, and FSDP2 swaps a unit's
    module parameters between its sharded and its unsharded ``nn.Parameter``: a unit that
    resharded after forward (ZeRO-3) lists its sharded parameters, which are not the leaves
    of the forward's autograd graph, so the input pass kept no weight-gradient state for them
    and the weight pass dropped their gradients (measured: pp 2 x dp 2 ZBV drifted by 7e-4 in
    loss after 3 steps). The units in ``resharded`` (those that reshard after forward) reshard
    again after each weight pass; the others stay gathered, as planned."""

    def __init__(self, *args, reshard_each: bool, resharded: list[nn.Module] = (),
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reshard_each = reshard_each
        self.resharded = list(resharded)

    def _units(self) -> list[FSDPModule]:
        return [m for m in self.submod.modules() if isinstance(m, FSDPModule)]

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict,
                                   last_backward: bool = False):
        if not isinstance(self.submod, FSDPModule):
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        if backward_type == "full":
            self.submod.set_requires_gradient_sync(True)
            self.submod.set_reshard_after_backward(self.reshard_each or last_backward)
            grads = stage_backward(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"],
                                   bwd_kwargs["input_values"])
            return grads, None
        for unit in self._units():
            unit.unshard()
        out = super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        if backward_type == "weight":
            for unit in self.resharded:
                unit.reshard()
        return out


def build_schedule(modules: list[nn.Module], chunk_ids: list[int], chunks: int, schedule: str,
                   microbatches: int, loss_fn: Callable, group, device: torch.device,
                   zero_stage: int = 0, resharded: list[list[nn.Module]] | None = None):
    """The pipeline schedule object of this rank over its chunk ``modules``; ``resharded[i]``:
    the FSDP units of ``modules[i]`` that reshard after forward (:func:`autopar.runtime.dp.
    apply_fsdp`'s result).

    Raises:
        UnsupportedPlanError: a schedule rule broken (:func:`~autopar.runtime.validate.
            check_schedule`).
    """
    pp = group.size()
    check_schedule(schedule, pp, len(modules), microbatches)
    units = resharded or [[] for _ in modules]
    stages = [ShardedGradStage(m, c, chunks, device, group=group, reshard_each=zero_stage == 3,
                               resharded=r) for m, c, r in zip(modules, chunk_ids, units)]
    cls = _SCHEDULES[schedule]
    if schedule in MULTI_CHUNK:
        return cls(stages, microbatches, loss_fn=loss_fn)
    return cls(stages[0], microbatches, loss_fn=loss_fn)
