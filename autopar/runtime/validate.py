"""Which plans :func:`autopar.runtime.apply` runs: :func:`check_plan`, pure (no process group,
no model), so the search's plans can be checked against it cheaply.

Rules that need the model (TP dividing heads and vocabulary, EP dividing the expert count,
tied embeddings, a known model layout) are checked by ``apply`` once it holds the model.

Pipeline rules are those ``torch.distributed.pipelining`` (torch 2.13) enforces in its schedule
constructors (``schedules.py``): ``Schedule1F1B`` and ``ScheduleDualPipeV`` need at least as many
micro-batches as stages; the looped schedules (interleaved 1F1B, interleaved zero bubble) need
the micro-batch count to be a multiple of its rounds, ``max(1, m // pp)``; ``ScheduleZBVZeroBubble``
and ``ScheduleDualPipeV`` hold exactly two chunks per rank. GPipe has no rule; a single-chunk
schedule with fewer micro-batches than stages still runs (``Schedule1F1B`` refuses it).
"""

from __future__ import annotations

from ..frameworks import rules
from .errors import UnsupportedPlanError

#: Schedules with one chunk per pipeline rank.
SINGLE_CHUNK = rules.SINGLE_CHUNK
#: Schedules holding several chunks per rank (virtual stages), and the chunk count they need
#: per rank (None: any >= 1).
MULTI_CHUNK = {"interleaved-1f1b": None, "interleaved-zero-bubble": None, "zbv-zero-bubble": 2,
               "dualpipev": 2}
#: Every schedule name the runtime runs.
RUNTIME_SCHEDULES = SINGLE_CHUNK + tuple(MULTI_CHUNK)


def _check(v: rules.Violation | None) -> None:
    """Raise a broken rule (:mod:`autopar.frameworks.rules`) as the runtime's error."""
    if v is not None:
        raise rules.refuse(v, UnsupportedPlanError)


def schedule_name(config) -> str:
    """The schedule the runtime runs for a resolved ``config`` with ``pp > 1``: the plan's, or
    1F1B (interleaved when ``virtual_stages > 1``), as the cost model resolves it."""
    v = config.virtual_stages or 1
    return config.schedule or ("interleaved-1f1b" if v > 1 else "1f1b")


def check_schedule(schedule: str, pp: int, virtual_stages: int, microbatches: int) -> None:
    """Check a pipeline schedule against ``torch.distributed.pipelining``'s rules.

    Args:
        schedule: a name of :data:`RUNTIME_SCHEDULES`.
        pp: pipeline ranks; virtual_stages: chunks per rank; microbatches: per step.

    Raises:
        UnsupportedPlanError: the rule broken and a fix.
    """
    if schedule == "dualpipe":
        raise UnsupportedPlanError(
            "schedule 'dualpipe': torch.distributed.pipelining (torch 2.13) has no bidirectional "
            "DualPipe, so plan.apply cannot run it. Fix: schedule='dualpipev' (its V on the same "
            "ranks, one copy of the parameters).")
    if schedule not in RUNTIME_SCHEDULES:
        raise UnsupportedPlanError(f"unknown pipeline schedule {schedule!r}; the runtime runs "
                                   f"{list(RUNTIME_SCHEDULES)}.")
    _check(rules.schedule_chunks(schedule, virtual_stages))
    _check(rules.pipeline_fill(schedule, pp * virtual_stages, microbatches))
    if schedule in ("interleaved-1f1b", "interleaved-zero-bubble"):
        _check(rules.schedule_rounds(schedule, pp, microbatches))


def check_plan(plan) -> None:
    """Raise if :func:`autopar.runtime.apply` cannot run ``plan`` (an :class:`autopar.Plan`).

    Pure: reads ``plan.config`` and ``plan.train`` only (no process group, no model, no torch).

    Raises:
        UnsupportedPlanError: the first broken rule, with a fix. Rules: dp divides the global
            batch and the micro-batch divides each DP rank's share; no MoE parallel folding
            (``expert_tp`` None); no Megatron-Core recompute modules (``recompute_modules``
            None) nor micro-batch group (``vp_group`` None); ep divides dp (experts are split
            over DP ranks); cp divides the sequence; the stage cut gives
            pp x virtual_stages chunks; the pipeline schedule's rules (:func:`check_schedule`).
            Each rule but the folding and group ones is a function of
            :mod:`autopar.frameworks.rules`, named on the error as ``rule``.
    """
    c, train = plan.config, plan.train
    dp = c.dp or 1
    _check(rules.batch_split(train.global_batch_size, dp))
    local = train.global_batch_size // dp
    mbs = c.micro_batch_size or train.micro_batch_size or local
    _check(rules.batch_split(train.global_batch_size, dp, mbs))
    if c.folded:
        raise UnsupportedPlanError(
            f"expert_tp={c.expert_tp} beside tp={c.tp} (MoE parallel folding): plan.apply lays "
            "experts over the innermost ep ranks of the data-parallel dimension with expert "
            "tensor parallelism equal to tp (autopar/runtime/mesh.py). Fix: export the plan to "
            "Megatron-LM (plan.to_megatron_args(): --expert-tensor-parallel-size), or plan "
            "with expert_tp=None.")
    if c.recompute_modules is not None:
        raise UnsupportedPlanError(
            f"recompute_modules={c.recompute_modules}: plan.apply's selective recompute keeps "
            "everything but the attention core (autopar/runtime/recompute.py); Megatron-Core's "
            "module checkpoints are not run here. Fix: export the plan to Megatron-LM "
            "(plan.to_megatron_args(): --recompute-modules), or plan with "
            "recompute_modules=None.")
    if c.vp_group is not None:
        raise UnsupportedPlanError(
            f"vp_group={c.vp_group}: plan.apply runs torch's ScheduleInterleaved1F1B, which "
            "groups the micro-batches by its own rounds (n_microbatches // max(1, "
            "n_microbatches // pp)). Fix: export the plan to Megatron-LM "
            "(plan.to_megatron_args(): --microbatch-group-size-per-virtual-pipeline-stage), or "
            "plan with vp_group=None.")
    _check(rules.ep_split(c.ep, dp))
    _check(rules.cp_seq(c.cp, train.seq_len))
    v = c.virtual_stages or 1
    if c.stage_blocks is not None:
        _check(rules.stage_cuts(c.stage_blocks, c.pp, v))
    if c.pp > 1:
        check_schedule(schedule_name(c), c.pp, v, local // mbs)
