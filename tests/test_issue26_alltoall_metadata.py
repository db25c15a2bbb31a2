"""Issue 26: Megatron-Core's all-to-all dispatcher moves more than the tokens. Since 2659630721
(core 0.13) the routed rows' probabilities travel in an all-to-all of their own (and their
gradient back), and every version all-gathers the per-expert token counts over the expert-TP x
EP group before the dispatch (core_v0.17.1 token_dispatcher.py ``preprocess`` and
``token_dispatch``). Per MoE layer and micro-batch those are small messages whose cost is the
collectives' latency on the EP group's links."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.config import ParallelConfig  # noqa: E402
from autopar.cost import capacity  # noqa: E402
from autopar.cost.model import CostModel  # noqa: E402
from autopar.frameworks import get_profile  # noqa: E402
from autopar.frameworks.stacks.megatron import (  # noqa: E402
    with_alltoall_seq_2024, with_moe_probs_at_combine)
from autopar.problem import model_graph  # noqa: E402

_MODEL = {"name": "moe-tiny", "family": "llama", "num_layers": 4, "hidden_size": 256,
          "num_heads": 4, "num_kv_heads": 4, "ffn_hidden_size": 512, "vocab_size": 1024,
          "seq_len": 256, "tied_embeddings": False, "num_experts": 8, "top_k": 2,
          "moe_ffn_hidden_size": 512, "first_dense_layers": 0}


def _off(profile):
    return profile.with_costs({"moe_probs_alltoall": "test", "moe_counts_gather": "test"},
                              moe_probs_alltoall=False, moe_counts_gather=False)


def _block(profile, spec="2x8xH100-80GB+8xefa-v2-100g", dispatcher="alltoall", mode="none",
           **kw):
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=256, framework="megatron")
    graph, _ = model_graph(_MODEL, train)
    cm = CostModel(graph, autopar.Cluster.from_spec(spec), train, framework=profile)
    plan = dict(tp=1, dp=16, ep=8, zero_stage=0, dispatcher=dispatcher)
    plan.update(kw)
    c = cm.resolve(ParallelConfig(**plan))
    moe = next(b for b in graph.layers if b.num_experts)
    return cm, c, moe, cm.block_cost(moe.index, mode, c)


def test_profiles_say_which_dispatcher_moves_probabilities_and_counts():
    """Megatron-LM and NeMo run core 0.13's dispatcher; a run dated before 2659630721 sends no
    probabilities; the 2024 dispatcher prices its counts' gather with its blocking reads; the
    torch stacks and the in-house FP8 stack price neither."""
    for name in ("megatron", "nemo"):
        p = get_profile(name)
        assert p.moe_probs_alltoall and p.moe_counts_gather
        assert "2659630721" in p.cost_sources["moe_probs_alltoall"]
        old = with_moe_probs_at_combine(p)
        assert not old.moe_probs_alltoall and old.moe_counts_gather
        assert old.memory.moe_combine_saved == 1
        seq = with_alltoall_seq_2024(old)
        assert not seq.moe_probs_alltoall and not seq.moe_counts_gather
        assert seq.moe_dispatch_sync_ops == 9
    for name in ("torch", "torchtitan", "deepspeed", "inhouse-2024", "megatron-2023"):
        p = get_profile(name)
        assert not p.moe_probs_alltoall and not p.moe_counts_gather


def test_probabilities_alltoall_and_counts_gather_are_charged_with_the_dispatch():
    """ep 8 over 16 ranks on 2 nodes (EP inside a node under the default order): the layer's
    expert-parallel seconds grow by two all-to-alls of the rows' probabilities (tokens x top-k
    x 2 bytes) and one all-gather of ep x experts int64 counts, and its load by theirs."""
    cm, c, moe, on = _block(get_profile("megatron"))
    _, _, _, off = _block(_off(get_profile("megatron")))
    ep_g, g = cm.groups.group("ep", c), cm.groups.group("tpep", c)
    # one sequence of 256 tokens x top-2 at tp 1, on the busiest EP rank of random routing
    # (capacity.random_routing_scale)
    rows = 256 * 2 * capacity.random_routing_scale(256, 2, 8, 8)
    probs = rows * 2
    counts = 8 * 8 * 8
    extra = 2 * ep_g.time("all_to_all", probs) + g.time("all_gather", counts)
    assert extra > 0
    assert on.ep_s - off.ep_s == pytest.approx(extra)
    assert on.fwd_s + on.bwd_s - off.fwd_s - off.bwd_s == pytest.approx(extra)
    assert on.ep_load.nbytes - off.ep_load.nbytes == pytest.approx(
        2 * ep_g.wire_bytes("all_to_all", probs) + g.wire_bytes("all_gather", counts))


def test_full_recompute_repeats_the_forward_ones():
    """Full recompute runs the forward again: the probabilities' all-to-all a third time
    (x 1.5, as the tokens') and the counts' all-gather a second time."""
    cm, c, moe, on = _block(get_profile("megatron"), mode="full")
    _, _, _, off = _block(_off(get_profile("megatron")), mode="full")
    ep_g, g = cm.groups.group("ep", c), cm.groups.group("tpep", c)
    probs = 256 * 2 * 2 * capacity.random_routing_scale(256, 2, 8, 8)
    extra = 3 * ep_g.time("all_to_all", probs) + 2 * g.time("all_gather", 8 * 8 * 8)
    assert on.ep_s - off.ep_s == pytest.approx(extra)


@pytest.mark.parametrize("kw", [dict(ep=1), dict(dispatcher="deepep")])
def test_nothing_without_expert_parallelism_or_under_another_dispatcher(kw):
    _, _, _, on = _block(get_profile("megatron"), **kw)
    _, _, _, off = _block(_off(get_profile("megatron")), **kw)
    assert on.ep_s == pytest.approx(off.ep_s)


def test_efa_alltoall_of_the_probabilities_costs_its_latency():
    """Across two p5 nodes (tp 2 x ep 8: the EP ranks 2 apart span both nodes) the
    probabilities' all-to-all is latency: a message of a few hundred bytes costs what the EP
    group's all-to-all costs at any small size, far above its bytes over the NICs."""
    cm, c, moe, on = _block(get_profile("megatron"), tp=2, dp=8, ep=8, sequence_parallel=True,
                            spec="2x8xH100-80GB+32xefa-v2-100g")
    _, _, _, off = _block(_off(get_profile("megatron")), tp=2, dp=8, ep=8,
                          sequence_parallel=True, spec="2x8xH100-80GB+32xefa-v2-100g")
    ep_g = cm.groups.group("ep", c)
    assert ep_g.size == 8 and ep_g.ranks[-1] >= 8     # both nodes
    probs = 128 * 2 * 2                  # 256 tokens / tp 2, top-2, bf16
    small = ep_g.time("all_to_all", probs)
    assert small == pytest.approx(ep_g.time("all_to_all", 1), rel=0.05)
    assert small > 100 * probs / (cm.cluster.inter_link.bandwidth_Bps * 4)
    assert on.ep_s - off.ep_s > 2 * small
