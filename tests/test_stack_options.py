"""Named stack options (autopar.frameworks.options): the variants the validation corpus selects
from a record's text, selectable by a user too (--stack-option), recorded in plan files."""

from __future__ import annotations

import json

import pytest

import autopar
from autopar.cli import main
from autopar.errors import InvalidTrainingConfig
from autopar.frameworks import get_profile, profile_edits
from autopar.frameworks.options import STACK_OPTIONS, with_options

#: A framework each option applies to.
_FOR = {"torch-compile": "torch", "cuda-graphs": "megatron", "hsdp": "fsdp1",
        "foreach-adamw": "torchtitan", "float8nocompile": "torchtitan",
        "alltoall-2024": "megatron", "deepspeed-0.3": "deepspeed",
        "megatron-v1-model": "deepspeed", "llama3-fsdp": "inhouse-2024"}


@pytest.mark.parametrize("name", sorted(STACK_OPTIONS))
def test_every_option_edits_cost_fields_a_plan_file_records(name):
    stock = get_profile(_FOR[name])
    edited = with_options(stock, [name], gpus_per_node=8)
    edits = profile_edits(edited)      # cost fields only: would raise otherwise
    assert edits and all(e["source"] for e in edits.values())


def test_an_unknown_or_foreign_option_is_refused_with_the_ones_that_apply():
    with pytest.raises(InvalidTrainingConfig, match="not one autopar knows.*torch-compile"):
        with_options(get_profile("megatron"), ["turbo"], 8)
    with pytest.raises(InvalidTrainingConfig, match="is for torchtitan, not megatron.*"
                                                    "alltoall-2024"):
        with_options(get_profile("megatron"), ["foreach-adamw"], 8)


def test_the_cli_applies_notes_and_saves_them(capsys, tmp_path):
    common = ["--model", "tiny-llama", "--cluster", "1x8xH100", "--global-batch", "16",
              "--seq-len", "32", "--framework", "torchtitan"]
    f = tmp_path / "p.json"
    assert main(["plan", *common, "--stack-option", "torch-compile", "--out", str(f)]) == 0
    err = " ".join(capsys.readouterr().err.split())   # notes go to stderr
    assert "stack option torch-compile" in err
    edits = json.loads(f.read_text())["profile_edits"]
    assert edits["fusion"]["value"] == "compile"
    plan = autopar.Plan.from_json(f)     # the option travels with the plan
    assert plan.profile_edits == edits
