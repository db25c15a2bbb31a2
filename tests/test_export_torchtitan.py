"""torchtitan exports of both series and their importers.

What validates what:
- 0.3 Python config: loaded by torchtitan's own ``ConfigManager`` (``--module``/``--config``, the
  way ``torchtitan.train`` loads a job), its degrees by ``ParallelDims`` and its model built on the
  meta device, where torchtitan >= 0.3 is installed (the ``frameworks`` extra); everywhere, each
  ``config.<section>.<key>`` it sets is checked against the recorded 0.3.0 schema
  (tests/data/torchtitan_0.3.0_config.json, written from torchtitan's dataclasses by
  ``python -m benchmarks.torchtitan_schema``).
- 0.2.x TOML: every key against the recorded 0.2.2 schema (tests/data/torchtitan_0.2.2_job_config
  .json); torchtitan 0.2's own loader in tests/test_export.py where 0.2 is installed.
- Each recorded schema is compared with the installed torchtitan of that version (drift).
- Round trips: export, import, estimate: the same configuration as the export wrote.
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
import tomllib
import typing
from pathlib import Path

import pytest

import autopar
from autopar.io.importers import from_torchtitan_toml
from autopar.io.titan_config import from_torchtitan_config
from autopar.runtime.errors import UnsupportedPlanError
from autopar.runtime.export import version as titan_version
from export_shapes import SHAPES as BASE_SHAPES, TRAIN, shape_plan
from export_shapes import cluster as _cluster

DATA = Path(__file__).parent / "data"
SCHEMA_02 = json.loads((DATA / "torchtitan_0.2.2_job_config.json").read_text())
SCHEMA_03 = json.loads((DATA / "torchtitan_0.3.0_config.json").read_text())
INSTALLED = titan_version.installed_torchtitan()

SHAPES = {**BASE_SHAPES,
          "cp-ring": (8, dict(dp=2, tp=2, cp=2, pp=1, zero_stage=3, cp_mode="ring")),
          "two-nodes": (16, dict(dp=8, tp=2, pp=1, zero_stage=3, recompute="selective"))}


@pytest.fixture(scope="module", params=list(SHAPES))
def plan(request):
    return shape_plan(*SHAPES[request.param])


def _gpus(plan) -> int:
    c = plan.config
    return c.dp * c.tp * c.pp * c.cp


def _matches(value, type_name: str) -> bool:
    """Whether ``value`` is of a recorded field type (the types autopar writes)."""
    if type_name.startswith("Literal["):
        return value in ast.literal_eval("(" + type_name[len("Literal["):-1] + ",)")
    if "None" in type_name and value is None:
        return True
    if type_name.startswith("bool"):
        return isinstance(value, bool)
    if type_name.startswith("int"):
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name.startswith("float"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_name.startswith("str"):
        return isinstance(value, str)
    if type_name.startswith("list"):
        return isinstance(value, list)
    return True


def _sets(text: str) -> dict[tuple[str, str], object]:
    """The ``config.<section>.<key> = literal`` lines of a 0.3 config file."""
    out = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            t = node.targets[0]
            if isinstance(t.value, ast.Attribute) and isinstance(t.value.value, ast.Name) \
                    and t.value.value.id == "config":
                out[(t.value.attr, t.attr)] = ast.literal_eval(node.value)
    return out


def _same_config(plan, imported, written) -> None:
    """The imported configuration estimates as the written one (both resolved by autopar)."""
    c = plan.config
    par, _ = imported.complete(_gpus(plan), 4)
    cluster = _cluster(_gpus(plan))
    got = autopar.estimate("tiny-llama", cluster, TRAIN, autopar.ParallelConfig(**par)).config
    want = autopar.estimate("tiny-llama", cluster, TRAIN, written).config
    assert got == want, (c, got, want)


# -- 0.3: Python config -----------------------------------------------------------------------

def test_config_sets_only_fields_of_torchtitan_0_3(plan):
    ex = plan.to_torchtitan_config()
    sets = _sets(ex.value)
    assert sets[("parallelism", "tensor_parallel_degree")] == plan.config.tp
    for (section, key), value in sets.items():
        field = SCHEMA_03["sections"][section].get(key)
        assert field is not None, f"config.{section}.{key} is not a torchtitan 0.3.0 field"
        assert _matches(value, field["type"]), (section, key, value, field)


def test_config_round_trips_to_the_written_configuration(plan):
    ex = plan.to_torchtitan_config()
    imp = from_torchtitan_config(ex.text())
    assert imp.model == "tiny-llama" and imp.train["global_batch_size"] == 16
    _same_config(plan, imp, ex.written)


@pytest.fixture(scope="module")
def titan03(tmp_path_factory):
    """torchtitan >= 0.3's ConfigManager and ParallelDims, with a folder on sys.path for the
    exported modules (skipped where another torchtitan, or none, is installed)."""
    if INSTALLED != "0.3":
        pytest.skip(f"torchtitan >= 0.3 not installed (installed: {INSTALLED})")
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.trainer import Trainer
    folder = tmp_path_factory.mktemp("titan03")
    sys.path.insert(0, str(folder))
    yield ConfigManager, ParallelDims, Trainer, folder
    sys.path.remove(str(folder))


def _load(titan03, text: str, name: str):
    manager, _, _, folder = titan03
    (folder / f"{name}.py").write_text(text)
    importlib.invalidate_caches()
    return manager().parse_args(["--module", name, "--config", "autopar_plan"])


def test_config_loads_with_torchtitans_own_classes(plan, titan03, request):
    import torch
    _, parallel_dims, trainer, _ = titan03
    ex = plan.to_torchtitan_config()
    cfg = _load(titan03, ex.value, "autopar_" + request.node.callspec.id.replace("-", "_"))
    assert isinstance(cfg, trainer.Config)          # Trainer.Config.__post_init__ ran
    w, p = ex.written, cfg.parallelism
    dims = parallel_dims.from_config(p, _gpus(plan))  # degrees multiply to the world size
    assert (dims.tp, dims.pp, dims.cp, dims.dp_replicate * dims.dp_shard) == (w.tp, w.pp, w.cp,
                                                                              w.dp)
    assert cfg.training.global_batch_size == 16 and cfg.training.seq_len == 32
    assert (cfg.activation_checkpoint is None) == (w.recompute == "none")
    model = cfg.model_spec.model
    model.update_from_config(config=cfg)
    with torch.device("meta"):
        built = model.build()
    assert len(built.layers) == 4
    # the flavor the file registers is autopar's model: the same parameter count
    from autopar.problem import model_graph
    assert sum(t.numel() for t in built.parameters()) == model_graph(
        "tiny-llama", TRAIN)[0].num_parameters
    for part in p.module_fqns_per_model_part or []:   # every stage's modules exist
        for fqn in part:
            built.get_submodule(fqn)


def test_flavors_autopar_matches_are_torchtitans_own(titan03):
    """The llama3 flavors the exporter names by shape build torchtitan 0.3 models with exactly
    the parameters autopar counts for the preset."""
    import torch
    from torchtitan.models.llama3 import model_registry

    from autopar.problem import model_graph
    for flavor, preset in (("8B", "llama3-8b"), ("70B", "llama3-70b")):
        with torch.device("meta"):
            built = model_registry(flavor).model.build()
        count = model_graph(preset, autopar.TrainingConfig(16, 4096))[0].num_parameters
        assert sum(t.numel() for t in built.parameters()) == count, flavor


def test_overrides_import_as_torchtitan_parses_them(titan03):
    args = ("--module llama3 --config llama3_8b --parallelism.tensor_parallel_degree 4 "
            "--parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2 "
            "--training.seq_len 4096 activation_checkpoint:full")
    imp = from_torchtitan_config(args)
    assert imp.model == "llama3-8b"
    assert imp.parallel["tp"] == 4 and imp.parallel["dp"] == 2
    assert imp.parallel["recompute"] == "full" and imp.train["seq_len"] == 4096
    cfg = titan03[0]().parse_args(args.split())
    assert cfg.parallelism.tensor_parallel_degree == 4 and cfg.training.local_batch_size == 2
    assert type(cfg.activation_checkpoint).__qualname__ == "FullAC.Config"


def test_recorded_0_3_schema_is_torchtitans_own():
    from importlib.metadata import version
    if INSTALLED != "0.3" or version("torchtitan") != SCHEMA_03["torchtitan"]:
        pytest.skip(f"torchtitan {SCHEMA_03['torchtitan']} not installed")
    from benchmarks.torchtitan_schema import schema
    assert json.loads(json.dumps(schema()[1], default=str)) == SCHEMA_03


def test_experts_run_without_expert_tensor_parallelism_in_0_3():
    """#3167: 0.3 has no expert TP; a plan with expert TP > 1 is written with 1 and re-estimated;
    DeepEP is the model's moe_comm_backend."""
    pytest.importorskip("transformers")
    model = dict(name="tiny-moe", family="llama", num_layers=4, hidden_size=64, num_heads=4,
                 vocab_size=256, seq_len=64, ffn_hidden_size=128, num_experts=8, top_k=2,
                 moe_ffn_hidden_size=32)
    p = autopar.optimize(model, autopar.Cluster.custom(1, 8, "H100-80GB"),
                         autopar.TrainingConfig(global_batch_size=16, seq_len=64,
                                                framework="torchtitan"),
                         fixed=dict(tp=2, pp=1, dp=4, ep=4, zero_stage=3, expert_tp=2,
                                    dispatcher="deepep"))
    ex = p.to_torchtitan_config()
    assert p.config.etp == 2 and ex.written.etp == 1
    assert any("expert_tp=2" in w and "#3167" in w for w in ex.warnings)
    assert "moe_comm_backend='deepep'" in ex.value and "from torchtitan.models.qwen3" in ex.value
    imp = from_torchtitan_config(ex.text())
    assert imp.parallel["ep"] == 4 and imp.parallel["expert_tp"] == 1
    assert imp.parallel["dispatcher"] == "deepep"
    assert _sets(ex.value)[("training", "disable_cuda_graphs")] is True
    assert any(w.startswith("re-estimated under torchtitan-0.3") for w in ex.warnings)


def test_the_0_3_profile_plans_only_what_torchtitan_0_3_runs():
    """The torchtitan-0.3 profile (the re-estimate's and the nearest plan's) refuses expert TP
    and ring CP, and its search never proposes them."""
    pytest.importorskip("transformers")
    from autopar.frameworks import get_profile
    prof = get_profile("torchtitan-0.3")
    assert "expert tensor parallelism" in prof.unsupported(
        autopar.ParallelConfig(tp=2, dp=4, ep=4, zero_stage=3, sequence_parallel=True))
    assert prof.unsupported(autopar.ParallelConfig(tp=2, dp=4, ep=4, expert_tp=1, zero_stage=3,
                                                   sequence_parallel=True)) is None
    assert "context-parallel mode 'ring'" in prof.unsupported(
        autopar.ParallelConfig(tp=1, dp=4, cp=2, zero_stage=3))
    model = dict(name="tiny-moe", family="llama", num_layers=4, hidden_size=64, num_heads=4,
                 vocab_size=256, seq_len=64, ffn_hidden_size=128, num_experts=8, top_k=2,
                 moe_ffn_hidden_size=32)
    p = autopar.optimize(model, autopar.Cluster.custom(1, 8, "H100-80GB"),
                         autopar.TrainingConfig(global_batch_size=16, seq_len=64,
                                                framework="torchtitan-0.3"), top_k=20)
    configs = [e.config for e in (p.estimate, *p.alternatives)]
    assert all(c.etp == 1 for c in configs) and any(c.tp > 1 for c in configs), configs
    assert any(c.ep > 1 for c in configs)


def test_fp8_is_the_float8_converter_in_0_3():
    p = autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 8, "H100-80GB"),
                         autopar.TrainingConfig(global_batch_size=16, seq_len=32, precision="fp8"),
                         fixed=dict(tp=1, pp=1, dp=8, zero_stage=3))
    ex = p.to_torchtitan_config()
    assert "Float8LinearConverter.Config(filter_fqns=['lm_head']" in ex.value
    assert not any("precision fp8" in w for w in ex.warnings)
    assert from_torchtitan_config(ex.text()).train["precision"] == "fp8"


def test_export_follows_the_installed_torchtitan(monkeypatch):
    p = autopar.optimize("tiny-llama", _cluster(8), TRAIN, fixed=SHAPES["fsdp"][1])
    for series, marker in (("0.2", "[parallelism]"), ("0.3", "def autopar_plan():"), (None,
                                                                                      "def autopar")):
        monkeypatch.setattr(titan_version, "installed_torchtitan", lambda s=series: s)
        assert marker in p.to_torchtitan().value
    assert "[parallelism]" in p.to_torchtitan("0.2").value
    # our own error type, as to_accelerate_config's unknown plugin (was a bare ValueError)
    with pytest.raises(UnsupportedPlanError, match="0.2, 0.3. Fix: pass one"):
        p.to_torchtitan("0.1")


def test_export_follows_the_plans_torchtitan_when_none_is_installed(monkeypatch):
    """Not installed: a plan made under ``torchtitan`` (v0.2.2) is written as the 0.2 TOML, one
    under ``torchtitan-0.3`` as the 0.3 config; installed and not the plan's series: the
    installed format, with a first warning naming the --framework to re-plan with. An
    explicit series is written as asked, with no such warning."""
    plans = {fw: autopar.optimize("tiny-llama", _cluster(8), autopar.TrainingConfig(
        16, 32, precision="bf16", optimizer="adamw", framework=fw), fixed=SHAPES["fsdp"][1])
             for fw in ("torchtitan", "torchtitan-0.3")}
    monkeypatch.setattr(titan_version, "installed_torchtitan", lambda: None)
    assert titan_version.torchtitan_series(plans["torchtitan"]) == "0.2"
    assert titan_version.torchtitan_series(plans["torchtitan-0.3"]) == "0.3"
    ex = plans["torchtitan"].to_torchtitan()
    assert tomllib.loads(ex.value)["parallelism"]["data_parallel_shard_degree"] == 8
    assert not any("is installed" in w for w in ex.warnings)
    assert any(w.startswith("re-estimated under torchtitan:") for w in ex.warnings)
    assert "def autopar_plan():" in plans["torchtitan-0.3"].to_torchtitan().value
    monkeypatch.setattr(titan_version, "installed_torchtitan", lambda: "0.3")
    ex = plans["torchtitan"].to_torchtitan()
    assert "def autopar_plan():" in ex.value
    assert ex.warnings[0] == (
        "torchtitan 0.3 is installed, so this file is in its format, but the plan was made for "
        "torchtitan 0.2 (--framework torchtitan); what 0.3 runs can differ from the plan (see "
        "the re-estimate). Fix: re-plan for the installed torchtitan with --framework "
        "torchtitan-0.3, or write the format the plan was made for with --export "
        "torchtitan-0.2")
    assert not any("is installed" in w for w in plans["torchtitan"].to_torchtitan("0.3").warnings)
    assert not any("is installed" in w for w in plans["torchtitan-0.3"].to_torchtitan().warnings)
    monkeypatch.setattr(titan_version, "installed_torchtitan", lambda: "0.2")
    ex = plans["torchtitan-0.3"].to_torchtitan()
    assert "[parallelism]" in ex.value
    assert "re-plan for the installed torchtitan with --framework torchtitan," in ex.warnings[0]


def test_cli_export_torchtitan_follows_the_plans_framework(tmp_path, monkeypatch):
    """``--framework torchtitan --export torchtitan FILE`` without torchtitan installed writes
    the v0.2.2 TOML the plan was made for, re-estimated at the plan's own step time."""
    from autopar.cli.exports import export_plan
    monkeypatch.setattr(titan_version, "installed_torchtitan", lambda: None)
    p = autopar.optimize("tiny-llama", _cluster(8), autopar.TrainingConfig(
        16, 32, precision="bf16", optimizer="adamw", framework="torchtitan"),
        fixed=SHAPES["tp-zero2"][1])
    out = tmp_path / "job.toml"
    got = export_plan(p, "torchtitan", str(out))
    assert got["framework"] == "torchtitan-0.2" and got["fits"] is True
    assert tomllib.loads(out.read_text())["parallelism"]["tensor_parallel_degree"] == 2
    assert any("runs the plan as estimated" in w for w in got["warnings"]), got["warnings"]


def test_cli_export_names_the_series_and_the_module(tmp_path, monkeypatch):
    from autopar.cli import main
    out = tmp_path / "myjob.py"
    main(["plan", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB", "--global-batch", "16",
          "--seq-len", "32", "--dp", "8", "--export", "torchtitan-0.3", str(out)])
    text = out.read_text()
    assert "--module myjob --config autopar_plan" in text and "NAME" not in text
    imp = from_torchtitan_config(str(out))
    assert imp.parallel["dp"] == 8


# -- 0.2.x: TOML ------------------------------------------------------------------------------

def test_toml_keys_are_fields_of_torchtitan_0_2_2(plan):
    doc = tomllib.loads(plan.to_torchtitan_toml().text())
    for section, keys in doc.items():
        for key, value in keys.items():
            field = SCHEMA_02["sections"][section].get(key)
            assert field is not None, f"[{section}] {key} is not a torchtitan 0.2.2 field"
            assert _matches(value, field["type"]), (section, key, value, field)


def test_toml_round_trips_to_the_written_configuration(plan):
    ex = plan.to_torchtitan_toml()
    _same_config(plan, from_torchtitan_toml(ex.text()), ex.written)


def test_recorded_0_2_2_schema_is_torchtitans_own():
    from importlib.metadata import version
    if INSTALLED != "0.2" or version("torchtitan") != SCHEMA_02["torchtitan"]:
        pytest.skip(f"torchtitan {SCHEMA_02['torchtitan']} not installed")
    from benchmarks.torchtitan_schema import schema
    assert json.loads(json.dumps(schema()[1], default=str)) == SCHEMA_02


def test_matches_reads_recorded_types():
    assert _matches("never", SCHEMA_02["sections"]["parallelism"]["fsdp_reshard_after_forward"]
                    ["type"])
    assert not _matches("sometimes", "Literal['default', 'always', 'never']")
    assert not _matches(True, "int") and _matches(None, "str | None")
    assert typing.get_origin(typing.Literal["a"]) is typing.Literal


# -- multi-token prediction and the registry base -----------------------------------------------

_TINY_MTP = dict(name="tiny-dsv3-mtp", family="llama", num_layers=4, hidden_size=64, num_heads=4,
                 vocab_size=256, seq_len=64, ffn_hidden_size=128, num_experts=8, top_k=2,
                 moe_ffn_hidden_size=32, num_shared_experts=1, first_dense_layers=1,
                 kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                 mtp_layers=1)


def _mtp_plan(**fixed):
    pytest.importorskip("transformers")
    return autopar.optimize(_TINY_MTP, autopar.Cluster.custom(1, 8, "H100-80GB"),
                            autopar.TrainingConfig(global_batch_size=16, seq_len=64),
                            fixed=dict(tp=1, ep=4, **fixed))


def test_mtp_is_left_out_of_pipelined_exports_and_their_stage_cuts():
    """torchtitan 0.3's deepseek_v3 refuses MTP under pipelining (mtp.py MTPDecoder.Config.
    update_from_config) and v0.2.2 has none: both files list the 4 decoder layers only (no
    'layers.4', which would be the MTP block), and each says so."""
    p = _mtp_plan(pp=2, dp=4)
    assert sum(p.config.stage_blocks) == 5                   # 4 layers + the MTP block
    ex3 = p.to_torchtitan_config()
    parts = _sets(ex3.value)[("parallelism", "module_fqns_per_model_part")]
    layers = [f for part in parts for f in part if f.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(4)]
    assert parts[-1][-2:] == ["norm", "lm_head"]
    assert "num_mtp_layers" not in ex3.value and "MTPLoss" not in ex3.value
    assert any("refuses it with pipeline parallelism" in w and "trains without them" in w
               for w in ex3.warnings)
    doc = tomllib.loads(p.to_torchtitan_toml().text())
    fqns = [f for part in doc["parallelism"]["module_fqns_per_model_part"] for f in part]
    assert "layers.4" not in fqns and "layers.3" in fqns


def test_mtp_is_built_where_torchtitan_0_3_runs_it():
    """Without pipeline and context parallelism the 0.3 file builds the MTP module and its loss
    (models/deepseek_v3/config_registry.py deepseek_v3_debugmodel_mtp does the same)."""
    p = _mtp_plan(pp=1, dp=8)
    ex = p.to_torchtitan_config()
    assert "num_mtp_layers=1" in ex.value
    assert "config.loss = MTPLoss.Config(global_vocab_size=" in ex.value
    assert any("multi-token-prediction module(s) written" in w for w in ex.warnings)


def test_mtp_file_loads_and_builds_in_torchtitan_0_3(titan03):
    """The MTP lines load with torchtitan's own ConfigManager and build an MTP layer (the tiny
    flavor swapped for torchtitan's 'debugmodel', which it registers itself)."""
    import torch
    ex = _mtp_plan(pp=1, dp=8).to_torchtitan_config()
    text = ex.value.replace("model_registry('tiny-dsv3-mtp'", "model_registry('debugmodel'")
    cfg = _load(titan03, text, "autopar_mtp")
    assert type(cfg.loss).__qualname__ == "MTPLoss.Config"
    model = cfg.model_spec.model
    model.update_from_config(config=cfg)
    with torch.device("meta"):
        assert len(model.build().mtp_layers) == 1


def test_deepseek_v3_starts_from_torchtitans_671b_registry_function():
    """torchtitan 0.3.0 has deepseek_v3_671b (models/deepseek_v3/config_registry.py): the
    DeepSeek-V3 file starts from it; a flavor without its own function says which base it
    uses and what the file overrides."""
    from autopar.runtime.export.torchtitan_config import TITAN3_OWN_BASES
    assert TITAN3_OWN_BASES[("deepseek_v3", "671B")] == "deepseek_v3_671b"
    ex = _mtp_plan(pp=1, dp=8).to_torchtitan_config()
    assert "config = config_registry.deepseek_v3_16b()" in ex.value
    assert "# torchtitan 0.3.0 has no registry function for flavor 'tiny-dsv3-mtp'" in ex.value
    assert "set below: model_spec" in ex.value
    if INSTALLED == "0.3":
        from torchtitan.models.deepseek_v3 import config_registry
        assert callable(config_registry.deepseek_v3_671b)


def test_deepseek_v3_export_uses_the_671b_base_and_no_mtp_stage_module(tmp_path, capsys):
    """The user's trial: DeepSeek-V3 on 256 H800s with pp 32 was written from
    deepseek_v3_16b() with 'layers.61' (the MTP block) in the last stage; torchtitan 0.3's model
    has layers 0-60 and refuses MTP under pipelining. Read back, the file estimates with the
    MTP block on the last stage, as the export's re-estimate does."""
    p = autopar.optimize("deepseek-v3", "32x8xH800", autopar.TrainingConfig(
        global_batch_size=4096, seq_len=4096, framework="megatron"), fixed=dict(
        tp=1, pp=32, dp=8, ep=8, zero_stage=1, micro_batch_size=1, virtual_stages=1))
    ex = p.to_torchtitan_config()
    assert "config = config_registry.deepseek_v3_671b()" in ex.value
    parts = _sets(ex.value)[("parallelism", "module_fqns_per_model_part")]
    layers = [f for part in parts for f in part if f.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(61)]
    out = tmp_path / "dsv3.py"
    out.write_text(ex.text())
    from autopar.cli import main
    capsys.readouterr()
    main(["estimate", "--model", "deepseek-v3", "--cluster", "32x8xH800", "--global-batch",
          "4096", "--seq-len", "4096", "--torchtitan-config", str(out)])
    text = " ".join(capsys.readouterr().out.split())
    assert "its 1 multi-token-prediction block(s) are estimated on the last stage" in text


def test_a_file_with_no_torchtitan_setting_is_refused_not_read_as_the_defaults(tmp_path):
    # a new user's report: --torchtitan-config with a TOML job (or any Python file) imported
    # nothing and estimated the defaults, saying "costed as torchtitan-0.3 runs it"
    import pytest as _pytest
    from autopar.errors import InvalidParallelConfig
    from autopar.io.titan_config import from_torchtitan_config
    toml = tmp_path / "job.toml"
    toml.write_text("[parallelism]\ntensor_parallel_degree = 2\n[training]\nseq_len = 8192\n")
    with _pytest.raises(InvalidParallelConfig, match="--torchtitan-toml"):
        from_torchtitan_config(toml)
    other = tmp_path / "x.py"
    other.write_text("x = 1\n")
    with _pytest.raises(InvalidParallelConfig, match="no torchtitan setting found"):
        from_torchtitan_config(other)
