"""``autopar calibrate --check`` (issue 27, item 5): measured bus bandwidth per link and
collective against the catalogue and published nccl-tests runs; short links flagged; what they
cost a plan. End to end on gloo (4 forked ranks as 2 "nodes" of 2) with the inter-node link
made slow on purpose."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import pytest
import torch
import torch.distributed as dist

import autopar
from autopar.calibrate import load_calibration
from autopar.calibrate import comm_bench
from autopar.calibrate.check import CHECK_OPS, check_links, plan_cost
from autopar.calibrate.fit import predicted_seconds
from autopar.calibrate.schema import (Calibration, CollectiveSample, DeviceInfo, World,
                                      measured_fields)
from autopar.cli import main
from autopar.errors import InvalidCalibration
from autopar.hardware.comm_params import CommParams
from autopar.hardware.devices import Device
from autopar.hardware.links import LINK_KINDS, LinkType
from autopar.hardware.nccl_tests import (PUBLISHED, PUBLISHED_TOLERANCE, catalog_ratio,
                                         healthy_floor)

from test_runtime import run_ranks

A100 = autopar.Cluster.from_spec("2x8xA100-80GB")
SIZES = (2 ** 20, 2 ** 24, 2 ** 28, 2 ** 30, 2 ** 33)


def _cal(slow_inter: float = 1.0, slow_intra: float = 1.0) -> Calibration:
    """A calibration of 2 x 8 A100 whose collectives take what the catalogue predicts, times
    the given slowdowns."""
    coll = []
    for scope, n, nodes, slow in (("intra", 8, 1, slow_intra), ("inter", 2, 2, slow_inter)):
        for op in CHECK_OPS:
            for nb in SIZES:
                s = CollectiveSample(op, scope, n, nodes, nb, 1.0)
                coll.append(dataclasses.replace(s, seconds=predicted_seconds(A100, s) * slow))
    return Calibration("2026-12-06T00:00:00Z", "2.9.0", "nccl",
                       DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", 85e9),
                       World(16, 8, 2), None, 1, "bf16", measured_fields((), (), None, coll),
                       (), (), None, tuple(coll))


def test_published_runs_against_the_catalogue():
    # the 8 x A100 NVSwitch run (Azure) sits at 0.965 of the model's ring at 8 GiB
    a100 = next(r for r in PUBLISHED if r.spec == "1x8xA100-40GB")
    assert catalog_ratio(a100) == pytest.approx(231.6e9 / 240e9, rel=0.01)
    # the floor is the lowest healthy ratio near the size: 0.97 at 8 GiB, lower at 256 MiB
    # (32 p5 nodes, where NCCL's curve bends below the model's)
    f8, row8 = healthy_floor(2 ** 33)
    f256, row256 = healthy_floor(2 ** 28)
    assert row8 is a100 and f8 == catalog_ratio(a100)
    assert row256.spec.startswith("32x8xH100") and 0.5 < f256 < f8
    # below the smallest published size the smallest size's floor is taken
    assert healthy_floor(2 ** 14) == healthy_floor(2 ** 25)
    assert 0.95 < PUBLISHED_TOLERANCE < 0.96


def test_a_healthy_cluster_passes_and_a_slow_network_is_flagged():
    ok = check_links(_cal())
    assert not ok.short and all(v.ratio == pytest.approx(1.0) for v in ok.verdicts)
    # the node's all_reduce at 8 GiB is set beside the published 8 x A100 run
    ar = next(v for v in ok.verdicts if v.scope == "intra" and v.op == "all_reduce")
    assert ar.published.busbw_Bps == 231.6e9 and ar.published_ratio == pytest.approx(240 / 231.6, rel=1e-3)
    slow = check_links(_cal(slow_inter=3.0))
    assert {(v.scope, v.op) for v in slow.short} == {("inter", op) for op in CHECK_OPS}
    assert all("0.33 of the catalogue's" in v.short for v in slow.short)
    # a user's threshold replaces the published floor
    assert not check_links(_cal(slow_inter=3.0), threshold=0.3).short
    with pytest.raises(InvalidCalibration, match="in \\(0, 1\\]"):
        check_links(_cal(), threshold=1.5)


def test_below_the_published_run_of_the_same_node_is_flagged():
    # 0.98 of the catalogue passes the floor at 8 GiB (0.965) and the published comparison
    # (0.98 x 240 / 231.6 = 1.02)
    assert not check_links(_cal(slow_intra=1 / 0.98)).short
    # 0.93 of the published 231.6 GB/s is below the health check's 0.953, with a user threshold
    # that lets the catalogue comparison pass
    r = check_links(_cal(slow_intra=240 / (0.93 * 231.6)), threshold=0.5)
    (v,) = r.short
    assert v.op == "all_reduce" and "of the published 231.6 GB/s" in v.short


def test_the_cost_of_a_slow_network_on_a_plan(tmp_path):
    plan = autopar.optimize("llama3-8b", A100, autopar.TrainingConfig(64, 2048))
    same = plan_cost(plan, _cal())
    assert same.measured_step_s == pytest.approx(same.catalog_step_s, rel=0.02)
    slow = plan_cost(plan, _cal(slow_inter=10.0))
    assert slow.catalog_step_s == pytest.approx(same.catalog_step_s)
    assert slow.measured_step_s > 1.05 * slow.catalog_step_s


def test_cli_check_of_a_file_prints_flags_and_step_times(tmp_path, capsys):
    cal, plan = tmp_path / "cal.json", tmp_path / "plan.json"
    _cal(slow_inter=10.0).to_json(cal)
    assert main(["plan", "--model", "llama3-8b", "--cluster", "2x8xA100-80GB", "--global-batch",
                 "64", "--seq-len", "2048", "--out", str(plan)]) == 0
    capsys.readouterr()
    # exit code 1: a link is short (as a health check's failure)
    assert main(["calibrate", "--check", "--calibration", str(cal), "--plan", str(plan)]) == 1
    text = capsys.readouterr().out
    assert text.count("SHORT") == 4 and "short: inter-node all_reduce at 8 GiB" in text
    assert "with the catalogue's links" in text and "231.6 GB/s at 8 GiB" in text
    assert main(["calibrate", "--check", "--calibration", str(cal), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert len([v for v in data["verdicts"] if v["short"]]) == 4 and data["cost"] is None
    assert main(["calibrate", "--model", "tiny-llama"]) == 2
    assert "needs --model and --out (or --check)" in capsys.readouterr().err
    _cal().to_json(cal)
    assert main(["calibrate", "--check", "--calibration", str(cal)]) == 0
    assert main(["calibrate", "--model", "x", "--out", "y", "--threshold", "0.5"]) == 2
    assert "belong to --check" in capsys.readouterr().err


# ------------------------------------------------------------------ end to end on gloo
#: The slowed link's extra time per call: a 40 ms sleep at the 256 KiB the test measures
#: (a 6.6 MB/s link), against about 1 ms for gloo's own call on this machine.
SIZE = 2 ** 18
DELAY_S = 0.4


def _slow_inter(op_call):
    """``comm_bench._op_call`` whose collectives over groups spanning both "nodes" (ranks
    {0, 1} and {2, 3}) sleep ``nbytes / SIZE x DELAY_S`` after each call: a slow network.
    (A sleep proportional to the call's own time would feed back: the call includes the wait
    for the peers' sleep.)"""
    def call(op, nbytes, n, group, rank_in, pair_peer, device):
        fn = op_call(op, nbytes, n, group, rank_in, pair_peer, device)
        ranks = dist.get_process_group_ranks(group)
        if fn is None or len({r // 2 for r in ranks}) < 2:
            return fn

        def slow():
            fn()
            time.sleep(nbytes / SIZE * DELAY_S)
        return slow
    return call


def _check_worker(rank, world, store_path, out_path):
    torch.set_num_threads(1)
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    comm_bench._op_call = _slow_inter(comm_bench._op_call)  # this forked rank only
    # two calls per timing: 7 calls per op (one warm-up, 3 x 2 timed), so the long sleep that
    # keeps the verdict clear of a loaded machine's jitter costs about 11 s in all
    comm_bench.MAX_ITERS = 2
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    try:
        assert main(["calibrate", "--check", "--out", out_path, "--min-bytes", str(SIZE),
                     "--max-bytes", str(SIZE), "--budget", "600"]) == 0
    finally:
        dist.destroy_process_group()


def _reference(cal: Calibration) -> autopar.Cluster:
    """The cluster a CPU's links are held against (a CPU has no catalogue row): both links of
    the bandwidth at which an all_gather of the measured size would take twice the slowest
    measured intra-node collective, no latencies: every intra-node op is predicted at least
    twice that slowest time, far above the floor; the slowed link's ratio is at most 4 x that
    slowest time / DELAY_S, short (below the 0.59 floor at 256 KiB) unless gloo took over 59 ms,
    about 60x its usual time here (a margin for a loaded 2-core machine)."""
    t = max(c.seconds for c in cal.collectives if c.scope == "intra")
    bw = SIZE / 2 / (2 * t)
    link = LinkType("gloo-ref", "ethernet", bw, 0.0, "test reference")
    dev = Device(name="measured-cpu", peak_flops={"fp32": 1e11}, memory_bytes=1e10,
                 hbm_bandwidth_Bps=1e10, nvlink_bandwidth_Bps=0.0, pcie_bandwidth_Bps=1e12,
                 form_factor="pcie", source="test")
    comm = CommParams(efficiency={k: 1.0 for k in LINK_KINDS}, launch_latency_s=0.0)
    return autopar.Cluster(2, 2, dev, dataclasses.replace(link, kind="pcie"), link, 2,
                           "2x2xgloo", comm)


def test_check_on_gloo_flags_the_slowed_link(tmp_path, capsys):
    out = tmp_path / "links.json"
    run_ranks(4, _check_worker, str(out))
    cal = load_calibration(out)
    assert cal.world == World(4, 2, 2) and cal.backend == "gloo" and not cal.gemm
    # 4 ops x (the node's pair, the rails), one size
    assert sorted((c.scope, c.op, c.nbytes) for c in cal.collectives) == sorted(
        (s, op, SIZE) for s in ("intra", "inter") for op in CHECK_OPS)
    report = check_links(cal, _reference(cal))
    # exactly the slowed link's ops are short; the node's own ops are held against a reference
    # built from their slowest time, so none of them is (their ratios, about 2 to 14 here, are
    # not asserted one by one: one fell below 2 once in CI on a loaded 2-core machine)
    assert {(v.scope, v.op) for v in report.short} == {("inter", op) for op in CHECK_OPS}
    # the CLI on a CPU with no --cluster says so instead of comparing
    assert main(["calibrate", "--check", "--calibration", str(out)]) == 0
    assert "has no catalogue row" in capsys.readouterr().out
