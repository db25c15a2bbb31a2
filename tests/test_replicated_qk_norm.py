"""torchtitan's Qwen3 TP plan before 2025-10-14 (PR #1870): the per-head query/key norms as
``NoParallel``, so under TP the queries and keys are all-gathered and the norms and the rotary
embedding after them run on whole heads (autopar.frameworks.stacks.torchtitan
``with_replicated_qk_norm``, the eager part ``tp_replicated_qk_norm``).

Values from a tiny dense Qwen3-style model (b = 1, s = 256, h = 256, 4 query heads and 2 KV
heads of dim 64, bf16): the norms' outputs are the queries s x 4 x 64 x 2 = 131,072 bytes and
the keys s x 2 x 64 x 2 = 65,536 bytes.
"""

from __future__ import annotations

import pytest

import autopar
from autopar.cost.compute import layer_time
from autopar.cost.qk_norm import qk_norm_bytes, qk_norm_ops
from autopar.cost.model import CostModel
from autopar.frameworks import get_profile
from autopar.frameworks.options import STACK_OPTIONS
from autopar.frameworks.stacks.torchtitan import QK_NORM_SHARDED_SINCE, with_replicated_qk_norm
from autopar.models import ModelConfig
from autopar.problem import model_graph

S = 256
QWEN3 = dict(name="tiny-qwen3", family="llama", num_layers=4, hidden_size=256, num_heads=4,
             num_kv_heads=2, head_dim=64, vocab_size=512, seq_len=S, ffn_hidden_size=512,
             qk_norm=True)
TRAIN = autopar.TrainingConfig(global_batch_size=32, seq_len=S, framework="torchtitan")
CLUSTER = autopar.Cluster.from_spec("1x8xH100")


def _graph(**changes):
    return model_graph(ModelConfig.from_dict({**QWEN3, **changes}), TRAIN)[0]


@pytest.fixture(scope="module")
def graph():
    return _graph()


def _models(graph):
    stock = get_profile("torchtitan")
    return (CostModel(graph, CLUSTER, TRAIN, framework=stock),
            CostModel(graph, CLUSTER, TRAIN, framework=with_replicated_qk_norm(stock)))


def test_the_whole_head_ops_are_the_qk_norms_and_the_rotary_embedding(graph):
    block = graph.blocks[0]
    names = [block.ops[i].name for i in sorted(qk_norm_ops(block))]
    assert names[:2] == ["attn_q_norm", "attn_k_norm"]
    # the block's own norms (outside the TP region) are not among them; nothing after the
    # attention is
    assert "attn_norm" not in names and "mlp_norm" not in names
    attention = next(i for i, op in enumerate(block.ops) if op.kind == "attention")
    assert max(qk_norm_ops(block)) < attention
    assert all(block.ops[i].kind not in ("matmul", "view") for i in qk_norm_ops(block))
    assert qk_norm_bytes(block) == S * 4 * 64 * 2 + S * 2 * 64 * 2
    # no per-head norm, nothing replicated
    assert qk_norm_ops(_graph(qk_norm=False).blocks[0]) == frozenset()


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_tp_adds_the_gathers_and_the_whole_head_work(graph, recompute):
    stock, old = _models(graph)
    c = autopar.ParallelConfig(tp=2, sequence_parallel=True, recompute=recompute, zero_stage=3)
    a, b = stock.estimate(c), old.estimate(c)
    assert b.step_time_s >= a.step_time_s   # (a tiny model: the host may set the pace)
    block = graph.blocks[0]
    tp = stock.group("tp", stock.resolve(c))
    gather = tp.time("all_gather", qk_norm_bytes(block))   # micro-batch 1 = the graph's
    passes = 3 if recompute == "full" else 2   # forward, (its recomputation,) backward
    got = (b.time_breakdown.tp_comm - a.time_breakdown.tp_comm) / b.num_micro_batches
    assert got == pytest.approx(graph.num_blocks * passes * gather, rel=1e-9)
    # the norms and the rotary embedding run on all heads: their HBM time is tp times the
    # sharded one (at a micro-batch large enough that bytes, not launches, set it)
    args = dict(micro_batch=4096, tp=2, cp=1, sequence_parallel=True, peak_flops=989e12,
                hbm_bandwidth=3.35e12, params=stock.params, architecture="hopper",
                fusion="eager")
    sharded = layer_time(block, **args)
    whole = layer_time(block, **args, eager_parts=("tp_replicated_qk_norm",))
    extra = sum(whole.op_fwd_s[i] - sharded.op_fwd_s[i] for i in qk_norm_ops(block))
    assert extra == pytest.approx(sum(sharded.op_fwd_s[i] for i in qk_norm_ops(block)), rel=1e-9)
    assert whole.fwd_s - sharded.fwd_s == pytest.approx(extra, rel=1e-9)


def test_nothing_changes_at_tp_1_or_without_qk_norms(graph):
    stock, old = _models(graph)
    c = autopar.ParallelConfig(tp=1, dp=8)
    assert old.estimate(c).step_time_s == stock.estimate(c).step_time_s
    plain = _graph(qk_norm=False)
    stock, old = _models(plain)
    c = autopar.ParallelConfig(tp=2, sequence_parallel=True)
    assert old.estimate(c).step_time_s == stock.estimate(c).step_time_s


def test_a_user_selects_it_by_name_and_the_corpus_by_date():
    option = STACK_OPTIONS["replicated-qk-norm"]
    assert option.applies_to("torchtitan") and not option.applies_to("megatron")
    assert "tp_replicated_qk_norm" in option.apply(get_profile("torchtitan"), 8).eager_parts
    from benchmarks import validation
    from benchmarks.records import parse
    raw = next(r for r in validation.load_corpus()
               if r["id"] == "new4-titan1690-qwen3-32b-32xh100-fsdp4-tp8-lbs16-fullac-eager")
    rec = parse(raw)
    assert "2025-09" in rec.framework and QK_NORM_SHARDED_SINCE == "2025-10-14"
    assert "tp_replicated_qk_norm" in validation.record_profile(rec).eager_parts
    later = parse({**raw, "training": {**raw["training"],
                                       "framework": "torchtitan main (2025-11)"}})
    assert "tp_replicated_qk_norm" not in validation.record_profile(later).eager_parts


def test_the_profile_names_its_source():
    p = with_replicated_qk_norm(get_profile("torchtitan"))
    assert "PR #1870" in p.cost_sources["eager_parts"]
    # applying it twice is applying it once
    assert with_replicated_qk_norm(p).eager_parts == p.eager_parts


@pytest.mark.parametrize("sp", [True, False])
def test_the_whole_head_norms_keep_whole_head_tensors(graph, sp):
    # what the per-head norms save (the graph's count, and an eager RMSNorm's fp32 copy) is
    # not sharded over TP when they run on whole heads
    from autopar.cost.memory import EAGER_RMSNORM_SAVED_EXTRA_BYTES, eager_saved_bytes
    block, tp = graph.blocks[0], 2
    args = dict(fusion="eager", dtype_bytes=2, micro_batch=1, tp=tp, cp=1, sequence_parallel=sp)
    sharded = eager_saved_bytes(block, **args)
    whole = eager_saved_bytes(block, **args, eager_parts=("tp_replicated_qk_norm",))
    norms = [block.ops[i] for i in qk_norm_ops(block) if block.ops[i].kind == "norm"]
    saved = sum(b for name, part, b in block.saved_by_op
                if part == "tp" and name in {n.name for n in norms})
    eager = sum(EAGER_RMSNORM_SAVED_EXTRA_BYTES * n.bytes_written / 2 for n in norms)
    expected = saved * (1 - 1 / tp) + eager * (1 - (1 / tp if sp else 1))
    assert saved > 0 and whole - sharded == pytest.approx(expected, rel=1e-12)
