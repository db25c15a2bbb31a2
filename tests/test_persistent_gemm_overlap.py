"""Persistent GEMMs beside a collective (issue 25, Hopper torch FSDP runs predicted fast): on Hopper
a library GEMM launches one CTA per SM (CUTLASS PersistentTileSchedulerSm90), so the SMs an NCCL
collective holds push part of its grid into a second wave and the GEMM takes twice as long while
the collective is in flight (autopar/hardware/nccl.py ``gemm_share_taken``); the data-parallel
overlap slowdown mixes that with the SM share of the other kernels (``mixed_share``)."""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar.cost.model import CostModel
from autopar.hardware import get_device
from autopar.hardware.nccl import compute_share_taken, gemm_share_taken, mixed_share


def test_a_persistent_gemm_runs_in_two_waves_beside_any_collective():
    h100, a100 = get_device("H100-SXM5-80GB"), get_device("A100-SXM4-80GB")
    # 132 CTAs with 24 SMs held: 108 run, 24 wait for a second wave -> twice the time
    assert gemm_share_taken(h100, 24) == pytest.approx(0.5)
    assert gemm_share_taken(h100, 2) == pytest.approx(0.5)
    # Ampere's cuBLAS GEMMs launch a CTA per tile: only the SM share (compute_share_taken)
    assert gemm_share_taken(a100, 24) == 0.0
    assert gemm_share_taken(h100, 0) == 0.0
    assert gemm_share_taken(dataclasses.replace(h100, sm_count=0), 24) == 0.0
    # a custom device named as nothing known, declared Hopper, is persistent too
    custom = dataclasses.replace(h100, name="MyCloud-GPU", arch="hopper")
    assert gemm_share_taken(custom, 24) == pytest.approx(0.5)


def test_mixed_share_stretches_each_part_of_the_compute_by_its_own_rate():
    assert mixed_share(0.0, 0.5, 0.2) == pytest.approx(0.2)
    assert mixed_share(1.0, 0.5, 0.2) == pytest.approx(0.5)
    # half the seconds at half rate, half at 0.8: 0.5 x 2 + 0.5 x 1.25 = 1.625 times as long
    assert mixed_share(0.5, 0.5, 0.2) == pytest.approx(1 - 1 / 1.625)
    for bad in ((-0.1, 0.5, 0.2), (1.1, 0.5, 0.2), (0.5, 1.0, 0.2), (0.5, 0.5, -0.1)):
        with pytest.raises(ValueError):
            mixed_share(*bad)


@pytest.fixture(scope="module")
def fsdp_8b(preset_cost_model):
    cm = preset_cost_model("llama3-8b", "1x8xH100-SXM5-80GB", global_batch_size=8, seq_len=4096,
                           framework="torchtitan", micro_batch_size=1)
    return cm.cluster, cm.train, cm.graph


def test_layer_gemm_seconds_are_its_matmuls_forward_seconds(fsdp_8b):
    _, train, graph = fsdp_8b
    cm = CostModel(graph, autopar.Cluster.from_spec("1x8xH100-SXM5-80GB"), train)
    block = next(i for i, layer in enumerate(graph.layers) if layer.kind == "block")
    lt = cm.blocks_cost.layer_time(block, 1, 1, 1, False)
    matmuls = sum(t for op, t in zip(graph.layers[block].ops, lt.op_fwd_s) if op.kind == "matmul")
    assert lt.gemm_fwd_s == pytest.approx(matmuls, rel=1e-12)
    assert 0.0 < lt.gemm_fwd_s < lt.fwd_s


def test_fsdp_on_hopper_pays_the_gemm_waves_beside_its_collectives(fsdp_8b):
    cluster, train, graph = fsdp_8b
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=8, zero_stage=3, recompute="none",
                                 micro_batch_size=1)
    cm = CostModel(graph, cluster, train)
    e = cm.estimate(cfg)
    tb = e.time_breakdown
    group = cm.group("dp", e.config)
    layers = tuple(range(len(graph.layers)))
    share = cm.dp.overlap_share(e.config, layers, group)
    sm = compute_share_taken(cluster.device, "nvlink", 8)
    assert cm.comm_share(group) == pytest.approx(sm)
    # the mix lies between the SM share (no GEMMs) and the GEMM's second wave (all GEMMs)
    assert sm < share < 0.5
    edge_comm, _ = cm.dp.zero3_edges_s(e.config, 0, train.dtype_bytes, cm.reduce_bytes)
    hidden = e.link_comm("nvlink").seconds - edge_comm
    assert tb.overlap_slowdown == pytest.approx(share * hidden, rel=1e-9)
    # the same GPU with non-persistent GEMMs pays the SM share alone (its other ceilings are
    # Ampere's too, so only the slowdown is compared)
    ampere_like = dataclasses.replace(cluster, device=dataclasses.replace(
        cluster.device, name="MyCloud-GPU", arch="ampere"))
    e0 = CostModel(graph, ampere_like, train).estimate(cfg)
    hidden0 = e0.link_comm("nvlink").seconds - edge_comm
    assert e0.time_breakdown.overlap_slowdown == pytest.approx(sm * hidden0, rel=1e-9)
