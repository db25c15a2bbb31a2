"""A new user's reports on error messages and return values (2026-12-07): a ParallelConfig field
named by its flag, a plan file given to --model, the default batch's cap in the batch's units,
an unreadable or missing --plan file, and an export sliced as the text it is."""

from __future__ import annotations

import pickle

import pytest

import autopar
from autopar.api import (DEFAULT_TOKENS_PER_STEP, MAX_DEFAULT_TOKENS_PER_STEP,
                         default_batch_note, default_global_batch)
from autopar.cli.flagwords import flag_words
from autopar.config import TrainingConfig
from autopar.errors import InvalidPlanFile
from autopar.runtime.export.common import Export
from export_shapes import shape_plan
from cli_run import run

TINY = ["--model", "tiny-llama", "--cluster", "1x8xH100", "--global-batch", "32",
        "--seq-len", "512"]



# -- 1: a ParallelConfig field the flags set is named by its flag -----------------------------
@pytest.mark.parametrize("flags, words", [
    (["--tp", "0"], "--tp (ParallelConfig.tp) must be a positive integer; got 0"),
    (["--pp", "-1"], "--pp (ParallelConfig.pp) must be a positive integer; got -1"),
    (["--cp", "0"], "--cp (ParallelConfig.cp) must be a positive integer; got 0"),
    (["--dp", "0"], "--dp (ParallelConfig.dp) must be a positive integer; got 0. Fix: pass an "
                    "int >= 1, or leave the flag out to let autopar choose."),
    (["--virtual-stages", "0"],
     "--virtual-stages (ParallelConfig.virtual_stages) must be a positive integer; got 0"),
])
def test_a_bad_degree_names_its_flag(capsys, flags, words):
    code, out, err = run(capsys, "estimate", *TINY, *flags)
    assert code == 2 and err.startswith("autopar: InvalidParallelConfig: ") and words in err


def test_a_bad_compare_degree_names_its_compare_flag(capsys):
    code, out, err = run(capsys, "plan", *TINY, "--compare-tp", "0", "--time-limit", "5")
    assert code == 2
    # once, as the --compare- flag (the message passes flag_words twice: no "--tp (--compare-tp")
    assert ("the hand-tuned plan of the --compare-* flags: --compare-tp (ParallelConfig.tp) "
            "must be a positive integer; got 0") in err
    assert err.count("ParallelConfig.tp") == 1


def test_flag_words_names_only_the_fields_the_flags_set():
    text = "ParallelConfig.dp must be a positive integer; got 0."
    assert flag_words(text).startswith("--dp (ParallelConfig.dp) must")
    # dp derived from the GPU count, or read from an import: no flag to blame
    assert flag_words(text, given=frozenset({"tp"})) == text
    # a field sharing a pin's prefix is not read as the pin (cp_mode is not --cp)
    assert flag_words("ParallelConfig.cp_mode x") == "ParallelConfig.cp_mode x"
    assert flag_words(flag_words(text)) == flag_words(text)   # a second pass changes nothing


# -- 2: a plan file given to --model ----------------------------------------------------------
def test_a_plan_file_given_as_the_model_is_refused_as_one(capsys, tmp_path):
    path = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", *TINY, "--time-limit", "10", "--out", str(path))
    assert code == 0, err
    code, out, err = run(capsys, "estimate", "--model", str(path), "--cluster", "1x8xH100")
    assert code == 2 and err.startswith("autopar: InvalidModelConfig: ")
    assert f"this is a plan file; use --plan {path}" in err
    assert "did you mean" not in err and "unknown key" not in err
    # and read as one, the same file estimates
    code, out, err = run(capsys, "estimate", "--plan", str(path))
    assert code == 0, err


# -- 3: the default batch's cap in the batch's units ------------------------------------------
@pytest.mark.parametrize("world, seq, tokens, words", [
    # llama3-70b (8,192 tokens) on 131,072 GPUs: 2,048 sequences = 2**24 tokens, at the cap
    (131072, 8192, MAX_DEFAULT_TOKENS_PER_STEP,
     "= 16.8M tokens per step (capped at 16.8M = 2^24 tokens,"),
    (8, 4096, DEFAULT_TOKENS_PER_STEP,
     "= 4.2M tokens per step (4.2M = 2^22 tokens rounded up to a multiple of"),
])
def test_the_default_batch_and_its_target_or_cap_read_alike(world, seq, tokens, words):
    train = TrainingConfig(global_batch_size=default_global_batch(world, seq), seq_len=seq)
    note = default_batch_note(train, world)
    assert train.global_batch_size * seq == tokens
    assert (MAX_DEFAULT_TOKENS_PER_STEP, DEFAULT_TOKENS_PER_STEP) == (2 ** 24, 2 ** 22)
    assert words in note and "16M" not in note


# -- 4: an unreadable or missing --plan file --------------------------------------------------
def test_a_binary_plan_file_is_not_a_plan_file(capsys, tmp_path):
    png = tmp_path / "some.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    code, out, err = run(capsys, "estimate", "--plan", str(png))
    assert code == 2 and err.startswith("autopar: InvalidPlanFile: ")
    assert f"not a plan file: {png} is not UTF-8 text" in err
    assert "`autopar plan --out`" in err and "UnicodeDecodeError" not in err


def test_a_missing_plan_file_is_named(capsys, tmp_path):
    path = tmp_path / "nope.json"
    code, out, err = run(capsys, "explain", "--plan", str(path))
    # a long path is shortened in the message (its start and its end kept): the file's name
    # and the fix are what must show
    assert code == 2 and "autopar: InvalidPlanFile: no such file: " in err
    assert "nope." in err and ". Fix: check the path" in err
    assert "Errno" not in err and "FileNotFoundError" not in err
    with pytest.raises(InvalidPlanFile, match="no such file"):
        autopar.Plan.from_json(path)


# -- 5: an export is its text -----------------------------------------------------------------
def test_an_export_slices_as_its_text():
    plan = shape_plan(8, dict(dp=4, tp=2, pp=1, zero_stage=2))
    for ex in (plan.to_slurm_script(), plan.to_torchrun_command(), plan.to_megatron_args(),
               plan.to_deepspeed_config()):
        text = ex.text()
        assert isinstance(ex, str) and type(text) is str and str(ex) == text
        assert ex[:800] == text[:800] and len(ex) == len(text) and ex == text
        assert ex.splitlines() == text.splitlines()
    slurm = plan.to_slurm_script()
    assert slurm.startswith("#") and "#SBATCH" in slurm[:800]


def test_an_export_keeps_its_fields_and_stays_read_only():
    ex = Export(["--tp", "2"], warnings=("w",), fits=True)
    assert ex == "# autopar: w\n--tp 2\n" and ex.value == ["--tp", "2"] and ex.fits is True
    assert ex.warnings == ("w",) and ex.written is None
    with pytest.raises(AttributeError):
        ex.fits = False
    back = pickle.loads(pickle.dumps(ex))
    assert back == ex and back.value == ex.value and back.warnings == ex.warnings
    assert repr(ex).startswith("Export(value=['--tp', '2'], warnings=('w',)")
    # its fields change through with_warnings; replace stays the text's str.replace
    more = ex.with_warnings(("v", *ex.warnings))
    assert more == "# autopar: v\n# autopar: w\n--tp 2\n" and more.fits is True
    assert ex.replace("--tp 2", "--tp 4") == "# autopar: w\n--tp 4\n"


def test_an_exports_warnings_go_below_a_scripts_interpreter_line():
    """sbatch reads its #! line only as the first line: warnings follow it."""
    ex = Export("#!/bin/bash\n#SBATCH --nodes=2\nsrun true\n", warnings=("a note",))
    lines = ex.splitlines()
    assert lines[0] == "#!/bin/bash" and lines[1] == "# autopar: a note"
    assert lines[2:] == ["#SBATCH --nodes=2", "srun true"]
    plain = Export("--tp 2", warnings=("a note",))
    assert plain.splitlines() == ["# autopar: a note", "--tp 2"]


def test_a_difference_in_a_setting_that_means_nothing_is_not_listed():
    """"differs from best" named cp_mode at cp 1 and sp at tp 1 (a new user's report)."""
    from autopar.config import ParallelConfig
    from autopar.report.explain import config_diff
    a = ParallelConfig(tp=1, pp=2, dp=4, cp=1, cp_mode="ring", sequence_parallel=False)
    b = ParallelConfig(tp=1, pp=2, dp=4, cp=1, cp_mode="ulysses", sequence_parallel=True)
    assert config_diff(a, b) == []
    c = ParallelConfig(tp=2, pp=2, dp=2, cp=1, sequence_parallel=True)
    assert config_diff(a, c) == ["tp 1->2", "dp 4->2", "sp off->on"]


def test_export_names_read_in_any_case_and_a_near_miss_is_named(capsys, tmp_path):
    from types import SimpleNamespace

    from autopar.cli.exports import check_outputs
    args = SimpleNamespace(export=[["Megatron", str(tmp_path / "a.txt")]], out=None, plot=None,
                           tokens=None, price_per_gpu_hour=None, currency="USD")
    check_outputs(args)
    assert args.export == [["megatron", str(tmp_path / "a.txt")]]
    bad = SimpleNamespace(**{**vars(args), "export": [["megatrn", str(tmp_path / "b.txt")]]})
    with pytest.raises(autopar.AutoparError, match="Did you mean 'megatron'"):
        check_outputs(bad)
