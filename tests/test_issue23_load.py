"""Issue 23: loading and measuring plans as the docs say.

Item 3: docs/apply.md loads a Hugging Face model's plan with ``Plan.from_json(path,
model=model)`` where ``model`` is the real one (weights in CPU memory); that raised
InvalidPlanFile for a model already in the plan's dtype (torch.export baked the CPU device of
RoPE's ``inv_freq`` into the graph, which then failed on meta tensors), while a meta copy loaded.

Item 4: docs/calibrate.md prices a CPU's plans on ``measured_cluster(cal)``; such a plan's
cluster is a name ("1x1xmeasured-cpu"), not a spec, and ``autopar measure`` (no --calibration)
could not load it, nor could ``Plan.from_json`` without a hand-built cluster and CostParams.

Item 10 (calibration output): a CPU's GEMMs printed as "0.00 TFLOP/s", and a fit 79% off its
own measurements passed without a warning.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import warnings

import pytest
import torch

import autopar
from autopar.calibrate import calibrated, measured_cluster
from autopar.calibrate.fit import FIT_WARN_RMS_REL_ERROR, algorithm_terms
from autopar.calibrate.run import comparison, device_info, fit_warnings, flops_text
from autopar.calibrate.schema import (Calibration, CollectiveSample, DeviceInfo, GemmSample,
                                      MemorySample, World, measured_fields)
from autopar.cli import main
from autopar.cost.params import CostParams
from autopar.errors import InvalidPlanFile

SEQ = 32


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        tie_word_embeddings=False, attn_implementation="sdpa"))


def _mixtral() -> torch.nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    return MixtralForCausalLM(MixtralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=SEQ, tie_word_embeddings=False,
        router_jitter_noise=0.0, attn_implementation="sdpa"))


@pytest.mark.parametrize("family", [_llama, _mixtral], ids=["llama", "mixtral"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_real_hf_model_loads_its_plan_as_a_meta_copy_does(family, precision, tmp_path):
    pytest.importorskip("transformers")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    # docs/apply.md: the full model, same seed on every rank, in the plan's precision
    model = family().to(dtype)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=SEQ, precision=precision)
    meta_model = copy.deepcopy(model).to("meta")
    cluster = autopar.Cluster.custom(1, 2, "A100-80GB")
    plan = autopar.optimize(meta_model, cluster, train)
    path = tmp_path / "plan.json"
    plan.to_json(path)
    real = autopar.Plan.from_json(path, model=model)  # raised InvalidPlanFile (rotary_emb)
    meta = autopar.Plan.from_json(path, model=meta_model)
    assert real.estimate.step_time_s > 0
    assert real.estimate == meta.estimate == plan.estimate
    assert real.alternatives == meta.alternatives
    # planning the real model gives the same plan (it raised UntraceableModelError)
    assert autopar.optimize(model, cluster, train).estimate == plan.estimate
    # the user's model is untouched: still real, on the CPU, with its weights
    assert all(t.device.type == "cpu" for t in [*model.parameters(), *model.buffers()])
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_meta_copy_keeps_ties_dtypes_and_the_original():
    from autopar.graph.assemble import meta_copy, on_meta
    model = autopar.models.build("tiny-llama", device="cpu", dtype=torch.float32, seed=0)
    model.lm_head.weight = model.embed.weight  # tie, as tie_word_embeddings does
    clone = meta_copy(model)
    assert on_meta(clone) and not on_meta(model)
    assert clone.lm_head.weight is clone.embed.weight
    assert [(n, p.shape, p.dtype, p.requires_grad) for n, p in clone.named_parameters()] == \
        [(n, p.shape, p.dtype, p.requires_grad) for n, p in model.named_parameters()]
    assert isinstance(clone.embed.weight, torch.nn.Parameter)


# ---------------------------------------------------------------- item 4: measured clusters
TRAIN = autopar.TrainingConfig(global_batch_size=2, seq_len=32, precision="fp32",
                               optimizer="adam")
#: GEMM shapes of tiny-llama's linears at one 32-token sequence (M x K x N)
SHAPES = [(32, 64, 64), (32, 64, 176), (32, 176, 64), (32, 64, 256), (32, 64, 32),
          (32, 128, 128)]


def _cpu_cal(ranks: int = 1, gflops: float = 2.0, follow_curve: bool = True) -> Calibration:
    """A calibration of this CPU (its name as `autopar calibrate` records it) whose GEMMs reach
    ``gflops`` GFLOP/s at best, on the efficiency curve (a fit with no error) or off it."""
    p = CostParams(matmul_efficiency={"unknown": 0.5}, matmul_half_size=64.0)
    eff = [p.gemm_efficiency(m, k, n, "unknown") for m, k, n in SHAPES]
    if not follow_curve:  # the smallest GEMMs fastest: no rising curve fits this
        eff = sorted(eff, reverse=True)
    top = max(eff)
    gemm = tuple(GemmSample(m, k, n, 2 * m * k * n / (gflops * 1e9 * e / top))
                 for (m, k, n), e in zip(SHAPES, eff))
    mem = MemorySample(2 ** 20, 2 * 2 ** 20 / 20e9, 2e-6)
    coll = tuple(CollectiveSample(op, "intra", 2, 1, nbytes, 5e-6 + sum(
        t * w for t, w in zip(algorithm_terms(op, 2, nbytes), (2e-6, 1 / 5e9))))
        for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
        for nbytes in (1024, 2 ** 14, 2 ** 18, 2 ** 20)) if ranks > 1 else ()
    return Calibration("2026-12-01T00:00:00Z", torch.__version__,
                       "gloo" if ranks > 1 else "none",
                       device_info(torch.device("cpu"), None), World(ranks, ranks, 1),
                       "tiny-llama", 32, "fp32", measured_fields(gemm, (), mem, coll), gemm, (),
                       mem, coll)


def _cpu_plan(cal: Calibration, path) -> autopar.Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no datasheet peak": true and expected here
        plan = autopar.optimize("tiny-llama", measured_cluster(cal), TRAIN, calibration=cal,
                                fixed=dict(tp=1, pp=1, cp=1, zero_stage=0, micro_batch_size=1))
    plan.to_json(path)
    return plan


def test_measure_runs_a_plan_priced_on_a_measured_cpu(tmp_path, capsys):
    cal = _cpu_cal()
    cal_path, plan_path, out = tmp_path / "cal.json", tmp_path / "plan.json", tmp_path / "r.json"
    cal.to_json(cal_path)
    plan = _cpu_plan(cal, plan_path)
    assert plan.cluster == "1x1xmeasured-cpu"
    with pytest.raises(InvalidPlanFile, match="calibration=FILE"):
        autopar.Plan.from_json(plan_path)
    assert main(["measure", "--plan", str(plan_path), "--out", str(out)]) == 2
    assert "--calibration FILE" in capsys.readouterr().err
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI machine's 2 cores are shared
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["measure", "--plan", str(plan_path), "--calibration", str(cal_path),
                         "--steps", "2", "--warmup", "0", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert "median step" in capsys.readouterr().out
    rec = json.loads(out.read_text())
    # the prediction is the calibrated one the plan was made with, not a datasheet's
    assert rec["prediction"]["step_time_s"] == plan.estimate.step_time_s
    # run on the machine it was priced for: the error tests the (calibrated) cost model
    assert rec["cluster"]["gpu"] == "measured-cpu" and rec["prediction"]["comparable"] is True
    assert "not on the plan's" not in rec["notes"]


def test_measure_takes_the_cluster_of_a_custom_named_plan(tmp_path, capsys):
    plan = autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 1, "A100-80GB", name="lab"),
                            TRAIN)
    plan_path, out = tmp_path / "plan.json", tmp_path / "r.json"
    plan.to_json(plan_path)
    assert main(["measure", "--plan", str(plan_path), "--out", str(out)]) == 2
    assert "Cluster.custom" in capsys.readouterr().err
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["measure", "--plan", str(plan_path), "--cluster", "1x1xA100-80GB",
                     "--steps", "1", "--warmup", "0", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    rec = json.loads(out.read_text())
    assert rec["prediction"]["step_time_s"] == plan.estimate.step_time_s


def test_from_json_with_the_calibration_gives_the_planned_estimate(tmp_path):
    cal = _cpu_cal(ranks=2)
    cal_path, plan_path = tmp_path / "cal.json", tmp_path / "plan.json"
    cal.to_json(cal_path)
    plan = _cpu_plan(cal, plan_path)
    assert plan.config.dp == 2 and plan.estimate.comm_by_link
    with pytest.warns(UserWarning, match="no datasheet peak"):
        back = autopar.Plan.from_json(plan_path, calibration=cal_path)
    assert back.estimate == plan.estimate and back.alternatives == plan.alternatives
    # a calibration of another machine is not taken for the plan's
    other = dataclasses.replace(cal, world=World(4, 4, 1))
    with pytest.raises(InvalidPlanFile, match="1x4xmeasured-cpu"):
        autopar.Plan.from_json(plan_path, calibration=other)


def test_from_json_with_a_gpu_calibration_reprices_as_planned(tmp_path):
    gemm = tuple(GemmSample(m, k, n, 2 * m * k * n / (312e12 * CostParams(
        matmul_efficiency={"ampere": 0.5}, matmul_half_size=256.0).gemm_efficiency(m, k, n)))
        for m, k, n in [(4096, 8192, 8192), (4096, 1024, 8192), (512, 8192, 2048),
                        (256, 256, 256)])
    mem = MemorySample(2 ** 30, 2 * 2 ** 30 / 1.5e12, 4e-6)
    cal = Calibration("2026-12-01T00:00:00Z", "2.13.0", "nccl",
                      DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", 85e9),
                      World(8, 8, 1), "tiny-llama", 32, "bf16",
                      measured_fields(gemm, (), mem, ()), gemm, (), mem, ())
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = autopar.optimize("tiny-llama", "1x8xA100-80GB", train, calibration=cal)
        back = autopar.Plan.from_json(plan.to_json(), calibration=cal)
    assert back.estimate == plan.estimate
    assert autopar.Plan.from_json(plan.to_json()).estimate != plan.estimate  # datasheet's


# ---------------------------------------------------------------- item 10: calibrate output
def test_flops_are_printed_in_a_unit_that_shows_them():
    assert flops_text(2.0e9) == "2.00 GFLOP/s"          # was "0.00 TFLOP/s"
    assert flops_text(312e12) == "312.00 TFLOP/s"
    assert flops_text(4.5e6) == "4.50 MFLOP/s"
    rows = comparison(_cpu_cal(gflops=2.0))
    assert rows[0][0].startswith("GEMM fp32 best") and rows[0][1] == "2.00 GFLOP/s"


def test_a_poor_fit_warns_in_the_result_and_the_cli(tmp_path, capsys, monkeypatch):
    good, bad = _cpu_cal(), _cpu_cal(follow_curve=False)
    assert calibrated(measured_cluster(good), None, good, "fp32").warnings == ()
    c = calibrated(measured_cluster(bad), None, bad, "fp32")
    err = c.fitted["gemm_fit_rms_rel_error"]
    assert err > FIT_WARN_RMS_REL_ERROR
    assert len(c.warnings) == 1 and f"{err:.0%} rms" in c.warnings[0]
    assert fit_warnings(bad) == list(c.warnings) and fit_warnings(good) == []
    with pytest.warns(UserWarning, match="calibration warning: the GEMM efficiency curve fit"):
        autopar.estimate("tiny-llama", measured_cluster(bad), TRAIN, {"dp": 1},
                         calibration=bad)
    # the CLI prints it beside the table (the run itself is replaced: the fit is under test)
    import autopar.calibrate.run as run
    monkeypatch.setattr(run, "run_calibration", lambda opts, device, progress=None: bad)
    assert main(["calibrate", "--model", "tiny-llama", "--out", str(tmp_path / "c.json")]) == 0
    captured = capsys.readouterr()
    assert "GFLOP/s" in captured.out and "TFLOP/s" not in captured.out
    assert "warning: the GEMM efficiency curve fit misses" in captured.out.replace("\n", " ")
    assert main(["calibrate", "--model", "tiny-llama", "--out", str(tmp_path / "c.json"),
                 "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == bad.to_dict()  # the file, nothing else
    assert "warning: the GEMM efficiency curve fit misses" in captured.err.replace("\n", " ")
