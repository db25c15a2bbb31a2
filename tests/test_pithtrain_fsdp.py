"""PithTrain's FSDP2 under its DualPipeV loop (mlc-ai/pith-train 093a9e4): the layers outside
the blocks gathered again every micro-batch, the gradient reduce-scatters issued after the
pipeline's last operation (FrameworkProfile.zero3_pp_root_regather,
zero3_pp_reduce_after_flush; autopar.frameworks.stacks.pithtrain.PITHTRAIN_FSDP)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.frameworks import get_profile
from autopar.frameworks.stacks.pithtrain import PITHTRAIN_FSDP, with_pithtrain_fsdp
from benchmarks import records, validation

_CFG = autopar.ParallelConfig(tp=1, pp=2, dp=8, zero_stage=3, micro_batch_size=1)


def _model(profile, gbs=64):
    train = autopar.TrainingConfig(global_batch_size=gbs, seq_len=512, framework="fsdp1")
    graph = model_graph("tiny-llama", train)[0]
    return CostModel(graph, autopar.Cluster.from_spec("2x8xH100-SXM5-80GB"), train,
                     framework=profile)


def _pith(**flags):
    p = with_pithtrain_fsdp("fsdp1")
    return p.with_costs({k: "test" for k in flags}, **flags) if flags else p


def _root_gathers(cm):
    """(seconds, elements) of one gather of each pipeline rank's non-block layers."""
    c = cm.resolve(_CFG)
    return [cm.dp.zero3_root_gather(c, r, 2)[::2] for r in range(c.pp)]


def test_profile_fields_and_sources():
    p = with_pithtrain_fsdp("fsdp1")
    assert p.zero3_pp_root_regather and p.zero3_pp_reduce_after_flush
    assert not p.zero3_regather_per_micro_batch
    assert p.grad_reduce_bytes == 4 and p.fsdp2_copies and p.zero_grad_copy_passes == 0
    for f in ("zero3_pp_root_regather", "zero3_pp_reduce_after_flush"):
        assert "093a9e4" in p.cost_sources[f]
    # no stock profile runs either
    from autopar.frameworks.stacks import PROFILES
    assert not any(q.zero3_pp_root_regather or q.zero3_pp_reduce_after_flush
                   for q in PROFILES.values())
    assert PITHTRAIN_FSDP.name == "pithtrain-fsdp2-dualpipev"


def test_root_layers_gathered_once_more_per_micro_batch():
    # m micro-batches each gather the embedding and head once more: m x one gather, exposed
    for gbs in (64, 128):   # 8 and 16 micro-batches per rank (dp 8, micro-batch 1)
        on = _model(_pith(zero3_pp_reduce_after_flush=False), gbs)
        off = _model(_pith(zero3_pp_reduce_after_flush=False, zero3_pp_root_regather=False), gbs)
        m = gbs // 8
        d = (on.estimate(_CFG).time_breakdown.dp_comm_exposed
             - off.estimate(_CFG).time_breakdown.dp_comm_exposed)
        dc = (on.estimate(_CFG).time_breakdown.dp_copies
              - off.estimate(_CFG).time_breakdown.dp_copies)
        # the bottleneck rank's: one of the two ranks (embedding on one, head on the other)
        (t_root, elems), = [(t, n) for t, n in _root_gathers(on)
                            if d == pytest.approx(m * t, rel=1e-9)]
        assert t_root > 0 and elems > 0
        # with FSDP2's copy-out of each of those gathers on the compute stream
        assert dc == pytest.approx(m * elems * 2 * 2 / on.inputs.hbm_Bps, rel=1e-9)


def test_reduce_after_flush_exposes_the_whole_reduce_scatter():
    flush = _model(_pith(zero3_pp_root_regather=False))
    behind = _model(_pith(zero3_pp_root_regather=False, zero3_pp_reduce_after_flush=False))
    c = flush.resolve(_CFG)
    e_flush = flush.estimate(_CFG).time_breakdown
    e_behind = behind.estimate(_CFG).time_breakdown
    # behind the last backward the reduce-scatter hides (FSDP2 overlaps it); after the flush
    # all of it is exposed, the same count whatever the micro-batches
    assert e_flush.dp_comm_exposed > e_behind.dp_comm_exposed
    one = _model(_pith(zero3_pp_root_regather=False), 16).estimate(_CFG).time_breakdown
    assert one.dp_comm_exposed == pytest.approx(e_flush.dp_comm_exposed, rel=1e-9)
    assert c.zero_stage == 3


def test_hybrid_sharding_gathers_within_the_shard_group():
    full = _model(_pith())
    hsdp = _model(autopar.frameworks.shard_within(_pith(), 4))
    for (t_full, n_full), (t_hsdp, n_hsdp) in zip(_root_gathers(full), _root_gathers(hsdp)):
        assert n_full == n_hsdp > 0
        assert 0 < t_hsdp < t_full
    assert hsdp.groups.zero1_group(hsdp.resolve(_CFG)).size == 4


def test_only_the_pithtrain_records_run_it():
    for raw in validation.load_corpus():
        if raw["id"].startswith("moe-pithtrain-pr40"):
            prof = validation.record_profile(records.parse(raw))
            assert prof.zero3_pp_root_regather and prof.zero3_pp_reduce_after_flush
            hybrid = raw["plan"].get("hybrid_shard") is True
            assert prof.zero1_group_size == (8 if hybrid else None)
    assert not get_profile("fsdp1").zero3_pp_root_regather


def test_loop_keeps_bf16_parameters_and_fp32_gradients_unsharded():
    # PithTrain holds 2 + 4 bytes per parameter of a chunk through the loop (torch's: 2 + 2)
    p = with_pithtrain_fsdp("fsdp1")
    assert (p.memory.pp_unsharded_bytes, p.memory.pp_unsharded_forward_bytes) == (6, 2)
    assert "093a9e4" in p.memory.sources["pp_unsharded_bytes"]
    torch_mem = get_profile("fsdp1").memory
    assert (torch_mem.pp_unsharded_bytes, torch_mem.pp_unsharded_forward_bytes) == (4, 0)
    pith, base = _model(p), _model(replace(p, memory=torch_mem))
    c = pith.resolve(_CFG)
    # under 1F1B (one chunk) a rank's activations peak at its first backward: every byte held
    for r in range(c.pp):
        assert pith.states.pp_unsharded_bytes(c, r, 1e9) == pytest.approx(6e9)
        assert base.states.pp_unsharded_bytes(c, r, 1e9) == pytest.approx(4e9)
    assert (pith.estimate(_CFG).memory_breakdown.transient
            > base.estimate(_CFG).memory_breakdown.transient)


def test_compiled_layer_keeps_no_eager_norm_or_glu_extras():
    from autopar.cost import memory as mem
    from autopar.frameworks.stacks.pithtrain import PITHTRAIN_FUSION, with_pithtrain_kernels
    p = with_pithtrain_kernels("fsdp1")
    assert (p.fusion, p.eager_parts) == ("compile", ())
    assert "093a9e4" in p.cost_sources["fusion"] and PITHTRAIN_FUSION.fusion == "compile"
    eager, compiled = _model(get_profile("fsdp1")), _model(p)
    c = eager.resolve(_CFG)
    li = next(i for i, lay in enumerate(eager.graph.layers) if lay.kind == "block")
    layer = eager.graph.layers[li]
    extra = mem.eager_saved_bytes(layer, fusion="eager", dtype_bytes=2, micro_batch=1, tp=1, cp=1,
                                  sequence_parallel=False)
    assert extra > 0
    assert (eager.block_cost(li, "none", c).act_bytes - compiled.block_cost(li, "none", c).act_bytes
            == pytest.approx(extra, rel=1e-9))
    # the PithTrain records take it
    raw = next(r for r in validation.load_corpus() if r["id"].startswith("moe-pithtrain-pr40"))
    assert validation.record_profile(records.parse(raw)).fusion == "compile"
