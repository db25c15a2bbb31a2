"""Issue 25 item 3 (multi-node bias): per-block ZeRO-3 (FSDP) exposes the collectives at the
ends of each micro-batch, which have no compute beside them.

Source: PyTorch docs/source/notes/fsdp.rst (pytorch/pytorch@16d83c2): "The 1st all-gather will
not be able to overlap with anything"; with FSDP on every block and on the root, "one
communication group with the initial embedding and final linear"; all-gathers and
reduce-scatters "run serially" on one NCCL stream. Exposed per micro-batch:
AG(root) + max(0, AG(first block) - embedding fwd) + max(0, RS(first block) - embedding bwd)
+ RS(root) (:meth:`autopar.cost.dp.DataParallel.zero3_edges_s`).
"""

from __future__ import annotations

import pytest

import autopar


def _zero3_7b(make, cluster: str, global_batch_size: int, framework: str, **degrees):
    """(cost model, resolved plan) of llama2-7b at seq 2048 and micro-batch 1 on the cluster
    spec ``cluster`` under ``framework``: ZeRO-3 over ``degrees``, no recomputation (``make``:
    the ``preset_cost_model`` fixture)."""
    cm = make("llama2-7b", cluster, global_batch_size=global_batch_size, seq_len=2048,
              framework=framework, micro_batch_size=1)
    return cm, cm.resolve(autopar.ParallelConfig(zero_stage=3, micro_batch_size=1,
                                                 recompute="none", **degrees))


@pytest.fixture(scope="module")
def fsdp_7b(preset_cost_model):
    return _zero3_7b(preset_cost_model, "8x8xA100-80GB", 64, "torchtitan", dp=64)


def _edges_by_hand(cm, c):
    """The edge seconds from the FSDP notes' grouping, recomputed from the collectives."""
    g = cm.graph
    dp_g = cm.group("dp", c)
    wbytes, gb = cm.train.dtype_bytes, cm.reduce_bytes
    layers = range(len(g.layers))
    first = next(i for i in layers if g.layers[i].kind == "block")
    root = [i for i in layers if g.layers[i].kind != "block"]

    def p(i):
        return cm.ranks.layer_params_per_rank(i, c.tp, True, c.ep, c.etp)

    ag_root = sum(dp_g.time("all_gather", p(i) * wbytes) for i in root)
    rs_root = sum(dp_g.time("reduce_scatter", p(i) * gb) for i in root)
    ag_first = dp_g.time("all_gather", p(first) * wbytes)
    rs_first = dp_g.time("reduce_scatter", p(first) * gb)
    fwd0 = sum(cm.block_cost(i, "none", c).fwd_s for i in range(first))
    bwd0 = sum(cm.block_cost(i, "none", c).bwd_s for i in range(first))
    comm = ag_root + rs_root + ag_first + rs_first
    exposed = ag_root + rs_root + max(0.0, ag_first - fwd0) + max(0.0, rs_first - bwd0)
    return comm, exposed, ag_root, rs_root


def test_edges_are_the_root_group_and_the_first_block(fsdp_7b):
    cm, c = fsdp_7b
    comm, exposed = cm.dp.zero3_edges_s(c, 0, cm.train.dtype_bytes, cm.reduce_bytes)
    want_comm, want_exposed, ag_root, rs_root = _edges_by_hand(cm, c)
    assert comm == pytest.approx(want_comm, rel=1e-12)
    assert exposed == pytest.approx(want_exposed, rel=1e-12)
    # the root group (embedding + head of llama2-7b, 2 x 32000 x 4096 + the final norm) is
    # exposed whole; the first block's collectives hide only behind the embedding's compute
    assert ag_root + rs_root <= exposed <= comm
    # at the catalog's 8 x HDR per node, the 7B's edges cost milliseconds, not the step
    assert 0.005 < exposed < 0.05


def test_step_exposes_the_edges_per_micro_batch(fsdp_7b):
    cm, c = fsdp_7b
    e = cm.estimate(c)
    tb = e.time_breakdown
    _, exposed, _, _ = _edges_by_hand(cm, c)
    m = e.num_micro_batches
    # the rest of the collectives hide behind the compute (7B at s2048 on 64 A100): what is
    # exposed is the edges, once per micro-batch
    assert tb.dp_comm_exposed == pytest.approx(m * exposed, rel=1e-9)
    assert tb.overlap_slowdown > 0


def test_edges_follow_the_micro_batches(preset_cost_model):
    cm, c = _zero3_7b(preset_cost_model, "8x8xA100-80GB", 256, "torchtitan", dp=64)
    e = cm.estimate(c)
    assert e.num_micro_batches == 4
    _, exposed = cm.dp.zero3_edges_s(c, 0, cm.train.dtype_bytes, cm.reduce_bytes)
    assert e.time_breakdown.dp_comm_exposed == pytest.approx(4 * exposed, rel=1e-9)


def test_not_overlapped_gathers_keep_everything_exposed(preset_cost_model):
    # DeepSpeed ZeRO-3 gathers per parameter with syncs (zero3_gather "per_parameter"): no
    # overlap, so the edges change nothing: the whole pass stays exposed
    cm, c = _zero3_7b(preset_cost_model, "2x8xA100-80GB", 16, "deepspeed", dp=16)
    e = cm.estimate(c)
    dp = cm.dp
    t_ag = dp.zero3_collective_s(c, 0, cm.train.dtype_bytes, "all_gather")
    t_rs = dp.zero3_collective_s(c, 0, cm.reduce_bytes, "reduce_scatter")
    assert e.time_breakdown.dp_comm_exposed == pytest.approx(
        e.num_micro_batches * (2 * t_ag + t_rs), rel=1e-9)


def test_one_rank_has_no_edges(preset_cost_model):
    cm, c = _zero3_7b(preset_cost_model, "1x8xA100-80GB", 8, "torchtitan", dp=1, tp=8)
    assert cm.dp.zero3_edges_s(c, 0, cm.train.dtype_bytes, cm.reduce_bytes) == (0.0, 0.0)
