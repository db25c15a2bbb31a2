"""Pipeline schedules: torch's action orders, their bubbles and in-flight micro-batches against
the published formulas, zero bubble against 1F1B, and the schedules through config, search,
exporters and importers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar
from autopar.cost.pipeline.orders import (
    ORDERED,
    check_order_args,
    peak_in_flight,
    rank_orders,
    rank_peak_in_flight,
)
from autopar.cost.pipeline.held import chunk_counts_at_peak, held_chunks_at_peak
from autopar.cost.pipeline.replay import replay
from autopar.cost.pipeline.schedule import pipeline_step_time, split_backward_step_time

SPLIT = ("interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev")


# -- the orders are torch's -----------------------------------------------------------------
def _torch_orders(name: str, pp: int, m: int, v: int):
    """torch 2.13's own per-rank compute actions, from its schedule classes without a process
    group: the order builders read only the counts set here."""
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = {"gpipe": S.ScheduleGPipe, "1f1b": S.Schedule1F1B,
           "interleaved-1f1b": S.ScheduleInterleaved1F1B,
           "interleaved-zero-bubble": S.ScheduleInterleavedZeroBubble,
           "zbv-zero-bubble": S.ScheduleZBVZeroBubble, "dualpipev": S.ScheduleDualPipeV}[name]
    o = cls.__new__(cls)
    o.pp_group_size, o._n_microbatches, o.n_local_stages = pp, m, v
    o._num_stages = o.num_stages = pp * v
    o.number_of_rounds = max(1, m // pp)
    o.microbatches_per_round = m // o.number_of_rounds
    if name in ("gpipe", "1f1b"):
        order = o._get_pipeline_order()
    else:
        order = {r: o._calculate_single_rank_operations(r) for r in range(pp)}
    out = []
    for r in range(pp):
        seq = []
        for a in order[r]:
            if a is None:
                continue
            if a.sub_actions is not None:
                f, b = a.sub_actions
                seq.append(("O", (f.stage_index, f.microbatch_index),
                            (b.stage_index, b.microbatch_index)))
            elif a.computation_type.value in ("F", "B", "I", "W"):
                seq.append((a.computation_type.value, a.stage_index, a.microbatch_index))
        out.append(tuple(seq))
    return tuple(out)


CASES = [(name, pp, m, v)
         for name, vs in (("gpipe", (1,)), ("1f1b", (1,)), ("interleaved-1f1b", (2, 3)),
                          ("interleaved-zero-bubble", (1, 2, 3)), ("zbv-zero-bubble", (2,)),
                          ("dualpipev", (2,)))
         for pp in (2, 3, 4) for m in (2, 4, 6, 8, 12) for v in vs]


@pytest.mark.parametrize("name,pp,m,v", CASES)
def test_orders_are_torchs(name, pp, m, v):
    try:
        check_order_args(name, pp, m, v)
    except ValueError:
        pytest.skip("torch refuses these counts too")
    if name == "1f1b" and m < pp:
        pytest.skip("Schedule1F1B refuses fewer micro-batches than stages")
    ours, theirs = rank_orders(name, pp, m, v), _torch_orders(name, pp, m, v)
    if name == "1f1b":
        # torch's Schedule1F1B._get_pipeline_order (the IR, not what step() runs) starts the
        # last rank's forwards at micro-batch 1; every other rank matches
        ours, theirs = ours[:-1], theirs[:-1]
    assert ours == theirs


# -- bubbles and memory against the papers ---------------------------------------------------
def _uniform(name: str, pp: int, m: int, v: int, f=1.0, i=1.0, w=1.0, pair_overlap=0.0):
    orders = rank_orders(name, pp, m, v)
    ov = (pair_overlap,) * pp if pair_overlap else None
    t, _ = replay(orders, pp * v, name, (f,) * pp, (i,) * pp, (w,) * pp, ov)
    return t - m * v * (f + i + w)  # bubble, in units of one chunk's pass


@pytest.mark.parametrize("pp,m", [(2, 8), (4, 8), (4, 16), (8, 16), (8, 32)])
def test_bubbles_match_the_published_formulas(pp, m):
    f = i = w = 1.0
    b = i + w
    # 1F1B and GPipe: (p - 1)(F + B) (Narayanan et al. 2021 section 2.2)
    assert _uniform("1f1b", pp, m, 1) == pytest.approx((pp - 1) * (f + b))
    assert _uniform("gpipe", pp, m, 1) == pytest.approx((pp - 1) * (f + b))
    # interleaved: the same bubble in chunk units, i.e. 1/v of a rank's (m % pp == 0)
    assert _uniform("interleaved-1f1b", pp, m, 2) == pytest.approx((pp - 1) * (f + b))
    # ZB-H1 (ZB1P): (p - 1)(F + B - 2W) (Qi et al. 2023; DeepSeek-V3 report table 2)
    assert _uniform("interleaved-zero-bubble", pp, m, 1) == pytest.approx(
        (pp - 1) * (f + b - 2 * w))
    # DualPipeV with its F&B pairs run as one: (PP/2 - 1)(F&B + B - 3W), PP = 2p chunks
    assert _uniform("dualpipev", pp, m, 2, pair_overlap=1e-12) == pytest.approx(
        (pp - 1) * ((f + b) + b - 3 * w))
    # ZBV: only the pipeline fill, (p - 1) F, once m >= 2p (Qi et al. section 6)
    if m >= 2 * pp:
        assert _uniform("zbv-zero-bubble", pp, m, 2) == pytest.approx((pp - 1) * f)


@pytest.mark.parametrize("pp,m", [(2, 8), (4, 8), (4, 16), (8, 32)])
def test_in_flight_micro_batches(pp, m):
    def peaks(name, v):
        return [peak_in_flight(o) for o in rank_orders(name, pp, m, v)]
    # 1F1B: rank r holds p - r (Narayanan et al. 2021); interleaved: Megatron's warm-up + 1
    assert peaks("1f1b", 1) == [min(m, pp - r) for r in range(pp)]
    assert peaks("interleaved-1f1b", 2) == [min(2 * m, 2 * (pp - r - 1) + pp + 1)
                                            for r in range(pp)]
    # ZB-H1: every rank holds p, the 1F1B peak (Qi et al. 2023 section 3: "the same peak
    # memory as 1F1B"), since rank r delays its weight passes by r steps
    assert peaks("interleaved-zero-bubble", 1) == [pp] * pp
    # ZB-V: 2p chunks of half a rank each = the 1F1B peak of p micro-batches (section 6)
    if m >= 2 * pp:
        assert peaks("zbv-zero-bubble", 2) == [2 * pp] * pp
    # DualPipeV: PP + 1 chunk activations, PP = 2p (DeepSeek-V3 report table 2)
    assert peaks("dualpipev", 2) == [2 * pp + 1] * pp
    assert rank_peak_in_flight("dualpipev", pp, m, 2, 0) == 2 * pp + 1


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_chunks_holding_fsdp_state_at_the_activation_peak(pp):
    """FSDP under PP: a chunk holds gathered parameters from its first forward and gradients
    from its first backward until its last backward. 1F1B peaks at (or after) the rank's first
    backward: its one chunk holds both. Interleaved 1F1B with m = pp (torchtitan's default
    micro-batch count): the earlier chunk has not begun its backward at the peak."""
    m = pp
    for r in range(pp):
        assert held_chunks_at_peak("1f1b", pp, m, 1, r)[-1] == (frozenset({r}), frozenset({r}))
        sets = held_chunks_at_peak("interleaved-1f1b", pp, m, 2, r)
        assert all(f == {r, r + pp} for f, _b in sets)
        assert {b for _f, b in sets} == {frozenset(), frozenset({r + pp})}
    # GPipe: every forward, then the first backward allocates the gradients
    assert held_chunks_at_peak("gpipe", pp, m, 1, 0) == ((frozenset({0}), frozenset()),
                                                          (frozenset({0}), frozenset({0})))


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_chunk_counts_at_the_peak(pp):
    """Interleaved 1F1B, m = pp: the last rank holds its first chunk's m micro-batches and one
    of its last chunk's (the head's), not (m + 1) / 2 of each; 1F1B: p - r of its one chunk."""
    m = pp
    assert chunk_counts_at_peak("interleaved-1f1b", pp, m, 2, pp - 1) == {pp - 1: m,
                                                                          2 * pp - 1: 1}
    for r in range(pp):
        assert chunk_counts_at_peak("1f1b", pp, m, 1, r) == {r: pp - r}
        # at one instant the counts add up to the peak; over all instants each is at most it
        counts = chunk_counts_at_peak("interleaved-1f1b", pp, m, 2, r)
        peak = rank_peak_in_flight("interleaved-1f1b", pp, m, 2, r)
        assert sum(counts.values()) >= peak and max(counts.values()) <= peak


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(ORDERED), st.integers(2, 4), st.integers(1, 4), st.integers(1, 3))
def test_state_at_peak_only_names_chunks_the_rank_runs(schedule, pp, rounds, v):
    v = 2 if schedule in ("zbv-zero-bubble", "dualpipev", "dualpipe") else (
        1 if schedule in ("gpipe", "1f1b") else v)
    m = max(2 * pp, rounds * pp) if schedule in ("dualpipev", "dualpipe") else rounds * pp
    orders = rank_orders(schedule, pp, m, v)
    for r in range(pp):
        mine = {a[1] for a in orders[r] if a[0] != "O"} | {
            x[0] for a in orders[r] if a[0] == "O" for x in a[1:]}
        sets = held_chunks_at_peak(schedule, pp, m, v, r)
        assert sets
        for f, b in sets:
            assert b <= mine and f <= mine


def _at_peak_two_passes(schedule, pp, m, v, r):
    """held_chunks_at_peak and chunk_counts_at_peak as their docstrings define them, the plain
    way: the peak first (peak_in_flight), then every instant (after each forward, at the start
    of each backward or weight pass) holding it, recorded."""
    order = rank_orders(schedule, pp, m, v)[r]
    peak = peak_in_flight(order)
    steps = [s for a in order for s in (
        (("F", a[1][0]), ("B", a[2][0])) if a[0] == "O" else ((a[0], a[1]),))]
    held, fwd, bwd, done, seen, count = 0, set(), set(), {}, set(), {}
    sets, best = {}, {}

    def note():
        if held == peak:
            sets.setdefault((frozenset(fwd), frozenset(bwd)), None)
            for c, n in count.items():
                best[c] = max(best.get(c, 0), n)

    for kind, stage in steps:
        if kind == "F":
            held += 1
            count[stage] = count.get(stage, 0) + 1
            if stage not in seen:
                seen.add(stage)
                fwd.add(stage)
            note()
        elif kind in ("B", "W"):
            bwd.add(stage)
            note()
            held -= 1
            count[stage] -= 1
            done[stage] = done.get(stage, 0) + 1
            if done[stage] == m:
                fwd.discard(stage)
                bwd.discard(stage)
    return tuple(sets), dict(sorted(best.items()))


def _assert_peaks_as_two_passes(schedule: str, pp: int, m: int, v: int) -> None:
    """Every rank's held chunks and counts at its peak equal the plain two-pass walk's (nothing
    checked for a combination the schedule refuses)."""
    try:
        check_order_args(schedule, pp, m, v)
    except ValueError:
        return
    for r in range(pp):
        sets, counts = _at_peak_two_passes(schedule, pp, m, v, r)
        assert held_chunks_at_peak(schedule, pp, m, v, r) == sets
        assert chunk_counts_at_peak(schedule, pp, m, v, r) == counts


def test_state_at_peak_one_pass_matches_the_two_pass_definition():
    """The cached one-pass walk (autopar.cost.pipeline.held._at_peak: no peak known in advance,
    instants that cannot change the answer skipped) gives exactly the plain two-pass walk's
    sets, in the same order, and counts, over every schedule and accepted micro-batch count of
    small pipelines (a search asks for thousands of these; the full grid up to pp 32, m 384 was
    checked equal when the walk was rewritten)."""
    for schedule in ORDERED:
        for pp in range(1, 6):
            for v in (1, 2, 3):
                for m in range(1, 3 * pp + 3):
                    _assert_peaks_as_two_passes(schedule, pp, m, v)


def test_state_at_peak_of_long_steps_matches_the_whole_order():
    """Long steps: one chunk per rank (1F1B, GPipe) is answered without a walk, and interleaved
    1F1B walks only the prefix of its order that shows every peak state
    (:func:`autopar.cost.pipeline.orders.looped_peak_order`); both give exactly the plain
    two-pass walk of the whole order, over many rounds of micro-batches."""
    for pp, v, rounds in ((2, 3, 9), (3, 2, 7), (4, 4, 6), (6, 2, 5), (8, 3, 4), (5, 1, 8)):
        for m in (rounds * pp, rounds * pp + rounds, 3 * pp + 1):
            for schedule, chunks in (("interleaved-1f1b", v), ("1f1b", 1), ("gpipe", 1)):
                _assert_peaks_as_two_passes(schedule, pp, m, chunks)


def test_long_steps_are_extrapolated_from_a_replayed_prefix():
    fwd, bwd, wgt = (1.0, 1.3, 0.9, 1.1), (2.0, 2.4, 1.9, 2.2), (0.9, 1.1, 0.8, 1.0)
    for name, v in (("interleaved-zero-bubble", 2), ("zbv-zero-bubble", 2), ("dualpipev", 2)):
        m = 64
        fast, _ = split_backward_step_time(fwd, bwd, wgt, m, v, name)
        full, _ = replay(rank_orders(name, 4, m, v), 4 * v, name, tuple(f / v for f in fwd),
                         tuple((b - w) / v for b, w in zip(bwd, wgt)),
                         tuple(w / v for w in wgt))
        assert fast == pytest.approx(full, rel=0.015)


times = st.floats(min_value=0.1, max_value=3.0, allow_nan=False)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(pp=st.integers(2, 6), rounds=st.integers(1, 4), data=st.data())
def test_zero_bubble_never_loses_to_1f1b(pp, rounds, data):
    m = pp * rounds
    fwd = tuple(data.draw(times) for _ in range(pp))
    inp = tuple(data.draw(times) for _ in range(pp))
    wgt = tuple(data.draw(times) for _ in range(pp))
    bwd = tuple(i + w for i, w in zip(inp, wgt))
    t_1f1b, bubble_1f1b = pipeline_step_time(fwd, bwd, m, 1, "1f1b")
    for name, v in (("interleaved-zero-bubble", 1), ("interleaved-zero-bubble", 2),
                    ("zbv-zero-bubble", 2), ("dualpipev", 2)):
        if name == "dualpipev" and m < 2 * pp:
            continue
        t, bubble = pipeline_step_time(fwd, bwd, m, v, name, wgrad=wgt)
        assert bubble >= -1e-9
        assert t >= m * max(f + b for f, b in zip(fwd, bwd)) - 1e-9
        if name == "interleaved-zero-bubble" and v == 1:
            # ZB-H1 runs 1F1B's order with weight passes moved later: never slower
            assert t <= t_1f1b * (1 + 1e-9)
            assert bubble <= bubble_1f1b + 1e-9


# -- configuration, cost model, search ----------------------------------------------------------
def test_config_names_aliases_and_chunk_rules():
    assert autopar.ParallelConfig(pp=2, schedule="ZBVZeroBubble").schedule == "zbv-zero-bubble"
    assert autopar.ParallelConfig(pp=2, schedule="interleaved-zb").schedule == \
        "interleaved-zero-bubble"
    assert autopar.ParallelConfig(pp=2, schedule="DualPipeV").schedule == "dualpipev"
    with pytest.raises(autopar.InvalidParallelConfig, match="exactly 2 chunks"):
        autopar.ParallelConfig(pp=2, schedule="zbv", virtual_stages=3)
    assert autopar.ParallelConfig(pp=2, schedule="DualPipe").schedule == "dualpipe"
    with pytest.raises(autopar.InvalidParallelConfig, match="not one of"):
        autopar.ParallelConfig(pp=2, schedule="dualpipe-x")


CLUSTER = autopar.Cluster.from_spec("1x8xA100-80GB")


def test_estimates_rank_the_schedules_and_place_the_v():
    train = autopar.TrainingConfig(global_batch_size=32, seq_len=2048)
    base = dict(tp=2, pp=4, micro_batch_size=1, recompute="selective")
    est = {s: autopar.estimate("llama2-7b", CLUSTER, train, autopar.ParallelConfig(
        **base, schedule=s, virtual_stages=1 if s in ("1f1b", "gpipe") else 2))
        for s in ("1f1b", "interleaved-1f1b") + SPLIT}
    bubble = {s: e.time_breakdown.bubble for s, e in est.items()}
    assert bubble["interleaved-1f1b"] < bubble["1f1b"]
    for s in SPLIT:
        assert est[s].config.virtual_stages == 2
        assert bubble[s] < bubble["interleaved-1f1b"]
    # V-shaped: rank 0 holds the first and the last chunk (embedding and head)
    v = est["zbv-zero-bubble"]
    assert v.stage_memory_bytes[0] == max(v.stage_memory_bytes)
    assert v.config.schedule == "zbv-zero-bubble"
    # pp = 1 has nothing to fill: 1F1B
    flat = autopar.estimate("llama2-7b", CLUSTER, train, autopar.ParallelConfig(
        tp=8, pp=1, schedule="dualpipev"))
    assert flat.config.schedule == "1f1b" and flat.config.virtual_stages == 1


def test_dualpipev_needs_two_micro_batches_per_rank():
    train = autopar.TrainingConfig(global_batch_size=4, seq_len=2048)
    with pytest.raises(autopar.InvalidParallelConfig, match="DualPipeV needs"):
        autopar.estimate("llama2-7b", CLUSTER, train, autopar.ParallelConfig(
            tp=2, pp=4, micro_batch_size=1, schedule="dualpipev"))


@pytest.fixture(scope="module")
def searched():
    out = {}
    fixed = {"pp": 4, "tp": 2, "micro_batch_size": 1, "recompute": "selective", "zero_stage": 0}
    for fw in ("torch", "megatron"):
        train = autopar.TrainingConfig(global_batch_size=16, seq_len=2048, framework=fw)
        out[fw] = autopar.optimize("llama2-7b", CLUSTER, train, fixed=fixed)
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=2048)
    out["torch 1f1b family"] = min(
        (autopar.optimize("llama2-7b", CLUSTER, train, fixed=dict(fixed, schedule=s))
         for s in ("1f1b", "interleaved-1f1b")), key=lambda p: p.estimate.step_time_s)
    return out


def test_search_picks_a_zero_bubble_schedule_where_the_framework_runs_one(searched):
    assert searched["torch"].config.schedule in SPLIT
    assert searched["megatron"].config.schedule in ("1f1b", "interleaved-1f1b")
    # the same search under torch with the schedule held to the 1F1B family is slower
    assert searched["torch"].estimate.step_time_s < \
        searched["torch 1f1b family"].estimate.step_time_s


def test_exporters_write_or_refuse_the_schedule(searched):
    plan = searched["torch"]
    toml = plan.to_torchtitan_toml()
    name = {"interleaved-zero-bubble": "InterleavedZeroBubble", "zbv-zero-bubble":
            "ZBVZeroBubble", "dualpipev": "DualPipeV"}[plan.config.schedule]
    assert f'pipeline_parallel_schedule = "{name}"' in str(toml)
    assert not any("schedule" in w for w in toml.warnings if "re-estimated" not in w)
    meg = plan.to_megatron_args()
    assert any("zero-bubble or V-shaped" in w for w in meg.warnings)
    assert meg.written.schedule in ("1f1b", "interleaved-1f1b")
    ds = plan.to_deepspeed_config()
    assert any("TrainSchedule" in w for w in ds.warnings)


def test_plan_files_keep_the_schedule(searched, tmp_path):
    plan = searched["torch"]
    path = tmp_path / "plan.json"
    plan.to_json(path)
    back = autopar.Plan.from_json(path)
    assert back.config.schedule == plan.config.schedule
    assert back.estimate.step_time_s == pytest.approx(plan.estimate.step_time_s)


def test_torchtitan_toml_round_trips_the_schedule(searched, tmp_path):
    from autopar.io.importers import from_torchtitan_toml
    plan = searched["torch"]
    path = tmp_path / "job.toml"
    path.write_text(plan.to_torchtitan_toml().value)
    imp = from_torchtitan_toml(path)
    assert imp.parallel["schedule"] == plan.config.schedule
    assert imp.parallel["virtual_stages"] == 2


def test_the_schedule_picture_replays_the_estimate():
    from autopar.report.plots import schedule_events
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=2048)
    for s in SPLIT:
        e = autopar.estimate("llama2-7b", CLUSTER, train, autopar.ParallelConfig(
            tp=2, pp=4, micro_batch_size=1, schedule=s, virtual_stages=2))
        events = schedule_events(e)
        pipe = e.step_time_s - e.time_breakdown.dp_comm_exposed - e.time_breakdown.optimizer
        assert max(start + d for _, _, start, d, _, _ in events) == pytest.approx(pipe)
        assert {k for _, k, *_ in events} >= {"F", "I", "W"} or s == "dualpipev"
        assert all(0 <= chunk < 2 for *_, chunk, _ in events)


def test_stage_table_places_v_schedule_chunks_in_a_v():
    # rank 0 of a V holds the first and the last chunk, so the embedding and the head; the
    # table showed round-robin chunks (the head on the last rank) while the cost model had a V
    from autopar.report.tables import stage_rows
    for schedule in ("dualpipev", "zbv-zero-bubble"):
        e = autopar.estimate("llama2-7b", "1x8xA100-80GB",
                             autopar.TrainingConfig(global_batch_size=64, seq_len=2048),
                             autopar.ParallelConfig(tp=2, pp=4, dp=1, schedule=schedule,
                                                    recompute="full"))
        rows = stage_rows(e)
        assert rows[0]["extra"] == ["embedding", "head"], schedule
        assert rows[0]["blocks"] == [0, 1, 2, 3, 28, 29, 30, 31], rows[0]["blocks"]
        assert rows[3]["blocks"] == list(range(12, 20)) and rows[3]["extra"] == []
