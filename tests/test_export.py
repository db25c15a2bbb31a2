"""Exporters: Megatron-LM arguments, torchtitan TOML, DeepSpeed config, torchrun, Slurm.

Framework names are checked against allow-lists written from each framework's source (named per
list). Where the framework itself is importable, its own loader validates the output too.
"""

from __future__ import annotations

import argparse
import json
import tomllib

import pytest

import autopar
from autopar.runtime import (
    to_deepspeed_config,
    to_megatron_args,
    to_slurm_script,
    to_torchrun_command,
    to_torchtitan_toml,
)
from autopar.runtime.export import MEGATRON_FLAGS

TRAIN = autopar.TrainingConfig(global_batch_size=16, seq_len=32, precision="bf16",
                               optimizer="adamw")

#: Megatron-LM megatron/training/arguments.py: flags taking a value (the rest are store_true).
_MEGATRON_VALUED = {
    "--tensor-model-parallel-size": int, "--pipeline-model-parallel-size": int,
    "--context-parallel-size": int, "--num-layers-per-virtual-pipeline-stage": int,
    "--decoder-first-pipeline-num-layers": int, "--decoder-last-pipeline-num-layers": int,
    "--micro-batch-size": int, "--global-batch-size": int, "--seq-length": int,
    "--max-position-embeddings": int, "--recompute-granularity": str, "--recompute-method": str,
    "--recompute-num-layers": int, "--fp8-format": str, "--num-layers": int,
    "--hidden-size": int, "--num-attention-heads": int, "--ffn-hidden-size": int,
    "--num-query-groups": int, "--vocab-size": int, "--normalization": str,
    "--norm-epsilon": float, "--position-embedding-type": str, "--rotary-base": int,
    "--attention-dropout": float, "--hidden-dropout": float, "--optimizer": str,
}
_MEGATRON_CHOICES = {"--recompute-granularity": {"full", "selective"},
                     "--recompute-method": {"uniform", "block"},
                     "--normalization": {"LayerNorm", "RMSNorm"},
                     "--position-embedding-type": {"learned_absolute", "rope", "none"},
                     "--fp8-format": {"e4m3", "hybrid"}, "--optimizer": {"adam", "sgd"}}

#: torchtitan 0.2.x torchtitan/config/job_config.py: sections and the keys we write.
_TITAN_KEYS = {
    "job": {"description"}, "model": {"name"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param",
                 "mixed_precision_reduce"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "context_parallel_degree"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "optimizer": {"name", "weight_decay"},
}

#: DeepSpeed 0.19 deepspeed/runtime/config.py (and its zero/, pipe, AutoTP config classes).
_DS_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
            "zero_optimization", "gradient_clipping", "bf16", "fp16", "optimizer",
            "tensor_parallel", "pipeline", "activation_checkpointing"}

SHAPES = {
    "fsdp": (8, dict(dp=8, tp=1, pp=1, zero_stage=3)),
    "tp-zero2": (8, dict(dp=4, tp=2, pp=1, zero_stage=2)),
    "3d-mixed": (8, dict(pp=2, dp=2, tp=2, recompute=("full", "none", "selective", "none"),
                         micro_batch_size=1, zero_stage=1, stage_blocks=(1, 1, 1, 1),
                         virtual_stages=2)),
    "pp-uneven": (8, dict(pp=2, dp=4, tp=1, zero_stage=0, stage_blocks=(1, 3),
                          recompute="full", schedule="gpipe")),
    "two-nodes": (16, dict(dp=8, tp=2, pp=1, zero_stage=3, recompute="selective")),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def plan(request):
    gpus, fixed = SHAPES[request.param]
    nodes = max(1, gpus // 8)
    return autopar.optimize("tiny-llama", autopar.Cluster.custom(nodes, gpus // nodes,
                                                                 "A100-80GB"), TRAIN, fixed=fixed)


def _megatron_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False)
    for flag in MEGATRON_FLAGS:
        if flag in _MEGATRON_VALUED:
            p.add_argument(flag, type=_MEGATRON_VALUED[flag],
                           choices=_MEGATRON_CHOICES.get(flag))
        else:
            p.add_argument(flag, action="store_true")
    return p


def test_megatron_args_parse_with_documented_names(plan):
    ex = to_megatron_args(plan)
    flags = [a for a in ex.value if a.startswith("--")]
    assert set(flags) <= MEGATRON_FLAGS, set(flags) - MEGATRON_FLAGS
    args = _megatron_parser().parse_args(ex.value)
    c = plan.config
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (c.tp, c.pp)
    assert args.global_batch_size == plan.train.global_batch_size
    assert args.sequence_parallel == c.sequence_parallel
    assert args.use_torch_fsdp2 == (c.zero_stage == 3 and c.pp == 1)


def test_megatron_says_what_it_cannot_express():
    _, fixed = SHAPES["3d-mixed"]
    p = autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 8, "A100-80GB"), TRAIN,
                         fixed=fixed)
    ex = to_megatron_args(p)
    assert any("per-block recompute" in w for w in ex.warnings)
    assert "--recompute-method" in ex.value and "block" in ex.value
    assert ex.text().startswith("# autopar:")


def test_torchtitan_toml_keys_and_cuts(plan):
    ex = to_torchtitan_toml(plan)
    doc = tomllib.loads(ex.text())
    for section, keys in doc.items():
        assert set(keys) <= _TITAN_KEYS[section], (section, set(keys) - _TITAN_KEYS[section])
    par, c = doc["parallelism"], plan.config
    assert par["tensor_parallel_degree"] == c.tp and par["pipeline_parallel_degree"] == c.pp
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == c.dp
    if c.pp > 1:
        parts = par["module_fqns_per_model_part"]
        assert [sum(f.startswith("layers.") for f in p) for p in parts] == list(c.stage_blocks)
    if not isinstance(c.recompute, str) and len(set(c.recompute)) > 1:
        assert any("per-block recompute" in w for w in ex.warnings)


def test_torchtitan_loader_when_installed(plan, tmp_path):
    job = pytest.importorskip("torchtitan.config.job_config")  # torchtitan 0.2.x only
    from torchtitan.config import ConfigManager
    path = tmp_path / "job.toml"
    path.write_text(to_torchtitan_toml(plan).text())
    cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
    assert isinstance(cfg, job.JobConfig)
    assert cfg.parallelism.tensor_parallel_degree == plan.config.tp


def test_deepspeed_config_keys_and_batch(plan):
    ex = to_deepspeed_config(plan)
    cfg, c = ex.value, plan.config
    assert set(cfg) <= _DS_KEYS, set(cfg) - _DS_KEYS
    assert cfg["train_batch_size"] == (cfg["train_micro_batch_size_per_gpu"]
                                       * cfg["gradient_accumulation_steps"] * c.dp)
    assert json.loads(ex.text())["train_batch_size"] == plan.train.global_batch_size
    if c.pp > 1 and len(set(c.stage_blocks)) > 1:
        assert any("stage cuts" in w for w in ex.warnings)


def test_deepspeed_config_class_when_installed(plan, tmp_path):
    pytest.importorskip("deepspeed")
    import deepspeed.comm as dscomm
    from deepspeed.runtime.config import DeepSpeedConfig

    c = plan.config

    class MPU:  # DeepSpeed reads the DP size from an mpu object
        def get_data_parallel_world_size(self):
            return c.dp

        def get_model_parallel_world_size(self):
            return c.tp

    if not dscomm.is_initialized():
        dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, rank=0,
                                world_size=1, init_method=f"file://{tmp_path}/store")
    ds = DeepSpeedConfig(json.loads(to_deepspeed_config(plan).text()), mpu=MPU())
    assert ds.train_batch_size == plan.train.global_batch_size


def test_launchers(plan):
    run = to_torchrun_command(plan, "train.py", ("--plan", "plan.json"))
    slurm = to_slurm_script(plan, "train.py")
    nodes = max(1, plan.world_size // 8)
    assert f"--nnodes={nodes}" in run.value and run.value.endswith("train.py --plan plan.json")
    assert f"#SBATCH --nodes={nodes}" in slurm.value
    assert "srun torchrun" in slurm.value and "--rdzv-endpoint=$MASTER_ADDR" in slurm.value
    if nodes == 1:
        assert "--standalone" in run.value


def test_plan_methods_delegate(plan):
    before = plan.to_json()
    assert plan.to_megatron_args().value == to_megatron_args(plan).value
    assert plan.to_torchtitan_toml().value == to_torchtitan_toml(plan).value
    assert plan.to_deepspeed_config().value == to_deepspeed_config(plan).value
    assert plan.to_torchrun_command().value == to_torchrun_command(plan).value
    assert plan.to_slurm_script().value == to_slurm_script(plan).value
    assert plan.to_json() == before


def test_deepspeed_batch_adds_up_when_context_parallelism_is_dropped():
    plan = autopar.optimize("llama2-7b", "2x8xA100-80GB",
                            autopar.TrainingConfig(global_batch_size=64, seq_len=8192),
                            fixed={"cp": 2, "tp": 2})
    out = plan.to_deepspeed_config()
    cfg, c = out.value, plan.config
    ds_dp = plan.world_size // (c.tp * c.pp)
    assert (cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * ds_dp
            == cfg["train_batch_size"] == 64)
    assert any("cp=2" in w and "data-parallel" in w for w in out.warnings)
