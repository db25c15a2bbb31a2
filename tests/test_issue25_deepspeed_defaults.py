"""DeepSpeed's documented defaults that decide step time (issue 25, "mechanisms, not factors"):
the table :data:`autopar.frameworks.stacks.deepspeed.DEFAULTS` (values read from DeepSpeed
v0.14.2 zero/config.py and runtime/constants.py), ZeRO-3's
``stage3_param_persistence_threshold`` (small tensors never gathered) and DeepSpeed 0.3.0's
ZeRO-1 (stage1.py: reduce-scatter, whole-gradient overflow check and norm read back per
tensor), which records naming DeepSpeed 0.3 or before are priced with."""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.frameworks import PROFILES, get_profile
from autopar.frameworks.profiles import COST_FIELDS
from autopar.frameworks.stacks.deepspeed import DEFAULTS, ZERO_030, with_deepspeed_030
from autopar.frameworks.vocabulary import (DEEPSPEED_030_ZERO1_GRAD_COPY_PASSES,
                                           DEEPSPEED_030_ZERO1_STEP_BYTES,
                                           DEEPSPEED_030_ZERO1_STEP_HOST_OPS_PER_TENSOR,
                                           DEEPSPEED_ZERO3_PERSISTENCE_THRESHOLD,
                                           DEEPSPEED_ZERO3_REDUCE_BUCKET_ELEMENTS)

NEW = ("zero1_step_bytes", "zero1_step_host_ops_per_tensor", "zero3_persistent_elements",
       "zero3_reduce_bucket_elements")


def _cm(profile, dp=8, model="llama2-7b"):
    train = autopar.TrainingConfig(global_batch_size=8 * dp, seq_len=4096, micro_batch_size=1,
                                   framework="deepspeed")
    graph, _ = model_graph(model, train)
    return CostModel(graph, autopar.Cluster.from_spec(f"1x{dp}xA100-80GB"), train,
                     framework=profile)


def _estimate(profile, zero_stage, dp=8):
    cm = _cm(profile, dp)
    return cm, cm.estimate(autopar.ParallelConfig(dp=dp, zero_stage=zero_stage,
                                                  micro_batch_size=1))


def test_documented_defaults_as_read_from_deepspeed_0_14_2():
    assert DEFAULTS["overlap_comm"][0] == (False, False, False, True)   # stage 0..3
    assert DEFAULTS["reduce_bucket_size"][0] == 500_000_000
    assert DEFAULTS["allgather_bucket_size"][0] == 500_000_000
    assert DEFAULTS["contiguous_gradients"][0] is True
    assert DEFAULTS["reduce_scatter"][0] is True
    assert DEFAULTS["use_multi_rank_bucket_allreduce"][0] is True
    assert DEFAULTS["prescale_gradients"][0] is False
    assert DEFAULTS["gradient_predivide_factor"][0] == 1.0
    assert DEFAULTS["stage3_prefetch_bucket_size"][0] == 50_000_000
    assert DEFAULTS["stage3_max_live_parameters"][0] == 1_000_000_000
    assert DEFAULTS["stage3_max_reuse_distance"][0] == 1_000_000_000
    assert DEFAULTS["stage3_param_persistence_threshold"][0] == 100_000
    assert DEFAULTS["sub_group_size"][0] == 1_000_000_000
    assert DEFAULTS["gradient_clipping"][0] == 0.0
    assert DEFAULTS["wall_clock_breakdown"][0] is False
    for name, (_, source, priced) in DEFAULTS.items():
        assert source and priced, name


def test_the_profile_prices_the_defaults_it_names():
    ds = get_profile("deepspeed")
    assert ds.overlap_dp_grad_reduce is False          # overlap_comm off for ZeRO-0..2
    assert ds.zero1_grad_all_reduce and ds.zero2_grad_all_reduce   # multi-rank bucket allreduce
    assert ds.zero3_gather == "per_parameter"
    assert ds.zero3_persistent_elements == DEEPSPEED_ZERO3_PERSISTENCE_THRESHOLD == 100_000
    assert "stage3_param_persistence_threshold" in ds.cost_sources["zero3_persistent_elements"]
    assert ds.zero3_reduce_bucket_elements == DEEPSPEED_ZERO3_REDUCE_BUCKET_ELEMENTS == 5 * 10**8
    assert DEFAULTS["reduce_bucket_size"][0] == ds.zero3_reduce_bucket_elements
    assert "reduce_scatter_coalesced" in ds.cost_sources["zero3_reduce_bucket_elements"]
    # the 0.3.0 ZeRO-1 fields are a version option, not the default
    assert ds.zero1_step_bytes == ds.zero1_step_host_ops_per_tensor == 0
    assert set(NEW) <= set(COST_FIELDS)
    for name, p in PROFILES.items():
        if name != "deepspeed":
            assert all(getattr(p, f) == 0 for f in NEW), name


def test_persistent_parameters_are_never_gathered():
    ds = get_profile("deepspeed")
    cm, e = _estimate(ds, 3)
    cm0, e0 = _estimate(dataclasses.replace(ds, zero3_persistent_elements=0), 3)
    msgs = list(cm.dp.zero3_messages(e.config, 0, 2))
    msgs0 = list(cm0.dp.zero3_messages(e0.config, 0, 2))
    # Llama-2-7B: the 2 RMSNorms of each of 32 blocks and the final norm (4096 elements each)
    assert sum(n for n, _ in msgs0) - sum(n for n, _ in msgs) == 32 * 2 + 1
    assert all(nbytes > 2 * 100_000 for _, nbytes in msgs)
    assert e.time_breakdown.dp_comm_exposed < e0.time_breakdown.dp_comm_exposed
    # ZeRO-1/2 do not gather per parameter: unchanged
    for stage in (1, 2):
        assert (_estimate(ds, stage)[1].step_time_s == pytest.approx(
            _estimate(dataclasses.replace(ds, zero3_persistent_elements=0), stage)[1]
            .step_time_s, rel=1e-12))


def test_zero3_gradients_are_reduced_in_buckets_persistent_ones_included():
    ds = get_profile("deepspeed")
    cm, e = _estimate(ds, 3)
    psi = cm.inputs.graph.num_parameters          # Llama-2-7B: 6 738 415 616
    msgs = list(cm.dp.zero3_messages(e.config, 0, 2, "reduce_scatter"))
    assert msgs == [(13, 2 * 5e8), (1, pytest.approx(2 * (psi - 13 * 5e8)))]
    per_tensor = dataclasses.replace(ds, zero3_reduce_bucket_elements=0)
    cm1, e1 = _estimate(per_tensor, 3)
    assert sum(n for n, _ in cm1.dp.zero3_messages(e1.config, 0, 2, "reduce_scatter")) == 32 * 9 + 3   # norms too
    # fewer calls, the same bytes: less latency
    assert e.time_breakdown.dp_comm_exposed < e1.time_breakdown.dp_comm_exposed


def test_deepspeed_030_zero1_counts_and_sources():
    assert DEEPSPEED_030_ZERO1_STEP_BYTES == 20            # overflow check 10 + norm 10
    assert DEEPSPEED_030_ZERO1_STEP_HOST_OPS_PER_TENSOR == 6    # 3 + 3, each read to the host
    assert DEEPSPEED_030_ZERO1_GRAD_COPY_PASSES == 8       # cat 2, mul_ 2, NCCL list copies 4
    p = with_deepspeed_030(get_profile("deepspeed"))
    assert p.name == "deepspeed"
    assert p.zero1_grad_all_reduce is False                # stage1.py reduce_scatter_gradients
    assert (p.zero1_step_bytes, p.zero1_step_host_ops_per_tensor,
            p.zero12_grad_copy_passes) == (20, 6, 8)
    assert "stage1.py" in p.cost_sources["zero1_step_bytes"]
    assert "reduce_scatter" in p.cost_sources["zero1_grad_all_reduce"]
    assert ZERO_030.zero0_step_bytes == get_profile("deepspeed").zero0_step_bytes


def test_deepspeed_030_zero1_step_reads_every_gradient_tensor_back():
    p = with_deepspeed_030(get_profile("deepspeed"))
    base = dataclasses.replace(p, zero1_step_bytes=0, zero1_step_host_ops_per_tensor=0)
    cm, e = _estimate(p, 1)
    _, b = _estimate(base, 1)
    psi = cm.inputs.graph.num_parameters
    extra = psi * 20 / cm.inputs.hbm_Bps + (32 * 9 + 3) * 6 * cm.inputs.params.host_op_s
    assert e.time_breakdown.optimizer - b.time_breakdown.optimizer == pytest.approx(
        extra, rel=1e-6)
    # reduce-scatter + all-gather moves less than all-reduce + all-gather
    _, e14 = _estimate(get_profile("deepspeed"), 1)
    assert e.time_breakdown.dp_comm_exposed < e14.time_breakdown.dp_comm_exposed
    # ZeRO-0 is the same engine path at 0.3.0 and later
    assert _estimate(p, 0)[1].step_time_s == pytest.approx(
        _estimate(get_profile("deepspeed"), 0)[1].step_time_s, rel=1e-12)


def test_records_naming_deepspeed_0_3_take_the_option():
    from benchmarks.records import parse
    from benchmarks.validation import load_corpus, record_profile
    seen = 0
    for raw in load_corpus():
        fw = (raw.get("training") or {}).get("framework") or ""
        if "deepspeed 0.3.0" in fw.lower() and raw["id"].startswith("vlt-dlperf-deepspeed"):
            p = record_profile(parse(raw))
            assert p.zero1_step_host_ops_per_tensor == 6 and not p.zero1_grad_all_reduce
            seen += 1
        elif "DeepSpeed 0.14.2" in fw:
            p = record_profile(parse(raw))
            assert p.zero1_step_host_ops_per_tensor == 0 and p.zero1_grad_all_reduce
    assert seen == 6


def test_the_new_fields_are_refused_when_not_whole_numbers():
    ds = get_profile("deepspeed")
    for f in NEW:
        with pytest.raises(autopar.AutoparError, match=f):
            dataclasses.replace(ds, **{f: -1})
