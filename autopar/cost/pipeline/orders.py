"""The order in which each pipeline rank runs its compute actions, per schedule, as
``torch.distributed.pipelining`` (torch 2.13, ``schedules.py``) builds it, and the most
micro-batches each rank holds along it (timed by :mod:`.replay`; per chunk at the peak:
:mod:`.held`).

An action is ``(kind, stage, micro-batch)`` with ``stage`` the global chunk index (0 .. S-1,
``S = pp * v``) and ``kind`` one of:

- ``F``: forward of one micro-batch through one chunk;
- ``B``: full backward (input and weight gradients together);
- ``I``: backward for the input gradient only (zero-bubble split; torch ``BACKWARD_INPUT``);
- ``W``: backward for the weight gradient only (torch ``BACKWARD_WEIGHT``);
- ``O``: an ``F`` and a ``B`` of two different micro-batches issued together (DualPipeV's
  ``OVERLAP_F_B``); ``stage``/``mb`` hold the pair ``((f_stage, f_mb), (b_stage, b_mb))``.

Chunk placement: looped schedules put chunk ``c`` on rank ``c % pp``; V-shaped ones (ZBV,
DualPipeV, exactly two chunks per rank) put chunk ``c < pp`` on rank ``c`` and chunk
``c >= pp`` on rank ``2 pp - 1 - c`` (torch ``generate_stage_to_rank_mapping(style="v")``), so
the last chunk sits on rank 0 beside the first.

What each order is (sources: the torch 2.13 classes named; Qi et al. 2023, "Zero Bubble
Pipeline Parallelism", arXiv 2401.10241; DeepSeek-AI 2024, DeepSeek-V3 technical report, arXiv
2412.19437, section 3.2.1):

- ``gpipe`` (``ScheduleGPipe``): every forward, then every backward.
- ``1f1b`` (``Schedule1F1B``; Narayanan et al. 2021 figure 4): ``pp - r - 1`` warm-up forwards,
  then one forward / one backward, then the remaining backwards.
- ``interleaved-1f1b`` (``ScheduleInterleaved1F1B``) and ``interleaved-zero-bubble``
  (``ScheduleInterleavedZeroBubble``, the paper's ZB-H1 generalised to v chunks): rounds of
  ``mpr = m / max(1, m // pp)`` micro-batches walk the rank's chunks; warm-up
  ``(v - 1) mpr + k (pp - 1 - r)`` forwards (k = 2 for 1F1B, 1 for zero bubble). Megatron-LM's
  interleaved 1F1B is the same walk with groups of N micro-batches
  (``--microbatch-group-size-per-virtual-pipeline-stage``, default pp) in place of the rounds, a
  last group holding the remainder (:func:`step_chunks`; ``group`` below); the zero-bubble
  variant splits each backward into I and W and, from rank r's ``r``-th steady step on, follows
  each I with the oldest pending W (weight gradients fill what would be bubbles).
- ``zbv-zero-bubble`` (``ScheduleZBVZeroBubble``, the paper's ZB-V, section 6).
- ``dualpipev`` (``ScheduleDualPipeV``, DeepSeek's DualPipe folded onto ``pp`` ranks): eight
  phases; its steady state pairs the forward of one chunk with the full backward of the other
  (``O`` actions), and the last ``pp`` backwards split into I and W.
- ``dualpipe`` (DeepSeek's bidirectional DualPipe, arXiv 2412.19437 section 3.2.1; no torch
  class): ordered as ``dualpipev`` on the same ranks. Both overlap a forward chunk with a
  backward chunk in the steady state and have the bubble (pp/2 - 1)(F&B + B - 3W) in units of
  their own stage (deepseek-ai/DualPipe README): a DualPipe stage is a DualPipeV chunk's
  double, so its bubble is (pp/2 - 1)/pp of a micro-batch's work against DualPipeV's
  (pp - 1)/(2 pp); the two copies of the parameters are in the memory model, and its
  activations follow its own step (:func:`dualpipe_stage_peak`: pp + 1 stages, where
  DualPipeV's order on the same ranks holds pp + 1/2).

Memory: torch's input-gradient pass keeps the autograd graph for the weight pass
(``torch/distributed/pipelining/_backward.py``, ``stage_backward_input`` calls
``autograd.grad(..., retain_graph=True)``), so a micro-batch's activations in a chunk are held
from its ``F`` until its ``W`` (or ``B``). The count a rank holds therefore follows from its
own order alone (:func:`peak_in_flight`), independent of timing.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

# SPLIT_BACKWARD: defined in autopar.config (frameworks read it too), re-exported for the
# pipeline modules that import it from here
from ...config import DUAL_PIPES, SCHEDULES, SPLIT_BACKWARD, V_SCHEDULES  # noqa: F401
from ...frameworks.rules import interleave_fill

#: Schedules whose ranks each hold exactly two chunks in a V.
V_SHAPED = V_SCHEDULES

#: Every schedule this module orders.
ORDERED = SCHEDULES

Action = tuple  # (kind, stage, mb) or ("O", (f_stage, f_mb), (b_stage, b_mb))


def stage_rank(stage: int, pp: int, schedule: str) -> int:
    """The pipeline rank that runs global chunk ``stage`` under ``schedule`` (see module doc)."""
    if schedule in V_SHAPED:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def check_order_args(schedule: str, pp: int, m: int, v: int, group: int | None = None) -> None:
    """Raise ValueError unless ``schedule`` can be ordered for pp ranks, m micro-batches and v
    chunks per rank (torch's constructor rules: ZBV and DualPipeV need v = 2, DualPipeV
    m >= 2 pp, the looped schedules m a multiple of their rounds, GPipe and 1F1B v = 1).
    ``group``: Megatron-LM's micro-batch group of interleaved 1F1B (module docstring), in
    [pp, m] with a last group of 0 or at least pp micro-batches over; None: torch's rounds."""
    if schedule not in ORDERED:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; known: {ORDERED}")
    if pp < 1 or m < 1 or v < 1:
        raise ValueError("pipeline orders need pp >= 1, m >= 1 and v >= 1")
    if schedule in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"{schedule} runs one chunk per rank, not {v}")
    if schedule in V_SHAPED and v != 2:
        raise ValueError(f"{schedule} runs exactly two chunks per rank, not {v}")
    if schedule in DUAL_PIPES and m < 2 * pp:
        raise ValueError(f"{schedule} needs at least 2 pp = {2 * pp} micro-batches, not {m}")
    if group is not None:
        if schedule != "interleaved-1f1b":
            raise ValueError(f"a micro-batch group is Megatron-LM's interleaved 1F1B, not {schedule}")
        broken = interleave_fill(pp, v, m, group)
        if broken is not None:
            raise ValueError(broken.problem)
    elif schedule in ("interleaved-1f1b", "interleaved-zero-bubble") and m % max(1, m // pp):
        raise ValueError(f"{schedule} needs m a multiple of its rounds max(1, m // pp)")


def rank_orders(schedule: str, pp: int, m: int, v: int = 1, group: int | None = None
                ) -> tuple[tuple[Action, ...], ...]:
    """Per pipeline rank, its compute actions in the order torch 2.13 issues them (cached).

    Args:
        schedule: a name of :data:`ORDERED`.
        pp: pipeline ranks; m: micro-batches per step; v: chunks per rank.
        group: interleaved 1F1B's micro-batch group in Megatron-LM's order (module
            docstring); None = torch's rounds.

    Returns:
        ``pp`` tuples of actions (module docstring); idle slots are not actions.

    Raises:
        ValueError: the combination breaks a rule of :func:`check_order_args`.
    """
    check_order_args(schedule, pp, m, v, group)
    return _rank_orders(schedule, pp, m, v, group)


@lru_cache(maxsize=1024)
def _rank_orders(schedule: str, pp: int, m: int, v: int, group: int | None = None
                 ) -> tuple[tuple[Action, ...], ...]:
    return tuple(rank_order(schedule, pp, m, v, r, group) for r in range(pp))


def _gpipe(_s: str, _pp: int, m: int, _v: int, r: int) -> list:
    return [("F", r, j) for j in range(m)] + [("B", r, j) for j in range(m)]


def _one_f_one_b(_s: str, pp: int, m: int, _v: int, r: int) -> list:
    warm = min(m, pp - r - 1)
    out = [("F", r, j) for j in range(warm)]
    f = warm
    for b in range(m):
        if f < m:
            out.append(("F", r, f))
            f += 1
        out.append(("B", r, b))
    return out


@lru_cache(maxsize=256)
def schedule_table(m: int, v: int, group: int) -> tuple[tuple[int, int], ...]:
    """(model chunk 0 .. v-1, micro-batch) of each of a looped order's ``m v`` forward steps:
    groups of ``group`` micro-batches walk the chunks in turn, the last group holding the
    micro-batches left (Megatron-LM's ``get_schedule_table``, megatron/core/pipeline_parallel/
    schedules.py; torch's rounds are the case ``group`` divides m). Backward step s runs the
    same micro-batch through chunk ``v - 1 - chunk`` (Megatron's ``get_model_chunk_id(...,
    forward=False)``)."""
    out: list[tuple[int, int]] = []
    for start in range(0, m, group):
        stop = m if start + group >= m else start + group
        out += [(chunk, j) for chunk in range(v) for j in range(start, stop)]
    return tuple(out)


@lru_cache(maxsize=256)
def step_chunks(m: int, v: int, group: int) -> tuple[int, ...]:
    """The chunk of each forward step of :func:`schedule_table`."""
    return tuple(chunk for chunk, _ in schedule_table(m, v, group))


def _looped(schedule: str, pp: int, m: int, v: int, r: int, steps: int | None = None,
            group: int | None = None) -> list:
    # steps: only the actions of the first ``steps`` steps (interleaved 1F1B; see
    # looped_peak_order), None for all; group: Megatron's micro-batch group (None: torch's
    # rounds, m / max(1, m // pp) micro-batches each)
    zb = schedule == "interleaved-zero-bubble"
    per_round = group or m // max(1, m // pp)
    warm = min((v - 1) * per_round + (1 if zb else 2) * (pp - 1 - r), m * v)
    total = m * v
    # step -> chunk: forward step s runs chunk chunk_of[s], backward step s (from warm on)
    # chunk v - 1 - chunk_of[s - warm], each on this rank (global index chunk * pp + r); read
    # from a table, as the walk over m * v steps is a search's hot loop
    chunk_of = step_chunks(m, v, per_round)
    # next micro-batch per global chunk, for forwards, backwards and weight passes
    nf, nb, nw = [0] * (pp * v), [0] * (pp * v), [0] * (pp * v)
    out: list = []
    put = out.append
    b_stages, w_done = [], 0   # the chunk of each backward run, for the weight passes
    back = "I" if zb else "B"
    top = (v - 1) * pp + r
    for step in range(total + warm if steps is None else min(steps, total + warm)):
        if step < total:
            stage = chunk_of[step] * pp + r
            put(("F", stage, nf[stage]))
            nf[stage] += 1
        if step >= warm:
            stage = top - chunk_of[step - warm] * pp
            put((back, stage, nb[stage]))
            nb[stage] += 1
            if zb:
                b_stages.append(stage)
                if step - warm >= r:  # rank r delays its weight passes by r steps
                    stage = b_stages[w_done]
                    put(("W", stage, nw[stage]))
                    nw[stage] += 1
                    w_done += 1
    while zb and w_done < len(b_stages):
        stage = b_stages[w_done]
        put(("W", stage, nw[stage]))
        nw[stage] += 1
        w_done += 1
    return out


def looped_peak_order(pp: int, m: int, v: int, r: int, group: int | None = None
                      ) -> tuple[Action, ...]:
    """The first actions of interleaved 1F1B's order on rank ``r`` (:func:`_looped`) that hold
    every distinct state of its activation peak (all of them for a short step; the arguments
    checked by the caller): what :mod:`autopar.cost.pipeline.held` walks.

    Step ``s`` runs forward ``s`` (while ``s < m v``), then from ``s = warm`` on backward
    ``s - warm``. The rank holds ``s + 1`` chunk-micro-batches after forward ``s`` up to
    ``warm``, then ``warm + 1`` after every forward: its peak, reached only at the forwards and
    backward starts of the steady steps ``warm <= s < m v``. In those steps every chunk has run
    its first forward (chunk ``c`` at step ``c per_round``, ``warm >= (v - 1) per_round``) and
    none its last backward (the first to finish, chunk ``v - 1``, ends at step ``m v + warm -
    (v - 1) per_round - 1 >= m v - 1``); the chunks whose backward has begun are all of them
    from ``warm + (v - 1) per_round`` on; and each window of ``v per_round`` steady steps runs
    ``per_round`` forwards and backwards of every chunk, so each chunk's count repeats with that
    period. So the steps before ``warm + (2 v - 1) per_round + 1`` show every (chunks forward,
    chunks backward, count) the walk records (checked equal to the whole order over pp 1-32,
    v 1-8, tests/test_schedules.py). With a Megatron ``group`` that leaves a shorter last group
    the steps do not repeat to the end: the whole order."""
    if group is not None and m % group:
        return tuple(_looped("interleaved-1f1b", pp, m, v, r, group=group))
    per_round = group or m // max(1, m // pp)
    warm = min((v - 1) * per_round + 2 * (pp - 1 - r), m * v)
    return tuple(_looped("interleaved-1f1b", pp, m, v, r,
                         steps=warm + (2 * v - 1) * per_round + 1, group=group))


def _zbv(_s: str, pp: int, m: int, _v: int, r: int) -> list:
    # orders n = max(2 pp - 1, m) micro-batches (enough to fill the V), then drops those >= m
    n = max(2 * pp - 1, m)
    c0, c1 = r, 2 * pp - 1 - r
    cnt = {"F0": 0, "F1": 0, "B0": 0, "B1": 0}
    out = []

    def step(kind: str, chunk: int, key: str) -> None:
        out.append((kind, c0 if chunk == 0 else c1, cnt[key]))
        if kind != "I":
            cnt[key] += 1

    for _ in range(2 * (pp - r) - 1):
        step("F", 0, "F0")
    for _ in range(r):
        step("F", 1, "F1")
        step("F", 0, "F0")
    for _ in range(pp - r):
        step("F", 1, "F1")
        step("I", 1, "B1")
        step("W", 1, "B1")
    while cnt["F1"] < cnt["F0"] or cnt["F0"] < n:
        if cnt["F0"] < n:
            step("F", 0, "F0")
        step("I", 0, "B0")
        step("W", 0, "B0")
        step("F", 1, "F1")
        step("I", 1, "B1")
        step("W", 1, "B1")
    w0, w1 = cnt["B0"], cnt["B1"]
    for _ in range(r):
        out.append(("I", c0, cnt["B0"]))
        cnt["B0"] += 1
        out.append(("I", c1, cnt["B1"]))
        cnt["B1"] += 1
    for _ in range(pp - r):
        out.append(("I", c0, cnt["B0"]))
        cnt["B0"] += 1
        out.append(("W", c0, w0))
        w0 += 1
    out += [("W", c1, j) for j in range(w1, cnt["B1"])]
    out += [("W", c0, j) for j in range(w0, cnt["B0"])]
    return [a for a in out if a[2] < m]


def _dualpipev(_s: str, pp: int, m: int, _v: int, r: int) -> list:
    c0, c1 = r, 2 * pp - 1 - r
    nxt: dict[tuple, int] = {}
    pending: deque = deque()  # weight passes owed, oldest first
    out: list = []

    def take(key: tuple) -> int:
        j = nxt.get(key, 0)
        nxt[key] = j + 1
        return j

    def single(stage: int, kind: str) -> None:
        j = take((stage, "F" if kind == "F" else "B"))
        out.append((kind, stage, j))
        if kind == "I":
            pending.append((stage, j))

    def pair(f_stage: int, b_stage: int) -> None:
        out.append(("O", (f_stage, take((f_stage, "F"))), (b_stage, take((b_stage, "B")))))

    def weight() -> None:
        if pending:
            stage, j = pending.popleft()
            out.append(("W", stage, j))

    for _ in range(2 * (pp - r - 1)):                 # 1: F0
        single(c0, "F")
    for _ in range(r + 1):                            # 2: F0 F1
        single(c0, "F")
        single(c1, "F")
    for _ in range(pp - r - 1):                       # 3: I1 W1 F1
        single(c1, "I")
        weight()
        single(c1, "F")
    for i in range(m - 2 * pp + r + 1):               # 4: (F0 B1) (F1 B0)
        if i == 0 and r == pp - 1:                    # not overlapped: a shorter bubble
            single(c0, "F")
            single(c1, "B")
        else:
            pair(c0, c1)
        pair(c1, c0)
    for _ in range(pp - r - 1):                       # 5: B1 (F1 B0)
        single(c1, "B")
        pair(c1, c0)
    split = False
    for i in range(r + 1):                            # 6: B1 B0, the second half split
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        single(c1, "I" if split else "B")
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        single(c0, "I" if split else "B")
    for _ in range(pp - r - 1):                       # 7: W0 B0
        weight()
        single(c0, "I" if split else "B")
    for _ in range(r + 1):                            # 8: W0
        weight()
    return out


def rank_peak_in_flight(schedule: str, pp: int, m: int, v: int, rank: int) -> int:
    """:func:`peak_in_flight` of rank ``rank``'s order for ``m`` micro-batches (cached; builds
    that rank's order only, for a shorter step with the same warm-up when there is one: the
    peak is reached before the steady state repeats. Checked equal to the full order for
    pp 2-8, v 1-4 and every accepted m < 160).

    Raises:
        ValueError: the combination breaks a rule of :func:`check_order_args`.
    """
    check_order_args(schedule, pp, m, v)
    if schedule in V_SHAPED:
        m = min(m, 3 * pp)
    elif schedule in ("interleaved-1f1b", "interleaved-zero-bubble"):
        rounds = max(1, m // pp)
        per_round = m // rounds
        m = next((k * per_round for k in range(3, rounds) if k * per_round // pp == k), m)
    return _rank_peak(schedule, pp, m, v, rank)


def dualpipe_stage_peak(pp: int, m: int, rank: int) -> int:
    """Micro-batch-stages whose activations rank ``rank`` of DeepSeek's bidirectional DualPipe
    on ``pp`` ranks holds at its peak, for ``m`` micro-batches per step (``m / 2`` fed from
    each end), in units of one micro-batch through one whole stage (1/pp of the model; the
    rank holds two stages, one per direction).

    DualPipe's ``step`` (deepseek-ai/DualPipe ``dualpipe/dualpipe.py``, steps 1-8) is
    DualPipeV's on ``pp / 2`` ranks (``dualpipev.py``, its "cut-in-half"): rank ``r`` runs the
    order of DualPipeV's rank ``min(r, pp - 1 - r)`` (``half_rank``) with ``m / 2`` micro-batches
    (``half_num_chunks``), each chunk a whole stage: step 1 ``(num_half_ranks - half_rank - 1)
    * 2`` forwards, step 4 ``half_num_chunks - num_ranks + half_rank + 1`` pairs, as
    :func:`_dualpipev` with pp / 2 ranks. The peak is ``pp + 1`` on every rank, the README's
    table ("Activation Per Device: PP+1" for DualPipe on PP devices).

    Raises:
        ValueError: odd ``pp`` or fewer than 2 pp micro-batches (``step`` asserts
            ``num_ranks % 2 == 0`` and ``num_chunks >= num_ranks * 2``).
    """
    if pp % 2 or pp < 2:
        raise ValueError(f"DualPipe runs on an even number of pipeline ranks, not {pp}")
    if m < 2 * pp:
        raise ValueError(f"DualPipe needs at least 2 pp = {2 * pp} micro-batches, not {m}")
    return rank_peak_in_flight("dualpipev", pp // 2, m // 2, 2, min(rank, pp - 1 - rank))


@lru_cache(maxsize=8192)
def _rank_peak(schedule: str, pp: int, m: int, v: int, rank: int) -> int:
    return peak_in_flight(tuple(_MAKERS[schedule](schedule, pp, m, v, rank)))


_MAKERS = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved-1f1b": _looped,
           "interleaved-zero-bubble": _looped, "zbv-zero-bubble": _zbv, "dualpipev": _dualpipev,
           "dualpipe": _dualpipev}


def peak_in_flight(order: tuple[Action, ...]) -> int:
    """Most chunk-micro-batches a rank holds activations for along ``order``: +1 at each
    forward, -1 at each weight pass or full backward (an input-gradient pass frees nothing,
    see the module docstring); an ``O`` pair counts its forward before its backward."""
    held = peak = 0
    for a in order:
        kinds = ("F", "B") if a[0] == "O" else (a[0],)
        for k in kinds:
            if k == "F":
                held += 1
                peak = max(peak, held)
            elif k in ("B", "W"):
                held -= 1
    return peak


def rank_order(schedule: str, pp: int, m: int, v: int, rank: int, group: int | None = None
               ) -> tuple[Action, ...]:
    """Rank ``rank``'s actions in torch's order (:func:`rank_orders`; Megatron-LM's with a
    micro-batch ``group``), unchecked: the caller has checked the arguments with
    :func:`check_order_args`."""
    if group is not None:
        return tuple(_looped(schedule, pp, m, v, rank, group=group))
    return tuple(_MAKERS[schedule](schedule, pp, m, v, rank))
