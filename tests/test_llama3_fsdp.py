"""Llama 3's FSDP as its paper states it (arXiv 2407.21783 sec. 3.3.2): fp32 gradients
accumulated over the step's micro-batches, one fp32 reduce-scatter per step
(FrameworkProfile.zero2_reduce_per_step, autopar.frameworks.stacks.inhouse.LLAMA3_FSDP)."""

from __future__ import annotations

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.frameworks import get_profile
from autopar.frameworks.stacks.inhouse import LLAMA3_FSDP, with_llama3_fsdp
from benchmarks import records, validation


def _estimate(profile, gbs, cfg):
    train = autopar.TrainingConfig(global_batch_size=gbs, seq_len=512, framework="inhouse-2024")
    graph = model_graph("tiny-llama", train)[0]
    cm = CostModel(graph, autopar.Cluster.from_spec("2x8xH100-SXM5-80GB"), train,
                   framework=profile)
    return cm.estimate(cfg)


def _profiles():
    # not overlapped, so every collective second is exposed and the count is visible
    step = with_llama3_fsdp(get_profile("inhouse-2024")).with_costs(
        {"overlap_dp_grad_reduce": "test"}, overlap_dp_grad_reduce=False)
    per_mb = step.with_costs({"zero2_reduce_per_step": "test"}, zero2_reduce_per_step=False)
    return step, per_mb


def test_one_reduce_scatter_per_step_whatever_the_micro_batches():
    step, per_mb = _profiles()
    cfg = autopar.ParallelConfig(tp=1, pp=2, dp=8, zero_stage=2, micro_batch_size=1)
    many = _estimate(step, 64, cfg).time_breakdown.dp_comm_exposed      # 8 micro-batches
    one = _estimate(step, 8, cfg).time_breakdown.dp_comm_exposed        # 1 micro-batch
    assert many == pytest.approx(one)
    again = _estimate(per_mb, 64, cfg).time_breakdown.dp_comm_exposed
    assert again > many
    assert _estimate(per_mb, 8, cfg).time_breakdown.dp_comm_exposed == pytest.approx(one)


def test_unsharded_fp32_gradients_held_across_the_step():
    step, per_mb = _profiles()
    cfg = autopar.ParallelConfig(tp=1, pp=2, dp=8, zero_stage=2, micro_batch_size=1)
    held = _estimate(step, 64, cfg).memory_breakdown.gradients
    sharded = _estimate(per_mb, 64, cfg).memory_breakdown.gradients
    assert LLAMA3_FSDP.grad_reduce_bytes == 4
    assert held == pytest.approx(8 * sharded * 4 / (per_mb.memory.grad_bytes or 4))


def test_only_the_llama3_records_run_it():
    raw = next(r for r in validation.load_corpus() if r["id"] == "llama3-405b-8192gpu-s8192")
    llama = validation.record_profile(records.parse(raw))
    assert llama.name.startswith("inhouse") and llama.zero2_reduce_per_step
    assert llama.grad_reduce_bytes == 4
    assert not get_profile("inhouse-2024").zero2_reduce_per_step
    # another in-house stack (no "meta internal" in its framework text) keeps the default
    other = {**raw, "training": {**raw["training"], "framework": "in-house stack (2024)"}}
    prof = validation.record_profile(records.parse(other))
    assert prof.name.startswith("inhouse") and not prof.zero2_reduce_per_step
