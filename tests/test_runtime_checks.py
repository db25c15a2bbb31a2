"""Checks ``autopar.runtime.apply`` makes before any distributed work (no process group needed)."""

from __future__ import annotations

import pytest
import torch

import autopar
from autopar.runtime import apply
from autopar.runtime.errors import UnsupportedPlanError


def _plan(seq_len: int) -> autopar.Plan:
    train = autopar.TrainingConfig(global_batch_size=2, seq_len=seq_len, precision="fp32",
                                   optimizer="adam")
    return autopar.optimize("tiny-llama", autopar.Cluster.custom(1, 1, "A100-80GB"), train)


def test_a_model_built_for_shorter_sequences_is_refused_with_the_fix():
    # tiny-llama's preset has seq_len 32; the plan trains 64. This used to fail at the first
    # step inside torch: "RuntimeError: start (0) + length (64) exceeds dimension size (32)".
    model = autopar.models.build("tiny-llama", device="cpu", dtype=torch.float32)
    with pytest.raises(UnsupportedPlanError) as e:
        apply(_plan(64), model)
    text = str(e.value)
    assert "64 tokens" in text and "at most 32" in text
    assert "autopar.models.build(name, seq_len=64)" in text


def test_build_takes_the_sequence_length_the_plan_needs():
    model = autopar.models.build("tiny-llama", device="cpu", dtype=torch.float32, seq_len=64)
    assert model.config.seq_len == 64
    assert model(torch.zeros(1, 64, dtype=torch.long)).shape == (1, 64, 256)
    with pytest.raises(autopar.errors.InvalidModelConfig):
        autopar.models.build("tiny-llama", seq_len=0)


def test_zero3_under_a_split_backward_schedule_is_planned_for_plan_apply_only():
    """plan.apply trains ZeRO-3 under ZBV / interleaved zero bubble / DualPipeV like one
    process (tests/test_runtime.py; FrameworkProfile.zero3_split_backward of the torch profile):
    the torch search returns the pairing and check_plan accepts it; torchtitan (no resharding
    under PP by default) keeps it; stacks that borrow the torch profile's capabilities but run
    their own loop (fsdp1, llm-foundry...) still refuse a pin of it, unverified there."""
    from autopar.runtime.validate import check_plan
    fixed = dict(pp=2, dp=2, zero_stage=3)

    def train(framework):
        return autopar.TrainingConfig(global_batch_size=8, seq_len=32, framework=framework)
    for framework in ("torch", "torchtitan"):
        plan = autopar.optimize("tiny-llama", "1x4xA100-80GB", train(framework), fixed=fixed)
        assert (plan.config.schedule, plan.config.zero_stage) == ("zbv-zero-bubble", 3)
        check_plan(plan)   # runnable
    for schedule in ("interleaved-zero-bubble", "dualpipev"):
        pinned = autopar.optimize("tiny-llama", "1x4xA100-80GB", train("torch"),
                                  fixed={**fixed, "schedule": schedule})
        assert pinned.config.zero_stage == 3
        check_plan(pinned)
    assert autopar.frameworks.get_profile("torch").zero3_split_backward
    assert not autopar.frameworks.get_profile("fsdp1").zero3_split_backward
    with pytest.raises(autopar.InvalidParallelConfig,
                       match="is not known to train ZeRO-3 correctly.*not verified"):
        autopar.optimize("tiny-llama", "1x4xA100-80GB", train("fsdp1"),
                         fixed={**fixed, "schedule": "zbv-zero-bubble"})


def test_a_meta_device_model_is_refused_with_the_fix():
    # used to fail inside torch: "Cannot copy out of meta tensor; no data!"
    with torch.device("meta"):
        model = autopar.models.build("tiny-llama", dtype=torch.float32)
    with pytest.raises(UnsupportedPlanError, match=r"meta device \('embed.weight'.*Fix: build "
                       r"the full model in real memory"):
        apply(_plan(32), model)


@pytest.mark.parametrize("model", [None, "tiny-llama"])
def test_a_model_that_is_no_module_is_refused_with_the_fix(model):
    # the new-user pass of 2026-12-07: plan.apply(None) or plan.apply("tiny-llama") failed
    # inside autopar with "AttributeError: ... has no attribute 'named_parameters'"
    with pytest.raises(autopar.errors.InvalidModelConfig,
                       match=r"plan.apply needs the model itself, an nn.Module; got "
                             r"(NoneType|str). Fix: build it in real memory"):
        _plan(32).apply(model)


def test_apply_outside_a_process_group_is_refused_with_the_fix():
    # used to fail inside torch: "Default process group has not been initialized"
    assert not torch.distributed.is_initialized()
    model = autopar.models.build("tiny-llama", device="cpu", dtype=torch.float32)
    with pytest.raises(UnsupportedPlanError, match="none is initialised. Fix: launch the "
                       "script with torchrun.*init_process_group"):
        apply(_plan(32), model)


@pytest.mark.parametrize("batch, labels", [((2, 32), (2, 31)), ((64,), (64,))])
def test_step_refuses_labels_of_another_shape_or_a_flat_batch(batch, labels):
    # labels one token short used to fail inside F.cross_entropy ("Expected input batch_size
    # (64) to match target batch_size (62)"); the check comes before any use of the mesh
    from autopar.runtime.apply import ParallelRun
    model = autopar.models.build("tiny-llama", device="cpu", dtype=torch.float32)
    run = ParallelRun(_plan(32), mesh=None, modules=[model], schedule=None,
                      optimizer=torch.optim.Adam(model.parameters()), micro_batch_size=1)
    with pytest.raises(autopar.InvalidParallelConfig, match=r"labels of the same shape. Fix: "
                       r"pass tokens\[:, :-1\] and tokens\[:, 1:\]"):
        run.step(torch.zeros(batch, dtype=torch.long), torch.zeros(labels, dtype=torch.long))
