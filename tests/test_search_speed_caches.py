"""The search's speed-ups (issue 14, item 5, third pass) give the answers of the plain computations:
estimates that share their ZeRO-free part across ZeRO stages equal estimates computed alone,
bitwise; the fit test of a rank equals asking for its fastest fitting recomputation; the galloping
stage-cut fit test equals the bisecting one; the mesh groups come in the order of their bounds."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autopar
from autopar.cost.model import CostModel
from autopar.search import cuts, phases, space
from autopar.search.cuts import rank_fits, rank_recompute, some_cut_fits

_CFG = {"name": "small", "family": "llama", "num_layers": 12, "hidden_size": 5120,
        "num_heads": 40, "num_kv_heads": 8, "vocab_size": 32000, "seq_len": 4096}
_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", params=["dense", "moe"])
def cm(request, dense_or_tiny_moe):
    """A dense Llama-like model and a tiny DeepSeek-V3 (dense then MoE blocks) on 16 A100-40GB:
    memory binds for part of the space, so both answers of the fit tests occur."""
    return dense_or_tiny_moe(request.param, _CFG)



def _config(cm, **kw):
    try:
        return cm.resolve(autopar.ParallelConfig(**kw))
    except autopar.InvalidParallelConfig:
        return None


def _fields(e):
    return (e.step_time_s, e.memory_per_gpu_bytes, e.fits, e.time_breakdown,
            e.memory_breakdown, e.stage_memory_bytes, e.stage_time_s, e.comm_by_link,
            e.stage_fwd_s, e.stage_bwd_s, e.peak_stage)


@settings(max_examples=40, **_SETTINGS)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]),
       schedule=st.sampled_from([None, "interleaved-zero-bubble", "dualpipev", "gpipe"]),
       rc=st.sampled_from(["none", "selective", "full"]), ep=st.sampled_from([1, 2]),
       zero=st.integers(0, 3), order=st.permutations([0, 1, 2, 3]))
def test_estimates_sharing_the_zero_free_part_equal_estimates_alone(cm, tp, pp, schedule, rc,
                                                                   ep, zero, order):
    """An estimate (and the time-only bound) after estimates of the same configuration under
    other ZeRO stages, in any order, equals the one a fresh cost model computes, bitwise."""
    base = dict(tp=tp, pp=pp, schedule=schedule, recompute=rc, ep=ep)
    if _config(cm, **base, zero_stage=zero) is None:
        return
    shared = CostModel(cm.graph, cm.cluster, cm.train)
    for z in order:
        c = _config(shared, **base, zero_stage=z)
        if c is not None:
            try:
                shared.step_without_dp_s(c) if z % 2 else shared.estimate(c)
            except ValueError:
                return   # a schedule that cannot order these counts
    fresh = CostModel(cm.graph, cm.cluster, cm.train)
    c = _config(fresh, **base, zero_stage=zero)
    alone = fresh.estimate(c)
    again = shared.estimate(c)
    assert _fields(again) == _fields(alone)
    assert shared.step_without_dp_s(c) == \
        CostModel(cm.graph, cm.cluster, cm.train).step_without_dp_s(c)


@settings(max_examples=60, **_SETTINGS)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([2, 4, 8]), zero=st.integers(0, 3),
       b=st.sampled_from([1, 2, 4, 8]), ep=st.sampled_from([1, 2]),
       allowed=st.sampled_from([cuts.MODES, ("full",), ("none",), ("none", "full")]),
       data=st.data())
def test_rank_fits_is_whether_a_fitting_recomputation_exists(cm, tp, pp, zero, b, ep, allowed,
                                                            data):
    c = _config(cm, tp=tp, pp=pp, zero_stage=zero, micro_batch_size=b, ep=ep,
                sequence_parallel=tp > 1)
    if c is None:
        return
    n = len(cm.blocks)
    rank = data.draw(st.integers(0, pp - 1))
    start = 0 if rank == 0 else data.draw(st.integers(1, n - 1))
    end = n if rank == pp - 1 else data.draw(st.integers(start + 1, n))
    if rank != pp - 1 and end == n:
        return
    layout = cm.interval_layout(c, rank, start, end)
    assert rank_fits(cm, c, layout, allowed) == (rank_recompute(cm, c, layout, allowed)
                                                 is not None)


def _bisecting_cut_fits(cm, c, allowed):
    """some_cut_fits as first written: each rank's largest fitting end by bisection."""
    n, p = len(cm.blocks), c.pp

    def fits(i, a, b):
        return rank_recompute(cm, c, cm.interval_layout(c, i, a, b), allowed) is not None

    a = 0
    for i in range(p):
        if i == p - 1:
            return fits(i, a, n)
        lo, hi = a + 1, n - (p - 1 - i)
        if not fits(i, a, lo):
            return False
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(i, a, mid):
                lo = mid
            else:
                hi = mid - 1
        a = lo
    return True


@settings(max_examples=60, **_SETTINGS)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([2, 3, 4, 6, 8]),
       zero=st.integers(0, 3), b=st.sampled_from([1, 2, 4, 8, 16]), ep=st.sampled_from([1, 2]),
       allowed=st.sampled_from([cuts.MODES, ("full",), ("none",)]))
def test_galloping_cut_fit_equals_bisection(cm, tp, pp, zero, b, ep, allowed):
    c = _config(cm, tp=tp, pp=pp, zero_stage=zero, micro_batch_size=b, ep=ep,
                sequence_parallel=tp > 1)
    if c is None or pp > len(cm.blocks):
        return
    assert some_cut_fits(cm, c, allowed) == _bisecting_cut_fits(cm, c, allowed)


def test_both_answers_of_the_cut_fit_test_occur(cm):
    """The property tests above see fitting and unfitting cases (on the dense model: the tiny
    MoE fits everywhere)."""
    if getattr(cm.graph, "num_experts", 0):
        pytest.skip("the tiny MoE model fits under every cut")
    seen = set()
    for b in (1, 8):
        for allowed in (cuts.MODES, ("none",)):
            c = _config(cm, tp=1, pp=2, zero_stage=0, micro_batch_size=b)
            if c is not None:
                got = some_cut_fits(cm, c, allowed)
                assert got == _bisecting_cut_fits(cm, c, allowed)
                seen.add(got)
    assert seen == {True, False}


def test_mesh_groups_come_in_the_order_of_their_bounds(cm):
    """MeshGroups yields every group in (bound, key) order, each bound the least lower_bound over
    its placements and CP modes, computed from resolved configurations one by one."""
    fixed = {}
    groups = phases.mesh_groups(cm, fixed, space.SpaceLimits())
    got = list(groups)
    assert len(got) == len(groups) > 10
    expect = []
    for _cheap, key, base, modes in groups._entries:
        bound = min(phases.lower_bound(cm, cm.resolve(autopar.ParallelConfig(
            **base, placement=placement, cp_mode=mode)))
            for placement in space.placements(base, fixed) for mode in modes)
        expect.append((bound, key))
    expect.sort()
    assert [(b, k) for b, k, _base in got] == expect
    assert all(math.isfinite(b) for b, _k in expect)


@settings(max_examples=40, **_SETTINGS)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]),
       schedule=st.sampled_from([None, "interleaved-zero-bubble", "zbv-zero-bubble", "gpipe"]),
       b=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2]),
       rc=st.sampled_from(["none", "selective", "full"]))
def test_zero_stages_one_to_three_share_the_recompute_free_bound(cm, tp, pp, schedule, b, ep, rc):
    """beyond computes recompute_free_bound once for ZeRO stages 1-3 of a configuration: their
    values agree to rounding (far inside BOUND_RTOL), and the shared one bounds each stage's
    step time under any recomputation."""
    bounds, steps = [], []
    for zero in (1, 2, 3):
        c = _config(cm, tp=tp, pp=pp, schedule=schedule, micro_batch_size=b, ep=ep,
                    zero_stage=zero)
        if c is None:
            return
        try:
            bounds.append(phases.recompute_free_bound(cm, c))
            steps.append(cm.estimate(c.replace(recompute=rc)).step_time_s)
        except ValueError:
            return
    assert max(bounds) - min(bounds) <= 1e-12 * max(bounds)
    assert all(bounds[0] <= s * (1 + phases.BOUND_RTOL) for s in steps)


def test_a_search_leaves_no_reference_cycles(cm):
    """The search pauses the cyclic collector (autopar.search.optimize._collector_paused): that
    only holds memory flat if reference counting frees all it allocates, i.e. it makes no
    reference cycles (a recursive closure left one per call before; dropped after use now)."""
    import gc

    from autopar.search.optimize import search
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        search(CostModel(cm.graph, cm.cluster, cm.train), fixed={"tp": 2})
        gc.collect()
        garbage = [type(o).__name__ + ":" + getattr(o, "__qualname__", "") for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert gc.isenabled()
    assert garbage == []


@settings(max_examples=40, **_SETTINGS)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]),
       schedule=st.sampled_from([None, "interleaved-1f1b", "dualpipev", "gpipe"]),
       b=st.sampled_from([None, 1, 2]), zero=st.integers(0, 3),
       rc=st.sampled_from(["none", "full", "per-block", "short"]),
       keep=st.sampled_from([None, "some", "short"]), order=st.permutations([0, 1, 2, 3]))
def test_resolving_a_variant_equals_resolving_it_alone(cm, tp, pp, schedule, b, zero, rc, keep,
                                                       order):
    """CostModel.resolve reuses a resolution across the ZeRO stage, recomputation and
    kept-gathered flags (fields resolving only copies, checking the per-block tuples' lengths):
    after other variants were resolved, in any order, a variant resolves as resolve() alone
    does, its error included (a per-block tuple of the wrong length)."""
    from autopar.cost.resolve import resolve
    n = cm.graph.num_blocks
    recompute = {"per-block": ("full",) + ("none",) * (n - 1), "short": ("full",)}.get(rc, rc)
    reshard = {"some": (False,) + (True,) * (n - 1), "short": (False, True)}.get(keep)
    base = dict(tp=tp, pp=pp, schedule=schedule, micro_batch_size=b)
    if reshard is not None:
        zero = 3
    shared = CostModel(cm.graph, cm.cluster, cm.train)
    for z in order:   # the plain variants first, under every ZeRO stage
        try:
            shared.resolve(shared.resolve(autopar.ParallelConfig(**base, zero_stage=z)))
        except autopar.InvalidParallelConfig:
            pass
    cfg = autopar.ParallelConfig(**base, zero_stage=zero, recompute=recompute,
                                 reshard_after_forward=reshard)

    def answer(f):
        try:
            return f(cfg)
        except autopar.InvalidParallelConfig as exc:
            return ("error", str(exc), getattr(exc, "rule", None))
    alone = answer(lambda c: resolve(c, cm.graph, cm.cluster.world_size, cm.train))
    assert answer(shared.resolve) == alone
    if not isinstance(alone, tuple):   # and again from the resolved configuration
        assert answer(lambda c: shared.resolve(shared.resolve(c))) == alone


@settings(max_examples=30, **_SETTINGS)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([2, 4]),
       schedule=st.sampled_from([None, "interleaved-1f1b", "zbv-zero-bubble", "gpipe"]),
       b=st.sampled_from([1, 2]), zero=st.integers(0, 3))
def test_time_layout_reads_as_the_stage_layout(cm, tp, pp, schedule, b, zero):
    """A time-only layout (Layouts.time_layout, built without model states where no ZeRO stage
    of the configuration has a layout yet) has the layers, pipeline sends and parameters of the
    full layout; the full layout built after it equals one built alone."""
    c = _config(cm, tp=tp, pp=pp, schedule=schedule, micro_batch_size=b, zero_stage=zero)
    if c is None:
        return
    shared = CostModel(cm.graph, cm.cluster, cm.train)
    timed = shared.layouts.time_layout(c)
    full = shared.stage_layout(c)
    alone = CostModel(cm.graph, cm.cluster, cm.train).stage_layout(c)
    assert full == alone
    assert [(s.layers, s.p2p_s, s.p2p_load, s.params) for s in timed] == \
        [(s.layers, s.p2p_s, s.p2p_load, s.params) for s in full]


def test_a_searched_model_answers_as_a_fresh_one(cm):
    """After a search has filled every cache (shared resolutions, time-only layouts, per-rank
    sums shared by equal (signature, count) items, rank_dp answers shared by equal rank
    problems), the estimates, time-only bounds and per-rank recomputations of the plans it
    returned equal those of a fresh cost model, bitwise."""
    from autopar.search.optimize import search
    from autopar.search.stages import best_recompute
    shared = CostModel(cm.graph, cm.cluster, cm.train)
    result = search(shared, top_k=3)
    plans = {e.config: e for e in (*result.top, *result.pareto)}
    assert plans
    for c, e in plans.items():
        fresh = CostModel(cm.graph, cm.cluster, cm.train)
        assert _fields(fresh.estimate(c)) == _fields(e) == _fields(shared.estimate(c))
        assert best_recompute(fresh, c) == best_recompute(shared, c)
        assert CostModel(cm.graph, cm.cluster, cm.train).step_without_dp_s(c) == \
            shared.step_without_dp_s(c)


@settings(max_examples=30, **_SETTINGS)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([2, 4]),
       schedule=st.sampled_from([None, "interleaved-1f1b", "dualpipev", "gpipe"]),
       zero=st.integers(0, 3), order=st.permutations(["none", "selective", "full", "cut"]))
def test_ranks_sharing_their_sums_equal_estimates_alone(cm, tp, pp, schedule, zero, order):
    """Per-rank sums under one recompute mode are shared by ranks (and stage cuts) whose
    (signature, count) items agree: after estimates under the other modes and cuts, in any
    order, each estimate equals a fresh cost model's, bitwise."""
    c = _config(cm, tp=tp, pp=pp, schedule=schedule, zero_stage=zero)
    if c is None:
        return
    cut = list(c.stage_blocks)
    if cut[0] > 1:   # one block moved off the first chunk
        cut[0] -= 1
        cut[-1] += 1
    variants = {rc: c.replace(recompute=rc) for rc in ("none", "selective", "full")}
    variants["cut"] = c.replace(stage_blocks=tuple(cut))
    shared = CostModel(cm.graph, cm.cluster, cm.train)
    try:
        got = {k: shared.estimate(variants[k]) for k in order}
    except (ValueError, autopar.InvalidParallelConfig):
        return
    for k, e in got.items():
        assert _fields(CostModel(cm.graph, cm.cluster, cm.train).estimate(variants[k])) == \
            _fields(e)


def test_parallel_config_replace_and_checks_memoised_are_the_constructor():
    """ParallelConfig.replace builds without the generated __init__ and skips the element checks
    of a placement or a stage_blocks tuple already checked (autopar.config._checked): the
    result equals the constructor's, fields in the same order, and every refusal stays."""
    from autopar.config import ParallelConfig
    from autopar.errors import InvalidParallelConfig

    c = ParallelConfig(tp=2, pp=2, dp=4, stage_blocks=(1, 3), placement=("tp", "cp", "dp", "pp"))
    r = c.replace(zero_stage=1, recompute="full")
    want = ParallelConfig(**{**c.__dict__, "zero_stage": 1, "recompute": "full"})
    assert r == want and list(r.__dict__) == list(want.__dict__) and hash(r) == hash(want)
    assert c.replace(stage_blocks=[2, 2]).stage_blocks == (2, 2)
    assert c.replace(tp=1).sequence_parallel is False     # normalisations still run
    for bad in (dict(stage_blocks=(True, 3)), dict(stage_blocks=(1, -3)),
                dict(stage_blocks=([1], 3)), dict(placement=(["tp"], "cp", "dp", "pp")),
                dict(placement=("tp", "tp", "dp", "pp")), dict(zero_stage=5)):
        with pytest.raises(InvalidParallelConfig):
            c.replace(**bad)
        with pytest.raises(InvalidParallelConfig):
            ParallelConfig(**{**c.__dict__, **bad})
    with pytest.raises(TypeError):
        c.replace(no_such_field=1)
