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
    assert "schedule='dualpipev' is a pipeline schedule and pp=1 is pinned" in err
