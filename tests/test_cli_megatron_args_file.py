"""``--megatron-args FILE``: a file of Megatron-LM arguments (what ``--export megatron`` writes)
is read, not ignored as one unknown word (a new user's report of 2026-12-07)."""

from __future__ import annotations

import json

from autopar.cli import main


def _estimate(capsys, *extra):
    code = main(["estimate", "--model", "llama2-7b", "--cluster", "1x8xH100", "--json", *extra])
    return code, capsys.readouterr().out


def test_a_file_of_flags_reads_as_the_same_flags_given_inline(capsys, tmp_path):
    flags = ("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
             "--micro-batch-size 2 --global-batch-size 64 --seq-length 2048 "
             "--use-distributed-optimizer --bf16")
    script = tmp_path / "args.sh"
    # as --export writes it (comment lines first), and as a launch script continues its lines
    script.write_text("# autopar: a note\n" + flags.replace(" --pipeline", " \\\n  --pipeline")
                      + "\n", encoding="utf-8")
    code_file, out_file = _estimate(capsys, "--megatron-args", str(script))
    code_inline, out_inline = _estimate(capsys, "--megatron-args", flags)
    assert code_file == code_inline == 0
    got, want = json.loads(out_file), json.loads(out_inline)
    assert got["step_time_s"] == want["step_time_s"]
    assert (got["config"]["tp"], got["config"]["pp"], got["config"]["dp"]) == (2, 2, 2)


def test_a_path_that_names_no_file_is_refused_with_the_fix(capsys):
    code, out = _estimate(capsys, "--megatron-args", "/nonexistent/args.txt")
    assert code == 2
    err = json.loads(out)["error"]
    assert err["type"] == "InvalidTrainingConfig"
    assert "no such file" in err["message"] and "Fix:" in err["message"]
