"""Framework profile and memory convention validation: bad values (NaN, infinity, wrong types,
out-of-range numbers, unknown names) are refused at construction, through
``dataclasses.replace`` and through ``with_costs``, as one :class:`InvalidTrainingConfig` that
names each bad field, its value, the rule and a fix; lists given for tuple fields become tuples."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.config import ATTENTION_KERNELS, SCHEDULES
from autopar.errors import InvalidTrainingConfig
from autopar.frameworks import PROFILES, get_profile
from autopar.frameworks.memory import TORCH_MEMORY, MemoryConventions
from autopar.frameworks.profiles import COST_FIELDS, FrameworkProfile

MEGA = get_profile("megatron")


def _refusal(call) -> str:
    with pytest.raises(InvalidTrainingConfig) as info:
        call()
    msg = str(info.value)
    assert "fix" in msg.lower(), msg
    return msg


def _cost(field, value):
    return MEGA.with_costs({field: "a test"}, **{field: value})


@pytest.mark.parametrize("field, value, expected", [
    ("step_fixed_s", float("nan"), "step_fixed_s=nan: must be a finite number >= 0 (seconds)"),
    ("step_fixed_s", float("inf"), "step_fixed_s=inf: must be a finite number >= 0 (seconds)"),
    ("step_fixed_s", -5, "step_fixed_s=-5: must be a finite number >= 0 (seconds)"),
    ("step_fixed_s", "1", "step_fixed_s='1': must be a finite number >= 0"),
    ("step_fixed_s", True, "step_fixed_s=True: must be a finite number"),
    ("optimizer_step_bytes", -1, "optimizer_step_bytes=-1: must be a whole number >= 1"),
    ("optimizer_step_bytes", 0, "optimizer_step_bytes=0: must be a whole number >= 1"),
    ("optimizer_step_bytes", float("nan"), "optimizer_step_bytes=nan: must be a whole number"),
    ("optimizer_step_bytes", 40.5, "optimizer_step_bytes=40.5: must be a whole number"),
    ("zero1_group_size", 0, "zero1_group_size=0: must be None (the whole data-parallel group) "
                            "or a whole number >= 1"),
    ("sync_grad_bucket_elements", -1, "sync_grad_bucket_elements=-1: must be a whole number "
                                      ">= 0"),
    ("zero_grad_copy_passes", float("inf"), "zero_grad_copy_passes=inf: must be a whole number"),
    ("grad_reduce_bytes", 3, "grad_reduce_bytes=3: must be one of [None, 1, 2, 4]"),
    ("grad_reduce_bytes", True, "grad_reduce_bytes=True: must be one of [None, 1, 2, 4]"),
    ("overlap_tp_comm", "yes", "overlap_tp_comm='yes': must be True or False"),
    ("fsdp2_copies", 1, "fsdp2_copies=1: must be True or False"),
    ("attention_kernels", {"*": "nope"}, "'*': 'nope' is not one of ['fa1', 'fa2', 'fa3', "
                                         "'cudnn', 'efficient']"),
    ("attention_kernels", {"hopper": "fa3"}, "needs '*' entry"),
    ("attention_kernels", "fa2", "attention_kernels='fa2': must be a mapping"),
    ("overlap_pp_p2p", ["1f1c"], "['1f1c'] not in"),
    ("overlap_pp_p2p", "1f1b", "overlap_pp_p2p='1f1b': must be a tuple of names"),
    ("eager_parts", ("rope",), "['rope'] not in ['glu', 'norm_input_cast', 'fp32_cross_entropy', "
                               "'fp8_amax_casts', 'separate_scale_mask', "
                               "'tp_replicated_qk_norm']"),
    ("fusion", "jit", "fusion='jit': must be one of ['eager', 'compile', 'fused']"),
    ("cp_attention", {"rign": "masked"}, "key 'rign' is not one of ['ring', 'ulysses', "
                                         "'allgather'] (did you mean 'ring'?)"),
    ("zero1_partition", None, "zero1_partition=None: must be one of ['flat', 'per_tensor']"),
])
def test_each_bad_cost_value_is_named_with_its_rule(field, value, expected):
    msg = _refusal(lambda: _cost(field, value))
    assert expected in msg, msg
    assert "1 problem, with its fix" in msg, msg


def test_nan_step_cost_no_longer_reaches_the_cost_model():
    _refusal(lambda: MEGA.with_costs({"step_fixed_s": "x"}, step_fixed_s=float("nan")))
    assert _cost("step_fixed_s", 0.25).step_fixed_s == 0.25
    assert isinstance(_cost("step_fixed_s", 1).step_fixed_s, float)


def test_dataclasses_replace_is_checked_like_with_costs():
    msg = _refusal(lambda: dataclasses.replace(MEGA, step_fixed_s="1"))
    assert "step_fixed_s='1'" in msg
    msg = _refusal(lambda: dataclasses.replace(MEGA, zero_stages=(0, 4), schedules=("1F1B",)))
    assert "zero_stages=(0, 4): [4] not in [0, 1, 2, 3]" in msg
    assert "(did you mean '1f1b'?)" in msg
    msg = _refusal(lambda: dataclasses.replace(MEGA, sequence_parallel=()))
    assert "sequence_parallel=(): must name at least one of [True, False]" in msg
    msg = _refusal(lambda: dataclasses.replace(MEGA, overlaps_ep_comm=("dualpipev",)))
    assert "['dualpipev'] not among the schedules it runs" in msg


def test_lists_become_tuples_and_the_profile_stays_hashable():
    p = MEGA.with_costs({"overlap_pp_p2p": "t", "eager_parts": "t"},
                        overlap_pp_p2p=["1f1b"], eager_parts=["glu"])
    assert p.overlap_pp_p2p == ("1f1b",) and p.eager_parts == ("glu",)
    q = MEGA.with_costs({"overlap_pp_p2p": "t", "eager_parts": "t"},
                        overlap_pp_p2p=("1f1b",), eager_parts=("glu",))
    assert hash(p) == hash(q) and p == q
    r = dataclasses.replace(MEGA, zero_stages=[0, 1])
    assert r.zero_stages == (0, 1)
    assert _cost("sync_grad_bucket_elements", 5e8).sync_grad_bucket_elements == 500_000_000


def test_a_change_without_source_says_how_to_give_one():
    msg = _refusal(lambda: MEGA.with_costs({}, overlap_tp_comm=True))
    assert ("overlap_tp_comm needs a source: with_costs({'overlap_tp_comm': 'where this value "
            "comes from'}, overlap_tp_comm=True)") in msg, msg
    assert "fusion" not in msg      # no list of every cost field for a missing source
    msg = _refusal(lambda: MEGA.with_costs({"fusion": "  "}, fusion="eager"))
    assert "fusion needs a source" in msg


def test_non_cost_fields_and_misspelt_names_are_named():
    msg = _refusal(lambda: MEGA.with_costs({"schedules": "x", "overlap_tp_com": "y"},
                                           schedules=("1f1b",), fusoin="fused"))
    assert "schedules is a capability, not a cost field; fix: dataclasses.replace(" in msg
    assert "fusoin is not a field of FrameworkProfile (did you mean 'fusion'?)" in msg
    assert "sources has 'overlap_tp_com', which is not a cost field (did you mean " \
           "'overlap_tp_comm'?)" in msg
    assert "3 problems, each with its fix" in msg
    msg = _refusal(lambda: MEGA.with_costs("because", fusion="eager"))
    assert "sources='because': must be a mapping" in msg


def test_one_error_lists_every_problem():
    msg = _refusal(lambda: MEGA.with_costs(
        {f: "t" for f in ("step_fixed_s", "optimizer_step_bytes", "zero1_group_size",
                          "sync_grad_bucket_elements", "grad_reduce_bytes")},
        step_fixed_s=-5, optimizer_step_bytes=-1, zero1_group_size=0,
        sync_grad_bucket_elements=-1, grad_reduce_bytes=3))
    assert "5 problems, each with its fix" in msg
    for text in ("step_fixed_s=-5", "optimizer_step_bytes=-1", "zero1_group_size=0",
                 "sync_grad_bucket_elements=-1", "grad_reduce_bytes=3"):
        assert f"\n  - {text}:" in msg, msg
    assert msg.count("; fix: e.g. ") == 5


def test_missing_capability_and_cost_sources_at_construction():
    kwargs = {f.name: getattr(MEGA, f.name) for f in dataclasses.fields(FrameworkProfile)}
    msg = _refusal(lambda: FrameworkProfile(**{**kwargs, "sources": {
        **MEGA.sources, "zero_stages": ""}}))
    assert "zero_stages needs a source: sources={..., 'zero_stages':" in msg
    msg = _refusal(lambda: FrameworkProfile(**{**kwargs, "cost_sources": {
        k: v for k, v in MEGA.cost_sources.items() if k != "fusion"}}))
    assert "fusion needs a source: cost_sources={..., 'fusion':" in msg
    msg = _refusal(lambda: FrameworkProfile(**{**kwargs, "sources": {
        **MEGA.sources, "zero_stage": "typo"}}))
    assert "sources has 'zero_stage', which is not a field it sources (did you mean " \
           "'zero_stages'?)" in msg


def test_the_kernel_names_are_one_tuple():
    from autopar.cost import params
    assert params.ATTENTION_KERNELS is ATTENTION_KERNELS
    for p in PROFILES.values():
        assert set(p.attention_kernels.values()) <= set(ATTENTION_KERNELS)


_ANY = st.one_of(st.none(), st.booleans(), st.integers(-10, 10 ** 12),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                 st.lists(st.sampled_from(SCHEDULES + ("glu", "x")), max_size=3),
                 st.dictionaries(st.sampled_from(["*", "hopper", "ring", 3]),
                                 st.sampled_from(ATTENTION_KERNELS + ("masked", "nope")),
                                 max_size=2))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(field=st.sampled_from(COST_FIELDS), value=_ANY)
def test_any_cost_value_is_accepted_valid_or_refused_as_our_error(field, value):
    try:
        p = _cost(field, value)
    except InvalidTrainingConfig as e:
        assert field in str(e) and "fix" in str(e)
        return
    got = getattr(p, field)
    hash(p)
    assert dataclasses.replace(p) == p          # what was accepted passes the checks again
    if isinstance(got, float):
        assert math.isfinite(got) and got >= 0
    if isinstance(value, list):
        assert got == tuple(value)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_step_fixed_s_accepted_exactly_when_finite_and_non_negative(x):
    ok = math.isfinite(x) and x >= 0
    try:
        p = _cost("step_fixed_s", x)
    except InvalidTrainingConfig:
        assert not ok
    else:
        assert ok and p.step_fixed_s == x


@settings(max_examples=200, deadline=None, derandomize=True)
@given(field=st.sampled_from(MemoryConventions.field_names()), value=_ANY)
def test_memory_conventions_accept_only_whole_byte_counts(field, value):
    try:
        m = dataclasses.replace(TORCH_MEMORY, **{field: value})
    except InvalidTrainingConfig as e:
        assert field in str(e) and "fix" in str(e)
        return
    got = getattr(m, field)
    assert got is None or (type(got) is int and got >= 0)


def test_memory_conventions_messages():
    msg = _refusal(lambda: dataclasses.replace(TORCH_MEMORY, loss_work_bytes=float("nan")))
    assert "loss_work_bytes=nan: must be a whole number >= 0 (bytes per logit element)" in msg
    msg = _refusal(lambda: dataclasses.replace(TORCH_MEMORY, weight_bytes="2"))
    assert "weight_bytes='2': must be None (the training dtype's bytes) or a whole number " \
           ">= 1 (bytes per parameter)" in msg
    msg = _refusal(lambda: dataclasses.replace(TORCH_MEMORY, pp_unsharded_forward_bytes=8))
    assert "pp_unsharded_forward_bytes=8: must be <= pp_unsharded_bytes=4" in msg
    msg = _refusal(lambda: MemoryConventions())
    assert "need sources: sources={..., 'weight_bytes':" in msg


def test_attention_kernel_keys_are_architectures():
    with pytest.raises(InvalidTrainingConfig, match="did you mean .hopper."):
        get_profile("torch").with_costs({"attention_kernels": "t"},
                                        attention_kernels={"*": "fa2", "Hopper": "fa3"})
    ok = get_profile("torch").with_costs({"attention_kernels": "t"},
                                         attention_kernels={"*": "fa2", "hopper": "fa3"})
    assert ok.attention_kernel("hopper") == "fa3" and ok.attention_kernel("ampere") == "fa2"


def test_placements_must_order_every_mesh_dimension():
    kwargs = {f.name: getattr(MEGA, f.name) for f in dataclasses.fields(FrameworkProfile)}
    msg = _refusal(lambda: FrameworkProfile(**{**kwargs, "placements": (("tp", "dp", "pp"),)}))
    assert "placements=(('tp', 'dp', 'pp'),): [('tp', 'dp', 'pp')] not an order of all of " \
           "['tp', 'cp', 'dp', 'pp']" in msg
    assert "fix: e.g. placements=(('tp', 'cp', 'dp', 'pp'),)" in msg
    p = FrameworkProfile(**{**kwargs, "placements": [["tp", "cp", "pp", "dp"]]})
    assert p.placements == (("tp", "cp", "pp", "dp"),)
