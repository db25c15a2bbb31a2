"""Compute slowed by the data-parallel collectives it overlaps (issue 13): NCCL's thread blocks
hold SMs while a collective is in flight (autopar/hardware/nccl.py), and the compute beside it
runs on the rest (autopar.cost.comm.overlapped_comm)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar
from autopar.api import model_graph
from autopar.cost.comm import overlapped_comm
from autopar.cost.model import CostModel
from autopar.errors import InvalidClusterSpec
from autopar.hardware import get_device
from autopar.hardware.nccl import collective_ctas, compute_share_taken, local_nics

times = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(comm=times, window=times, share=st.floats(min_value=0.0, max_value=0.5))
def test_overlap_ends_when_the_slowed_compute_or_the_collective_ends(comm, window, share):
    exposed, slow = overlapped_comm(comm, window, share)
    assert exposed >= 0 and slow >= 0
    if window > 0 and comm > 0:
        # both end at max(comm, window + share x comm): compute ran beside the collective at
        # 1 - share of its rate, then alone
        end = comm if comm * (1 - share) >= window else window + share * comm
        assert window + exposed + slow == pytest.approx(end, rel=1e-9, abs=1e-12)
    # no share: the ideal overlap; a larger share never costs less
    assert overlapped_comm(comm, window, 0.0) == (max(0.0, comm - window), 0.0)
    assert sum(overlapped_comm(comm, window, min(0.5, share + 0.1))) >= exposed + slow - 1e-12


def test_overlapped_comm_refuses_bad_input():
    with pytest.raises(ValueError):
        overlapped_comm(-1.0, 1.0, 0.1)
    with pytest.raises(ValueError):
        overlapped_comm(1.0, 1.0, 1.0)


def test_ctas_follow_nccl_channel_counts():
    # a DGX with 8 NICs: 16 SMs (NVIDIA/nccl #689); one NIC: 2; NVSwitch node: 24 channels
    assert collective_ctas("infiniband", 8) == 16
    assert collective_ctas("roce", 1) == 2
    assert collective_ctas("infiniband", 0.5) == 2
    assert collective_ctas("infiniband", 64) == 32   # NCCL MAXCHANNELS
    assert collective_ctas("nvlink", 8) == 24
    assert collective_ctas("local", 0) == 0
    with pytest.raises(InvalidClusterSpec, match="fix"):
        collective_ctas("carrier-pigeon", 1)
    with pytest.raises(InvalidClusterSpec, match="nics_per_node"):
        collective_ctas("infiniband", 0)


def test_share_is_ctas_over_the_gpu_sms():
    a100, h100 = get_device("A100-SXM4-80GB"), get_device("H100-SXM5-80GB")
    assert (a100.sm_count, h100.sm_count, get_device("H100-PCIe-80GB").sm_count) == (108, 132, 114)
    assert compute_share_taken(a100, "infiniband", 8) == pytest.approx(16 / 108)
    assert compute_share_taken(h100, "nvlink", 8) == pytest.approx(24 / 132)
    # an unknown SM count charges nothing
    assert compute_share_taken(dataclasses.replace(a100, sm_count=0), "infiniband", 8) == 0.0
    with pytest.raises(InvalidClusterSpec, match="sm_count"):
        dataclasses.replace(a100, sm_count=-1)


def test_a_group_uses_the_nics_local_to_its_ranks():
    # 8 GPUs and 4 NICs per node: NIC j on the PCIe switch of GPUs 2j and 2j + 1
    assert local_nics(tuple(range(16)), 8, 4) == 4            # a whole node's GPUs: every NIC
    assert local_nics(tuple(range(0, 16, 2)), 8, 4) == 4      # one TP rank of TP = 2: a GPU per NIC
    assert local_nics((0, 1, 2, 3, 8, 9, 10, 11), 8, 4) == 2  # half a node's switches
    assert local_nics(tuple(range(0, 32, 8)), 8, 4) == 1      # one GPU per node
    assert local_nics((0, 4, 8, 12), 8, 4) == 2
    # as many NICs as GPUs: one each; more NICs than GPUs: each GPU has its own several
    assert local_nics(tuple(range(0, 16, 2)), 8, 8) == 4
    assert local_nics((0, 8), 8, 16) == 2
    # NCCL keeps the fewest channels over the nodes (an uneven group)
    assert local_nics((0, 2, 4, 6, 8), 8, 4) == 1
    assert local_nics((0, 1), 8, 0) == 0
    with pytest.raises(InvalidClusterSpec, match="fix"):
        local_nics((), 8, 4)


def test_tp_peers_dp_groups_each_run_every_local_nic_channel():
    # under TP = 2 the DP group of one TP rank has 4 GPUs a node, one on each NIC's switch: its
    # communicator runs 2 channels per NIC (8 CTAs) though it gets half the NICs' bandwidth
    cluster = autopar.Cluster.from_spec("4x8xA100-80GB+4xroce-100g")
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=2048)
    graph, _ = model_graph("llama2-7b", train)
    cm = CostModel(graph, cluster, train)
    tp2 = cm.resolve(autopar.ParallelConfig(tp=2, dp=16))
    tp1 = cm.resolve(autopar.ParallelConfig(tp=1, dp=32))
    a100 = cluster.device
    assert cm.comm_share(cm.group("dp", tp2)) == pytest.approx(8 / a100.sm_count)
    assert cm.comm_share(cm.group("dp", tp1)) == pytest.approx(8 / a100.sm_count)
    tp8 = cm.resolve(autopar.ParallelConfig(tp=8, dp=4))
    assert cm.comm_share(cm.group("dp", tp8)) == pytest.approx(2 / a100.sm_count)


@pytest.fixture(scope="module")
def fsdp_70b(preset_cost_model):
    cm = preset_cost_model("llama2-70b", "8x8xA100-80GB", global_batch_size=128, seq_len=4096,
                           framework="torchtitan", micro_batch_size=2)
    return cm.cluster, cm.train, cm.graph


def test_fsdp_step_pays_the_slowdown_of_its_overlapped_collectives(fsdp_70b):
    cluster, train, graph = fsdp_70b
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=64, zero_stage=3, recompute="full",
                                 micro_batch_size=2)
    cm = CostModel(graph, cluster, train)
    e = cm.estimate(cfg)
    tb = e.time_breakdown
    assert tb.total == pytest.approx(e.step_time_s, rel=1e-12)
    # hidden behind compute but for each micro-batch's edges (the first gathers and last
    # reductions, nothing beside them: autopar.cost.dp.DataParallel.zero3_edges_s), the
    # collective time slows compute by the 16 of 108 SMs NCCL holds on an 8-NIC A100 node
    m = e.num_micro_batches
    edge_comm, edge_exposed = cm.dp.zero3_edges_s(e.config, 0, train.dtype_bytes,
                                                  cm.reduce_bytes)
    assert tb.dp_comm_exposed == pytest.approx(m * edge_exposed, rel=1e-9)
    assert tb.overlap_slowdown == pytest.approx(
        16 / 108 * (e.link_comm("infiniband").seconds - m * edge_comm), rel=1e-9)
    # a GPU of unknown SM count pays none, and is that much faster
    bare = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, sm_count=0))
    e0 = CostModel(graph, bare, train).estimate(cfg)
    assert e0.time_breakdown.overlap_slowdown == 0.0
    assert e.step_time_s - e0.step_time_s == pytest.approx(tb.overlap_slowdown, rel=1e-9)


def test_collectives_not_overlapped_slow_nothing(fsdp_70b):
    # Megatron-LM without --overlap-grad-reduce reduces after backward: exposed, no slowdown
    cluster, _, graph = fsdp_70b
    train = autopar.TrainingConfig(global_batch_size=128, seq_len=4096, framework="megatron",
                                   micro_batch_size=1)
    e = CostModel(graph, cluster, train).estimate(
        autopar.ParallelConfig(tp=8, pp=4, dp=2, zero_stage=1, recompute="full",
                               micro_batch_size=1))
    assert e.time_breakdown.overlap_slowdown == 0.0
    assert e.time_breakdown.dp_comm_exposed > 0.0
