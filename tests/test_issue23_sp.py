"""Issue 23, item 1: the default framework (``torch``, what ``plan.apply`` runs) never plans MoE
layers under sequence parallelism, which ``plan.apply`` refuses; the rule lives on the framework
profile (``moe_sequence_parallel``), read by the search, ``estimate`` and the runtime's check;
Megatron-LM's opposite rule (MoE under TP needs SP) is read from the same field; the CLI can turn
SP off (``--no-sp``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.cli import build_parser, main  # noqa: E402
from autopar.errors import InvalidParallelConfig, InvalidTrainingConfig  # noqa: E402
from autopar.frameworks import get_profile  # noqa: E402
from autopar.graph import hf  # noqa: E402
from autopar.runtime.apply import check_moe  # noqa: E402
from autopar.runtime.ep import find_experts  # noqa: E402
from autopar.runtime.errors import UnsupportedPlanError  # noqa: E402

TRAIN = autopar.TrainingConfig(global_batch_size=8, seq_len=64)
CLUSTER = "1x4xA100-80GB"


@pytest.fixture(scope="module")
def experts():
    experts = find_experts(hf.build("hf-tiny-mixtral"))   # on the meta device
    assert experts, "the tiny Mixtral has stacked-experts MoE layers"
    return experts


def test_torch_plans_moe_under_tp_without_sp_and_apply_accepts_it(experts):
    # before: tp=2 with sequence_parallel=True, which plan.apply refused
    plan = autopar.optimize("hf-tiny-mixtral", CLUSTER, TRAIN, fixed={"tp": 2}, top_k=3)
    assert plan.config.tp == 2 and plan.config.sequence_parallel is False
    for e in (plan.estimate, *plan.alternatives):
        assert not (e.config.tp > 1 and e.config.sequence_parallel), e.config
        check_moe(e.config, experts)   # the check plan.apply runs: passes
    with pytest.raises(UnsupportedPlanError, match="sequence_parallel=False"):
        check_moe(plan.config.replace(sequence_parallel=True), experts)


def test_the_rule_is_for_moe_only():
    # a dense model keeps SP on under TP (it saves memory at equal communication)
    plan = autopar.optimize("hf-tiny-llama", CLUSTER, TRAIN, fixed={"tp": 2}, top_k=1)
    assert plan.config.tp == 2 and plan.config.sequence_parallel is True
    check_moe(plan.config, [])


def test_one_rule_on_the_profile():
    torch, mega = get_profile("torch"), get_profile("megatron")
    assert torch.sequence_parallel_values() == (True, False)
    assert torch.sequence_parallel_values(moe=True) == (False,)
    assert mega.sequence_parallel_values(moe=True) == (True,)
    assert get_profile("torchtitan").sequence_parallel_values(moe=True) == (True,)
    assert get_profile("deepspeed").sequence_parallel_values(moe=True) == (False,)
    sp = autopar.ParallelConfig(tp=2, dp=2, sequence_parallel=True)
    assert torch.unsupported(sp) is None   # a dense model
    assert "MoE" in torch.unsupported(sp, moe=True)
    assert torch.unsupported(sp.replace(sequence_parallel=False), moe=True) is None
    assert "sequence_parallel=True" in mega.unsupported(sp.replace(sequence_parallel=False),
                                                        moe=True)
    assert torch.moe_sp_violation(1, False) is None   # no TP: nothing to shard
    with pytest.raises(InvalidTrainingConfig, match="moe_sequence_parallel=()"):
        dataclasses.replace(torch, moe_sequence_parallel=())


def test_estimate_warns_of_moe_under_sp_with_the_fix():
    e = autopar.estimate("hf-tiny-mixtral", CLUSTER, TRAIN,
                         autopar.ParallelConfig(tp=2, sequence_parallel=True))
    warned = [w for w in e.warnings if "MoE layers" in w]
    assert len(warned) == 1 and "fix: sequence_parallel=False (--no-sp)" in warned[0]
    off = autopar.estimate("hf-tiny-mixtral", CLUSTER, TRAIN, autopar.ParallelConfig(tp=2))
    assert not any("MoE layers" in w for w in off.warnings)


def test_a_pin_the_framework_cannot_run_on_moe_is_refused():
    with pytest.raises(InvalidParallelConfig, match="torch runs MoE layers"):
        autopar.optimize("hf-tiny-mixtral", CLUSTER, TRAIN,
                         fixed={"tp": 2, "sequence_parallel": True})
    # Megatron-Core's MoELayer raises in training under TP without SP; before, only MoE
    # parallel folding was refused, and a pinned SP off was planned
    mega = dataclasses.replace(TRAIN, framework="megatron")
    with pytest.raises(InvalidParallelConfig, match="megatron runs MoE layers"):
        autopar.optimize("hf-tiny-mixtral", CLUSTER, mega,
                         fixed={"tp": 2, "sequence_parallel": False})
    plan = autopar.optimize("hf-tiny-mixtral", CLUSTER, mega, fixed={"tp": 2}, top_k=1)
    assert plan.config.sequence_parallel is True


def _config(capsys, *argv) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)["config"]


def test_cli_sp_and_no_sp_pin_sequence_parallelism(capsys):
    tiny = ["--model", "hf-tiny-llama", "--cluster", CLUSTER, "--global-batch", "8",
            "--seq-len", "64", "--tp", "2", "--json"]
    assert _config(capsys, "plan", *tiny)["sequence_parallel"] is True   # searched: on
    assert _config(capsys, "plan", *tiny, "--no-sp")["sequence_parallel"] is False
    assert _config(capsys, "estimate", *tiny, "--sp")["sequence_parallel"] is True
    assert _config(capsys, "estimate", *tiny, "--no-sp")["sequence_parallel"] is False
    # --no-sp overrides imported Megatron-LM arguments
    mega = ["--megatron-args", "--tensor-model-parallel-size 2 --sequence-parallel"]
    assert _config(capsys, "estimate", *tiny, *mega)["sequence_parallel"] is True
    assert _config(capsys, "estimate", *tiny, *mega, "--no-sp")["sequence_parallel"] is False
    parser = build_parser()
    for cmd in ("plan", "estimate", "explain"):
        base = [cmd, "--model", "m", "--cluster", "c"]
        assert parser.parse_args(base).sequence_parallel is None   # left to the search
        assert parser.parse_args([*base, "--no-sp"]).sequence_parallel is False
        assert parser.parse_args([*base, "--sp"]).sequence_parallel is True
    assert parser.parse_args(["explain", "--model", "m", "--cluster", "c",
                              "--no-compare-sp"]).compare_sequence_parallel is False


def test_experts_kept_whole_under_tp_are_not_searched_and_a_pinned_tp_is_warned():
    # plan.apply keeps each rank's stacked experts whole under TP (runtime/tp.py shards nn.Linear
    # only), while the cost model splits them over tp: such plans were priced up to tp times too
    # cheap in expert FLOPs and memory. The search no longer proposes them under torch or
    # DeepSpeed (experts_tp_sharded=False); a pinned one says its estimate is optimistic.
    assert get_profile("torch").experts_tp_sharded is False
    assert get_profile("deepspeed").experts_tp_sharded is False
    assert get_profile("megatron").experts_tp_sharded and get_profile("torchtitan").experts_tp_sharded
    plan = autopar.optimize("hf-tiny-mixtral", CLUSTER, TRAIN, top_k=5)
    assert all(e.config.tp == 1 for e in (plan.estimate, *plan.alternatives, *plan.pareto))
    assert not any("keeps experts whole" in w for w in plan.estimate.warnings)
    pinned = autopar.optimize("hf-tiny-mixtral", CLUSTER, TRAIN, fixed={"tp": 2}, top_k=1)
    assert any("torch keeps experts whole on every TP rank" in w and "optimistic" in w
               for w in pinned.estimate.warnings), pinned.estimate.warnings
    mega = autopar.optimize("hf-tiny-mixtral", CLUSTER,
                            dataclasses.replace(TRAIN, framework="megatron"), fixed={"tp": 2},
                            top_k=1)
    assert not any("keeps experts whole" in w for w in mega.estimate.warnings)
    dense = autopar.optimize("hf-tiny-llama", CLUSTER, TRAIN, fixed={"tp": 2}, top_k=1)
    assert not any("keeps experts whole" in w for w in dense.estimate.warnings)
