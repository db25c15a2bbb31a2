"""Fill a ParallelConfig's open fields with defaults and check it against model and cluster.

The rules are :mod:`autopar.frameworks.rules`' (each error names the rule, as ``rule``, and a
fix), checked in this order: the degrees multiply to the GPUs (mesh_size); tp divides the
attention and KV heads (tp_heads), tp * cp too under Ulysses CP (ulysses_heads; the KV heads
not where the profile repeats them, ulysses_kv_repeat); experts:
MoE parallel folding (expert_folding, folding_sp), else ep needs a MoE model (ep_needs_moe) and
divides the experts and dp (ep_split); DeepEP's kernels run the expert-TP x EP group and the
node (deepep_ranks), across nodes not over EFA (deepep_fabric); cp divides the sequence
(cp_seq) and the target framework's sequence split holds (seq_split); the global batch is a multiple of dp *
micro-batch (batch_split); pp * v <= blocks (pp_blocks); interleaved 1F1B needs the micro-batch
count to be a multiple of pp (interleave_fill, Megatron-LM); interleaved zero bubble a multiple
of its rounds (schedule_rounds) and DualPipeV at least 2 pp micro-batches (pipeline_fill; torch
2.13 schedule constructors); one stage cut per chunk (stage_cuts).
"""

from __future__ import annotations

from ..config import DEFAULT_PLACEMENT, DUAL_PIPES, V_SCHEDULES, ParallelConfig, TrainingConfig
from ..errors import InvalidParallelConfig
from ..frameworks import FrameworkProfile, get_profile, rules
from ..graph.types import ModelGraph
from .stages import balanced_stage_blocks


def check(violation: rules.Violation | None) -> None:
    """Raise a broken rule (:mod:`autopar.frameworks.rules`) as this stage's error.

    Raises:
        InvalidParallelConfig: ``violation`` is not None (its text; ``rule`` names it).
    """
    if violation is not None:
        raise rules.refuse(violation, InvalidParallelConfig)


def resolve(config: ParallelConfig, graph: ModelGraph, world_size: int,
            train: TrainingConfig, gpus_per_node: int | None = None,
            profile: FrameworkProfile | None = None,
            inter_kind: str | None = None) -> ParallelConfig:
    """A copy of ``config`` with every ``None`` filled and every rule checked
    (``gpus_per_node``, where given, for the rules that read the node: deepep_ranks).

    ``profile``: the framework profile whose rules apply (an edited one, e.g. a record's);
    None = the profile of ``train.framework``. ``inter_kind``: the kind of the cluster's
    inter-node link (deepep_fabric), None for one node.

    Defaults: dp from the world size; micro-batch from ``train`` or 1; one virtual stage;
    schedule 1F1B (interleaved when virtual_stages > 1); balanced stage cuts.

    Raises:
        InvalidParallelConfig: the configuration breaks a rule (message names it and a fix).
    """
    c = config
    check(rules.mesh_size(world_size, c.tp, c.pp, c.cp))
    mp = c.tp * c.pp * c.cp
    dp = c.dp if c.dp is not None else world_size // mp
    check(rules.mesh_size(world_size, c.tp, c.pp, c.cp, dp))
    prof = profile or get_profile(train.framework)
    heads, kv = graph.attention_heads, graph.kv_heads
    check(rules.tp_heads(c.tp, heads, kv, prof.kv_heads_below_tp))
    check(rules.ulysses_heads(c.tp, c.cp, heads, kv, c.cp_mode, prof.ulysses_kv_repeat))
    experts = getattr(graph, "num_experts", 0)
    if c.folded:
        check(rules.expert_folding(c.ep, c.etp, c.tp * c.cp * dp, experts))
        check(rules.folding_sp(c.etp, c.tp, c.sequence_parallel, prof))
    else:
        check(rules.ep_needs_moe(c.ep, experts) or rules.ep_split(c.ep, dp, experts))
    if c.dispatcher == "deepep" and c.ep > 1 and experts:   # as the cost model prices it
        check(rules.deepep_ranks(c.etp, c.ep, gpus_per_node, experts, world_size))
        check(rules.deepep_fabric(c.etp, c.ep, inter_kind, gpus_per_node))
    check(rules.cp_seq(c.cp, train.seq_len))
    # the target framework's split of each sequence over CP and SP ranks; an indivisible length
    # makes ranks' reduce-scatter/all-gather shapes differ (a gloo size mismatch at run time) or
    # trips the framework's own assertion
    check(rules.seq_split(prof, train.seq_len, c.tp, c.cp,
                          bool(c.sequence_parallel)))
    mbs = c.micro_batch_size or train.micro_batch_size or 1
    check(rules.batch_split(train.global_batch_size, dp, mbs))
    m = train.global_batch_size // (dp * mbs)
    v = c.virtual_stages or (2 if c.schedule in V_SCHEDULES else 1)
    schedule = c.schedule or ("interleaved-1f1b" if v > 1 else "1f1b")
    if schedule not in ("gpipe", "1f1b") and c.pp == 1:  # nothing to interleave or fill
        schedule, v = "1f1b", 1
    blocks = graph.num_blocks
    if c.stage_blocks is None:   # given cuts may leave a chunk without decoder blocks (the
        # embedding or the loss counted as a layer: Megatron-LM --account-for-*-in-pipeline-
        # split, autopar.frameworks.layersplit); stage_cuts checks them
        check(rules.pp_blocks(c.pp, v, blocks))
    if schedule == "interleaved-1f1b":
        check(rules.interleave_fill(c.pp, v, m, c.vp_group))
    if schedule == "interleaved-zero-bubble":
        check(rules.schedule_rounds(schedule, c.pp, m))
    if schedule in DUAL_PIPES:
        check(rules.pipeline_fill(schedule, c.pp * v, m))
    stage_blocks = c.stage_blocks or (balanced_stage_blocks(blocks, c.pp * v) if blocks else (0,))
    check(rules.stage_cuts(stage_blocks, c.pp, v))
    c.block_recompute(blocks)  # checks a per-block tuple's length
    c.block_reshard(blocks)
    return c.replace(dp=dp, micro_batch_size=mbs, virtual_stages=v, schedule=schedule,
                     stage_blocks=tuple(stage_blocks),
                     placement=c.placement or DEFAULT_PLACEMENT)
