"""Values a new-user pass found wrong (issue 12's "tried again as a new user would"): each test
holds the value that was wrong."""

from __future__ import annotations

import pytest
import torch

import autopar
from autopar.errors import InvalidParallelConfig
from autopar.io.importers import from_torchtitan_toml
from autopar.models.transformer import RotaryEmbedding
from autopar.report.advice import fixes_to_fit
from autopar.report.explain import Problem

TINY = autopar.Cluster.custom(1, 8, "A100-80GB")


def test_torchtitan_export_with_cp_imports_back_sharded():
    # the README plan's shape (cp > 1, dp = 1, ZeRO-3) was written with
    # data_parallel_shard_degree 1 and read back as ZeRO-0 (167 GB, "out of memory"): torchtitan
    # shards over dp_shard x cp (parallel_dims.py: fsdp_enabled = dp_shard or cp enabled)
    plan = autopar.optimize("tiny-llama", TINY, autopar.TrainingConfig(8, 32),
                            fixed=dict(tp=2, cp=2, pp=2, dp=1, zero_stage=3))
    imp = from_torchtitan_toml(plan.to_torchtitan_toml().text())
    assert imp.parallel["cp"] == 2 and imp.parallel["zero_stage"] == 3


def test_sequence_parallelism_needs_divisible_tokens():
    # seq 31 with tp=2 + SP was planned, then failed at run time with a gloo size mismatch
    train = autopar.TrainingConfig(8, 31)
    with pytest.raises(InvalidParallelConfig, match="divisible by tp=2"):
        autopar.estimate("tiny-llama", "1x2xA100-80GB", train,
                         dict(tp=2, dp=1, sequence_parallel=True))
    plan = autopar.optimize("tiny-llama", "1x2xA100-80GB", train, fixed=dict(tp=2))
    assert plan.config.sequence_parallel is False


def test_fixes_to_fit_are_ones_the_framework_runs():
    # under Megatron with pp=4 the fix list offered "ZeRO-2" (76.2 GB), which the Megatron
    # export itself turns into ZeRO-1 (89.2 GB, out of memory)
    problem = Problem.build("llama2-70b", "4x8xA100-80GB",
                            autopar.TrainingConfig(1024, 4096, framework="megatron"))
    fixes = fixes_to_fit(problem, autopar.ParallelConfig(
        tp=2, pp=4, cp=4, dp=1, zero_stage=1, sequence_parallel=True, micro_batch_size=1))
    assert fixes and all(e.config.zero_stage in (0, 1) for _, e in fixes)


def test_rotary_keeps_the_compute_dtype():
    # fp32 tables promoted bf16 q/k to fp32 beside a bf16 v: "Expected query, key, and value to
    # have the same dtype" under FSDP mixed precision (autopar measure on a ZeRO-3 bf16 plan)
    rope = RotaryEmbedding(head_dim=8, seq_len=16, theta=10000.0)
    q = torch.randn(1, 2, 16, 8, dtype=torch.bfloat16)
    rq, rk = rope(q, q.clone())
    assert rq.dtype == rk.dtype == torch.bfloat16


def test_deepspeed_full_recompute_says_the_model_must_checkpoint():
    plan = autopar.optimize("tiny-llama", TINY, autopar.TrainingConfig(16, 32),
                            fixed=dict(tp=1, pp=1, dp=8, recompute="full"))
    warnings = plan.to_deepspeed_config().warnings
    assert any("deepspeed.checkpointing.checkpoint around every block" in w for w in warnings)


def test_measured_cluster_takes_a_path(tmp_path):
    from autopar.calibrate import measured_cluster
    from autopar.errors import InvalidCalibration
    bad = tmp_path / "cal.json"
    bad.write_text("{}")
    with pytest.raises(InvalidCalibration):  # a path is loaded strictly, not an AttributeError
        measured_cluster(str(bad))


def test_pipeline_sends_have_seconds_beside_their_bytes():
    # the README plan's table read "InfiniBand 8.6 GB 0.00 s, used by pp": the last rank's
    # gradient sends were counted in bytes but their time was charged to the rank before it
    cluster = autopar.Cluster.custom(2, 2, "A100-80GB")
    plan = autopar.optimize("tiny-llama", cluster, autopar.TrainingConfig(16, 32),
                            fixed=dict(tp=2, pp=2, dp=1, cp=1, placement=("tp", "cp", "dp", "pp")))
    e = plan.estimate
    assert e.group_links.pp == "infiniband"
    assert e.link_comm("infiniband").nbytes > 0 and e.link_comm("infiniband").seconds > 0


def test_a_mistyped_plan_field_says_one_fix(tmp_path):
    # "Fix: pass an int >= 1.. Fix: regenerate ..." (two fixes, a double full stop)
    import json
    plan = autopar.optimize("tiny-llama", TINY, autopar.TrainingConfig(16, 32),
                            fixed=dict(tp=1, pp=1, dp=8))
    d = json.loads(plan.to_json())
    d["config"]["tp"] = "two"
    with pytest.raises(autopar.InvalidPlanFile) as err:
        autopar.Plan.from_dict(d)
    text = str(err.value)
    assert text.count("Fix:") == 1 and ".." not in text


def test_pinned_interleaving_is_honoured_or_refused():
    """A pinned virtual_stages > 1 was silently dropped on pp = 1 meshes (the plan came back
    with v = 1); now every plan interleaves, and pp = 1 with it is refused with a fix."""
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=512)
    plan = autopar.optimize("llama2-7b", "1x8xA100-80GB", train, fixed={"virtual_stages": 2},
                            top_k=3)
    for est in (plan.estimate, *plan.alternatives):
        assert est.config.pp > 1 and est.config.virtual_stages == 2
    with pytest.raises(autopar.errors.InfeasibleError, match="pin pp >= 2"):
        autopar.optimize("llama2-7b", "1x8xA100-80GB", train,
                         fixed={"pp": 1, "virtual_stages": 2})


@pytest.mark.parametrize("schedule", ["dualpipev", "zbv-zero-bubble", "interleaved-zero-bubble",
                                      "interleaved-1f1b", "gpipe"])
def test_a_pinned_schedule_is_searched(schedule):
    # fixed={"schedule": "dualpipev"} crashed the search with InvalidParallelConfig (its memory
    # probe built v=1); a schedule that needs a pipeline now skips pp=1 meshes
    plan = autopar.optimize("llama2-7b", "1x8xA100-80GB",
                            autopar.TrainingConfig(global_batch_size=16, seq_len=512),
                            fixed={"schedule": schedule}, top_k=1)
    assert plan.config.schedule == schedule
    if schedule != "gpipe":
        assert plan.config.pp > 1


def test_cli_pins_schedule_and_ep(capsys):
    import json
    from autopar.cli import main
    assert main(["plan", "--model", "llama2-7b", "--cluster", "1x8xA100-80GB", "--global-batch",
                 "16", "--seq-len", "512", "--schedule", "zbv-zero-bubble", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["schedule"] == "zbv-zero-bubble"
    pytest.importorskip("transformers")
    assert main(["plan", "--model", "hf-tiny-mixtral", "--cluster", "1x8xA100-80GB",
                 "--global-batch", "16", "--seq-len", "64", "--ep", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["ep"] == 2


def test_python_estimate_warns_when_the_framework_cannot_run_it():
    # only the CLI said so; an Estimate from autopar.estimate carried no word of it
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=512, framework="torchtitan")
    est = autopar.estimate("llama2-7b", "1x8xA100-80GB", train,
                           autopar.ParallelConfig(tp=2, pp=2, zero_stage=1))
    assert any("torchtitan does not run ZeRO-1" in w for w in est.warnings)
    ok = autopar.estimate("llama2-7b", "1x8xA100-80GB", train,
                          autopar.ParallelConfig(tp=2, pp=2, zero_stage=3,
                                                 sequence_parallel=True))
    assert not any("cannot run" in w for w in ok.warnings)


def test_second_user_pass_outputs():
    """Values the second new-user pass found: ep invisible in the tables, --ep on a dense
    model answered 'relax fixed=', schedule shown for pp=1."""
    from autopar.report import tables
    from rich.console import Console
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=512)
    with pytest.raises(autopar.errors.InfeasibleError, match="has no MoE layer"):
        autopar.optimize("llama2-7b", "1x8xA100-80GB", train, fixed={"ep": 2})
    est = autopar.estimate("llama2-7b", "1x8xA100-80GB", train,
                           autopar.ParallelConfig(tp=1, dp=8, zero_stage=3))
    console = Console(width=200, record=True)
    console.print(tables.degrees_table(est))
    text = console.export_text()
    assert "no pipeline" in text and "ep (expert" not in text
    pytest.importorskip("transformers")
    moe = autopar.estimate("hf-tiny-mixtral", "1x8xA100-80GB",
                           autopar.TrainingConfig(global_batch_size=16, seq_len=64),
                           autopar.ParallelConfig(tp=1, dp=8, ep=4, zero_stage=3))
    console = Console(width=200, record=True)
    console.print(tables.degrees_table(moe))
    assert "ep (expert parallel)" in console.export_text()


def test_pins_that_bind_on_any_cluster_are_named_with_the_gpus_it_takes_without_them():
    # llama2-70b with tp=1 pp=1 ZeRO-0 on 16 A100s: every GPU holds all 1.1 TB of model
    # states, so more GPUs cannot help; the error used to say "at least 14 GPUs ... (got 16)"
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096)
    with pytest.raises(autopar.InfeasibleError) as err:
        autopar.optimize("llama2-70b", autopar.Cluster.from_spec("2x8xA100-80GB"), train,
                         fixed={"tp": 1, "pp": 1, "zero_stage": 0})
    msg = str(err.value)
    assert "more GPUs of this kind do not help with pp=1, tp=1, zero_stage=0 pinned" in msg
    assert "unpin them and use at least 24 GPUs" in msg
    assert "even with full sharding" not in msg


def test_a_hugging_face_hub_id_is_told_what_to_use_instead():
    # the new-user pass: 'mistralai/Mistral-7B-v0.1' was called a file path
    with pytest.raises(autopar.InvalidModelConfig) as err:
        autopar.optimize("mistralai/Mistral-7B-v0.1", autopar.Cluster.from_spec("1x8xH100"),
                         autopar.TrainingConfig(global_batch_size=8, seq_len=512))
    msg = str(err.value)
    assert "looks like a Hugging Face Hub id" in msg and "'hf-mistral-7b'" in msg
    assert "file path" not in msg
    with pytest.raises(autopar.InvalidModelConfig, match="looks like a file path"):
        autopar.optimize("configs/model.yaml", autopar.Cluster.from_spec("1x8xH100"),
                         autopar.TrainingConfig(global_batch_size=8, seq_len=512))
