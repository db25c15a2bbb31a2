"""Megatron-LLaMA's OverlappedDistributedOptimizer (autopar.frameworks.stacks.megatron.
with_overlapped_distributed_optimizer): ZeRO-2 on the 2023 Megatron-LM profile, its fp32
gradient buckets reduce-scattered in every micro-batch's backward."""

from __future__ import annotations

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.frameworks import get_profile
from autopar.frameworks.stacks.megatron import (OVERLAPPED_DISTRIBUTED_OPTIMIZER,
                                                with_overlapped_distributed_optimizer)
from benchmarks import records, validation

CFG = autopar.ParallelConfig(tp=2, pp=1, dp=8, zero_stage=2, micro_batch_size=1,
                             sequence_parallel=True)


def _estimate(profile, gbs, cfg=CFG):
    train = autopar.TrainingConfig(global_batch_size=gbs, seq_len=512, framework="megatron-2023")
    graph = model_graph("tiny-llama", train)[0]
    cm = CostModel(graph, autopar.Cluster.from_spec("2x8xA100-SXM4-80GB"), train,
                   framework=profile)
    return cm.estimate(cfg)


def _dp_bytes(e) -> float:
    """Bytes on the inter-node link, which only the data-parallel groups cross here."""
    return sum(lc.nbytes for lc in e.comm_by_link if lc.link == "infiniband")


def test_stock_2023_profile_refuses_zero2_the_option_runs_it():
    assert "ZeRO-2" in get_profile("megatron-2023").unsupported(CFG)
    odo = with_overlapped_distributed_optimizer("megatron-2023")
    assert odo.name == "megatron-2023" and odo.unsupported(CFG) is None
    assert "Megatron-LLaMA" in odo.sources["zero_stages"]
    assert _estimate(odo, 64).step_time_s > 0


def test_reduce_scatter_every_micro_batch_in_fp32():
    odo = with_overlapped_distributed_optimizer("megatron-2023")
    one = _dp_bytes(_estimate(odo, 8))       # 1 micro-batch per rank
    eight = _dp_bytes(_estimate(odo, 64))    # 8 micro-batches per rank
    # the gather runs once per step, the reduce-scatter once per micro-batch; fp32 gradients
    # against bf16 parameters: 4 bytes reduced for every 2 gathered
    rs, ag = one * 4 / 6, one * 2 / 6
    assert eight == pytest.approx(8 * rs + ag, rel=1e-6)
    assert OVERLAPPED_DISTRIBUTED_OPTIMIZER.grad_reduce_bytes == 4
    # ZeRO-1 of the same release reduces once per step
    z1 = autopar.ParallelConfig(**{**CFG.__dict__, "zero_stage": 1})
    stock = get_profile("megatron-2023")
    assert _dp_bytes(_estimate(stock, 64, z1)) == pytest.approx(one, rel=1e-6)


def test_sharded_gradients_weigh_less_than_the_distributed_optimizers_buffer():
    odo = with_overlapped_distributed_optimizer("megatron-2023")
    z1 = autopar.ParallelConfig(**{**CFG.__dict__, "zero_stage": 1})
    assert (_estimate(odo, 64).memory_breakdown.gradients
            < _estimate(get_profile("megatron-2023"), 64, z1).memory_breakdown.gradients)


def test_megatron_llama_zero2_records_run_it_and_zero1_ones_do_not():
    corpus = {r["id"]: r for r in validation.load_corpus()}
    odo = validation.record_profile(records.parse(
        corpus["rep3-mllama22-llama13b-128xa800-tp2-gbs1024-overlapped"]))
    assert odo.zero2_grad_all_reduce is False and 2 in odo.zero_stages
    assert odo.overlap_dp_grad_reduce and odo.grad_reduce_bytes == 4
    plain = validation.record_profile(records.parse(
        corpus["rep3-mllama22-llama13b-128xa800-tp2-gbs1024-distopt"]))
    assert 2 not in plain.zero_stages
