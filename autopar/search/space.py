"""The search space: which degrees and choices are legal for a model, cluster and batch.

Model rules: tp divides attention and KV heads; cp divides the sequence (and leaves at least
``min_cp_chunk`` tokens per rank, below which ring attention cannot hide its transfers);
pp * v <= blocks; interleaving needs the micro-batch count to be a multiple of pp; 1F1B at least
pp micro-batches.
Cluster rules: tp stays inside a node (NVLink/PCIe domain) unless fixed otherwise.
Batch rules: the global batch is a multiple of dp * micro-batch.
Framework rules (:mod:`autopar.frameworks`): only the ZeRO stages, schedules, interleavings, CP
modes, recompute policies, sequence and expert parallelism the target framework runs
(``TrainingConfig.framework``).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations

from ..config import ParallelConfig, TrainingConfig
from ..errors import InvalidParallelConfig
from ..frameworks import PROFILES, FrameworkProfile
from ..graph.types import ModelGraph

_TORCH = PROFILES["torch"]

#: Keys ``fixed=`` may pin.
FIXABLE = ("tp", "pp", "dp", "cp", "ep", "zero_stage", "recompute", "sequence_parallel",
           "micro_batch_size", "virtual_stages", "schedule", "stage_blocks", "placement",
           "cp_mode", "reshard_after_forward")


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
        min_cp_chunk: fewest tokens per context-parallel rank.
        tp_across_nodes: allow TP groups that span nodes.
        refine_within: phase-1 candidates within this fraction of the best get phase 2
            (placements, CP modes, stage cuts).
        exhaustive_below: when phase 1 yields at most this many candidates, all get phase 2.
        layerwise: let each block take its own recomputation and each stage its own number of
            blocks; False restricts plans to one recompute mode for all blocks and balanced
            cuts (the uniform baseline ``benchmarks.search_quality`` compares against).
    """

    max_micro_batch: int = 16
    max_virtual_stages: int = 16
    min_cp_chunk: int = 1024
    tp_across_nodes: bool = False
    refine_within: float = 0.05
    exhaustive_below: int = 400
    layerwise: bool = True


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
    ParallelConfig(**{k: v for k, v in fixed.items()})  # type and range checks
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
            if heads % tp or kv % tp:
                continue
            if not limits.tp_across_nodes and tp > cluster.gpus_per_node:
                continue
        for cp in divisors(world // tp):
            if "cp" in fixed and cp != fixed["cp"]:
                continue
            if train.seq_len % cp:
                continue
            if "cp" not in fixed and cp > 1 and not profile.cp_modes:
                continue
            if "cp" not in fixed and cp > 1 and train.seq_len // cp < limits.min_cp_chunk:
                continue
            for pp in divisors(world // (tp * cp)):
                if "pp" in fixed and pp != fixed["pp"]:
                    continue
                if pp > blocks:
                    continue
                dp = world // (tp * cp * pp)
                if "dp" in fixed and dp != fixed["dp"]:
                    continue
                if train.global_batch_size % dp:
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
    least = pp if pp > 1 and fixed.get("schedule") != "gpipe" else 1
    return [b for b in divisors(per_replica)
            if b <= limits.max_micro_batch and per_replica // b >= least]


def virtual_stage_options(pp: int, blocks: int, m: int, fixed: dict,
                          limits: SpaceLimits, profile: FrameworkProfile = _TORCH) -> list[int]:
    """Interleaving degrees: 1, and v > 1 when pp > 1, pp * v <= blocks, pp divides m and the
    framework interleaves (only into equal chunks, blocks % (pp * v) == 0, when its rule is
    "equal")."""
    if "virtual_stages" in fixed:
        return [fixed["virtual_stages"]]
    if fixed.get("schedule") in ("1f1b", "gpipe"):
        return [1]
    opts = [1]
    if pp > 1 and m % pp == 0 and "interleaved-1f1b" in profile.schedules \
            and profile.interleaved_chunks != "none":
        opts += [v for v in range(2, limits.max_virtual_stages + 1) if pp * v <= blocks
                 and (profile.interleaved_chunks == "any" or blocks % (pp * v) == 0)]
    if fixed.get("schedule") == "interleaved-1f1b":
        opts = [v for v in opts if v > 1] or opts
    return opts


def zero_options(base: dict, fixed: dict, profile: FrameworkProfile = _TORCH) -> list[int]:
    """ZeRO stages worth trying on the mesh ``base`` (tp, pp, dp, cp, ep): 0 when no rank
    shares weights (dp * cp = 1), else those of 0-3 the framework runs with these degrees (the
    optimizer shards over dp x cp, as Megatron-LM's distributed optimizer does)."""
    if "zero_stage" in fixed:
        return [fixed["zero_stage"]]
    if base["dp"] * base.get("cp", 1) == 1:
        return [0]
    return list(profile.zero_options(base.get("tp", 1), base.get("pp", 1), base.get("cp", 1),
                                     base.get("ep", 1)))


def recompute_modes(fixed: dict, profile: FrameworkProfile = _TORCH) -> tuple[str, ...]:
    """Recompute modes blocks may take: those of none, selective, full the framework offers
    (in that order), or the one pinned."""
    rc = fixed.get("recompute")
    if isinstance(rc, str):
        return (rc,)
    return tuple(m for m in ("none", "selective", "full") if m in profile.recompute_modes)


def sequence_parallel_options(tp: int, fixed: dict, profile: FrameworkProfile = _TORCH,
                              tokens: int | None = None) -> list[bool]:
    """Sequence parallelism: on whenever tp > 1 and the framework allows it (it saves memory
    at equal communication volume, Korthikanti et al. 2022) and the ``tokens`` per CP rank
    divide by tp (else off where the framework runs TP without it), or the value pinned."""
    if "sequence_parallel" in fixed:
        return [fixed["sequence_parallel"]]
    divisible = tokens is None or tokens % tp == 0
    if tp > 1 and not divisible:
        return [False] if False in profile.sequence_parallel else []
    return [tp > 1 and True in profile.sequence_parallel]


def placements(base: dict, fixed: dict) -> list[tuple[str, ...]]:
    """Rank placements worth trying, innermost first, TP always innermost (on the fastest
    links). Orders that differ only in where degree-1 dimensions sit are one placement."""
    if "placement" in fixed:
        return [tuple(fixed["placement"])]
    out, seen = [], set()
    for rest in permutations(("cp", "dp", "pp")):
        order = ("tp", *rest)
        canon = tuple(d for d in order if base.get(d, 1) > 1)
        if canon not in seen:
            seen.add(canon)
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
    heads, kv, n = graph.attention_heads, graph.kv_heads, base["tp"] * base["cp"]
    if heads and heads % n == 0 and kv % n == 0:
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
    return [e for e in divisors(dp) if experts % e == 0]
