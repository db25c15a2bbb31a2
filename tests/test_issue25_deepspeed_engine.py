"""DeepSpeed's engine without ZeRO (issue 25): the reduction's copies on the compute stream
(engine.py ``allreduce_bucket`` / ``allreduce_and_copy``) and FP16_Optimizer's step
(fp16/fused_optimizer.py: the per-tensor host-synchronised overflow check of runtime/utils.py
``CheckOverflow.has_overflow_serial`` and the flatten of the fp32 casts), only in the DeepSpeed
profile and only under ZeRO-0."""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.frameworks import PROFILES, get_profile
from autopar.frameworks.profiles import COST_FIELDS
from autopar.frameworks.vocabulary import (DEEPSPEED_ZERO0_GRAD_COPY_PASSES,
                                           DEEPSPEED_ZERO0_STEP_BYTES,
                                           DEEPSPEED_ZERO0_STEP_HOST_OPS_PER_TENSOR)

FIELDS = ("zero0_grad_copy_passes", "zero0_step_bytes", "zero0_step_host_ops_per_tensor")
TRAIN = dict(global_batch_size=64, seq_len=4096, micro_batch_size=1)


def _cm(profile, dp=8, model="llama2-7b"):
    train = autopar.TrainingConfig(**{**TRAIN, "global_batch_size": 8 * dp},
                                   framework="deepspeed")
    graph, _ = model_graph(model, train)
    spec = f"1x{dp}xA100-80GB"
    return CostModel(graph, autopar.Cluster.from_spec(spec), train, framework=profile)


def _estimate(profile, zero_stage, dp=8):
    cm = _cm(profile, dp)
    return cm, cm.estimate(autopar.ParallelConfig(dp=dp, zero_stage=zero_stage,
                                                  micro_batch_size=1))


def _without(profile):
    return dataclasses.replace(profile, **{f: 0 for f in FIELDS})


def test_the_counts_their_sources_and_only_deepspeed_sets_them():
    assert DEEPSPEED_ZERO0_GRAD_COPY_PASSES == 6      # flatten, post-scale mul_, copy_ back
    assert DEEPSPEED_ZERO0_STEP_BYTES == 18           # x.float().sum() 10 + fp32 concat 8
    assert DEEPSPEED_ZERO0_STEP_HOST_OPS_PER_TENSOR == 3   # float(), sum(), read to the host
    assert set(FIELDS) <= set(COST_FIELDS)
    ds = get_profile("deepspeed")
    assert (ds.zero0_grad_copy_passes, ds.zero0_step_bytes,
            ds.zero0_step_host_ops_per_tensor) == (6, 18, 3)
    assert "engine.py" in ds.cost_sources["zero0_grad_copy_passes"]
    assert "fused_optimizer.py" in ds.cost_sources["zero0_step_bytes"]
    assert "has_overflow_serial" in ds.cost_sources["zero0_step_host_ops_per_tensor"]
    for name, p in PROFILES.items():
        if name != "deepspeed":
            assert all(getattr(p, f) == 0 for f in FIELDS), name


def test_gradient_tensors_are_the_parameter_owning_ops():
    cm, _ = _estimate(get_profile("deepspeed"), 0)
    layers = tuple(range(len(cm.inputs.graph.layers)))
    # Llama-2-7B: 32 blocks x (q, k, v, o, gate, up, down, two RMSNorms) + embedding, final
    # norm, untied LM head
    assert cm.dp.param_tensors(layers) == 32 * 9 + 3


def test_zero0_reduction_copies_are_six_passes_over_the_compute_dtype_gradients():
    ds = get_profile("deepspeed")
    cm, e = _estimate(ds, 0)
    psi = cm.inputs.graph.num_parameters
    expected = 6 * psi * 2 / cm.inputs.hbm_Bps
    assert e.time_breakdown.dp_copies == pytest.approx(expected, rel=1e-6)
    assert _estimate(_without(ds), 0)[1].time_breakdown.dp_copies == 0.0
    # one rank: nothing to reduce, no copies
    assert _estimate(ds, 0, dp=1)[1].time_breakdown.dp_copies == 0.0


def test_zero0_step_adds_the_overflow_check_bytes_and_its_host_reads():
    ds = get_profile("deepspeed")
    cm, e = _estimate(ds, 0)
    _, base = _estimate(_without(ds), 0)
    psi = cm.inputs.graph.num_parameters
    extra = psi * 18 / cm.inputs.hbm_Bps + 291 * 3 * cm.inputs.params.host_op_s
    assert e.time_breakdown.optimizer - base.time_breakdown.optimizer == pytest.approx(
        extra, rel=1e-6)
    # the check runs without data parallelism too (FP16_Optimizer wraps the optimizer)
    _, e1 = _estimate(ds, 0, dp=1)
    _, b1 = _estimate(_without(ds), 0, dp=1)
    assert e1.time_breakdown.optimizer - b1.time_breakdown.optimizer == pytest.approx(
        extra, rel=1e-6)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_are_unchanged(stage):
    ds = get_profile("deepspeed")
    assert (_estimate(ds, stage)[1].step_time_s
            == pytest.approx(_estimate(_without(ds), stage)[1].step_time_s, rel=1e-12))


def test_the_fields_are_refused_when_not_whole_numbers():
    ds = get_profile("deepspeed")
    for f in FIELDS:
        with pytest.raises(autopar.AutoparError, match=f):
            dataclasses.replace(ds, **{f: -1})
