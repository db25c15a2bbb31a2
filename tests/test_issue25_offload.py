"""CPU offload (issue 25): parameter offload (FSDP CPUOffload / DeepSpeed offload_param) and
activation offload (save_on_cpu) as TrainingConfig options, what leaves the GPU, the host copies
at the catalog's PCIe rate, which frameworks run them (autopar.cost.offload), the record fields
and the exporters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost import offload
from autopar.cost.model import CostModel
from autopar.errors import InvalidParallelConfig, InvalidTrainingConfig
from autopar.search.optimize import search

#: tiny-llama on one A100 node: 217,664 parameters, the largest layer 46,208 (per rank)
PARAMS, LARGEST, DP = 217_664, 46_208, 8
PCIE = 32e9   # A100 SXM host PCIe Gen4 x16 per direction (the catalog's datasheet rate)


def _cm(framework: str, **train_kw) -> CostModel:
    train = autopar.TrainingConfig(64, 256, micro_batch_size=1, framework=framework, **train_kw)
    graph, _ = model_graph("tiny-llama", train)
    return CostModel(graph, autopar.Cluster.from_spec("1x8xA100-80GB"), train)


ZERO3 = autopar.ParallelConfig(dp=DP, zero_stage=3, micro_batch_size=1)


def test_flags_are_validated_bools():
    for name in ("param_offload", "activation_offload"):
        with pytest.raises(InvalidTrainingConfig, match=name):
            autopar.TrainingConfig(8, 128, **{name: "yes"})
    t = autopar.TrainingConfig(8, 128)
    assert not t.param_offload and not t.activation_offload


def test_frameworks_without_a_source_are_refused_with_a_fix():
    with pytest.raises(InvalidTrainingConfig,
                       match=r"Fix: drop param_offload \(--param-offload\), or use framework"):
        _cm("megatron", param_offload=True)
    with pytest.raises(InvalidTrainingConfig, match="--framework fsdp1"):
        _cm("deepspeed", activation_offload=True)
    assert set(offload.SUPPORT) == {"fsdp1", "torchtitan", "torchtitan-0.3", "deepspeed"}


def test_parameter_offload_needs_zero3():
    cm = _cm("fsdp1", param_offload=True)
    with pytest.raises(InvalidParallelConfig, match="zero_stage=3"):
        cm.estimate(autopar.ParallelConfig(dp=DP, zero_stage=1, micro_batch_size=1))


def test_fsdp_parameter_offload_moves_weights_gradients_and_optimizer_to_the_host():
    a, b = _cm("fsdp1"), _cm("fsdp1", param_offload=True)
    ma, mb = a.estimate(ZERO3).memory_breakdown, b.estimate(ZERO3).memory_breakdown
    # ZeRO-3 shards over 8 ranks: 2 + 2 + 12 bytes per parameter, 217,664 / 8 = 27,208 each
    assert (ma.weights, ma.gradients, ma.optimizer_states) == (54_416, 54_416, 326_496)
    assert (mb.weights, mb.gradients, mb.optimizer_states) == (0.0, 0.0, 0.0)
    # FSDP's CPUOffload(offload_params=True) implies the optimizer step on the CPU
    assert b.inputs.train.optimizer_offload and not b.train.optimizer_offload
    # what stays: the two gathered units, plus the two shards copied in before the gathers
    c = a.resolve(ZERO3)
    ga, gb = a.stage_layout(c)[0].gather_bytes, b.stage_layout(c)[0].gather_bytes
    assert ga == 2 * 2 * LARGEST == 184_832
    assert gb - ga == 2 * LARGEST / DP * 2 == 23_104
    e = b.estimate(ZERO3)
    assert e.time_breakdown.optimizer == 0.0   # the CPU step is not priced, and said
    assert any("optimizer step runs on the CPU" in w for w in e.warnings)


def test_deepspeed_offload_param_moves_only_the_compute_dtype_partitions():
    a, b = _cm("deepspeed"), _cm("deepspeed", param_offload=True)
    ea, eb = a.estimate(ZERO3), b.estimate(ZERO3)
    ma, mb = ea.memory_breakdown, eb.memory_breakdown
    assert mb.weights == 0.0 and ma.weights == 54_416
    assert (mb.gradients, mb.optimizer_states) == (ma.gradients, ma.optimizer_states)
    assert not b.inputs.train.optimizer_offload
    # the GPU step writes the updated bf16 partition back to the host: 27,208 x 2 B at 32 GB/s
    extra = eb.time_breakdown.optimizer - ea.time_breakdown.optimizer
    assert extra == pytest.approx(PARAMS / DP * 2 / PCIE, rel=1e-9)


def test_host_copies_per_gather_and_reduction():
    t = autopar.TrainingConfig(8, 128, framework="fsdp1", param_offload=True)
    fsdp = offload.effective(t)
    # 1e9-element shard: 2 B over 32e9 B/s in = 62.5 ms; the 4 B gradient out = 125 ms
    assert offload.param_copy_s(fsdp, 1e9, 2, 4, PCIE) == pytest.approx((0.0625, 0.125))
    ds = autopar.TrainingConfig(8, 128, framework="deepspeed", param_offload=True)
    assert offload.param_copy_s(ds, 1e9, 2, 4, PCIE) == pytest.approx((0.0625, 0.0))
    plain = autopar.TrainingConfig(8, 128, framework="fsdp1")
    assert offload.param_copy_s(plain, 1e9, 2, 4, PCIE) == (0.0, 0.0)


def test_parameter_offload_copies_ride_beside_compute_and_show_where_it_is_shorter():
    # one A100 holding all of llama2-7b: FSDP still copies every unit in before its forward and
    # again before its backward (2 x P x 2 B) and its gradients out (P x 4 B reduce dtype), on a
    # side stream beside the micro-batch's compute; only the excess shows
    train = autopar.TrainingConfig(8, 2048, micro_batch_size=1, framework="fsdp1",
                                   param_offload=True)
    graph, _ = model_graph("llama2-7b", train)
    cm = CostModel(graph, autopar.Cluster.from_spec("1x1xA100-80GB"), train)
    c = cm.resolve(autopar.ParallelConfig(dp=1, zero_stage=3, micro_batch_size=1))
    layout = cm.stage_layout(c)
    pt = cm.pipeline.timing(c, layout)
    p = layout[0].params
    copies = (2 * p * 2 + p * cm.inputs.reduce_bytes) / PCIE
    window = pt.stage_fwd[0] + pt.stage_bwd[0]
    e = cm.estimate(c)
    assert copies > window   # the copies outlast the compute here
    assert e.time_breakdown.dp_comm_exposed == pytest.approx(8 * (copies - window), rel=1e-9)
    assert e.memory_breakdown.weights == e.memory_breakdown.gradients == 0.0
    assert e.time_breakdown.total == pytest.approx(e.step_time_s, rel=1e-12)


# "none": the block's saved tensors incl. eager RMSNorm/SwiGLU's extra ones under fsdp1
# (autopar.cost.memory.eager_saved_bytes)
@pytest.mark.parametrize("mode,saved", [("full", 32_768.0), ("none", 729_088.0)])
def test_activation_offload_keeps_no_block_activations_and_copies_them_on_the_stream(mode, saved):
    a, b = _cm("fsdp1"), _cm("fsdp1", activation_offload=True)
    c = a.resolve(ZERO3.replace(recompute=mode))
    x, y = a.block_cost(a.blocks[0], mode, c), b.block_cost(b.blocks[0], mode, c)
    assert x.act_bytes == saved and y.act_bytes == 0.0
    assert y.transient_bytes - x.transient_bytes == saved   # back for the block's backward
    assert y.fwd_s - x.fwd_s == pytest.approx(saved / PCIE, rel=1e-9)
    assert y.bwd_s - x.bwd_s == pytest.approx(saved / PCIE, rel=1e-9)
    assert y.compute_s - x.compute_s == pytest.approx(2 * saved / PCIE, rel=1e-9)
    assert a.estimate(c).memory_breakdown.activations > b.estimate(c).memory_breakdown.activations
    e = b.estimate(c)   # the components still add up to the step
    assert e.time_breakdown.total == pytest.approx(e.step_time_s, rel=1e-12)


def test_records_state_offload_from_their_quotes():
    from benchmarks.records import parse
    data = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
    recs = {r["id"]: r for f in ("published_runs_fsdp.json", "published_runs_pipeline.json")
            for r in json.loads((data / f).read_text())}
    for rid in ("fsd-awsfsdp-gpt-1t-a100-40g-128gpu", "fsd-awsfsdp-gpt-1t-a100-40g-512gpu"):
        r = recs[rid]
        assert "offloaded into CPU memory" in r["source_quote"]
        assert "offloaded to CPU during forward pass" in r["source_quote"]
        t = parse(r).train
        assert t.param_offload and t.activation_offload and not t.optimizer_offload
    for rid in ("fsd-awsfsdp-gpt3-175b-a100-40g-128gpu",
                "pip-hfblog-granite7b-a100x4-deepspeed-zero3"):
        t = parse(recs[rid]).train
        assert not (t.param_offload or t.activation_offload or t.optimizer_offload)


def test_exporters_write_parameter_offload_or_say_why_not():
    from autopar.models import get_config
    c = dict(dp=8, zero_stage=3, micro_batch_size=1)
    train = autopar.TrainingConfig(16, 256, framework="deepspeed", param_offload=True)
    e = autopar.estimate("tiny-llama", "1x8xA100-80GB", train, c)
    plan = autopar.Plan(config=e.config, estimate=e, model="tiny-llama", cluster="1x8xA100-80GB",
                        train=train, model_config=get_config("tiny-llama").to_dict())
    ds = plan.to_deepspeed_config().value
    assert ds["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert "enable_cpu_offload = true" in plan.to_torchtitan_toml().value
    mg = plan.to_megatron_args()
    assert any(w.startswith("param_offload") for w in mg.warnings)


def test_search_pins_zero3_under_parameter_offload_and_never_turns_offload_on():
    train = autopar.TrainingConfig(64, 256, framework="fsdp1", param_offload=True)
    plan = autopar.optimize("tiny-llama", "1x8xA100-80GB", train)
    assert plan.config.zero_stage == 3 and plan.train.param_offload
    plain = autopar.optimize("tiny-llama", "1x8xA100-80GB",
                             autopar.TrainingConfig(64, 256, framework="fsdp1"))
    assert not (plain.train.param_offload or plain.train.activation_offload
                or plain.train.optimizer_offload)


def test_an_infeasible_problem_offers_the_offload_its_framework_runs():
    from autopar.errors import InfeasibleError
    # llama2-7b at seq 4096 on one 40 GB A100: model states alone (16 B/param) do not fit
    train = autopar.TrainingConfig(8, 4096, micro_batch_size=1, framework="fsdp1")
    with pytest.raises(InfeasibleError) as err:
        autopar.optimize("llama2-7b", "1x1xA100-40GB", train)
    assert "param_offload=True" in str(err.value)
    assert offload.runs("fsdp1", "activation_offload")
    assert not offload.runs("megatron", "param_offload")
    assert offload.runs("megatron", "optimizer_offload")


def test_a_pinned_zero_stage_other_than_3_is_refused_before_searching():
    cm = _cm("fsdp1", param_offload=True)
    with pytest.raises(InvalidParallelConfig, match=r"zero_stage=3 \(--zero 3\)"):
        search(cm, {"zero_stage": 1})


def test_the_header_says_what_is_offloaded():
    assert offload.offload_text(autopar.TrainingConfig(8, 128)) == ""
    t = autopar.TrainingConfig(8, 128, param_offload=True, activation_offload=True)
    assert offload.offload_text(t) == ", parameters and activations offloaded to the CPU"


def test_parameter_offload_stages_the_shard_of_the_hybrid_sharding_group(monkeypatch):
    """Under hybrid sharding (FSDP HYBRID_SHARD, here 4 ranks a group) each rank holds 1/4 of
    a unit, not 1/8: the two shards copied in before the gathers, and each gather's
    host-to-device copy, are a quarter of the unit (ModelStates.zero_groups, as the ZeRO
    states)."""
    from autopar.frameworks import get_profile
    from autopar.frameworks.options import with_options
    train = autopar.TrainingConfig(64, 256, micro_batch_size=1, framework="fsdp1",
                                   param_offload=True)
    graph, _ = model_graph("tiny-llama", train)
    cluster = autopar.Cluster.from_spec("1x8xA100-80GB")
    full = CostModel(graph, cluster, train)
    plain = CostModel(graph, cluster, autopar.TrainingConfig(64, 256, micro_batch_size=1,
                                                             framework="fsdp1"),
                      framework=with_options(get_profile("fsdp1"), ["hsdp"], 4))
    hsdp = CostModel(graph, cluster, train,
                     framework=with_options(get_profile("fsdp1"), ["hsdp"], 4))
    c = hsdp.resolve(ZERO3)
    assert hsdp.states.zero_groups(c) == (4, 4) and full.states.zero_groups(c) == (8, 8)
    g_full = full.stage_layout(full.resolve(ZERO3))[0].gather_bytes
    g_hsdp = hsdp.stage_layout(c)[0].gather_bytes
    g_plain = plain.stage_layout(plain.resolve(ZERO3))[0].gather_bytes
    assert g_full - g_plain == 2 * LARGEST / 8 * 2 == 23_104
    assert g_hsdp - g_plain == 2 * LARGEST / 4 * 2 == 46_208
    # the host-to-device copy of each gather moves the rank's 1/4 shard: 217,664 / 4 elements
    seen = []
    real = offload.param_copy_s

    def spy(train, shard_elements, *rest):
        seen.append(shard_elements)
        return real(train, shard_elements, *rest)

    monkeypatch.setattr(offload, "param_copy_s", spy)
    hsdp.estimate(ZERO3)
    full.estimate(ZERO3)
    assert seen == [PARAMS / 4, PARAMS / 8]
