"""ZeRO-1 by whole tensors (InternEvo's hybrid ZeRO): the partition and what the cost model reads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.cost.zero1 import greedy_shares, owners
from autopar.errors import InvalidParallelConfig
from autopar.frameworks import get_profile


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10**9), min_size=1, max_size=40), st.integers(1, 64))
def test_greedy_shares_conserve_elements_and_bound_the_largest(sizes, ranks):
    shares = greedy_shares(tuple(sizes), ranks)
    assert len(shares) == ranks
    assert sum(shares) == sum(sizes)
    # no share is below the largest tensor's, nor (LPT) above the mean plus the largest tensor
    assert max(sizes) <= max(shares) <= sum(sizes) / ranks + max(sizes)
    assert owners(tuple(sizes), ranks) == min(ranks, len(sizes))


def test_greedy_shares_deal_largest_first_to_the_least_loaded_rank():
    # InternEvo c18bec9 _partition_param_list: sorted by numel descending, argmin (first) rank
    assert greedy_shares((1, 5, 3, 4), 2) == (6, 7)
    assert greedy_shares((2, 2), 3) == (2, 2, 0)
    with pytest.raises(InvalidParallelConfig, match="at least one rank"):
        greedy_shares((1,), 0)
    with pytest.raises(InvalidParallelConfig, match="sizes"):
        greedy_shares((-1,), 2)


def _estimate(partition, dp):
    prof = get_profile("torch").with_costs(
        {"zero1_param_sync": "t", "zero1_partition": "t"},
        zero1_param_sync="broadcast", zero1_partition=partition)
    train = autopar.TrainingConfig(global_batch_size=dp, seq_len=512)
    graph = model_graph("tiny-llama", train)[0]
    cm = CostModel(graph, autopar.Cluster.from_spec(f"{dp // 8}x8xA100-80GB"), train,
                   framework=prof)
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=dp, zero_stage=1, micro_batch_size=1)
    c = cm.resolve(cfg)
    layers = cm.stage_layout(c)[0].layers
    return cm, c, layers, cm.estimate(cfg)


def test_per_tensor_zero1_paces_the_step_on_the_largest_tensor_and_caps_the_broadcasts():
    cm, c, layers, per_tensor = _estimate("per_tensor", 256)
    psi = cm.stage_layout(c)[0].params
    tensors = sum(1 for i in layers for o in cm.graph.layers[i].ops if o.num_parameters > 0)
    biggest = max(o.num_parameters for i in layers for o in cm.graph.layers[i].ops)
    assert tensors < 256
    largest, holders = cm.zero1_split(c, layers, psi)
    assert holders == tensors and largest == biggest > psi / 256
    _, _, _, flat = _estimate("flat", 256)
    # the optimizer step runs on the embedding's share, not on psi / 256
    assert per_tensor.time_breakdown.optimizer == pytest.approx(
        flat.time_breakdown.optimizer * biggest / (psi / 256), rel=1e-9)
    # fewer broadcasts (one per rank holding tensors), each paying the 256-rank chain latency
    assert per_tensor.time_breakdown.dp_comm_exposed < flat.time_breakdown.dp_comm_exposed


def _bucketed(elements, spec="2x8xA100-80GB"):
    prof = get_profile("torch").with_costs(
        {"sync_grad_bucket_elements": "t"}, sync_grad_bucket_elements=elements)
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=512)
    graph = model_graph("tiny-llama", train)[0]
    cm = CostModel(graph, autopar.Cluster.from_spec(spec), train, framework=prof)
    c = cm.resolve(autopar.ParallelConfig(tp=1, pp=1, dp=16, zero_stage=0, micro_batch_size=1))
    st_ = cm.stage_layout(c)[0]
    return cm, c, st_


def test_sync_buckets_hide_each_bucket_only_behind_the_next_and_expose_the_last():
    # InternEvo c18bec9 _reduce_and_copy: torch.cuda.synchronize() before each bucket; step()
    # reduces the last bucket after backward
    cm, c, st_ = _bucketed(10**15)
    dp_g = cm.group("dp", c)
    # one bucket holds every gradient: all of it is reduced after backward
    assert cm.sync_bucket_exposed_s(c, st_.layers, "all_reduce", 2, 0.8) == pytest.approx(
        dp_g.time("all_reduce", st_.params * 2), rel=1e-12)
    cm, c, st_ = _bucketed(st_.params // 8)
    hidden = cm.sync_bucket_exposed_s(c, st_.layers, "all_reduce", 2, 0.8)
    bare = cm.sync_bucket_exposed_s(c, st_.layers, "all_reduce", 2, 0.0)
    assert 0 < hidden < bare
    # the estimate charges it: the last bucket's reduction at least
    assert cm.estimate(c).time_breakdown.dp_comm_exposed >= hidden > 0
