"""DeepSpeedExamples' Megatron-LM v1 GPT-2 attention (issue 25, the DLPerf DeepSpeed GPT-2
runs): its unfused attention divides, multiplies and subtracts over the scores as three
element-wise ops (Megatron-LM/mpu/transformer.py at DeepSpeedExamples a79272c), 8 bytes per
score element more than the graph's one scale+mask pass, forward and backward."""

from types import SimpleNamespace

import pytest

from autopar.cost.compute import (SEPARATE_SCALE_MASK_BYTES_PER_SCORE, layer_time,
                                  unfused_scores)
from autopar.cost.params import CostParams
from autopar.frameworks import get_profile
from autopar.frameworks.stacks.deepspeed import MEGATRON_V1_MODEL, with_megatron_v1_model
from autopar.frameworks.vocabulary import EAGER_PARTS
from autopar.graph.kernels import UNFUSED_SCORE_BYTES
from autopar.hardware.devices import get_device

B, H, S, D = 2, 12, 1024, 64


def _attention_layer(fused):
    qkv = B * S * H * D * 2                       # one fp16 q (k, v, output alike)
    scores = B * H * S * S
    op = SimpleNamespace(kind="attention", target="scaled_dot_product_attention",
                         fwd_flops=4.0 * scores * D, bytes_read=3 * qkv + (
                             0 if fused else UNFUSED_SCORE_BYTES * scores),
                         bytes_written=qkv, region="tp", tp_role="", fused=fused, causal=True,
                         moe_role="", gemm=(), num_parameters=0, window=0)
    return SimpleNamespace(ops=(op,), kind="head"), scores


def _time(layer, parts):
    dev = get_device("V100-SXM2-16GB")
    return layer_time(layer, micro_batch=1, tp=1, cp=1, sequence_parallel=False,
                      peak_flops=dev.peak_flops["fp16"], hbm_bandwidth=dev.hbm_bandwidth_Bps,
                      params=CostParams(), fusion="eager", eager_parts=parts)


def test_scores_recovered_from_the_graph_bytes():
    layer, scores = _attention_layer(fused=False)
    assert unfused_scores(layer.ops[0]) == scores
    assert unfused_scores(_attention_layer(fused=True)[0].ops[0]) == 0.0


def test_extra_passes_priced_forward_and_backward():
    assert SEPARATE_SCALE_MASK_BYTES_PER_SCORE == 3 * 4 - 4     # div, mul, sub minus one pass
    layer, scores = _attention_layer(fused=False)
    base, extra = _time(layer, ()), _time(layer, ("separate_scale_mask",))
    dev, p = get_device("V100-SXM2-16GB"), CostParams()
    per = SEPARATE_SCALE_MASK_BYTES_PER_SCORE * scores / (dev.hbm_bandwidth_Bps * p.hbm_efficiency)
    assert extra.fwd_s - base.fwd_s == pytest.approx(per)
    assert extra.bwd_s - base.bwd_s == pytest.approx(per)
    assert extra.attention_fwd_s - base.attention_fwd_s == pytest.approx(per)


def test_fused_attention_unchanged():
    layer, _ = _attention_layer(fused=True)
    assert _time(layer, ("separate_scale_mask",)).fwd_s == _time(layer, ()).fwd_s


def test_choice_is_an_option_not_the_default():
    assert "separate_scale_mask" in EAGER_PARTS
    ds = get_profile("deepspeed")
    assert "separate_scale_mask" not in ds.eager_parts
    p = with_megatron_v1_model(ds)
    assert p.eager_parts == ("fp32_cross_entropy", "separate_scale_mask")
    assert p.fusion == "eager"
    assert "a79272c" in MEGATRON_V1_MODEL.sources["eager_parts"]


def test_dlperf_deepspeed_records_get_it():
    from benchmarks import validation as V, records as R
    recs = [R.parse(r) for r in V.load_corpus()
            if r["id"].startswith("vlt-dlperf-deepspeed-gpt2small-")]
    assert len(recs) == 6
    for rec in recs:
        assert "separate_scale_mask" in V.record_profile(rec).eager_parts
    other = [R.parse(r) for r in V.load_corpus()
             if r["id"].startswith("pip-gist-llama7b-a800x8-")]
    assert other and all("separate_scale_mask" not in V.record_profile(r).eager_parts
                         for r in other)
