"""A new user's trial of the command line: sequence parallelism off by default is said with what
--sp would give, --out says what it wrote, a corrupt model_config gives one fix, an empty
torchrun script is refused, and a plan file on a cluster its mesh does not fill names the mesh."""

from __future__ import annotations

import json
import re

import pytest

from autopar.cli import main
from autopar.errors import InvalidPlanFile, InvalidTrainingConfig

TINY = ["--model", "tiny-llama", "--cluster", "2x4xA100-80GB", "--global-batch", "32",
        "--seq-len", "512"]
SP_NOTE = "sequence parallelism is off (the default without --sp)"


def run(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _json(capsys, *argv) -> dict:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_estimate_says_what_sequence_parallelism_would_give(capsys):
    # item 1: the README's hand-tuned llama2-70b example ran SP off (568.5 s, 31.9% MFU) where
    # --sp gave 428.3 s (42.3%), and nothing said so
    off = _json(capsys, "estimate", *TINY, "--tp", "2")
    on = _json(capsys, "estimate", *TINY, "--tp", "2", "--sp")
    notes = [n for n in off["notes"] if n.startswith(SP_NOTE)]
    assert len(notes) == 1, off["notes"]
    assert f"with --sp: {on['step_time_s']:.1f} s/step" in notes[0]
    assert f"{on['memory_per_gpu_bytes'] / 1e9:.1f} GB per GPU" in notes[0]
    assert not any(n.startswith(SP_NOTE) for n in on["notes"])
    # printed once, as a note line
    code, out, _ = run(capsys, "estimate", *TINY, "--tp", "2")
    assert code == 0 and out.count(f"note: {SP_NOTE}") == 1


@pytest.mark.parametrize("flags", [["--tp", "2", "--no-sp"], ["--tp", "1"],
                                   ["--tp", "2", "--framework", "deepspeed"]])
def test_no_sequence_parallel_note_when_pinned_needless_or_not_offered(capsys, flags):
    # --no-sp pins it; tp=1 has nothing to shard; DeepSpeed's AutoTP has no SP (its profile)
    data = _json(capsys, "estimate", *TINY, *flags)
    assert not any(n.startswith(SP_NOTE) for n in data["notes"]), data["notes"]


def test_no_sequence_parallel_note_for_a_plan_file(capsys, tmp_path):
    # a plan file's configuration is pinned, sequence_parallel included
    p = tmp_path / "p.json"
    assert run(capsys, "plan", *TINY, "--tp", "2", "--no-sp", "--out", str(p))[0] == 0
    data = _json(capsys, "estimate", "--plan", str(p))
    assert not any(n.startswith(SP_NOTE) for n in data["notes"]), data["notes"]


def test_out_says_what_it_wrote(capsys, tmp_path):
    # item 2: --out wrote silently where every --export prints "wrote FILE"
    p = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", *TINY, "--out", str(p))
    assert code == 0, err
    assert f"plan file: wrote {p}" in out and p.exists()
    code, out, _ = run(capsys, "plan", *TINY, "--out", str(p), "--json")
    assert code == 0 and json.loads(out)["config"]   # stdout stays JSON


@pytest.mark.parametrize("field, value", [("hidden_size", -5), ("hidden_size", 100)])
def test_a_corrupt_model_config_gives_one_fix(capsys, tmp_path, field, value):
    # item 4: "...; fix: pass hidden_size >= 1. Fix: regenerate the plan ..." (two fixes)
    import autopar
    p = tmp_path / "p.json"
    assert run(capsys, "plan", *TINY, "--out", str(p))[0] == 0
    d = json.loads(p.read_text())
    d["model_config"][field] = value
    p.write_text(json.dumps(d))
    code, _, err = run(capsys, "estimate", "--plan", str(p))
    assert code == 2 and "model_config is not a valid model" in err, err
    assert len(re.findall(r"\bfix:", err, re.I)) == 1, err
    with pytest.raises(InvalidPlanFile) as exc:
        autopar.Plan.from_json(p)
    assert len(re.findall(r"\bfix:", str(exc.value), re.I)) == 1, exc.value


@pytest.mark.parametrize("script", ["", "   "])
def test_an_empty_torchrun_script_is_refused(script):
    # item 5: to_torchrun_command("") wrote '' as the script
    from export_shapes import SHAPES, shape_plan
    plan = shape_plan(*SHAPES["fsdp"])
    with pytest.raises(InvalidTrainingConfig, match="training script.*Fix: .*train.py"):
        plan.to_torchrun_command(script)
    with pytest.raises(InvalidTrainingConfig, match="training script"):
        plan.to_slurm_script(script)


def test_a_plan_on_a_cluster_its_mesh_does_not_fill_names_the_mesh(capsys, tmp_path):
    # item 6: a plan of 8 GPUs estimated on 16 failed naming dp=16, which the user never set,
    # with a fix ("change dp") that did not work
    p = tmp_path / "tiny.json"
    assert run(capsys, "plan", "--model", "tiny-llama", "--cluster", "1x8xH100",
               "--global-batch", "32", "--seq-len", "512", "--out", str(p))[0] == 0
    config = json.loads(p.read_text())["config"]
    assert (config["tp"], config["pp"], config["cp"], config["dp"]) == (1, 1, 1, 8)
    assert config["micro_batch_size"] > 2   # else dp=16 fits the batch of 32 and nothing fails
    code, _, err = run(capsys, "estimate", "--plan", str(p), "--cluster", "2x8xH100")
    assert code == 2, err
    text = " ".join(err.split())
    assert "is a mesh of 8 GPUs (tp x pp x cp x dp = 1 x 1 x 1 x 8)" in text, text
    assert "does not fill the 16 GPUs of --cluster 2x8xH100" in text
    assert "dp was derived as 16 (not in the plan or the flags)" in text
    assert len(re.findall(r"\bfix:", text, re.I)) == 1, text
    replan = ("autopar plan --model tiny-llama --cluster 2x8xH100 --global-batch 32 "
              "--seq-len 512")
    assert replan in text and "--cluster 1x8x" in text
    # the fixes it names work: the re-plan, and a micro-batch that dp=16 divides the batch with
    assert run(capsys, *replan.split()[1:])[0] == 0
    assert run(capsys, "estimate", "--plan", str(p), "--cluster", "2x8xH100",
               "--micro-batch", "2")[0] == 0
    # explain --plan says it in the same terms (its search of the pinned plan found no layout)
    code, _, err = run(capsys, "explain", "--plan", str(p), "--cluster", "2x8xH100")
    text = " ".join(err.split())
    assert code == 2 and "is a mesh of 8 GPUs" in text and replan in text, text
    assert len(re.findall(r"\bfix:", text, re.I)) == 1, text
