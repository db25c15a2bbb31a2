"""torchtitan's optimizer default by date (issue 25): before PR #881 (2025-02-24) torchtitan
built the foreach AdamW (``--optimizer.fused`` store_true, default False); since, the fused one."""

import json

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.frameworks import get_profile
from autopar.frameworks.stacks.torchtitan import (FOREACH_ADAMW_2024, FUSED_ADAMW_SINCE,
                                                  with_foreach_adamw)
from autopar.frameworks.vocabulary import FUSED_OPTIMIZER_STEP_BYTES, TORCH_OPTIMIZER_STEP_BYTES
from benchmarks.records import parse
from benchmarks.validation import DATA_DIR, dated_before, record_profile, training


def test_foreach_choice_moves_the_torch_foreach_bytes():
    assert FOREACH_ADAMW_2024.optimizer_step_bytes == TORCH_OPTIMIZER_STEP_BYTES == 92
    assert get_profile("torchtitan").optimizer_step_bytes == FUSED_OPTIMIZER_STEP_BYTES == 40
    p = with_foreach_adamw(get_profile("torchtitan"))
    assert p.optimizer_step_bytes == 92
    assert "PR #881" in p.cost_sources["optimizer_step_bytes"]
    assert FUSED_ADAMW_SINCE == "2025-02-24"


@pytest.mark.parametrize("text, before", [
    ("torchtitan (PR #778 branch, ~2025-01) + torchao float8 (2025)", True),
    ("torchtitan (torch.compile, Float8 linears, FSDP2; 2024)", True),
    ("torchtitan (FSDP2; PyTorch nightly, 2024-11)", True),
    ("torchtitan 0.0.2 + torchao 0.10.0 (torch 2.7.0a0; 2025)", False),   # year alone: not wholly before
    ("torchtitan main (2025-10, FSDP2)", False),
    ("torchtitan main", False),
])
def test_dated_before(text, before):
    assert dated_before(text, FUSED_ADAMW_SINCE) is before


def _record(rid):
    raw = json.loads((DATA_DIR / "published_runs_memory.json").read_text())
    raw = raw if isinstance(raw, list) else raw["records"]
    return parse(next(r for r in raw if r["id"] == rid))


def test_early_2025_torchtitan_record_steps_with_foreach_adamw():
    rec = _record("mem-float8nocompile-llama3-8b-8xh100-seq4096-noac-bf16-eager")
    profile = record_profile(rec)
    assert profile.optimizer_step_bytes == 92
    train = training(rec)
    graph, _ = model_graph(rec.model, train)
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=8, zero_stage=3, recompute="none",
                                 micro_batch_size=1)
    fused = CostModel(graph, rec.cluster, train, framework=get_profile("torchtitan"))
    foreach = CostModel(graph, rec.cluster, train, framework=profile)
    a, b = fused.estimate(cfg).time_breakdown, foreach.estimate(cfg).time_breakdown
    # the step's HBM bytes per parameter scale the optimizer's seconds, nothing else moves
    assert b.optimizer == pytest.approx(a.optimizer * 92 / 40, rel=1e-9)
    assert b.compute == a.compute and b.dp_copies == a.dp_copies
