"""The legality rules of a parallel layout, each written once: one function per rule that returns
a :class:`Violation` (the rule's name, the problem and the fix) or None.

Every check calls these: the cost model's ``resolve`` (:mod:`autopar.cost.resolve`), the search
space and its diagnosis (:mod:`autopar.search.space`, :mod:`autopar.search.diagnose`), the
plan-file check (:mod:`autopar.io.planfile`), the runtime's check (:mod:`autopar.runtime.validate`,
:func:`autopar.runtime.apply.check_moe`) and the framework profiles
(:meth:`autopar.frameworks.FrameworkProfile.seq_violation`, ``moe_sp_violation``). Each site
raises its own error type, formatted from the record (:func:`refuse` names the rule on the
error as ``rule``). The rules are pure functions of integers (and a framework profile where the
rule is the framework's), cheap enough for the search's inner loops.

Here, in :mod:`autopar.frameworks`, because that is the lowest package every stage may import
(it imports only :mod:`autopar.config` and :mod:`autopar.errors`), and because some rules are
the framework's own (sequence split, MoE layers under sequence parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Every rule's name, as :attr:`Violation.rule` carries it.
RULES = ("mesh_size", "tp_heads", "tp_node", "ulysses_heads", "ep_needs_moe", "ep_split",
         "expert_folding", "deepep_ranks", "folding_sp", "moe_sp", "cp_seq", "seq_split", "batch_split",
         "pp_blocks", "stage_cuts", "interleave_fill", "schedule_rounds", "pipeline_fill",
         "schedule_chunks")


@dataclass(frozen=True)
class Violation:
    """One broken rule.

    Attributes:
        rule: the rule's name, one of :data:`RULES`.
        problem: what is wrong, with the values (no full stop).
        fix: the change that repairs it (no "Fix:" and no full stop).
    """

    rule: str
    problem: str
    fix: str

    @property
    def text(self) -> str:
        """``"{problem}. Fix: {fix}."``: the message every site starts from."""
        return f"{self.problem}. Fix: {self.fix}."


def refuse(v: Violation, error: type, prefix: str = "") -> Exception:
    """``error(prefix + v.text)`` with the rule's name as its ``rule`` attribute."""
    exc = error(prefix + v.text)
    exc.rule = v.rule
    return exc


# -- the mesh ----------------------------------------------------------------------------------
def mesh_size(world: int, tp: int, pp: int, cp: int, dp: int | None = None) -> Violation | None:
    """tp * pp * cp divides the ``world`` GPUs and, with ``dp`` given, tp * pp * cp * dp equals
    it."""
    mp = tp * pp * cp
    if dp is None:
        if world % mp:
            return Violation("mesh_size", f"tp*pp*cp = {tp}*{pp}*{cp} = {mp} does not divide the "
                                          f"{world} GPUs",
                             f"choose degrees whose product divides {world}")
        return None
    if dp * mp != world:
        fix = (f"dp={world // mp} (GPUs / (tp*pp*cp))" if world % mp == 0 else
               f"degrees whose product is {world}")
        return Violation("mesh_size", f"tp*pp*cp*dp = {tp}*{pp}*{cp}*{dp} = {dp * mp} but the "
                                      f"cluster has {world} GPUs (the degrees must multiply to it)",
                         fix)
    return None


def tp_heads(tp: int, heads: int, kv: int, kv_below_tp: bool = False) -> Violation | None:
    """tp divides the attention heads and the KV heads (Megatron-LM's head split); with
    ``kv_below_tp`` (a framework that gathers each KV head to the ranks sharing it,
    :attr:`autopar.frameworks.FrameworkProfile.kv_heads_below_tp`) tp may instead be a
    multiple of the KV heads. No rule when the head count is unknown (0)."""
    def ok(t: int) -> bool:
        return heads % t == 0 and (kv % t == 0 or kv_below_tp and t % kv == 0)
    if heads and not ok(tp):
        legal = [t for t in range(1, heads + 1) if ok(t)] if kv_below_tp else [
            t for t in range(1, kv + 1) if ok(t)]
        need = (f"must divide the {heads} attention heads and divide or be a multiple of the "
                f"{kv} KV heads" if kv_below_tp else
                f"must divide the {heads} attention heads and {kv} KV heads")
        return Violation("tp_heads", f"tp={tp} {need}", f"use tp in {legal}")
    return None


def tp_node(tp: int, gpus_per_node: int) -> Violation | None:
    """A TP group stays inside a node (on its NVLink/PCIe domain): tp <= GPUs per node."""
    if tp > gpus_per_node:
        return Violation("tp_node", f"tp={tp} spans nodes of {gpus_per_node} GPUs (tensor "
                                    "parallelism is kept on a node's fast links)",
                         f"tp <= {gpus_per_node}, or allow TP across nodes")
    return None


def ulysses_heads(tp: int, cp: int, heads: int, kv: int, cp_mode: str = "ulysses",
                  kv_repeat: bool = False) -> Violation | None:
    """Ulysses context parallelism splits heads over tp * cp, which must divide the query heads
    and, unless the framework repeats the KV heads to the query heads before the all-to-all
    (``kv_repeat``: :attr:`autopar.frameworks.FrameworkProfile.ulysses_kv_repeat`, XTuner),
    the KV heads. No rule when the head count is unknown (0)."""
    n = tp * cp
    if not (cp > 1 and cp_mode == "ulysses" and heads):
        return None
    if heads % n:
        return Violation("ulysses_heads", f"Ulysses context parallelism splits heads over tp*cp = "
                                          f"{n}, which must divide the {heads} attention heads",
                         "use cp_mode='ring' or a tp*cp dividing the heads")
    if kv % n and not kv_repeat:
        return Violation("ulysses_heads", f"Ulysses context parallelism splits heads over tp*cp = "
                                          f"{n}, which must divide the {heads} heads and {kv} KV "
                                          "heads (this framework sends K and V at their own head "
                                          "count)",
                         "use cp_mode='ring' or a smaller cp, or a framework that repeats the KV "
                         "heads before the all-to-all (FrameworkProfile.ulysses_kv_repeat, "
                         "XTuner's sequence parallelism)")
    return None


# -- experts -----------------------------------------------------------------------------------
def ep_needs_moe(ep: int, experts: int) -> Violation | None:
    """Expert parallelism (ep > 1) needs a model with MoE layers."""
    if ep > 1 and not experts:
        return Violation("ep_needs_moe", f"ep={ep} needs a mixture-of-experts model; this model "
                                         "has no MoE layer",
                         "ep=1 (drop --ep / the ep pin)")
    return None


def ep_split(ep: int, dp: int, experts: int | None = None) -> Violation | None:
    """ep divides dp (experts are split over data-parallel ranks) and, when known, the expert
    count (Megatron-LM's expert parallelism)."""
    parts = []
    if experts and experts % ep:
        parts.append(f"the model's {experts} experts")
    if dp % ep:
        parts.append(f"dp={dp}")
    if not parts:
        return None
    fix = (f"use ep in {[e for e in range(1, dp + 1) if experts % e == 0 and dp % e == 0]}"
           if experts else "an ep dividing dp")
    return Violation("ep_split", f"ep={ep} does not divide {' and '.join(parts)} (experts are "
                                 "split over data-parallel ranks)", fix)


def expert_folding(ep: int, etp: int, span: int, experts: int) -> Violation | None:
    """MoE parallel folding (expert_tp beside tp): a MoE model whose experts ep divides, and
    ep * etp dividing ``span`` = tp * cp * dp (Megatron-Core parallel_state.py
    initialize_model_parallel: world_size % (etp * ep * pp) == 0)."""
    if not experts:   # a dense model: "whose 0 experts ep divides" said nothing useful
        return Violation("expert_folding", f"expert_tp={etp} needs a mixture-of-experts model; "
                                           "this model has no MoE layer",
                         "drop the expert_tp pin (--expert-tp)")
    if experts % ep or span % (ep * etp):
        return Violation("expert_folding",
                         f"expert_tp={etp} with ep={ep} (MoE parallel folding) needs a MoE model "
                         f"whose {experts} experts ep divides, and ep*etp = {ep * etp} dividing "
                         f"tp*cp*dp = {span}",
                         f"expert_tp=None (etp = tp), or ep and expert_tp with ep*expert_tp "
                         f"dividing {span}")
    return None


#: Group sizes DeepEP's normal (training) kernels run on inside one NVLink domain: the cases of
#: ``SWITCH_RANKS`` (deepseek-ai/DeepEP csrc/kernels/legacy/launch.cuh at dd758ca, 2026-07-14;
#: the same 2, 4, 8 since the first release ebfe47e), which every intranode kernel switches on
#: (csrc/kernels/legacy/intranode.cu); any other size fails ``"Unsupported ranks"``.
DEEPEP_NVL_RANKS = (2, 4, 8)
#: NVLink peers per RDMA rank of DeepEP's internode kernels: ``LEGACY_NUM_MAX_NVL_PEERS = 8``
#: (csrc/kernels/legacy/compiled.cuh), statically asserted in csrc/legacy/buffer.hpp; a rank r
#: of the group is NVLink rank r % 8 of RDMA rank r // 8.
DEEPEP_NVL_PEERS = 8
#: RDMA ranks (groups of 8 NVLink peers) DeepEP's internode kernels run on: the cases of
#: ``SWITCH_RDMA_RANKS`` (launch.cuh at dd758ca; 3 and 6 / 12 came with e02e4d2 "Support EP24"
#: and c939644 "Support EP48/96", 2025-09), the same keys as ``get_dispatch_config`` /
#: ``get_combine_config``'s maps (deep_ep/buffers/legacy.py: 16 ... 160 ranks) and within
#: ``LEGACY_NUM_MAX_RDMA_PEERS = 20`` (buffer.hpp asserts num_ranks <= 8 x 20 outside
#: low-latency mode).
DEEPEP_RDMA_RANKS = (2, 3, 4, 6, 8, 12, 16, 18, 20)
#: Every expert-TP x EP group size DeepEP's normal kernels run on.
DEEPEP_RANKS = DEEPEP_NVL_RANKS + tuple(DEEPEP_NVL_PEERS * r for r in DEEPEP_RDMA_RANKS)


def deepep_fabric(etp: int, ep: int, inter_kind: str | None,
                  gpus_per_node: int | None = None) -> Violation | None:
    """DeepEP's internode kernels (an expert-TP x EP group spanning nodes: beyond
    ``gpus_per_node``, or :data:`DEEPEP_NVL_PEERS` when not given) post RDMA from the GPU
    (NVSHMEM with InfiniBand GPUDirect Async): on an EFA network (``inter_kind`` "efa") stock
    DeepEP does not run. Ports that proxy the GPU's requests through the CPU exist (UCCL-EP;
    NVSHMEM over libfabric), but the only published microbenchmark of one (uccl-project/uccl
    ep/README.md at da914a2054c2, p5en: EP16 50 GB/s dispatch, 18 GB/s combine) would price
    it faster than NCCL's all-to-all, while training runs on p5 measured it 30-190% slower
    (awslabs/awsome-distributed-ai, Qwen3-30B-A3B on 64 H100): no price autopar has is one
    to plan with."""
    node = gpus_per_node or DEEPEP_NVL_PEERS
    if inter_kind == "efa" and etp * ep > node:
        return Violation(
            "deepep_fabric",
            f"dispatcher 'deepep' over EFA: DeepEP's internode kernels ({etp * ep} ranks, beyond "
            f"one node's {node}) need GPU-initiated RDMA (InfiniBand GPUDirect "
            "Async), which EFA does not offer; its CPU-proxied ports (UCCL-EP, NVSHMEM over "
            "libfabric) measured slower than NCCL's all-to-all on p5 and autopar has no price "
            "for them",
            "dispatcher='alltoall' (NCCL over EFA), or an expert-TP x EP group within a node")
    return None


def _deepep_runs(n: int, gpus_per_node: int | None) -> bool:
    return n in DEEPEP_RANKS and (gpus_per_node is None
                                  or gpus_per_node % min(n, DEEPEP_NVL_PEERS) == 0)


def deepep_ranks(etp: int, ep: int, gpus_per_node: int | None = None,
                 num_experts: int | None = None, world: int | None = None) -> Violation | None:
    """DeepEP's normal kernels run the expert-TP x EP group of ``etp * ep`` ranks (Megatron-Core
    token_dispatcher.py ``MoEFlexTokenDispatcher``: one DeepEP buffer over ``tp_ep_group``,
    "DeepEP dispatcher requires TPxEP > 1"; fused_a2a.py ``get_buffer`` sizes it by
    ``Buffer.get_dispatch_config(group.size())``, which asserts "Unsupported number of EP
    ranks" off its map).

    The group must be one of :data:`DEEPEP_RANKS`: 2, 4 or 8 ranks inside one node
    (:data:`DEEPEP_NVL_RANKS`; CUDA IPC over NVLink), or 8 x 2, 3, 4, 6, 8, 12, 16, 18 or 20 =
    16, 24, 32, 48, 64, 96, 128, 144 or 160 ranks in whole groups of 8 NVLink peers
    (:data:`DEEPEP_RDMA_RANKS`; DeepEP's buffer.hpp asserts ``num_ranks < 8 or num_ranks % 8
    == 0``). With ``gpus_per_node`` given, a node (autopar's NVLink domain) must hold whole
    groups: ``gpus_per_node`` a multiple of the group (up to 8 ranks) or of 8 (beyond). The
    rank order inside the node (autopar's placement) is not checked. DeepEP's low-latency
    kernels (other limits: hidden sizes of ``SWITCH_HIDDEN``) are not what the flex dispatcher
    runs in training, so they are not a way out here. ``num_experts``, ``world`` (GPUs): the
    fix then names only the ep values that also divide the experts and groups that divide the
    GPUs."""
    n = etp * ep
    if _deepep_runs(n, gpus_per_node):
        return None
    if n in DEEPEP_RANKS:
        block = min(n, DEEPEP_NVL_PEERS)
        problem = (f"dispatcher 'deepep' needs each node to hold whole groups of {block} of its "
                   f"{n} ranks (expert_tp*ep = {etp}*{ep}), but a node has {gpus_per_node} GPUs "
                   "(DeepEP joins up to 8 ranks of a node over NVLink, csrc/legacy/buffer.hpp)")
    else:
        problem = (f"dispatcher 'deepep' runs its expert-TP x EP group of expert_tp*ep = "
                   f"{etp}*{ep} = {n} ranks only at {list(DEEPEP_RANKS)} ranks (DeepEP's "
                   "kernels are compiled for those: SWITCH_RANKS / SWITCH_RDMA_RANKS in "
                   "csrc/kernels/legacy/launch.cuh)")
    fits = [d // etp for d in DEEPEP_RANKS
            if d % etp == 0 and d // etp > 1 and _deepep_runs(d, gpus_per_node)
            and (not num_experts or num_experts % (d // etp) == 0)
            and (not world or world % d == 0)]
    fix = (f"ep in {fits} at expert_tp={etp}, or " if fits else "") + "dispatcher='alltoall'"
    return Violation("deepep_ranks", problem, fix)


def folding_sp(etp: int, tp: int, sequence_parallel: bool, profile=None) -> Violation | None:
    """Folded MoE layers under tp > 1 take sequence-parallel inputs: each TP rank sends its own
    share of the tokens over the expert-TP x EP group (without SP every TP rank holds the same
    tokens). The message cites ``profile``'s own source where its MoE layers take only
    sequence-parallel inputs (:attr:`~autopar.frameworks.FrameworkProfile.moe_sequence_parallel`
    ``(True,)``: Megatron-Core's moe_layer.py, torchtitan's apply_moe_ep_tp); for any other
    framework (or None) it states the rule without one, as autopar prices folding."""
    if tp == 1 or sequence_parallel:
        return None
    if profile is not None and tuple(profile.moe_sequence_parallel) == (True,):
        why = (f"{profile.name}'s MoE layers take sequence-parallel inputs when tp > 1 "
               f"({profile.sources['moe_sequence_parallel']})")
    else:
        why = ("folded MoE layers take sequence-parallel inputs when tp > 1 (each TP rank "
               "sends its own share of the tokens to the experts; without sequence "
               "parallelism every TP rank holds the same tokens)")
    return Violation("folding_sp", f"expert_tp={etp} beside tp={tp}: {why}",
                     "sequence_parallel=True, or expert_tp=None")


def moe_sp(profile, tp: int, sequence_parallel: bool) -> Violation | None:
    """The framework ``profile`` runs its MoE layers under tp with ``sequence_parallel``
    (:attr:`~autopar.frameworks.FrameworkProfile.moe_sequence_parallel`)."""
    if tp == 1 or bool(sequence_parallel) in profile.moe_sequence_parallel:
        return None
    want = profile.moe_sequence_parallel[0]
    return Violation("moe_sp", f"{profile.name} runs MoE layers under tensor parallelism only with "
                               f"sequence_parallel={want} "
                               f"({profile.sources['moe_sequence_parallel']})",
                     f"sequence_parallel={want} ({'--sp' if want else '--no-sp'}), or tp=1")


# -- the sequence ------------------------------------------------------------------------------
def cp_seq(cp: int, seq_len: int) -> Violation | None:
    """cp divides the sequence length (tokens)."""
    if seq_len % cp:
        return Violation("cp_seq", f"cp={cp} does not divide the sequence length {seq_len}",
                         "a cp that divides it")
    return None


def seq_rule_split(rule, framework: str, seq_len: int, tp: int, cp: int,
                   sequence_parallel: bool, sp_optional: bool = True) -> Violation | None:
    """``framework`` with the :class:`~autopar.frameworks.seqrule.SeqLenRule` ``rule`` cuts
    sequences of ``seq_len`` tokens over tp x cp (with ``sequence_parallel``); ``sp_optional``:
    it runs TP without SP (then turning SP off is offered)."""
    d = rule.divisor(tp, cp, sequence_parallel)
    if seq_len % d == 0:
        return None
    parts = []
    if rule.always:
        parts.append(f"tp * {rule.cp_chunks} * cp = {tp} * {rule.cp_chunks} * {cp}")
    else:
        if cp > 1 and rule.cp_chunks > 1:
            parts.append(f"{rule.cp_chunks} * cp = {rule.cp_chunks * cp} (load-balanced "
                         f"context parallelism cuts the sequence into {rule.cp_chunks * cp} "
                         "chunks)")
        elif cp > 1:
            parts.append(f"cp = {cp}")
        if sequence_parallel and tp > 1:
            parts.append(f"cp * tp = {cp * tp} (sequence parallelism shards each CP rank's "
                         f"tokens, {seq_len} / cp={cp}, over tp: they must be divisible by "
                         f"tp={tp})")
    down, up = seq_len // d * d, (seq_len // d + 1) * d
    fixes = [f"a sequence length that is a multiple of {d} (e.g. {up}"
             + (f" or {down})" if down else ")")]
    if sequence_parallel and tp > 1 and sp_optional and not rule.always \
            and seq_len % rule.divisor(tp, cp, False) == 0:
        fixes.append("sequence_parallel=False")
    if seq_len % rule.divisor(1, 1, False) == 0:
        fixes.append("a smaller tp or cp")
    return Violation("seq_split",
                     f"{framework} needs the sequence length to be a multiple of {d} with tp={tp}, "
                     f"cp={cp}, sequence_parallel={sequence_parallel}: a multiple of "
                     f"{' and of '.join(parts) or d}; {seq_len} is not ({rule.source})",
                     ", or ".join(fixes))


def seq_split(profile, seq_len: int, tp: int, cp: int, sequence_parallel: bool
              ) -> Violation | None:
    """The framework ``profile``'s split of each sequence over CP and SP ranks holds
    (:attr:`~autopar.frameworks.FrameworkProfile.seq_rule`: load-balanced CP needs seq % 2 cp,
    SP needs seq / cp % tp; torchtitan seq % (2 tp cp) always)."""
    return seq_rule_split(profile.seq_rule, profile.name, seq_len, tp, cp, sequence_parallel,
                          sp_optional=False in profile.sequence_parallel)


# -- the batch ---------------------------------------------------------------------------------
def batch_split(global_batch: int, dp: int, micro_batch: int | None = None) -> Violation | None:
    """The global batch (sequences) is a multiple of dp (x the micro-batch, when given): every
    data-parallel rank runs whole micro-batches, global = micro x dp x micro-batches per step."""
    n = dp * (micro_batch or 1)
    if global_batch % n == 0:
        return None
    if micro_batch is None:
        return Violation("batch_split", f"global batch {global_batch} is not a multiple of "
                                        f"dp={dp}",
                         f"make the global batch a multiple of {dp}, or change dp")
    return Violation("batch_split", f"global batch {global_batch} is not a multiple of "
                                    f"dp*micro_batch = {dp}*{micro_batch} = {n}",
                     f"make the global batch a multiple of {n}, or change dp or the micro-batch "
                     "size")


# -- the pipeline ------------------------------------------------------------------------------
def pp_blocks(pp: int, v: int, blocks: int) -> Violation | None:
    """pp * virtual_stages chunks of at least one decoder block each: pp * v <= blocks."""
    if pp * v > max(blocks, 1):
        return Violation("pp_blocks", f"pp*virtual_stages = {pp}*{v} = {pp * v} exceeds the "
                                      f"model's {blocks} blocks (too few layers for a deeper "
                                      "pipeline)",
                         f"use pp*virtual_stages <= {blocks}")
    return None


def stage_cuts(stage_blocks, pp: int, v: int, blocks: int | None = None) -> Violation | None:
    """The stage cuts give one block count per pipeline chunk (pp * v) and, when the model's
    ``blocks`` is given, cover every block exactly once."""
    if len(stage_blocks) != pp * v:
        return Violation("stage_cuts", f"stage_blocks has {len(stage_blocks)} entries; "
                                       f"pp*virtual_stages = {pp * v} chunks need one block count "
                                       "each",
                         "give one block count per pipeline chunk")
    if blocks is not None and sum(stage_blocks) != blocks:
        return Violation("stage_cuts", f"stage_blocks {list(stage_blocks)} cover "
                                       f"{sum(stage_blocks)} blocks but the model has {blocks} "
                                       "(stage cuts must cover every block exactly once)",
                         f"block counts summing to {blocks}")
    return None


def interleave_fill(pp: int, v: int, m: int, group: int | None = None) -> Violation | None:
    """Interleaved 1F1B (v > 1) runs the ``m`` micro-batches in groups of ``group`` per model
    chunk (:attr:`autopar.config.ParallelConfig.vp_group`; None = pp): Megatron-LM needs pp <=
    group <= m and the last group's remainder ``m % group`` to be 0 or at least pp
    (megatron/core/pipeline_parallel/schedules.py ``forward_backward_pipelining_with_
    interleaving``: "should range in [PP, M]", "should be 0, or larger than or equal to the
    pipeline-parallel size"). With the default group pp: m a multiple of pp."""
    if v <= 1:
        return None
    if group is None:
        if m % pp:
            return Violation("interleave_fill", f"interleaved 1F1B needs the micro-batch count "
                                                f"({m}) to be a multiple of pp={pp}",
                             "change the global batch, dp or micro-batch so that it is, use v=1, "
                             "or (Megatron-LM) set vp_group to a group size that divides the "
                             "micro-batches or leaves at least pp over")
        return None
    if not pp <= group <= m:
        return Violation("interleave_fill", f"vp_group={group} must lie in [pp={pp}, micro-batch "
                                            f"count={m}]",
                         f"a vp_group from {pp} to {m}, or vp_group=None")
    rest = m % group
    if 0 < rest < pp:
        return Violation("interleave_fill", f"vp_group={group} leaves a last group of {rest} "
                                            f"micro-batches of {m}, fewer than pp={pp}",
                         f"a vp_group that divides {m} or leaves at least {pp} over")
    return None


def schedule_rounds(schedule: str, pp: int, m: int) -> Violation | None:
    """torch's looped schedules (``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``,
    torch 2.13 schedules.py) need ``m`` micro-batches to be a multiple of their rounds
    ``max(1, m // pp)``."""
    rounds = max(1, m // pp)
    if m % rounds:
        return Violation("schedule_rounds", f"torch's {schedule} schedule needs the micro-batch "
                                            f"count ({m}) to be a multiple of its rounds "
                                            f"max(1, m // pp) = {rounds}",
                         f"a global batch, dp or micro-batch giving a multiple of pp={pp} "
                         "micro-batches")
    return None


#: What each schedule that needs a micro-batch per stage is called in messages, and the
#: schedule offered instead.
_FILLED = {"1f1b": ("torch's 1F1B schedule", "'gpipe'"),
           "dualpipev": ("DualPipeV", "'zbv-zero-bubble'"),
           "dualpipe": ("DualPipe", "'zbv-zero-bubble'")}


def pipeline_fill(schedule: str, stages: int, m: int) -> Violation | None:
    """``Schedule1F1B`` and ``ScheduleDualPipeV`` (torch 2.13) need at least one micro-batch per
    pipeline stage (``stages`` = pp x virtual_stages): m >= stages."""
    if schedule in _FILLED and m < stages:
        name, other = _FILLED[schedule]
        return Violation("pipeline_fill", f"{m} micro-batch{'' if m == 1 else 'es'} per step "
                                          f"for {stages} pipeline stages: {name} needs at least "
                                          f"{stages} micro-batches per step (one per stage)",
                         "a smaller micro-batch or dp, a larger global batch, or schedule "
                         + other)
    return None


#: Schedules with one chunk per pipeline rank, and those holding exactly two (a V).
SINGLE_CHUNK = ("gpipe", "1f1b")
V_CHUNKS = {"zbv-zero-bubble": 2, "dualpipev": 2, "dualpipe": 2}


def schedule_chunks(schedule: str, v: int) -> Violation | None:
    """Chunks per pipeline rank the schedule holds: one for GPipe and 1F1B, exactly two (a V)
    for ZBV and DualPipeV, any for the interleaved ones."""
    if schedule in SINGLE_CHUNK and v != 1:
        return Violation("schedule_chunks", f"schedule {schedule!r} runs one chunk per pipeline "
                                            f"rank; virtual_stages={v}",
                         "schedule 'interleaved-1f1b' or virtual_stages=1")
    need = V_CHUNKS.get(schedule)
    if need is not None and v != need:
        return Violation("schedule_chunks", f"schedule {schedule!r} places exactly {need} chunks "
                                            f"on each pipeline rank (a V); virtual_stages={v}",
                         f"virtual_stages={need}")
    return None


#: What each degree must satisfy, for a search that found no legal layout (format with heads,
#: kv, gpn, blocks, seq, gbs); the rules behind each: tp: mesh_size, tp_heads, tp_node; pp:
#: mesh_size, pp_blocks; cp: mesh_size, cp_seq; dp: batch_split.
DEGREE_RULES = {
    "tp": "tp must divide the GPUs and the {heads} heads and {kv} KV heads (the search keeps "
          "it inside a node of {gpn} GPUs; a pinned tp may span nodes)",
    "pp": "pp must divide the GPUs and be at most the model's {blocks} blocks (too few layers "
          "for a deeper pipeline)",
    "cp": "cp must divide the GPUs and the sequence length {seq}",
    "dp": "dp = GPUs / (tp*cp*pp) must divide the global batch {gbs}",
}


def first_n_modes(chunks: tuple[int, ...], n: int) -> tuple[str, ...]:
    """Per-block recompute of Megatron-LM's ``--recompute-method block --recompute-num-layers
    n``: "full" on the first ``n`` blocks of every chunk (``chunks``: blocks per pipeline chunk,
    in model order), "none" on the others (:func:`first_n_full` reads it back)."""
    return tuple("full" if i < n else "none" for size in chunks for i in range(size))


def first_n_full(modes: tuple[str, ...], chunks: tuple[int, ...] | None) -> int | None:
    """N when the per-block recompute ``modes`` are "full" for the first N blocks of every
    pipeline chunk (``chunks``: blocks per chunk, in order; all of a chunk when it has fewer)
    and "none" for the rest, as Megatron-LM's ``--recompute-method block
    --recompute-num-layers N`` recomputes (megatron/core/transformer/transformer_block.py
    ``_checkpointed_forward``: per chunk, layers ``0 <= l < recompute_num_layers``); else None
    (also for unknown chunks)."""
    if not chunks or sum(chunks) != len(modes):
        return None
    first, n, whole = 0, None, 0
    for size in chunks:
        part = tuple(modes[first:first + size])
        k = sum(1 for m in part if m == "full")
        if part != ("full",) * k + ("none",) * (size - k):
            return None
        if k < size:   # a chunk with "none" blocks fixes N
            if n is not None and n != k:
                return None
            n = k
        else:          # a chunk recomputed whole needs N >= its size
            whole = max(whole, size)
        first += size
    if n is None:
        return whole
    return n if n >= whole else None
