"""A dimension's groups are priced by the slowest of them, not rank 0's: where node boundaries
cut the groups unevenly (48-rank replicas on 2 x 72 GB200, 3-stage pipelines on 3 x 8 H100,
TP pairs on 7-GPU nodes), some group crosses the network and sets the link and the cost
(autopar/cost/groups.py ``Groups._worst``). Node-aligned meshes keep rank 0's group."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autopar.config import ParallelConfig
from autopar.cost.groups import Groups, all_groups
from autopar.hardware import Cluster, rank_groups

PROFILE = SimpleNamespace(zero1_group_size=None)


def _groups(spec):
    cl = Cluster.from_spec(spec)
    return cl, Groups(cl, PROFILE)


def test_48_rank_replica_on_two_nvl72_racks_crosses_infiniband():
    # ranks tp, cp, pp, dp: replica 1 is ranks 48-95, its stage 5 (ranks 68-71) sends to
    # stage 6 (72-75) on the other rack; rank 0's replica (0-47) stays on rack 0
    cl, g = _groups("2x72xGB200")
    c = ParallelConfig(tp=4, pp=12, dp=3, cp=1, placement=("tp", "cp", "pp", "dp"))
    pp = g.group("pp", c)
    assert pp.ranks == (68, 72)
    assert pp.link == "infiniband"
    assert g.links(c).pp == "infiniband"
    assert pp.time("send_recv", 1e8) == cl.collective_time("send_recv", 1e8, (68, 72))
    assert pp.time("send_recv", 1e8) > 10 * cl.collective_time("send_recv", 1e8, (0, 4))
    # TP groups of 4 never straddle a rack (72 = 18 x 4)
    assert g.group("tp", c).ranks == (0, 1, 2, 3) and g.links(c).tp == "nvlink"


def test_node_aligned_mesh_keeps_rank_zero_groups():
    # 36-rank replicas: two per rack, every group the same up to a shift by a rack
    cl, g = _groups("2x72xGB200")
    c = ParallelConfig(tp=4, pp=9, dp=4, cp=1, placement=("tp", "cp", "pp", "dp"))
    assert g.group("pp", c).ranks == (0, 4)
    assert g.group("pp", c).link == "nvlink"
    assert g.group("dp", c).ranks == (0, 36, 72, 108)
    assert g.group("tp", c).ranks == (0, 1, 2, 3)
    assert g.group("pp", c).time("send_recv", 1e8) == cl.collective_time("send_recv", 1e8, (0, 4))


def test_three_stage_pipelines_on_8_gpu_nodes():
    # pipelines {0,1,2}, {3,4,5}, {6,7,8}: the third hops from node 0 to node 1
    _, g = _groups("3x8xH100")
    c = ParallelConfig(tp=1, pp=3, dp=8, cp=1, placement=("tp", "cp", "pp", "dp"))
    assert g.group("pp", c).ranks == (7, 8)
    assert g.links(c).pp == "infiniband"


def test_tp_pairs_on_7_gpu_nodes():
    # TP pairs (6, 7) sit on nodes 0 and 1 of 7 GPUs each
    cl, g = _groups("4x7xA100")
    c = ParallelConfig(tp=2, pp=1, dp=14, cp=1)
    tp = g.group("tp", c)
    assert tp.ranks == (6, 7) and tp.link == cl.link_classes[1]
    assert tp.time("all_reduce", 1e8) > cl.collective_time("all_reduce", 1e8, (0, 1))


@pytest.mark.parametrize("dim", ["tp", "cp", "pp", "dp"])
def test_all_groups_matches_rank_groups(dim):
    c = ParallelConfig(tp=2, pp=3, dp=2, cp=2, placement=("tp", "dp", "cp", "pp"))
    rows = all_groups(dim, c).tolist()
    dims = {"tp": 2, "dp": 2, "cp": 2, "pp": 3}
    want = rank_groups(24, dims)
    if dim == "dp":   # the dp x cp group
        want = rank_groups(24, {"tp": 2, "dpcp": 4, "pp": 3})["dpcp"]
    else:
        want = want[dim]
    assert sorted(rows) == want


def test_placement_table_says_infiniband_for_a_straddling_pipeline():
    # 16-rank replicas on 72-GPU racks: replica 4 (ranks 64-79) hops 68 -> 72 across racks
    import autopar
    from rich.console import Console
    from autopar.report.tables import degrees_table

    cluster = Cluster.from_spec("2x72xGB200")
    train = autopar.TrainingConfig(global_batch_size=144, seq_len=4096)
    est = autopar.estimate("llama3-8b", cluster, train, ParallelConfig(
        tp=4, pp=4, dp=9, placement=("tp", "cp", "pp", "dp")))
    assert est.group_links.pp == "infiniband" and est.group_links.tp == "nvlink"
    con = Console(record=True, width=200)
    con.print(degrees_table(est, cluster))
    rows = {line.split("│")[1].strip(): line for line in con.export_text().splitlines()
            if line.count("│") > 2}
    assert "InfiniBand" in rows["pp (pipeline parallel)"]
    assert "inside one" not in rows["pp (pipeline parallel)"]
    assert "NVLink (inside one 72-GPU domain)" in rows["tp (tensor parallel)"]


def test_the_shortcuts_agree_with_looking_at_every_group():
    """_distinct_rows is np.unique(axis=0)'s first indices; _node_aligned only says True where
    every group of the dimension has rank 0's shape on the nodes."""
    import numpy as np

    from autopar.cost.groups import _distinct_rows, _node_aligned, all_groups
    rng = np.random.default_rng(3)
    for _ in range(200):
        rows = rng.integers(0, 4, size=(int(rng.integers(1, 30)), int(rng.integers(1, 5))))
        want = np.sort(np.unique(rows, axis=0, return_index=True)[1])
        assert (_distinct_rows(rows) == want).all()
    for gpn, degrees in ((8, (4, 1, 12, 3)), (8, (2, 1, 4, 4)), (72, (4, 1, 12, 3)),
                         (72, (4, 1, 9, 4)), (7, (2, 1, 1, 14))):
        tp, cp, pp, dp = degrees
        c = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp)
        for dim in ("tp", "pp", "dp"):
            if not _node_aligned(dim, c, gpn):
                continue
            rows = all_groups(dim, c)
            shapes = {tuple(r - (r[0] // gpn) * gpn) for r in rows}
            nodes = {tuple(r // gpn - r[0] // gpn) for r in rows}
            assert len(nodes) == 1, (gpn, degrees, dim)
            assert all(len(set(s)) == len(s) for s in shapes)
    straddles = ("tp", "cp", "pp", "dp")   # replica 1 of tp4 pp12 over ranks 48-95
    assert not _node_aligned("pp", ParallelConfig(tp=4, pp=12, dp=3, placement=straddles), 72)
    assert _node_aligned("pp", ParallelConfig(tp=4, pp=9, dp=4, placement=straddles), 72)
