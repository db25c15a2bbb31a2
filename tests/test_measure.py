"""``autopar measure`` (issue 15, item 3): a plan's steps run with ``plan.apply`` on gloo (2
forked ranks, and one process through the CLI), and the record is of the published-run schema:
``benchmarks/records.py`` reads it back, with the prediction error computed from it."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

import autopar
from autopar.calibrate.measure import record, run_steps
from autopar.cli import main
from benchmarks import records

from test_runtime import run_ranks

TRAIN = autopar.TrainingConfig(global_batch_size=2, seq_len=32, precision="fp32",
                               optimizer="adam")


def _plan(world: int, **fixed) -> autopar.Plan:
    return autopar.optimize("tiny-llama", autopar.Cluster.custom(1, world, "A100-80GB"), TRAIN,
                            fixed=dict(tp=1, pp=1, cp=1, zero_stage=0, micro_batch_size=1,
                                       **fixed))


def _worker(rank, world, store_path, plan, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    try:
        result = run_steps(plan, steps=3, warmup=1, device=torch.device("cpu"))
        rec = record(plan, result, 3, 1, torch.device("cpu"))
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(rec, f)
    finally:
        dist.destroy_process_group()


def _check(rec: dict, plan: autopar.Plan, steps: int) -> None:
    assert rec["training"]["framework"] == "torch"
    assert rec["cluster"]["gpu"] == "A100-SXM4-80GB"
    assert rec["cluster"]["num_gpus"] == plan.world_size
    assert rec["cluster"]["ran_on"]["device"] == "cpu"
    assert rec["plan"]["dp"] == plan.config.dp and rec["plan"]["tp"] == 1
    m, p = rec["measured"], rec["prediction"]
    assert len(m["step_times_s"]) == steps and all(t > 0 for t in m["step_times_s"])
    assert m["step_time_s"] == sorted(m["step_times_s"])[steps // 2]
    assert m["memory_gib"] is None and len(m["memory_per_rank_bytes"]) == plan.world_size
    assert p["step_time_s"] == plan.estimate.step_time_s
    assert p["step_time_relative_error"] == pytest.approx(
        (plan.estimate.step_time_s - m["step_time_s"]) / m["step_time_s"])
    assert p["comparable"] is False and "not on the plan's A100-SXM4-80GB" in rec["notes"]
    # the loss of the synthetic data falls from ln(256) = 5.55 as the model trains
    assert m["losses"][0] == pytest.approx(5.55, abs=0.1)
    # benchmarks/records.py reads it as it reads the published runs
    r = records.parse(rec)
    assert r.measured_step_s == m["step_time_s"]
    assert r.cluster.world_size == plan.world_size and r.train.seq_len == 32
    assert r.fixed["dp"] == plan.config.dp
    back = autopar.Plan.from_dict(rec["autopar_plan"])
    assert back.config == plan.config and back.estimate == plan.estimate


def test_measure_two_ranks_on_gloo(tmp_path):
    plan = _plan(2, dp=2)
    out = tmp_path / "rec.json"
    run_ranks(2, _worker, plan, str(out))
    _check(json.loads(out.read_text()), plan, 3)


def test_cli_measure_single_process(tmp_path, capsys):
    plan = _plan(1, dp=1)
    plan_path, out = tmp_path / "plan.json", tmp_path / "rec.json"
    plan.to_json(plan_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the forked ranks: the CI machine's 2 cores are shared
    try:
        assert main(["measure", "--plan", str(plan_path), "--steps", "3", "--warmup", "1",
                     "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    text = capsys.readouterr().out
    assert "median step" in text and "predicted" in text
    assert "(1 rank): median step" in text and "over 3 steps" in text   # was "(1 ranks)"
    _check(json.loads(out.read_text()), plan, 3)
    assert not dist.is_initialized()


def test_cli_measure_refuses_zero_steps(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    _plan(1, dp=1).to_json(plan_path)
    # refused by the parser, as every other bad flag (it was an InvalidPlanFile without a fix)
    with pytest.raises(SystemExit) as info:
        main(["measure", "--plan", str(plan_path), "--steps", "0", "--out",
              str(tmp_path / "r.json")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --steps: '0' must be >= 1" in err and "Fix:" in err
    with pytest.raises(SystemExit):   # the bound named for -1 was ">= 0"
        main(["measure", "--plan", str(plan_path), "--steps", "-1"])
    assert "argument --steps: '-1' must be >= 1" in capsys.readouterr().err


def _refuse_build(monkeypatch):
    """Make any model build fail the test: a refusal must come before it."""
    import autopar.calibrate.measure as measure

    def no_build(*a, **k):
        raise AssertionError("a model was built before the refusal")
    monkeypatch.setattr(measure, "build", no_build)


def test_cli_measure_refuses_a_multi_rank_plan_in_one_process(tmp_path, capsys, monkeypatch):
    # new user: a 32-rank plan measured in a plain shell built the whole model and was OOM-killed
    for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    _refuse_build(monkeypatch)
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=32, precision="fp32",
                                   optimizer="adam")
    plan = autopar.optimize("tiny-llama", autopar.Cluster.from_spec("2x4xA100"), train,
                            fixed=dict(tp=1, pp=1, cp=1, dp=8, zero_stage=0,
                                       micro_batch_size=1))
    plan_path, out = tmp_path / "plan.json", tmp_path / "rec.json"
    plan.to_json(plan_path)
    assert main(["measure", "--plan", str(plan_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "InvalidParallelConfig" in err and "needs 8 ranks" in err
    assert "WORLD_SIZE unset" in err and "nothing was built" in err
    assert "torchrun --nnodes=2 --nproc-per-node=4 -m autopar.cli measure" in err
    assert not out.exists() and not dist.is_initialized()


def test_measure_refuses_a_model_larger_than_the_memory_before_building(tmp_path, capsys,
                                                                        monkeypatch):
    import autopar.calibrate.measure as measure
    for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    _refuse_build(monkeypatch)
    monkeypatch.setattr(measure, "available_bytes", lambda device: 1e5)
    plan_path, out = tmp_path / "plan.json", tmp_path / "rec.json"
    _plan(1, dp=1).to_json(plan_path)
    assert main(["measure", "--plan", str(plan_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "builds the whole tiny-llama model in fp32" in err and "nothing was built" in err
    assert "Fix: measure a smaller model" in err
    # in GB (1e9 bytes), as plan and estimate print memory
    need = 4.0 * autopar.models.get_config("tiny-llama").num_parameters   # fp32 bytes
    flat = " ".join(err.split())
    assert f"shards it: {need / 1e9:.3g} GB, more than" in flat  # 0.000871 (GiB: 0.000811)
    assert "(0.0001 GB, shared by 1 rank)" in flat
    assert "GiB" not in err
    assert not out.exists() and not dist.is_initialized()


def _gpu_like_record(rec: dict, peak_bytes: float) -> dict:
    """``rec`` as a GPU run writes it: ``memory_gib`` and the memory error set from the peak."""
    rec["measured"]["memory_per_rank_bytes"] = [peak_bytes] * len(
        rec["measured"]["memory_per_rank_bytes"])
    rec["measured"]["memory_gib"] = peak_bytes / 2 ** 30
    pred = rec["prediction"]["memory_per_gpu_bytes"]
    rec["prediction"]["memory_relative_error"] = (pred - peak_bytes) / peak_bytes
    return rec


def test_memory_line_is_in_gb_as_plan_and_estimate_print_it():
    # a new user: plan/estimate print GB (1e9 bytes), measure printed GiB (2^30)
    from autopar.cli.measure_cmds import memory_line
    rec = {"measured": {"memory_gib": 42e9 / 2 ** 30, "memory_per_rank_bytes": [40e9, 42e9]},
           "prediction": {"memory_per_gpu_bytes": 45e9, "memory_relative_error": 3 / 42}}
    assert memory_line(rec) == ("peak memory 42.00 GB per GPU (max over ranks); predicted "
                                "45.00 GB (+7.1%)")   # in GiB: 39.12 and 41.91
    rec["prediction"]["memory_relative_error"] = None
    assert memory_line(rec).endswith("predicted 45.00 GB")


def test_cli_measure_prints_gb_and_keeps_memory_gib_in_the_record(tmp_path, capsys,
                                                                  monkeypatch):
    import autopar.calibrate.measure as measure
    real = measure.record
    monkeypatch.setattr(measure, "run_steps", lambda plan, steps, warmup, device: {
        "step_times_s": [0.5] * steps, "memory_per_rank_bytes": [1.0] * plan.world_size,
        "losses": [5.5] * (steps + warmup), "notes": []})
    monkeypatch.setattr(measure, "record",
                        lambda *a, **k: _gpu_like_record(real(*a, **k), 42e9))
    plan = _plan(1, dp=1)
    plan_path, out = tmp_path / "plan.json", tmp_path / "rec.json"
    plan.to_json(plan_path)
    assert main(["measure", "--plan", str(plan_path), "--steps", "3", "--warmup", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    pred = plan.estimate.memory_per_gpu_bytes
    assert (f"peak memory 42.00 GB per GPU (max over ranks); predicted {pred / 1e9:.2f} GB "
            f"({(pred - 42e9) / 42e9 * 100:+.1f}%)") in " ".join(text.split())
    assert "GiB" not in text
    rec = json.loads(out.read_text())   # the record's fields are unchanged: GiB, and bytes
    assert rec["measured"]["memory_gib"] == pytest.approx(42e9 / 2 ** 30)
    assert max(rec["measured"]["memory_per_rank_bytes"]) == 42e9
    assert not dist.is_initialized()
