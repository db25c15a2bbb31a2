"""FP8 casts of torchao's float8nocompile prototype (issue 25, the float8nocompile README runs):
each Linear operand is cast by an amax pass then a cast kernel, forward and again in backward
(``eager_parts`` "fp8_amax_casts", autopar.cost.compute.FP8_AMAX_CAST_BYTES), where Transformer
Engine's fused cast-transpose moves 4 bytes per element of the input, the weight and the output
gradient."""

from __future__ import annotations

import pytest

from autopar.cost.compute import FP8_AMAX_CAST_BYTES, FP8_FUSED_CAST_BYTES, layer_time
from autopar.cost.params import CostParams
from autopar.errors import InvalidTrainingConfig
from autopar.frameworks import get_profile
from autopar.frameworks.stacks.torchtitan import with_float8nocompile
from benchmarks import validation
from benchmarks.records import parse


def test_amax_casts_cost_their_counted_bytes_per_linear(preset_cost_model):
    cm = preset_cost_model("llama3-8b", "1x8xH100-SXM5-80GB", global_batch_size=8,
                           seq_len=4096, precision="fp8")
    block = next(layer for layer in cm.graph.layers if layer.kind == "block")
    dev, params = cm.cluster.device, CostParams()
    kw = dict(micro_batch=1, tp=1, cp=1, sequence_parallel=False,
              peak_flops=dev.peak_flops["bf16"], fp8_peak_flops=dev.peak_flops["fp8"],
              hbm_bandwidth=dev.hbm_bandwidth_Bps, params=params, architecture="hopper",
              fusion="eager")
    fused = layer_time(block, **kw)
    amax = layer_time(block, eager_parts=("fp8_amax_casts",), **kw)
    bw = dev.hbm_bandwidth_Bps * params.hbm_efficiency
    linears = [op.gemm for op in block.ops if op.kind == "matmul" and op.gemm
               and op.tp_role in ("column", "row")]
    assert linears
    mk = sum(m * k for m, k, _ in linears)
    kn = sum(k * n for _, k, n in linears)
    mn = sum(m * n for m, _, n in linears)
    (x, w, g, wb), (fx, fw, fg, fwb) = FP8_AMAX_CAST_BYTES, FP8_FUSED_CAST_BYTES
    assert amax.fwd_s - fused.fwd_s == pytest.approx(((x - fx) * mk + (w - fw) * kn) / bw,
                                                     rel=1e-9)
    assert amax.bwd_s - fused.bwd_s == pytest.approx(((g - fg) * mn + (wb - fwb) * kn) / bw,
                                                     rel=1e-9)
    # a BF16 layer has no casts to cost
    kw_bf16 = {**kw, "fp8_peak_flops": None}
    assert layer_time(block, eager_parts=("fp8_amax_casts",), **kw_bf16) == layer_time(block,
                                                                                      **kw_bf16)


def test_with_float8nocompile_adds_the_part_with_its_source():
    base = get_profile("torchtitan")
    prof = with_float8nocompile(base, "record x")
    assert "fp8_amax_casts" in prof.eager_parts
    assert set(base.eager_parts) <= set(prof.eager_parts)
    assert "float8nocompile" in prof.cost_sources["eager_parts"]
    assert with_float8nocompile(prof, "again").eager_parts == prof.eager_parts
    with pytest.raises(InvalidTrainingConfig):
        base.with_costs({"eager_parts": "test"}, eager_parts=("no-such-part",))


@pytest.mark.parametrize("suffix, expected", [
    ("noac-float8nocompile", True), ("noac-fp8-compile", False), ("noac-bf16-eager", False)])
def test_only_the_eager_float8nocompile_records_run_its_casts(suffix, expected):
    raw = next(r for r in validation.load_corpus()
               if r["id"] == f"mem-float8nocompile-llama3-8b-8xh100-seq4096-{suffix}")
    prof = validation.record_profile(parse(raw))
    assert ("fp8_amax_casts" in prof.eager_parts) is expected
