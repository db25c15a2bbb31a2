"""The compiled timing of pipeline orders equals the event replay exactly (not approximately)."""

from hypothesis import given, settings, strategies as st

from autopar.cost.pipeline.orders import ORDERED, check_order_args, rank_orders
from autopar.cost.pipeline.replay import replay
from autopar.cost.pipeline.schedule import simulate_pipeline
from autopar.cost.pipeline.timed_orders import compiled_orders, compiled_simulation, timed_step

times = st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(name=st.sampled_from(ORDERED), pp=st.integers(1, 6), m=st.integers(1, 20),
       v=st.integers(1, 3), data=st.data())
def test_compiled_order_equals_replay(name, pp, m, v, data):
    if name in ("zbv-zero-bubble", "dualpipev"):
        v = 2
    elif name in ("gpipe", "1f1b"):
        v = 1
    try:
        check_order_args(name, pp, m, v)
    except ValueError:
        return
    per_rank = st.lists(times, min_size=pp, max_size=pp).map(tuple)
    fwd, inp, wgt = data.draw(per_rank), data.draw(per_rank), data.draw(per_rank)
    overlap = data.draw(st.one_of(st.none(), per_rank))
    want, _ = replay(rank_orders(name, pp, m, v), pp * v, name, fwd, inp, wgt, overlap)
    got = timed_step(compiled_orders(name, pp, m, v), fwd, inp, wgt, overlap)
    assert got == want


@settings(max_examples=100, deadline=None, derandomize=True)
@given(name=st.sampled_from(("1f1b", "gpipe")), pp=st.integers(1, 8), m=st.integers(1, 24),
       data=st.data())
def test_compiled_simulation_equals_simulate_pipeline(name, pp, m, data):
    per_rank = st.lists(times, min_size=pp, max_size=pp).map(tuple)
    fwd, bwd = data.draw(per_rank), data.draw(per_rank)
    got = timed_step(compiled_simulation(name, pp, m), fwd, bwd, (0.0,) * pp)
    assert got == simulate_pipeline(fwd, bwd, m, name)


def test_compiled_orders_reject_what_torch_rejects():
    import pytest
    with pytest.raises(ValueError):
        compiled_orders("zbv-zero-bubble", 4, 8, 3)
    with pytest.raises(ValueError):
        compiled_simulation("dualpipev", 4, 8)
