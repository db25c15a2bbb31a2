"""The search against brute force, and its contract (fits, fixed, determinism, anytime)."""

from __future__ import annotations

import itertools

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.search.optimize import search
from autopar.search.space import divisors

PROBLEMS = []
for i, (layers, h, heads, kv, world, gpu, gbs, seq) in enumerate(itertools.product(
        [2, 4, 8], [1024, 2048], [16], [4, 16], [4, 8, 16], ["A100-40GB"], [16], [2048])):
    PROBLEMS.append((layers, h, heads, kv, world, gpu, gbs, seq))
PROBLEMS = PROBLEMS[::3] + PROBLEMS[1::3][:12]


def _brute_force(cm: CostModel):
    """Best fitting estimate over every legal uniform configuration, by plain enumeration."""
    world = cm.cluster.world_size
    train = cm.train
    best = None
    for tp, cp, pp in itertools.product(divisors(world), repeat=3):
        if world % (tp * cp * pp) or tp > cm.cluster.gpus_per_node:
            continue
        if cp > 1 and train.seq_len // cp < 1024:
            continue
        dp = world // (tp * cp * pp)
        for b, v, zero, rc in itertools.product(range(1, 17), range(1, 9), range(4),
                                                ("none", "selective", "full")):
            if zero and dp * cp == 1:
                continue
            if v > 1 and pp == 1:
                continue
            try:
                e = cm.estimate(autopar.ParallelConfig(
                    tp=tp, cp=cp, pp=pp, dp=dp, micro_batch_size=b, virtual_stages=v,
                    zero_stage=zero, recompute=rc, sequence_parallel=tp > 1))
            except autopar.InvalidParallelConfig:
                continue
            if e.fits and (best is None or e.step_time_s < best.step_time_s):
                best = e
    return best


@pytest.mark.parametrize("layers,h,heads,kv,world,gpu,gbs,seq", PROBLEMS)
def test_search_matches_or_beats_brute_force(layers, h, heads, kv, world, gpu, gbs, seq):
    cfg = {"name": "small", "family": "llama", "num_layers": layers, "hidden_size": h,
           "num_heads": heads, "num_kv_heads": kv, "vocab_size": 32000, "seq_len": seq}
    train = autopar.TrainingConfig(global_batch_size=gbs, seq_len=seq)
    graph = model_graph(cfg, train)[0]
    cluster = autopar.Cluster.custom(max(1, world // 8), min(world, 8), gpu)
    cm = CostModel(graph, cluster, train)
    brute = _brute_force(cm)
    found = search(cm).best
    assert brute is not None and found.fits
    # per-block recompute mixes (CP-SAT) may beat every uniform configuration
    assert found.step_time_s <= brute.step_time_s * (1 + 1e-9)


def test_search_never_returns_an_oversized_plan():
    train = autopar.TrainingConfig(global_batch_size=32, seq_len=4096)
    graph = model_graph("llama2-13b", train)[0]
    cm = CostModel(graph, autopar.Cluster.from_spec("1x8xA100-40GB"), train)
    result = search(cm, top_k=10)
    for e in result.top + result.pareto:
        assert e.fits and e.memory_per_gpu_bytes <= cm.device.memory_bytes
    times = [e.step_time_s for e in result.pareto]
    mems = [e.memory_per_gpu_bytes for e in result.pareto]
    assert times == sorted(times) and mems == sorted(mems, reverse=True)


def test_cp_sat_mixes_recompute_when_memory_binds():
    train = autopar.TrainingConfig(global_batch_size=32, seq_len=4096)
    graph = model_graph("llama2-13b", train)[0]
    cm = CostModel(graph, autopar.Cluster.from_spec("1x8xA100-40GB"), train)
    best = search(cm, fixed={"tp": 8, "pp": 1, "micro_batch_size": 2}).best
    uniform = [cm.estimate(best.config.replace(recompute=m)) for m in ("none", "selective",
                                                                     "full")]
    fitting = [e for e in uniform if e.fits]
    assert best.step_time_s <= min(e.step_time_s for e in fitting)


def test_time_limit_returns_best_so_far():
    train = autopar.TrainingConfig(global_batch_size=1536, seq_len=2048)
    graph = model_graph("gpt3-175b", train)[0]
    cm = CostModel(graph, autopar.Cluster.from_spec("128x8xA100-80GB"), train)
    result = search(cm, time_limit_s=0.3)
    assert not result.complete
    assert result.best.fits and result.wall_s < 5
