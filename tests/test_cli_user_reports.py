"""A new user's reports on the command line (2026-12-07): choices in any case (--precision BF16),
a GPU named without its memory size (1x8xH100-SXM5), --json errors as JSON, and the MoE
folding rule citing the framework in use rather than Megatron-Core."""

from __future__ import annotations

import json

import pytest

from autopar.cli import build_parser, main
from cli_run import run
from autopar.errors import InvalidClusterSpec
from autopar.frameworks import get_profile, rules
from autopar.hardware.cluster import Cluster
from autopar.hardware.devices import CATALOG, memory_ambiguity

TINY = ["--model", "tiny-llama", "--global-batch", "32", "--seq-len", "512"]
MOE = ["--model", "mixtral-8x7b", "--cluster", "1x8xH100", "--global-batch", "64",
       "--seq-len", "4096"]



def _subcommands():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices.items()


# -- 1: choices among lower-case names, in any case -------------------------------------------
def test_the_reported_command_line_reads_bf16_as_bf16():
    args = build_parser().parse_args(["plan", "--model", "llama3-8b", "--cluster",
                                      "1x8xH100-SXM5-80GB", "--precision", "BF16"])
    assert args.precision == "bf16"


def test_every_option_of_lower_case_choices_reads_any_case():
    # one mechanism for all of them (the parser's add_argument), so a new option gets it too
    checked = []
    for name, p in _subcommands():
        for action in p._actions:
            choices = action.choices
            if not choices or not all(isinstance(c, str) and c == c.lower() for c in choices):
                continue
            flag = action.option_strings[0]
            for c in choices:
                assert action.type(c.upper()) == c, (name, flag, c)
                assert action.type(c.title()) == c, (name, flag, c)
            checked.append(f"{name} {flag}")
    for want in ("plan --precision", "plan --framework", "plan --dispatcher", "plan --recompute",
                 "plan --optimizer-state-dtype", "plan --objective", "plan --compare-recompute",
                 "estimate --cp-mode", "estimate --schedule", "explain --dispatcher",
                 "calibrate --precision"):
        assert want in checked, want


def test_mixed_case_values_parse_to_the_canonical_names():
    args = build_parser().parse_args([
        "plan", "--precision", "Fp8", "--framework", "Megatron", "--dispatcher", "AllGather",
        "--recompute", "FULL", "--optimizer-state-dtype", "BF16", "--objective", "Fastest",
        "--schedule", "Interleaved-1F1B", "--compare-recompute", "Selective"])
    assert (args.precision, args.framework, args.dispatcher, args.recompute,
            args.optimizer_state_dtype, args.objective, args.schedule,
            args.compare_recompute) == ("fp8", "megatron", "allgather", "full", "bf16",
                                        "fastest", "interleaved-1f1b", "selective")
    assert build_parser().parse_args(["estimate", "--cp-mode", "ULYSSES"]).cp_mode == "ulysses"
    assert build_parser().parse_args(["calibrate", "--precision", "TF32"]).precision == "tf32"


def test_a_value_outside_the_choices_is_still_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", *TINY, "--cluster", "1x8xH100", "--precision", "BF17"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "invalid choice: 'bf17'" in err and "'bf16'" in err


# -- 2: a GPU named without its memory size -----------------------------------------------------
@pytest.mark.parametrize("spec, device, world", [
    ("1x8xH100-SXM5", "H100-SXM5-80GB", 8), ("1x8xh100-sxm5", "H100-SXM5-80GB", 8),
    ("16xH100-SXM5", "H100-SXM5-80GB", 16), ("2x8xH200-SXM", "H200-SXM-141GB", 16),
    ("8xB200-SXM", "B200-SXM-180GB", 8), ("1x8xA100-PCIe-40", None, 0),
])
def test_a_gpu_name_that_begins_one_catalog_name_is_that_gpu(spec, device, world):
    if device is None:   # not at a '-': a near miss, refused with the closest name
        with pytest.raises(InvalidClusterSpec, match="Did you mean 'A100-PCIe-40GB'"):
            Cluster.from_spec(spec)
        return
    c = Cluster.from_spec(spec)
    assert c.device.name == device and c.world_size == world
    assert c.device == CATALOG.device(device)


def test_a_gpu_name_that_begins_several_names_is_refused_naming_them():
    assert CATALOG.extending("A100-SXM4") == ("A100-SXM4-40GB", "A100-SXM4-80GB")
    with pytest.raises(InvalidClusterSpec) as exc:
        Cluster.from_spec("2x8xA100-SXM4")
    text = str(exc.value)
    assert text.startswith("cluster spec '2x8xA100-SXM4': GPU 'a100-sxm4' begins the names of 2 "
                           "GPUs of the catalog: A100-SXM4-40GB (40 GB), A100-SXM4-80GB (80 GB)")
    assert text.endswith("Fix: write the full name of yours: 'A100-SXM4-40GB' or "
                         "'A100-SXM4-80GB'")
    assert "Valid names" not in text   # the candidates are the fix, not the whole catalog
    with pytest.raises(InvalidClusterSpec, match="'RTX-3090-24GB', 'RTX-A6000-48GB' or "
                                                 "'RTX-4090-24GB'"):
        CATALOG.device("rtx")


def test_names_the_catalog_knew_read_as_before():
    # aliases win over the prefix rule: 'a100' stays the 80 GB part, with its note
    assert CATALOG.device("a100").name == "A100-SXM4-80GB"
    assert CATALOG.device("a100-sxm").name == "A100-SXM4-80GB"
    assert "A100-SXM4-40GB" in memory_ambiguity("a100")
    assert memory_ambiguity("h100-sxm5") is None   # one part: nothing to note
    assert CATALOG.extending("h100-sxm5-80gb") == ()
    with pytest.raises(InvalidClusterSpec, match=r"Did you mean 'H100-SXM5-80GB' \('h100-sxm'\)"):
        Cluster.from_spec("1x8xH100-SXM6")


def test_the_cli_plans_on_a_gpu_named_without_its_memory(capsys):
    code, out, err = run(capsys, "plan", *TINY, "--cluster", "1x8xH100-SXM5", "--precision",
                         "BF16", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["cluster"] == "1x8xH100-SXM5-80GB+8xib-ndr" and data["world_size"] == 8
    assert data["train"]["precision"] == "bf16"


# -- 3: --json errors are JSON ----------------------------------------------------------------
@pytest.mark.parametrize("argv, kind, words", [
    (["estimate", *TINY, "--cluster", "1x8xA100-SXM4"], "InvalidClusterSpec",
     "Fix: write the full name of yours"),
    (["plan", "--model", "no-such-model", "--cluster", "1x8xH100"], "InvalidModelConfig",
     "unknown model preset 'no-such-model'"),
    (["explain", *TINY, "--cluster", "9x9xZ100"], "InvalidClusterSpec", "unknown GPU 'z100'"),
    (["estimate", *TINY, "--cluster", "1x8xH100", "--tp", "3"], "InvalidParallelConfig",
     "tp*pp*cp = 3*1*1 = 3 does not divide the 8 GPUs"),
])
def test_a_failed_command_with_json_prints_a_json_error(capsys, argv, kind, words):
    code, out, err = run(capsys, *argv, "--json")
    assert code == 2 and err == ""
    data = json.loads(out)
    assert list(data) == ["error"] and data["error"]["type"] == kind
    assert words in data["error"]["message"]
    # without --json: the one red line on stderr, as before
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(f"autopar: {kind}: ") and words in err


def test_a_bad_flag_with_json_prints_a_json_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", *TINY, "--cluster", "1x8xH100", "--precision", "bf17", "--json"])
    cap = capsys.readouterr()
    assert exc.value.code == 2 and cap.err == ""
    error = json.loads(cap.out)["error"]
    assert error["type"] == "UsageError"
    assert error["message"].startswith("argument --precision: invalid choice: 'bf17'")
    assert error["message"].endswith("Fix: see 'autopar plan --help' for the options.")
    with pytest.raises(SystemExit) as exc:
        main(["estimate", "--json", "--modl", "tiny-llama"])
    error = json.loads(capsys.readouterr().out)["error"]
    assert exc.value.code == 2 and "Did you mean --model?" in error["message"]


# -- 4: the MoE folding rule cites the framework in use ---------------------------------------
def test_the_folding_rule_cites_the_profile_in_use_or_none():
    torch, titan, megatron = (get_profile(f) for f in ("torch", "torchtitan", "megatron"))
    assert rules.folding_sp(1, 2, True, torch) is None and rules.folding_sp(1, 1, False) is None
    plain = rules.folding_sp(1, 2, False, torch).problem
    assert "Megatron" not in plain and "megatron" not in plain
    assert plain.startswith("expert_tp=1 beside tp=2: folded MoE layers take sequence-parallel "
                            "inputs when tp > 1")
    assert rules.folding_sp(1, 2, False).problem == plain   # no profile: the general words
    said = rules.folding_sp(1, 2, False, titan).problem
    assert "torchtitan's MoE layers" in said and "apply_moe_ep_tp" in said
    assert "Megatron" not in said
    said = rules.folding_sp(1, 2, False, megatron).problem
    assert "megatron's MoE layers" in said and "transformer/moe/moe_layer.py" in said
    assert rules.folding_sp(1, 2, False, titan).fix == "sequence_parallel=True, or expert_tp=None"


@pytest.mark.parametrize("framework, cites", [("torch", None), ("TorchTitan", "apply_moe_ep_tp"),
                                              ("megatron", "moe_layer.py")])
def test_estimate_refuses_folding_without_sp_citing_the_framework(capsys, framework, cites):
    code, out, err = run(capsys, "estimate", *MOE, "--framework", framework, "--tp", "2",
                         "--ep", "4", "--expert-tp", "1", "--no-sp")
    assert code == 2 and out == ""
    assert "autopar: InvalidParallelConfig: --expert-tp 1 beside --tp 2: " in err
    assert "Fix: --sp, or no --expert-tp." in err
    if cites is None:
        assert "Megatron" not in err and "folded MoE layers take sequence-parallel" in err
    else:
        assert f"{framework.lower()}'s MoE layers" in err and cites in err
