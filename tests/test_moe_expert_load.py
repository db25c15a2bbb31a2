"""Routing imbalance as an input (issue 26 item 3, "load imbalance: dropless, the busiest expert
sets the pace; capacity factor: dropped tokens"): ``TrainingConfig.moe_expert_load`` gives each
routed expert's load, the EP rank holding the busiest contiguous block of experts sets the pace,
and a capacity factor caps each expert before the ranks are compared."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.api import model_graph  # noqa: E402
from autopar.cli import main  # noqa: E402
from autopar.cost import capacity  # noqa: E402
from autopar.cost.model import CostModel  # noqa: E402
from autopar.errors import InvalidTrainingConfig  # noqa: E402
from autopar.frameworks import with_host_rate  # noqa: E402

# 8 experts top-2 of FFN 4096, hidden 2048 (large enough that the GPU, not the host, sets the
# pace): seq 1024 -> T x k / E = 256 rows per expert
_MOE = dict(name="load-moe", family="llama", num_layers=4, hidden_size=2048, num_heads=16,
            num_kv_heads=4, vocab_size=512, seq_len=1024, ffn_hidden_size=4096,
            num_experts=8, top_k=2, moe_ffn_hidden_size=4096)
_PLAN = dict(tp=1, pp=1, dp=4, zero_stage=1, recompute="none", micro_batch_size=1)
#: experts 0-1 take twice the others' tokens: shares 2/10 and 1/10 -> 1.6x and 0.8x the mean
_HOT = (2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)


def _train(**kw) -> autopar.TrainingConfig:
    return autopar.TrainingConfig(global_batch_size=8, seq_len=1024, framework="megatron", **kw)


@pytest.fixture(scope="module")
def graph():
    return model_graph(_MOE, _train())[0]


def _estimate(graph, ep: int, **kw):
    # this toy MoE is host-bound at Megatron-Core's per-kernel rate, which would hide the
    # expert loads' GPU-side costs: priced without it
    cm = CostModel(graph, autopar.Cluster.from_spec("1x4xH100"), _train(**kw),
                   framework=with_host_rate("megatron", 0.0, "test: GPU-side costs alone"))
    return cm.estimate(autopar.ParallelConfig(**_PLAN, ep=ep))


@pytest.mark.parametrize("load, ep, factor, scale", [
    (None, 4, None, capacity.random_routing_scale(16, 2, 4, 4)),   # balanced in expectation
    ((1, 1, 1, 1), 4, None, 1.0),                  # balanced, given
    ((3, 3, 1, 1), 1, None, 1.0),                  # one rank holds all: the mean
    ((3, 3, 1, 1), 2, None, 1.5),                  # rank 0 holds experts 0-1 at 1.5x
    ((3, 1, 3, 1), 2, None, 1.0),                  # each rank one hot, one cold expert
    ((3, 1, 3, 1), 4, None, 1.5),
    ((3, 3, 1, 1), 2, 1.25, 1.25),                 # capacity ceil(8 x 1.25) = 10 of load 8
    ((3, 3, 1, 1), 1, 1.0, 0.75),                  # hot experts dropped to 1: (1+1+.5+.5)/4
    ((3, 3, 1, 1), 2, 0.5, 0.5),                   # every expert capped at half
])
def test_busiest_rank_sets_the_rows(load, ep, factor, scale):
    # 16 tokens, top-2, 4 experts: 8 rows per expert when balanced
    train = _train(moe_capacity_factor=factor, moe_expert_load=load)
    assert capacity.routed_scale(train, 16, 2, 4, ep) == pytest.approx(scale)


def test_padding_ignores_the_loads():
    train = _train(moe_capacity_factor=1.25, moe_pad_to_capacity=True, moe_expert_load=(3, 3, 1, 1))
    assert capacity.routed_scale(train, 16, 2, 4, 2) == pytest.approx(1.25)


def test_uneven_ep_is_refused():
    with pytest.raises(ValueError, match="does not divide"):
        capacity.busiest_rank((1.0, 1.0, 1.0), 2)


@pytest.mark.parametrize("load", [(1.0,), (), (1.0, -1.0), (0, 0), (1.0, math.nan),
                                  (True, 1.0), "1,2", 3.0])
def test_bad_loads_are_refused(load):
    with pytest.raises(InvalidTrainingConfig, match="moe_expert_load"):
        _train(moe_expert_load=load)


def test_a_json_list_becomes_one_spelling():
    t = _train(moe_expert_load=[1, 2])
    assert t.moe_expert_load == (1.0, 2.0) and hash(t) == hash(_train(moe_expert_load=(1, 2)))


def test_loads_must_fit_the_model(graph):
    cluster = autopar.Cluster.from_spec("1x4xH100")
    with pytest.raises(InvalidTrainingConfig, match="lists 4 experts but"):
        CostModel(graph, cluster, _train(moe_expert_load=(1, 1, 1, 1)))
    with pytest.raises(InvalidTrainingConfig, match="at most once"):
        CostModel(graph, cluster, _train(moe_expert_load=(100,) + (1,) * 7))
    dense = model_graph("tiny-llama", autopar.TrainingConfig(global_batch_size=8, seq_len=32))[0]
    with pytest.raises(InvalidTrainingConfig, match="no routed experts"):
        CostModel(dense, cluster, autopar.TrainingConfig(global_batch_size=8, seq_len=32,
                                                         moe_expert_load=(1, 1)))


def test_equal_loads_are_the_exact_balanced_split(graph):
    """Given loads are the rows every call sends (no fluctuation added): equal ones are the
    exact balanced split, which runs less than routing balanced in expectation only, whose
    busiest EP rank runs its random excess (capacity.random_routing_scale)."""
    e0 = _estimate(graph, 4)
    e1 = _estimate(graph, 4, moe_expert_load=(5,) * 8)
    e_1 = _estimate(graph, 1)
    assert e1.step_time_s < e0.step_time_s
    assert e1.memory_per_gpu_bytes < e0.memory_per_gpu_bytes
    # one EP rank holds every expert: its rows are the whole call's, nothing to fluctuate
    assert e_1.step_time_s == _estimate(graph, 1, moe_expert_load=(5,) * 8).step_time_s


def test_the_busiest_rank_is_slower_and_heavier(graph):
    # ep 4: rank 0 holds experts 0-1 at 1.6x the mean; ep 1: every rank holds all, balanced
    e0, e1 = _estimate(graph, 4), _estimate(graph, 4, moe_expert_load=_HOT)
    assert e1.step_time_s > e0.step_time_s
    assert e1.memory_breakdown.activations > e0.memory_breakdown.activations
    assert e1.link_comm("nvlink").nbytes > e0.link_comm("nvlink").nbytes
    assert _estimate(graph, 1, moe_expert_load=_HOT).step_time_s == \
        _estimate(graph, 1).step_time_s


def test_a_capacity_buys_back_the_imbalance_in_order(graph):
    # the measured shape of a capacity series on natural routing: a lower factor drops more of
    # the hot experts' rows and runs faster, dropless is slowest
    times = [_estimate(graph, 4, moe_expert_load=_HOT, moe_capacity_factor=f).step_time_s
             for f in (1.0, 1.2, 1.4)]
    dropless = _estimate(graph, 4, moe_expert_load=_HOT).step_time_s
    assert times[0] < times[1] < times[2] < dropless
    # at 1.6 or more nothing is dropped: dropless
    assert _estimate(graph, 4, moe_expert_load=_HOT, moe_capacity_factor=2.0).step_time_s == \
        pytest.approx(dropless)


def test_header_and_plan_file_keep_the_loads(graph, tmp_path):
    train = _train(moe_expert_load=_HOT)
    assert capacity.capacity_text(train) == ", MoE expert loads (busiest 1.60x the mean)"
    plan = autopar.optimize(_MOE, "1x4xH100", train, fixed=dict(_PLAN, ep=4))
    path = tmp_path / "plan.json"
    plan.to_json(path)
    back = autopar.Plan.from_json(path)
    assert back.train.moe_expert_load == _HOT
    assert back.estimate.step_time_s == pytest.approx(plan.estimate.step_time_s)


def test_cli_reads_a_list_or_a_file(tmp_path, capsys):
    model = tmp_path / "moe.json"
    model.write_text(json.dumps(_MOE))
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps(list(_HOT)))
    common = ["estimate", "--model", str(model), "--cluster", "1x4xH100", "--global-batch", "8",
              "--seq-len", "1024", "--framework", "megatron", "--ep", "4", "--tp", "1",
              "--pp", "1"]
    outs = []
    for given in (",".join(f"{x:g}" for x in _HOT), str(loads)):
        assert main(common + ["--moe-expert-load", given]) == 0
        outs.append(" ".join(capsys.readouterr().out.split()))   # rich wraps long lines
    assert "MoE expert loads (busiest 1.60x the mean)" in outs[0] and outs[0] == outs[1]
    for given, says in (("1,two", "'two' is not a number"),
                        (str(tmp_path / "missing.json"), "no file"),
                        (str(model), "expected a JSON list of per-expert loads in")):
        with pytest.raises(SystemExit):
            main(common + ["--moe-expert-load", given])
        assert says in capsys.readouterr().err


def test_a_record_can_carry_its_loads():
    from benchmarks import records, validation
    raw = next(r for r in validation.load_corpus()
               if r["id"] == "moer-pai643-qwen3-30b-a3b-h800-16gpu-tp1-pp2-ep8")
    counts = [2.0] * 16 + [1.0] * 112
    loaded = {**raw, "training": {**raw["training"], "moe_expert_load": counts}}
    assert records.parse(raw).train.moe_expert_load is None
    assert records.parse(loaded).train.moe_expert_load == tuple(counts)
