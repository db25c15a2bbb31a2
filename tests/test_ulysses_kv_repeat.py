"""Ulysses CP with the KV heads repeated before the all-to-all (XTuner's sequence parallelism,
:mod:`autopar.frameworks.stacks.xtuner`): the legality rule, the all-to-all bytes, the memory,
and the refusal of the profiles that send K and V at their own head count.

The record used (ls2-xtuner-llama2-70b-256k-32gpu-sp16) is a development-split record; the
tests run a copy of it at 16k tokens and 2 layers to stay fast."""

from __future__ import annotations

import copy
import dataclasses

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.comm import cp_layer_comm
from autopar.cost.memory import kv_repeat_bytes
from autopar.cost.model import CostModel
from autopar.errors import InvalidParallelConfig
from autopar.frameworks import get_profile, rules
from autopar.frameworks.choices import with_choice
from autopar.frameworks.stacks.xtuner import XTUNER_SEQUENCE_PARALLEL, with_xtuner_attention
from autopar.search import space
from benchmarks import validation
from benchmarks.records import parse

SP16 = "ls2-xtuner-llama2-70b-256k-32gpu-sp16"
SEQ = 16384
ULYSSES16 = autopar.ParallelConfig(tp=1, pp=1, cp=16, dp=2, cp_mode="ulysses", zero_stage=3,
                                   recompute="full")


def _small(dev):
    """The sp16 record at 16k tokens and 2 layers: (record, its profile, graph, training)."""
    raw = copy.deepcopy(dev[SP16])
    raw["model"].update(seq_len=SEQ, num_layers=2)
    rec = parse(raw)
    train = validation.training(rec)
    graph, _ = model_graph(rec.model, train)
    return rec, validation.record_profile(rec), graph, train


def test_rule_needs_only_the_query_heads_when_kv_heads_are_repeated():
    """64 heads, 8 KV heads over tp*cp = 16: refused by default, naming both counts and the
    option; accepted with kv_repeat; query heads that 16 does not divide are refused either
    way."""
    v = rules.ulysses_heads(1, 16, 64, 8)
    assert v.rule == "ulysses_heads"
    assert "64 heads and 8 KV heads" in v.problem and "ulysses_kv_repeat" in v.fix
    assert rules.ulysses_heads(1, 16, 64, 8, kv_repeat=True) is None
    assert rules.ulysses_heads(2, 8, 64, 8, kv_repeat=True) is None
    q = rules.ulysses_heads(1, 16, 56, 8, kv_repeat=True)
    assert q.rule == "ulysses_heads" and "56 attention heads" in q.problem
    assert rules.ulysses_heads(1, 16, 64, 8, cp_mode="ring") is None


@pytest.mark.parametrize("name", ["megatron", "torchtitan", "deepspeed", "torch", "nemo"])
def test_profiles_that_send_kv_heads_as_they_are_refuse(dev, name):
    """Megatron-LM (Transformer Engine's QKVO all-to-all asserts KV heads % cp), torchtitan (no
    Ulysses), DeepSpeed and plan.apply keep refusing tp*cp = 16 over 8 KV heads, with the
    rule's name and a fix."""
    _, _, graph, train = _small(dev)
    rec = parse(dev[SP16])
    profile = get_profile(name)
    assert profile.ulysses_kv_repeat is False
    with pytest.raises(InvalidParallelConfig) as err:
        CostModel(graph, rec.cluster, train, framework=profile).estimate(ULYSSES16)
    assert err.value.rule == "ulysses_heads"
    assert "8 KV heads" in str(err.value) and "Fix: use cp_mode='ring'" in str(err.value)


def test_xtuner_records_get_xtuners_attention(dev):
    """An XTuner 0.1 record's profile repeats KV heads (sourced to XTuner's llama dispatch) and
    keeps them; the stock DeepSpeed profile does neither."""
    rec = parse(dev[SP16])
    p = validation.record_profile(rec)
    assert p.name == "deepspeed" and p.ulysses_kv_repeat and p.memory.kv_repeat_saved == 1
    assert "repeat_kv" in p.cost_sources["ulysses_kv_repeat"]
    assert "3a8035d6" in p.memory.sources["kv_repeat_saved"]
    stock = get_profile("deepspeed")
    assert not stock.ulysses_kv_repeat and stock.memory.kv_repeat_saved == 0
    assert with_xtuner_attention().ulysses_kv_repeat


def test_repeated_kv_crosses_the_all_to_all_at_the_query_width(dev):
    """Llama2-70B block, 16k tokens, cp 16: forward all-to-alls 3 x Q (Q, K, V at 64 heads) and
    the output Q, instead of Q + 2 x Q/8 and Q; backward the same. Q = 16384 x 8192 x 2 bytes."""
    rec, profile, graph, train = _small(dev)
    cm = CostModel(graph, rec.cluster, train, framework=profile)
    grp = cm.group("cp", cm.resolve(ULYSSES16))
    block = graph.layers[1]
    assert (block.attention_heads, block.kv_heads) == (64, 8)
    q = SEQ * 8192 * 2
    f, b, load = cp_layer_comm(block, grp, micro_batch=1, tp=1, attention_fwd_s=0.0,
                               mode="ulysses", kv_repeat=True)
    assert f == b == pytest.approx(grp.time("all_to_all", 3 * q / 16)
                                   + grp.time("all_to_all", q / 16))
    f0, _, load0 = cp_layer_comm(block, grp, micro_batch=1, tp=1, attention_fwd_s=0.0,
                                 mode="ulysses", kv_repeat=False)
    assert f0 == pytest.approx(grp.time("all_to_all", 1.25 * q / 16)
                               + grp.time("all_to_all", q / 16))
    wire = load.intra_bytes + load.inter_bytes
    assert wire / (load0.intra_bytes + load0.inter_bytes) == pytest.approx(4 / 2.25)
    # other modes and multi-head attention are unchanged by the flag
    for mode in ("ring", "allgather"):
        assert cp_layer_comm(block, grp, micro_batch=1, tp=1, attention_fwd_s=1e-3, mode=mode,
                             kv_repeat=True) == cp_layer_comm(
            block, grp, micro_batch=1, tp=1, attention_fwd_s=1e-3, mode=mode)


def test_xtuner_estimate_prices_the_repeat_in_time_and_memory(dev):
    """The record's layout estimates under XTuner's profile; its CP time is that of the
    repeated bytes, and keeping the repeated K and V adds at least the recomputed block's
    copies (kv_repeat_bytes: 2 x Q - 2 x Q/8 over 16 ranks) to the peak."""
    rec, profile, graph, train = _small(dev)
    e = CostModel(graph, rec.cluster, train, framework=profile).estimate(ULYSSES16)
    no_keep = dataclasses.replace(profile, memory=dataclasses.replace(profile.memory,
                                                                      kv_repeat_saved=0))
    e0 = CostModel(graph, rec.cluster, train, framework=no_keep).estimate(ULYSSES16)
    extra = kv_repeat_bytes(graph.layers[1], micro_batch=1, tp=1, cp=16)
    q = SEQ * 8192 * 2
    assert extra == (2 * q - 2 * q / 8) / 16
    grew = e.memory_per_gpu_bytes - e0.memory_per_gpu_bytes
    assert extra <= grew <= 1.1 * extra
    assert e.step_time_s == pytest.approx(e0.step_time_s)   # memory only


def test_search_offers_ulysses_only_where_the_profile_repeats_kv_heads():
    """tp 1, cp 16 over 64 heads and 8 KV heads: the search space offers Ulysses to a profile
    with XTuner's choice, not to the stock one."""
    graph = type("G", (), {"attention_heads": 64, "kv_heads": 8})()
    base = {"tp": 1, "cp": 16}
    stock = get_profile("torch")
    assert "ulysses" in stock.cp_modes
    assert "ulysses" not in space.cp_modes(graph, base, {}, stock)
    repeats = with_choice(stock, XTUNER_SEQUENCE_PARALLEL)
    assert "ulysses" in space.cp_modes(graph, base, {}, repeats)
