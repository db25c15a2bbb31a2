"""Fill a ParallelConfig's open fields with defaults and check it against model and cluster.

The rules (each error names the rule and a fix):
  tp * pp * cp * dp = GPUs; tp divides attention heads and KV heads (Megatron-LM's head split);
  cp divides the sequence, and the target framework's sequence split holds
  (:meth:`autopar.frameworks.FrameworkProfile.seq_violation`: load-balanced CP needs
  seq % (2 cp), SP needs seq / cp % tp; torchtitan seq % (2 tp cp) always); the global batch
  is a multiple of dp * micro-batch; pp * v <= blocks;
  interleaved 1F1B needs the micro-batch count to be a multiple of pp (Megatron-LM);
  interleaved zero bubble a multiple of its rounds ``max(1, m // pp)`` and DualPipeV at least
  ``2 pp`` micro-batches (torch 2.13 ``ScheduleInterleavedZeroBubble`` / ``ScheduleDualPipeV``
  constructors); ZBV and DualPipeV hold 2 chunks per rank.
"""

from __future__ import annotations

from ..config import DEFAULT_PLACEMENT, V_SCHEDULES, ParallelConfig, TrainingConfig
from ..errors import InvalidParallelConfig
from ..frameworks import get_profile
from ..graph.types import ModelGraph
from .stages import balanced_stage_blocks


def resolve(config: ParallelConfig, graph: ModelGraph, world_size: int,
            train: TrainingConfig) -> ParallelConfig:
    """A copy of ``config`` with every ``None`` filled and every rule checked.

    Defaults: dp from the world size; micro-batch from ``train`` or 1; one virtual stage;
    schedule 1F1B (interleaved when virtual_stages > 1); balanced stage cuts.

    Raises:
        InvalidParallelConfig: the configuration breaks a rule (message names it and a fix).
    """
    c = config
    mp = c.tp * c.pp * c.cp
    if world_size % mp:
        raise InvalidParallelConfig(
            f"tp*pp*cp = {c.tp}*{c.pp}*{c.cp} = {mp} does not divide the {world_size} GPUs. "
            f"Fix: choose degrees whose product divides {world_size}.")
    dp = c.dp if c.dp is not None else world_size // mp
    if dp * mp != world_size:
        raise InvalidParallelConfig(
            f"tp*pp*cp*dp = {c.tp}*{c.pp}*{c.cp}*{dp} = {dp * mp} but the cluster has "
            f"{world_size} GPUs. Fix: set dp={world_size // mp} or leave dp unset.")
    heads, kv = graph.attention_heads, graph.kv_heads
    if heads and (heads % c.tp or kv % c.tp):
        raise InvalidParallelConfig(
            f"tp={c.tp} must divide the {heads} attention heads and {kv} KV heads. Fix: use tp in "
            f"{[t for t in range(1, kv + 1) if heads % t == 0 and kv % t == 0]}.")
    if c.cp > 1 and c.cp_mode == "ulysses" and heads and (heads % (c.tp * c.cp)
                                                          or kv % (c.tp * c.cp)):
        raise InvalidParallelConfig(
            f"Ulysses context parallelism splits heads over tp*cp = {c.tp * c.cp}, which must "
            f"divide the {heads} heads and {kv} KV heads. Fix: use cp_mode='ring' or a smaller cp.")
    experts = getattr(graph, "num_experts", 0)
    if c.folded:
        # MoE parallel folding: Megatron-Core parallel_state.py initialize_model_parallel builds
        # the expert grid etp x ep x expert-dp x pp and raises unless world_size % (etp * ep *
        # pp) == 0, i.e. ep * etp divides tp * cp * dp
        span = c.tp * c.cp * dp
        if not experts or experts % c.ep or span % (c.ep * c.etp):
            raise InvalidParallelConfig(
                f"expert_tp={c.etp} with ep={c.ep} (MoE parallel folding) needs a MoE model "
                f"whose {experts} experts ep divides, and ep*etp = {c.ep * c.etp} dividing "
                f"tp*cp*dp = {span}. Fix: expert_tp=None (etp = tp), or ep and expert_tp with "
                f"ep*expert_tp dividing {span}.")
        if c.tp > 1 and not c.sequence_parallel:
            raise InvalidParallelConfig(
                f"expert_tp={c.etp} beside tp={c.tp}: the MoE layers of Megatron-Core take "
                "sequence-parallel inputs when tp > 1 (transformer/moe/moe_layer.py raises "
                "without sequence_parallel in training). Fix: sequence_parallel=True, or "
                "expert_tp=None.")
    elif c.ep > 1 and not experts:
        raise InvalidParallelConfig(
            f"ep={c.ep} needs a mixture-of-experts model; this model is dense (no experts). "
            "Fix: ep=1 (drop --ep).")
    elif c.ep > 1 and (experts % c.ep or dp % c.ep):
        raise InvalidParallelConfig(
            f"ep={c.ep} must divide the model's {experts} experts and dp={dp} (experts are "
            f"split over data-parallel ranks). Fix: use ep in "
            f"{[e for e in range(1, dp + 1) if experts and experts % e == 0 and dp % e == 0]}.")
    if train.seq_len % c.cp:
        raise InvalidParallelConfig(
            f"cp={c.cp} must divide the sequence length {train.seq_len}. Fix: choose cp that "
            "divides it.")
    # the target framework's split of each sequence over CP and SP ranks (load-balanced CP in
    # 2 cp chunks, SP shards of each CP rank's tokens: autopar.frameworks.seqrule); an
    # indivisible length makes ranks' reduce-scatter/all-gather shapes differ (a gloo size
    # mismatch at run time) or trips the framework's own assertion
    why = get_profile(train.framework).seq_violation(train.seq_len, c.tp, c.cp,
                                                     bool(c.sequence_parallel))
    if why:
        raise InvalidParallelConfig(why)
    mbs = c.micro_batch_size or train.micro_batch_size or 1
    if train.global_batch_size % (dp * mbs):
        raise InvalidParallelConfig(
            f"global batch {train.global_batch_size} is not a multiple of dp*micro_batch = "
            f"{dp}*{mbs} = {dp * mbs}. Fix: make the global batch a multiple of {dp * mbs}, or "
            "change dp or the micro-batch size.")
    m = train.global_batch_size // (dp * mbs)
    v = c.virtual_stages or (2 if c.schedule in V_SCHEDULES else 1)
    schedule = c.schedule or ("interleaved-1f1b" if v > 1 else "1f1b")
    if schedule not in ("gpipe", "1f1b") and c.pp == 1:  # nothing to interleave or fill
        schedule, v = "1f1b", 1
    blocks = graph.num_blocks
    if c.pp * v > max(blocks, 1):
        raise InvalidParallelConfig(
            f"pp*virtual_stages = {c.pp}*{v} = {c.pp * v} exceeds the model's {blocks} blocks. "
            f"Fix: use pp*virtual_stages <= {blocks}.")
    if schedule == "interleaved-1f1b" and v > 1 and m % c.pp:
        raise InvalidParallelConfig(
            f"interleaved 1F1B needs the micro-batch count ({m}) to be a multiple of pp={c.pp}. "
            f"Fix: change the global batch, dp or micro-batch so that it is, or use v=1.")
    if schedule == "interleaved-zero-bubble" and m % max(1, m // c.pp):
        raise InvalidParallelConfig(
            f"torch's interleaved zero-bubble schedule needs the micro-batch count ({m}) to be a "
            f"multiple of its rounds max(1, m // pp) = {max(1, m // c.pp)}. Fix: a global batch, "
            f"dp or micro-batch giving a multiple of pp={c.pp} micro-batches.")
    if schedule == "dualpipev" and m < 2 * c.pp:
        raise InvalidParallelConfig(
            f"DualPipeV needs at least one micro-batch per chunk, 2 x pp = {2 * c.pp}; the "
            f"step has {m}. Fix: a smaller micro-batch or dp, a larger global batch, or "
            "schedule 'zbv-zero-bubble'.")
    stage_blocks = c.stage_blocks or (balanced_stage_blocks(blocks, c.pp * v) if blocks else (0,))
    if len(stage_blocks) != c.pp * v:
        raise InvalidParallelConfig(
            f"stage_blocks has {len(stage_blocks)} entries; pp*virtual_stages = {c.pp * v}. "
            "Fix: give one block count per pipeline chunk.")
    c.block_recompute(blocks)  # checks a per-block tuple's length
    c.block_reshard(blocks)
    return c.replace(dp=dp, micro_batch_size=mbs, virtual_stages=v, schedule=schedule,
                     stage_blocks=tuple(stage_blocks),
                     placement=c.placement or DEFAULT_PLACEMENT)
