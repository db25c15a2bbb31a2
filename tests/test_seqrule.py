"""Sequence-length divisibility per framework (issue 13 c): load-balanced context parallelism
cuts the sequence into 2 cp chunks (Megatron-Core, torchtitan), sequence parallelism shards each
CP rank's tokens over tp; the rule lives in each FrameworkProfile and both the cost model
(resolve) and the search (space) apply it."""

from __future__ import annotations

from math import lcm

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar
from autopar.config import FRAMEWORKS
from autopar.errors import InfeasibleError, InvalidParallelConfig, InvalidTrainingConfig
from autopar.frameworks import PROFILES, SeqLenRule

H100x16 = autopar.Cluster.custom(2, 8, "H100-SXM5-80GB")
H100x8 = autopar.Cluster.custom(1, 8, "H100-SXM5-80GB")


@settings(max_examples=200, deadline=None)
@given(seq=st.integers(1, 1 << 18), tp=st.sampled_from([1, 2, 4, 8]),
       cp=st.sampled_from([1, 2, 4, 8, 16]), sp=st.booleans())
def test_rules_are_the_frameworks_assertions(seq, tp, cp, sp):
    mega, titan, torch_ = PROFILES["megatron"], PROFILES["torchtitan"], PROFILES["torch"]
    # Megatron-LM arguments.py (seq % 2cp when cp > 1) and mappings.py (seq / cp % tp under SP)
    ok = (cp == 1 or seq % (2 * cp) == 0) and (not (sp and tp > 1) or (
        seq % cp == 0 and (seq // cp) % tp == 0))
    assert (mega.seq_violation(seq, tp, cp, sp) is None) == ok
    if cp > 1 and sp and tp > 1:
        assert ok == (seq % (cp * lcm(2, tp)) == 0)
    # torchtitan parallel_dims.py seq_len_divisor = tp * (cp * 2), asserted for every job
    assert (titan.seq_violation(seq, tp, cp, sp) is None) == (seq % (tp * 2 * cp) == 0)
    # plan.apply: contiguous CP split allowed, SP needs equal shards of each CP rank's tokens
    ok = seq % cp == 0 and (not (sp and tp > 1) or (seq // cp) % tp == 0)
    assert (torch_.seq_violation(seq, tp, cp, sp) is None) == ok


@pytest.mark.parametrize("framework", ["megatron", "torchtitan", "torch"])
def test_llama3_8b_at_4097_with_tp8_sp_is_refused_with_the_rule_and_a_fix(framework):
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=4097, framework=framework)
    with pytest.raises(InvalidParallelConfig) as exc:
        autopar.estimate("llama3-8b", H100x8, train,
                         autopar.ParallelConfig(tp=8, sequence_parallel=True))
    msg = str(exc.value)
    assert f"{framework} needs the sequence length to be a multiple of" in msg
    assert "Fix:" in msg and "4096" in msg
    if framework == "megatron":
        assert "multiple of 8" in msg and "sequence_parallel=False" in msg
        assert "mappings.py" in msg
    if framework == "torchtitan":
        assert "multiple of 16" in msg and "seq_len_divisor" in msg
        assert "sequence_parallel=False" not in msg    # torchtitan always runs SP under TP


def test_megatron_cp_needs_two_chunks_per_rank():
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=4098, framework="megatron")
    with pytest.raises(InvalidParallelConfig, match=r"multiple of 4 .*2 \* cp = 4"):
        autopar.estimate("llama3-8b", H100x8, train, autopar.ParallelConfig(tp=1, cp=2, dp=4))
    # stock torch (plan.apply) falls back to a contiguous split
    e = autopar.estimate("llama3-8b", H100x8, autopar.TrainingConfig(8, 4098),
                         autopar.ParallelConfig(tp=1, cp=2, dp=4))
    assert e.config.cp == 2


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_optimize_at_131074_never_breaks_the_rule(framework):
    # 131074 = 2 * 65537 (a prime): Megatron can run no CP and SP only at tp <= 2;
    # torchtitan neither TP nor CP
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=131074, framework=framework)
    profile = PROFILES[framework]
    try:
        plan = autopar.optimize("llama3-8b", H100x16, train)
    except InfeasibleError as exc:
        # tp = cp = 1 only: 8B at 131K tokens overflows (both torchtitan series)
        assert framework in ("torchtitan", "torchtitan-0.3")
        assert "131074 tokens rule out tp x cp = 1x2, 2x1" in str(exc)   # and says why
        return
    for e in (plan.estimate, *plan.alternatives, *plan.pareto):
        c = e.config
        assert profile.seq_violation(131074, c.tp, c.cp, c.sequence_parallel) is None, c
    if framework == "megatron":
        assert all(e.config.cp == 1 for e in (plan.estimate, *plan.alternatives))
        assert any(e.config.tp > 2 and not e.config.sequence_parallel
                   for e in (plan.estimate, *plan.alternatives))


def test_a_rule_without_source_is_refused():
    with pytest.raises(InvalidTrainingConfig, match="source"):
        SeqLenRule(cp_chunks=2, source="")
    with pytest.raises(InvalidTrainingConfig, match="cp_chunks"):
        SeqLenRule(cp_chunks=3)
