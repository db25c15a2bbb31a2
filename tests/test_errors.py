"""Every error class autopar raises: one example input each, and the message's three parts
(the input, the rule, a fix). ``EXAMPLES`` (benchmarks/docs_examples.py) generates the table in
docs/errors.md. Also: Ctrl-C in ``autopar plan`` prints the best plan so far, and before a
search exits with one line."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import autopar
from autopar import errors
from benchmarks.docs_examples import EXAMPLES, TINY, TRAIN

ROOT = Path(__file__).resolve().parents[1]


def _as_from_a_shell() -> None:
    """SIGINT as a shell leaves it to a command it starts: default action, not blocked. A test
    process may have it ignored or blocked (both are inherited across exec), e.g. after another
    test in the same pytest-xdist worker started process groups; the child then never saw the
    Ctrl-C these tests send (rc 0 after the whole search)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _unsupported_plan():
    from autopar.runtime.errors import UnsupportedPlanError
    return UnsupportedPlanError


@pytest.mark.parametrize("cls, text, call", EXAMPLES, ids=[f"{c.__name__}-{i}"
                                                            for i, (c, _, _) in enumerate(EXAMPLES)])
def test_every_error_names_rule_and_fix(cls, text, call):
    with pytest.raises(cls) as info:
        call()
    msg = str(info.value)
    assert isinstance(info.value, autopar.AutoparError)
    assert "fix" in msg.lower() or "use at least" in msg, msg
    print(f"{cls.__name__} | {text} | {msg}")


def test_every_error_class_has_an_example():
    classes = {c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.AutoparError)}
    assert classes - {errors.AutoparError} <= {c for c, _, _ in EXAMPLES}
    assert issubclass(_unsupported_plan(), autopar.AutoparError)
    from autopar.report.plots import MissingDependency
    assert MissingDependency is autopar.MissingDependency


def test_infeasible_names_the_batch_multiple():
    with pytest.raises(autopar.InfeasibleError, match="multiple of 8"):
        autopar.optimize(TINY, "1x8xA100", dict(global_batch_size=7, seq_len=64),
                         fixed={"tp": 1, "pp": 1})


def test_infeasible_names_the_gpus_needed():
    with pytest.raises(autopar.InfeasibleError, match=r"at least \d+ GPUs of this kind"):
        autopar.optimize("llama2-7b", "1x1xA100-40GB", dict(global_batch_size=64, seq_len=4096))


def test_infeasible_states_one_rounding_for_one_quantity():
    # the new-user trial read "108 GB in all ... 107.8 GB per GPU sharded over all 1"
    with pytest.raises(autopar.InfeasibleError) as info:
        autopar.optimize("llama2-7b", "1x1xA100-40GB", dict(global_batch_size=64, seq_len=4096))
    msg = str(info.value)
    assert re.search(r"model states alone are \d+\.\d GB in all \(16 bytes per parameter "
                     r"with adam; all of it on the one GPU\)", msg), msg
    from autopar.search.diagnose import _states_text
    assert _states_text(107.84e9, 16, "adam", 4) == (
        "107.8 GB in all (16 bytes per parameter with adam; 27.0 GB per GPU sharded over all 4)")


def test_infeasible_names_the_state_options_that_fit():
    # 70B on 16 A100-80GB: 69 GB of fp32 Adam states per GPU with full sharding do not fit;
    # bf16 moments or CPU offload do, and the message says so (both were missing)
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096)
    with pytest.raises(autopar.InfeasibleError) as info:
        autopar.optimize("llama2-70b", "2x8xA100-80GB", train)
    msg = str(info.value)
    assert "optimizer_state_dtype='bf16'" in msg and "--optimizer-offload" in msg, msg
    # the fix named makes a plan fit (with the memory margin of 28 runs' band; the search's
    # default margin follows the measured band, a policy this test is not about)
    plan = autopar.optimize("llama2-70b", "2x8xA100-80GB",
                            dataclasses.replace(train, optimizer_state_dtype="bf16"),
                            memory_margin=0.12)
    assert plan.estimate.fits


def test_pinned_pp_beyond_the_layers_is_named():
    with pytest.raises(autopar.InfeasibleError, match="too few layers"):
        autopar.optimize(TINY, "1x8xA100", TRAIN, fixed={"pp": 4})


def test_ctrl_c_in_the_cli_prints_the_best_plan_so_far(tmp_path):
    # issue 12 item 8: the signal was sent after a 2 s sleep and on a loaded machine landed in
    # `import autopar` (traceback, rc -2). Now it is sent once the search reports progress on
    # stderr, so it always lands in the search: a signal sent at any moment after that (even
    # after the search ended) gives the plan found so far and exit code 0.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out_file = tmp_path / "plan.json"
    p = subprocess.Popen([sys.executable, "-m", "autopar.cli", "plan", "--model", "gpt3-175b",
                          "--cluster", "128x8xA100-80GB", "--global-batch", "1536", "--out",
                          str(out_file)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=_as_from_a_shell)
    seen = []
    for line in p.stderr:  # blocks until the child prints; no timing involved
        seen.append(line)
        if line.startswith("searching "):
            p.send_signal(signal.SIGINT)
            break
    out, err = p.communicate(timeout=600)
    err = "".join(seen) + err
    assert p.returncode == 0, err
    assert "interrupt: stopping with the best plan found so far" in err
    assert "Traceback" not in err
    plan = autopar.Plan.from_json(out_file)
    assert plan.estimate.fits and "autopar plan: gpt3-175b" in out


def _on_import(module: str) -> str:
    """Child-process code that sends itself SIGINT when ``module`` is first imported."""
    return f"""
class Hook:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Hook())
"""


#: Child processes that send themselves SIGINT at one point of start-up, under Python's default
#: handler, as a Ctrl-C pressed at that moment would: while torch is being imported (an import
#: hook), or during graph extraction (autopar.problem.model_graph wrapped).
_HOOKS = {
    "import": _on_import("torch"),
    # torch._C imports numpy from C and clears a KeyboardInterrupt raised inside that import, so
    # the key press was lost (the whole search ran, rc 0) or numpy was left half-imported
    "numpy": _on_import("numpy"),
    "extraction": """
import autopar.problem as problem
extract = problem.model_graph
def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return extract(*args, **kwargs)
problem.model_graph = interrupted
""",
}


@pytest.mark.parametrize("when", sorted(_HOOKS))
@pytest.mark.parametrize("command", ["plan", "estimate"])
def test_ctrl_c_during_start_up_exits_cleanly(when, command):
    # issue 12 item 8: Ctrl-C while `import autopar` loaded torch printed a traceback (rc -2);
    # before a search has started it is one line and exit code 130
    script = ("import os, runpy, signal, sys\n" + _HOOKS[when]
              + f"sys.argv = ['autopar', {command!r}, '--model', 'tiny-llama', '--cluster', "
                "'1x8xA100-80GB', '--global-batch', '16', '--seq-len', '32']\n"
                "runpy.run_module('autopar.cli', run_name='__main__', alter_sys=True)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=300, preexec_fn=_as_from_a_shell)
    assert (p.returncode, p.stderr, p.stdout) == (130, "autopar: interrupted\n", "")


def test_unwritable_outputs_are_our_error(tmp_path):
    plan = autopar.optimize("tiny-llama", "1x8xA100-80GB",
                            autopar.TrainingConfig(global_batch_size=16, seq_len=32))
    with pytest.raises(autopar.OutputError, match="cannot write"):
        plan.to_json(tmp_path / "missing-folder" / "plan.json")
    pytest.importorskip("matplotlib")
    from autopar.cli import main

    assert main(["plan", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB", "--global-batch",
                 "16", "--seq-len", "32", "--plot", str(tmp_path / "nope" / "x.png")]) == 2


def test_pinned_degrees_whose_product_does_not_divide_the_gpus_are_named():
    # tp=4 pp=4 on 8 GPUs was reported as "pp=4 breaks: pp must divide the GPUs", which it does
    with pytest.raises(autopar.InfeasibleError) as info:
        autopar.optimize("llama2-7b", "1x8xA100-80GB", TRAIN, fixed={"tp": 4, "pp": 4})
    msg = str(info.value)
    assert "tp=4 x pp=4 = 16 GPUs per data-parallel replica do not divide the 8 GPUs" in msg
    assert "pp in [1, 2]" in msg
    # with dp pinned too the product is the whole mesh, not one replica's GPUs
    with pytest.raises(autopar.InfeasibleError) as info:
        autopar.optimize("llama2-7b", "1x8xA100-80GB", TRAIN, fixed={"tp": 2, "pp": 2, "dp": 4})
    assert "tp=2 x pp=2 x dp=4 = 16 GPUs do not divide the 8 GPUs" in str(info.value)
