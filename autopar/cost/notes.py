"""What an estimate warns about beside its numbers: prices the framework would not run as
estimated, choices that change nothing, and inputs that leave a cost uncharged."""

from __future__ import annotations

from ..config import ParallelConfig
from .context import CostInputs, runnable_kernel


def estimate_notes(inputs: CostInputs, c: ParallelConfig) -> tuple[str, ...]:
    """Warnings of the estimate of the resolved config ``c`` about how it is priced (a CP
    attention path the framework runs unfused, experts split where the framework keeps them
    whole, a configuration the framework refuses), then :func:`no_effect_notes`."""
    prof, graph = inputs.profile, inputs.graph
    warns: tuple[str, ...] = ()
    path = prof.cp_attention.get(c.cp_mode, "fused") if c.cp > 1 else "fused"
    if path != "fused":
        how = ("in plain tensor ops (scores through memory)" if path == "unfused" else
               "through SDPA with a mask (memory-efficient kernel, no causal skipping)")
        # the torch profile is plan.apply's runtime, not torch's own context_parallel (fused)
        who = "plan.apply (the torch profile)" if "plan.apply" in prof.version else prof.name
        warns = (*warns, f"{who} runs {c.cp_mode} context-parallel attention "
                         f"{how}, and this estimate prices that; cp_mode='ulysses' runs the "
                         "fused kernel (Megatron-LM, torchtitan and torch's own "
                         "context_parallel run fused ring attention)")
    if graph.num_experts and c.etp > 1 and not prof.experts_tp_sharded:
        warns = (*warns, f"{prof.name} keeps experts whole on every TP rank "
                         f"({prof.sources.get('experts_tp_sharded', 'its profile')}); this estimate "
                         f"prices them split over tp={c.tp}, so its step time and memory "
                         "are optimistic. Fix: tp=1 (--tp 1) for MoE models under this "
                         "framework, or plan for a framework that splits experts "
                         "(--framework megatron or torchtitan)")
    if inputs.train.optimizer_offload:
        warns = (*warns, "the optimizer step runs on the CPU and its CPU seconds are not "
                         "priced (the cluster model has no host memory bandwidth): this "
                         "step time is a lower bound by that step (autopar.cost.offload)")
    refused = prof.unsupported(c, moe=graph.num_experts > 0)
    if refused:  # the search never returns such a plan; a hand-written one can be one
        warns = (*warns, f"{refused}: the framework cannot run this configuration as "
                         "estimated")
    return (*warns, *no_effect_notes(inputs, c))


def resolve_notes(config: ParallelConfig) -> tuple[str, ...]:
    """Warnings for fields of the unresolved ``config`` that change nothing: a schedule or
    interleaving at pp=1 (resolving drops them), a context-parallel mode at cp=1. Said, not
    silently."""
    notes = []
    if config.pp == 1 and config.schedule not in (None, "1f1b"):
        notes.append(
            f"schedule {config.schedule!r} at pp=1: there is no pipeline, so the schedule "
            "changes nothing here; fix: drop it, or pp > 1")
    if config.pp == 1 and (config.virtual_stages or 1) > 1:
        # resolving dropped the interleaving too (no pipeline ranks to give chunks to)
        notes.append(
            f"virtual_stages={config.virtual_stages} at pp=1: there is no pipeline to "
            "interleave, so it changes nothing here (costed as v=1); fix: drop it, or "
            "pp > 1")
    if config.cp == 1 and config.cp_mode != "ring":
        # one rank holds the whole sequence: no attention inputs are exchanged
        notes.append(
            f"cp_mode={config.cp_mode!r} at cp=1: there is no context parallelism, so the "
            "exchange mode changes nothing here; fix: drop it, or cp > 1")
    return tuple(notes)


def no_effect_notes(inputs: CostInputs, c: ParallelConfig) -> tuple[str, ...]:
    """Notes for a ZeRO stage that changes nothing in this plan (a hand-written plan can
    hold one; the search never emits it), for FlashAttention-3 priced off Hopper, and for a
    device whose missing SM count leaves the overlap slowdown uncharged. (A schedule at pp=1 is
    noted by :func:`resolve_notes`: resolving drops it.)"""
    notes = []
    if c.zero_stage and c.dp * c.cp == 1:
        notes.append(f"zero_stage={c.zero_stage} with dp x cp = 1: no rank shares weights, "
                     "so ZeRO shards nothing and changes nothing here; fix: zero_stage=0, "
                     "or dp > 1")
    if inputs.attention_kernel == "fa3" and inputs.device.architecture != "hopper":
        notes.append(f"attention kernel fa3 (FlashAttention-3) runs on Hopper GPUs only "
                     f"(Shah et al. 2024, FlashAttention-3: wgmma and TMA); "
                     f"{inputs.device.name!r} is {inputs.device.architecture}, so this estimate "
                     "prices a kernel it cannot run; fix: attention_kernels {'*': 'fa2'} for "
                     "it")
    arch = inputs.device.architecture
    wanted = inputs.profile.attention_kernel(arch)
    if inputs.train.flash_attention and inputs.attention_kernel != wanted \
            and runnable_kernel(wanted, arch) == inputs.attention_kernel:
        te = wanted == "cudnn"   # Transformer Engine's fused attention (megatron, nemo)
        notes.append(f"attention kernel {wanted} does not run on {arch} GPUs "
                     f"({inputs.device.name!r}): priced as SDPA's memory-efficient kernel "
                     "('efficient'), where torch's scaled_dot_product_attention dispatches"
                     + ("; Transformer Engine runs its unfused attention there instead: fix: "
                        "flash_attention=False (--no-flash-attention) prices that" if te
                        else ""))
    # an explicit kernel the GPU cannot run (fa3 off Hopper has its own note above)
    elif inputs.train.flash_attention and inputs.attention_kernel != "fa3" and \
            runnable_kernel(inputs.attention_kernel, arch) != inputs.attention_kernel:
        notes.append(f"attention kernel {inputs.attention_kernel} does not run on {arch} GPUs "
                     f"({inputs.device.name!r}): this estimate prices a kernel it cannot run; "
                     "fix: attention_kernel='efficient', or flash_attention=False")
    if c.dp * c.cp > 1 and not inputs.device.sm_count:
        notes.append(f"device {inputs.device.name!r} has no sm_count: the compute slowdown "
                     "beside overlapped collectives (autopar.hardware.nccl) is not charged, "
                     "so this estimate is optimistic; fix: give the device's SM count "
                     "(dataclasses.replace(device, sm_count=...))")
    return tuple(notes)


#: How the host-time warning of :func:`host_rate_notes` begins, and the words before the step
#: it states (read back by :func:`stated_host_step_s`).
HOST_NOTE_PREFIX = "host time: "
_STATED = "this step would take about "
#: The step-time growth at a stack's published per-kernel host time from which an estimate
#: warns (:func:`host_rate_notes`): 10%, the size of the development split's typical error.
HOST_RATE_WARN = 0.10


def host_rate_growth(inputs: CostInputs, stage_host: tuple, m: int) -> tuple[float, int]:
    """(seconds the step would grow by if each kernel took the framework's published host
    seconds, the pipeline rank that would be slowest then).

    The published rate is :attr:`~autopar.frameworks.FrameworkProfile.host_op_s_published`,
    the priced one :attr:`~autopar.cost.params.CostParams.host_op_s`. Each pipeline rank's
    micro-batch then takes ``max(stream, k x host)`` per pass (``k`` the ratio of the two rates;
    ``stage_host`` as :attr:`PipelineTiming.stage_host`), and the step grows by ``m`` times the
    growth of the slowest rank's micro-batch (the bubble's growth is not counted: an estimate
    of the size, not a price). (0.0, 0) under CUDA graphs or where no figure is published."""
    prof, per = inputs.profile, inputs.params.host_op_s
    if prof.host_issue != "per_kernel" or prof.host_op_s_published <= per or not stage_host:
        return 0.0, 0
    k = prof.host_op_s_published / per
    now = [max(gf, hf) + max(gb, hb) for gf, gb, hf, hb in stage_host]
    then = [max(gf, k * hf) + max(gb, k * hb) for gf, gb, hf, hb in stage_host]
    return m * (max(then) - max(now)), then.index(max(then))


def host_rate_notes(inputs: CostInputs, stage_host: tuple, m: int, step_s: float
                    ) -> tuple[str, ...]:
    """A warning when the step (``step_s`` seconds) would grow by :data:`HOST_RATE_WARN` or more
    at the framework's published per-kernel host time (:func:`host_rate_growth`)."""
    extra, r = host_rate_growth(inputs, stage_host, m)
    if step_s <= 0 or extra < HOST_RATE_WARN * step_s:
        return ()
    prof, per = inputs.profile, inputs.params.host_op_s
    gf, gb, hf, hb = stage_host[r]
    n = round((hf + hb) / per)
    return (f"{HOST_NOTE_PREFIX}pipeline rank {r} issues about {n:,} kernels per micro-batch for "
            f"{(gf + gb) * 1e3:.3g} ms of GPU work ({(gf + gb) / max(n, 1) * 1e6:.0f} us each); "
            f"autopar prices {per * 1e6:.3g} us of host time per kernel (a measured lower "
            f"bound), while published step times of the {prof.name} stack imply about "
            f"{prof.host_op_s_published * 1e6:.0f} us (its profile's host_op_s_published, "
            f"not priced); at that rate {_STATED}{step_s + extra:.4g} s "
            f"(+{extra / step_s:.0%}). Fix: CUDA graphs (--stack-option cuda-graphs), or more "
            "work per kernel: more tokens per GPU (a larger global batch, or fewer GPUs), then "
            "a larger micro-batch or less tensor or expert parallelism (pinning those alone, "
            "the search may restore the split)",)


def stated_host_step_s(warnings) -> float | None:
    """The step seconds the host-time warning among ``warnings`` (an estimate's) states
    (:func:`host_rate_notes`, 4 significant figures), or None without one."""
    for w in warnings:
        if w.startswith(HOST_NOTE_PREFIX) and _STATED in w:
            return float(w.split(_STATED, 1)[1].split(" s", 1)[0])
    return None
