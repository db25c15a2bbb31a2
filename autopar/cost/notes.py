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


#: How the host-time note of :func:`host_bound_notes` begins.
HOST_NOTE_PREFIX = "host time: "
#: The share of the step the exposed host time must reach before an estimate says so
#: (:func:`host_bound_notes`): 10%, the size of the development split's typical error.
HOST_NOTE_SHARE = 0.10


def host_bound_notes(inputs: CostInputs, stage_host: tuple, host_exposed_s: float,
                     step_s: float) -> tuple[str, ...]:
    """A note when the host's issue time exposed in the step (``host_exposed_s`` of
    ``step_s`` seconds: the time breakdown's ``host_exposed``) is :data:`HOST_NOTE_SHARE` of it
    or more: the kernels per micro-batch of the slowest-issuing pipeline rank
    (``stage_host`` as :attr:`PipelineTiming.stage_host`), their average GPU time, the host
    seconds each is priced at (:attr:`CostInputs.kernel_host_s`) and where that rate comes
    from, and what lowers it."""
    if step_s <= 0 or host_exposed_s < HOST_NOTE_SHARE * step_s or not stage_host:
        return ()
    prof, per = inputs.profile, inputs.kernel_host_s
    r = max(range(len(stage_host)), key=lambda i: stage_host[i][2] + stage_host[i][3])
    gf, gb, hf, hb = stage_host[r]
    n = round((hf + hb) / per)
    if per > inputs.params.host_op_s:
        origin = " ".join(prof.cost_sources.get("host_op_s_published", "").split())
        rate = (f"the {prof.name} stack's host time per counted kernel, a total of its module "
                "code, dispatcher and launches; from: "
                + (origin if len(origin) <= 120 else origin[:117].rstrip() + "..."))
    else:
        rate = "the measured dispatch rate, a lower bound: CostParams.host_op_s"
    return (f"{HOST_NOTE_PREFIX}pipeline rank {r} issues about {n:,} kernels per micro-batch for "
            f"{(gf + gb) * 1e3:.3g} ms of GPU work ({(gf + gb) / max(n, 1) * 1e6:.0f} us each) "
            f"at {per * 1e6:.3g} us of host time each ({rate}): the host adds "
            f"{host_exposed_s:.3g} s ({host_exposed_s / step_s:.0%}) to this step. Fix: CUDA "
            "graphs (--stack-option cuda-graphs), or more work per kernel: more tokens per GPU "
            "(a larger global batch, or fewer GPUs), then a larger micro-batch or less tensor or "
            "expert parallelism (pinning those alone, the search may restore the split)",)
