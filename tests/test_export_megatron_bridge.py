"""Megatron-Bridge ConfigContainer override export and import.

megatron-bridge cannot be installed here (its releases need Python 3.12 and megatron-core with
transformer-engine), so its config classes do not run in CI: every field the export writes is
checked against the field names recorded from its source, each dataclass with its bases through
Megatron-Core (tests/data/megatron_bridge_schema.json, benchmarks/megatron_bridge_schema.py, at
the Megatron-Bridge commit the file names).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import autopar
from autopar.cli import main
from autopar.config import ParallelConfig
from autopar.errors import InvalidParallelConfig
from autopar.io.megatron_bridge_importer import from_megatron_bridge_yaml
from autopar.runtime import to_megatron_args, to_megatron_bridge

yaml = pytest.importorskip("yaml")

TRAIN = autopar.TrainingConfig(global_batch_size=16, seq_len=32, precision="bf16",
                               optimizer="adamw")

SCHEMA = json.loads((Path(__file__).parent / "data" / "megatron_bridge_schema.json").read_text())

SHAPES = {
    "3d": dict(pp=2, dp=2, tp=2, recompute="full", micro_batch_size=1, zero_stage=1,
               schedule="1f1b", virtual_stages=1),
    "interleaved": dict(pp=2, dp=4, tp=1, recompute="selective", micro_batch_size=1,
                        zero_stage=1, schedule="interleaved-1f1b", virtual_stages=2),
    "cp-fsdp": dict(dp=2, tp=2, cp=2, pp=1, zero_stage=3, micro_batch_size=1,
                    sequence_parallel=True),
    "ddp": dict(dp=8, tp=1, pp=1, zero_stage=0),
    "uneven": dict(pp=2, dp=4, tp=1, zero_stage=1, micro_batch_size=1, virtual_stages=1,
                   schedule="1f1b", stage_blocks=(1, 3)),
    "tp-pp-dp": dict(pp=2, dp=2, tp=2, zero_stage=1, micro_batch_size=1, virtual_stages=1,
                     schedule="1f1b", placement=("tp", "cp", "pp", "dp")),
}

#: Fields a round trip must keep (placement by its non-trivial dimensions).
ROUND_TRIP = ("tp", "pp", "cp", "dp", "zero_stage", "recompute", "sequence_parallel",
              "micro_batch_size", "virtual_stages", "schedule", "stage_blocks", "ep", "cp_mode")


def _plan(fixed: dict, model="tiny-llama", train=TRAIN):
    return autopar.optimize(model, autopar.Cluster.custom(1, 8, "A100-80GB"), train,
                            fixed=fixed)


@pytest.fixture(scope="module", params=list(SHAPES))
def plan(request):
    return _plan(SHAPES[request.param])


def _config(par: dict, world: int) -> ParallelConfig:
    """The imported degrees with dp from the world size, as Megatron-Bridge derives it
    (ConfigContainer.get_data_parallel_size)."""
    mp = par.get("tp", 1) * par.get("pp", 1) * par.get("cp", 1)
    return ParallelConfig(**{"dp": world // mp, **par})


def _in_schema(doc: dict) -> list[str]:
    """The fields of ``doc`` that Megatron-Bridge's ConfigContainer does not have."""
    bad = [s for s in doc if s not in SCHEMA["container"]]
    for section, body in doc.items():
        if isinstance(body, dict):
            known = set(SCHEMA["sections"][section]["fields"])
            bad += [f"{section}.{k}" for k in body if k not in known]
    return bad


def test_every_exported_field_is_one_megatron_bridge_defines(plan):
    ex = to_megatron_bridge(plan)
    assert _in_schema(ex.value) == []
    assert ex.value["mixed_precision"] in SCHEMA["mixed_precision"]


def test_the_yaml_is_the_value_and_reads_back_to_the_written_configuration(plan):
    ex = to_megatron_bridge(plan)
    text = ex.text()
    assert yaml.safe_load(text) == ex.value
    imp = from_megatron_bridge_yaml(text)
    par, train = imp.complete(plan.world_size, 4)
    got, w = _config(par, plan.world_size), ex.written
    for name in ROUND_TRIP:
        a, b = getattr(got, name), getattr(w, name)
        if name == "stage_blocks" and (a is None or b is None):
            continue   # None is the balanced cut
        if name in ("virtual_stages", "schedule") and w.pp == 1:
            continue
        assert a == b, (name, a, b)
    assert [d for d in got.placement if getattr(got, d) > 1] == \
        [d for d in w.placement if getattr(w, d) > 1]
    assert train["global_batch_size"] == plan.train.global_batch_size
    assert train["seq_len"] == plan.train.seq_len and train["precision"] == "bf16"
    assert train["optimizer"] == "adamw"


def test_it_runs_and_is_re_estimated_as_megatron_lm(plan):
    """Megatron-Bridge runs Megatron-Core: the written configuration and verdict are
    Megatron-LM's export's."""
    ex, mlm = to_megatron_bridge(plan), to_megatron_args(plan)
    assert ex.written == mlm.written and ex.fits == mlm.fits
    assert ex.warnings[-len(mlm.warnings):] == mlm.warnings
    assert ex.warnings[-1].startswith("re-estimated under megatron")


def test_switches_a_recipe_may_set_are_pinned():
    """Recipes set recompute, overlaps and uneven stages of their own; the file sets each to
    what was estimated."""
    ex = to_megatron_bridge(_plan(SHAPES["ddp"]))
    m = ex.value["model"]
    assert m["recompute_granularity"] is None and m["sequence_parallel"] is False
    assert m["num_layers_in_first_pipeline_stage"] is None
    assert ex.value["ddp"]["overlap_grad_reduce"] is False
    assert ex.value["dist"]["use_megatron_fsdp"] is False
    assert any("ddp.overlap_grad_reduce false" in w for w in ex.warnings)


def test_experts_and_fp8_are_written_in_bridge_fields():
    model = dict(name="tiny-moe", family="llama", num_layers=4, hidden_size=64, num_heads=4,
                 vocab_size=256, seq_len=64, ffn_hidden_size=128, num_experts=8, top_k=2,
                 moe_ffn_hidden_size=32)
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=64, precision="fp8",
                                   framework="megatron")
    p = autopar.optimize(model, autopar.Cluster.custom(1, 8, "H100-80GB"), train,
                         fixed=dict(tp=2, pp=1, dp=4, ep=4, expert_tp=1, zero_stage=1))
    ex = to_megatron_bridge(p)
    assert _in_schema(ex.value) == []
    m = ex.value["model"]
    assert m["expert_model_parallel_size"] == 4 and m["expert_tensor_parallel_size"] == 1
    assert m["moe_token_dispatcher_type"] in ("alltoall", "flex")
    assert ex.value["mixed_precision"] == "bf16_with_fp8_delayed_scaling_mixed"
    imp = from_megatron_bridge_yaml(ex.text())
    par, train = imp.complete(8, 4)
    got = _config(par, 8)
    assert (got.ep, got.etp, got.dispatcher) == (4, 1, ex.written.dispatcher)
    assert train["precision"] == "fp8"


def test_fp32_offload_and_bf16_moments_round_trip():
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=32, precision="fp32",
                                   optimizer_offload=True, optimizer_state_dtype="bf16",
                                   framework="megatron")
    ex = to_megatron_bridge(_plan(dict(pp=1, dp=8, tp=1, zero_stage=1), train=train))
    assert _in_schema(ex.value) == []
    opt = ex.value["optimizer"]
    assert opt["exp_avg_dtype"] == "torch.bfloat16" and opt["optimizer_cpu_offload"] is True
    assert ex.value["mixed_precision"] is None
    imp = from_megatron_bridge_yaml(ex.text())
    assert imp.train["precision"] == "fp32" and imp.train["optimizer_state_dtype"] == "bf16"
    assert imp.train["optimizer_offload"] is True
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=32, precision="fp32",
                                   framework="megatron")
    ex = to_megatron_bridge(_plan(SHAPES["3d"], train=train))
    assert any("model.pipeline_dtype" in w for w in ex.warnings)


def test_the_import_refuses_what_megatron_bridge_refuses():
    with pytest.raises(InvalidParallelConfig, match="mutually exclusive"):
        from_megatron_bridge_yaml({"dist": {"use_megatron_fsdp": True, "use_torch_fsdp2": True}})
    with pytest.raises(InvalidParallelConfig, match="only supported with adam"):
        from_megatron_bridge_yaml({"optimizer": {"optimizer": "sgd",
                                                 "use_precision_aware_optimizer": True,
                                                 "use_distributed_optimizer": True}})
    with pytest.raises(InvalidParallelConfig, match="only supported with distributed"):
        from_megatron_bridge_yaml({"optimizer": {"use_precision_aware_optimizer": True}})
    # Megatron-LM's layer split rule, through the flags the fields stand for
    with pytest.raises(InvalidParallelConfig):
        from_megatron_bridge_yaml({"model": {"num_layers": 46,
                                             "pipeline_model_parallel_size": 4}})


def test_the_import_reads_a_hand_written_override_and_names_what_it_ignores():
    imp = from_megatron_bridge_yaml("model:\n  tensor_model_parallel_size: 4\n"
                                    "  context_parallel_size: 2\n  cp_comm_type: a2a\n"
                                    "  hidden_dropout: 0.0\ntrain:\n  global_batch_size: 64\n"
                                    "mixed_precision: bf16-mixed\n")
    assert imp.parallel["tp"] == 4 and imp.parallel["cp_mode"] == "ulysses"
    assert imp.train == {"global_batch_size": 64, "precision": "bf16"}
    assert any("model.hidden_dropout" in n for n in imp.notes)


def test_cli_exports_megatron_bridge(tmp_path, capsys):
    out = tmp_path / "bridge.yaml"
    rc = main(["plan", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB", "--global-batch",
               "16", "--seq-len", "32", "--framework", "megatron", "--json",
               "--export", "megatron-bridge", str(out)])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["export"]["framework"] == "megatron-bridge" and data["export"]["fits"] is True
    doc = yaml.safe_load(out.read_text())
    assert doc["train"]["global_batch_size"] == 16 and _in_schema(doc) == []


# -- Megatron-Core's own config classes (the bases of Megatron-Bridge's) -----------------------

#: What Megatron-Bridge's registered recipes set on the model (training/mixed_precision.py at
#: 067f987df03b: bf16_mixed, and bf16_with_fp8_delayed_scaling_mixed on top of it).
_BRIDGE_PRECISION = {"bf16_mixed": {"bf16": True, "params_dtype": "bfloat16",
                                    "pipeline_dtype": "bfloat16"},
                     "bf16_with_fp8_delayed_scaling_mixed": {
                         "bf16": True, "params_dtype": "bfloat16", "pipeline_dtype": "bfloat16",
                         "fp8": "hybrid", "fp8_recipe": "delayed"}}


def _mcore_configs(ex, model_config: dict):
    """Build Megatron-Core's TransformerConfig, DistributedDataParallelConfig and
    OptimizerConfig from the export (their ``__post_init__`` checks run); returns the model
    fields the installed Megatron-Core does not define."""
    import dataclasses

    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig
    known = {f.name for f in dataclasses.fields(TransformerConfig)}
    model = {k: v for k, v in ex.value["model"].items() if k in known}
    for k, v in _BRIDGE_PRECISION.get(ex.value["mixed_precision"], {}).items():
        model[k] = getattr(torch, v) if k.endswith("dtype") else v
    m = model_config
    experts = {"num_moe_experts": m["num_experts"], "moe_router_topk": m["top_k"],
               "moe_ffn_hidden_size": m["moe_ffn_hidden_size"]} if m.get("num_experts") else {}
    TransformerConfig(num_layers=m["num_layers"], hidden_size=m["hidden_size"],
                      num_attention_heads=m["num_heads"], num_query_groups=m.get("num_kv_heads"),
                      ffn_hidden_size=m["ffn_hidden_size"], **experts, **model)
    DistributedDataParallelConfig(**ex.value["ddp"])
    opt = {k: (getattr(torch, v.split(".")[1]) if k.endswith("dtype") else v)
           for k, v in ex.value["optimizer"].items()}
    OptimizerConfig(**opt, bf16=model.get("bf16", False))
    return sorted(set(ex.value["model"]) - known)


def test_megatron_core_builds_its_configs_from_the_export(plan):
    """megatron-core (0.16 installs on Python 3.11 beside torch 2.13; megatron-bridge does not)
    runs its own checks on the fields; those it lacks must be Megatron-Bridge's (recorded)."""
    pytest.importorskip("megatron.core")
    missing = _mcore_configs(to_megatron_bridge(plan), plan.model_config)
    assert set(missing) <= set(SCHEMA["sections"]["model"]["fields"])
    assert "tensor_model_parallel_size" not in missing


def test_megatron_core_builds_its_configs_from_an_expert_export():
    """bf16: Megatron-Core checks FP8 with experts against transformer-engine's version, which
    is not installed here."""
    pytest.importorskip("megatron.core")
    model = dict(name="tiny-moe", family="llama", num_layers=4, hidden_size=64, num_heads=4,
                 vocab_size=256, seq_len=64, ffn_hidden_size=128, num_experts=8, top_k=2,
                 moe_ffn_hidden_size=32)
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=64, precision="bf16",
                                   framework="megatron")
    p = autopar.optimize(model, autopar.Cluster.custom(1, 8, "H100-80GB"), train,
                         fixed=dict(tp=2, pp=2, dp=2, ep=2, expert_tp=1, zero_stage=1,
                                    virtual_stages=1, schedule="1f1b", micro_batch_size=1))
    _mcore_configs(to_megatron_bridge(p), {**model, "num_kv_heads": 4})
