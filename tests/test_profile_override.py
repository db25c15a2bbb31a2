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
    assert edited.time_breakdown["dp_comm_exposed"] < plain.time_breakdown["dp_comm_exposed"]
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
    assert any("imported --overlap-grad-reduce" in n for n in out["overlap"]["notes"])
    # for another framework the Megatron flags are named as ignored
    assert main([*base, args + " --overlap-grad-reduce", "--framework", "torch"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert any("ignored for torch" in n for n in data["notes"])
