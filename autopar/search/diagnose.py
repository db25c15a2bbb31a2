"""Why a search found nothing, and the smallest change that would find something.

Two failures: no legal mesh at all (:func:`no_mesh_error`: divisibility of heads, batch or
sequence, too few layers for pp, pinned choices), or meshes whose plans all overflow GPU memory
(:func:`infeasible_error`). For the second, feasibility is probed (phase 1 of the search only:
balanced cuts, default placement, best recomputation per rank) with each pinned choice released,
without a pinned micro-batch, and on larger clusters of the same node type, within a time budget.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from types import SimpleNamespace

from ..config import ParallelConfig
from ..cost import offload
from ..cost.model import CostModel
from ..errors import AutoparError, InfeasibleError, InvalidParallelConfig
from ..frameworks import rules
from . import space
from .phases import first_fit

#: Seconds spent probing changes that would make an infeasible problem feasible.
PROBE_BUDGET_S = 10.0
#: Largest factor by which the GPU count is grown when probing for a cluster that fits.
MAX_GROWTH = 64

#: What each pinned degree must satisfy (:data:`autopar.frameworks.rules.DEGREE_RULES`).
_RULES = rules.DEGREE_RULES


def _fmt(rule: str, cm: CostModel) -> str:
    g, t = cm.graph, cm.train
    return rule.format(heads=g.attention_heads, kv=g.kv_heads, gpn=cm.cluster.gpus_per_node,
                       blocks=g.num_blocks, seq=t.seq_len, gbs=t.global_batch_size)


def no_mesh_error(cm: CostModel, fixed: dict) -> AutoparError:
    """The error for a problem with no legal (tp, cp, pp, dp, micro-batch): which rule binds
    and the smallest change (a batch multiple, a legal degree, a micro-batch)."""
    g, world, train = cm.graph, cm.cluster.world_size, cm.train
    limits = space.SpaceLimits()
    any_batch = SimpleNamespace(seq_len=train.seq_len, global_batch_size=world)
    head = f"no legal parallel layout for {g.name} on {world} GPU{'' if world == 1 else 's'}"
    dense = rules.ep_needs_moe(fixed.get("ep") or 1, max(
        (getattr(layer, "num_experts", 0) for layer in g.layers), default=0))
    if dense is not None:
        return rules.refuse(dense, InfeasibleError, f"{head}: ")
    ep, experts = fixed.get("ep") or 1, g.num_experts
    if experts and experts % ep:
        # each EP rank holds experts / ep of every MoE layer's experts
        fits = [d for d in range(1, experts + 1) if experts % d == 0 and world % d == 0]
        if fixed.get("dispatcher") == "deepep":
            # and a group DeepEP runs at some expert_tp (rules.deepep_ranks)
            gpn = cm.cluster.gpus_per_node
            fits = [d for d in fits if d == 1 or any(
                rules.deepep_ranks(t, d, gpn) is None for t in range(1, gpn + 1)
                if gpn % t == 0 and world % (t * d) == 0)]
        return InfeasibleError(f"{head}: ep={ep} does not divide the model's {experts} experts "
                               f"(each expert-parallel rank holds experts / ep of them). Fix: "
                               f"ep in {fits}, or leave it to autopar.")
    if fixed.get("dispatcher") == "deepep" and ep > 1 and experts:
        # DeepEP's kernels run only some expert-TP x EP group sizes (rules.deepep_ranks): a
        # pinned ep no expert_tp can pair with (or the pinned one) leaves no layout
        etp = fixed.get("expert_tp") or fixed.get("tp")
        gpn = cm.cluster.gpus_per_node
        tries = [etp] if etp else [t for t in range(1, gpn + 1) if gpn % t == 0]
        broken = [rules.deepep_ranks(t, ep, gpn, experts, world) for t in tries]
        if all(broken):
            return rules.refuse(broken[0], InfeasibleError, f"{head}: ")
    v = fixed.get("virtual_stages") or 1
    if v > 1 and fixed.get("pp", 2) == 1:
        return InfeasibleError(f"{head}: virtual_stages={v} interleaves pipeline stages, but "
                               "pp=1 is pinned. Fix: pin pp >= 2, or virtual_stages=1.")
    piped = _pipeline_schedule_error(cm, fixed, head, any_batch, limits)
    if piped is not None:
        return piped
    if space.meshes(g, cm.cluster, any_batch, fixed, limits):
        legal = space.meshes(g, cm.cluster, train, fixed, limits)
        if not legal:
            dps = sorted({m[3] for m in space.meshes(g, cm.cluster, any_batch, fixed, limits)})
            d, b = dps[0], train.global_batch_size
            return InfeasibleError(
                f"{head}: the global batch {b} is not a multiple of any legal data-parallel "
                f"degree {dps[:10]} (dp = GPUs / (tp*cp*pp)). Fix: global batch must be a "
                f"multiple of {d} (e.g. {-(-b // d) * d})"
                + (f", or unpin fixed={fixed}." if fixed else "."))
        mbs = fixed.get("micro_batch_size", train.micro_batch_size)
        if mbs is not None:
            per = sorted({train.global_batch_size // m[3] for m in legal})
            return InfeasibleError(
                f"{head}: micro-batch size {mbs} does not divide the per-replica batch of any "
                f"legal layout ({per[:10]} sequences). Fix: use a micro-batch that divides one of "
                f"them (e.g. 1), or a global batch that is a multiple of dp*{mbs}.")
        if all(not space.micro_batches(train, dp, fixed, limits, pp) for _, _, pp, dp in legal):
            _, _, pp, dp = legal[0]
            unfilled = rules.pipeline_fill("1f1b", pp, train.global_batch_size // dp)
            err = InfeasibleError(
                f"{head}: {unfilled.problem}; each of the {dp} data-parallel replicas gets "
                f"{train.global_batch_size // dp} "
                f"sequence{'' if train.global_batch_size // dp == 1 else 's'}. Fix: a global batch "
                f"of at least {pp * dp}, a smaller pp, or the GPipe schedule "
                "(fixed={'schedule': 'gpipe'}, --schedule gpipe).")
            err.rule = unfilled.rule
            return err
        for tp, cp, pp, dp in legal[:1]:
            try:
                cm.resolve(ParallelConfig(**{k: v for k, v in fixed.items() if k in (
                    "virtual_stages", "schedule", "stage_blocks", "placement", "cp_mode",
                    "sequence_parallel")},
                    tp=tp, cp=cp, pp=pp, dp=dp))
            except InvalidParallelConfig as exc:
                return InfeasibleError(f"{head} with fixed={fixed}: {exc}")
        return InfeasibleError(f"{head} with fixed={fixed}. Fix: relax fixed=.")
    pinned = {k: fixed[k] for k in ("tp", "cp", "pp", "dp")
              if isinstance(fixed.get(k), int) and fixed[k] >= 1}
    product = math.prod(pinned.values())
    if len(pinned) > 1 and world % product:
        names = " x ".join(f"{k}={v}" for k, v in pinned.items())
        last = list(pinned)[-1]
        rest = {k: v for k, v in fixed.items() if k != last}
        options = sorted({m[("tp", "cp", "pp", "dp").index(last)]
                          for m in space.meshes(g, cm.cluster, any_batch, rest, limits)})
        hint = f" e.g. {last} in {options[:12]} with the others as pinned," if options else ""
        # with dp pinned too the product is the whole mesh, not one replica's share
        per = "" if "dp" in pinned else " per data-parallel replica"
        return InfeasibleError(
            f"{head}: the pinned degrees {names} = {product} GPUs{per} "
            f"do not divide the {world} GPUs (tp x cp x pp x dp = GPUs). Fix: pin degrees "
            f"whose product divides {world},{hint} or leave some to autopar.")
    for key in sorted(k for k in fixed if k in _RULES):
        rest = {k: v for k, v in fixed.items() if k != key}
        options = _pin_options(cm, key, rest, any_batch, limits)
        if options:
            return InfeasibleError(
                f"{head}: fixed {key}={fixed[key]} breaks a rule: {_fmt(_RULES[key], cm)}. "
                f"Fix: use {key} in {options[:12]}, or leave it to autopar.")
    return InfeasibleError(
        f"{head} with fixed={fixed}: {'; '.join(_fmt(r, cm) for r in _RULES.values())}. "
        "Fix: relax fixed=, or use a GPU count with more divisors.")


def _pin_options(cm: CostModel, key: str, rest: dict, any_batch,
                 limits: space.SpaceLimits) -> list[int]:
    """The values of degree ``key`` (tp, cp, pp or dp) that, pinned with the pins ``rest``,
    leave a legal mesh: what a fix for a bad pin may name. The unpinned search space is
    narrower (TP inside a node, at least ``limits.min_cp_chunk`` tokens per CP rank), so its
    degrees left out values a pin is allowed (``--tp 16`` on two 8-GPU nodes, ``--cp 8``)."""
    g = cm.graph
    heads, kv = g.attention_heads or 1, g.kv_heads or 1
    out = []
    for v in space.divisors(cm.cluster.world_size):
        if key == "tp" and rules.tp_heads(v, heads, kv, cm.profile.kv_heads_below_tp):
            continue   # a pinned tp is checked against the heads when it is resolved
        if space.meshes(g, cm.cluster, any_batch, {**rest, key: v}, limits):
            out.append(v)
    return out


def _pipeline_schedule_error(cm: CostModel, fixed: dict, head: str, any_batch,
                             limits: space.SpaceLimits) -> AutoparError | None:
    """The error when the pinned pipeline schedule is the one pin no layout can honour: it
    needs pp > 1 (:func:`space.meshes` keeps only 1F1B and GPipe at pp = 1, where they are a
    plain step) and pp is pinned to 1 or no legal layout has a pipeline. None when another
    rule binds (a layout exists with the schedule, or none exists without it)."""
    sched = fixed.get("schedule")
    if sched in (None, "1f1b", "gpipe"):
        return None
    g, cluster = cm.graph, cm.cluster
    if space.meshes(g, cluster, any_batch, fixed, limits):
        return None
    rest = {k: v for k, v in fixed.items() if k != "schedule"}
    if not space.meshes(g, cluster, any_batch, rest, limits):
        return None
    pps = sorted({m[2] for m in space.meshes(
        g, cluster, any_batch, {k: v for k, v in fixed.items() if k != "pp"}, limits)})
    if fixed.get("pp") == 1:
        return InfeasibleError(
            f"{head}: schedule={sched!r} is a pipeline schedule and pp=1 is pinned: without a "
            "pipeline there is nothing to schedule. Fix: drop the schedule (--schedule) to "
            "train without a pipeline, or pin pp > 1"
            + (f" (pp in {pps[:12]})." if pps else "."))
    return InfeasibleError(
        f"{head}: schedule={sched!r} needs a pipeline (pp > 1), and no legal layout "
        f"{'with the other pins ' if rest else ''}has one ({_fmt(_RULES['pp'], cm)}). Fix: "
        "drop the schedule (--schedule), or use more GPUs.")


def _with_nodes(cm: CostModel, nodes: int) -> CostModel:
    from ..hardware import Cluster
    c = cm.cluster
    bigger = Cluster(nodes, c.gpus_per_node, c.device, c.intra_link,
                     c.inter_link if c.inter_link is not None else _default_nic(c),
                     c.nics_per_node or 1, comm_params=c.comm_params,
                     gpus_per_host=c.gpus_per_host)
    return cm.rebuilt(bigger)


def _default_nic(cluster):
    from ..hardware.links import get_link
    return get_link("ib-hdr")


def _smallest_cluster(cm: CostModel, fixed: dict, need: int, deadline: float) -> str:
    """'at least N GPUs ...' from probing larger clusters of the same node type."""
    from ..hardware.cluster import MAX_WORLD_SIZE
    gpn, nodes0 = cm.cluster.gpus_per_node, cm.cluster.num_nodes
    lo = nodes0                                   # known not to fit
    hi = max(nodes0 + 1, -(-need // gpn))
    found = None
    while hi * gpn <= MAX_WORLD_SIZE and hi <= nodes0 * MAX_GROWTH and time.monotonic() < deadline:
        if first_fit(_with_nodes(cm, hi), fixed, deadline) is not None:
            found = hi
            break
        lo, hi = hi, hi * 2
    if found is None:
        if fixed and need <= cm.cluster.world_size:
            # full sharding would hold the states here: the pins, not the GPU count, bind
            return (f"more GPUs of this kind do not help with {_pins(fixed)} pinned (no plan "
                    f"fits on up to {lo * gpn} GPUs)")
        return (f"use more GPUs: at least {need} GPUs of this kind are needed even with full "
                f"sharding (got {cm.cluster.world_size})")
    while found - lo > 1 and time.monotonic() < deadline:  # narrow down (feasibility is
        mid = (lo + found) // 2                            # nearly monotone in the GPU count)
        if first_fit(_with_nodes(cm, mid), fixed, deadline) is not None:
            found = mid
        else:
            lo = mid
    least = (lo + 1) * gpn
    return (f"use at least {least} GPUs of this kind (got {cm.cluster.world_size}): a plan fits "
            f"on {found} nodes x {gpn} = {found * gpn} GPUs, none on {lo * gpn}")


def _pins(fixed: dict) -> str:
    """The pinned choices as text: ``tp=1, pp=1, zero_stage=0``."""
    return ", ".join(f"{k}={v!r}" for k, v in sorted(fixed.items()))


def infeasible_error(cm: CostModel, smallest, fixed: dict,
                     deadline: float | None = None) -> AutoparError:
    """The error for a search whose every plan overflows GPU memory: what the most frugal one
    needs, and the smallest changes that fit (unpinning a choice, a smaller micro-batch, more
    GPUs of the same kind), probed until ``deadline`` (monotonic seconds) at the latest."""
    fixed = dict(fixed or {})
    dev = cm.device
    if smallest is None:
        schedule, profile = fixed.get("schedule"), cm.profile
        if schedule is not None and schedule not in profile.schedules:
            # the pinned schedule is one this framework does not run: say so, with its own list
            return InfeasibleError(
                f"{profile.name} does not run the pipeline schedule {schedule!r} (it runs "
                f"{list(profile.schedules)}; {profile.sources.get('schedules', '')}). Fix: one of "
                "those, or the framework that runs it (e.g. 'dualpipe' runs only under "
                "inhouse-2024, DeepSeek's HAI-LLM).")
        return InfeasibleError(
            f"no configuration could be evaluated for fixed={fixed}. Fix: relax fixed= (on the "
            "command line, drop some of the pinned flags).")
    # probe within PROBE_BUDGET_S, and within the search's own time limit when it has one
    deadline = min(time.monotonic() + PROBE_BUDGET_S, deadline or math.inf)
    k = cm.state_bytes_per_param()
    states = k * cm.graph.num_parameters
    usable = cm.params.usable_memory(dev.visible_memory_bytes)
    need = max(1, math.ceil(states / usable)) if usable > 0 else cm.cluster.world_size + 1
    changes = []
    for key in sorted(fixed):
        rest = {kk: v for kk, v in fixed.items() if kk != key}
        e = first_fit(cm, rest, deadline)
        if e is not None:
            val = getattr(e.config, key, None)
            val = val if isinstance(val, (int, str)) else "mixed"
            changes.append(f"unpin {key}={fixed[key]!r} ({key}={val!r} fits)")
    if len(fixed) > 1 and not changes:
        # no single pin binds alone: all of them together may
        e = first_fit(cm, {}, deadline)
        if e is not None:
            changes.append(f"unpin {_pins(fixed)} together ({_short(e.config)} fits)")
    if cm.train.micro_batch_size not in (None, 1) and "micro_batch_size" not in fixed:
        small = replace(cm.train, micro_batch_size=1)
        if first_fit(cm.rebuilt(train=small), fixed, deadline):
            changes.append("use micro_batch_size=1")
    changes += _memory_options(cm, fixed, deadline)
    gpus = _smallest_cluster(cm, fixed, need, deadline)
    if fixed and gpus.startswith("more GPUs of this kind do not help") \
            and not any(c.startswith("unpin") for c in changes):
        # the pins bind on any cluster: say how many GPUs it takes without them
        gpus += f"; unpin them and {_smallest_cluster(cm, {}, need, deadline)}"
    blocked = seq_blocked(cm, fixed)
    if blocked:
        changes.append(blocked)
    e = smallest
    return InfeasibleError(
        f"infeasible: memory per GPU binds: no plan fits in "
        f"{dev.visible_memory_bytes / 1e9:.0f} GB per "
        f"{dev.name}. The most frugal configuration tried ({_short(e.config)}) needs "
        f"{e.memory_per_gpu_bytes / 1e9:.1f} GB per GPU; model states alone are "
        f"{_states_text(states, k, cm.train.optimizer, cm.cluster.world_size)}. Smallest "
        f"changes: {'; '.join(changes + [gpus])}. Fix: one of those, or a shorter sequence.")


def _states_text(states: float, k: int, optimizer: str, world: int) -> str:
    """The model states (``states`` bytes, ``k`` bytes per parameter with ``optimizer``) in all
    and per GPU over the ``world`` GPUs, both in GB (1e9 bytes) to one decimal: the same
    quantity is rounded the same way (one GPU: one figure)."""
    head = f"{states / 1e9:.1f} GB in all ({k} bytes per parameter with {optimizer}"
    if world == 1:
        return head + "; all of it on the one GPU)"
    return head + f"; {states / world / 1e9:.1f} GB per GPU sharded over all {world})"


#: Training options that take model states off the GPU, as (field, value, how to ask for it).
_STATE_OPTIONS = (
    ("optimizer_state_dtype", "bf16", "bf16 moment estimates (optimizer_state_dtype='bf16', "
                                      "--optimizer-state-dtype bf16)"),
    ("optimizer_offload", True, "the optimizer states in CPU memory (optimizer_offload=True, "
                                "--optimizer-offload)"),
    ("param_offload", True, "the ZeRO-3 parameter shards in CPU memory (param_offload=True, "
                            "--param-offload; ZeRO-3 plans)"),
    ("activation_offload", True, "the decoder blocks' saved activations in CPU memory "
                                 "(activation_offload=True, --activation-offload)"),
)


def _memory_options(cm: CostModel, fixed: dict, deadline: float) -> list[str]:
    """The training options of :data:`_STATE_OPTIONS` not yet on under which a plan fits on
    this cluster, each as a change to try (probed until ``deadline``); an offload kind only
    where the target framework runs it (:data:`autopar.cost.offload.SUPPORT`)."""
    out = []
    for name, value, how in _STATE_OPTIONS:
        if getattr(cm.train, name) == value or time.monotonic() >= deadline:
            continue
        if not offload.runs(cm.train.framework, name):   # offered only where it runs
            continue
        pins = fixed
        if name == "param_offload":   # ZeRO-3 only (autopar.cost.offload.check_plan)
            if fixed.get("zero_stage", 3) != 3:
                continue
            pins = {**fixed, "zero_stage": 3}
        train = replace(cm.train, **{name: value})
        if first_fit(cm.rebuilt(train=train), pins, deadline):
            out.append(f"keep {how}")
    return out


def seq_blocked(cm: CostModel, fixed: dict) -> str | None:
    """The (tp, cp) pairs the target framework's sequence split rules out at this sequence
    length (:func:`autopar.frameworks.rules.seq_split`), as a change to try, or
    None when it rules out none."""
    profile = cm.profile
    limits, seq = space.SpaceLimits(), cm.train.seq_len
    pairs = sorted({(m[0], m[1]) for m in space.meshes(cm.graph, cm.cluster, cm.train, fixed,
                                                         limits)})
    out = []
    for tp, cp in pairs:
        sps = space.sequence_parallel_options(tp, fixed, profile, seq, cp,
                                              moe=cm.graph.num_experts > 0)
        if not sps or rules.seq_split(profile, seq, tp, cp, sps[0]):
            out.append(f"{tp}x{cp}")
    if not out:
        return None
    return (f"a sequence length {profile.name} can split over more tp x cp ({seq} tokens rule "
            f"out tp x cp = {', '.join(out[:8])}{', ...' if len(out) > 8 else ''}: "
            f"{profile.seq_rule.source})")


def _short(c: ParallelConfig) -> str:
    rc = c.recompute if isinstance(c.recompute, str) else "mixed"
    return (f"tp={c.tp} pp={c.pp} dp={c.dp} cp={c.cp} zero={c.zero_stage} recompute={rc} "
            f"mbs={c.micro_batch_size}")
