"""What a new user read and misread (user pass of 2026-12-01): errors name the real conflict, a
re-estimated plan file says what it changed, explain's words match the plan table's."""

from __future__ import annotations

import json

import pytest

import autopar
from autopar.cli import main
from autopar.errors import InfeasibleError

TINY8 = autopar.Cluster.custom(1, 8, "A100-80GB")
TRAIN = autopar.TrainingConfig(global_batch_size=16, seq_len=32)


def run(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize("schedule", ["dualpipev", "zbv-zero-bubble", "interleaved-1f1b"])
def test_pipeline_schedule_pinned_at_pp_1_names_the_schedule(schedule):
    # was "fixed pp=1 breaks a rule: pp must divide the GPUs and be at most the model's blocks",
    # which pp=1 does not break
    with pytest.raises(InfeasibleError) as info:
        autopar.optimize("tiny-llama", TINY8, TRAIN, fixed={"schedule": schedule, "pp": 1})
    msg = str(info.value)
    assert f"schedule={schedule!r} is a pipeline schedule and pp=1 is pinned" in msg
    assert "drop the schedule" in msg and "pp in [2, 4]" in msg
    assert "breaks a rule" not in msg


def test_pipeline_schedule_without_any_pipeline_names_the_schedule():
    # one GPU: no layout has a pipeline, pp not pinned
    one = autopar.Cluster.custom(1, 1, "A100-80GB")
    with pytest.raises(InfeasibleError) as info:
        autopar.optimize("tiny-llama", one, TRAIN, fixed={"schedule": "dualpipev"})
    msg = str(info.value)
    assert "on 1 GPU:" in msg and "schedule='dualpipev' needs a pipeline (pp > 1)" in msg
    assert "drop the schedule" in msg


def test_plain_schedules_at_pp_1_still_plan():
    for schedule in ("1f1b", "gpipe"):
        plan = autopar.optimize("tiny-llama", TINY8, TRAIN, fixed={"schedule": schedule,
                                                                   "pp": 1})
        assert plan.config.pp == 1


def test_cli_schedule_at_pp_1(capsys):
    code, _, err = run(capsys, "plan", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB",
                       "--global-batch", "16", "--seq-len", "32", "--schedule", "dualpipev",
                       "--pp", "1")
    assert code == 2
    assert "--schedule dualpipev is a pipeline schedule and --pp 1 is pinned" in err


@pytest.fixture(scope="module")
def kept_plan(tmp_path_factory):
    """A ZeRO-3 plan with dp=16 on 16 GPUs that keeps 3 of its 4 blocks gathered."""
    path = tmp_path_factory.mktemp("plans") / "p.json"
    plan = autopar.optimize("tiny-llama", autopar.Cluster.custom(2, 8, "A100-80GB"),
                            autopar.TrainingConfig(global_batch_size=32, seq_len=32),
                            fixed=dict(dp=16, tp=1, pp=1, zero_stage=3,
                                       reshard_after_forward=(False, True, False, False)))
    plan.to_json(path)
    return path


def _estimate_json(capsys, *argv):
    code, out, err = run(capsys, "estimate", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_plan_on_a_smaller_cluster_says_dp_changed(capsys, kept_plan):
    # dp=16 on 16 GPUs silently became dp=8 on 8
    data = _estimate_json(capsys, "--plan", str(kept_plan), "--cluster", "1x8xA100-80GB")
    assert data["config"]["dp"] == 8
    assert "dp 16 -> 8 for the 8 GPUs of the new cluster (tp x cp x pp = 1 x 1 x 1)" \
        in data["notes"]
    same = _estimate_json(capsys, "--plan", str(kept_plan), "--cluster", "2x8xA100-80GB")
    assert same["config"]["dp"] == 16 and not [n for n in same["notes"] if "dp 16" in n]


def test_plan_with_another_degree_says_what_it_derived(capsys, kept_plan):
    data = _estimate_json(capsys, "--plan", str(kept_plan), "--pp", "2")
    assert data["config"]["dp"] == 8 and data["config"]["pp"] == 2
    assert "dp 16 -> 8 for the 16 GPUs (tp x cp x pp = 1 x 1 x 2)" in data["notes"]
    assert "stage cuts 4 (blocks per pipeline chunk) -> balanced for pp=2" in data["notes"]
    # a flag equal to the plan's own value derives nothing again
    data = _estimate_json(capsys, "--plan", str(kept_plan), "--tp", "1", "--zero", "3")
    assert data["config"]["reshard_after_forward"] == [False, True, False, False]
    assert len(data["notes"]) == 1 and data["notes"][0].startswith("re-estimating")


def test_plan_with_another_zero_stage_drops_per_block_resharding(capsys, kept_plan):
    # failed with a dump of the booleans and "Fix: ... reshard_after_forward=None", which the
    # command line cannot pass
    data = _estimate_json(capsys, "--plan", str(kept_plan), "--zero", "2")
    assert data["config"]["zero_stage"] == 2 and data["config"]["reshard_after_forward"] is None
    assert ("zero 3 -> 2: the plan's per-block FSDP resharding (FSDP keeps 3 of 4 blocks "
            "gathered forward to backward) is dropped; only ZeRO-3 gathers parameters to keep"
            ) in data["notes"]


@pytest.mark.parametrize("flag", ["--megatron-args", "--torchtitan-toml"])
@pytest.mark.parametrize("value", ["", "  "])
def test_empty_import_flags_are_refused(capsys, flag, value, kept_plan):
    # an empty --megatron-args was costed as plain torch with no note
    base = ["estimate", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB",
            "--global-batch", "16", "--seq-len", "32"]
    code, _, err = run(capsys, *base, f"{flag}={value}")
    assert code == 2 and f"InvalidTrainingConfig: {flag} is empty" in err
    assert "Fix:" in err and "drop the flag" in err
    code, _, err = run(capsys, "estimate", "--plan", str(kept_plan), f"{flag}={value}")
    assert code == 2 and f"{flag} is empty" in err


def test_explain_counts_blocks_kept_gathered_as_the_plan_table_does():
    # explain printed "reshard default->10/32 blocks" where the table said "keeps 22 of 32"
    from autopar.report.explain import config_diff
    from autopar.report.summary import reshard_text
    base = autopar.ParallelConfig(dp=8, zero_stage=3)
    kept = autopar.ParallelConfig(dp=8, zero_stage=3,
                                  reshard_after_forward=(False,) * 22 + (True,) * 10)
    assert reshard_text(kept).startswith("FSDP keeps 22 of 32 blocks gathered")
    assert config_diff(base, kept) == ["FSDP keeps 0->22 of 32 blocks gathered"]
    other = autopar.ParallelConfig(dp=8, zero_stage=3,
                                   reshard_after_forward=(True,) * 10 + (False,) * 22)
    assert config_diff(kept, other) == ["FSDP keeps 22 of 32 blocks gathered (other blocks)"]
    # only ZeRO-3 gathers: against ZeRO-2 the zero change says it all
    assert config_diff(kept, autopar.ParallelConfig(dp=8, zero_stage=2)) == ["zero 3->2"]


def test_explain_does_not_put_fsdp_copies_on_a_link():
    # dp_copies (copies in GPU memory on the compute stream) read "... on InfiniBand"
    from autopar.report.explain import compare
    cluster = autopar.Cluster.custom(2, 8, "A100-80GB")
    train = autopar.TrainingConfig(global_batch_size=32, seq_len=32)
    plain = autopar.estimate("tiny-llama", cluster, train, autopar.ParallelConfig(dp=16))
    fsdp = autopar.estimate("tiny-llama", cluster, train,
                            autopar.ParallelConfig(dp=16, zero_stage=3))
    assert fsdp.group_links.dp == "infiniband" and fsdp.time_breakdown.dp_copies > 0
    words = {d.component: d.words for d in compare(plain, fsdp, "zero-3").time}
    assert "GPU-memory copies" in words["dp_copies"] and "no link" in words["dp_copies"]
    assert "InfiniBand" not in words["dp_copies"]
    assert words["overlap_slowdown"].endswith("on InfiniBand")   # a collective still has one


def test_mfu_warning_never_prints_two_equal_percentages():
    # "MFU 45.7% exceeds the best published ... (45.7%: ...)"
    from autopar.cost.regime import Regime, distinct_percents, mfu_ceiling, plausibility_warnings
    r = Regime("torch", "bf16", "hopper", "fsdp", "dense", "1 node", "3-30B")
    best = mfu_ceiling(r.framework, r.precision, r.gpu).mfu
    for above in (1e-5, 3e-4, 1e-3, 0.02):
        (w,) = plausibility_warnings(best + above, r)
        ours, theirs = distinct_percents(best + above, best)
        assert ours != theirs and f"MFU {ours} exceeds" in w and f": {theirs} (" in w
    assert distinct_percents(0.45712, 0.45695) == ("45.71%", "45.70%")
    assert distinct_percents(0.5, 0.4) == ("50.0%", "40.0%")   # one decimal when it differs
    assert distinct_percents(0.457, 0.457) == ("45.7%", "45.7%")


def test_zero_refusal_cites_the_capability_that_refuses():
    # Megatron's ZeRO-2 refusal cited "--use-torch-fsdp2 has no TP assertion"
    from autopar.frameworks import get_profile
    mg = get_profile("megatron")
    for tp, pp in ((1, 1), (2, 1), (2, 2)):
        why = mg.unsupported(autopar.ParallelConfig(tp=tp, pp=pp, dp=8 // (tp * pp),
                                                    zero_stage=2, sequence_parallel=tp > 1))
        assert why.startswith("megatron does not run ZeRO-2 (it runs [0, 1, 3]; ")
        assert mg.sources["zero_stages"] in why and "TP assertion" not in why
    why = mg.unsupported(autopar.ParallelConfig(tp=2, pp=2, dp=2, zero_stage=3,
                                                sequence_parallel=True))
    assert "with tp=2, pp=2" in why and mg.sources["zero_stages_with_pp"] in why
    why = mg.unsupported(autopar.ParallelConfig(dp=4, ep=2, zero_stage=3))
    assert mg.sources["zero_stages_with_ep"] in why
    tt = get_profile("torchtitan")   # DDP beside TP: the TP capability refuses ZeRO-0
    why = tt.unsupported(autopar.ParallelConfig(tp=2, dp=4, zero_stage=0,
                                                sequence_parallel=True))
    assert tt.sources["zero_stages_with_tp"] in why


def test_cli_megatron_zero_2_warning_cites_no_zero_2(capsys):
    code, out, err = run(capsys, "estimate", "--model", "tiny-llama", "--cluster",
                         "1x8xA100-80GB", "--global-batch", "16", "--seq-len", "32",
                         "--framework", "megatron", "--zero", "2", "--json")
    assert code == 0, err
    text = " ".join(json.loads(out)["warnings"])
    assert "megatron does not run ZeRO-2" in text and "so no ZeRO-2" in text
    assert "TP assertion" not in text


def test_explain_counts_kept_blocks_only_between_zero3_plans():
    from autopar.report.explain import config_diff
    kept = autopar.ParallelConfig(dp=8, zero_stage=3, reshard_after_forward=(False,) * 3 + (True,))
    plain = autopar.ParallelConfig(dp=8, zero_stage=1)
    assert not any("FSDP keeps" in d for d in config_diff(kept, plain))
    assert "zero 3->1" in config_diff(kept, plain)
    both = config_diff(autopar.ParallelConfig(dp=8, zero_stage=3), kept)
    assert "FSDP keeps 0->3 of 4 blocks gathered" in both


def test_a_bad_pinned_degree_is_offered_every_degree_a_pin_may_take():
    # user pass of 2026-12-06: --cp 3 was answered "use cp in [1, 2, 4]" and --tp 3 "use tp in
    # [1, 2, 4, 8] ... fit in a node", yet --cp 8 and --tp 16 are accepted as pins (the list was
    # the unpinned search's, which keeps TP in a node and 1024+ tokens per CP rank)
    two = autopar.Cluster.custom(2, 8, "A100-80GB")
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096)
    for key in ("tp", "cp"):
        with pytest.raises(InfeasibleError) as info:
            autopar.optimize("llama2-7b", two, train, fixed={key: 3})
        assert f"use {key} in [1, 2, 4, 8, 16]" in str(info.value)
    assert "a pinned tp may span nodes" in str(
        pytest.raises(InfeasibleError, autopar.optimize, "llama2-7b", two, train,
                      fixed={"tp": 3}).value)
    for key in ("tp", "cp"):   # each value offered is accepted
        plan = autopar.optimize("llama2-7b", two, train, fixed={key: 16}, time_limit_s=5)
        assert getattr(plan.config, key) == 16


def test_a_transformers_config_is_refused_with_how_to_build_the_model():
    # user pass of 2026-12-06: a LlamaConfig got "model must be an nn.Module, ...; got
    # LlamaConfig. Fix: e.g. autopar.optimize('llama2-70b', ...)", which does not say how
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                   num_attention_heads=4, vocab_size=256)
    with pytest.raises(autopar.errors.InvalidModelConfig,
                       match="AutoModelForCausalLM.from_config"):
        autopar.optimize(cfg, TINY8, TRAIN)


def test_a_hand_edited_plan_file_is_not_told_to_use_a_flag_that_cannot_help(capsys, tmp_path):
    # user pass of 2026-12-06: a plan file edited to tp=4 (dp left at 8) was answered "Fix: --dp
    # 2", and `estimate --plan FILE --dp 2` failed the same way (the file is checked first)
    plan = autopar.optimize("tiny-llama", TINY8, TRAIN, fixed={"tp": 1, "pp": 1})
    d = plan.to_dict()
    d["config"]["tp"] = 4
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    code, out, err = run(capsys, "estimate", "--plan", str(path))
    assert code == 2 and "InvalidPlanFile" in err
    assert "Fix: dp=2 (GPUs / (tp*pp*cp))" in err and "--dp" not in err
    # the flags override the file (docs/cli.md), so they may also repair an edit (tp 2 of the
    # model's 2 KV heads, dp left at 8)
    d["config"]["tp"] = 2
    path.write_text(json.dumps(d))
    code, out, err = run(capsys, "estimate", "--plan", str(path), "--dp", "4")
    assert code == 0, err
    assert "re-estimating the configuration of" in err + out
    code, out, err = run(capsys, "estimate", "--plan", str(path), "--dp", "3")
    assert code == 2 and "tp*pp*cp*dp = 2*1*1*3" in err


def test_a_per_block_recompute_pin_given_as_a_list_is_kept():
    # user pass of 2026-12-06: fixed={"recompute": ["full"] * 4} (a list, as JSON gives) was
    # dropped and the search chose "none"; a tuple of the wrong length was taken as one mode
    plan = autopar.optimize("tiny-llama", TINY8, TRAIN,
                            fixed={"recompute": ["full", "none", "full", "none"]})
    assert plan.config.recompute == ("full", "none", "full", "none")
    assert autopar.optimize("tiny-llama", TINY8, TRAIN,
                            fixed={"recompute": ["full"] * 4}).config.recompute == "full"
    for wrong in (["full"] * 3, ("full",) * 3):
        with pytest.raises(autopar.errors.InvalidParallelConfig, match="3 entries but the "
                                                                      "model has 4 blocks"):
            autopar.optimize("tiny-llama", TINY8, TRAIN, fixed={"recompute": wrong})


def test_explain_does_not_compare_tp_layouts_the_framework_cannot_price_for_moe():
    # user pass of 2026-12-06: `explain` on Mixtral under torch compared "TP=8 inside each
    # node", priced with the experts split over TP, which torch does not do (estimate warns
    # "optimistic"; the search leaves such meshes out)
    from autopar.problem import Problem
    from autopar.report.explain import canonical_alternatives, left_out_notes
    moe = dict(name="tiny-moe", family="llama", num_layers=4, hidden_size=64, num_heads=8,
               num_kv_heads=8, vocab_size=256, seq_len=64, ffn_hidden_size=128,
               num_experts=8, top_k=2, moe_ffn_hidden_size=32)
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=64)
    torch_p = Problem.build(moe, TINY8, train)
    assert not any(pins.get("tp", 1) > 1 for _, pins in canonical_alternatives(torch_p))
    assert any("keeps experts whole on every TP rank" in n for n in left_out_notes(torch_p))
    mega = Problem.build(moe, TINY8, autopar.TrainingConfig(16, 64, framework="megatron"))
    assert any(pins.get("tp") == 8 for _, pins in canonical_alternatives(mega))


def test_a_torchtitan_toml_autopar_wrote_for_a_model_without_a_flavor_reads_back(tmp_path):
    # user pass of 2026-12-06: `--export torchtitan-0.2` of a llama2-7b plan writes name
    # "llama3", flavor "llama2-7b" (torchtitan has no such flavor); `estimate --torchtitan-toml`
    # of that file then looked for the preset "llama3-llama2-7b"
    from autopar.io.importers import from_torchtitan_toml
    plan = autopar.optimize("llama2-7b", autopar.Cluster.custom(2, 8, "A100-80GB"),
                            autopar.TrainingConfig(64, 4096), fixed={"tp": 2, "pp": 1},
                            time_limit_s=5)
    path = tmp_path / "job.toml"
    path.write_text(plan.to_torchtitan_toml().text())
    assert from_torchtitan_toml(path).model == "llama2-7b"
    text = path.read_text().replace('flavor = "llama2-7b"', 'flavor = "8B"')
    path.write_text(text)
    assert from_torchtitan_toml(path).model == "llama3-8b"   # torchtitan's own flavors as before


def test_plan_of_another_model_derives_its_per_block_choices_again(capsys, tmp_path):
    # estimate --plan FILE --model M with M of another block count failed: "recompute has 4
    # entries but the model has 6 blocks", then "stage_blocks ... sum to 4", flags never given
    path = tmp_path / "p.json"
    autopar.optimize("tiny-llama", TINY8, autopar.TrainingConfig(global_batch_size=16, seq_len=32),
                     fixed=dict(tp=1, pp=2, recompute=("full", "none", "none", "none"),
                                stage_blocks=(1, 3))).to_json(path)
    model = tmp_path / "m.json"
    model.write_text(json.dumps({"name": "six", "family": "llama", "num_layers": 6,
                                 "hidden_size": 64, "num_heads": 4, "vocab_size": 256,
                                 "seq_len": 32}))
    data = _estimate_json(capsys, "--plan", str(path), "--model", str(model))
    assert data["config"]["recompute"] == "none" and data["config"]["pp"] == 2
    assert sum(data["config"]["stage_blocks"]) == 6
    notes = " ".join(data["notes"])
    assert "stage cuts 1/3 (the plan's 4 blocks) -> balanced over the 6 blocks" in notes
    assert "-> 'none' on all 6 blocks" in notes and "balanced for pp" not in notes
    # a flag still decides
    data = _estimate_json(capsys, "--plan", str(path), "--model", str(model), "--recompute", "full")
    assert data["config"]["recompute"] == "full"
