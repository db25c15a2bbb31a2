"""An MoE layer's all-to-alls re-run in backward under op-level selective recomputation when the
framework's save list lacks them (FrameworkProfile.moe_sac_redispatch): plan.apply's policy
(autopar/runtime/recompute.py), torchtitan before its save list kept them
(torchtitan.SAC_SAVES_ALLTOALL_SINCE)."""

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.frameworks import get_profile
from autopar.frameworks.options import with_options
from autopar.frameworks.stacks.torchtitan import SAC_SAVES_ALLTOALL_SINCE
from benchmarks import validation
from benchmarks.records import parse

_MOE = dict(name="sac-moe", family="llama", num_layers=2, hidden_size=256, num_heads=4,
            num_kv_heads=2, vocab_size=512, seq_len=128, ffn_hidden_size=512, num_experts=16,
            top_k=2, moe_ffn_hidden_size=256)


def _ep_seconds(profile, recompute):
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=128)
    graph, _ = model_graph(_MOE, train)
    cm = CostModel(graph, autopar.Cluster.from_spec("2x8xH100"), train, framework=profile)
    cfg = autopar.ParallelConfig(dp=16, ep=16, zero_stage=3, micro_batch_size=1,
                                 recompute=recompute)
    return cm.estimate(cfg).time_breakdown.ep_comm


def test_plan_apply_dispatches_again_under_op_level_recompute():
    torch_p = get_profile("torch")
    assert torch_p.moe_sac_redispatch
    assert "_OP_SAC_SAVED" in torch_p.cost_sources["moe_sac_redispatch"]
    none = _ep_seconds(torch_p, "none")
    assert _ep_seconds(torch_p, "selective-op") == pytest.approx(1.5 * none, rel=1e-9)
    assert _ep_seconds(torch_p, "full") == pytest.approx(1.5 * none, rel=1e-9)


def test_torchtitan_keeps_the_all_to_all_unless_the_option_says_otherwise():
    stock = get_profile("torchtitan")
    assert not stock.moe_sac_redispatch
    none = _ep_seconds(stock, "none")
    assert _ep_seconds(stock, "selective-op") == pytest.approx(none, rel=1e-9)
    old = with_options(stock, ["sac-redispatch"], gpus_per_node=8)
    assert old.moe_sac_redispatch
    assert _ep_seconds(old, "selective-op") == pytest.approx(1.5 * none, rel=1e-9)


@pytest.mark.parametrize("rid, redispatch", [
    # DeepSeek-V3 16B logged 2025-08-20, before c4e229115 (2025-09-06) saved its all-to-all
    ("new4-titan1610-dsv3-16b-8xh100-fsdp8-ep8-lbs8-sacop-sdpa", True),
    # the same model's toml in 2025-10: saved
    ("mem-oom-titan-dsv3-16b-8xh100-80gb-default-toml", False),
    # Qwen3 in 2025-12: its own save list had no all_to_all_single until 2026-03-23
    ("moe2-titanfork-qwen3-30b-a3b-8xh200-exp4-ep8-lbs8-s8192-sac-compile", True)])
def test_records_re_run_the_all_to_all_their_torchtitan_re_ran(rid, redispatch):
    rec = parse(next(r for r in validation.load_corpus() if r["id"] == rid))
    assert validation.record_profile(rec).moe_sac_redispatch is redispatch
    assert SAC_SAVES_ALLTOALL_SINCE == {"deepseek": "2025-09-06", "llama4": "2025-09-06",
                                        "*": "2026-03-23"}
