"""Exporters: Megatron-LM arguments, torchtitan TOML, DeepSpeed config, torchrun, Slurm.

Framework names are checked against allow-lists written from each framework's source (named per
list). Where the framework itself is importable, its own loader validates the output too.
"""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from pathlib import Path

import pytest

import autopar
from autopar.runtime import (
    to_deepspeed_config,
    to_megatron_args,
    to_slurm_script,
    to_torchrun_command,
    to_torchtitan_toml,
)
from autopar.runtime import UnsupportedPlanError
from autopar.runtime.export import MEGATRON_FLAGS
from export_shapes import SHAPES as BASE_SHAPES, TRAIN, shape_plan


#: Megatron-LM's own flag table (every flag its parser defines, with values and choices), read
#: by building the parser at the commit it records: benchmarks/megatron_arguments.py.
_MEGATRON = json.loads((Path(__file__).parent / "data" / "megatron_arguments.json").read_text())

#: torchtitan v0.2.2 torchtitan/config/job_config.py: sections and the keys we write.
_TITAN_KEYS = {
    "job": {"description"}, "model": {"name", "flavor"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param",
                 "mixed_precision_reduce"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "context_parallel_degree", "context_parallel_rotate_method",
                    "expert_parallel_degree", "expert_tensor_parallel_degree"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "optimizer": {"name", "weight_decay"},
}

#: DeepSpeed 0.19 deepspeed/runtime/config.py (and its zero/, pipe, AutoTP config classes).
_DS_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
            "zero_optimization", "gradient_clipping", "bf16", "fp16", "optimizer",
            "tensor_parallel", "pipeline", "activation_checkpointing"}

SHAPES = {**BASE_SHAPES,
          "two-nodes": (16, dict(dp=8, tp=2, pp=1, zero_stage=3, recompute="selective"))}


@pytest.fixture(scope="module", params=list(SHAPES))
def plan(request):
    return shape_plan(*SHAPES[request.param])


def _megatron_parser() -> argparse.ArgumentParser:
    """A parser with exactly Megatron-LM's flags (values as text, its choices enforced)."""
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False, add_help=False)
    for flag, spec in _MEGATRON["flags"].items():
        if flag in ("-h", "--help"):
            continue
        if not spec["value"]:
            p.add_argument(flag, action="store_true")
        else:
            nargs = spec["nargs"] if spec["nargs"] in ("+", "*", "?") else None
            p.add_argument(flag, nargs=nargs, choices=spec["choices"])
    return p


def test_every_flag_the_exporter_may_write_is_one_megatron_defines():
    # issue 15 item 4: checked against Megatron-LM's parser, not a list from memory
    assert _MEGATRON["commit"] == "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
    assert MEGATRON_FLAGS <= set(_MEGATRON["flags"]), MEGATRON_FLAGS - set(_MEGATRON["flags"])


def test_megatron_args_parse_with_documented_names(plan):
    ex = to_megatron_args(plan)
    flags = [a for a in ex.value if a.startswith("--")]
    assert set(flags) <= MEGATRON_FLAGS, set(flags) - MEGATRON_FLAGS
    args = _megatron_parser().parse_args(ex.value)
    c = plan.config
    assert (int(args.tensor_model_parallel_size), int(args.pipeline_model_parallel_size)) == (
        c.tp, c.pp)
    assert int(args.global_batch_size) == plan.train.global_batch_size
    assert args.sequence_parallel == c.sequence_parallel
    assert args.use_torch_fsdp2 == (c.zero_stage == 3 and c.pp == 1)


def test_megatron_writes_experts_and_latent_attention():
    """An MoE model with latent attention, leading dense layers and a shared expert: every
    flag is Megatron's, and the layer pattern, experts and MLA sizes are the config's."""
    pytest.importorskip("transformers")
    model = dict(name="tiny-dsv3", family="llama", num_layers=4, hidden_size=64, num_heads=4,
                 vocab_size=256, seq_len=64, ffn_hidden_size=128, num_experts=8, top_k=2,
                 moe_ffn_hidden_size=32, num_shared_experts=1, first_dense_layers=1,
                 kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
                 v_head_dim=16)
    p = autopar.optimize(model, autopar.Cluster.custom(1, 8, "H100-80GB"),
                         autopar.TrainingConfig(global_batch_size=16, seq_len=64),
                         fixed=dict(tp=1, pp=1, dp=8, ep=4))
    ex = to_megatron_args(p)
    assert set(a for a in ex.value if a.startswith("--")) <= MEGATRON_FLAGS
    args = _megatron_parser().parse_args(ex.value)
    assert (args.num_experts, args.moe_router_topk, args.moe_ffn_hidden_size) == ("8", "2", "32")
    assert eval(args.moe_layer_freq) == [0, 1, 1, 1]  # noqa: S307 - Megatron evals it too
    assert args.moe_shared_expert_intermediate_size == "32"
    assert args.multi_latent_attention and (args.kv_lora_rank, args.q_lora_rank) == ("16", "24")
    assert (args.qk_head_dim, args.qk_pos_emb_head_dim, args.v_head_dim) == ("16", "8", "16")
    assert args.moe_token_dispatcher_type == "alltoall" and args.expert_model_parallel_size == "4"


@pytest.mark.parametrize("pp, v", [(2, 1), (2, 2)])
def test_megatron_layout_places_the_mtp_layer_last(pp, v):
    """A multi-token-prediction block is written as 'm' after every decoder layer, so the
    layout's 't' count equals --num-layers, as Megatron-Core checks (pipeline_parallel_layer_
    layout.py validate_layer_layout); a DeepSeek-V3 export had 62 't' for 61 layers."""
    model = dict(name="tiny-mtp", family="llama", num_layers=7, hidden_size=64, num_heads=4,
                 vocab_size=256, seq_len=64, ffn_hidden_size=128, num_experts=8, top_k=2,
                 moe_ffn_hidden_size=32, first_dense_layers=1, mtp_layers=1)
    p = autopar.optimize(model, autopar.Cluster.custom(1, 8, "H100-80GB"),
                         autopar.TrainingConfig(global_batch_size=16, seq_len=64),
                         fixed=dict(tp=1, pp=pp, dp=4, ep=4, virtual_stages=v))
    args = _megatron_parser().parse_args(to_megatron_args(p).value)
    layout = args.pipeline_model_parallel_layout
    assert layout.endswith("mL") and int(args.num_layers) == 7 and args.mtp_num_layers == "1"
    layer_layout = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    layer_layout.PipelineParallelLayerLayout(layout, pp).validate_layer_layout(7, 1)


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
    if c.pp > 1 and c.stage_blocks:
        planned = tuple(sum(c.stage_blocks[s::c.pp]) for s in range(c.pp))
        # DeepSpeed's own partition is said only where it differs from the plan's cut
        assert (ex.written.stage_blocks != planned) == any("stage cuts" in w
                                                           for w in ex.warnings)


def test_deepspeed_config_class_when_installed(plan, monkeypatch):
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig

    c = plan.config

    class MPU:  # DeepSpeed reads the DP size from an mpu object
        def get_data_parallel_world_size(self):
            return c.dp

        def get_model_parallel_world_size(self):
            return c.tp

    # DeepSpeedConfig asks deepspeed.comm for this process's rank (and falls back to world size
    # 1 without a process group); answer rank 0 instead of starting a default process group,
    # which would outlive the test and break the runtime tests' forked workers
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    ds = DeepSpeedConfig(json.loads(to_deepspeed_config(plan).text()), mpu=MPU())
    assert ds.train_batch_size == plan.train.global_batch_size
    assert ds.world_size == c.dp


def test_launchers(plan):
    run = to_torchrun_command(plan, "train.py", ("--plan", "plan.json"))
    slurm = to_slurm_script(plan, "train.py")
    nodes = max(1, plan.world_size // 8)
    assert f"--nnodes={nodes}" in run.value and run.value.endswith("train.py --plan plan.json")
    assert f"#SBATCH --nodes={nodes}" in slurm.value
    assert "srun --cpus-per-task=$SLURM_CPUS_PER_TASK torchrun" in slurm.value
    assert "--rdzv-endpoint=$MASTER_ADDR" in slurm.value
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


# -- what the exported file really runs (issue 12 items 1 and 2) ------------------------------

def test_torchtitan_local_batch_is_the_micro_batch_without_pipelining():
    """llama3-8b on 2x8xH100, global batch 64 x 8192: the plan runs micro-batch 1 with no
    pipelining; local_batch_size = 4 made torchtitan run 4 sequences per forward."""
    plan = autopar.optimize("llama3-8b", "2x8xH100", autopar.TrainingConfig(64, 8192),
                            fixed={"pp": 1, "tp": 1, "cp": 1})
    c = plan.config
    doc = tomllib.loads(plan.to_torchtitan_toml().text())
    tr, par = doc["training"], doc["parallelism"]
    assert (c.micro_batch_size, c.dp) == (1, 16)
    assert tr["local_batch_size"] == 1 and tr["global_batch_size"] == 64   # was 4
    # torchtitan's gradient accumulation (train.py): 64 / (1 * 16) = 4 = the plan's micro-batches
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert tr["global_batch_size"] // (tr["local_batch_size"] * dp) == plan.estimate.num_micro_batches
    assert doc["model"] == {"name": "llama3", "flavor": "8B"}


def test_torchtitan_batch_check_warns_on_the_old_value():
    from autopar.runtime.export import titan_batch_check
    par = {"pipeline_parallel_degree": 1}
    assert titan_batch_check({"local_batch_size": 1, "global_batch_size": 64}, par, 16, 1, 64) == []
    old = titan_batch_check({"local_batch_size": 4, "global_batch_size": 64}, par, 16, 1, 64)
    assert len(old) == 1 and "4 sequences per forward" in old[0]
    pp = {"pipeline_parallel_degree": 2, "pipeline_parallel_microbatch_size": 2}
    assert titan_batch_check({"local_batch_size": 8, "global_batch_size": 64}, pp, 8, 2, 64) == []
    assert titan_batch_check({"local_batch_size": 8, "global_batch_size": 64}, pp, 8, 1, 64)


def test_torchtitan_pipelined_batch_splits_into_micro_batches():
    _, fixed = SHAPES["pp-uneven"]
    plan = autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 8, "A100-80GB"), TRAIN,
                            fixed=fixed)
    doc = tomllib.loads(plan.to_torchtitan_toml().text())
    tr, par = doc["training"], doc["parallelism"]
    assert tr["local_batch_size"] == TRAIN.global_batch_size // plan.config.dp
    assert par["pipeline_parallel_microbatch_size"] == plan.config.micro_batch_size
    assert (tr["local_batch_size"] // par["pipeline_parallel_microbatch_size"]
            == plan.estimate.num_micro_batches)


def test_torchtitan_flavor_only_for_its_own_shapes():
    ex = to_torchtitan_toml(_fixed_plan("llama2-7b", "1x8xA100-80GB", 8, 4096,
                                        dict(tp=1, pp=1, dp=8, zero_stage=3)))
    doc = tomllib.loads(ex.text())
    assert doc["model"]["flavor"] == "llama2-7b"          # not "8B", not the debug model
    assert any("no llama3 flavor" in w and "llama3_args" in w for w in ex.warnings)
    # the file stops at the unknown flavor: the verdict is for the file once it is added
    # (the plan is torch's: the file is re-estimated as torchtitan runs it)
    assert ("what this file runs once the flavor 'llama2-7b' is added (the plan's own "
            "configuration, which was costed for torch)") in ex.warnings[-1]
    with pytest.raises(UnsupportedPlanError, match="no architecture"):
        to_torchtitan_toml(_fixed_plan("tiny-gpt", "1x8xA100-80GB", 16, 32,
                                       dict(tp=1, pp=1, dp=8, zero_stage=3)))


def test_torchtitan_never_writes_ddp_beside_tensor_parallelism():
    """torchtitan raises 'DDP has not supported > 1D parallelism' for replicate + TP/PP."""
    for zero in (0, 1):
        plan = autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 8, "A100-80GB"), TRAIN,
                                fixed=dict(tp=2, pp=1, dp=4, zero_stage=zero))
        ex = plan.to_torchtitan_toml()
        par = tomllib.loads(ex.text())["parallelism"]
        assert par["data_parallel_replicate_degree"] == 1
        assert par["data_parallel_shard_degree"] == 4 and par["fsdp_reshard_after_forward"] == "never"
        assert ex.written.zero_stage == 2
        assert any(f"zero_stage {zero}" in w and "FSDP" in w for w in ex.warnings)
    pure = autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 8, "A100-80GB"), TRAIN,
                            fixed=dict(tp=1, pp=1, dp=8, zero_stage=0))
    par = tomllib.loads(pure.to_torchtitan_toml().text())["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (8, 1)


def _fixed_plan(model, cluster, gbs, seq, config, framework="torch"):
    """A plan for exactly ``config`` (no search): estimate it and wrap it as a Plan."""
    from autopar.models import get_config
    train = autopar.TrainingConfig(gbs, seq, framework=framework)
    e = autopar.estimate(model, cluster, train, config)
    return autopar.Plan(config=e.config, estimate=e, model=model,
                        cluster=autopar.api.as_cluster(cluster).name, train=train,
                        model_config=get_config(model).to_dict())


#: The README's plan (autopar plan --model llama2-70b --cluster 4x8xA100-80GB --global-batch
#: 1024 --seq-len 4096), pinned so the test needs no search.
README_PLAN = dict(tp=2, pp=4, dp=1, cp=4, zero_stage=3, recompute="none", sequence_parallel=True,
                   micro_batch_size=2, virtual_stages=1, schedule="1f1b",
                   stage_blocks=(20, 20, 20, 20), cp_mode="ring")


def test_megatron_export_of_the_readme_plan_says_it_does_not_fit():
    plan = _fixed_plan("llama2-70b", "4x8xA100-80GB", 1024, 4096, README_PLAN)
    # torch pipelining keeps each stage's FSDP parameters and gradients unsharded across
    # micro-batches (MemoryConventions.pp_unsharded_bytes): this ZeRO-3 + PP plan no longer fits
    assert not plan.estimate.fits
    ex = plan.to_megatron_args()
    assert ex.written.zero_stage == 1 and ex.fits is False
    text = "\n".join(ex.warnings)
    assert re.search(r"[\d.]+ GB per GPU \(plan [\d.]+ GB(; [^)]*)?\) of 85\.1 GB: DOES NOT FIT",
                     text)
    # what moved: ZeRO-3's sharded states against ZeRO-1's full gradients (a new user read a
    # memory change as the config change's alone)
    assert re.search(r"plan [\d.]+ GB; (weights|gradients|optimizer states|activations|"
                     r"transient|reserved) [\d.]+ -> [\d.]+ GB", text)
    near = next(w for w in ex.warnings if w.startswith("nearest plan megatron can run"))
    # the nearest plan keeps the default memory margin free, as the command it prints does
    # (without it, a ZeRO-1 plan at the planned degrees that fills all but the last GB)
    assert "s per step" in near and "% kept free)" in near
    assert "# autopar: re-estimated under megatron" in ex.text()


def test_exports_that_run_the_plan_say_so():
    cfg = dict(tp=2, pp=1, dp=4, zero_stage=3, sequence_parallel=True)
    for framework, method in (("megatron", "to_megatron_args"),
                              ("torchtitan", "to_torchtitan_toml")):
        plan = _fixed_plan("tiny-llama", "1x8xA100-80GB", 16, 32, cfg, framework)
        ex = getattr(plan, method)()
        assert ex.fits is True and ex.written == plan.config
        assert "runs the plan as estimated" in ex.warnings[-1]
        # the same configuration planned for torch is re-estimated as the framework runs it
        other = getattr(_fixed_plan("tiny-llama", "1x8xA100-80GB", 16, 32, cfg), method)()
        assert "(the plan's own configuration, which was costed for torch)" in other.warnings[-1]


def test_deepspeed_pipeline_export_is_re_estimated_as_zero_1():
    plan = _fixed_plan("tiny-llama", "1x8xA100-80GB", 16, 32,
                       dict(tp=1, pp=2, dp=4, zero_stage=3, micro_batch_size=1))
    ex = plan.to_deepspeed_config()
    assert ex.value["zero_optimization"]["stage"] == 1 and ex.written.zero_stage == 1
    assert any(w.startswith("re-estimated under deepspeed") and "zero_stage 1 (planned 3)" in w
               for w in ex.warnings)


def test_megatron_search_of_the_readme_problem_runs_under_megatron():
    plan = autopar.optimize("llama2-70b", "4x8xA100-80GB",
                            autopar.TrainingConfig(1024, 4096, framework="megatron"), top_k=10)
    for e in (plan.estimate, *plan.alternatives):
        assert not (e.config.zero_stage == 3 and e.config.pp > 1), e.config
        assert e.config.zero_stage != 2 and e.config.schedule != "gpipe"
    ex = plan.to_megatron_args()
    assert ex.fits is True and "runs the plan as estimated" in ex.warnings[-1]


def test_torchtitan_export_imports_back_as_the_written_configuration():
    from autopar.io.importers import from_torchtitan_toml
    plan = autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 8, "A100-80GB"), TRAIN,
                            fixed=dict(tp=2, pp=1, dp=4, zero_stage=1))
    ex = plan.to_torchtitan_toml()
    imp = from_torchtitan_toml(ex.text())
    assert imp.parallel["zero_stage"] == ex.written.zero_stage == 2
    assert imp.parallel["micro_batch_size"] == plan.config.micro_batch_size


@pytest.mark.parametrize("schedule, v, cuts", [
    ("interleaved-zero-bubble", 1, (8, 8, 8, 8)),
    ("interleaved-1f1b", 2, (3, 5, 4, 4, 4, 4, 4, 4)),
])
def test_torchtitan_pipeline_chunks_import_back_exactly(schedule, v, cuts):
    # the importer ignored module_fqns_per_model_part and took torchtitan's default 2 stages
    # per rank: a pp=8 v=1 plan came back as 16 chunks of 5 (found by the new-user pass)
    from autopar.io.importers import from_torchtitan_toml
    plan = _fixed_plan("llama2-7b", "1x8xA100-80GB", 64, 4096,
                       dict(tp=2, pp=4, dp=1, schedule=schedule, virtual_stages=v,
                            stage_blocks=cuts, recompute="full"), framework="torchtitan")
    imp = from_torchtitan_toml(plan.to_torchtitan_toml().text())
    assert imp.parallel["stage_blocks"] == cuts and imp.parallel["virtual_stages"] == v


def _layer_model(layers: int) -> dict:
    return {"name": f"llama-{layers}l", "family": "llama", "num_layers": layers,
            "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "ffn_hidden_size": 176,
            "vocab_size": 256, "seq_len": 32}


def _unroll(layout: str) -> list[str]:
    """Chunks of a Megatron layout string, ``t*n`` unrolled (Megatron's own grammar:
    megatron/core/transformer/pipeline_parallel_layer_layout.py parse_str_to_list)."""
    import re
    return re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout).split("|")


def _megatron_plan(layers: int, gpus: int, **fixed):
    from autopar.models import get_config
    model = _layer_model(layers)
    train = autopar.TrainingConfig(16, 32)
    cluster = autopar.Cluster.custom(gpus // 8, 8, "A100-80GB")
    e = autopar.estimate(model, cluster, train, {"tp": 1, "dp": 1, "micro_batch_size": 1,
                                                 **fixed})
    return autopar.Plan(config=e.config, estimate=e, model=model["name"], cluster=cluster.name,
                        train=train, model_config=get_config(model).to_dict())


def test_megatron_never_writes_chunks_that_build_fewer_layers():
    """80 layers, pp=16, 2 virtual stages: 5 layers per stage cannot split into two equal
    chunks; per-chunk counts (2 or 3 per chunk) would build 64 or 96 layers. The export writes
    the exact chunks in Megatron's layout string instead."""
    plan = _megatron_plan(80, 16, pp=16, virtual_stages=2)
    assert len(set(plan.config.stage_blocks)) > 1
    ex = plan.to_megatron_args()
    assert "--num-layers-per-virtual-pipeline-stage" not in ex.value
    layout = ex.value[ex.value.index("--pipeline-model-parallel-layout") + 1]
    chunks = _unroll(layout)
    assert len(chunks) == 32 and sum(ch.count("t") for ch in chunks) == 80
    assert [ch.count("t") for ch in chunks] == list(plan.config.stage_blocks)
    assert ex.written == plan.config
    _megatron_parser().parse_args(ex.value)


def test_megatron_expresses_an_uneven_cut_exactly():
    # issue 15: 46 layers, pp=4: the (11, 12, 12, 11) cut in Megatron's own flag, not evened
    plan = _megatron_plan(46, 8, pp=4, dp=2, stage_blocks=(11, 12, 12, 11))
    ex = plan.to_megatron_args()
    layout = ex.value[ex.value.index("--pipeline-model-parallel-layout") + 1]
    assert layout == "Et*11|t*12|t*12|t*11L"
    assert "--decoder-first-pipeline-num-layers" not in ex.value
    assert ex.written.stage_blocks == (11, 12, 12, 11)
    assert "'Et*11|t*12|t*12|t*11L'" in ex.text()  # quoted for the shell


def _placed(placement):
    return autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 8, "A100-80GB"), TRAIN,
                            fixed=dict(tp=2, pp=2, dp=2, cp=1, zero_stage=1,
                                       placement=placement))


def test_megatron_exports_the_rank_placement_it_has_a_flag_for():
    # issue 15 item 4: the placement order was never exported
    pp_inside = _placed(("tp", "cp", "pp", "dp"))
    e = pp_inside.to_megatron_args()
    assert "--use-tp-pp-dp-mapping" in e.value
    assert e.written.placement == ("tp", "cp", "pp", "dp")
    default = _placed(("tp", "cp", "dp", "pp")).to_megatron_args()
    assert "--use-tp-pp-dp-mapping" not in default.value
    assert not any("rank placement" in w for w in default.warnings)


def test_a_placement_the_framework_cannot_build_is_said_and_re_estimated():
    odd = _placed(("dp", "tp", "cp", "pp"))
    for export in (odd.to_megatron_args(), odd.to_torchtitan_toml(),
                   odd.to_deepspeed_config()):
        assert any("rank placement dp-tp-cp-pp" in w for w in export.warnings)
        assert export.written.placement == ("tp", "cp", "dp", "pp")
        assert "--use-tp-pp-dp-mapping" not in str(export.value)


def test_megatron_fsdp2_export_passes_megatrons_own_rule():
    # Megatron-LM's validate_args (run on this export at d98e8a64, outside CI) refused it:
    # "--use-torch-fsdp2 is not supported with gradient accumulation fusion" (on by default)
    p = autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 8, "A100-80GB"), TRAIN,
                         fixed=dict(dp=8, tp=1, pp=1, cp=1, zero_stage=3))
    value = to_megatron_args(p).value
    assert "--use-torch-fsdp2" in value and "--no-gradient-accumulation-fusion" in value
    _megatron_parser().parse_args(value)


def test_optimizer_memory_options_are_written_or_warned():
    """optimizer_offload and bf16 moments reach each framework's file, or a warning says why
    not (and the re-estimate prices what the file runs)."""
    from autopar.models import get_config
    c = dict(tp=1, pp=1, dp=8, zero_stage=2, micro_batch_size=1)
    train = autopar.TrainingConfig(16, 256, optimizer_offload=True, optimizer_state_dtype="bf16")
    e = autopar.estimate("tiny-llama", "1x8xA100-80GB", train, c)
    plan = autopar.Plan(config=e.config, estimate=e, model="tiny-llama", cluster="1x8xA100-80GB",
                        train=train, model_config=get_config("tiny-llama").to_dict())
    ds = plan.to_deepspeed_config()
    assert ds.value["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert any("optimizer_state_dtype" in w for w in ds.warnings)
    mg = plan.to_megatron_args().value
    assert "--optimizer-cpu-offload" in mg and "--use-precision-aware-optimizer" in mg
    assert mg[mg.index("--exp-avg-dtype") + 1] == "bf16"
    tt = plan.to_torchtitan_toml()
    assert any(w.startswith("optimizer_offload") for w in tt.warnings)


def test_megatron_fsdp2_export_reads_back_as_zero3():
    # a new user's round trip: the exporter writes --use-torch-fsdp2 for ZeRO-3, which the
    # importer ignored (the plan read back as ZeRO-0, out of memory)
    from autopar.io.importers import from_megatron_args

    got = from_megatron_args("--tensor-model-parallel-size 2 --use-torch-fsdp2 "
                             "--micro-batch-size 1 --global-batch-size 64 --seq-length 8192")
    assert got.parallel["zero_stage"] == 3


def test_deepspeed_overlap_comm_is_what_the_estimate_priced():
    # ZeRO-2 was written with overlap_comm=True while the deepspeed profile (DeepSpeed's own
    # default for stages 1-2) prices the gradient reduction after backward
    from autopar.frameworks import get_profile
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=32, framework="deepspeed")
    for zero in (1, 2):
        plan = autopar.optimize("tiny-llama", "1x8xA100-80GB", train,
                                fixed={"zero_stage": zero, "tp": 1, "pp": 1}, top_k=1)
        z = plan.to_deepspeed_config().value["zero_optimization"]
        assert z["overlap_comm"] is get_profile("deepspeed").overlap_dp_grad_reduce is False


def test_an_export_that_leaves_no_room_for_the_memory_error_says_so():
    # the torch plan at 67.6 GB is written as Megatron runs it (ZeRO-1, 1F1B): 80.4 GB of 85.1,
    # which the re-estimate warns about as an estimate would (the verdict only said "fits")
    plan = _fixed_plan("llama2-70b", "4x8xA100-80GB", 1024, 4096,
                       dict(tp=4, pp=4, dp=2, cp=1, zero_stage=2, recompute="none",
                            sequence_parallel=True, micro_batch_size=1, virtual_stages=1,
                            schedule="interleaved-zero-bubble"))
    ex = plan.to_megatron_args()
    assert any(w.startswith("memory: ") and "may not fit on the first try" in w
               for w in ex.warnings), ex.warnings


def test_megatron_args_of_an_edited_profile_parse_with_documented_names():
    from autopar.frameworks import get_profile
    prof = get_profile("megatron").with_costs(
        {k: "launcher" for k in ("overlap_dp_grad_reduce", "overlap_tp_comm", "overlap_pp_p2p")},
        overlap_dp_grad_reduce=True, overlap_tp_comm=True, overlap_pp_p2p=())
    train = autopar.TrainingConfig(64, 512, framework="megatron", optimizer_state_dtype="bf16")
    plan = autopar.optimize("tiny-llama", "2x8xA100-80GB", train, profile=prof,
                            fixed={"tp": 2, "sequence_parallel": True, "zero_stage": 1})
    ex = to_megatron_args(plan)
    flags = [a for a in ex.value if a.startswith("--")]
    assert {"--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
            "--no-overlap-p2p-communication", "--exp-avg-dtype"} <= set(flags)
    assert set(flags) <= MEGATRON_FLAGS, set(flags) - MEGATRON_FLAGS
    _megatron_parser().parse_args(ex.value)


def test_torchtitan_export_of_experts_names_the_moe_model_not_llama3():
    """A MoE config is not written as a dense llama3 flavor: the TOML names torchtitan's model
    with experts (deepseek_v3 for latent attention) and the warning lists the sizes to register."""
    pytest.importorskip("transformers")
    model = dict(name="tiny-dsv3", family="llama", num_layers=4, hidden_size=64, num_heads=4,
                 vocab_size=256, seq_len=64, ffn_hidden_size=128, num_experts=8, top_k=2,
                 moe_ffn_hidden_size=32, num_shared_experts=1, first_dense_layers=1,
                 kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    p = autopar.optimize(model, autopar.Cluster.custom(1, 8, "H100-80GB"),
                         autopar.TrainingConfig(global_batch_size=16, seq_len=64),
                         fixed=dict(tp=1, pp=1, dp=8, ep=4))
    ex = to_torchtitan_toml(p)
    doc = tomllib.loads(ex.text())
    assert doc["model"] == {"name": "deepseek_v3", "flavor": "tiny-dsv3"}
    warning = next(w for w in ex.warnings if "torchtitan's llama3 does not have" in w)
    assert "num_experts=8" in warning and "kv_lora_rank=16" in warning
    assert not any("llama3_args" in w for w in ex.warnings)


def test_megatron_args_cp_comm_type_sets_the_context_parallel_mode():
    """--cp-comm-type (Megatron-Core transformer_config.py cp_comm_type) is read, not ignored:
    p2p -> ring, a2a -> ulysses, all_gather -> allgather; a2a+p2p and per-layer mixes refused."""
    from autopar.errors import InvalidParallelConfig
    from autopar.io.megatron_importer import from_megatron_args
    base = "--context-parallel-size 4 --cp-comm-type "
    for kind, mode in (("p2p", "ring"), ("a2a", "ulysses"), ("all_gather", "allgather")):
        imp = from_megatron_args(base + kind)
        assert imp.parallel["cp_mode"] == mode
        assert not any("--cp-comm-type" in n for n in imp.notes)
    assert from_megatron_args(base + "a2a a2a").parallel["cp_mode"] == "ulysses"
    with pytest.raises(InvalidParallelConfig, match="a2a\\+p2p.*not modelled.*Fix"):
        from_megatron_args(base + "a2a+p2p")
    with pytest.raises(InvalidParallelConfig, match="differs by layer"):
        from_megatron_args(base + "a2a p2p")
    assert "cp_mode" not in from_megatron_args("--cp-comm-type a2a").parallel   # cp 1


def test_an_export_named_for_the_other_torchtitan_format_says_so(tmp_path):
    """--export torchtitan picks the format by the installed torchtitan or the plan's framework,
    not by the file name: a 0.2 TOML written to job.py gets a warning with the fix."""
    from types import SimpleNamespace

    from autopar.cli.exports import _write
    ex = SimpleNamespace(fits=True, warnings=())
    out = _write("torchtitan-0.2", str(tmp_path / "job.py"), "[job]\n", ex)
    (w,) = out["warnings"]
    assert "holds torchtitan-0.2's format (toml)" in w and "--export torchtitan-0.3" in w
    assert _write("torchtitan-0.2", str(tmp_path / "job.toml"), "[job]\n", ex)["warnings"] == []
    assert _write("torchtitan-0.3", str(tmp_path / "job.py"), "x = 1\n", ex)["warnings"] == []
    assert _write("megatron", str(tmp_path / "a.py"), "--tp 1\n", ex)["warnings"] == []


def test_printing_an_export_prints_its_text():
    """A new user's print(plan.to_torchrun_command("train.py")) printed Export(value=...)."""
    from autopar.runtime.export.common import Export
    ex = Export("torchrun --standalone train.py", warnings=("w",))
    assert str(ex) == ex.text() and "torchrun --standalone train.py" in str(ex)


def test_deepspeed_parameter_partition_is_deepspeeds_own():
    """partition_boundaries reproduces deepspeed/runtime/utils.py partition_balanced (the
    partition_method 'parameters' the export writes), ties and zero weights included."""
    import random
    utils = pytest.importorskip("deepspeed.runtime.utils")
    from autopar.runtime.export.deepspeed import partition_boundaries
    rng = random.Random(7)
    for _ in range(200):
        n, m = rng.randint(1, 18), rng.randint(1, 7)
        w = [rng.choice([0, 1, 3, 10, rng.randint(0, 50)]) for _ in range(n)]
        assert partition_boundaries(w, m) == list(utils.partition_balanced(w, m)), (w, m)


def test_deepspeed_cut_of_deepseek_v3_is_the_parameter_partition():
    """DeepSeek-V3 (3 dense leading blocks, 58 MoE blocks, the MTP block; ep 8) on 16 stages:
    DeepSpeed's partition by parameter count (embedding and head layers included, each MoE
    layer with its 256/8 local experts) puts 5 blocks on the first stage, not the equal-count
    (4, ..., 4, 3, 3) the note used to give; the re-estimate prices DeepSpeed's cut and does
    not call it unrunnable."""
    from autopar.runtime.verdict import plans_cost_model
    p = autopar.optimize("deepseek-v3", "32x8xH800", autopar.TrainingConfig(
        global_batch_size=4096, seq_len=4096, framework="megatron"), fixed=dict(
        tp=1, pp=16, dp=16, ep=8, zero_stage=1, micro_batch_size=1, virtual_stages=1,
        stage_blocks=(3,) + (4,) * 14 + (3,)))
    ex = to_deepspeed_config(p)
    cut = ex.written.stage_blocks
    assert sum(cut) == 62 and cut != (4,) * 14 + (3, 3)
    assert cut[0] == 5 and cut[-1] == 2
    note = next(w for w in ex.warnings if w.startswith("stage cuts"))
    assert f"estimated as {cut}" in note and "1/8 of the experts" in note
    assert not any("cannot run it as written" in w for w in ex.warnings)
    utils = pytest.importorskip("deepspeed.runtime.utils")
    layers = plans_cost_model(p, p.train).graph.layers
    weights = [x.num_parameters - x.expert_parameters + x.expert_parameters // 8
               for x in layers]
    bounds = utils.partition_balanced(weights, 16)
    assert cut == tuple(sum(x.kind == "block" for x in layers[a:b])
                        for a, b in zip(bounds, bounds[1:]))


def test_deepspeed_pipeline_recompute_note_says_every_layer_is_checkpointed():
    """Under pipelining the file sets activation_checkpoint_interval 1, with which DeepSpeed's
    PipelineModule checkpoints every layer with parameters (pipe/module.py forward): the note
    says so and that the re-estimate prices full recompute, not 'every block marked'."""
    p = autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 8, "A100-80GB"), TRAIN,
                         fixed=dict(tp=1, pp=2, dp=4, zero_stage=1, micro_batch_size=1,
                                    virtual_stages=1, recompute=("full", "none", "none", "none")))
    ex = to_deepspeed_config(p)
    assert ex.value["pipeline"]["activation_checkpoint_interval"] == 1
    assert ex.written.recompute == "full"
    note = next(w for w in ex.warnings if w.startswith("recompute ("))
    assert "activation_checkpoint_interval 1" in note and "all 4 blocks are recomputed whole" in note
    assert "prices full recompute on every block" in note
    assert "checkpoint every block marked" not in note
    # without pipelining the model code checkpoints the marked blocks only, as written
    q = autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 8, "A100-80GB"), TRAIN,
                         fixed=dict(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1,
                                    recompute=("full", "none", "none", "none")))
    ex1 = to_deepspeed_config(q)
    assert ex1.written.recompute == ("full", "none", "none", "none")
    assert any("checkpoint every block marked" in w for w in ex1.warnings)
