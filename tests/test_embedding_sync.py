"""The all-reduce that keeps a pipeline stage's copy of the embedding table in step with the
embedding's own (autopar/cost/embedding_sync.py; Megatron-Core finalize_model_grads.py
``_allreduce_word_embedding_grads``)."""

from __future__ import annotations

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel


@pytest.fixture(scope="module")
def tied():
    """GPT 1.7B (tied embeddings: the head uses the table) on two 8-GPU nodes."""
    train = autopar.TrainingConfig(global_batch_size=32, seq_len=512, framework="megatron")
    graph, _ = model_graph("gpt-1.7b", train)
    return CostModel(graph, autopar.Cluster.from_spec("2x8xH100-80GB"), train)


def test_no_pipeline_no_copy(tied):
    c = tied.resolve(autopar.ParallelConfig(tp=1, pp=1, dp=16))
    assert tied.embedding_sync.cost(c)[0] == 0.0


def test_a_tied_head_on_the_last_stage_all_reduces_the_table(tied):
    """pp 2 over the two nodes: the head's copy of the 51,200 x 2,304 table (vocabulary-
    parallel, / tp) is all-reduced once per step in Megatron's fp32 main-grad dtype, between
    the first and the last stage, and the step waits for it."""
    c = tied.resolve(autopar.ParallelConfig(tp=2, pp=2, dp=4, placement=("tp", "cp", "dp", "pp")))
    seconds, load = tied.embedding_sync.cost(c)
    table = tied.graph.layers[-1].shared_parameters
    assert table == 51200 * 2304
    group = tied.groups.stages(c, (0, 1))
    assert group.size == 2 and group.link == tied.groups.group("pp", c).link
    assert seconds == pytest.approx(group.time("all_reduce", table / 2 * 4))
    assert seconds > 0 and load.nbytes > 0
    assert tied.estimate(c).time_breakdown.dp_comm_exposed >= seconds


def test_a_v_shaped_schedule_keeps_the_table_on_one_rank(tied):
    """DualPipeV places the first and the last chunk on rank 0: no copy, nothing to sum."""
    c = tied.resolve(autopar.ParallelConfig(tp=1, pp=2, dp=8, virtual_stages=2,
                                            schedule="dualpipev"))
    assert tied.embedding_sync.cost(c)[0] == 0.0
