"""Accelerate (FSDP and DeepSpeed plugin YAML) and Colossal-AI plugin exports and imports.

Accelerate's own code validates the YAML where accelerate is installed: ``accelerate launch``'s
config loading (``_validate_launch_command``), its environment for the workers
(``prepare_multi_gpu_env`` / ``prepare_deepspeed_cmd_env``), then the plugins built from that
environment as the workers build them (``FullyShardedDataParallelPlugin``, ``ParallelismConfig``,
``DeepSpeedPlugin``) and DeepSpeed's batch check on the config Accelerate fills. Colossal-AI
cannot be installed beside torch 2.13 (its PyPI release pins torch<=2.5.1): its output is checked
against the plugin signatures recorded from its source (tests/data/colossalai_plugins.json,
benchmarks/colossalai_plugins.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import autopar
from autopar.config import ParallelConfig
from autopar.errors import InvalidParallelConfig
from autopar.io.colossalai_importer import from_colossalai_plugin
from autopar.io.plugin_importers import from_accelerate_yaml
from autopar.runtime import to_accelerate_config, to_colossalai_plugin
from export_shapes import shape_plan


SHAPES = {
    "fsdp": (8, dict(dp=8, tp=1, pp=1, zero_stage=3)),
    "ddp": (8, dict(dp=8, tp=1, pp=1, zero_stage=0)),
    "tp-zero2": (8, dict(dp=4, tp=2, pp=1, zero_stage=2, recompute="full")),
    "cp": (8, dict(dp=2, tp=2, cp=2, pp=1, zero_stage=3, micro_batch_size=1)),
    "3d": (8, dict(pp=2, dp=2, tp=2, recompute="full", micro_batch_size=1, zero_stage=1,
                   schedule="1f1b", virtual_stages=1)),
    "two-nodes": (16, dict(dp=8, tp=2, pp=1, zero_stage=1)),
}

#: Fields a round trip must keep (placement is compared by its non-trivial dimensions).
ROUND_TRIP = ("tp", "pp", "cp", "dp", "zero_stage", "recompute", "sequence_parallel",
              "micro_batch_size", "virtual_stages", "schedule", "stage_blocks", "ep")

_COLOSSAL = json.loads((Path(__file__).parent / "data" / "colossalai_plugins.json").read_text())


@pytest.fixture(scope="module", params=list(SHAPES))
def plan(request):
    return shape_plan(*SHAPES[request.param])


def _same(imported: dict, written: ParallelConfig):
    got = ParallelConfig(**imported)
    for name in ROUND_TRIP:
        a, b = getattr(got, name), getattr(written, name)
        if name == "stage_blocks" and (a is None or b is None):
            continue   # None is the balanced cut
        if name in ("virtual_stages", "schedule") and written.pp == 1:
            continue
        assert a == b, (name, a, b)
    if imported.get("placement"):
        real = [d for d in got.placement if getattr(got, d) > 1]
        assert real == [d for d in written.placement if getattr(written, d) > 1]


# -- Accelerate ------------------------------------------------------------------------------

@pytest.mark.parametrize("plugin", ["fsdp", "deepspeed"])
def test_accelerate_export_imports_back_as_written(plan, plugin):
    ex = to_accelerate_config(plan, plugin)
    imp = from_accelerate_yaml(ex.text())
    assert ex.written.pp == 1 and ex.written.ep == 1
    if plugin == "deepspeed":
        assert ex.written.tp == ex.written.cp == 1
    _same(imp.parallel, ex.written)
    assert imp.train["global_batch_size"] == plan.train.global_batch_size
    assert ex.warnings[-1].startswith("re-estimated under " + ("torch" if plugin == "fsdp"
                                                                 else "deepspeed"))


def _accelerate_env(path: Path) -> tuple[SimpleNamespace, dict]:
    """(launch args, the workers' environment) as ``accelerate launch --config_file`` builds
    them (accelerate/commands/launch.py launch_command, before it starts processes)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        return args, prepare_deepspeed_cmd_env(args)[1]
    return args, prepare_multi_gpu_env(args)


def _set_env(monkeypatch, env: dict) -> None:
    for k, v in env.items():
        if k.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")):
            monkeypatch.setenv(k, v)


@pytest.mark.parametrize("plugin", ["fsdp", "deepspeed"])
def test_accelerate_builds_its_plugins_from_the_yaml(plan, plugin, tmp_path, monkeypatch):
    pytest.importorskip("accelerate")
    ex = to_accelerate_config(plan, plugin)
    path = tmp_path / "accelerate.yaml"
    path.write_text(ex.text())
    from accelerate.commands.config.config_args import ClusterConfig
    cfg = ClusterConfig.from_yaml_file(str(path))   # refuses unknown keys
    w = ex.written
    assert cfg.num_processes == plan.world_size and cfg.num_machines == max(1, plan.world_size // 8)
    args, env = _accelerate_env(path)
    _set_env(monkeypatch, env)
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    if plugin == "fsdp" and env.get("ACCELERATE_USE_FSDP") == "true":
        from accelerate.utils import FullyShardedDataParallelPlugin
        fsdp = FullyShardedDataParallelPlugin()
        assert fsdp.fsdp_version == 2
        assert fsdp.reshard_after_forward is (w.zero_stage == 3)
        assert fsdp.activation_checkpointing is (w.recompute == "full")
        if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true":
            from accelerate.parallelism_config import ParallelismConfig
            pc = ParallelismConfig()
            assert (pc.tp_size, pc.cp_size, pc.data_parallel_size) == (w.tp, w.cp, w.dp)
            # the checks Accelerator.prepare runs on it (a duck-typed FSDP2 accelerator)
            from accelerate.utils import DistributedType
            pc._validate_accelerator(SimpleNamespace(
                multi_device=True, num_processes=plan.world_size, is_fsdp2=True,
                distributed_type=DistributedType.FSDP, is_main_process=True))
    elif plugin == "fsdp":
        raise AssertionError("the FSDP plugin's export must launch FSDP, not DDP")
    else:
        from accelerate.utils import DeepSpeedPlugin
        ds = DeepSpeedPlugin()
        assert ds.zero_stage == w.zero_stage
        # Accelerator._prepare_deepspeed fills the batch from the DataLoader's; DeepSpeed then
        # checks train_batch_size = micro x accumulation x data-parallel size
        pytest.importorskip("deepspeed")
        import deepspeed.runtime.config as ds_config
        per_device = int(ex.text().split("per_device_batch_size=")[1].split()[0])
        ds.deepspeed_config_process(
            must_match=False, train_micro_batch_size_per_gpu=per_device,
            train_batch_size=per_device * ds.get_value("gradient_accumulation_steps")
            * plan.world_size)

        class MPU:
            def get_data_parallel_world_size(self):
                return plan.world_size

            def get_model_parallel_world_size(self):
                return 1

        monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
        checked = ds_config.DeepSpeedConfig(dict(ds.deepspeed_config), mpu=MPU())
        assert checked.train_batch_size == plan.train.global_batch_size


def _fixed(cluster: str, fixed: dict, **train):
    t = autopar.TrainingConfig(**{**dict(global_batch_size=16, seq_len=32), **train})
    return autopar.optimize("tiny-llama", cluster, t, fixed=fixed)


def test_accelerate_maps_pipelines_to_data_parallelism_and_keeps_pp_out_of_the_nearest_plan():
    plan = _fixed("1x8xA100-80GB", dict(tp=1, pp=4, dp=2, zero_stage=1, micro_batch_size=1))
    ex = plan.to_accelerate_config()
    assert ex.written.pp == 1 and ex.written.dp == 8
    assert any(w.startswith("pp=4: Accelerate has no pipeline parallelism") for w in ex.warnings)
    assert "re-estimated under torch" in ex.warnings[-1]


def test_accelerate_refuses_tensor_parallelism_without_a_shard_dimension():
    # parallelism_config.py: FSDP needs dp_shard or cp beside tp; the export folds tp into dp
    plan = _fixed("1x2xA100-80GB", dict(tp=2, pp=1, dp=1, zero_stage=0))
    ex = plan.to_accelerate_config()
    assert ex.written.tp == 1 and ex.written.dp == 2


def test_accelerate_fsdp_export_writes_fsdp_for_a_plan_without_sharding():
    """--export accelerate-fsdp never writes DDP (MULTI_GPU): FSDP2's fully_shard has no unsharded
    mode, so a ZeRO-0 data-parallel plan is written as FSDP2 ZeRO-2 and said so with the DDP
    alternative."""
    ex = shape_plan(*SHAPES["ddp"]).to_accelerate_config()
    assert "distributed_type: FSDP\n" in ex.text() and "fsdp_version: 2" in ex.text()
    assert ex.written.zero_stage == 2
    assert any(w.startswith("zero_stage 0: the plan shards nothing") and "--multi_gpu" in w
               for w in ex.warnings)


def test_accelerate_keeps_tensor_parallelism_when_folded_stages_give_fsdp_a_shard_dimension():
    """The user's trial (llama3-70b tp4 pp8 dp1 ZeRO-0) was written as DDP over 32 ranks: TP was
    folded away because dp was 1 before the pipeline stages became data-parallel ranks. With the
    stages folded, dp_shard > 1 beside TP, which ParallelismConfig._validate_accelerator
    accepts."""
    plan = _fixed("1x8xA100-80GB", dict(tp=2, pp=4, dp=1, zero_stage=0, micro_batch_size=1))
    ex = plan.to_accelerate_config()
    w = ex.written
    assert (w.tp, w.pp, w.dp, w.zero_stage) == (2, 1, 4, 2)
    text = ex.text()
    assert "distributed_type: FSDP\n" in text and "parallelism_config_tp_size: 2" in text
    assert "parallelism_config_dp_shard_size: 4" in text
    assert not any(x.startswith("tp=2:") for x in ex.warnings)


def test_accelerate_import_refuses_what_accelerate_and_deepspeed_refuse():
    base = ("distributed_type: FSDP\nnum_processes: 8\nnum_machines: 1\nmixed_precision: bf16\n"
            "fsdp_config:\n  fsdp_version: 2\n")
    with pytest.raises(InvalidParallelConfig, match="reshard_after_forward must be a bool"):
        from_accelerate_yaml(base + "  fsdp_reshard_after_forward: FULL_SHARD\n")
    with pytest.raises(InvalidParallelConfig, match="total_size \\(4\\) does not match"):
        from_accelerate_yaml(base + "parallelism_config:\n  parallelism_config_tp_size: 2\n"
                             "  parallelism_config_dp_shard_size: 2\n")
    with pytest.raises(InvalidParallelConfig, match="no dimension for FSDP to shard"):
        from_accelerate_yaml(base + "parallelism_config:\n  parallelism_config_tp_size: 8\n")
    ds = ("distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n  zero_stage: 2\n"
          "  gradient_accumulation_steps: 4\n")
    with pytest.raises(InvalidParallelConfig, match="train_batch_size is not equal to "
                       "micro_batch_per_gpu \\* gradient_acc_step \\* world_size"):
        from_accelerate_yaml(ds + "# autopar-script: per_device_batch_size=2 "
                             "gradient_accumulation_steps=4 global_batch_size=32\n")
    with pytest.raises(InvalidParallelConfig, match="offload_param is valid only with ZeRO "
                       "stage 3"):
        from_accelerate_yaml(ds + "  offload_param_device: cpu\n")
    ok = from_accelerate_yaml(ds + "# autopar-script: per_device_batch_size=2 "
                              "gradient_accumulation_steps=4 global_batch_size=64\n")
    assert ok.parallel == {"dp": 8, "zero_stage": 2, "micro_batch_size": 2}


# -- Colossal-AI -----------------------------------------------------------------------------

def _check_against_schema(doc: dict, world: int) -> None:
    """The plugin's recorded signature: known keyword names, the required ones given, each
    value of its default's type, the listed values from its source."""
    spec = _COLOSSAL["plugins"][doc["plugin"]]
    params, kw = spec["params"], doc["kwargs"]
    assert set(kw) <= set(params), set(kw) - set(params)
    assert {p for p, s in params.items() if s["required"]} <= set(kw)
    for name, value in kw.items():
        default = params[name]["default"]
        if default not in (None, "None") and default[0].isdigit() or default in ("True", "False"):
            assert type(value) is type(eval(default)) or isinstance(value, float), (name, value)
    consts = spec["constants"]
    if "SUPPORTED_PRECISION" in consts:
        assert kw["precision"] in consts["SUPPORTED_PRECISION"]
    if kw.get("sequence_parallelism_mode"):
        sp_modes = _COLOSSAL["plugins"]["HybridParallelPlugin"]["constants"]["SUPPORT_SP_MODE"]
        assert kw["sequence_parallelism_mode"] in sp_modes
    if doc["plugin"].endswith("HybridParallelPlugin"):
        assert world % (kw["tp_size"] * kw["pp_size"]) == 0
        assert kw["zero_stage"] in (0, 1, 2) and (kw["pp_size"] == 1 or kw["zero_stage"] <= 1)


def test_colossalai_export_matches_the_recorded_signature_and_imports_back(plan):
    ex = to_colossalai_plugin(plan)
    doc = json.loads(ex.text())
    _check_against_schema(doc, plan.world_size)
    imp = from_colossalai_plugin(ex.text())
    _same(imp.parallel, ex.written)
    assert imp.train["global_batch_size"] == plan.train.global_batch_size
    assert "re-estimated under torch" in ex.warnings[-1]


def test_colossalai_plugin_choice():
    zero3 = _fixed("1x8xA100-80GB", dict(tp=1, pp=1, dp=8, zero_stage=3))
    assert zero3.to_colossalai_plugin().value["plugin"] == "GeminiPlugin"
    zero2 = _fixed("1x8xA100-80GB", dict(tp=1, pp=1, dp=8, zero_stage=2))
    assert zero2.to_colossalai_plugin().value["plugin"] == "LowLevelZeroPlugin"
    piped = _fixed("1x8xA100-80GB", dict(tp=1, pp=2, dp=4, zero_stage=3, micro_batch_size=1))
    ex = piped.to_colossalai_plugin()
    assert ex.value["plugin"] == "HybridParallelPlugin" and ex.value["kwargs"]["zero_stage"] == 1
    assert ex.written.zero_stage == 1


def test_colossalai_import_refuses_what_its_plugins_assert():
    hybrid = {"plugin": "HybridParallelPlugin", "autopar": {"world_size": 8}}
    with pytest.raises(InvalidParallelConfig, match="zero stage must be 0 or 1 when using "
                       "pipeline parallelism"):
        from_colossalai_plugin({**hybrid, "kwargs": dict(tp_size=1, pp_size=2, zero_stage=2,
                                                         microbatch_size=1)})
    with pytest.raises(InvalidParallelConfig, match="num_microbatches or microbatch_size"):
        from_colossalai_plugin({**hybrid, "kwargs": dict(tp_size=1, pp_size=2)})
    with pytest.raises(InvalidParallelConfig, match="must be enabled when using tensor "
                       "parallelism"):
        from_colossalai_plugin({**hybrid, "kwargs": dict(
            tp_size=1, pp_size=1, enable_sequence_parallelism=True,
            sequence_parallelism_mode="split_gather")})
    with pytest.raises(InvalidParallelConfig, match="not divisible by tp_size 3"):
        from_colossalai_plugin({**hybrid, "kwargs": dict(tp_size=3, pp_size=1)})
    with pytest.raises(InvalidParallelConfig, match="only supports stage 1/2"):
        from_colossalai_plugin({"plugin": "LowLevelZeroPlugin", "kwargs": {"stage": 3}})
    with pytest.raises(InvalidParallelConfig, match="dp_size should be divisible by ep_size"):
        from_colossalai_plugin({"plugin": "MoeHybridParallelPlugin", "autopar": {"world_size": 8},
                                "kwargs": dict(tp_size=2, pp_size=1, ep_size=3)})


def test_the_nearest_plan_keeps_the_degrees_the_runner_fixes():
    # Accelerate is re-estimated under the torch profile, which runs pipelines; the nearest plan
    # offered for an Accelerate file must not be one (alternatives.nearest's limits)
    from autopar.alternatives import nearest
    from autopar.problem import Problem
    plan = _fixed("1x8xA100-80GB", dict(tp=1, pp=2, dp=4, zero_stage=1, micro_batch_size=1))
    problem = Problem.build("tiny-llama", "1x8xA100-80GB", plan.train)
    line = nearest(problem.cost_model, "torch", plan.estimate, {"pp": 1, "ep": 1})
    assert line.startswith("nearest plan torch can run with pp=1 ep=1: ")
    assert " pp=1 " in line and "--pp 1 --ep 1" in line and "fixed={'pp': 1, 'ep': 1}" in line


def test_the_nearest_plan_keeps_the_memory_margin_its_command_keeps():
    # user pass of 2026-12-06: the nearest plan offered for an Accelerate export of Mixtral
    # filled 84.9 of 84.9 GB, while the `autopar plan` command it printed keeps 8% free and
    # finds another plan
    from autopar.alternatives import nearest
    from autopar.problem import Problem
    from autopar.search.margin import check_margin
    plan = _fixed("1x8xA100-80GB", dict(tp=1, pp=2, dp=4, zero_stage=1, micro_batch_size=1))
    cm = Problem.build("tiny-llama", "1x8xA100-80GB", plan.train).cost_model
    line = nearest(cm, "torch", plan.estimate, {"pp": 1})
    assert f"({check_margin(None):.0%} kept free)" in line and "--memory-margin" not in line
    line = nearest(cm, "torch", plan.estimate, {"pp": 1}, memory_margin=0.3)
    assert "(30% kept free)" in line
    assert "--pp 1 --memory-margin 0.3," in line and "memory_margin=0.3))" in line


def test_accelerate_context_parallelism_is_priced_fused():
    # a new user's trial: the FSDP plugin's torch context parallelism (torch's own
    # context_parallel, fused SDPA per chunk) was re-estimated as plan.apply's plain-op ring,
    # +156% on Llama 3 8B at 8k tokens, with a warning blaming "torch"
    plan = autopar.optimize("llama3-8b", "1x8xH100",
                            autopar.TrainingConfig(global_batch_size=16, seq_len=8192),
                            fixed=dict(tp=1, pp=1, cp=2, cp_mode="ring", zero_stage=3))
    ex = to_accelerate_config(plan, "fsdp")
    line = next(w for w in ex.warnings if w.startswith("re-estimated under torch"))
    assert "this file runs the plan as estimated" not in line
    pct = float(line.split(" s per step (")[1].split("%")[0])
    assert pct < -10   # fused per-chunk attention, against the plan's plain-op ring
    ring = autopar.estimate("llama3-8b", "1x8xH100",
                            autopar.TrainingConfig(global_batch_size=16, seq_len=8192),
                            ParallelConfig(tp=1, pp=1, cp=2, dp=4, cp_mode="ring",
                                           zero_stage=3))
    (w,) = [w for w in ring.warnings if "context-parallel attention" in w]
    assert w.startswith("plan.apply (the torch profile) runs ring")
    assert "torch's own context_parallel run fused ring attention" in w
