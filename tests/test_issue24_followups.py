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


def test_a_published_stack_is_banded_with_the_framework_whose_code_path_it_runs():
    """--framework nemo is Megatron-Core: its estimate takes megatron's error band (it fell back
    to the cells pooled over frameworks, as an unknown name); InternEvo has no cells of its own."""
    import autopar
    from autopar.cost.regime import Regime
    from autopar.frameworks import BAND_FRAMEWORK, band_framework, get_profile
    from autopar.problem import model_graph
    from autopar.config import FRAMEWORKS
    assert set(BAND_FRAMEWORK) == set(FRAMEWORKS)
    assert set(BAND_FRAMEWORK.values()) <= {"torch", "torchtitan", "megatron", "deepspeed", "*"}
    cluster = autopar.Cluster.from_spec("2x8xH100")
    bands = {}
    for fw in ("megatron", "nemo", "megatron-2023", "internevo"):
        train = autopar.TrainingConfig(global_batch_size=64, seq_len=2048, framework=fw)
        est = autopar.estimate("llama2-7b", cluster, train,
                               {"tp": 2, "pp": 1, "dp": 8, "zero_stage": 1})
        bands[fw] = est.error_band
        graph, _ = model_graph("llama2-7b", train)
        regime = Regime.of(train, cluster, graph, est.config)
        assert regime.framework == band_framework(fw) and est.error_band.cell == regime.key()
        assert regime.key()[4:] == ("dense", "2-64 nodes", "3-30B")
    assert bands["nemo"] == bands["megatron"] == bands["megatron-2023"]
    assert bands["internevo"].cell[0] == "*"
    assert band_framework(get_profile("fsdp1")) == "torch" and band_framework("nope") == "*"


def test_a_megatron_flag_written_without_dashes_is_named_not_dropped():
    from autopar.io.importers import from_megatron_args
    got = from_megatron_args("tensor-model-parallel-size 2 --foo 3")
    assert got.parallel.get("tp") is None
    stray = [n for n in got.notes if "not a flag" in n]
    assert stray and "tensor-model-parallel-size 2" in stray[0]
    assert "did you mean --tensor-model-parallel-size?" in stray[0]
    # the value of an unknown flag is not a stray word
    assert not any("not a flag" in n for n in from_megatron_args("--foo 3 --tp-comm-x").notes)
