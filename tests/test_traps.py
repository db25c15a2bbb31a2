"""The interconnect traps practitioners fall into must show in autopar.estimate (issue 4)."""

from __future__ import annotations

import autopar

T = autopar.TrainingConfig
P = autopar.ParallelConfig


def _comm_share(e, *keys):
    return sum(getattr(e.time_breakdown, k) for k in keys) / e.step_time_s


def test_tp8_on_pcie_box_crawls():
    train = T(global_batch_size=64, seq_len=4096)
    cfg = P(tp=8, recompute="selective")
    pcie = autopar.estimate("llama2-13b", "1x8xA100-PCIe-80GB", train, cfg)
    sxm = autopar.estimate("llama2-13b", "1x8xA100-80GB", train, cfg)
    assert pcie.group_links.tp == "pcie" and sxm.group_links.tp == "nvlink"
    assert pcie.step_time_s > 2 * sxm.step_time_s
    assert _comm_share(pcie, "tp_comm") > 0.5 > _comm_share(sxm, "tp_comm")


def test_dp_across_nodes_on_slow_ethernet():
    train = T(global_batch_size=256, seq_len=4096)
    cfg = P(tp=8, pp=2, dp=2, zero_stage=1, recompute="full")
    eth = autopar.estimate("llama2-70b", "4x8xA100-80GB+1xeth-25g", train, cfg)
    ib = autopar.estimate("llama2-70b", "4x8xA100-80GB+8xib-hdr", train, cfg)
    assert eth.group_links.dp == "ethernet" and ib.group_links.dp == "infiniband"
    assert eth.step_time_s > 1.5 * ib.step_time_s
    assert eth.time_breakdown.dp_comm_exposed > ib.time_breakdown.dp_comm_exposed
    assert _comm_share(eth, "dp_comm_exposed", "pp_comm") > 0.3


def test_tp_spanning_two_nodes_vs_inside_one():
    train = T(global_batch_size=128, seq_len=4096)
    inside = autopar.estimate("llama2-70b", "2x8xA100-80GB", train,
                              P(tp=8, dp=2, zero_stage=3, recompute="full"))
    across = autopar.estimate("llama2-70b", "2x8xA100-80GB", train,
                              P(tp=8, dp=2, zero_stage=3, recompute="full",
                                placement=("dp", "tp", "cp", "pp")))
    assert inside.group_links.tp == "nvlink" and across.group_links.tp == "infiniband"
    assert across.time_breakdown.tp_comm > 1.5 * inside.time_breakdown.tp_comm
    assert across.step_time_s > inside.step_time_s
