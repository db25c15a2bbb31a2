"""Follow-ups of issue 24: the cost model's cached refusals keep the rule they name."""

from __future__ import annotations

import pytest

import autopar
from autopar.config import ParallelConfig
from autopar.cost.model import CostModel
from autopar.errors import InvalidParallelConfig


def _cm() -> CostModel:
    from autopar.api import as_cluster, model_graph
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=32, precision="fp32")
    graph, _ = model_graph("tiny-llama", train)
    return CostModel(graph, as_cluster("1x8xA100-80GB"), train)


@pytest.mark.parametrize("bad, rule", [
    (ParallelConfig(tp=2, pp=2, cp=1, dp=4), "mesh_size"),       # 16 GPUs' worth on 8
    (ParallelConfig(tp=2, pp=2, cp=1, dp=2, micro_batch_size=3), "batch_split"),
])
def test_a_cached_refusal_is_raised_again_with_its_rule(bad, rule):
    cm = _cm()
    errors = []
    for _ in range(2):   # the second call answers from the cache
        with pytest.raises(InvalidParallelConfig) as info:
            cm.resolve(bad)
        errors.append(info.value)
    first, again = errors
    assert first.rule == again.rule == rule
    assert str(first) == str(again)
    assert again is not first   # a fresh copy each time: tracebacks do not pile up on the cached one
