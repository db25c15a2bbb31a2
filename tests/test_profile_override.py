"""A copied and edited framework profile stays in force: through optimize/estimate, the
search's margin and diagnosis rebuilds, and Megatron-LM's imported overlap flags."""

from __future__ import annotations

import pytest

import autopar
from autopar.cli import main
from autopar.frameworks import get_profile
from autopar.io.importers import from_megatron_args

TRAIN = autopar.TrainingConfig(global_batch_size=64, seq_len=512, framework="megatron")
CFG = autopar.ParallelConfig(tp=2, dp=8, zero_stage=1, micro_batch_size=2)


def _overlapped():
    return get_profile("megatron").with_costs({"overlap_dp_grad_reduce": "test"},
                                              overlap_dp_grad_reduce=True)


def test_estimate_and_optimize_cost_with_the_given_profile():
    plain = autopar.estimate("tiny-llama", "2x8xA100-80GB", TRAIN, CFG)
    edited = autopar.estimate("tiny-llama", "2x8xA100-80GB", TRAIN, CFG, profile=_overlapped())
    # Megatron's default reduces gradients after backward; the edited profile overlaps them
    assert edited.time_breakdown.dp_comm_exposed < plain.time_breakdown.dp_comm_exposed
    assert edited.step_time_s < plain.step_time_s
    # a torch TrainingConfig with a megatron profile is costed as megatron (edited)
    torch_train = autopar.TrainingConfig(global_batch_size=64, seq_len=512)
    again = autopar.estimate("tiny-llama", "2x8xA100-80GB", torch_train, CFG,
                             profile=_overlapped())
    assert again.step_time_s == edited.step_time_s
    plan = autopar.optimize("tiny-llama", "2x8xA100-80GB", TRAIN, fixed={"tp": 2, "zero_stage": 1,
                            "micro_batch_size": 2}, profile=_overlapped())
    assert plan.train.framework == "megatron"
    same = autopar.estimate("tiny-llama", "2x8xA100-80GB", TRAIN, plan.config,
                            profile=_overlapped())
    assert plan.estimate.step_time_s == same.step_time_s


def test_a_profile_must_be_a_profile():
    with pytest.raises(autopar.InvalidTrainingConfig, match="FrameworkProfile"):
        autopar.estimate("tiny-llama", "2x8xA100-80GB", TRAIN, CFG, profile="megatron")


def test_megatron_overlap_flags_are_imported_as_profile_costs():
    imp = from_megatron_args("--use-distributed-optimizer --overlap-grad-reduce "
                             "--overlap-param-gather --tp-comm-overlap "
                             "--no-overlap-p2p-communication")
    assert imp.costs == {"overlap_dp_grad_reduce": True, "overlap_tp_comm": True,
                         "overlap_pp_p2p": ()}
    assert set(imp.cost_sources) == set(imp.costs)
    assert not any("ignored" in n for n in imp.notes)
    lone = from_megatron_args("--use-distributed-optimizer --overlap-grad-reduce")
    assert any("one switch for both" in n for n in lone.notes)
    bad = from_megatron_args("--overlap-param-gather")
    assert bad.costs == {} and any("refuses" in n for n in bad.notes)


def test_cli_costs_megatron_args_with_their_overlaps(capsys):
    base = ["estimate", "--model", "tiny-llama", "--cluster", "2x8xA100-80GB", "--json",
            "--megatron-args"]
    args = ("--tensor-model-parallel-size 2 --use-distributed-optimizer --micro-batch-size 2 "
            "--global-batch-size 64 --seq-length 512")
    import json
    out = {}
    for key, extra in (("plain", ""), ("overlap", " --overlap-grad-reduce --overlap-param-gather")):
        assert main([*base, args + extra]) == 0
        out[key] = json.loads(capsys.readouterr().out)
    assert out["overlap"]["step_time_s"] < out["plain"]["step_time_s"]
    assert any("imported --overlap-grad-reduce --overlap-param-gather" in n
               for n in out["overlap"]["notes"])
    # for another framework the Megatron flags are named as ignored
    assert main([*base, args + " --overlap-grad-reduce", "--framework", "torch"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert any("ignored for torch" in n for n in data["notes"])


def _edited_plan():
    return autopar.optimize("tiny-llama", "2x8xA100-80GB", TRAIN,
                            fixed={"tp": 2, "pp": 2, "zero_stage": 1, "micro_batch_size": 2},
                            profile=get_profile("megatron").with_costs(
                                {"overlap_tp_comm": "our launcher", "overlap_dp_grad_reduce":
                                 "our launcher"}, overlap_tp_comm=True,
                                overlap_dp_grad_reduce=True))


def test_plan_keeps_its_profile_edits_through_json_and_the_cli(tmp_path, capsys):
    import json
    plan = _edited_plan()
    assert plan.profile_edits == {
        "overlap_tp_comm": {"value": True, "source": "our launcher"},
        "overlap_dp_grad_reduce": {"value": True, "source": "our launcher"}}
    assert "costed with edited profile fields" in plan.summary()
    path = tmp_path / "p.json"
    plan.to_json(path)
    back = autopar.Plan.from_json(path)
    assert back.profile_edits == plan.profile_edits
    assert back.estimate.step_time_s == plan.estimate.step_time_s
    stock = autopar.estimate("tiny-llama", "2x8xA100-80GB", TRAIN, plan.config)
    assert stock.step_time_s > plan.estimate.step_time_s   # the edits are what made it faster
    assert main(["estimate", "--plan", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step_time_s"] == pytest.approx(plan.estimate.step_time_s, rel=1e-12)
    assert any("edited megatron profile fields" in n for n in data["notes"])
    # a stock plan's file has no profile_edits key (its bytes are unchanged)
    plain = autopar.optimize("tiny-llama", "2x8xA100-80GB", TRAIN, fixed={"tp": 2})
    assert "profile_edits" not in json.loads(plain.to_json())


def test_exports_write_the_edits_they_can_and_say_the_rest():
    plan = _edited_plan()
    ex = plan.to_megatron_args()
    assert "--tp-comm-overlap" in ex.value and "--overlap-grad-reduce" in ex.value
    assert "--overlap-param-gather" in ex.value          # ZeRO-1: the distributed optimizer
    assert any("runs the plan as estimated" in w for w in ex.warnings)
    tt = plan.to_torchtitan_toml()                       # another framework: re-estimated
    assert not any("runs the plan as estimated" in w for w in tt.warnings)
    # a Megatron plan whose edits the file cannot carry says so and re-estimates without them
    odd = autopar.optimize("tiny-llama", "2x8xA100-80GB", TRAIN, fixed={"tp": 2},
                           profile=get_profile("megatron").with_costs(
                               {"step_fixed_s": "measured launch overhead"}, step_fixed_s=0.5))
    ex = odd.to_megatron_args()
    assert any("does not set (step_fixed_s=0.5)" in w for w in ex.warnings)
    assert not any("runs the plan as estimated" in w for w in ex.warnings)


def test_a_profile_of_another_framework_than_the_training_config_is_refused():
    with pytest.raises(autopar.InvalidTrainingConfig, match="disagree"):
        autopar.estimate("tiny-llama", "2x8xA100-80GB",
                         autopar.TrainingConfig(global_batch_size=64, seq_len=512,
                                                framework="deepspeed"), CFG,
                         profile=_overlapped())
    import dataclasses
    odd = dataclasses.replace(get_profile("megatron"), zero_stages=(0, 1, 2, 3))
    with pytest.raises(autopar.InvalidTrainingConfig, match="cannot record"):
        autopar.estimate("tiny-llama", "2x8xA100-80GB", TRAIN, CFG, profile=odd)


def test_overlap_param_gather_needs_the_distributed_optimizer():
    imp = from_megatron_args("--overlap-grad-reduce --overlap-param-gather")
    assert any("--use-distributed-optimizer" in n and "refuses" in n for n in imp.notes)
    ok = from_megatron_args("--use-distributed-optimizer --overlap-grad-reduce "
                            "--overlap-param-gather")
    assert not any("refuses" in n for n in ok.notes)


def test_edited_fixed_step_cost_is_its_own_time_component():
    prof = get_profile("megatron").with_costs({"step_fixed_s": "measured"}, step_fixed_s=0.25)
    e = autopar.estimate("tiny-llama", "2x8xA100-80GB", TRAIN, CFG, profile=prof)
    assert e.time_breakdown.fixed_step == 0.25
    assert e.time_breakdown.total == pytest.approx(e.step_time_s, rel=1e-12)


def test_tp_comm_overlap_needs_sequence_parallelism():
    prof = get_profile("megatron").with_costs({"overlap_tp_comm": "t"}, overlap_tp_comm=True)
    for sp in (False, True):
        cfg = autopar.ParallelConfig(tp=2, dp=8, zero_stage=1, micro_batch_size=2,
                                     sequence_parallel=sp)
        stock = autopar.estimate("tiny-llama", "2x8xA100-80GB", TRAIN, cfg)
        edited = autopar.estimate("tiny-llama", "2x8xA100-80GB", TRAIN, cfg, profile=prof)
        # Megatron-LM asserts sequence parallelism for --tp-comm-overlap: without it, nothing
        if sp:
            assert edited.time_breakdown.tp_comm < stock.time_breakdown.tp_comm
        else:
            assert edited.step_time_s == stock.step_time_s
    plan = autopar.optimize("tiny-llama", "2x8xA100-80GB", TRAIN, profile=prof,
                            fixed={"tp": 2, "sequence_parallel": False, "zero_stage": 1})
    ex = plan.to_megatron_args()
    assert "--tp-comm-overlap" not in ex.value and "--sequence-parallel" not in ex.value
    assert any("runs the plan as estimated" in w for w in ex.warnings)


def test_fa3_off_hopper_is_noted():
    prof = get_profile("torch").with_costs({"attention_kernels": "t"},
                                           attention_kernels={"*": "fa3"})
    torch_train = autopar.TrainingConfig(global_batch_size=64, seq_len=512)
    a100 = autopar.estimate("tiny-llama", "2x8xA100-80GB", torch_train, CFG, profile=prof)
    assert any("fa3 (FlashAttention-3) runs on Hopper GPUs only" in w for w in a100.warnings)
    h100 = autopar.estimate("tiny-llama", "2x8xH100", torch_train, CFG, profile=prof)
    assert not any("FlashAttention-3" in w for w in h100.warnings)
