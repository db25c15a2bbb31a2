"""Megatron-LM's micro-batch group of interleaved 1F1B (``ParallelConfig.vp_group``:
``--microbatch-group-size-per-virtual-pipeline-stage``): the order, the warm-up and the
activations it holds, its rules, and the plan's path through import, estimate, plan files and
export. Values are hand-computed from megatron/core/pipeline_parallel/schedules.py
(``get_schedule_table``, ``get_pp_rank_microbatches``); where megatron-core is installed its
own functions are compared too."""

from __future__ import annotations

import json

import pytest

import autopar
from autopar import InvalidParallelConfig, ParallelConfig
from autopar.api import model_graph
from autopar.cost.memory import in_flight
from autopar.cost.model import CostModel
from autopar.cost.pipeline.held import chunk_counts_at_peak
from autopar.cost.pipeline.orders import (check_order_args, peak_in_flight, rank_orders,
                                          schedule_table)
from autopar.frameworks import get_profile, rules
from autopar.io.importers import from_megatron_args


def test_schedule_table_groups_micro_batches_per_chunk_with_a_shorter_last_group():
    # m = 10, v = 2, N = 4: groups [0-3], [4-7], [8-9], each through chunk 0 then chunk 1
    table = schedule_table(10, 2, 4)
    assert table[:8] == tuple((c, j) for c in (0, 1) for j in range(4))
    assert table[8:16] == tuple((c, j) for c in (0, 1) for j in range(4, 8))
    assert table[16:] == ((0, 8), (0, 9), (1, 8), (1, 9))


def test_schedule_table_is_megatrons():
    mcore = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
    for m, v, n in ((10, 2, 4), (5, 3, 5), (12, 4, 4), (22, 2, 6), (8, 2, 8)):
        theirs = mcore.get_schedule_table(m, v, n)   # (micro-batch, chunk) pairs
        assert schedule_table(m, v, n) == tuple((c, j) for j, c in theirs)


def test_order_warm_up_is_megatrons_and_the_default_group_is_torchs():
    # rank r runs 2 (pp - r - 1) + (v - 1) N forwards before its first backward
    pp, m, v, n = 4, 10, 2, 5
    for r, order in enumerate(rank_orders("interleaved-1f1b", pp, m, v, group=n)):
        kinds = [a[0] for a in order]
        assert kinds.index("B") == min(2 * (pp - r - 1) + (v - 1) * n, m * v) + 1
        assert kinds.count("F") == kinds.count("B") == m * v
    # the group pp on m a multiple of pp is torch's rounds: the same order
    assert rank_orders("interleaved-1f1b", 4, 8, 2, group=4) == rank_orders(
        "interleaved-1f1b", 4, 8, 2)


def test_peak_in_flight_follows_the_group_and_the_memory_formula():
    for pp, m, v, n in ((4, 10, 2, 5), (4, 20, 2, 10), (2, 6, 3, 3), (4, 22, 2, 6)):
        for r, order in enumerate(rank_orders("interleaved-1f1b", pp, m, v, group=n)):
            peak = peak_in_flight(order)
            assert peak == min(m * v, 2 * (pp - r - 1) + (v - 1) * n + 1)
            assert in_flight("interleaved-1f1b", r, pp, m, v, n) == peak
            counts = chunk_counts_at_peak("interleaved-1f1b", pp, m, v, r, n)
            assert max(counts.values()) <= m and set(counts) <= {c * pp + r for c in range(v)}


def test_megatrons_group_rules():
    assert rules.interleave_fill(4, 2, 10) is not None          # default N = pp: 10 % 4
    assert rules.interleave_fill(4, 2, 10, 5) is None           # two groups of 5
    assert rules.interleave_fill(4, 2, 10, 6) is None           # 6 + 4 (4 >= pp)
    assert "fewer than pp=4" in rules.interleave_fill(4, 2, 10, 7).problem   # 7 + 3
    assert "[pp=4" in rules.interleave_fill(4, 2, 10, 3).problem
    assert "[pp=4" in rules.interleave_fill(4, 2, 10, 11).problem
    assert rules.interleave_fill(4, 1, 10, 7) is None            # no interleaving
    with pytest.raises(ValueError):
        check_order_args("interleaved-zero-bubble", 4, 10, 2, group=5)


def test_parallel_config_needs_interleaving_for_a_group():
    assert ParallelConfig(pp=4, virtual_stages=2, vp_group=5).vp_group == 5
    with pytest.raises(InvalidParallelConfig, match="vp_group"):
        ParallelConfig(pp=4, virtual_stages=1, vp_group=5)
    with pytest.raises(InvalidParallelConfig, match="vp_group"):
        ParallelConfig(pp=4, schedule="1f1b", vp_group=5)
    with pytest.raises(InvalidParallelConfig):
        ParallelConfig(pp=4, virtual_stages=2, vp_group=0)


@pytest.fixture(scope="module")
def models():
    def make(framework: str, global_batch: int = 40):
        train = autopar.TrainingConfig(global_batch_size=global_batch, seq_len=2048,
                                       micro_batch_size=1, framework=framework)
        graph, _ = model_graph("llama3-8b", train)
        return CostModel(graph, autopar.Cluster.from_spec("1x8xH100-80GB"), train)
    return make


def test_a_larger_group_holds_more_activations_at_the_same_step_time(models):
    cm = models("megatron")   # m = 40 / (2 x 1) = 20 micro-batches, pp 4, v 2
    base = ParallelConfig(tp=1, pp=4, dp=2, virtual_stages=2, micro_batch_size=1,
                          zero_stage=1)
    default, g5, g10 = (cm.estimate(base.replace(vp_group=n)) for n in (None, 5, 10))
    assert cm.estimate(base.replace(vp_group=4)).stage_memory_bytes == default.stage_memory_bytes
    assert all(a < b < c for a, b, c in zip(default.stage_memory_bytes, g5.stage_memory_bytes,
                                            g10.stage_memory_bytes))
    assert g10.step_time_s == pytest.approx(default.step_time_s)
    assert g10.config.vp_group == 10


def test_a_group_makes_a_micro_batch_count_runnable_that_pp_does_not_divide(models):
    cm = models("megatron", global_batch=44)   # m = 22
    base = ParallelConfig(tp=1, pp=4, dp=2, virtual_stages=2, micro_batch_size=1)
    with pytest.raises(InvalidParallelConfig, match="multiple of pp=4"):
        cm.estimate(base)
    assert cm.estimate(base.replace(vp_group=6)).step_time_s > 0   # 6 + 6 + 6 + 4
    with pytest.raises(InvalidParallelConfig, match="fewer than pp=4"):
        cm.estimate(base.replace(vp_group=5))                         # 5 x 4 + 2


def test_only_megatron_sets_the_group(models):
    assert get_profile("megatron").vp_group_tunable
    assert get_profile("nemo").vp_group_tunable
    assert not get_profile("megatron-2023").vp_group_tunable
    e = models("torch").estimate(ParallelConfig(tp=1, pp=4, dp=2, virtual_stages=2,
                                                micro_batch_size=1, vp_group=5))
    assert any("sets the micro-batch groups of its interleaved schedule itself" in w
               for w in e.warnings)


def test_megatron_args_in_plan_file_and_megatron_args_out(models, tmp_path):
    args = ("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --num-layers 32 "
            "--num-layers-per-virtual-pipeline-stage 4 "
            "--microbatch-group-size-per-virtual-pipeline-stage 10 --micro-batch-size 1 "
            "--global-batch-size 40 --seq-length 2048 --bf16")
    imp = from_megatron_args(args)
    assert imp.parallel["vp_group"] == 10 and imp.parallel["virtual_stages"] == 2
    ignored = from_megatron_args("--pipeline-model-parallel-size 4 "
                                 "--microbatch-group-size-per-virtual-pipeline-stage 10")
    assert "vp_group" not in ignored.parallel
    assert any("ignored" in n for n in ignored.notes)

    plan = autopar.optimize("llama3-8b", "1x8xH100-80GB",
                            autopar.TrainingConfig(global_batch_size=40, seq_len=2048,
                                                   framework="megatron"),
                            fixed=dict(tp=1, pp=4, dp=2, virtual_stages=2, micro_batch_size=1,
                                       vp_group=10))
    assert plan.config.vp_group == 10
    d = json.loads(plan.to_json())
    assert d["version"] == 5 and d["config"]["vp_group"] == 10
    assert autopar.Plan.from_json(plan.to_json()).config == plan.config
    d["version"], old = 4, dict(d["config"])
    del d["config"]["vp_group"]
    assert autopar.Plan.from_json(json.dumps(d)).config.vp_group is None   # v4: the default
    d["config"] = old
    from autopar.runtime.export import to_megatron_args
    out = to_megatron_args(plan).value
    i = out.index("--microbatch-group-size-per-virtual-pipeline-stage")
    assert out[i + 1] == "10"
    # stacks whose interleaved schedule takes its own rounds drop the group, saying so
    from autopar.runtime.export import to_megatron_bridge, to_torchtitan_toml
    titan = to_torchtitan_toml(plan)
    assert titan.written.vp_group is None
    assert any(w.startswith("vp_group 10: torchtitan sets the micro-batch groups")
               for w in titan.warnings)
    bridge = to_megatron_bridge(plan).value
    assert "microbatch_group_size_per_vp_stage" in str(bridge)


def test_the_search_groups_micro_batches_where_pp_does_not_divide_them():
    """22 micro-batches on pp 4: Megatron-LM interleaves them in groups of 6 (6 + 6 + 6 + 4, the
    smallest group it accepts); torch's interleaved 1F1B cannot (22 is no multiple of its rounds
    22 // 4 = 5)."""
    from autopar.search.space import vp_group_option
    megatron, torch = get_profile("megatron"), get_profile("torch")
    assert vp_group_option(4, 22, {}, megatron) == 6
    assert vp_group_option(4, 20, {}, megatron) is None          # pp divides: the default
    assert vp_group_option(4, 22, {}, torch) is None
    assert vp_group_option(4, 22, {"vp_group": 11}, torch) == 11  # pinned is pinned
    fixed = dict(tp=1, pp=4, dp=2, micro_batch_size=1)

    def best(framework):
        train = autopar.TrainingConfig(global_batch_size=44, seq_len=2048, framework=framework)
        return autopar.optimize("llama3-8b", "1x8xH100-80GB", train, fixed=fixed,
                                objective="fastest").config
    c = best("megatron")
    assert c.schedule == "interleaved-1f1b" and c.virtual_stages > 1 and c.vp_group == 6
    t = best("torch")   # a V-shaped or one-chunk schedule, never interleaved 1F1B here
    assert t.vp_group is None and t.schedule != "interleaved-1f1b"


def test_plan_apply_refuses_a_group():
    from autopar.runtime.errors import UnsupportedPlanError
    from autopar.runtime.validate import check_plan
    plan = autopar.optimize("llama3-8b", "1x8xH100-80GB",
                            autopar.TrainingConfig(global_batch_size=40, seq_len=2048,
                                                   framework="megatron"),
                            fixed=dict(tp=1, pp=4, dp=2, virtual_stages=2, micro_batch_size=1,
                                       vp_group=10))
    with pytest.raises(UnsupportedPlanError, match="vp_group=10"):
        check_plan(plan)


def test_the_plan_command_names_the_group_it_chose(capsys):
    from autopar.cli import main
    assert main(["plan", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB", "--framework",
                 "megatron", "--global-batch", "44", "--seq-len", "2048", "--tp", "1", "--pp",
                 "4", "--micro-batch", "1", "--objective", "fastest"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # the interleaving depth the search picks moves with the host time of the stage edges'
    # small layers (Megatron-Core's per-kernel rate); the group is named whatever it is
    assert "interleaved-1f1b, v=" in out and "6 micro-batches per chunk in" in out
