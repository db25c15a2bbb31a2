"""Issue 25 item 5: a search under a dated stack proposes only plans that release could run.

``megatron-2023`` (Megatron-LM before 4eeff55d1f) had the distributed optimizer but no FSDP, no
context parallelism, equal interleaved chunks and no separate expert TP; the search under it
(as ``benchmarks/search_quality.py`` runs for the 2021-2022 Megatron records) must not return a
ZeRO-3 or CP plan whose advantage exists only in a newer release."""

from __future__ import annotations

import autopar
from autopar.config import ParallelConfig
from autopar.cost.model import CostModel
from autopar.frameworks import get_profile
from autopar.problem import model_graph
from autopar.search.optimize import search


def test_megatron_2023_refuses_what_that_release_lacked_with_its_source():
    old, new = get_profile("megatron-2023"), get_profile("megatron")
    zero3 = ParallelConfig(tp=1, pp=1, dp=8, zero_stage=3)
    cp2 = ParallelConfig(tp=1, pp=1, dp=4, cp=2)
    assert new.unsupported(zero3) is None and new.unsupported(cp2) is None
    assert "e1993fa6f7" in old.unsupported(zero3)
    assert "context-parallel" in old.unsupported(cp2)
    uneven = ParallelConfig(tp=1, pp=2, dp=4, virtual_stages=2, stage_blocks=(3, 2, 3, 2))
    assert "same layers" in old.unsupported(uneven)
    # the cost path is unchanged: only the capabilities differ
    assert old.overlap_pp_p2p == () and old.optimizer_step_bytes == new.optimizer_step_bytes


def _searched(framework: str):
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=2048, framework=framework)
    graph, _ = model_graph("llama2-7b", train)
    cm = CostModel(graph, autopar.Cluster.from_spec("2x8xA100-80GB"), train)
    r = search(cm, top_k=5)
    return (r.best, *r.top)


def test_search_under_megatron_2023_keeps_to_zero1_and_no_cp():
    # main's Megatron-LM (FSDP2, CP) picks ZeRO-3 here; the 2023 release could not
    assert _searched("megatron")[0].config.zero_stage == 3
    old = _searched("megatron-2023")
    for e in old:
        assert e.config.zero_stage in (0, 1) and e.config.cp == 1
    assert old[0].config.zero_stage == 1
