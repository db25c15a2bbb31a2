"""DeepSpeed ZeRO-1/2 gradient reduction as its engine runs it at its defaults (issue 25):
every bucket all-reduced (``use_multi_rank_bucket_allreduce``) and the bucket copies on the
compute stream (``overlap_comm`` off for ZeRO-1/2), only in the DeepSpeed profile."""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.frameworks import PROFILES, get_profile
from autopar.frameworks.choices import FSDP2, with_choice
from autopar.frameworks.profiles import COST_FIELDS
from autopar.frameworks.stacks.deepspeed import FUSED_ADAM, HF_TRAINER_TORCH_ADAMW, ZERO
from autopar.frameworks.vocabulary import DEEPSPEED_ZERO12_GRAD_COPY_PASSES

#: the gist's LLaMA-7B plan shape (8 GPUs, seq 4096, micro-batch 1, 8 micro-batches)
TRAIN = dict(global_batch_size=64, seq_len=4096, micro_batch_size=1)


def _estimate(profile, zero_stage, recompute="none", model="llama2-7b"):
    train = autopar.TrainingConfig(**TRAIN, framework="deepspeed")
    graph, _ = model_graph(model, train)
    cm = CostModel(graph, autopar.Cluster.from_spec("1x8xA100-80GB"), train, framework=profile)
    return cm.estimate(autopar.ParallelConfig(dp=8, zero_stage=zero_stage, recompute=recompute,
                                              micro_batch_size=1))


def test_new_fields_are_cost_fields_with_sources_and_only_deepspeed_sets_them():
    assert {"zero2_grad_all_reduce", "zero12_grad_copy_passes"} <= set(COST_FIELDS)
    assert DEEPSPEED_ZERO12_GRAD_COPY_PASSES == 6   # bucket copy, div_, flatten: 3 x (r + w)
    ds = get_profile("deepspeed")
    assert ds.zero2_grad_all_reduce and ds.zero1_grad_all_reduce
    assert ds.zero12_grad_copy_passes == 6
    for key in ("zero2_grad_all_reduce", "zero1_grad_all_reduce", "zero12_grad_copy_passes"):
        assert "stage_1_and_2.py" in ds.cost_sources[key]
    for name, p in PROFILES.items():
        if name != "deepspeed":
            assert not p.zero2_grad_all_reduce and p.zero12_grad_copy_passes == 0, name
    assert not FSDP2.zero2_grad_all_reduce and FSDP2.zero12_grad_copy_passes == 0


def test_zero2_all_reduce_doubles_the_exposed_gradient_reduction():
    ds = get_profile("deepspeed")
    rs = with_choice(ds, dataclasses.replace(ZERO, zero2_grad_all_reduce=False,
                                             zero12_grad_copy_passes=0))
    a = _estimate(ds, 2).time_breakdown
    b = _estimate(rs, 2).time_breakdown
    # reduction every micro-batch (8) plus one parameter all-gather; all-reduce ~ 2 x RS
    assert a.dp_comm_exposed > 1.6 * b.dp_comm_exposed
    assert b.dp_copies == 0.0 and a.dp_copies > 0.0


def test_zero2_bucket_copies_are_per_micro_batch_and_zero1_once_per_step():
    ds = get_profile("deepspeed")
    e2, e1 = _estimate(ds, 2), _estimate(ds, 1)
    assert e2.num_micro_batches == 8
    assert e2.time_breakdown.dp_copies == pytest.approx(8 * e1.time_breakdown.dp_copies,
                                                        rel=1e-9)
    # ZeRO-3 does not take the ZeRO-1/2 bucket path; ZeRO-0 takes the engine's own reduction
    # (zero0_grad_copy_passes: 6 passes once a step, as many as ZeRO-1's bucket copies)
    assert _estimate(ds, 3).time_breakdown.dp_copies == 0.0
    assert _estimate(ds, 0).time_breakdown.dp_copies == pytest.approx(
        e1.time_breakdown.dp_copies, rel=1e-9)


def test_other_frameworks_zero2_unchanged_by_the_deepspeed_fields():
    torch = get_profile("torch")
    base = _estimate(torch, 2).step_time_s
    stripped = with_choice(torch, dataclasses.replace(FSDP2, zero2_grad_all_reduce=False,
                                                      zero12_grad_copy_passes=0))
    assert _estimate(stripped, 2).step_time_s == base


def test_deepspeed_zero2_now_slower_than_reduce_scatter_costing_for_the_gist_shape():
    """The chenyaofo gist's ZeRO-2 row (DeepSpeed 0.14.2, LLaMA-7B, 8 x A800 (A100 here), no
    checkpointing, micro-batch 1 of 64): measured 12.008 s. The sourced mechanisms add the second half of the
    all-reduce and the copies: the prediction rises toward it and stays below it (the compute
    gap is not DeepSpeed's)."""
    ds = get_profile("deepspeed")
    old = with_choice(ds, dataclasses.replace(ZERO, zero2_grad_all_reduce=False,
                                              zero1_grad_all_reduce=False,
                                              zero12_grad_copy_passes=0))
    new_s, old_s = _estimate(ds, 2).step_time_s, _estimate(old, 2).step_time_s
    assert old_s < new_s < 12.008


def test_hf_trainer_torch_adamw_is_a_named_choice_not_the_default():
    ds = get_profile("deepspeed")
    assert ds.optimizer_step_bytes == FUSED_ADAM.optimizer_step_bytes == 52
    hf = with_choice(ds, HF_TRAINER_TORCH_ADAMW)
    assert hf.optimizer_step_bytes == 104
    assert "deepspeed_optim_sched" in hf.cost_sources["optimizer_step_bytes"]
    a, b = _estimate(ds, 2).time_breakdown, _estimate(hf, 2).time_breakdown
    assert b.optimizer == pytest.approx(a.optimizer * 104 / 52, rel=1e-9)
