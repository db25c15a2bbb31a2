"""Issue 25, memory: torch's cuBLAS workspaces come from its caching allocator
(aten/src/ATen/cuda/CublasHandlePool.cpp ``getNewWorkspace``), so the allocated and reserved
counters include them: 2 per GPU (forward on the Python thread, backward on the autograd
engine's device thread), 32 MiB each on Hopper and Blackwell, 8.125 MiB before."""

from __future__ import annotations

import pytest

import autopar
from autopar.cost import memory

MIB = 2 ** 20
TRAIN = autopar.TrainingConfig(global_batch_size=8, seq_len=2048, micro_batch_size=1)
PLAN = autopar.ParallelConfig(tp=1, pp=1, dp=1, cp=1, zero_stage=0, recompute="none",
                              micro_batch_size=1)


@pytest.mark.parametrize("arch, each", [("hopper", 32 * MIB), ("blackwell", 32 * MIB),
                                        ("ampere", 8 * MIB + 128 * 1024),
                                        ("volta", 8 * MIB + 128 * 1024)])
def test_two_default_workspaces_per_gpu(arch, each):
    assert memory.cublas_workspace_bytes(arch) == 2 * each


@pytest.mark.parametrize("cluster, arch", [("1x1xH100-SXM5-80GB", "hopper"),
                                           ("1x1xA100-SXM4-80GB", "ampere")])
def test_the_estimate_counts_them_as_allocated(monkeypatch, cluster, arch):
    """The allocated peak (every component but ``reserved``) and the transient component grow
    by exactly the workspaces, the whole device by them and the allocator's fragmentation share
    of them."""
    ws = memory.cublas_workspace_bytes(arch)
    with_ws = autopar.estimate("tiny-llama", cluster, TRAIN, PLAN).memory_breakdown
    monkeypatch.setattr(memory, "CUBLAS_WORKSPACES_PER_STEP", 0)
    without = autopar.estimate("tiny-llama", cluster, TRAIN, PLAN).memory_breakdown
    assert with_ws.transient - without.transient == pytest.approx(ws, rel=1e-9)
    assert with_ws.allocated - without.allocated == pytest.approx(ws, rel=1e-9)
    # the whole device: the allocator's fragmentation share of them too
    assert with_ws.total - without.total == pytest.approx(
        ws * (1 + autopar.CostParams().fragmentation), rel=1e-9)
