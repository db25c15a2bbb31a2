"""Issue 25: NVIDIA V100 (Volta) rows in the GPU catalog, so published V100 runs are no longer
refused as "unknown GPU". Figures: NVIDIA Tesla V100 datasheet (2018) and V100 whitepaper."""

from __future__ import annotations

import pytest

import autopar
from autopar.errors import InvalidTrainingConfig
from autopar.hardware import Cluster, get_device
from autopar.hardware.devices import CATALOG, memory_ambiguity
from autopar.hardware.links import get_link

_GB = 1e9
_T = 1e12


@pytest.mark.parametrize("name, fp16, fp32, mem_gb, gib, form, tdp", [
    ("V100-SXM2-16GB", 125, 15.7, 16, 15.78, "sxm", 300),
    ("V100-SXM2-32GB", 125, 15.7, 32, 31.74, "sxm", 300),
    ("V100-PCIe-32GB", 112, 14, 32, 31.74, "pcie", 250),
    ("V100-SXM3-32GB", 125, 15.7, 32, 31.74, "sxm", 0),
])
def test_the_v100_rows_load_with_datasheet_figures(name, fp16, fp32, mem_gb, gib, form, tdp):
    d = get_device(name)
    assert d.architecture == "volta" and d.sm_count == 80 and d.form_factor == form
    assert d.peak("fp16") == pytest.approx(fp16 * _T) and d.peak("fp32") == pytest.approx(fp32 * _T)
    assert d.memory_bytes == pytest.approx(mem_gb * _GB)           # datasheet GB, decimal
    assert d.visible_memory_bytes == pytest.approx(gib * 2 ** 30)  # what torch reports, GiB
    assert d.hbm_bandwidth_Bps == pytest.approx(900 * _GB)
    assert d.pcie_bandwidth_Bps == pytest.approx(16 * _GB)         # Gen3 x16 per direction
    assert d.nvlink_bandwidth_Bps == pytest.approx(0 if form == "pcie" else 150 * _GB)
    assert d.tdp_w == tdp
    row = CATALOG.row(name)
    assert "V100" in row.source_of("peak_flops") and row.source_of("capacity_bytes")
    for dtype in ("bf16", "tf32", "fp8"):   # Volta has none of them
        with pytest.raises(InvalidTrainingConfig, match=dtype):
            d.peak(dtype)


@pytest.mark.parametrize("alias, name", [
    ("V100", "V100-SXM2-32GB"), ("v100-32gb", "V100-SXM2-32GB"), ("V100-SXM2", "V100-SXM2-32GB"),
    ("V100-16GB", "V100-SXM2-16GB"), ("V100-PCIe", "V100-PCIe-32GB"), ("v100-sxm3", "V100-SXM3-32GB"),
])
def test_v100_aliases(alias, name):
    assert get_device(alias).name == name


def test_bare_v100_names_the_16gb_part():
    note = memory_ambiguity("V100")
    assert "read as V100-SXM2-32GB (32 GB)" in note and "V100-SXM2-16GB" in note


def test_dgx1_and_dgx2_nodes():
    c = Cluster.from_spec("2x8xV100-SXM2-32GB")
    assert c.world_size == 16 and c.device is get_device("V100")
    # DGX-1: hybrid cube-mesh NVLink 2.0 (point to point), 4 x EDR per 8 GPUs
    assert (c.intra_link.name, c.intra_link.kind, c.inter_link.name, c.nics_per_node) == \
        ("nvlink2-cubemesh", "nvlink", "ib-edr", 4)
    assert c.intra_link.bandwidth_Bps == pytest.approx(150 * _GB)     # 6 x 25 GB/s per direction
    assert get_link("ib-edr").bandwidth_Bps == pytest.approx(12.5 * _GB)
    c2 = Cluster.from_spec("2x16xV100-SXM3-32GB")   # DGX-2: 16 GPUs on NVSwitch, 8 x EDR
    assert (c2.intra_link.name, c2.intra_link.kind, c2.inter_link.name, c2.nics_per_node) == \
        ("nvlink2", "nvswitch", "ib-edr", 8)
    pc = Cluster.from_spec("1x8xV100-PCIe")
    assert pc.intra_link.name == "pcie-gen3"


def test_bf16_on_v100_is_our_clear_error():
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=512)   # bf16 by default
    with pytest.raises(InvalidTrainingConfig, match=r"V100-SXM2-32GB does not support bf16.*fp16"):
        autopar.estimate("tiny-gpt", "1x8xV100", train, {"tp": 1, "micro_batch_size": 1})


def test_an_fp16_estimate_runs_on_v100():
    model = dict(name="small", family="gpt", num_layers=4, hidden_size=512, num_heads=8,
                 vocab_size=32000, seq_len=512)
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=512, precision="fp16")
    est = autopar.estimate(model, "2x8xV100-SXM2-32GB", train, {"tp": 2, "micro_batch_size": 1})
    assert est.step_time_s > 0 and est.memory_per_gpu_bytes > 0
    # the same run on the 16 GB part has the same time (the capacity only limits the fit)
    est16 = autopar.estimate(model, "2x8xV100-SXM2-16GB", train, {"tp": 2, "micro_batch_size": 1})
    assert est16.step_time_s == pytest.approx(est.step_time_s)
