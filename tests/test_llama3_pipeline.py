"""Llama 3's pipeline as its paper describes it (arXiv 2407.21783 sec. 3.3.2): one layer taken
from the first and the last stages, one decoder layer per chunk
(autopar.frameworks.stacks.inhouse.llama3_pipeline_chunks), and the three 405B records that
state it."""

from __future__ import annotations

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.frameworks import get_profile
from autopar.frameworks.stacks.inhouse import (LLAMA3_LAYER_SPLIT, llama3_pipeline_chunks,
                                               with_llama3_fsdp)
from benchmarks import records, validation

_IDS = ("llama3-405b-8192gpu-s8192", "llama3-405b-16384gpu-s8192",
        "llama3-405b-16384gpu-s131072")


def test_405b_over_16_ranks_is_8_one_layer_chunks_first_and_last_empty():
    v, blocks = llama3_pipeline_chunks(126, 16)
    assert v == 8
    assert blocks == (0,) + (1,) * 126 + (0,)
    assert LLAMA3_LAYER_SPLIT.embedding and LLAMA3_LAYER_SPLIT.loss


@pytest.mark.parametrize("layers, pp", [(126, 5), (126, 1)])
def test_no_one_layer_chunks_is_refused_with_a_fix(layers, pp):
    with pytest.raises(autopar.errors.InvalidParallelConfig, match="Fix:"):
        llama3_pipeline_chunks(layers, pp)


def test_the_405b_records_run_it():
    raw = {r["id"]: r for r in validation.load_corpus() if r["id"] in _IDS}
    assert set(raw) == set(_IDS)
    v, blocks = llama3_pipeline_chunks(126, 16)
    for rid, r in raw.items():
        rec = records.parse(r)
        assert rec.fixed["virtual_stages"] == v
        assert rec.fixed["stage_blocks"] == blocks
        assert rec.open_fields == ("micro_batch_size",)
        # all-gather CP (sec. 3.3.2 'Context parallelism for long sequences')
        assert rec.fixed.get("cp_mode") == ("allgather" if rec.fixed["cp"] > 1 else None)


def test_one_layer_chunks_hold_fewer_activations_than_two_chunks():
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=512, framework="inhouse-2024")
    graph = model_graph("tiny-llama", train)[0]
    cm = CostModel(graph, autopar.Cluster.from_spec("4x8xH100-SXM5-80GB"), train,
                   framework=with_llama3_fsdp(get_profile("inhouse-2024")))
    v, blocks = llama3_pipeline_chunks(len(cm.blocks), 2)
    base = dict(tp=1, pp=2, dp=16, zero_stage=2, micro_batch_size=1,
                schedule="interleaved-1f1b")
    two = cm.estimate(autopar.ParallelConfig(**base, virtual_stages=2))
    llama = cm.estimate(autopar.ParallelConfig(**base, virtual_stages=v, stage_blocks=blocks))
    assert llama.memory_breakdown.activations < two.memory_breakdown.activations
    assert llama.time_breakdown.bubble < two.time_breakdown.bubble
