"""Eager-framework costs (issue 13): the optimizer step as each framework runs it, on its ZeRO
shard, and the parts of a fused stack that still run as eager ops (InternEvo)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar
from autopar.api import model_graph
from autopar.cost.compute import (FUSED_NORM_BYTES_PER_ELEMENT, NORM_INPUT_CAST_BWD_BYTES,
                                  NORM_INPUT_CAST_FWD_BYTES, memory_bound_kernels)
from autopar.cost.model import CostModel
from autopar.errors import InvalidTrainingConfig
from autopar.frameworks import get_profile
from autopar.frameworks.profiles import (FUSED_OPTIMIZER_STEP_BYTES,
                                         MIXED_FUSED_OPTIMIZER_STEP_BYTES,
                                         TORCH_OPTIMIZER_STEP_BYTES)


def _cm(framework="torch", profile=None, spec="2x8xA100-80GB"):
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=512, framework=framework)
    graph = model_graph("tiny-llama", train)[0]
    return CostModel(graph, autopar.Cluster.from_spec(spec), train, framework=profile)


def test_optimizer_step_bytes_count_the_passes_of_each_implementation():
    # torch.optim.AdamW foreach: 8 passes (80 B) + clip_grad_norm_ (norm 4, scale 4 + 4)
    assert TORCH_OPTIMIZER_STEP_BYTES == 8 + 12 + 8 + 12 + 8 + 8 + 8 + 16 + 12 == 92
    # one fused kernel reads p, g, m, v and writes p, m, v; clipping as above
    assert FUSED_OPTIMIZER_STEP_BYTES == 16 + 12 + 12 == 40
    # plus the fp32 main-gradient cast (2 + 4) and the bf16 parameter copy (4 + 2)
    assert MIXED_FUSED_OPTIMIZER_STEP_BYTES == FUSED_OPTIMIZER_STEP_BYTES + 6 + 6
    assert get_profile("torch").optimizer_step_bytes == TORCH_OPTIMIZER_STEP_BYTES
    assert get_profile("torchtitan").optimizer_step_bytes == FUSED_OPTIMIZER_STEP_BYTES
    for fw in ("megatron", "deepspeed"):
        assert get_profile(fw).optimizer_step_bytes == MIXED_FUSED_OPTIMIZER_STEP_BYTES


def test_optimizer_time_is_its_bytes_on_the_zero_shard_at_hbm_bandwidth():
    cm = _cm()
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=16, zero_stage=1, micro_batch_size=1)
    e = cm.estimate(cfg)
    psi = max(st.params for st in cm.stage_layout(e.config))
    bw = cm.device.hbm_bandwidth_Bps * cm.params.hbm_efficiency
    assert e.time_breakdown.optimizer == pytest.approx(psi / 16 * 92 / bw, rel=1e-12)
    # a ZeRO group of 8 (InternEvo parallel.zero1=8, FSDP hybrid sharding in a node): each rank
    # steps 1/8 of the parameters, not 1/16
    grouped = get_profile("torch").with_costs({"zero1_group_size": "t"}, zero1_group_size=8)
    g = _cm(profile=grouped).estimate(cfg)
    assert g.time_breakdown.optimizer == pytest.approx(
        2 * e.time_breakdown.optimizer, rel=1e-12)
    # without ZeRO every rank steps all of its parameters
    z0 = cm.estimate(autopar.ParallelConfig(tp=1, pp=1, dp=16, zero_stage=0,
                                            micro_batch_size=1))
    assert z0.time_breakdown.optimizer == pytest.approx(psi * 92 / bw, rel=1e-12)


@settings(max_examples=6, deadline=None)
@given(nbytes=st.integers(20, 200))
def test_more_optimizer_bytes_never_speed_a_step(nbytes):
    base = get_profile("torch")
    more = base.with_costs({"optimizer_step_bytes": "t"}, optimizer_step_bytes=nbytes + 1)
    less = base.with_costs({"optimizer_step_bytes": "t"}, optimizer_step_bytes=nbytes)
    cfg = autopar.ParallelConfig(tp=2, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    assert _cm(profile=more).estimate(cfg).step_time_s > _cm(profile=less).estimate(
        cfg).step_time_s


def test_profile_refuses_unknown_eager_parts_and_empty_optimizer_bytes():
    t = get_profile("torch")
    with pytest.raises(InvalidTrainingConfig):
        t.with_costs({"eager_parts": "t"}, eager_parts=("rope",))
    with pytest.raises(InvalidTrainingConfig):
        t.with_costs({"optimizer_step_bytes": "t"}, optimizer_step_bytes=0)


def _internevo_like():
    return get_profile("torch").with_costs(
        {"fusion": "t", "eager_parts": "t"}, fusion="fused",
        eager_parts=("glu", "norm_input_cast"))


def test_norm_input_cast_costs_the_cast_fp32_norm_and_its_repeat():
    cm = _cm(profile=_internevo_like())
    block = next(layer for layer in cm.graph.layers if layer.kind == "block")
    norms = [op for op in block.ops if op.kind == "norm"]
    rows = {id(op): r for op, *r in memory_bound_kernels(block, "fused",
                                                         ("norm_input_cast",))}
    for op in norms:
        fwd, kernels, bwd, repeated = rows[id(op)]
        per = (op.bytes_read + op.bytes_written) / FUSED_NORM_BYTES_PER_ELEMENT
        assert (fwd, kernels) == (NORM_INPUT_CAST_FWD_BYTES * per, 2)
        assert repeated == NORM_INPUT_CAST_FWD_BYTES * per
        assert bwd == (NORM_INPUT_CAST_BWD_BYTES + NORM_INPUT_CAST_FWD_BYTES) * per
    # the GLU activation is its own kernel: read a, write act(a) (2 x bytes(a)); its backward
    # (silu_backward) reads the gradient and a, writes a's gradient (3 x bytes(a))
    act = [op for op in block.ops if op.kind == "view" and op.target.lower() == "silu"]
    glu = {id(op): r for op, *r in memory_bound_kernels(block, "fused", ("glu",))}
    assert glu[id(act[0])] == [2 * act[0].bytes_read, 1, 3 * act[0].bytes_read, 0.0]
    eager = {id(op): r for op, *r in memory_bound_kernels(block, "eager")}
    assert eager[id(act[0])] == glu[id(act[0])]
    # under fusion="eager" the GLU is already eager: not counted twice
    assert id(act[0]) in {id(op) for op, *_ in memory_bound_kernels(block, "eager", ("glu",))}
    assert sum(1 for op, *_ in memory_bound_kernels(block, "eager", ("glu",))
               if op is act[0]) == 1


def test_full_recompute_does_not_repeat_what_the_framework_checkpoints_itself():
    cm = _cm(profile=_internevo_like())
    plain = _cm(profile=get_profile("torch").with_costs({"fusion": "t"}, fusion="fused"))
    index = cm.blocks[0]
    lt = cm.layer_time(index, 1, 1, 1, False)
    base = plain.layer_time(index, 1, 1, 1, False)
    assert lt.checkpointed_s > 0 and base.checkpointed_s == 0
    assert lt.fwd_s > base.fwd_s and lt.bwd_s > base.bwd_s
    # a fully recomputed block repeats its forward once: backward + recompute = bwd + fwd less
    # the already repeated cast + norm
    assert lt.bwd_s + lt.recompute_s("full") == pytest.approx(
        lt.bwd_s + lt.fwd_s - lt.checkpointed_s, rel=1e-12)
    assert lt.recompute_s("full") < lt.fwd_s
    assert lt.recompute_s("none") == 0.0


def test_eager_rmsnorm_backward_is_its_autograd_bytes():
    from autopar.cost.compute import (EAGER_RMSNORM_BWD_BYTES_PER_ELEMENT,
                                      EAGER_RMSNORM_BYTES_PER_ELEMENT)
    # the derivation in the constant's docstring, term by term
    assert EAGER_RMSNORM_BWD_BYTES_PER_ELEMENT == (
        4 + 6 + 2 + 6 + 8 + 12 + 4 + 8 + 8 + 8 + 12 + 12 + 6) == 96
    cm = _cm()
    block = next(layer for layer in cm.graph.layers if layer.kind == "block")
    rows = [r for r in memory_bound_kernels(block, "eager") if r[0].kind == "norm"]
    assert rows
    for op, fwd, kernels, bwd, repeated in rows:
        per = (op.bytes_read + op.bytes_written) / FUSED_NORM_BYTES_PER_ELEMENT
        assert fwd == pytest.approx(EAGER_RMSNORM_BYTES_PER_ELEMENT * per)
        assert bwd == pytest.approx(EAGER_RMSNORM_BWD_BYTES_PER_ELEMENT * per)
        assert repeated == 0.0
    # under "fused" every op keeps the element-wise rule (backward twice the forward)
    for op, fwd, kernels, bwd, repeated in memory_bound_kernels(block, "fused"):
        assert bwd == 2.0 * fwd


def _assert_copies_add(more, less, extra: float) -> None:
    """``more`` costs ``extra`` seconds over ``less``, all of them in ``dp_copies``."""
    assert more.step_time_s - less.step_time_s == pytest.approx(extra, rel=1e-9)
    assert more.time_breakdown.dp_copies - less.time_breakdown.dp_copies == pytest.approx(
        extra, rel=1e-9)
    assert more.time_breakdown.compute == less.time_breakdown.compute


def test_fsdp1_flat_parameter_gradient_copy_is_charged_per_micro_batch():
    from autopar.frameworks.profiles import FSDP1_GRAD_COPY_PASSES
    assert get_profile("torch").zero_grad_copy_passes == 0      # FSDP2: a tensor per parameter
    fsdp1 = get_profile("torch").with_costs({"zero_grad_copy_passes": "t"},
                                            zero_grad_copy_passes=FSDP1_GRAD_COPY_PASSES)
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=512)
    graph = model_graph("tiny-llama", train)[0]
    cluster = autopar.Cluster.from_spec("2x8xA100-80GB")
    base, flat = (CostModel(graph, cluster, train, framework=f)
                  for f in (get_profile("torch"), fsdp1))
    bw = base.device.hbm_bandwidth_Bps * base.params.hbm_efficiency
    for zero in (2, 3):
        cfg = autopar.ParallelConfig(tp=1, pp=1, dp=16, zero_stage=zero, micro_batch_size=2)
        a, b = base.estimate(cfg), flat.estimate(cfg)
        psi = max(st.params for st in base.stage_layout(a.config))
        extra = a.num_micro_batches * FSDP1_GRAD_COPY_PASSES * psi * 2 / bw   # bf16 gradients
        _assert_copies_add(b, a, extra)
    # DDP / ZeRO-1 keep no flat-parameter views
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=16, zero_stage=1, micro_batch_size=2)
    assert flat.estimate(cfg).step_time_s == base.estimate(cfg).step_time_s


def test_fsdp2_copy_out_and_copy_in_are_charged_per_gather_and_reduce_scatter():
    """FSDP2's all-gather copy-out (read + write the gathered bf16 parameters) and reduce-scatter
    copy-in (read the bf16 gradients, write the reduce dtype) run on the compute stream."""
    torch_p = get_profile("torch")
    assert torch_p.fsdp2_copies and get_profile("torchtitan").fsdp2_copies
    assert not get_profile("deepspeed").fsdp2_copies
    off = torch_p.with_costs({"fsdp2_copies": "t"}, fsdp2_copies=False)
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=512)
    graph = model_graph("tiny-llama", train)[0]
    cluster = autopar.Cluster.from_spec("2x8xA100-80GB")
    on_m, off_m = (CostModel(graph, cluster, train, framework=f) for f in (torch_p, off))
    bw = on_m.device.hbm_bandwidth_Bps * on_m.params.hbm_efficiency
    gb = on_m.reduce_bytes
    for zero, gathers_per_mb in ((3, 2), (2, None)):
        cfg = autopar.ParallelConfig(tp=1, pp=1, dp=16, zero_stage=zero, micro_batch_size=2)
        a, b = on_m.estimate(cfg), off_m.estimate(cfg)
        m = a.num_micro_batches
        assert m == 2
        psi = max(st.params for st in on_m.stage_layout(a.config))
        # ZeRO-3 gathers forward and again backward every micro-batch; ZeRO-2 once a step
        gathers = m * gathers_per_mb if gathers_per_mb else 1
        extra = psi * (gathers * 2 * 2 + m * (2 + gb)) / bw
        _assert_copies_add(a, b, extra)
    # ZeRO-1 and single-rank runs run no FSDP collectives
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=16, zero_stage=1, micro_batch_size=2)
    assert on_m.estimate(cfg).step_time_s == off_m.estimate(cfg).step_time_s
    one = autopar.Cluster.from_spec("1x2xA100-80GB")
    cfg = autopar.ParallelConfig(tp=2, pp=1, dp=1, zero_stage=3, micro_batch_size=2)
    assert (CostModel(graph, one, train, framework=torch_p).estimate(cfg).step_time_s
            == CostModel(graph, one, train, framework=off).estimate(cfg).step_time_s)
