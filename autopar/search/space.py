"""The search space: which degrees and choices are legal for a model, cluster and batch.

Model rules: tp divides attention and KV heads; cp divides the sequence (and leaves at least
``min_cp_chunk`` tokens per rank, below which ring attention cannot hide its transfers) and the
framework's split of the sequence over tp x cp holds (load-balanced CP, SP:
seq_split);
pp * v <= blocks; interleaving needs the micro-batch count to be a multiple of pp; 1F1B at least
pp micro-batches; the split-backward schedules follow torch's rules (:func:`schedule_options`).
Cluster rules: tp stays inside a node (NVLink/PCIe domain) unless fixed otherwise.
Batch rules: the global batch is a multiple of dp * micro-batch.
Each rule is a function of :mod:`autopar.frameworks.rules` (tp_heads, cp_seq, seq_split,
pp_blocks, interleave_fill, pipeline_fill, schedule_rounds, tp_node, batch_split, ulysses_heads,
ep_split, expert_folding), the one the cost model's resolve and the plan checks use too.
Framework rules (:mod:`autopar.frameworks`): only the ZeRO stages, schedules, interleavings, CP
modes, recompute policies, sequence and expert parallelism the target framework runs
(``TrainingConfig.framework``).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations

from ..config import RECOMPUTE_MODES, SPLIT_BACKWARD, ParallelConfig, TrainingConfig
from ..errors import InvalidParallelConfig
from ..frameworks import PROFILES, FrameworkProfile, rules
from ..graph.types import ModelGraph

_TORCH = PROFILES["torch"]

#: Keys ``fixed=`` may pin.
FIXABLE = ("tp", "pp", "dp", "cp", "ep", "zero_stage", "recompute", "sequence_parallel",
           "micro_batch_size", "virtual_stages", "schedule", "stage_blocks", "placement",
           "cp_mode", "reshard_after_forward", "expert_tp", "dispatcher", "recompute_modules",
           "vp_group")


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return small + large[::-1]


@dataclass(frozen=True)
class SpaceLimits:
    """Bounds that keep the enumeration finite without cutting plausible plans.

    Attributes:
        max_micro_batch: largest micro-batch tried (sequences).
        max_virtual_stages: largest interleaving degree tried.
        max_zero_bubble_chunks: largest v tried for interleaved zero bubble (a search-time
            limit: its weight passes already fill most of 1F1B's bubble, and each chunk adds
            pipeline traffic and in-flight memory; measured on benchmarks.search_speed, trying
            every v made the GPT-3 search 3.5x slower). Pin ``virtual_stages`` to try others.
        min_cp_chunk: fewest tokens per context-parallel rank.
        tp_across_nodes: allow TP groups that span nodes.
        refine_within: phase-1 candidates within this fraction of the best get phase 2
            (placements, CP modes, stage cuts).
        exhaustive_below: when phase 1 yields at most this many candidates, all get phase 2.
        layerwise: let each block take its own recomputation and each stage its own number of
            blocks; False restricts plans to one recompute mode for all blocks and balanced
            cuts (the uniform baseline ``benchmarks.search_quality`` compares against).
        max_dims: the most parallel dimensions of degree > 1 (tp, cp, pp, dp, ep) a plan may
            use; None: any. The robust objective's search for simpler plans
            (:mod:`autopar.search.robust`) sets it.
    """

    max_micro_batch: int = 16
    max_virtual_stages: int = 16
    max_zero_bubble_chunks: int = 2
    min_cp_chunk: int = 1024
    tp_across_nodes: bool = False
    refine_within: float = 0.05
    exhaustive_below: int = 400
    layerwise: bool = True
    max_dims: int | None = None


def check_fixed(fixed: dict | None) -> dict:
    """Validate a ``fixed=`` mapping: known keys only.

    Raises:
        InvalidParallelConfig: an unknown key (message lists the valid ones).
    """
    fixed = dict(fixed or {})
    unknown = sorted(set(fixed) - set(FIXABLE))
    if unknown:
        raise InvalidParallelConfig(
            f"fixed= has unknown keys {unknown}. Fix: use only {list(FIXABLE)}.")
    checked = ParallelConfig(**{k: v for k, v in fixed.items()   # type and range checks
                                if not (k == "dispatcher" and v == AUTO_DISPATCHER)})
    if "schedule" in fixed:
        fixed["schedule"] = checked.schedule  # an alias, normalised
    if "recompute" in fixed:
        # a per-block list becomes the tuple the search reads as per-block modes (a list was
        # neither a str nor a tuple there: the pin was dropped and the search chose)
        fixed["recompute"] = checked.recompute
    return fixed


def meshes(graph: ModelGraph, cluster, train: TrainingConfig, fixed: dict,
           limits: SpaceLimits, profile: FrameworkProfile = _TORCH
           ) -> list[tuple[int, int, int, int]]:
    """Legal (tp, cp, pp, dp) with tp * cp * pp * dp = GPUs, in a deterministic order (cp = 1
    only when ``profile`` has no context parallelism)."""
    world = cluster.world_size
    heads, kv = graph.attention_heads or 1, graph.kv_heads or 1
    blocks = max(graph.num_blocks, 1)
    out = []
    for tp in divisors(world):
        if "tp" in fixed and tp != fixed["tp"]:
            continue
        if "tp" not in fixed:
            if rules.tp_heads(tp, heads, kv, profile.kv_heads_below_tp):
                continue
            if not limits.tp_across_nodes and rules.tp_node(tp, cluster.gpus_per_node):
                continue
            if tp > 1 and getattr(graph, "num_experts", 0) and not profile.experts_tp_sharded:
                # the framework keeps experts whole on every TP rank, which the cost model does
                # not price yet (it splits them): such plans would win only in the model
                continue
        for cp in divisors(world // tp):
            if "cp" in fixed and cp != fixed["cp"]:
                continue
            if rules.cp_seq(cp, train.seq_len):
                continue
            if "cp" not in fixed and cp > 1 and not profile.cp_modes:
                continue
            if "cp" not in fixed and cp > 1 and train.seq_len // cp < limits.min_cp_chunk:
                continue
            sps = sequence_parallel_options(tp, fixed, profile, train.seq_len, cp,
                                            moe=getattr(graph, "num_experts", 0) > 0)
            if not sps or rules.seq_split(profile, train.seq_len, tp, cp, sps[0]):
                continue  # the framework cannot split the sequence over tp x cp
            for pp in divisors(world // (tp * cp)):
                if "pp" in fixed and pp != fixed["pp"]:
                    continue
                if rules.pp_blocks(pp, 1, blocks):
                    continue
                if pp == 1 and ((fixed.get("virtual_stages") or 1) > 1 or fixed.get(
                        "schedule") not in (None, "1f1b", "gpipe")):
                    continue  # interleaving or a split-backward schedule was pinned: needs pp > 1
                dp = world // (tp * cp * pp)
                if "dp" in fixed and dp != fixed["dp"]:
                    continue
                if rules.batch_split(train.global_batch_size, dp):
                    continue
                out.append((tp, cp, pp, dp))
    return out


def micro_batches(train: TrainingConfig, dp: int, fixed: dict, limits: SpaceLimits,
                  pp: int = 1) -> list[int]:
    """Micro-batch sizes dividing the per-replica batch, ascending.

    With ``pp > 1`` and a 1F1B schedule (any but a pinned GPipe) at least ``pp`` micro-batches
    per step: ``torch.distributed.pipelining``'s ``Schedule1F1B`` refuses fewer (and no 1F1B
    pipeline fills with fewer). A pinned micro-batch is returned as it is.
    """
    if "micro_batch_size" in fixed:
        return [fixed["micro_batch_size"]]
    if train.micro_batch_size is not None:
        return [train.micro_batch_size]
    per_replica = train.global_batch_size // dp
    fill = pp > 1 and fixed.get("schedule") != "gpipe"
    return [b for b in divisors(per_replica) if b <= limits.max_micro_batch
            and not (fill and rules.pipeline_fill("1f1b", pp, per_replica // b))]


def vp_group_option(pp: int, m: int, fixed: dict, profile: FrameworkProfile = _TORCH
                    ) -> int | None:
    """The micro-batch group interleaved 1F1B runs with (:attr:`autopar.config.ParallelConfig.
    vp_group`): a pinned one; else None (the schedule's default) where pp divides the ``m``
    micro-batches or the framework cannot set it (:attr:`~autopar.frameworks.FrameworkProfile.
    vp_group_tunable`); else the smallest Megatron-LM accepts (:func:`autopar.frameworks.rules.
    interleave_fill`), which holds the fewest micro-batches in flight; None when there is none
    (interleaving is then not offered)."""
    if "vp_group" in fixed:
        return fixed["vp_group"]
    if pp <= 1 or m % pp == 0 or not profile.vp_group_tunable:
        return None
    return next((n for n in range(pp, m + 1) if not rules.interleave_fill(pp, 2, m, n)), None)


def virtual_stage_options(pp: int, blocks: int, m: int, fixed: dict,
                          limits: SpaceLimits, profile: FrameworkProfile = _TORCH) -> list[int]:
    """Interleaving degrees: 1, and v > 1 when pp > 1, pp * v <= blocks, pp divides m (or the
    group of :func:`vp_group_option` groups m: :func:`autopar.frameworks.rules.interleave_fill`)
    and the
    framework interleaves (only into equal chunks, blocks % (pp * v) == 0, when its rule is
    "equal"). A pinned v is the only option, and none on a mesh with pp = 1 when it is > 1;
    with a pinned ``vp_group``, v > 1 only."""
    if "virtual_stages" in fixed:
        # a pinned v > 1 means interleaving: a mesh without a pipeline cannot honour it
        return [fixed["virtual_stages"]] if pp > 1 or fixed["virtual_stages"] == 1 else []
    if fixed.get("schedule") in ("1f1b", "gpipe"):
        return [1]
    opts = [1]
    group = vp_group_option(pp, m, fixed, profile)
    if pp > 1 and not rules.interleave_fill(pp, 2, m, group) \
            and "interleaved-1f1b" in profile.schedules and profile.interleaved_chunks != "none":
        opts += [v for v in range(2, limits.max_virtual_stages + 1)
                 if not rules.pp_blocks(pp, v, blocks)
                 and (profile.interleaved_chunks == "any" or blocks % (pp * v) == 0)]
    if fixed.get("schedule") == "interleaved-1f1b":
        opts = [v for v in opts if v > 1] or opts
    if "vp_group" in fixed:   # a pinned micro-batch group is interleaving's (ParallelConfig)
        opts = [v for v in opts if v > 1]
    return opts


#: Schedules splitting backward into input- and weight-gradient passes (torch 2.13), and the
#: chunk count per rank each needs (None: any).
SPLIT_SCHEDULES = {"interleaved-zero-bubble": None, "zbv-zero-bubble": 2, "dualpipev": 2,
                   "dualpipe": 2}


def schedule_options(pp: int, blocks: int, m: int, fixed: dict, limits: SpaceLimits,
                     profile: FrameworkProfile = _TORCH) -> list[tuple[str | None, int]]:
    """(schedule, virtual_stages) pairs to try: the 1F1B family as
    :func:`virtual_stage_options` gives it (schedule None = 1F1B, interleaved when v > 1), then,
    with ``pp > 1`` and where the framework runs them, the split-backward schedules:
    interleaved zero bubble at v = 1 .. ``limits.max_zero_bubble_chunks`` (m a multiple of
    torch's rounds ``max(1, m // pp)``), ZBV and DualPipeV at v = 2 (DualPipeV with m >= 2 pp).
    Chunk counts obey ``pp * v <= blocks`` and the framework's chunk rule. A pinned schedule or
    virtual_stages keeps only the pairs that match it.
    """
    want, want_v = fixed.get("schedule"), fixed.get("virtual_stages")
    out: list[tuple[str | None, int]] = []
    if want is None or want not in SPLIT_SCHEDULES:
        out += [(want, v) for v in virtual_stage_options(pp, blocks, m, fixed, limits, profile)]
    if pp == 1:
        return out

    def chunks_ok(v: int) -> bool:
        if rules.pp_blocks(pp, v, blocks):
            return False
        if v > 1 and profile.interleaved_chunks == "none":
            return False
        return v == 1 or profile.interleaved_chunks == "any" or blocks % (pp * v) == 0

    for name, need in SPLIT_SCHEDULES.items():
        if name not in profile.schedules or want not in (None, name):
            continue
        if need is None:
            if rules.schedule_rounds(name, pp, m):
                continue
            vs = [want_v] if want_v else list(range(1, limits.max_zero_bubble_chunks + 1))
        else:
            vs = [need]
        if rules.pipeline_fill(name, pp * 2, m):   # DualPipeV: a micro-batch per chunk
            continue
        out += [(name, v) for v in vs if chunks_ok(v) and want_v in (None, v)]
    return out


def zero_options(base: dict, fixed: dict, profile: FrameworkProfile = _TORCH,
                 schedule: str | None = None) -> list[int]:
    """ZeRO stages worth trying on the mesh ``base`` (tp, pp, dp, cp, ep): 0 when no rank
    shares weights (dp * cp = 1), else those of 0-3 the framework runs with these degrees (the
    optimizer shards over dp x cp, as Megatron-LM's distributed optimizer does), without 3
    under a split-backward ``schedule`` where the framework trains that pairing wrong
    (:attr:`~autopar.frameworks.FrameworkProfile.zero3_split_backward`)."""
    if "zero_stage" in fixed:
        stages = [fixed["zero_stage"]]
    elif base["dp"] * base.get("cp", 1) == 1:
        stages = [0]
    else:
        stages = list(profile.zero_options(base.get("tp", 1), base.get("pp", 1),
                                           base.get("cp", 1), base.get("ep", 1)))
    if schedule in SPLIT_BACKWARD and base.get("pp", 1) > 1 and not profile.zero3_split_backward:
        return [z for z in stages if z != 3]
    return stages


def recompute_modes(fixed: dict, profile: FrameworkProfile = _TORCH) -> tuple[str, ...]:
    """Recompute modes blocks may take: those of :data:`autopar.config.RECOMPUTE_MODES` the
    framework offers (in that order), or the one pinned."""
    rc = fixed.get("recompute")
    if isinstance(rc, str):
        return (rc,)
    return tuple(m for m in RECOMPUTE_MODES if m in profile.recompute_modes)


def sequence_parallel_options(tp: int, fixed: dict, profile: FrameworkProfile = _TORCH,
                              seq_len: int | None = None, cp: int = 1,
                              moe: bool = False) -> list[bool]:
    """Sequence parallelism: on whenever tp > 1 and the framework allows it (it saves memory
    at equal communication volume, Korthikanti et al. 2022), on a model with MoE layers
    (``moe``) only where its MoE layers take it
    (:meth:`~autopar.frameworks.FrameworkProfile.sequence_parallel_values`), and the
    framework's sequence split holds for sequences of ``seq_len`` tokens over tp x ``cp``
    (:func:`autopar.frameworks.rules.seq_split`), else off where the framework
    runs TP without it and that split holds; [] when neither does; or the value pinned."""
    if tp == 1:   # before a pin: SP needs tp > 1, and a config built with it would be marked
        return [False]   # as asking for it at tp=1 (config.check_sp_request)
    if "sequence_parallel" in fixed:
        return [fixed["sequence_parallel"]]
    return [sp for sp in (True, False) if sp in profile.sequence_parallel_values(moe) and (
        seq_len is None or rules.seq_split(profile, seq_len, tp, cp, sp) is None)][:1]


def placements(base: dict, fixed: dict,
               profile: FrameworkProfile = _TORCH) -> list[tuple[str, ...]]:
    """Rank placements worth trying, innermost first, TP always innermost (on the fastest
    links), only those the framework builds (:attr:`FrameworkProfile.placements`; the first
    is the default, tp-cp-dp-pp). Orders that differ only in where degree-1 dimensions sit
    are one placement. A pinned placement is returned as pinned (the pin check,
    :meth:`FrameworkProfile.unsupported`, refuses one the framework does not build)."""
    if "placement" in fixed:
        return [tuple(fixed["placement"])]

    def canon(order):
        return tuple(d for d in order if base.get(d, 1) > 1)

    built = {canon(o) for o in profile.placements}
    out, seen = [], set()
    for rest in permutations(("cp", "dp", "pp")):
        order = ("tp", *rest)
        key = canon(order)
        if key not in seen and (not built or key in built):
            seen.add(key)
            out.append(order)
    return out


def cp_modes(graph: ModelGraph, base: dict, fixed: dict,
             profile: FrameworkProfile = _TORCH) -> list[str]:
    """Context-parallel exchange modes legal for this mesh and framework (only "ring" when
    cp = 1)."""
    if "cp_mode" in fixed:
        return [fixed["cp_mode"]]
    if base.get("cp", 1) == 1:
        return ["ring"]
    modes = ["ring", "allgather"]
    heads, kv = graph.attention_heads, graph.kv_heads
    if heads and not rules.ulysses_heads(base["tp"], base["cp"], heads, kv,
                                         kv_repeat=profile.ulysses_kv_repeat):
        modes.insert(1, "ulysses")
    return [m for m in modes if m in profile.cp_modes] or modes[:1]


def ep_options(graph: ModelGraph, dp: int, fixed: dict,
               profile: FrameworkProfile = _TORCH) -> list[int]:
    """Expert-parallel degrees: divisors of both the expert count and dp (1 for dense models
    and frameworks without expert parallelism)."""
    if "ep" in fixed:
        return [fixed["ep"]]
    experts = getattr(graph, "num_experts", 0)
    if not experts or not profile.expert_parallel:
        return [1]
    return [e for e in divisors(dp) if not rules.ep_split(e, dp, experts)]


#: Dispatchers the search chooses between when asked to (``fixed={"dispatcher": "auto"}``, the
#: CLI's ``--dispatcher auto``) where a framework runs them. DeepEP stays a pinned choice: its
#: price is one vendor's published bandwidth table (autopar.cost.dispatch).
SEARCHED_DISPATCHERS = ("alltoall", "allgather")
#: The ``fixed`` dispatcher value that asks the search to choose (not a :data:`DISPATCHERS`
#: name: searching it doubles the MoE groups, measured on benchmarks.search_speed's MoE cases
#: under the megatron profile at 2.1x the CPU seconds, so it is opt-in).
AUTO_DISPATCHER = "auto"


def dispatchers(ep: int, fixed: dict, profile: FrameworkProfile | None) -> tuple[str, ...]:
    """Token dispatchers to try for a group with ``ep`` expert-parallel ranks: the pinned one
    (``fixed["dispatcher"]``); with ``"auto"`` (:data:`AUTO_DISPATCHER`) and ep > 1, those of
    :data:`SEARCHED_DISPATCHERS` the framework runs (:attr:`FrameworkProfile.dispatchers`:
    Megatron-Core's all-to-all and all-gather), so only MoE groups with ep > 1 are multiplied;
    else the default, ``ParallelConfig.dispatcher`` (all-to-all)."""
    pin = fixed.get("dispatcher")
    if pin == AUTO_DISPATCHER:
        found = tuple(d for d in SEARCHED_DISPATCHERS
                      if profile is not None and d in profile.dispatchers)
        return found if ep > 1 and found else (ParallelConfig.dispatcher,)
    if pin is not None:
        return (pin,)
    return (ParallelConfig.dispatcher,)


def expert_options(graph: ModelGraph, tp: int, cp: int, dp: int, fixed: dict,
                   profile: FrameworkProfile = _TORCH, gpus_per_node: int | None = None
                   ) -> list[tuple[int, int | None]]:
    """(ep, expert_tp) pairs to try on a tp x cp x dp mesh: without MoE parallel folding
    (expert_tp None) the :func:`ep_options`; with it, where the framework runs it
    (:attr:`FrameworkProfile.expert_tensor_parallel`), every etp other than tp (the
    framework's rule: "one_or_tp" only 1; "one" only 1, and no unfolded pair under tp > 1;
    "any" each divisor of tp x cp x dp up to
    ``gpus_per_node``, expert tensor parallelism kept inside a node as TP is) with each ep
    dividing the experts and tp x cp x dp / etp (Megatron-Core parallel_state.py: world_size %
    (etp * ep * pp) == 0). Pinned ``ep`` / ``expert_tp`` are kept. Megatron's rule that folded
    MoE under tp > 1 needs sequence parallelism is left to
    :func:`autopar.cost.resolve.resolve`, which refuses the rest."""
    pinned = "expert_tp" in fixed
    etp_pin = fixed.get("expert_tp")
    if etp_pin == tp:
        etp_pin = None
    out: list[tuple[int, int | None]] = []
    rule = profile.expert_tensor_parallel
    experts = getattr(graph, "num_experts", 0)
    if not pinned or etp_pin is None:   # unfolded: etp = tp, which rule "one" runs only at 1
        out = [(e, None) for e in ep_options(graph, dp, fixed, profile)
               if not (rule == "one" and tp > 1 and experts)]
    if not experts or not profile.expert_parallel or rule == "tp" or (pinned and etp_pin is None):
        return out
    span = tp * cp * dp
    if pinned:
        etps = [etp_pin]
    elif rule in ("one_or_tp", "one"):
        etps = [1] if tp > 1 else []
    else:
        etps = [t for t in divisors(span) if t != tp
                and (gpus_per_node is None or not rules.tp_node(t, gpus_per_node))]
    for etp in etps:
        for e in divisors(span // etp) if span % etp == 0 else []:
            if not rules.expert_folding(e, etp, span, experts) and fixed.get("ep", e) == e:
                out.append((e, etp))
    return out
