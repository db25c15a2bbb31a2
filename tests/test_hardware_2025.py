"""Issue 27, item 3: the 2025 hardware rows (B200, B300, GB200/GB300 NVL72, H20, MI300X, MI325X,
MI355X), the NVL72 rack as one 72-GPU NVLink node, the Infinity Fabric mesh, and the
"unvalidated" band their estimates carry.

Oracles are the vendors' published figures (sources on the rows, autopar/hardware/devices.py),
re-derived here from the tables as printed: NVIDIA quotes HGX and NVL72 tensor peaks for the whole
board or rack and with 2:4 sparsity, so a dense per-GPU figure is table / 2 / GPUs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from rich.console import Console

import autopar
from autopar.errors import InvalidClusterSpec, InvalidTrainingConfig
from autopar.hardware import Cluster, get_device, rank_groups
from autopar.hardware.devices import CATALOG
from autopar.hardware.gpu import architecture
from autopar.cost.regime import gpu_generation

ROOT = Path(__file__).resolve().parents[1]
T, G = 1e12, 1e9


# --------------------------------------------------------------------------- catalog figures
# name -> (table figure, GPUs in the table, sparse?) per precision, as the source prints them
_NVIDIA_TABLES = {
    # HGX B200 / B300 spec tables, per 8 GPUs, tensor rows "with sparsity": FP8 72 PF,
    # FP16/BF16 36 PF, TF32 18 PF; FP32 600 TF (dense)
    "B200-SXM-180GB": {"fp8": (72e15, 8, True), "bf16": (36e15, 8, True),
                       "tf32": (18e15, 8, True), "fp32": (600e12, 8, False)},
    "B300-SXM-288GB": {"fp8": (72e15, 8, True), "bf16": (36e15, 8, True),
                       "tf32": (18e15, 8, True), "fp32": (600e12, 8, False)},
    # GB200 / GB300 NVL72 spec tables, per 72 GPUs, with sparsity: FP8 720 PF, BF16 360 PF,
    # TF32 180 PF; GB200 FP32 5,760 TF
    "GB200-NVL72": {"fp8": (720e15, 72, True), "bf16": (360e15, 72, True),
                    "tf32": (180e15, 72, True), "fp32": (5760e12, 72, False)},
    "GB300-NVL72": {"fp8": (720e15, 72, True), "bf16": (360e15, 72, True),
                    "tf32": (180e15, 72, True)},
}


@pytest.mark.parametrize("name", sorted(_NVIDIA_TABLES))
def test_nvidia_dense_peaks_are_the_tables_halved_per_gpu(name):
    d = get_device(name)
    for dtype, (figure, gpus, sparse) in _NVIDIA_TABLES[name].items():
        assert d.peak(dtype) == pytest.approx(figure / gpus / (2 if sparse else 1)), dtype
    assert d.peak("fp16") == d.peak("bf16")
    assert "sparsity" in d.source   # the row says which figures it halved


# (name, bf16 TF, fp8 TF, memory GB (decimal), HBM TB/s, scale-up link bidir GB/s, TDP W)
_SHEETS = [
    ("H20-96GB", 148, 296, 96, 4.0, 900, 400),
    # DGX B200: 1,440 GB / 8; HBM from the driver (bus x clock, devices._B200_QUERY), the
    # sheet's 64 TB/s / 8 rounded
    ("B200-SXM-180GB", 2250, 4500, 180, 7.67232, 1800, 1000),
    ("B300-SXM-288GB", 2250, 4500, 288, 8.0, 1800, 1100),
    ("GB200-NVL72", 2500, 5000, 186, 8.0, 1800, 1200),     # rack: 13.4 TB / 72, 576 TB/s / 72
    ("GB300-NVL72", 2500, 5000, 288, 8.0, 1800, 1400),
    ("MI300X-192GB", 1307.4, 2614.9, 192, 5.3, 7 * 128, 750),   # 7 IF links x 128 GB/s
    ("MI325X-256GB", 1307.4, 2614.9, 256, 6.0, 7 * 128, 1000),
    ("MI355X-288GB", 2516.6, 5033.2, 288, 8.0, 7 * 153.6, 1400),
]


@pytest.mark.parametrize("name,bf16,fp8,mem,hbm,link,tdp", _SHEETS)
def test_datasheet_figures_in_si_units(name, bf16, fp8, mem, hbm, link, tdp):
    d = get_device(name)
    assert d.peak("bf16") == pytest.approx(bf16 * T) and d.peak("fp8") == pytest.approx(fp8 * T)
    assert d.memory_bytes == pytest.approx(mem * G)         # the vendor's decimal GB, not GiB
    assert d.hbm_bandwidth_Bps == pytest.approx(hbm * T)
    assert d.nvlink_bandwidth_Bps == pytest.approx(link / 2 * G)   # per direction
    assert d.tdp_w == tdp
    if name == "B200-SXM-180GB":
        # a CUDA device query (pytorch/ao PR #4002): 148 SMs, 178.35 GiB to the framework (GiB:
        # a torchtitan log shows 167.93 GiB as 94.15% of it)
        assert d.sm_count == 148
        assert d.visible_memory_bytes == pytest.approx(178.35 * 2 ** 30)
        assert "PR #4002" in CATALOG.row(name).source_of("sm_count")
        return
    assert d.visible_memory_bytes == d.memory_bytes        # no measured framework capacity yet
    assert d.sm_count == 0   # not sourced: the estimate warns (no collective-SM slowdown charged)


def test_every_new_fact_has_a_source_and_fp4_is_not_invented():
    for name, *_ in _SHEETS:
        row = CATALOG.row(name)
        for fact in ("peak_flops", "memory_bytes", "hbm_bandwidth_Bps", "nvlink_bandwidth_Bps",
                     "pcie_bandwidth_Bps", "tdp_w"):
            assert row.source_of(fact), (name, fact)
        assert set(row.device.peak_flops) <= {"fp32", "tf32", "fp16", "bf16", "fp8"}
    # CDNA 4 has no TF32 matrix rate: refused with what the GPU has, not a made-up number
    with pytest.raises(InvalidTrainingConfig, match="tf32"):
        get_device("MI355X").peak("tf32")


@pytest.mark.parametrize("name,arch,band", [
    ("B200-SXM-180GB", "blackwell", "blackwell"), ("B300-SXM-288GB", "blackwell", "blackwell"),
    ("GB200-NVL72", "blackwell", "blackwell"), ("GB300-NVL72", "blackwell", "blackwell"),
    ("MI300X-192GB", "cdna3", "cdna3"), ("MI325X-256GB", "cdna3", "cdna3"),
    ("MI355X-288GB", "cdna4", "cdna4"), ("MI350X", "cdna4", "cdna4"),
    # the H20 is Hopper silicon with 15% of the H100's compute: banded apart from Hopper
    ("H20-96GB", "hopper", "hopper-h20"), ("H200-SXM-141GB", "hopper", "hopper"),
    ("MI250X", "unknown", "mi250x"),
])
def test_generations(name, arch, band):
    assert architecture(name) == arch
    assert gpu_generation(name) == band


# --------------------------------------------------------------------------- cluster specs
def test_b200_spec_plans_instead_of_suggesting_h200():
    c = Cluster.from_spec("2x8xB200")
    assert c.device.name == "B200-SXM-180GB" and c.world_size == 16
    assert (c.intra_link.name, c.inter_link.name, c.nics_per_node) == ("nvlink5", "ib-ndr", 8)
    assert c.intra_link.bandwidth_Bps == 900 * G    # NVLink 5: 1.8 TB/s bidirectional
    b300 = Cluster.from_spec("2x8xB300")
    assert (b300.inter_link.name, b300.inter_link.bandwidth_Bps) == ("ib-xdr", 100 * G)
    # an 800 Gb/s NIC is not capped by a Gen5 host link (B300: PCIe Gen6)
    assert b300.fabric().inter_per_gpu_Bps > Cluster.from_spec("2x8xB200").fabric().inter_per_gpu_Bps


@pytest.mark.parametrize("spec", ["2x72xGB200", "2xNVL72xGB200", "144xGB200", "2x72xgb200-nvl72"])
def test_two_nvl72_racks_are_two_72_gpu_nodes(spec):
    c = Cluster.from_spec(spec)
    assert (c.num_nodes, c.gpus_per_node, c.world_size) == (2, 72, 144)
    assert c.gpus_per_host == 4 and c.nics_per_node == 72   # 18 trays x 4, one CX-7 per GPU
    assert c.domain_text() == "NVLink domain of 72 GPUs (18 trays x 4)"
    assert c.name == "2x72xGB200-NVL72+72xib-ndr"


def test_gb300_racks_and_nvl72_limits():
    c = Cluster.from_spec("144xGB300")
    assert (c.num_nodes, c.gpus_per_node, c.inter_link.name) == (2, 72, "ib-xdr")
    with pytest.raises(InvalidClusterSpec, match="at most 72 GPUs"):
        Cluster.from_spec("1x144xGB200")
    with pytest.raises(InvalidClusterSpec, match="not a multiple of 72"):
        Cluster.from_spec("100xGB200")
    # part of a rack is a smaller NVLink domain; an 8-GPU board box keeps one host per node
    assert Cluster.from_spec("1x36xGB200").domain_text().startswith("NVLink domain of 36")
    assert Cluster.from_spec("16xB200").domain_text() == ""
    # the graph keeps one NVLink switch per rack and says which tray each GPU is in
    g = Cluster.from_spec("1x72xGB200").graph()
    trays = {d["tray"] for n, d in g.nodes(data=True) if d["type"] == "gpu"}
    assert trays == set(range(18))
    assert sum(1 for _, d in g.nodes(data=True) if d["type"] == "nvswitch") == 1


# --------------------------------------------------------------------------- NVL72 placement
def test_tp8_and_ep72_inside_an_nvl72_rack_cross_no_infiniband():
    nvl = Cluster.from_spec("2x72xGB200")
    groups = rank_groups(nvl, {"tp": 8, "dp": 18})
    assert {nvl.link_class(g) for g in groups["tp"]} == {"nvlink"}
    # an expert group of 72 (EP over a whole rack) stays on NVLink: no byte through a NIC
    ep = rank_groups(nvl, {"ep": 72, "dp": 2})["ep"]
    assert {nvl.link_class(g) for g in ep} == {"nvlink"}
    assert all(nvl.collective_load("all_to_all", 1e9, g).inter_bytes == 0 for g in ep)
    # the same 72-GPU group on 8-GPU B200 boards crosses InfiniBand for 64/72 of its bytes
    hgx = Cluster.from_spec("18x8xB200")
    ep_hgx = rank_groups(hgx, {"ep": 72, "dp": 2})["ep"]
    load = hgx.collective_load("all_to_all", 1e9, ep_hgx[0])
    assert hgx.link_class(ep_hgx[0]) == "infiniband"
    assert load.inter_bytes == pytest.approx(64 / 72 * 1e9)


# --------------------------------------------------------------------------- xGMI mesh
def test_a_mesh_node_holds_at_most_its_links_plus_one_gpus():
    """A switchless xGMI mesh joins each GPU to every other by a link of its own: 7 peer links
    per MI300X join 8 GPUs; a 16-GPU 'node' of them was planned as if it existed."""
    from autopar.errors import InvalidClusterSpec
    assert Cluster.from_spec("2x8xMI300X").gpus_per_node == 8
    with pytest.raises(InvalidClusterSpec, match=r"at most 8 GPUs.*'2x8xMI300X-192GB'"):
        Cluster.from_spec("1x16xMI300X")


def test_a_board_node_holds_at_most_its_boards_gpus():
    """An HGX/DGX board's NVSwitch fabric ends at its 8 GPUs: '1x16xH100' and '2x72xB200' were
    priced as NVLink domains no such box has. DGX-2 joins 16 V100 SXM3 on its NVSwitches, so
    that box's node is 16 GPUs; a larger domain stays possible with an explicit link."""
    from autopar.errors import InvalidClusterSpec
    with pytest.raises(InvalidClusterSpec, match=r"at most 8 GPUs.*'2x8xH100-SXM5-80GB'"):
        Cluster.from_spec("1x16xH100")
    with pytest.raises(InvalidClusterSpec, match=r"at most 8 GPUs.*'18x8xB200-SXM-180GB'"):
        Cluster.from_spec("2x72xB200")
    assert Cluster.from_spec("2x72xGB200").gpus_per_node == 72     # an NVL72 rack is one node
    dgx2 = Cluster.from_spec("32xV100-SXM3-32GB")
    assert (dgx2.num_nodes, dgx2.gpus_per_node, dgx2.nics_per_node) == (2, 16, 8)
    big = Cluster.custom(1, 16, "H100", intra="nvlink4")
    assert big.world_size == 16 and big.intra_link.name == "nvlink4"


def test_mi300x_mesh_gives_a_group_only_its_peer_links():
    c = Cluster.from_spec("1x8xMI300X")
    link = c.intra_link
    assert (link.kind, link.mesh_links, link.bandwidth_Bps) == ("xgmi", 7, 7 * 64 * G)
    eff = c.comm_params.efficiency["xgmi"]
    # a pair shares one 64 GB/s link per direction; all 8 reach all 7
    for k in (2, 4, 8):
        g = c._layout(tuple(range(k)))
        assert c.group_fabric(g).intra_Bps == pytest.approx((k - 1) * 64 * G * eff)
    assert c.link_class([0, 1]) == "xgmi"
    # on a switch the pair would get the whole per-GPU rate: not so on the mesh
    h = Cluster.from_spec("1x8xH100")
    assert h.bus_bandwidth("all_reduce", 1e9, [0, 1]) > 5 * c.bus_bandwidth("all_reduce", 1e9, [0, 1])
    # the graph: no switch, an edge per GPU pair at one link's rate
    graph = c.graph()
    peers = [(a, b, d) for a, b, d in graph.edges(data=True) if d["kind"] == "xgmi"]
    assert len(peers) == 28 and {d["bandwidth_Bps"] for *_, d in peers} == {64 * G}
    assert not any(d["type"] == "nvswitch" for _, d in graph.nodes(data=True))
    assert "RCCL" in link.source and "unvalidated" in link.source.lower()


# --------------------------------------------------------------------------- estimates
_TRAIN = autopar.TrainingConfig(global_batch_size=144, seq_len=4096)


@pytest.mark.parametrize("spec,config", [
    ("2x72xGB200", {"tp": 8, "pp": 2, "dp": 9}),
    ("2x8xB200", {"tp": 8, "pp": 2, "dp": 1}),
    ("2x8xMI300X", {"tp": 8, "pp": 2, "dp": 1}),
    ("2x8xH20", {"tp": 8, "pp": 2, "dp": 1}),
])
def test_new_hardware_estimates_say_unvalidated(spec, config):
    train = autopar.TrainingConfig(global_batch_size=144 if "GB200" in spec else 16, seq_len=4096)
    est = autopar.estimate("llama3-8b", spec, train, autopar.ParallelConfig(**config))
    band = est.error_band
    assert band is not None and not band.validated
    assert band.text() == "± unknown (unvalidated regime)"
    assert band.cell[2] == gpu_generation(Cluster.from_spec(spec).device.name)
    assert est.group_links.tp == ("xgmi" if "MI300X" in spec else "nvlink")


def test_the_placement_table_shows_the_72_gpu_domain():
    from autopar.report.tables import degrees_table

    cluster = Cluster.from_spec("2x72xGB200")
    est = autopar.estimate("llama3-8b", cluster, _TRAIN, autopar.ParallelConfig(tp=8, pp=2, dp=9))
    con = Console(record=True, width=200)
    con.print(degrees_table(est, cluster))
    text = con.export_text()
    assert "node (scale-up domain)" in text and "72 GPUs" in text
    assert "NVLink domain of 72 GPUs (18 trays x 4); 2 such nodes joined by InfiniBand" in text
    assert "NVLink (inside one 72-GPU domain)" in text
    # an 8-GPU board gets no such row (existing tables unchanged)
    h = Cluster.from_spec("2x8xH100")
    con = Console(record=True, width=200)
    con.print(degrees_table(autopar.estimate("llama3-8b", h, autopar.TrainingConfig(
        global_batch_size=16, seq_len=4096), autopar.ParallelConfig(tp=8, dp=2)), h))
    assert "scale-up domain" not in con.export_text()


# --------------------------------------------------------------------------- corpus records
def _record(path: str, rec_id: str) -> dict:
    return next(r for r in json.loads((ROOT / path).read_text()) if r["id"] == rec_id)


def test_records_once_refused_for_their_gpu_are_refused_for_their_next_reason():
    from benchmarks.records import RecordError, parse

    for rid in ("lsq-msswift-zero3-qwen2.5-7b-16k-h20-fa2", "lsq-msswift-zero3-qwen2.5-7b-16k-h20-fa3"):
        rec = _record("benchmarks/data/published_runs_longseq.json", rid)
        assert get_device(rec["cluster"]["gpu"]).name == "H20-96GB"
        with pytest.raises(RecordError, match="packing true") as err:
            parse(rec)
        assert "H20" not in str(err.value)
    # the GB200 run gives trays of 4; its 256 GPUs fill no whole number of 72-GPU domains
    gb = _record("benchmarks/data/published_runs_papers.json", "b-mcore-moe-dsv3-gb200-256gpu-mxfp8")
    with pytest.raises(RecordError, match="72-GPU NVLink domains"):
        parse(gb)


def test_new_architectures_gemm_ceilings_are_their_mamf_lower_rows():
    """The ml-engineering MAMF table's best-shape BF16 rows (an upper bound) give the GEMM
    ceiling of an architecture with no measurement of ours: the lowest of its parts, never the
    Ampere fallback (0.82, above every one of them)."""
    from autopar.cost.params import CostParams

    p = CostParams()
    mamf = {"blackwell": [1745.0 / 2250, 1769.0 / 2250, 1822.0 / 2500],
            "cdna3": [668.4 / 1300, 784.9 / 1300], "cdna4": [1565.0 / 2516.6]}
    for arch, rows in mamf.items():
        assert p.matmul_ceiling(arch) == pytest.approx(min(rows), abs=5e-4)
        assert p.matmul_ceiling(arch) < p.matmul_ceiling("ampere")


@pytest.mark.parametrize("torch_name,memory,expect", [
    ("NVIDIA B200", 190e9, "B200-SXM-180GB"), ("NVIDIA GB200", 190e9, "GB200-NVL72"),
    ("NVIDIA H20", 102e9, "H20-96GB"), ("NVIDIA H200", 150e9, "H200-SXM-141GB"),
    ("AMD Instinct MI300X", 206e9, "MI300X-192GB"), ("AMD Instinct MI355X", 309e9, "MI355X-288GB"),
])
def test_calibration_finds_the_new_rows_by_model_number(torch_name, memory, expect):
    from autopar.calibrate.run import match_catalog

    # the model number must match whole: "H20" is not the H200, nor "H200" the H20
    assert match_catalog(torch_name, memory) == expect


def test_rows_that_cannot_be_built_are_refused():
    from autopar.hardware.catalog import Box
    from autopar.hardware.links import LinkType

    with pytest.raises(InvalidClusterSpec, match="multiple of gpus_per_host"):
        Box("odd-rack", "nvlink5", 72, "ib-ndr", "test", gpus_per_node=72, gpus_per_host=5)
    with pytest.raises(InvalidClusterSpec, match="mesh_links"):
        LinkType("switch-mesh", "nvswitch", 1e9, 1e-6, "test", mesh_links=7)
    with pytest.raises(InvalidClusterSpec, match="gpus_per_host"):
        dataclasses.replace(Cluster.from_spec("1x72xGB200"), gpus_per_host=-1)
