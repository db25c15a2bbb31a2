"""Issue 26: routed experts' gradients are reduced over the expert-data-parallel group, not the
data-parallel group (Megatron-Core's separate expert gradient buffers: ba773259
distributed_data_parallel.py lines 81-92 and 142-145, parallel_state.py lines 508-517)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.config import ParallelConfig  # noqa: E402
from autopar.cost.groups import Groups  # noqa: E402
from autopar.cost.model import CostModel  # noqa: E402
from autopar.problem import model_graph  # noqa: E402

_MODEL = {"name": "moe-tiny", "family": "llama", "num_layers": 4, "hidden_size": 256,
          "num_heads": 4, "num_kv_heads": 4, "ffn_hidden_size": 512, "vocab_size": 1024,
          "seq_len": 256, "tied_embeddings": False, "num_experts": 8, "top_k": 2,
          "moe_ffn_hidden_size": 512, "first_dense_layers": 0}


@pytest.mark.parametrize("kw, edp", [
    (dict(tp=2, dp=8, ep=8), (0,)),                           # dp / ep = 1: nothing to reduce
    (dict(tp=2, dp=8, ep=4), (0, 8)),                         # the DP ranks ep apart
    (dict(tp=2, dp=4, cp=2, ep=2), (0, 2, 8, 10)),            # with the CP ranks
    (dict(tp=4, dp=4, ep=8, expert_tp=1), (0, 8)),            # folded: tp*dp / (ep*etp)
    (dict(tp=2, dp=8, ep=1), (0, 2, 4, 6, 8, 10, 12, 14)),    # no EP: the DP group
])
def test_expert_data_parallel_group_ranks(kw, edp):
    groups = Groups(autopar.Cluster.from_spec("2x8xH100-80GB"), None)
    c = ParallelConfig(**kw)
    g = groups.group("edp", c)
    assert g.ranks == edp
    assert g.size == c.tp * c.cp * c.dp // (c.ep * c.etp)


def _dp_cost(ep: int):
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=256, framework="megatron")
    graph, _ = model_graph(_MODEL, train)
    cm = CostModel(graph, autopar.Cluster.from_spec("2x8xH100-80GB"), train)
    c = cm.resolve(ParallelConfig(tp=2, dp=8, ep=ep, zero_stage=0, sequence_parallel=True))
    layout = cm.stage_layout(c)
    psi = layout[0].params
    experts = cm.ranks.rank_params(c.tp, c.ep, layout[0].layers, c.etp)[1]
    return cm, c, psi, experts


def test_dense_gradients_alone_cross_the_data_parallel_group_at_ep_equal_dp():
    """tp 2, dp 8, ep 8 on 16 GPUs: each expert shard lives on one rank (expert DP 1), so the
    all-reduce after backward carries the dense parameters only."""
    cm, c, psi, experts = _dp_cost(8)
    assert 0 < experts < psi
    coll = cm.dp.reduction_groups(c, cm.stage_layout(c)[0].layers, psi)
    dp_g = cm.groups.group("dp", c)
    rb = cm.reduce_bytes
    assert coll.time("all_reduce", rb) == pytest.approx(dp_g.time("all_reduce", (psi - experts)
                                                                  * rb))
    assert cm.estimate(c).time_breakdown.dp_comm_exposed == pytest.approx(
        dp_g.time("all_reduce", (psi - experts) * rb))


def test_expert_gradients_reduced_over_their_own_group_at_ep_below_dp():
    """ep 4 of dp 8: the expert gradients are all-reduced over the 2 ranks holding the same
    expert shard, after the dense all-reduce over the 8 DP ranks; with no EP one collective
    over the DP group carries everything, as before."""
    cm, c, psi, experts = _dp_cost(4)
    coll = cm.dp.reduction_groups(c, cm.stage_layout(c)[0].layers, psi)
    dp_g, edp_g = cm.groups.group("dp", c), cm.groups.group("edp", c)
    rb = cm.reduce_bytes
    assert edp_g.size == 2
    assert coll.time("all_reduce", rb) == pytest.approx(
        dp_g.time("all_reduce", (psi - experts) * rb) + edp_g.time("all_reduce", experts * rb))
    cm1, c1, psi1, _ = _dp_cost(1)
    coll1 = cm1.dp.reduction_groups(c1, cm1.stage_layout(c1)[0].layers, psi1)
    assert coll1.edp_g is None and coll1.dense == psi1


def _tokens_only(profile):
    """``profile`` without the current dispatcher's probabilities' all-to-all and counts'
    gather (tests/test_issue26_alltoall_metadata.py), so the 2024 dispatcher's own additions
    are what differs."""
    return profile.with_costs({"moe_probs_alltoall": "test", "moe_counts_gather": "test"},
                              moe_probs_alltoall=False, moe_counts_gather=False)


def _moe_block_tp_s(profile, dispatcher="alltoall", tp=2):
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=256, framework="megatron")
    graph, _ = model_graph(_MODEL, train)
    cm = CostModel(graph, autopar.Cluster.from_spec("2x8xH100-80GB"), train, framework=profile)
    c = cm.resolve(ParallelConfig(tp=tp, dp=16 // tp, ep=8, zero_stage=0,
                                  sequence_parallel=tp > 1, dispatcher=dispatcher))
    moe = next(b for b in graph.layers if b.num_experts)
    return cm, c, moe, cm.block_cost(moe.index, "none", c)


def test_2024_alltoall_dispatcher_adds_its_tp_alltoalls_and_logits_gather():
    """Megatron-Core 9208adbdc7..a11077467a (ba773259 token_dispatcher.py 401-404, 482-485;
    router.py 235-240): under TP 2 each MoE layer adds two all-to-alls of a rank's sequence
    shard and the logits' all-gather forward, the same bytes backward; nothing at TP 1, and
    Megatron-LM's current dispatcher adds none."""
    from autopar.frameworks import get_profile
    from autopar.frameworks.stacks.megatron import with_alltoall_seq_2024
    now, old = _tokens_only(get_profile("megatron")), with_alltoall_seq_2024(get_profile("megatron"))
    assert old.moe_tp_token_alltoall and not now.moe_tp_token_alltoall
    cm, c, moe, new = _moe_block_tp_s(now)
    cm_old, _, _, was = _moe_block_tp_s(old)
    tp_g = cm.groups.group("tp", c)
    shard = moe.output_bytes / 2               # [S*B/tp, H] of one rank, micro-batch 1
    logits = sum(o.bytes_written for o in moe.ops if o.moe_role == "router")
    assert logits == pytest.approx(256 * 8 * 2)   # tokens x experts x bf16
    extra = 2 * tp_g.time("all_to_all", shard) + tp_g.time("all_gather", logits)
    assert was.tp_s - new.tp_s == pytest.approx(2 * extra)
    # the 2024 dispatcher's host reads are charged with the dispatch, half of it forward
    assert was.fwd_s - new.fwd_s == pytest.approx(
        extra + cm_old.blocks_cost.dispatch_sync_s(moe, c) / 2)
    assert (_moe_block_tp_s(old, tp=1)[3].tp_s == _moe_block_tp_s(now, tp=1)[3].tp_s == 0.0)


def test_megatron_runs_dated_before_the_token_level_dispatcher_take_the_2024_dispatcher():
    from benchmarks import records, validation
    from tests.test_issue26_records import _published
    rec = records.parse(_published("moer-mlm756-mixtral8x7b-h100-16gpu-tp2-ep8"))
    assert validation.record_profile(rec).moe_tp_token_alltoall
    assert not validation.dated_before("Megatron-Core 0.17.1, 2026-06", "2024-09-10")


def test_zero1_step_runs_on_the_dense_shard_and_the_expert_shard():
    """The distributed optimizer shards dense states over dp x cp and the routed experts' over
    their expert-data-parallel group (ba773259 core/optimizer/__init__.py
    get_megatron_optimizer), as the memory model keeps them: at tp 2, dp 8, ep 8 a rank steps
    1/8 of its dense parameters and all of its expert shard."""
    cm, c, psi, experts = _dp_cost(8)
    c1 = cm.resolve(ParallelConfig(tp=2, dp=8, ep=8, zero_stage=1, sequence_parallel=True))
    layers = cm.stage_layout(c1)[0].layers
    share, owners = cm.zero1_split(c1, layers, psi)
    assert share == pytest.approx((psi - experts) / 8 + experts) and owners == 8
    cm4, _, psi4, experts4 = _dp_cost(4)
    c4 = cm4.resolve(ParallelConfig(tp=2, dp=8, ep=4, zero_stage=1, sequence_parallel=True))
    share4, _ = cm4.zero1_split(c4, cm4.stage_layout(c4)[0].layers, psi4)
    assert share4 == pytest.approx((psi4 - experts4) / 8 + experts4 / 2)


def test_2024_dispatcher_host_reads_expose_the_ops_after_them():
    """ba773259 preprocess reads the token counts back twice with blocking copies under ep > 1:
    the GPU waits for the 9 ops issued after the reads (11 with the TP all-to-all) and the
    counts' all-gather over EP; Megatron-LM's current profile prices none, and ep 1 none."""
    from autopar.frameworks import get_profile
    from autopar.frameworks.stacks.megatron import with_alltoall_seq_2024
    old = with_alltoall_seq_2024(get_profile("megatron"))
    cm, c, moe, was = _moe_block_tp_s(old)
    host = cm.params.host_op_s
    counts = cm.groups.group("ep", c).time("all_gather", 8 * 8 * 8)
    assert cm.blocks_cost.dispatch_sync_s(moe, c) == pytest.approx(11 * host + counts)
    cm1, c1, moe1, _ = _moe_block_tp_s(old, tp=1)
    assert cm1.blocks_cost.dispatch_sync_s(moe1, c1) == pytest.approx(
        9 * host + cm1.groups.group("ep", c1).time("all_gather", 8 * 8 * 8))
    cm_now, c_now, moe_now, now = _moe_block_tp_s(_tokens_only(get_profile("megatron")))
    assert cm_now.blocks_cost.dispatch_sync_s(moe_now, c_now) == 0.0
    assert was.ep_s - now.ep_s == pytest.approx(11 * host + counts)


@pytest.mark.parametrize("framework, precision, nbytes", [
    ("megatron", "bf16", 4), ("megatron", "fp8", 4), ("megatron", "fp16", 2),
    ("megatron-2023", "bf16", 4), ("megatron-2023", "fp16", 2),
    ("nemo", "bf16", 2), ("inhouse-2024", "bf16", 2), ("torchtitan", "bf16", 4),
    ("deepspeed", "bf16", 2)])
def test_megatron_reduces_gradients_in_fp32_under_bf16_only(framework, precision, nbytes):
    """Megatron-LM arguments.py sets accumulate_allreduce_grads_in_fp32 under --bf16 (ba773259
    lines 282-288; d98e8a64 1209-1216 unless --grad-reduce-in-bf16); fp16 keeps fp16 buffers.
    NeMo's recipes reduce in bf16 (grad_sync_dtype=bf16)."""
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=256, framework=framework,
                                   precision=precision)
    graph, _ = model_graph(_MODEL, train)
    cm = CostModel(graph, autopar.Cluster.from_spec("2x8xH100-80GB"), train)
    assert cm.reduce_bytes == nbytes
