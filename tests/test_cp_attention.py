"""How a context-parallel rank runs attention, priced per framework (autopar/runtime/cp.py for
plan.apply): all-gather CP passes SDPA an explicit mask (memory-efficient kernel over every
pair), ring CP computes scores in plain tensor ops, Ulysses runs the fused causal kernel; a
contiguous (unbalanced) split makes the last rank's causal work (2 cp - 1) / cp of the mean."""

from __future__ import annotations

import pytest

import autopar
from autopar.config import ParallelConfig
from autopar.cost.compute import UNFUSED_SCORE_PASSES, layer_time
from autopar.cost.model import CostModel
from autopar.cost.params import CostParams
from autopar.frameworks import get_profile
from autopar.graph.kernels import ATTENTION_BACKWARD_RATIO

CLUSTER = "1x8xH100-SXM5-80GB"


def _cm(seq: int, framework: str = "torch") -> CostModel:
    from autopar.api import as_cluster, model_graph
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=seq, framework=framework)
    graph, _ = model_graph("llama3-8b", train)
    return CostModel(graph, as_cluster(CLUSTER), train)


def _block(cm: CostModel) -> int:
    return next(layer.index for layer in cm.graph.layers if layer.kind == "block")


def test_torch_profile_prices_what_plan_apply_runs():
    prof = get_profile("torch")
    assert dict(prof.cp_attention) == {"allgather": "masked", "ring": "unfused"}
    assert dict(get_profile("torchtitan").cp_attention) == {}   # flash kernels per chunk
    cm = _cm(32768)
    i = _block(cm)
    t = {m: cm.layer_time(i, 1, 1, 8, False, m).attention_fwd_s for m in ("ulysses", "allgather",
                                                                          "ring")}
    assert t["ulysses"] < t["allgather"] < t["ring"]
    titan = _cm(32768, "torchtitan")
    assert titan.layer_time(i, 1, 1, 8, False, "ring").attention_fwd_s == pytest.approx(
        titan.layer_time(i, 1, 1, 8, False, "ulysses").attention_fwd_s)


def test_masked_and_unfused_attention_by_hand():
    cm = _cm(32768)
    layer = cm.graph.layers[_block(cm)]
    op = next(o for o in layer.ops if o.kind == "attention")
    p = CostParams()
    peak, hbm = cm.compute_peak, cm.device.hbm_bandwidth_Bps
    d, keys = cm.blocks_cost.attention_dims(layer, 8)
    kw = dict(micro_batch=1, tp=1, cp=8, sequence_parallel=False, peak_flops=peak,
              hbm_bandwidth=hbm, params=p, architecture="hopper", attention_dims=(d, keys))
    flops = op.fwd_flops / 8
    masked = layer_time(layer, cp_attention="masked", **kw).attention_fwd_s
    eff = p.attention_ceiling("efficient", "hopper") * p.attention_shape_factor("efficient", d,
                                                                              keys)
    r, ratio = p.attention_backward_efficiency, ATTENTION_BACKWARD_RATIO
    assert masked == pytest.approx(flops / (peak * eff * (1 + ratio / r) / (1 + ratio)))
    unfused = layer_time(layer, cp_attention="unfused", **kw).attention_fwd_s
    scores = flops / (4 * d)
    assert unfused == pytest.approx(flops / (peak * p.matmul_ceiling("hopper"))
                                    + UNFUSED_SCORE_PASSES * 2 * scores
                                    / (hbm * p.hbm_efficiency))
    fused = layer_time(layer, **kw).attention_fwd_s
    assert fused < masked < unfused


def test_contiguous_split_costs_the_last_ranks_causal_work():
    even, odd = _cm(32768, "torchtitan"), _cm(32760, "torchtitan")
    i = _block(even)
    cp = 8
    a = even.layer_time(i, 1, 1, cp, False, "ring").attention_fwd_s
    b = odd.layer_time(i, 1, 1, cp, False, "ring").attention_fwd_s
    # same work within 8 tokens; the contiguous split's slowest rank does (2cp-1)/cp of the mean
    assert b / a == pytest.approx((2 * cp - 1) / cp, rel=2e-3)
    assert odd.layer_time(i, 1, 1, cp, False, "ulysses").attention_fwd_s == pytest.approx(
        even.layer_time(i, 1, 1, cp, False, "ulysses").attention_fwd_s, rel=2e-3)


def test_default_search_avoids_plain_op_ring_attention():
    # under the torch profile a long-sequence plan that needs CP takes the fused path (Ulysses)
    # unless ring is pinned; pinned, ring's estimate is the slower one
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=32768)
    fixed = {"cp": 8, "tp": 1}
    best = autopar.optimize("llama3-8b", CLUSTER, train, fixed=fixed, top_k=1)
    assert best.config.cp_mode == "ulysses"
    ring = autopar.optimize("llama3-8b", CLUSTER, train, fixed={**fixed, "cp_mode": "ring"},
                            top_k=1)
    assert ring.estimate.step_time_s > best.estimate.step_time_s


def test_estimate_says_when_cp_attention_is_not_fused():
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=32768)
    ring = autopar.estimate("llama3-8b", CLUSTER, train,
                            ParallelConfig(tp=1, cp=8, cp_mode="ring", zero_stage=3))
    assert any("plain tensor ops" in w for w in ring.warnings)
    uly = autopar.estimate("llama3-8b", CLUSTER, train,
                           ParallelConfig(tp=1, cp=8, cp_mode="ulysses", zero_stage=3))
    assert not any("context-parallel attention" in w for w in uly.warnings)
