"""Eager torch cross entropy on fp32-upcast logits (issue 25): priced by the ATen kernels' HBM
passes, checked against the H200 microbenchmark rows of benchmarks/data/gpu/h200_sweep.json."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from autopar.cost.compute import (EAGER_CE_BWD_BYTES_PER_LOGIT, EAGER_CE_FWD_BYTES_PER_LOGIT,
                                  layer_time, memory_bound_kernels)
from autopar.cost.params import CostParams
from autopar.frameworks import get_profile
from autopar.graph.types import Op
from autopar.hardware.devices import get_device

SWEEP = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "gpu" / "h200_sweep.json"


def _loss_layer(tokens, vocab):
    # the graph's loss op: reads the bf16 logits, writes their fp32 copy (graph/assemble.add_loss)
    op = Op(name="loss", kind="loss", target="cross_entropy", fwd_flops=0.0,
            bytes_read=2 * tokens * vocab, bytes_written=4 * tokens * vocab, num_parameters=0,
            region="tp")
    return SimpleNamespace(ops=(op,), kind="head")


def test_counted_bytes_per_logit():
    assert EAGER_CE_FWD_BYTES_PER_LOGIT == 4 + 16
    assert EAGER_CE_BWD_BYTES_PER_LOGIT == 4 + 16 + 4
    ((op, fwd, kernels, bwd, rep),) = memory_bound_kernels(_loss_layer(10, 100), "eager",
                                                           ("fp32_cross_entropy",))
    assert (fwd, bwd, kernels, rep) == (22 * 1000, 26 * 1000, 3, 0.0)
    # without the part the graph's own bytes, backward twice forward
    ((op, fwd, kernels, bwd, rep),) = memory_bound_kernels(_loss_layer(10, 100), "eager", ())
    assert (fwd, bwd) == (6 * 1000, 12 * 1000)


def _seconds(tokens, vocab, parts):
    dev = get_device("H200")
    t = layer_time(_loss_layer(tokens, vocab), micro_batch=1, tp=1, cp=1,
                   sequence_parallel=False, peak_flops=dev.peak_flops["bf16"],
                   hbm_bandwidth=dev.hbm_bandwidth_Bps, params=CostParams(), fusion="eager",
                   eager_parts=parts)
    return t.fwd_s + t.bwd_s


@pytest.mark.parametrize("tokens, vocab", [(8192, 128256), (16384, 32000)])
def test_eager_loss_against_the_h200_measurement(tokens, vocab):
    rows = json.loads(SWEEP.read_text())["memory_bound"]
    measured = next(r["s"] for r in rows
                    if r["op"] == f"cross_entropy fwd+bwd (fp32 upcast) {tokens}x{vocab}")
    priced = _seconds(tokens, vocab, ("fp32_cross_entropy",))
    assert priced == pytest.approx(measured, rel=0.08)           # 12.8 vs 13.6, 6.4 vs 6.6 ms
    assert _seconds(tokens, vocab, ()) < 0.4 * measured          # the graph's bytes alone


def test_which_stacks_run_the_eager_loss():
    for name in ("torch", "torchtitan", "deepspeed"):
        assert "fp32_cross_entropy" in get_profile(name).eager_parts, name
    for name in ("megatron", "fsdp1", "llm-foundry", "flash-attention-training", "tinyllama",
                 "internevo"):
        assert "fp32_cross_entropy" not in get_profile(name).eager_parts, name
