"""Fused attention kernels an architecture cannot run (FlashAttention and SDPA's flash and cuDNN
backends need sm80): the cost model prices what torch dispatches to instead, SDPA's
memory-efficient kernel, and says so."""

from __future__ import annotations

import pytest

import autopar
from autopar.cost.context import runnable_kernel
from autopar.cost.model import CostModel
from autopar.api import model_graph


def _train(**kw):
    return autopar.TrainingConfig(global_batch_size=8, seq_len=1024, precision="fp16", **kw)


@pytest.fixture(scope="module")
def graph():
    return model_graph("gpt-1.7b", _train())[0]


def test_volta_runs_only_the_memory_efficient_kernel():
    for kernel in ("fa1", "fa2", "fa3", "cudnn"):
        assert runnable_kernel(kernel, "volta") == "efficient"
        assert runnable_kernel(kernel, "ampere") == kernel
    assert runnable_kernel("efficient", "volta") == "efficient"


@pytest.mark.parametrize("framework, te", [("torch", False), ("megatron", True)])
def test_the_profile_kernel_falls_back_with_a_note(graph, framework, te):
    plan = autopar.ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=1)
    v100 = CostModel(graph, autopar.Cluster.from_spec("1x8xV100-32GB"),
                     _train(framework=framework))
    assert v100.inputs.attention_kernel == "efficient"
    notes = [w for w in v100.estimate(plan).warnings if "does not run on volta" in w]
    assert len(notes) == 1 and ("Transformer Engine" in notes[0]) == te
    assert "efficient" in notes[0]
    a100 = CostModel(graph, autopar.Cluster.from_spec("1x8xA100-80GB"),
                     _train(framework=framework))
    assert a100.inputs.attention_kernel == ("cudnn" if te else "fa2")
    assert not [w for w in a100.estimate(plan).warnings if "does not run" in w]
    # the memory-efficient kernel is slower than FlashAttention-2 (0.30 against 0.60 of peak on
    # Ampere, the figure Volta borrows): the same plan on V100 is slower than if FA2 ran there
    fa2 = CostModel(graph, autopar.Cluster.from_spec("1x8xV100-32GB"),
                    _train(framework=framework), attention_kernel="fa2")
    assert v100.estimate(plan).step_time_s > fa2.estimate(plan).step_time_s
    assert [w for w in fa2.estimate(plan).warnings if "prices a kernel it cannot run" in w]


def test_unfused_attention_needs_no_note(graph):
    cm = CostModel(graph, autopar.Cluster.from_spec("1x8xV100-32GB"),
                   _train(flash_attention=False))
    est = cm.estimate(autopar.ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=1))
    assert not [w for w in est.warnings if "does not run" in w]
