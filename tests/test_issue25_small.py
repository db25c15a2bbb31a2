"""Issue 25 (small models over many GPUs): an all-reduce across more than 2 nodes is priced as
NCCL runs it, ring or tree, never a hierarchical ring of per-GPU shards (NCCL has no such
algorithm; the hierarchical stand-in is kept for 2 nodes, where NCCL's tree moves the same
bytes: src/graph/search.cc "increase bwIntra for trees (2 nodes or collnet)", tuning.cc
``nNodes <= 2 ? bwIntra``, NVIDIA/nccl-tests#196)."""

from __future__ import annotations

import pytest

from autopar.hardware import Cluster
from autopar.hardware import collectives as col

#: A tensor-parallel activation all-reduce of OneFlow DLPerf's MP_1x32x1 run: micro-batch 16 x
#: sequence 2048 x hidden 3072, fp16.
M = 16 * 2048 * 3072 * 2


def _group(spec: str):
    c = Cluster.from_spec(spec)
    ranks = tuple(range(c.world_size))
    return c, ranks, c._layout(ranks), c.fabric()


def test_no_hierarchical_all_reduce_beyond_two_nodes():
    for spec in ("3x8xA100-80GB", "4x8xV100-SXM2-16GB+1xib-edr", "8x8xH100+8xib-ndr"):
        _, _, g, f = _group(spec)
        assert [a for a, _ in col.algorithm_times("all_reduce", M, g, f)] == ["ring", "tree"]
    _, _, g, f = _group("2x8xV100-SXM2-16GB+1xib-edr")
    assert "hierarchical" in dict(col.algorithm_times("all_reduce", M, g, f))


def test_four_node_all_reduce_sends_the_rings_bytes_through_the_nic():
    # 4 nodes of 8 V100 with one EDR NIC each (12.5 GB/s, x the catalog's 0.86 efficiency =
    # 10.75 GB/s per node, 1.34 GB/s per GPU): a ring's node NIC carries 2(n-1)/n x M per
    # direction, so the all-reduce takes at least 2 x 31/32 x M / 10.75 GB/s = 36.2 ms
    c, ranks, g, f = _group("4x8xV100-SXM2-16GB+1xib-edr")
    node_bw = 8 * f.inter_per_gpu_Bps
    assert node_bw == pytest.approx(10.75e9)
    assert c.algorithm("all_reduce", M, ranks) == "ring"
    t = c.collective_time("all_reduce", M, ranks)
    assert t >= 2 * 31 / 32 * M / node_bw
    assert t == pytest.approx(0.03668, rel=1e-3)
    load = c.collective_load("all_reduce", M, ranks)
    assert load.inter_bytes == pytest.approx(2 * 31 / 32 * M / 8)
    # the hierarchical shard ring this replaces sent 2(N-1)/N x M per node (1.5 M, not 1.94 M)
    intra_s, inter_s, _ = col._hierarchical_parts("all_reduce", M, g, f)
    assert intra_s + inter_s < 0.9 * t


def test_two_node_all_reduce_keeps_the_tree_rate():
    # 2 nodes: NCCL's tree moves M per node and direction, the hierarchical stand-in's bytes
    c, ranks, g, f = _group("2x8xV100-SXM2-16GB+1xib-edr")
    assert c.algorithm("all_reduce", M, ranks) == "hierarchical"
    assert c.collective_time("all_reduce", M, ranks) == pytest.approx(0.02173, rel=1e-3)
    assert c.collective_load("all_reduce", M, ranks).inter_bytes == pytest.approx(M / 8)
