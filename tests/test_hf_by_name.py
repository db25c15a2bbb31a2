"""Hugging Face presets by name: ``autopar.estimate/optimize("hf-...")``, the CLI's ``--model
hf-...`` and ``autopar models``, and a plan file of one re-estimated without the module."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.cli import main  # noqa: E402
from autopar.graph import extract, hf  # noqa: E402

TRAIN = autopar.TrainingConfig(global_batch_size=8, seq_len=64)


def test_estimate_by_name_equals_the_traced_module():
    by_name = autopar.estimate("hf-tiny-llama", "1x2xA100-80GB", TRAIN, autopar.ParallelConfig(tp=2))
    module = autopar.estimate(hf.build("hf-tiny-llama"), "1x2xA100-80GB", TRAIN,
                              autopar.ParallelConfig(tp=2))
    assert by_name.step_time_s == module.step_time_s
    assert by_name.memory_per_gpu_bytes == module.memory_per_gpu_bytes
    assert extract(hf.build("hf-tiny-llama"), 64, 1, name="hf-tiny-llama").num_blocks == 4


def test_plan_file_of_a_preset_reloads_without_the_module(tmp_path):
    plan = autopar.optimize("hf-tiny-mixtral", "1x4xA100-80GB", TRAIN, top_k=1)
    assert plan.model == "hf-tiny-mixtral" and plan.model_config is None
    path = tmp_path / "plan.json"
    plan.to_json(path)
    again = autopar.Plan.from_json(path)  # rebuilt from the preset name, re-estimated
    assert again.config == plan.config
    assert again.estimate.step_time_s == pytest.approx(plan.estimate.step_time_s, rel=1e-12)


def test_cli_plans_and_lists_hf_presets(capsys):
    assert main(["plan", "--model", "hf-tiny-llama", "--cluster", "1x2xA100-80GB",
                 "--global-batch", "8", "--seq-len", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "hf-tiny-llama"
    assert main(["models", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)["hf_models"]}
    assert listed["hf-deepseek-v3"]["layers"] == 61
    assert listed["hf-deepseek-v3"]["model_class"] == "DeepseekV3ForCausalLM"
    assert set(listed) == set(hf.HF_PRESETS)


def test_unknown_name_mentions_hf_presets():
    with pytest.raises(autopar.errors.InvalidModelConfig, match="hf-"):
        autopar.estimate("hf-nonexistent", "1x2xA100-80GB", TRAIN, autopar.ParallelConfig())


def test_cli_estimates_a_preset_plan_file(tmp_path, capsys):
    # `autopar estimate --plan` refused a plan of an hf-* preset ("is of an nn.Module")
    path = tmp_path / "p.json"
    assert main(["plan", "--model", "hf-tiny-llama", "--cluster", "1x2xA100-80GB",
                 "--global-batch", "8", "--seq-len", "64", "--out", str(path), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main(["estimate", "--plan", str(path), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["step_time_s"] == pytest.approx(planned["estimate"]["step_time_s"], rel=1e-12)


def test_megatron_export_of_a_preset_says_its_shape_is_missing():
    plan = autopar.optimize("hf-tiny-mixtral", "1x4xA100-80GB", TRAIN, top_k=1,
                            fixed={"pp": 1})
    ex = plan.to_megatron_args()
    assert "--num-layers" not in ex.value
    assert any("shape is not written" in w and "--num-experts" in w for w in ex.warnings)
