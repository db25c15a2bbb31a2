"""The cost fields of FrameworkProfile (issue 13) and how the cost model reads them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.errors import InvalidTrainingConfig
from autopar.frameworks import PROFILES, get_profile
from autopar.frameworks.profiles import COST_FIELDS, FUSION_LEVELS


def test_every_profile_sources_every_cost_field():
    for p in PROFILES.values():
        assert set(COST_FIELDS) <= set(p.cost_sources)
        assert all(p.cost_sources[k] for k in COST_FIELDS)
        assert p.fusion in FUSION_LEVELS


def test_with_costs_refuses_unsourced_or_non_cost_changes():
    tt = get_profile("torchtitan")
    with pytest.raises(InvalidTrainingConfig, match="source"):
        tt.with_costs({}, fusion="compile")
    with pytest.raises(InvalidTrainingConfig, match="schedules is a capability, not a cost field"):
        tt.with_costs({"schedules": "x"}, schedules=("1f1b",))
    with pytest.raises(InvalidTrainingConfig):
        tt.with_costs({"fusion": "a source"}, fusion="jit")
    assert tt.with_costs({"fusion": "a source"}, fusion="compile").fusion == "compile"


def test_attention_kernel_per_architecture_falls_back_to_the_star_entry():
    assert get_profile("megatron").attention_kernel("hopper") == "cudnn"
    assert get_profile("torch").attention_kernel("blackwell") == "fa2"


def _cm(framework, profile=None, spec="2x8xA100-80GB", seq=512, model="tiny-llama"):
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=seq, framework=framework)
    graph = model_graph(model, train)[0]
    return CostModel(graph, autopar.Cluster.from_spec(spec), train, framework=profile)


def test_cost_model_reads_the_profile_of_the_training_framework():
    assert _cm("megatron").attention_kernel == "cudnn"
    assert _cm("torchtitan").reduce_bytes == 4          # FSDP reduce_dtype float32
    assert _cm("torch").profile is get_profile("torch")


@settings(max_examples=8, deadline=None)
@given(tp=st.sampled_from([1, 2]), b=st.sampled_from([1, 2]))
def test_overlapping_tp_comm_never_slows_a_step(tp, b):
    # tiny-llama's blocks are host-bound (autopar.cost.host: the host issues kernels slower
    # than the GPU runs them), where hiding TP behind GEMMs cannot shorten the step: the
    # overlap is compared with the host's time per kernel off (CUDA graphs)
    meg = get_profile("megatron").with_costs({"host_issue": "test"}, host_issue="cuda_graph")
    over = meg.with_costs({"overlap_tp_comm": "test"}, overlap_tp_comm=True)
    # (Megatron-LM overlaps TP only under sequence parallelism)
    cfg = autopar.ParallelConfig(tp=tp, pp=1, dp=16 // tp, zero_stage=1, micro_batch_size=b,
                                 sequence_parallel=tp > 1)
    a = _cm("megatron", meg).estimate(cfg).step_time_s
    o = _cm("megatron", over).estimate(cfg).step_time_s
    assert o <= a * (1 + 1e-12)
    if tp > 1:
        assert o < a


def test_zero3_kept_gathered_across_micro_batches_under_pp_is_not_slower():
    tt = get_profile("torchtitan")
    regather = tt.with_costs({"zero3_regather_per_micro_batch": "test"},
                             zero3_regather_per_micro_batch=True)
    cfg = autopar.ParallelConfig(tp=1, pp=2, dp=8, zero_stage=3, micro_batch_size=1)
    kept = _cm("torchtitan", tt).estimate(cfg)
    again = _cm("torchtitan", regather).estimate(cfg)
    assert kept.step_time_s <= again.step_time_s
    assert kept.time_breakdown.dp_comm_exposed <= again.time_breakdown.dp_comm_exposed


def test_fusion_levels_order_memory_bound_time():
    base = get_profile("torch")
    times = {}
    for fusion in FUSION_LEVELS:
        prof = base.with_costs({"fusion": "test"}, fusion=fusion)
        cfg = autopar.ParallelConfig(tp=1, pp=1, dp=16, zero_stage=0, micro_batch_size=1)
        times[fusion] = _cm("torch", prof).estimate(cfg).time_breakdown.compute
    # eager RMSNorm moves 9x the bytes of a fused one; compile fuses point-wise chains
    assert times["compile"] < times["fused"] < times["eager"]


def test_per_parameter_zero3_gathers_hide_less_than_per_block():
    # every tensor gathered: tiny-llama's tensors are all below DeepSpeed's default
    # stage3_param_persistence_threshold (1e5 elements), which would keep them whole
    ds = get_profile("deepspeed").with_costs({"zero3_persistent_elements": "test"},
                                             zero3_persistent_elements=0)
    block = ds.with_costs({"zero3_gather": "test"}, zero3_gather="per_block")
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=16, zero_stage=3, micro_batch_size=1)
    per_param = _cm("deepspeed", ds, spec="2x8xA100-80GB").estimate(cfg)
    per_block = _cm("deepspeed", block, spec="2x8xA100-80GB").estimate(cfg)
    assert per_param.step_time_s > per_block.step_time_s


def test_power_cap_lowers_the_clock_by_the_cube_root_of_the_power_ratio():
    import dataclasses

    from autopar.hardware import get_device

    h100 = get_device("H100-SXM5-80GB")
    assert h100.tdp_w == 700 and h100.clock_scale == 1.0
    capped = dataclasses.replace(h100, power_limit_w=500)
    assert capped.clock_scale == pytest.approx((500 / 700) ** (1 / 3))
    assert dataclasses.replace(h100, power_limit_w=900).clock_scale == 1.0
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=512)
    graph = model_graph("tiny-llama", train)[0]
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=8, zero_stage=0, micro_batch_size=2)
    # tiny-llama is host-bound (autopar.cost.host), where the GPU clock changes nothing: the
    # clock's effect is seen with the host's per-kernel time off (CUDA graphs)
    graphs = get_profile("torch").with_costs({"host_issue": "test"}, host_issue="cuda_graph")
    full = CostModel(graph, autopar.Cluster.custom(1, 8, h100), train,
                     framework=graphs).estimate(cfg)
    tmpl_links = dict(intra="nvlink4", inter=None)
    slow = CostModel(graph, autopar.Cluster.custom(1, 8, capped, **tmpl_links),
                     train, framework=graphs).estimate(cfg)
    assert slow.step_time_s > full.step_time_s


def test_zero1_per_rank_broadcasts_and_gradient_all_reduce_cost_more_at_scale():
    base = get_profile("torch")
    owner = base.with_costs({"zero1_param_sync": "t", "zero1_grad_all_reduce": "t"},
                            zero1_param_sync="broadcast", zero1_grad_all_reduce=True)
    within = owner.with_costs({"zero1_group_size": "t"}, zero1_group_size=8)
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=64, zero_stage=1, micro_batch_size=1)
    t = {name: _cm("torch", prof, spec="8x8xA100-80GB").estimate(cfg)
         .time_breakdown.dp_comm_exposed
         for name, prof in (("all_gather", base), ("owner", owner), ("within", within))}
    # 64 broadcasts of 1/64 each over 64 ranks pay 64 latencies; within a node 8 over NVLink
    assert t["owner"] > t["within"] >= t["all_gather"]


def test_eager_runs_the_glu_activation_as_its_own_kernel():
    # eager PyTorch runs F.silu(a) * b as aten::silu (read a, write act(a)) then aten::mul;
    # the graph counts the fused GLU, so eager adds 2 x bytes(a) per SwiGLU, fused/compile none
    from autopar.cost.compute import EAGER_GLU_ACT_PASSES, _memory_bound_ops
    cm = _cm("torch")
    block = next(layer for layer in cm.graph.layers if layer.kind == "block")
    act = [op for op in block.ops if op.kind == "view" and op.target.lower() == "silu"]
    assert len(act) == 1
    eager = {op.target: b for op, b, _ in _memory_bound_ops(block.ops, "eager")}
    assert eager["silu"] == EAGER_GLU_ACT_PASSES * act[0].bytes_read > 0
    for fusion in ("fused", "compile"):
        assert all(op.target != "silu" for op, _, _ in _memory_bound_ops(block.ops, fusion))


def test_mlp_linears_reducing_their_own_input_gradient_add_one_backward_all_reduce():
    # a gated MLP's gate and up read one input: a framework whose two column-parallel linears
    # each all-reduce their input gradient (InternEvo's FeedForward on flash-attn fused_dense)
    # reduces it twice; the attention's projections and the forward are unchanged
    from autopar.cost.comm import Collectives, mlp_linear_reductions, tp_layer_comm
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=512)
    graph = model_graph("tiny-llama", train)[0]
    block = next(layer for layer in graph.layers if layer.kind == "block")
    assert mlp_linear_reductions(block) == (block.tp_column_inputs[-1],)
    gpt = next(layer for layer in model_graph("tiny-gpt", train)[0].layers
               if layer.kind == "block")
    assert mlp_linear_reductions(gpt) == ()          # one column linear per input
    assert mlp_linear_reductions(graph.layers[0]) == ()   # no attention: nothing
    grp = Collectives(autopar.Cluster.from_spec("1x8xA100-80GB"), (0, 1))
    kw = dict(micro_batch=2, cp=1, sequence_parallel=False)
    f0, b0, fb0, bb0 = tp_layer_comm(block, grp, **kw)
    f1, b1, fb1, bb1 = tp_layer_comm(block, grp, mlp_per_linear=True, **kw)
    assert (f1, fb1) == (f0, fb0)
    mlp_in = 2 * block.tp_column_inputs[-1]
    assert b1 - b0 == pytest.approx(grp.time("all_reduce", mlp_in))
    assert bb1.nbytes - bb0.nbytes == pytest.approx(grp.wire_bytes("all_reduce", mlp_in))


def test_per_linear_mlp_reductions_cost_tp_time_only_under_tp():
    base = get_profile("torch")
    per = base.with_costs({"tp_mlp_reduce_per_linear": "test"}, tp_mlp_reduce_per_linear=True)
    assert hash(per) != hash(base) and per != base
    for tp in (1, 2):
        cfg = autopar.ParallelConfig(tp=tp, pp=1, dp=16 // tp, micro_batch_size=1)
        a = _cm("torch", base).estimate(cfg).time_breakdown.tp_comm
        b = _cm("torch", per).estimate(cfg).time_breakdown.tp_comm
        assert (b > a) if tp > 1 else (a == b == 0.0)
