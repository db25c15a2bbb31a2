"""AWS EFA link rows: line rates from the instance pages, latency and efficiency from published
nccl-tests runs (sources on the rows: autopar/hardware/links.py, comm_params.py)."""

import pytest

from autopar.hardware import Cluster
from autopar.hardware.comm_params import DEFAULT_COMM_PARAMS
from autopar.hardware.links import LINKS, NETWORK_KINDS
from autopar.hardware.nccl import collective_ctas
from benchmarks.records import _inter_link

MB = 2 ** 20


def _p5(nodes):
    return Cluster.from_spec(f"{nodes}x8xH100-SXM5-80GB+32xefa-v2-100g")


@pytest.mark.parametrize("name, Bps, nics, node_gbps", [
    ("efa-v1-100g", 12.5e9, 4, 400), ("efa-v2-100g", 12.5e9, 32, 3200),
    ("efa-v3-200g", 25e9, 16, 3200)])
def test_efa_rows_are_the_instance_line_rates(name, Bps, nics, node_gbps):
    link = LINKS[name]
    assert link.kind == "efa" and "efa" in NETWORK_KINDS
    assert link.bandwidth_Bps == Bps
    assert nics * link.bandwidth_Bps * 8 / 1e9 == node_gbps   # p4d 400, p5 / p5en 3,200 Gb/s


def test_efa_efficiency_is_the_measured_busbw_ratio():
    ratios = (79.25 / 93.75, 54.07 / 64.58, 49.63 / 56.25, 356.99 / 400, 355.36 / 400)
    assert DEFAULT_COMM_PARAMS.efficiency["efa"] == pytest.approx(sum(ratios) / 5, abs=0.005)


@pytest.mark.parametrize("spec, measured_us", [
    ("2x8xH100-SXM5-80GB+32xefa-v2-100g", 71.1),    # 2 x p5.48xlarge, 8 B-1 KB mean
    ("2x8xA100-SXM4-80GB+4xefa-v1-100g", 162.3)])   # 2 x p4de.24xlarge
def test_small_all_reduce_latency_reproduces_published_runs(spec, measured_us):
    t = Cluster.from_spec(spec).collective_time("all_reduce", 8, list(range(16)))
    assert t * 1e6 == pytest.approx(measured_us, rel=0.03)


@pytest.mark.parametrize("op, nodes, size_mb, algbw", [
    ("all_to_all", 2, 2048, 84.53), ("all_to_all", 4, 2048, 55.82),
    ("all_to_all", 8, 2048, 50.41), ("all_reduce", 4, 8192, 184.25),
    ("all_reduce", 8, 8192, 180.50)])
def test_large_messages_within_8_percent_of_p5_nccl_tests(op, nodes, size_mb, algbw):
    M = size_mb * MB
    t = _p5(nodes).collective_time(op, M, list(range(8 * nodes)))
    assert t == pytest.approx(M / (algbw * 1e9), rel=0.08)


def test_small_all_to_all_over_many_nodes_is_overpriced():
    """Known limit: the pairwise model charges one network latency per peer, so at 32 MB on
    8 nodes it is about twice the measured 1.15 ms (nccl_alltoall.csv)."""
    t = _p5(8).collective_time("all_to_all", 32 * MB, list(range(64)))
    assert 1.8 < t / (32 * MB / 29.13e9) < 2.4


def test_efa_collectives_hold_two_ctas_per_nic():
    assert collective_ctas("efa", 4) == 8


@pytest.mark.parametrize("text, expected", [
    ("32x 100 Gbps EFA per node (AWS p5.48xlarge, 3.2 Tbps)", ("efa-v2-100g", 32)),
    ("4x EFA 100 Gbps per node (rate from the p4d.24xlarge spec, not the blog)",
     ("efa-v1-100g", 4)),
    ("EFA 3200 Gbps per node (p5en.48xlarge)", ("efa-v3-200g", 16))])
def test_records_read_efa_text(text, expected):
    assert _inter_link(text, 8, 2, {}) == expected
