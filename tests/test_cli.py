"""The command line: plan / estimate / explain print what they should, --json parses, framework
configs are read, money arithmetic, bad input exits 2 with our message; every flag is documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autopar.cli import build_parser, main
from autopar.errors import InvalidParallelConfig
from autopar.io.importers import from_megatron_args, from_torchtitan_toml

TINY = ["--model", "tiny-llama", "--cluster", "2x4xA100-80GB", "--global-batch", "32",
        "--seq-len", "512"]


def run(capsys, *argv):
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_plan_tables_progress_and_money(capsys):
    code, out, err = run(capsys, "plan", *TINY, "--tokens", "1e9", "--price-per-gpu-hour", "2",
                         "--compare-tp", "2")
    assert code == 0, err
    for text in ("Parallelism and placement", "Pipeline stages", "Step time", "MFU / HFU",
                 "Memory per GPU", "Communication per GPU", "Top alternatives",
                 "Whole run", "hand-tuned", "GPU-hours"):
        assert text in out, text
    assert "searching" in err and "best so far" in err
    # the run's days and cost carry the step time's band (a new user: no uncertainty shown)
    assert "each carries its band" in " ".join(out.split()) and "± " in out.split("Whole run")[1]


def test_plan_json_is_a_plan_with_extras(capsys, tmp_path):
    import autopar
    code, out, _ = run(capsys, "plan", *TINY, "--json", "--tokens", "2e9",
                       "--price-per-gpu-hour", "3", "--out", str(tmp_path / "p.json"))
    assert code == 0
    data = json.loads(out)
    plan = autopar.Plan.from_dict(data)          # extras do not break loading
    e = plan.estimate
    cost = data["run_cost"][0]
    assert cost["plan"] == "best"
    assert cost["seconds"] == pytest.approx(2e9 / e.tokens_per_s)
    assert cost["days"] == pytest.approx(cost["seconds"] / 86400)
    assert cost["gpu_hours"] == pytest.approx(8 * cost["seconds"] / 3600)
    assert cost["cost"] == pytest.approx(3 * cost["gpu_hours"])
    assert autopar.Plan.from_json(tmp_path / "p.json").config == plan.config


def test_a_gpu_named_without_its_memory_size_is_noted(capsys):
    code, out, err = run(capsys, "estimate", "--model", "tiny-llama", "--cluster", "1x8xA100",
                         "--global-batch", "32", "--seq-len", "512", "--tp", "1")
    assert code == 0, err
    assert "note: GPU 'a100' is read as A100-SXM4-80GB (80 GB)" in out


def test_estimate_fits_and_json(capsys):
    code, out, _ = run(capsys, "estimate", *TINY, "--tp", "2", "--pp", "2", "--zero", "1")
    assert code == 0 and "Verdict: fits" in out
    code, out, _ = run(capsys, "estimate", *TINY, "--tp", "2", "--json")
    data = json.loads(out)
    assert data["config"]["tp"] == 2 and data["config"]["dp"] == 4
    assert data["verdict"] == "fits" and data["fixes"] == []


def test_estimate_oom_verdict_and_fixes(capsys):
    # Llama-2-70B, TP4 PP2 DP4 on 32 A800 without recompute or a distributed optimizer: the
    # seed claim's layout (72% MFU) does not fit; fixes are re-estimated
    argv = ["estimate", "--model", "llama2-70b", "--cluster", "4x8xA800-80GB+4xroce-200g",
            "--tp", "4", "--pp", "2", "--dp", "4", "--global-batch", "512", "--seq-len", "4096"]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert "OUT OF MEMORY" in out and "What to change to fit" in out
    code, out, _ = run(capsys, *argv, "--json")
    data = json.loads(out)
    assert data["verdict"] == "out of memory" and not data["fits"]
    fitting = [f for f in data["fixes"] if f["fits"]]
    assert fitting, data["fixes"]
    assert fitting[0]["mfu"] < 0.721               # honest: below the claimed 72.1%
    assert all(f["memory_per_gpu_bytes"] <= 79.25 * 2 ** 30 for f in fitting)  # torch sees 79.25 GiB


def test_megatron_args_parsing():
    imp = from_megatron_args(
        "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --context-parallel-size 1"
        " --sequence-parallel --recompute-granularity full --recompute-method uniform "
        "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 1024 "
        "--seq-length 4096 --num-layers 80 --num-layers-per-virtual-pipeline-stage 10 --bf16 "
        "--lr 3e-4 --train-iters 10")
    assert imp.parallel == {"tp": 4, "pp": 2, "cp": 1, "sequence_parallel": True,
                            "recompute": "full", "zero_stage": 1, "micro_batch_size": 1,
                            "virtual_stages": 4}
    assert imp.train["global_batch_size"] == 1024 and imp.train["seq_len"] == 4096
    assert imp.train["precision"] == "bf16"
    assert any("--lr" in n for n in imp.notes)
    assert from_megatron_args("--recompute-activations").parallel["recompute"] == "selective"
    lazy = from_megatron_args("--pipeline-model-parallel-size 4 "
                              "--num-layers-per-virtual-pipeline-stage 5")
    assert lazy.complete(32, 80)[0]["virtual_stages"] == 4
    with pytest.raises(InvalidParallelConfig):
        from_megatron_args("--tensor-model-parallel-size four")
    with pytest.raises(InvalidParallelConfig):
        from_megatron_args('--seq-length "4096')


TOML = """
[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 2
seq_len = 8192
[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 2
pipeline_parallel_degree = 1
context_parallel_degree = 1
[activation_checkpoint]
mode = "selective"
"""


def test_torchtitan_toml_parsing(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(TOML)
    imp = from_torchtitan_toml(path)
    assert imp.model == "llama3-8b"
    assert imp.parallel["tp"] == 2 and imp.parallel["zero_stage"] == 3
    assert imp.parallel["recompute"] == "selective-op" and imp.parallel["sequence_parallel"]
    par, train = imp.complete(16, 32)
    assert train["global_batch_size"] == 2 * 8 and train["seq_len"] == 8192
    assert par["micro_batch_size"] == 2
    with pytest.raises(InvalidParallelConfig):
        from_torchtitan_toml("[parallelism\ntensor_parallel_degree = 2")
    with pytest.raises(InvalidParallelConfig):
        from_torchtitan_toml(tmp_path / "missing.toml")


def test_flags_that_replace_imported_values_say_so(capsys):
    # the new-user pass: --global-batch beside a different --global-batch-size was dropped
    # without a word
    code, out, err = run(capsys, "estimate", "--model", "tiny-llama", "--cluster",
                         "2x4xA100-80GB", "--megatron-args",
                         "--tensor-model-parallel-size 1 --micro-batch-size 2 "
                         "--global-batch-size 64 --seq-length 512", "--global-batch", "32",
                         "--tp", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["config"]["tp"] == 2
    assert "the flags' global batch 32 replaces the imported 64" in data["notes"]
    assert "the flags' tp 2 replaces the imported 1" in data["notes"]
    assert not any("sequence length" in n for n in data["notes"])   # equal: nothing to say


def test_a_single_megatron_flag_is_the_value_of_megatron_args(capsys):
    # the new-user pass: --megatron-args "--use-distributed-optimizer" (one flag, no space) was
    # read by argparse as an option and answered "expected one argument"
    code, out, err = run(capsys, "estimate", *TINY, "--tp", "2", "--megatron-args",
                         "--use-distributed-optimizer", "--json")
    assert code == 0, err
    assert json.loads(out)["config"]["zero_stage"] == 1
    # a missing value before one of autopar's own flags is still refused
    with pytest.raises(SystemExit):
        main(["estimate", *TINY, "--megatron-args", "--tp", "2"])
    assert "--megatron-args: expected one argument" in capsys.readouterr().err


def test_a_value_beginning_with_a_dash_is_told_to_attach(capsys):
    # a new user's trial: "--cluster -1x8xH100" got argparse's bare "expected one argument"
    with pytest.raises(SystemExit):
        main(["plan", "--model", "tiny-llama", "--cluster", "-1x8xH100"])
    err = capsys.readouterr().err
    assert "attach it, --cluster=VALUE" in err
    with pytest.raises(SystemExit):   # no value at all: no such hint
        main(["plan", "--model", "tiny-llama", "--cluster"])
    assert "attach it" not in capsys.readouterr().err
    code, _out, err = run(capsys, "plan", "--model", "tiny-llama", "--cluster=-1x8xH100")
    assert code != 0 and "node and GPU counts are whole numbers >= 1, got -1" in err


def test_estimate_from_framework_configs(capsys, tmp_path):
    code, out, err = run(capsys, "estimate", "--model", "tiny-llama", "--cluster",
                         "2x4xA100-80GB", "--megatron-args",
                         "--tensor-model-parallel-size 2 --micro-batch-size 2 "
                         "--global-batch-size 32 --seq-length 512 --use-distributed-optimizer",
                         "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["config"]["tp"] == 2 and data["config"]["zero_stage"] == 1
    assert data["config"]["micro_batch_size"] == 2
    # imported Megatron arguments are costed as Megatron runs them (were plain torch)
    assert any("costed as megatron" in n for n in data["notes"])
    path = tmp_path / "job.toml"
    path.write_text(TOML.replace('"llama3"', '"tiny"').replace('"8B"', '"llama"')
                    .replace("8192", "512"))
    code, out, err = run(capsys, "estimate", "--cluster", "2x4xA100-80GB",
                         "--torchtitan-toml", str(path), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["config"]["tp"] == 2 and data["config"]["zero_stage"] == 3
    assert any("costed as torchtitan" in n for n in data["notes"])


def test_explain_words_and_json(capsys):
    code, out, _ = run(capsys, "explain", *TINY, "--compare-tp", "2")
    assert code == 0
    assert "Why this plan was chosen" in out and "hand-tuned plan" in out
    assert "\nobjective: robust: " in out
    code, out, _ = run(capsys, "explain", *TINY, "--json")
    data = json.loads(out)
    assert data["comparisons"] and all("sentence" in c for c in data["comparisons"])
    assert any("TP=8 across two nodes" in s for s in data["skipped"])


@pytest.mark.parametrize("argv, words", [
    (["plan", "--model", "no-such-model", "--cluster", "2x4xA100-80GB"], "InvalidModelConfig"),
    (["plan", "--model", "tiny-llama", "--cluster", "9x9xZ100"], "InvalidClusterSpec"),
    (["estimate", *TINY, "--tp", "3"], "InvalidParallelConfig"),
    (["estimate", *TINY, "--price-per-gpu-hour", "2"], "needs --tokens"),
    (["estimate", "--cluster", "2x4xA100-80GB"], "--model is required"),
    (["estimate", *TINY, "--megatron-args", "--micro-batch-size x"], "Megatron"),
    (["estimate", *TINY, "--torchtitan-toml", "/nonexistent/job.toml"], "cannot read"),
    (["estimate", "--model", "/nonexistent/model.json", "--cluster", "2x4xA100-80GB"],
     "cannot read model file"),
])
def test_bad_input_exits_2_with_our_message(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert words in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["plan", *TINY, "--tokens", "-1"],
                                  ["plan", *TINY, "--tokens", "lots"],
                                  ["estimate", *TINY, "--zero", "5"]])
def test_bad_flag_values_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_flag_errors_are_one_line_with_the_closest_option(capsys):
    # argparse printed ~30 lines of usage before the error; a misspelt flag had no suggestion
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--modl", "tiny-llama", "--globl-batch=8"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "usage:" not in err and len(err.strip().splitlines()) == 1
    assert "Did you mean --model, --global-batch?" in err and "--help" in err
    # the dashes every option shares made '--foo' look like '--out'
    with pytest.raises(SystemExit):
        main(["plan", "--model", "tiny-llama", "--foo"])
    assert "Did you mean" not in capsys.readouterr().err


def test_every_flag_is_documented():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        assert f"autopar {name}" in doc, name
        for action in p._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert f"`{flag}" in doc, f"{name} {flag} missing from docs/cli.md"


def test_documented_choices_are_the_parsers():
    # docs/cli.md listed --dispatcher as alltoall/deepep; the parser also takes allgather, auto
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        section = doc.split(f"### `autopar {name}`", 1)[1].split("\n### ", 1)[0]
        for action in p._actions:
            flag = next((f for f in action.option_strings if f.startswith("--")), None)
            row = re.search(rf"^\| `{re.escape(flag or '-')}`[^|]*\| ([^|]*) \|", section, re.M)
            if action.choices is None or row is None or "..." in row.group(1):
                continue   # a row ending in "..." names a few of a long list
            values = set(re.split(r"/|, ", row.group(1).strip()))   # "dualpipe" in "dualpipev"
            missing = [c for c in map(str, action.choices) if c not in values]
            assert not missing, f"{name} {flag}: docs/cli.md's values lack {missing}"


@pytest.mark.parametrize("flags, words", [
    (["--out", "/nonexistent-folder/p.json"], "No such file or directory"),
    (["--export", "jax", "x.txt"], "autopar exports to megatron"),
    (["--export", "megatron", "/nonexistent-folder/a.txt"], "No such file or directory"),
    (["--price-per-gpu-hour", "2"], "--price-per-gpu-hour needs --tokens"),
    (["--tokens", "1e9", "--currency", "dollars"], "not an ISO 4217 currency code"),
])
def test_outputs_are_checked_before_the_search(capsys, flags, words):
    # these failed only after the search had run (seconds to minutes on a large problem)
    code, out, err = run(capsys, "plan", *TINY, *flags)
    assert code == 2 and words in err and "searching" not in err, err


def test_sequence_parallel_at_tp_1_is_noted(capsys):
    code, out, err = run(capsys, "estimate", *TINY, "--tp", "1", "--sp", "--json")
    assert code == 0, err
    assert any("needs tp > 1: ignored at tp=1" in n for n in json.loads(out)["notes"])


def test_cp_mode_at_cp_1_is_noted(capsys):
    # --cp-mode at cp=1 was dropped silently while --sp at tp=1 got a note
    # said once: the estimate's own warning for a mode other than the default, the CLI's note
    # for an explicit ring
    code, out, err = run(capsys, "estimate", *TINY, "--tp", "2", "--cp-mode", "ulysses", "--json")
    assert code == 0, err
    said = [n for n in json.loads(out)["notes"] + json.loads(out)["warnings"] if "cp=1" in n]
    assert len(said) == 1 and "cp_mode='ulysses' at cp=1" in said[0], said
    code, out, err = run(capsys, "estimate", *TINY, "--tp", "2", "--cp-mode", "ring", "--json")
    assert code == 0, err
    said = [n for n in json.loads(out)["notes"] + json.loads(out)["warnings"] if "cp=1" in n]
    assert len(said) == 1 and "needs cp > 1: ignored at cp=1" in said[0], said
    code, out, err = run(capsys, "estimate", *TINY, "--cp", "2", "--cp-mode", "ulysses", "--json")
    assert code == 0 and not any("cp=1" in n for n in json.loads(out)["notes"]), out


def test_estimate_without_parallel_flags_names_the_defaults(capsys):
    # the new-user trial got an estimate of pure data parallelism with no word on its origin
    code, out, err = run(capsys, "estimate", *TINY)
    assert code == 0, err
    assert re.search(r"note: no parallel flags given: estimated at the defaults tp=1 pp=1 dp=8 "
                     r"cp=1, ZeRO 0, recompute none, micro-batch 1 .*`autopar plan`",
                     " ".join(out.split())), out
    code, out, _ = run(capsys, "estimate", *TINY, "--json")
    assert sum("no parallel flags given" in n for n in json.loads(out)["notes"]) == 1
    for flags in (["--zero", "1"], ["--micro-batch", "2"], ["--recompute", "full"]):
        code, out, _ = run(capsys, "estimate", *TINY, *flags, "--json")
        assert code == 0 and not any("no parallel flags" in n
                                     for n in json.loads(out)["notes"]), flags


def test_explain_compares_each_plan_once(capsys):
    """A runner-up that is also a canonical layout's best plan gets one row, and the other name
    is listed as skipped."""
    # the model's fastest plan: the scenario (a runner-up that is a layout's best) is of it
    code, out, _ = run(capsys, "explain", *TINY, "--json", "--objective", "fastest")
    assert code == 0
    data = json.loads(out)
    configs = [json.dumps(c["config"], sort_keys=True) for c in data["comparisons"]]
    assert len(configs) == len(set(configs))
    assert any("the same plan as 'pure data parallel" in s for s in data["skipped"])


def test_a_global_batch_just_short_of_a_multiple_of_the_gpus_is_pointed_out(capsys):
    # the new-user pass: 1000 sequences on 21 GPUs chose a pipeline 27% slower than dp=21 at
    # 1008, silently; 32 on 8 GPUs (a multiple) and 40 on 32 (25% short) say nothing
    code, out, err = run(capsys, "plan", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB",
                         "--global-batch", "998", "--seq-len", "512")
    assert code == 0, err
    (note,) = [line for line in (out + err).splitlines() if "shares only" in line]
    assert note.startswith("note: the global batch 998 shares only the factor 2 with the 8 GPUs")
    assert "1,000 (+0.2%) allows them (--global-batch 1000)" in note
    from autopar.cli.batch_notes import batch_divisibility_note as _batch_divisibility_note
    (text,) = _batch_divisibility_note(1000, 21)
    assert "1,000 shares no factor with the 21 GPUs" in text and "1,008 (+0.8%)" in text
    assert _batch_divisibility_note(32, 8) == [] and _batch_divisibility_note(40, 32) == []
    (small,) = _batch_divisibility_note(7, 8)
    assert "smaller than the 8 GPUs" in small and "--global-batch 8" in small
    (one,) = _batch_divisibility_note(1, 8)   # was "at most 1 data-parallel ranks"
    assert "at most 1 data-parallel rank, so" in one


def test_export_can_be_repeated_and_writes_every_file(capsys, tmp_path):
    # the new-user pass: a second --export replaced the first, silently
    a, ds = tmp_path / "a.sh", tmp_path / "ds.json"
    code, out, err = run(capsys, "plan", *TINY, "--json", "--export", "megatron", str(a),
                         "--export", "deepspeed", str(ds))
    assert code == 0, err
    data = json.loads(out)
    assert [e["framework"] for e in data["exports"]] == ["megatron", "deepspeed"]
    assert data["export"] == data["exports"][0]
    assert "--tensor-model-parallel-size" in a.read_text() and json.loads(ds.read_text())
    code, out, err = run(capsys, "plan", *TINY, "--export", "megatron", str(a),
                         "--export", "deepspeed", str(ds))
    assert code == 0 and f"wrote {a}" in out and f"wrote {ds}" in out


def test_two_exports_to_one_file_are_refused_before_the_search(capsys, tmp_path):
    f = str(tmp_path / "x.txt")
    code, out, err = run(capsys, "plan", *TINY, "--export", "megatron", f,
                         "--export", "deepspeed", f)
    assert code == 2 and "more than once" in err and "Fix:" in err and "searching" not in err


@pytest.mark.parametrize("argv, hint", [
    (["models", "--out", "x.txt"], None),                     # models has no --out
    (["models", "--jsn"], "Did you mean --json?"),
    (["estimate", *TINY, "--objective", "fastest"], None),     # a plan/explain flag
    (["plan", *TINY, "--global-batch-size", "64"], "Did you mean --global-batch?"),
    # explain --megatron-args was answered "Did you mean --memory-margin?"
    (["explain", *TINY, "--megatron-args", "--tensor-model-parallel-size 2"],
     "--megatron-args is an option of autopar estimate, not of autopar explain."),
    (["models", "--out", "x.txt"],
     "--out is an option of autopar plan, autopar calibrate, autopar measure, not of autopar "
     "models."),
])
def test_a_flag_is_suggested_only_when_the_subcommand_has_it(capsys, argv, hint):
    # the new-user pass: `models --out x.txt` was answered "Did you mean --out?"
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"see 'autopar {argv[0]} --help'" in err
    if hint is None:
        assert "Did you mean" not in err, err
    else:
        assert hint in err, err


@pytest.mark.parametrize("spec", ["12xH100", "3xH100", "13xH100", "12xMI300X", "12xRTX-4090",
                                  "100xGB200"])
def test_a_gpu_count_that_fills_no_whole_nodes_suggests_specs_that_work(spec):
    # the new-user pass: '12xH100' suggested '1x12xh100', which an 8-GPU H100 board refuses
    import re
    from autopar.errors import InvalidClusterSpec
    from autopar.hardware.cluster import Cluster
    with pytest.raises(InvalidClusterSpec) as exc:
        Cluster.from_spec(spec)
    text = str(exc.value)
    assert "Fix: write" in text and "): Fix" not in text   # one sentence ends before the fix
    suggested = re.findall(r"'(\d+x[\dx]*[a-z][a-z0-9\-]*)'", text.split("Fix:")[1])
    assert suggested, text
    for s in suggested:
        Cluster.from_spec(s)   # each suggestion is valid


@pytest.fixture
def only_fsdp_validated(monkeypatch):
    """The band table with only FSDP (and the pooled stand-in) validated at a band wide enough
    that the robust objective passes over the faster plan of llama3-8b on one H100 node (as
    tests/test_issue25_robust.py sets it)."""
    from autopar.cost import published, regime
    fsdp = ("torch", "bf16", "hopper", "fsdp", "dense", "1 node", "3-30B")
    monkeypatch.setattr(published, "BANDS", {fsdp: (0.9, -0.01, 30, 3),
                                             ("*",) * 7: (0.9, -0.01, 30, 3)})
    regime.band_for.cache_clear()
    yield
    regime.band_for.cache_clear()


def test_explain_and_plan_say_the_robust_plan_was_chosen_not_fastest(capsys,
                                                                      only_fsdp_validated):
    # the new-user pass: explain titled "Why the best plan wins" over faster alternatives, and
    # plan's note said "2.6% faster" where its table said -2.5% for the same pair
    import re
    argv = ["--model", "llama3-8b", "--cluster", "1x8xH100-80GB"]
    code, out, err = run(capsys, "explain", *argv)
    assert code == 0, err
    text = " ".join(out.split())
    assert "Chosen plan:" in text and "Best plan:" not in text
    assert "objective: robust: a simpler plan of a validated regime" in text
    assert "Why this plan was chosen" in text and "Why the best plan wins" not in text
    code, out, err = run(capsys, "plan", *argv)
    assert code == 0, err
    text = " ".join(out.split())
    (pct,) = set(re.findall(r"alternative 1, is ([\d.]+)% faster by the model", text))
    row1 = re.search(r"│ 1 │ [\d,.]+ │ ([-+][\d.]+)% │", text)
    assert row1 and float(row1.group(1)) == -float(pct), (pct, row1)
    # the clipolish pass: row 0 read "(best)" and the columns "vs best" above a faster row 1
    assert "(chosen by the robust objective)" in text and "(best)" not in text
    assert "differences from the chosen plan" in text and "vs chosen" in text
    assert "vs best" not in text and "differs from best" not in text


def test_plan_table_calls_the_fastest_plan_best(capsys):
    # the robust objective that keeps the fastest plan, and --objective fastest: "(best)" stands
    for objective in ("robust", "fastest"):
        code, out, err = run(capsys, "plan", *TINY, "--objective", objective)
        assert code == 0, err
        text = " ".join(out.split())
        assert "(best)" in text and "vs best" in text and "chosen by" not in text


@pytest.mark.parametrize("flags, words", [
    (["--moe-capacity-factor", "1.25"], "the model has no routed experts"),
    (["--dispatcher", "deepep"], "--dispatcher deepep only applies to mixture-of-experts layers"),
    (["--expert-tp", "2"], "--expert-tp 2 only applies to mixture-of-experts layers"),
    (["--dispatcher", "deepep", "--expert-tp", "2"], "drop --dispatcher and --expert-tp"),
])
def test_moe_flags_on_a_dense_model_blame_the_model_not_the_framework(capsys, flags, words):
    # the new-user pass: under the default framework (torch) these said torch cannot run them,
    # which sent users to another framework, where the dense model fails the same way
    code, out, err = run(capsys, "plan", *TINY, *flags)
    assert code == 2 and words in err and "Fix:" in err, err
    assert "under torch" not in err and "framework 'torch'" not in err and "searching" not in err


def test_a_model_dict_with_top_k_over_its_experts_names_a_fix(capsys, tmp_path):
    # the new-user pass: the message named the rule but no fix
    model = tmp_path / "moe.json"
    model.write_text(json.dumps({
        "name": "my-moe", "family": "llama", "num_layers": 4, "hidden_size": 256,
        "num_heads": 4, "vocab_size": 1000, "seq_len": 512, "num_experts": 4, "top_k": 6,
        "moe_ffn_hidden_size": 512}))
    code, out, err = run(capsys, "estimate", "--model", str(model), "--cluster", "1x8xA100-80GB",
                         "--global-batch", "32")
    assert code == 2 and "InvalidModelConfig" in err, err
    assert "top_k=6 must be in [1, num_experts=4]" in err and "fix: top_k at most 4" in err


def test_an_estimate_notes_a_dispatcher_a_dense_model_ignores(capsys):
    code, out, err = run(capsys, "estimate", *TINY, "--dispatcher", "deepep", "--json")
    assert code == 0, err
    assert any("dispatcher 'deepep' ignored: the model is dense" in n
               for n in json.loads(out)["notes"])


def test_v100_mfu_warning_says_what_it_compares(capsys):
    # the clipolish pass: "exceeds the best published for any framework" read as the world's
    # best and hid that the figure is another framework's run, in which convention
    from autopar.cost.regime import mfu_ceiling
    code, out, err = run(capsys, "plan", "--model", "gpt-1.7b", "--cluster", "1x8xV100-32GB",
                         "--precision", "fp16", "--global-batch", "256", "--seq-len", "1024")
    assert code == 0, err
    text = " ".join(out.split())
    best = mfu_ceiling("torch", "fp16", "volta")
    assert best.cell[0] == "*"   # the corpus has no torch run on Volta
    assert ("best measured in autopar's corpus of published runs for fp16 dense models on "
            "Volta GPUs") in text
    assert "any framework (torch has no run there)" in text and best.record in text
    assert "model FLOPs (recomputation excluded) over the step time" in text
    assert "best published" not in text


def test_a_huge_global_batch_gets_a_note_with_a_fix(capsys):
    # the clipolish pass: --global-batch 10000000 (tokens meant, or a typo) was planned silently
    from autopar.cli.batch_notes import LARGEST_PUBLISHED_TOKENS_PER_STEP
    from autopar.cli.batch_notes import huge_batch_note as _huge_batch_note
    code, out, err = run(capsys, "estimate", "--model", "tiny-llama", "--cluster",
                         "2x4xA100-80GB", "--global-batch", "10000000", "--tp", "1", "--pp", "1")
    assert code == 0, err
    text = " ".join(out.split())
    assert ("the global batch 10,000,000 sequences x 32 tokens = 320.0M tokens per step is "
            "larger than any published pre-training batch") in text
    assert "--global-batch counts sequences, not tokens" in text
    (fix,) = re.findall(r"Fix: for about 10,000,000 tokens per step, --global-batch (\d+);", text)
    assert int(fix) % 8 == 0 and abs(int(fix) * 32 - 1e7) <= 4 * 32   # a multiple of the GPUs
    # the boundary: the largest published batch itself is no surprise
    assert _huge_batch_note(15_360, 4_096, 8, 512) == []
    assert LARGEST_PUBLISHED_TOKENS_PER_STEP == 15_360 * 4_096
    assert _huge_batch_note(15_361, 4_096, 8, 512)
    code, out, err = run(capsys, "estimate", *TINY, "--tp", "1", "--pp", "1")
    assert "larger than any published" not in " ".join((out + err).split())
    # a new user's --global-batch 64 --seq-len 1000000: the sequences are the cause, and the
    # fix is a batch of sequences, not a reading of 64 as tokens
    (note,) = _huge_batch_note(64, 1_000_000, 32, 512)
    assert "not tokens" not in note and "at sequences of 1,000,000 tokens" in note
    assert "Fix: --global-batch 62 or fewer" in note     # 62.9M // 1M


def test_models_lists_mixtures_of_experts_as_such(capsys):
    # the clipolish pass: Mixtral, DeepSeek and Qwen3-MoE were listed with family "llama" only,
    # and the Hugging Face table showed gpt-oss and Llama 4 without their experts
    code, out, err = run(capsys, "models", "--json")
    assert code == 0, err
    data = json.loads(out)
    rows = {r["name"]: r for r in data["models"]}
    assert rows["mixtral-8x7b"]["moe"] and rows["mixtral-8x7b"]["family"] == "llama"
    assert rows["deepseek-v3"]["moe"] and rows["deepseek-v3"]["latent_attention"]
    assert not rows["llama3-8b"]["moe"] and not rows["llama3-8b"]["latent_attention"]
    hf_rows = {r["name"]: r for r in data["hf_models"]}
    if hf_rows:   # transformers installed
        assert (hf_rows["hf-gpt-oss-120b"]["experts"], hf_rows["hf-gpt-oss-120b"]["top_k"]) == (128, 4)
        assert (hf_rows["hf-llama4-scout"]["experts"], hf_rows["hf-llama4-scout"]["top_k"]) == (16, 1)
        assert (hf_rows["hf-deepseek-v3"]["experts"], hf_rows["hf-qwen3-30b-a3b"]["experts"]) == (256, 128)
        assert hf_rows["hf-llama3-8b"]["experts"] is None
    code, out, err = run(capsys, "models")
    assert code == 0, err
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"):
        assert "│ llama MoE " in lines[name], lines[name]
    assert "│ llama " in lines["llama3-8b"] and "MoE" not in lines["llama3-8b"]
    assert "MLA" in lines["deepseek-v3"] and "MLA" not in lines["mixtral-8x7b"]
    if hf_rows:
        assert "128 top-4" in lines["hf-gpt-oss-120b"] and "16 top-1" in lines["hf-llama4-scout"]
        assert "top-" not in lines["hf-llama3-8b"]


def test_an_export_that_cannot_be_written_leaves_no_file_behind(capsys, tmp_path):
    # the new-user pass: the deepspeed file was written, then the torchtitan export failed
    model = tmp_path / "moe.json"
    model.write_text(json.dumps(dict(
        name="cap-moe", family="llama", num_layers=2, hidden_size=128, num_heads=4,
        num_kv_heads=2, vocab_size=512, seq_len=256, ffn_hidden_size=512, num_experts=8,
        top_k=2, moe_ffn_hidden_size=256)))
    ds, tt = tmp_path / "ds.json", tmp_path / "tt.toml"
    code, out, err = run(capsys, "plan", "--model", str(model), "--cluster", "1x4xH100",
                         "--global-batch", "8", "--seq-len", "256", "--framework", "megatron",
                         "--moe-capacity-factor", "1.0", "--export", "deepspeed", str(ds),
                         "--export", "torchtitan", str(tt))
    assert code == 2 and "torchtitan's MoE is dropless" in err
    assert f"--export torchtitan {tt}" in err and "no --export file was written" in err
    assert not ds.exists() and not tt.exists()


def test_explain_reads_a_plan_file(capsys, tmp_path):
    # the new-user pass: `explain --plan FILE` was "unrecognized arguments ... Did you mean --plot?"
    f = tmp_path / "p.json"
    code, _, err = run(capsys, "plan", *TINY, "--out", str(f))
    assert code == 0, err
    code, out, err = run(capsys, "explain", "--plan", str(f))
    assert code == 0, err
    saved = json.loads(f.read_text())["config"]
    assert f"Plan of {f}" in out and f"tp={saved['tp']} pp={saved['pp']} dp={saved['dp']}" in out


def test_a_bad_cluster_in_a_plan_file_names_the_file_and_its_field(capsys, tmp_path):
    # a new user: a hand-edited cluster gave InvalidClusterSpec with no word of the plan file
    f = tmp_path / "p.json"
    code, _, err = run(capsys, "plan", *TINY, "--out", str(f))
    assert code == 0, err
    d = json.loads(f.read_text())
    d["cluster"] = "1x8xH10O"
    f.write_text(json.dumps(d))
    code, _, err = run(capsys, "estimate", "--plan", str(f))
    flat = " ".join(err.split())
    assert code == 2 and "InvalidPlanFile" in flat
    assert f"{f}: its 'cluster' field: cluster spec '1x8xH10O'" in flat
    assert "Did you mean 'H100-SXM5-80GB'" in flat and "--cluster SPEC" in flat
    # --cluster stands in for the file's field
    code, out, err = run(capsys, "estimate", "--plan", str(f), "--cluster", "1x8xH100")
    assert code == 0, err


def test_cli_errors_name_the_flags_a_cli_user_types(capsys):
    """A new user got "TrainingConfig.seq_len ... pass an int" and "Fix: dispatcher='alltoall'"
    from the command line: the CLI names its own flags (the API name kept beside the field)."""
    from autopar.cli.commands import flag_words
    code, out, err = run(capsys, "plan", "--model", "tiny-llama", "--cluster", "1x8xH100",
                         "--global-batch", "16", "--seq-len", "0")
    assert code == 2 and "--seq-len (TrainingConfig.seq_len) must be" in " ".join(err.split())
    assert flag_words("Fix: dispatcher='alltoall'; ep=3 does not divide; expert_tp*ep = 2*4") \
        == "Fix: --dispatcher alltoall; --ep 3 does not divide; expert_tp*ep = 2*4"
    # the new-user pass of 2026-12-06: "Fix: --expert-tp None" named a value the flag refuses
    assert flag_words("Fix: expert_tp=None (etp = tp)") == "Fix: no --expert-tp (etp = tp)"


def test_cli_errors_name_only_the_flags_the_user_gave(capsys):
    # the new-user pass of 2026-12-07: "--ep 3 does not divide ... and --dp 16" named a flag
    # that was never given (dp was derived from the GPU count)
    from autopar.cli.flagwords import flag_words
    args = ("estimate", "--model", "mixtral-8x7b", "--cluster", "2x8xH100", "--global-batch",
            "256", "--seq-len", "4096", "--ep", "3")
    code, _, err = run(capsys, *args)
    text = " ".join(err.split())
    assert code == 2 and "--ep 3 does not divide" in text and "and dp=16" in text
    assert "--dp" not in text
    code, _, err = run(capsys, *args, "--dp", "16")
    assert code == 2 and "and --dp 16" in " ".join(err.split())
    assert flag_words("ep=3 and dp=16", given=frozenset({"ep"})) == "--ep 3 and dp=16"


def test_cli_moe_errors_name_the_moe_flags(capsys):
    # the new-user pass of 2026-12-07: MoE errors named TrainingConfig's fields on the CLI
    from autopar.cli.flagwords import flag_words
    code, _, err = run(capsys, "estimate", "--model", "tiny-llama", "--cluster", "1x8xH100",
                       "--global-batch", "16", "--seq-len", "256", "--moe-capacity-factor", "1.0")
    text = " ".join(err.split())
    assert code == 2 and "--moe-capacity-factor 1.0: the model has no routed experts" in text
    assert "drop --moe-capacity-factor," in text and "moe_capacity_factor" not in text
    assert flag_words("moe_pad_to_capacity=True needs moe_capacity_factor; "
                      "TrainingConfig.moe_expert_load") == \
        "--moe-pad-to-capacity needs --moe-capacity-factor; TrainingConfig.moe_expert_load"


def test_plan_says_sp_is_ignored_at_a_pinned_tp_1(capsys):
    # the new-user pass of 2026-12-06: estimate said so, plan and explain dropped --sp silently
    code, out, err = run(capsys, "plan", *TINY, "--sp", "--tp", "1")
    assert code == 0, err
    assert "needs tp > 1: ignored at tp=1" in err
    code, out, err = run(capsys, "plan", *TINY, "--sp")
    assert code == 0 and "ignored at tp=1" not in err   # tp searched: sp is used where tp > 1


def test_a_model_autopar_has_as_a_hugging_face_preset_is_named(capsys):
    """gpt-oss and Llama 4 are Hugging Face presets (hf-*): their bare names point there, not to
    the closest built-in preset by spelling (gpt-oss-120b once suggested 'gpt-1008b')."""
    assert main(["plan", "--model", "gpt-oss-120b", "--cluster", "4x8xH100",
                 "--global-batch", "64", "--seq-len", "4096"]) == 2
    err = capsys.readouterr().err
    assert "Did you mean 'hf-gpt-oss-120b'" in err and "gpt-1008b'?" not in err


@pytest.mark.parametrize("flags", [["--sp", "--no-sp"], ["--no-compare-sp", "--compare-sp"]])
def test_opposite_on_off_flags_are_refused(capsys, flags):
    # argparse kept the last of --sp --no-sp without a word
    with pytest.raises(SystemExit) as exc:
        main(["plan", *TINY, flags[0], "--tp", "2", flags[1]])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"argument {flags[1]}: not allowed with argument {flags[0]}" in err \
        or f"argument {flags[0]}: not allowed with argument {flags[1]}" in err, err


def test_an_unsupported_precision_names_the_flag_that_fixes_it(capsys):
    # the message listed tf32 (no training precision) and named only precision='fp16'
    code, _, err = run(capsys, "estimate", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB",
                       "--precision", "fp8")
    assert code == 2 and "tf32" not in err, err
    assert "A100-SXM4-80GB does not support fp8" in err and "Fix: --precision bf16" in err, err


@pytest.mark.parametrize("argv", [
    ["estimate", *TINY, "--dispatcher", "auto"],
    ["plan", *TINY, "--compare-dispatcher", "auto"],
])
def test_auto_dispatcher_is_a_search_pin_only(capsys, argv):
    # estimate and --compare-* took 'auto' and then failed: "dispatcher 'auto' is not one of"
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "invalid choice: 'auto'" in err, err


def test_a_refused_pin_names_the_framework_flag_once():
    from autopar.cli.commands import flag_words
    text = "or plan for another framework (--framework / TrainingConfig(framework=...))."
    assert flag_words(text) == "or plan for another framework (--framework)."
    assert flag_words("set TrainingConfig(framework=...)") == \
        "set --framework (TrainingConfig(framework=...))"


def test_an_imported_files_model_is_named_when_it_is_not_used_or_unknown(capsys, tmp_path):
    # --model silently replaced the TOML's [model]; an unknown flavor read as a bad --model
    toml = tmp_path / "job.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\n'
                    'tensor_parallel_degree = 2\n')
    code, out, err = run(capsys, "estimate", *TINY, "--torchtitan-toml", str(toml), "--json")
    assert code == 0, err
    assert "the flags' model 'tiny-llama' replaces the imported 'llama3-8b' (the file's model " \
           "name and flavor)" in json.loads(out)["notes"]
    toml.write_text('[model]\nname = "deepseek_v3"\nflavor = "671B"\n')
    code, _, err = run(capsys, "estimate", "--cluster", "1x8xH100", "--torchtitan-toml",
                       str(toml))
    assert code == 2 and "the imported file's model name and flavor give 'deepseek-v3-671b'" in err
    assert "Did you mean 'deepseek-v3'?" in err and "Fix: name the model with --model" in err


def test_expert_tp_on_a_dense_model_is_refused_in_plain_words(capsys):
    # estimate said "needs a MoE model whose 0 experts ep divides, and ep*etp = 2 dividing ..."
    code, _, err = run(capsys, "estimate", *TINY, "--tp", "1", "--expert-tp", "2")
    assert code == 2, err
    assert "--expert-tp 2 needs a mixture-of-experts model; this model has no MoE layer" in err
    assert "0 experts" not in err and "Fix: drop the expert_tp pin (--expert-tp)" in err


def test_compare_sp_at_compare_tp_1_is_noted(capsys):
    # the new-user pass of 2026-12-07: --sp at tp 1 was noted, --compare-sp dropped silently
    code, out, err = run(capsys, "plan", *TINY, "--compare-sp", "--compare-zero", "1")
    assert code == 0, err
    assert "note: --compare-sp: sequence parallelism shards" in err and "ignored at tp=1" in err
    code, out, err = run(capsys, "plan", *TINY, "--compare-sp", "--compare-tp", "2")
    assert code == 0 and "--compare-sp:" not in err


@pytest.mark.parametrize("command", ["plan", "explain"])
def test_a_broken_compare_plan_names_the_compare_flags_before_searching(capsys, command):
    # the new-user pass of 2026-12-07: --compare-ep 2 on a dense model was refused after the
    # whole search, as "--ep 2 needs a mixture-of-experts model. Fix: --ep 1 (drop --ep ...)"
    code, out, err = run(capsys, command, *TINY, "--compare-ep", "2")
    assert code == 2 and out == ""
    assert "searching" not in err   # refused before the search
    assert ("InvalidParallelConfig: the hand-tuned plan of the --compare-* flags: --compare-ep 2 "
            "needs a mixture-of-experts model") in err
    assert "Fix: --compare-ep 1 (drop --compare-ep" in err and " --ep" not in err


def test_a_model_file_that_is_not_a_dict_is_named(capsys, tmp_path):
    # the new-user pass of 2026-12-07: a JSON list said "model must be an nn.Module, ...; got
    # list. Fix: e.g. autopar.optimize('llama2-70b', ...)", Python advice on the command line
    f = tmp_path / "model.json"
    f.write_text("[1, 2]")
    code, out, err = run(capsys, "estimate", "--model", str(f), "--cluster", "1x8xA100-80GB")
    assert code == 2
    assert f"InvalidModelConfig: model file {f} holds a JSON list, not a model dict" in err
    assert "autopar.optimize" not in err


def test_estimate_under_an_sp_only_framework_takes_sp_on_by_default(capsys):
    # the new-user pass of 2026-12-07: `estimate --framework torchtitan --tp 2` estimated TP
    # without SP (ParallelConfig's default), with a warning that torchtitan cannot run it
    code, out, err = run(capsys, "estimate", *TINY, "--framework", "torchtitan", "--tp", "2",
                         "--zero", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["config"]["sequence_parallel"] is True
    assert any(n.startswith("sequence parallelism on (not given): torchtitan runs tensor "
                            "parallelism only with it") for n in data["notes"])
    assert not any("only with sequence_parallel=True" in w for w in data["warnings"])
    # --no-sp still estimates it off (and warns); torch keeps its default (off, with a note)
    code, out, err = run(capsys, "estimate", *TINY, "--framework", "torchtitan", "--tp", "2",
                         "--zero", "2", "--no-sp", "--json")
    data = json.loads(out)
    assert data["config"]["sequence_parallel"] is False
    assert any("only with sequence_parallel=True" in w for w in data["warnings"])
    code, out, err = run(capsys, "estimate", *TINY, "--tp", "2", "--json")
    data = json.loads(out)
    assert data["config"]["sequence_parallel"] is False
    assert any("the default without --sp" in n for n in data["notes"])


def test_schedule_flag_takes_the_spellings_parallel_config_takes(capsys):
    # the new-user pass of 2026-12-07: ParallelConfig(schedule="1F1B") is read as '1f1b'
    # (SCHEDULE_ALIASES), --schedule 1F1B was an invalid choice
    for given, read in (("1F1B", "1f1b"), ("Interleaved1F1B", "interleaved-1f1b"),
                        ("ZBV", "zbv-zero-bubble")):
        code, out, err = run(capsys, "estimate", *TINY, "--pp", "2", "--schedule", given,
                             "--json")
        assert code == 0, err
        assert json.loads(out)["config"]["schedule"] == read
    with pytest.raises(SystemExit) as exc:
        main(["estimate", *TINY, "--pp", "2", "--schedule", "bogus"])
    assert exc.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err


def test_framework_flag_reads_any_case(capsys):
    # the new-user pass of 2026-12-07: --framework Megatron was an invalid choice
    code, out, err = run(capsys, "estimate", *TINY, "--framework", "TorchTitan", "--tp", "2",
                         "--zero", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["config"]["sequence_parallel"] is True   # torchtitan's SP-only TP
    with pytest.raises(SystemExit) as exc:
        main(["estimate", *TINY, "--framework", "Megatrn"])
    assert exc.value.code == 2 and "invalid choice: 'megatrn'" in capsys.readouterr().err


def test_a_dispatcher_ignored_on_a_dense_model_does_not_empty_the_fix_table(capsys):
    # a new user's report: --dispatcher deepep on a dense model was noted as ignored, yet kept
    # in the configuration, so every fix was one torch cannot run and the table came out empty
    flags = ["--model", "llama3-8b", "--cluster", "1x8xH100", "--global-batch", "64",
             "--seq-len", "4096", "--json"]
    code, out, err = run(capsys, "estimate", *flags, "--dispatcher", "deepep")
    assert code == 0, err
    data = json.loads(out)
    plain = json.loads(run(capsys, "estimate", *flags)[1])
    assert any("dispatcher 'deepep' ignored" in n for n in data["notes"])
    assert data["verdict"] == plain["verdict"] == "out of memory"
    assert [f["change"] for f in data["fixes"]] == [f["change"] for f in plain["fixes"]]
    assert data["fixes"] and "fixes_unavailable" not in data


def test_an_out_of_memory_configuration_the_framework_cannot_run_says_why_no_fix(capsys):
    # every fix keeps the schedule torch cannot run: the reason is given, not a memory verdict
    code, out, err = run(capsys, "estimate", "--model", "llama3-70b", "--cluster", "8x8xH100",
                         "--tp", "8", "--pp", "8", "--schedule", "dualpipe",
                         "--global-batch", "512", "--seq-len", "8192", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["verdict"] == "out of memory" and data["fixes"] == []
    assert "torch cannot run this configuration" in data["fixes_unavailable"]
    assert "dualpipe" in data["fixes_unavailable"]


def test_the_plan_command_after_an_oom_plan_file_names_its_model_and_cluster(capsys, tmp_path):
    # a new user's report: `estimate --plan p.json --seq-len 8192` out of memory offered
    # `autopar plan --global-batch 64 --seq-len 8192`, which cannot run without --model/--cluster
    path = tmp_path / "p.json"
    code, _, err = run(capsys, "plan", "--model", "llama3-8b", "--cluster", "1x8xH100",
                       "--global-batch", "64", "--seq-len", "4096", "--out", str(path))
    assert code == 0, err
    code, out, err = run(capsys, "estimate", "--plan", str(path), "--seq-len", "8192", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["verdict"] == "out of memory"
    assert data["plan_command"].startswith(
        "autopar plan --model llama3-8b --cluster 1x8xH100-SXM5-80GB+8xib-ndr --global-batch 64 "
        "--seq-len 8192")


def test_a_fix_ending_a_sentence_or_turning_sequence_parallelism_on_is_typeable():
    # a new user's report: "Fix: sequence_parallel=True, or --expert-tp None" (the full stop
    # was read as part of the value, and sequence_parallel had no flag)
    from autopar.cli.flagwords import flag_words
    text = ("expert_tp=1 beside tp=2: the MoE layers take sequence-parallel inputs. "
            "Fix: sequence_parallel=True, or expert_tp=None.")
    assert flag_words(text, given=frozenset({"expert_tp", "tp"})) == (
        "--expert-tp 1 beside --tp 2: the MoE layers take sequence-parallel inputs. "
        "Fix: --sp, or no --expert-tp.")
    assert flag_words("Fix: vp_group=None.") == "Fix: no --vp-group."
    assert flag_words("Fix: moe_capacity_factor=1.5.") == "Fix: --moe-capacity-factor 1.5."


def test_a_time_limit_error_names_the_flags_not_the_python_arguments():
    # a new user's report: `plan --time-limit 1` said "raise time_limit_s, or pin choices with
    # fixed=" (the Python API's words)
    from autopar.cli.flagwords import flag_words
    text = ("no fitting plan found within time_limit_s=1.0 (3 of 9 candidate meshes searched, "
            "10 configurations). Fix: raise time_limit_s, or pin choices with fixed= to shrink "
            "the space.")
    out = flag_words(text)
    assert "within --time-limit 1.0" in out and "Fix: raise --time-limit" in out
    assert "time_limit_s" not in out and "fixed=" not in out


def test_the_search_line_says_the_meshes_are_the_space_not_those_searched(capsys):
    # a new user's report: a stopped search printed "649 configurations, 1,028 meshes" when it
    # had reached 102 of the 1,028
    code, out, err = run(capsys, "plan", *TINY)
    assert code == 0, err
    line = [s for s in out.splitlines() if s.startswith("search: ")][0]
    assert " meshes in the space, " in line or " mesh in the space, " in line, line


def test_an_imported_moe_configuration_on_a_dense_model_is_blamed_on_the_import(
        capsys, tmp_path):
    # a new user's report: a Mixtral torchtitan export imported with --model llama3-8b said
    # "ep=8 needs a mixture-of-experts model ... Fix: --ep 1 (drop --ep)", a flag never typed
    path = tmp_path / "mix.py"
    code, _, err = run(capsys, "plan", "--model", "mixtral-8x7b", "--cluster", "2x8xH100",
                       "--global-batch", "64", "--seq-len", "4096", "--framework",
                       "torchtitan-0.3", "--export", "torchtitan-0.3", str(path))
    assert code == 0, err
    code, out, err = run(capsys, "estimate", "--model", "llama3-8b", "--cluster", "2x8xH100",
                         "--torchtitan-config", str(path))
    assert code == 2
    assert "the imported configuration sets expert parallelism" in err
    assert "Fix: --model mixtral-8x7b (the file's)" in err and "drop --ep" not in err
    code, out, err = run(capsys, "estimate", "--model", "mixtral-8x7b", "--cluster", "2x8xH100",
                         "--torchtitan-config", str(path))
    assert code == 0, err


def test_help_and_usage_errors_load_no_torch():
    # `autopar --help` took about 4 s: the parser pulled torch in through the measure
    # commands, the report and the search's margin; the parser now answers alone
    import subprocess
    import sys
    code = ("import sys\nfrom autopar.cli import main\nrcs = []\n"
            "for argv in (['--help'], ['plan', '--help'], ['plan', '--modle', 'x']):\n"
            "    try:\n        main(argv)\n"
            "    except SystemExit as exc:\n        rcs.append(exc.code)\n"
            "print(rcs, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[0, 0, 2] False"
    assert "Did you mean --model?" in out.stderr


def test_models_names_the_hf_presets_without_transformers(capsys, monkeypatch):
    # a new user's trial: without transformers `autopar models` listed no hf-* preset, while
    # every unknown-preset error pointed at it for them
    from autopar.errors import MissingDependency
    from autopar.graph import hf

    def missing(name):
        raise MissingDependency("Hugging Face presets need transformers")
    monkeypatch.setattr(hf, "describe", missing)
    assert main(["models"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "With it, the Hugging Face presets: hf-" in out and "hf-llama3-8b" in out
    assert main(["models", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hf_models"] == [] and "hf-llama3-8b" in doc["hf_preset_names"]
