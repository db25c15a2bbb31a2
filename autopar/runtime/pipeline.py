"""Pipeline stages and schedules from ``torch.distributed.pipelining``.

Chunk ``c`` (``stage_blocks[c]`` blocks, in model order) runs on pipeline rank ``c % pp``: with
``virtual_stages = v`` each rank holds ``v`` chunks, as Megatron-LM's interleaved schedule
(Narayanan et al. 2021). The plan's schedule maps to ``ScheduleGPipe``, ``Schedule1F1B`` or
``ScheduleInterleaved1F1B``. Losses are per micro-batch means; the schedule scales gradients by
1 / micro-batches (``scale_grads=True``), so a step's gradient is that of the mean loss.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from .errors import UnsupportedPlanError

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
              "interleaved-1f1b": ScheduleInterleaved1F1B}


def local_chunk_ids(pp: int, pp_rank: int, chunks: int) -> list[int]:
    """Chunk indices that pipeline rank ``pp_rank`` runs (``pp_rank``, ``pp_rank + pp``, ...)."""
    return list(range(pp_rank, chunks, pp))


def build_schedule(modules: list[nn.Module], chunk_ids: list[int], chunks: int, schedule: str,
                   microbatches: int, loss_fn: Callable, group, device: torch.device):
    """The pipeline schedule object of this rank over its chunk ``modules``.

    Raises:
        UnsupportedPlanError: fewer micro-batches than pipeline ranks (no schedule can fill the
            pipeline), or an unknown schedule.
    """
    pp = group.size()
    if microbatches < pp:
        raise UnsupportedPlanError(
            f"{microbatches} micro-batches per step cannot fill {pp} pipeline stages. Fix: a "
            "smaller micro_batch_size or a larger global batch.")
    if schedule not in _SCHEDULES:
        raise UnsupportedPlanError(f"unknown pipeline schedule {schedule!r}; known: "
                                   f"{sorted(_SCHEDULES)}.")
    stages = [PipelineStage(m, c, chunks, device, group=group)
              for m, c in zip(modules, chunk_ids)]
    cls = _SCHEDULES[schedule]
    if schedule == "interleaved-1f1b" or len(stages) > 1:
        return ScheduleInterleaved1F1B(stages, microbatches, loss_fn=loss_fn)
    return cls(stages[0], microbatches, loss_fn=loss_fn)
