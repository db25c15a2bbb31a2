"""Calibration (issue 15, item 2): the fits recover known constants, the file loads strictly,
a calibration of other hardware is refused, and ``autopar calibrate`` runs end to end on gloo
(4 forked ranks as 2 "nodes" of 2, FileStore rendezvous) and its file is used in an estimate."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types

import pytest
import torch
import torch.distributed as dist

import autopar
from autopar.calibrate import calibrated, load_calibration, measured_cluster
from autopar.calibrate.bench import gemm_shapes
from autopar.calibrate.fit import algorithm_terms, fit_alpha_beta, fit_gemm
from autopar.calibrate.run import Options, comparison, match_catalog, run_calibration
from autopar.calibrate.schema import (AttentionSample, Calibration, CollectiveSample, DeviceInfo,
                                      GemmSample, MemorySample, World, measured_fields)
from autopar.cli import main
from autopar.cost.params import CostParams
from autopar.errors import InvalidCalibration

from test_runtime import run_ranks

A100 = autopar.Cluster.from_spec("1x8xA100-80GB")
#: A model whose GEMMs are large enough for compute to dominate, small enough to extract fast.
MID = {"name": "mid-llama", "family": "llama", "num_layers": 2, "hidden_size": 2048,
       "num_heads": 16, "vocab_size": 32000, "seq_len": 1024}


def _collectives(launch, alpha, bw, scope="intra", n_max=8, nodes=1):
    """Samples whose times follow the alpha-beta model exactly."""
    out = []
    for n in (2, 4, 8):
        if n > n_max:
            continue
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
            size = 2 if op == "send_recv" else n
            for nbytes in (4096, 65536, 2 ** 20, 2 ** 24, 2 ** 28):
                spans = nodes if scope == "inter" else 1
                steps, vol = algorithm_terms(op, size, nbytes, spans)
                out.append(CollectiveSample(op, scope, size, spans,
                                            nbytes, launch + steps * alpha + vol / bw))
    return tuple(out)


def _gpu_cal(ceiling=0.41, half=256.0, precision="bf16", catalog="A100-SXM4-80GB",
             collectives=()) -> Calibration:
    """A calibration whose GEMM times follow the efficiency curve of ``ceiling``/``half``."""
    p = CostParams(matmul_efficiency={"ampere": ceiling}, matmul_half_size=half)
    gemm = tuple(GemmSample(m, k, n, 2 * m * k * n / (312e12 * p.gemm_efficiency(m, k, n)))
                 for m, k, n in [(4096, 8192, 8192), (4096, 1024, 8192), (512, 8192, 2048),
                                 (4096, 8192, 28672), (256, 256, 256), (64, 4096, 4096)])
    mem = MemorySample(2 ** 30, 2 * 2 ** 30 / 1.5e12, 4e-6)
    return Calibration("2026-11-30T00:00:00Z", "2.13.0", "nccl",
                       DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", catalog, 85e9),
                       World(8, 8, 1), "llama3-8b", 8192, precision,
                       measured_fields(gemm, (), mem, collectives), gemm, (), mem, collectives)


def test_gemm_fit_recovers_the_curve_it_was_made_from():
    c, h, err = fit_gemm(_gpu_cal(ceiling=0.41, half=256.0), 312e12)
    assert c == pytest.approx(0.41, rel=1e-9) and h == 256.0 and err < 1e-9


def test_alpha_beta_fit_recovers_launch_alpha_and_bandwidth():
    ab = fit_alpha_beta(list(_collectives(7e-6, 2e-6, 150e9)))
    assert ab.launch_s == pytest.approx(7e-6, rel=1e-6)
    assert ab.alpha_s == pytest.approx(2e-6, rel=1e-6)
    assert ab.bandwidth_Bps == pytest.approx(150e9, rel=1e-6)
    assert ab.rms_rel_error < 1e-9


def test_calibration_replaces_the_datasheet_constants():
    cal = _gpu_cal(collectives=_collectives(7e-6, 2e-6, 150e9))
    out = calibrated(A100, None, cal, "bf16")
    assert out.params.matmul_ceiling("ampere") == pytest.approx(0.41)   # datasheet: 0.82
    assert out.params.matmul_half_size == 256.0                          # default: 128
    assert out.params.hbm_efficiency == pytest.approx(1.5e12 / 2.039e12)
    assert out.params.kernel_launch_s == 4e-6
    assert out.cluster.intra_link.bandwidth_Bps == pytest.approx(150e9, rel=1e-6)  # 300e9 x 0.8
    assert out.cluster.comm_params.efficiency["nvswitch"] == 1.0
    assert out.cluster.comm_params.launch_latency_s == pytest.approx(7e-6, rel=1e-6)
    assert out.cluster.name == A100.name
    # the calibrated cluster reproduces the measured collective: 8-rank all_reduce of 256 MiB
    t = out.cluster.collective_time("all_reduce", 2 ** 28, range(8))
    assert t == pytest.approx(7e-6 + 14 * 2e-6 + 1.75 * 2 ** 28 / 150e9, rel=1e-6)
    # the cost model uses them: half the GEMM ceiling, slower steps. The GEMMs take twice as
    # long or more (a larger half-size too); the memory-bound kernels (norms, the eager fp32
    # loss over the 32k vocabulary) only 0.82 / 0.735 = 1.12x as long, so the whole lies between
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=1024)
    base = autopar.estimate(MID, A100, train, {"tp": 1})
    cal_e = autopar.estimate(MID, A100, train, {"tp": 1}, calibration=cal)
    assert 1.8 * base.time_breakdown.compute < cal_e.time_breakdown.compute \
        < 2.5 * base.time_breakdown.compute


def test_a_cpu_or_other_gpu_calibration_is_refused():
    cpu = _gpu_cal(catalog=None)
    cpu = Calibration(**{**cpu.__dict__, "device": DeviceInfo("cpu", "cpu", None, 1e10)})
    with pytest.raises(InvalidCalibration, match="a CPU, which cannot stand for a GPU"):
        autopar.estimate("tiny-llama", A100, autopar.TrainingConfig(8, 1024), {"tp": 1},
                         calibration=cpu)
    with pytest.raises(InvalidCalibration, match="the cluster's GPU is H100-SXM5-80GB"):
        calibrated(autopar.Cluster.from_spec("1x8xH100"), None, _gpu_cal(), "bf16")
    with pytest.raises(InvalidCalibration, match="--precision fp16"):
        calibrated(A100, None, _gpu_cal(), "fp16")


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(extra=1), "unknown key(s) ['extra']"),
    (lambda d: d["gemm"][0].update(seconds="fast"), "gemm[0].seconds must be a positive"),
    (lambda d: d["device"].update(kind="tpu"), "device.kind = 'tpu' is not one of"),
    (lambda d: d.update(version=2), "version = 2"),
    (lambda d: d["world"].update(num_nodes=2), "world has local_world_size*num_nodes"),
    (lambda d: d.update(measured_fields=["CostParams.hbm_efficiency"]),
     "measured_fields = ['CostParams.hbm_efficiency'] does not match"),
    (lambda d: d["collectives"][0].update(op="broadcast"), "collectives[0].op = 'broadcast'"),
])
def test_the_file_is_loaded_strictly(tmp_path, mutate, field):
    cal = _gpu_cal(collectives=_collectives(7e-6, 2e-6, 150e9))
    path = tmp_path / "cal.json"
    cal.to_json(path)
    assert load_calibration(path) == cal
    d = json.loads(path.read_text())
    mutate(d)
    with pytest.raises(InvalidCalibration, match="Fix|fix") as exc:
        load_calibration(d)
    assert field in str(exc.value)


@pytest.mark.parametrize("name, memory, expect", [
    ("NVIDIA H100 80GB HBM3", 85.0e9, "H100-SXM5-80GB"),
    ("NVIDIA H200", 143.7e9, "H200-SXM-141GB"),
    ("NVIDIA A100-SXM4-40GB", 42.5e9, "A100-SXM4-40GB"),
    ("NVIDIA A100 80GB PCIe", 85.1e9, "A100-PCIe-80GB"),
    ("NVIDIA GeForce RTX 4090", 25.3e9, None),
])
def test_torch_device_names_match_the_catalogue(name, memory, expect):
    assert match_catalog(name, memory) == expect


# ------------------------------------------------------------------ end to end on gloo
def _calibrate_worker(rank, world, store_path, out_path):
    torch.set_num_threads(1)
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    try:
        cal = run_calibration(Options(model="tiny-llama", budget_s=600, min_bytes=1024,
                                      max_bytes=2 ** 16, copy_bytes=2 ** 20), torch.device("cpu"))
        if rank == 0:
            cal.to_json(out_path)
    finally:
        dist.destroy_process_group()


def test_calibrate_runs_on_gloo_and_its_file_prices_a_plan(tmp_path):
    out = tmp_path / "cal.json"
    run_ranks(4, _calibrate_worker, str(out))
    cal = load_calibration(out)
    assert cal.world == World(4, 2, 2) and cal.backend == "gloo"
    assert cal.device.kind == "cpu" and cal.device.catalog is None
    # 4 sizes x 5 ops x (intra pairs + inter rails)
    assert len(cal.collectives) == 40
    assert {c.scope for c in cal.collectives} == {"intra", "inter"}
    assert "Cluster.inter_link.bandwidth_Bps" in cal.measured_fields
    graph, _ = autopar.api.model_graph("tiny-llama", autopar.TrainingConfig(1, 32))
    shapes = gemm_shapes(graph)  # the model's GEMMs unsharded and as TP 2, 4, 8 shard them
    assert [(g.m, g.k, g.n) for g in cal.gemm] == shapes and len(shapes) == 18
    assert cal.attention[0].heads == 4 and cal.attention[0].kv_heads == 2
    assert cal.attention[0].seq_len == 32 and cal.attention[0].head_dim == 16
    # the collectives' timings on a shared 2-core machine are noise (they need not even grow
    # with size): price the plan with samples that follow a known alpha-beta law, so the test
    # checks the file's path into the cost model, not the machine's load
    cal = dataclasses.replace(cal, collectives=tuple(
        dataclasses.replace(c, seconds=5e-6 + sum(t * w for t, w in zip(
            algorithm_terms(c.op, c.group_size, c.nbytes, c.nodes), (2e-6, 1 / 1e9))))
        for c in cal.collectives))
    cluster = measured_cluster(cal)
    assert cluster.world_size == 4 and cluster.device.name == "measured-cpu"
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=32, precision="fp32")
    with pytest.warns(UserWarning, match="no datasheet peak"):
        est = autopar.estimate("tiny-llama", cluster, train, {"dp": 4}, calibration=cal)
    assert math.isfinite(est.step_time_s) and est.step_time_s > 0
    with pytest.raises(InvalidCalibration, match="CPU"):
        autopar.estimate("tiny-llama", "1x4xA100", train, {"dp": 4}, calibration=out)


def test_cli_calibrate_single_process_then_plan_with_calibration(tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--model", "tiny-llama", "--out", str(out), "--budget", "30",
                 "--copy-bytes", str(2 ** 20)]) == 0
    text = capsys.readouterr().out
    assert "no datasheet" in text and "kernel launch floor" in text
    cal = load_calibration(out)
    assert cal.collectives == () and cal.world == World(1, 1, 1)
    assert main(["plan", "--model", "tiny-llama", "--cluster", "1x1xA100", "--global-batch", "8",
                 "--seq-len", "32", "--precision", "fp32", "--calibration", str(out)]) == 2
    assert "cannot stand for a GPU" in capsys.readouterr().err
    gpu = tmp_path / "gpu.json"
    _gpu_cal(collectives=_collectives(7e-6, 2e-6, 150e9)).to_json(gpu)
    assert main(["plan", "--model", "tiny-llama", "--cluster", "1x8xA100", "--global-batch", "8",
                 "--seq-len", "1024", "--calibration", str(gpu), "--json"]) == 0
    captured = capsys.readouterr()
    assert "calibrated from" in captured.err
    assert json.loads(captured.out)["estimate"]["step_time_s"] > 0


def test_the_printed_comparison_sets_measured_against_the_catalogue():
    rows = {q: (m, c) for q, m, c in comparison(_gpu_cal(collectives=_collectives(
        7e-6, 2e-6, 150e9)))}
    ceiling = rows["GEMM efficiency ceiling (16k^3)"]
    assert ceiling[0].startswith("0.410 of peak = 127.92 TFLOP/s (half-size 256")
    assert ceiling[1].startswith("0.820 of peak = 255.84 TFLOP/s (half-size")
    assert rows["memory copy"] == ("1500.0 GB/s", "2039 GB/s HBM (x0.82 = 1672)")
    intra = next(v for k, v in rows.items() if k.startswith("intra-node bandwidth"))
    assert intra[0].startswith("150.00 GB/s, alpha 2.0 us, launch 7.0 us")
    assert intra[1].startswith("240.0 GB/s (nvlink3 x 0.80)")
    # the fitted model reproduces every measured collective
    assert rows["calibrated model vs measured collectives"][0].startswith("median |error| 0%")


def test_a_cpu_ceiling_is_printed_with_its_unit():
    # the clipolish pass: a CPU run printed the ceiling as a bare "32.4" (a ratio to the fastest
    # measured GEMM, not a fraction of a peak)
    from autopar.calibrate.run import ceiling_text
    cpu = _gpu_cal(catalog=None)
    cpu = Calibration(**{**cpu.__dict__, "device": DeviceInfo("cpu", "cpu", None, 1e10)})
    rows = {q: m for q, m, _ in comparison(cpu)}
    text = rows["GEMM efficiency ceiling (16k^3, of the fastest GEMM)"]
    assert " the fastest GEMM = " in text and "TFLOP/s (half-size 256" in text
    assert ceiling_text(32.4, 2e9, "the fastest GEMM") == "32.4x the fastest GEMM = 64.80 GFLOP/s"
    assert ceiling_text(0.5, 2e9, "the fastest GEMM") == "0.500 of the fastest GEMM = 1.00 GFLOP/s"
    assert ceiling_text(12345.6, 1e6, "the fastest GEMM") == ("12,346x the fastest GEMM = "
                                                               "12.35 GFLOP/s")


def test_the_comparison_prices_measured_attention_at_its_shape():
    # the row used to multiply the peak by the per-kernel efficiency table (a mapping): TypeError
    base = _gpu_cal()
    att = (AttentionSample(1, 32, 8, 8192, 128, True, 1e-3, 3.5e-3),)
    cal = dataclasses.replace(base, attention=att, collectives=(), measured_fields=measured_fields(
        base.gemm, att, base.memory, ()))
    rows = {q: (m, c) for q, m, c in comparison(cal)}
    measured, model = rows["attention fwd+bwd (s=8192, 32 heads)"]
    p = CostParams()
    eff = p.attention_ceiling("fa2", "ampere") * p.attention_shape_factor("fa2", 128, 8192)
    assert model == f"{312e12 * eff / 1e12:.0f} TFLOP/s at efficiency {eff:.3f} (FA2)"
    assert measured.endswith("TFLOP/s")


def test_all_to_all_fit_steps_are_the_cost_models_rounds():
    """The calibration fits an all-to-all's alpha over the rounds of peers the cost model
    charges (NCCL runs up to 8 peers per channel at once), not n-1 exchanges."""
    assert algorithm_terms("all_to_all", 8, 1e6)[0] == 1.0
    assert algorithm_terms("all_to_all", 16, 1e6)[0] == 2.0       # one node: 8 peers a round
    assert algorithm_terms("all_to_all", 16, 1e6, 16)[0] == 1.0   # one per node: one round
    assert algorithm_terms("all_reduce", 16, 1e6)[0] == 30.0


# ------------------------------------------------------------------ the budget is honoured
class _FakeClock:
    """A clock that moves ``step`` seconds each time it is read (no wall time is asserted)."""

    def __init__(self, step: float):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def test_the_budget_stops_the_run_and_keeps_what_it_measured(tmp_path, monkeypatch):
    # new user: `calibrate --model llama3-8b` on a 2-core CPU ran 518 s past its 300 s budget
    import autopar.calibrate.run as run_mod
    monkeypatch.delenv("RANK", raising=False)
    # the run module's clock only (time.monotonic itself stays real for everything else)
    monkeypatch.setattr(run_mod, "time", types.SimpleNamespace(monotonic=_FakeClock(1.0)))
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--model", "tiny-llama", "--out", str(out), "--budget", "6",
                 "--copy-bytes", str(2 ** 20), "--json"]) == 0
    cal = load_calibration(out)
    shapes = len(gemm_shapes(autopar.problem.model_graph(
        autopar.models.get_config("tiny-llama"),
        autopar.TrainingConfig(global_batch_size=1, seq_len=32, precision="bf16"))[0]))
    assert cal.memory is not None and 0 < len(cal.gemm) < shapes and cal.attention == ()
    assert any(f"({len(cal.gemm)} measured); the rest were not measured" in n
               for n in cal.notes)
    assert any("budget ran out before attention" in n for n in cal.notes)
    assert json.loads(out.read_text())["notes"] == list(cal.notes)


def test_a_benchmark_predicted_past_the_budget_is_skipped_with_a_note(tmp_path, capsys,
                                                                       monkeypatch):
    import autopar.calibrate.bench as bench
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(bench, "probe_rate", lambda dtype, device: 1.0)  # 1 FLOP/s
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--model", "tiny-llama", "--out", str(out), "--budget", "30",
                 "--copy-bytes", str(2 ** 20)]) == 0
    captured = capsys.readouterr()
    cal = load_calibration(out)
    assert cal.gemm == () and cal.attention == () and cal.memory is not None
    assert "GEMM shapes were skipped: their predicted time" in " ".join(cal.notes)
    assert "note: attention (seq 32, 4 heads) was skipped" in captured.out
    assert "calibrate: budget 30 s (--budget)" in captured.err
    assert "no collectives are measured" in captured.err
    assert "calibrate: memory copy of 1 MiB" in captured.err


def test_the_notes_are_loaded_strictly(tmp_path):
    cal = dataclasses.replace(_gpu_cal(), notes=("attention was skipped.",))
    path = tmp_path / "cal.json"
    cal.to_json(path)
    assert load_calibration(path) == cal
    assert "notes" not in _gpu_cal().to_dict()   # a complete run's file keeps its bytes
    d = json.loads(path.read_text())
    d["notes"] = [3]
    with pytest.raises(InvalidCalibration, match=r"notes\[0\]"):
        load_calibration(d)
