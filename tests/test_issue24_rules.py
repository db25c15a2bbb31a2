"""Issue 24 item 4: one rules module (``autopar.frameworks.rules``) that every check uses.

The search space yields only layouts the rules accept; the cost model's ``resolve`` refuses a
layout exactly when a rule does, naming that rule; and a layout breaking a rule is refused by
``resolve``, the plan-file check and the runtime check with the same rule name."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

import autopar
from autopar.config import ParallelConfig, TrainingConfig
from autopar.cost.resolve import resolve
from autopar.errors import InvalidParallelConfig, InvalidPlanFile
from autopar.frameworks import get_profile, rules
from autopar.io.planfile import check_plan as check_plan_file
from autopar.runtime import UnsupportedPlanError, check_plan
from autopar.runtime.validate import check_schedule
from autopar.search import space


def _graph(heads: int, kv: int, blocks: int, experts: int = 0):
    """What the space and resolve read of a model graph."""
    return SimpleNamespace(attention_heads=heads, kv_heads=kv, num_blocks=blocks,
                           num_experts=experts)


def _cluster(nodes: int, per_node: int):
    return SimpleNamespace(world_size=nodes * per_node, gpus_per_node=per_node)


def _broken(c: ParallelConfig, graph, cluster, train: TrainingConfig, profile, limits
            ) -> list[rules.Violation]:
    """Every rule of :mod:`autopar.frameworks.rules` the layout ``c`` breaks."""
    dp, world = c.dp, cluster.world_size
    v = c.virtual_stages or 1
    mbs = c.micro_batch_size
    m = train.global_batch_size // (dp * mbs) if train.global_batch_size % (dp * mbs) == 0 else 0
    sched = c.schedule or ("interleaved-1f1b" if v > 1 else "1f1b")
    found = [
        rules.mesh_size(world, c.tp, c.pp, c.cp, dp),
        rules.tp_heads(c.tp, graph.attention_heads, graph.kv_heads, profile.kv_heads_below_tp),
        None if limits.tp_across_nodes else rules.tp_node(c.tp, cluster.gpus_per_node),
        rules.ulysses_heads(c.tp, c.cp, graph.attention_heads, graph.kv_heads, c.cp_mode),
        rules.cp_seq(c.cp, train.seq_len),
        rules.seq_split(profile, train.seq_len, c.tp, c.cp, c.sequence_parallel),
        rules.batch_split(train.global_batch_size, dp, mbs),
        rules.pp_blocks(c.pp, v, graph.num_blocks),
    ]
    if c.folded:
        found += [rules.expert_folding(c.ep, c.etp, c.tp * c.cp * dp, graph.num_experts),
                  rules.folding_sp(c.etp, c.tp, c.sequence_parallel)]
    else:
        found += [rules.ep_needs_moe(c.ep, graph.num_experts),
                  rules.ep_split(c.ep, dp, graph.num_experts)]
    if graph.num_experts:
        found.append(rules.moe_sp(profile, c.tp, c.sequence_parallel))
    if c.pp > 1 and m:
        found += [rules.schedule_chunks(sched, v), rules.pipeline_fill(sched, c.pp * v, m)]
        if sched == "interleaved-1f1b":
            found.append(rules.interleave_fill(c.pp, v, m, c.vp_group))
        if sched.startswith("interleaved"):
            found.append(rules.schedule_rounds(sched, c.pp, m))
    return [x for x in found if x is not None]


def _space(graph, cluster, train: TrainingConfig, profile, limits):
    """Every layout the search space yields (degrees, micro-batch, schedule, experts, SP, CP
    mode), as :class:`ParallelConfig`."""
    fixed: dict = {}
    moe = graph.num_experts > 0
    for tp, cp, pp, dp in space.meshes(graph, cluster, train, fixed, limits, profile):
        for mbs in space.micro_batches(train, dp, fixed, limits, pp):
            m = train.global_batch_size // (dp * mbs)
            for sched, v in space.schedule_options(pp, graph.num_blocks, m, fixed, limits,
                                                   profile):
                for ep, etp in space.expert_options(graph, tp, cp, dp, fixed, profile,
                                                    cluster.gpus_per_node):
                    for sp in space.sequence_parallel_options(tp, fixed, profile,
                                                              train.seq_len, cp, moe):
                        base = dict(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep)
                        for mode in space.cp_modes(graph, base, fixed, profile):
                            # the micro-batch group the search takes (search/phases.py)
                            group = (space.vp_group_option(pp, m, fixed, profile) if v > 1
                                     else None)
                            yield ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep,
                                                 expert_tp=etp, micro_batch_size=mbs,
                                                 virtual_stages=v, schedule=sched,
                                                 sequence_parallel=sp, cp_mode=mode,
                                                 vp_group=group)


CASES = [
    # (model: heads, kv, blocks, experts), cluster (nodes, GPUs per node), train, framework
    ((64, 8, 80, 0), (4, 8), TrainingConfig(1024, 4096), "torch"),        # llama2-70b
    ((64, 8, 80, 0), (2, 8), TrainingConfig(96, 8192), "megatron"),
    ((32, 32, 32, 0), (1, 8), TrainingConfig(24, 2048), "torchtitan"),    # llama2-7b
    ((4, 2, 4, 0), (1, 8), TrainingConfig(16, 32), "torch"),              # tiny-llama
    ((32, 8, 12, 8), (2, 8), TrainingConfig(64, 4096), "megatron"),       # a MoE model
    ((32, 8, 12, 8), (1, 8), TrainingConfig(32, 4096), "torch"),
    ((96, 96, 6, 0), (1, 8), TrainingConfig(48, 6144), "deepspeed"),
]


@pytest.mark.parametrize("model, nodes, train, framework", CASES)
def test_the_search_space_yields_only_layouts_the_rules_accept(model, nodes, train, framework):
    graph, cluster, profile = _graph(*model), _cluster(*nodes), get_profile(framework)
    limits = space.SpaceLimits()
    train = dataclasses.replace(train, framework=framework)
    world = cluster.world_size
    n = 0
    for c in _space(graph, cluster, train, profile, limits):
        n += 1
        broken = _broken(c, graph, cluster, train, profile, limits)
        # MoE parallel folding under tp > 1 without SP is left to resolve (space.expert_options)
        assert [b.rule for b in broken] in ([], ["folding_sp"]), (c, broken)
        if broken:
            with pytest.raises(InvalidParallelConfig) as info:
                resolve(c, graph, world, train)
            assert info.value.rule == "folding_sp"
            continue
        r = resolve(c, graph, world, train)
        if not r.folded and r.vp_group is None:
            # the runtime runs every resolved layout but MoE parallel folding and Megatron-LM's
            # micro-batch groups
            check_plan(SimpleNamespace(config=r, train=train))
    assert n > 0


@pytest.mark.parametrize("model, nodes, train, framework", CASES[:5])
def test_resolve_refuses_exactly_what_the_rules_refuse(model, nodes, train, framework):
    """Every mesh of divisors (not only the legal ones): resolve raises iff a rule breaks, and
    names the first rule that does."""
    graph, cluster = _graph(*model), _cluster(*nodes)
    train = dataclasses.replace(train, framework=framework)
    profile, world = get_profile(framework), cluster.world_size
    limits = dataclasses.replace(space.SpaceLimits(), tp_across_nodes=True)
    for tp in space.divisors(world):
        for cp in space.divisors(world // tp):
            for pp in space.divisors(world // (tp * cp)):
                dp = world // (tp * cp * pp)
                for mbs in (1, 3):
                    c = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, micro_batch_size=mbs,
                                       sequence_parallel=tp > 1)
                    broken = _broken(c, graph, cluster, train, profile, limits)
                    # resolve leaves MoE under SP to the framework check (profile.unsupported)
                    # and the 1F1B fill to the runtime (the cost model prices such a step)
                    broken = [b for b in broken if b.rule not in ("moe_sp", "pipeline_fill")]
                    if not broken:
                        resolve(c, graph, world, train)
                        continue
                    with pytest.raises(InvalidParallelConfig) as info:
                        resolve(c, graph, world, train)
                    assert info.value.rule in {b.rule for b in broken}, (c, broken)
                    assert str(info.value) in {b.text for b in broken}


# -- a layout breaking a rule is refused by every check, with the same rule name ---------------
TINY = TrainingConfig(16, 32, precision="fp32")


@pytest.fixture(scope="module")
def plan():
    return autopar.optimize("tiny-llama", "1x8xA100-80GB", TINY,
                            fixed=dict(tp=2, pp=2, cp=1, zero_stage=3))


def _file_refusal(plan, train=None, **changes) -> str:
    d = json.loads(json.dumps(plan.to_dict()))
    d["config"].update(changes)
    d["train"].update(train or {})
    with pytest.raises(InvalidPlanFile) as info:
        check_plan_file(d)
    assert "Fix:" in str(info.value)
    return info.value.rule


def _runtime_refusal(plan, train=None, **changes) -> str:
    bad = dataclasses.replace(plan, config=plan.config.replace(**changes),
                              train=train or plan.train)
    with pytest.raises(UnsupportedPlanError) as info:
        check_plan(bad)
    return info.value.rule


def _resolve_refusal(plan, train=None, **changes) -> str:
    g = _graph(4, 2, 4)
    with pytest.raises(InvalidParallelConfig) as info:
        resolve(plan.config.replace(**changes), g, 8, train or plan.train)
    return info.value.rule


def test_the_same_broken_rule_is_named_by_resolve_the_plan_file_and_the_runtime(plan):
    c = plan.config
    assert (c.tp, c.pp, c.dp, c.micro_batch_size) == (2, 2, 2, 4)
    odd = dataclasses.replace(TINY, global_batch_size=12)
    # the micro-batch does not split the batch: all three
    assert _resolve_refusal(plan, micro_batch_size=3) == "batch_split"
    assert _file_refusal(plan, micro_batch_size=3) == "batch_split"
    assert _runtime_refusal(plan, micro_batch_size=3) == "batch_split"
    assert _runtime_refusal(plan, train=odd, dp=8, micro_batch_size=1) == "batch_split"
    # cp does not divide the sequence (32 tokens)
    seq = dataclasses.replace(TINY, seq_len=30)
    assert _resolve_refusal(plan, train=seq, cp=4, dp=None, tp=1, pp=2) == "cp_seq"
    assert _runtime_refusal(plan, train=seq, cp=4, dp=1, tp=1) == "cp_seq"
    assert _file_refusal(plan, train={"seq_len": 31}, cp=2, dp=1) == "cp_seq"
    # stage cuts: one per chunk
    assert _resolve_refusal(plan, stage_blocks=(4,)) == "stage_cuts"
    assert _file_refusal(plan, stage_blocks=[4]) == "stage_cuts"
    assert _runtime_refusal(plan, stage_blocks=(4,)) == "stage_cuts"
    assert _file_refusal(plan, stage_blocks=[1, 2]) == "stage_cuts"   # cover 3 of 4 blocks
    # the degrees and the GPUs; the heads
    assert _resolve_refusal(plan, dp=4) == "mesh_size"
    assert _file_refusal(plan, dp=4) == "mesh_size"
    assert _resolve_refusal(plan, tp=4, dp=1) == "tp_heads"
    assert _file_refusal(plan, tp=4, dp=1) == "tp_heads"
    # experts over data-parallel ranks
    assert _runtime_refusal(plan, ep=3) == "ep_split"
    moe = _graph(4, 2, 4, experts=6)
    with pytest.raises(InvalidParallelConfig) as info:
        resolve(plan.config.replace(ep=3), moe, 8, plan.train)
    assert info.value.rule == "ep_split"
    # the pipeline schedule
    assert _runtime_refusal(plan, micro_batch_size=8, virtual_stages=1, schedule="1f1b",
                            stage_blocks=None) == "pipeline_fill"
    with pytest.raises(UnsupportedPlanError) as info:
        check_schedule("dualpipev", 2, 2, 3)
    assert info.value.rule == "pipeline_fill"
    with pytest.raises(InvalidParallelConfig) as info:
        resolve(plan.config.replace(schedule="dualpipev", virtual_stages=2, micro_batch_size=8,
                                    stage_blocks=None), _graph(4, 2, 4), 8, plan.train)
    assert info.value.rule == "pipeline_fill"
    with pytest.raises(UnsupportedPlanError) as info:
        check_schedule("interleaved-zero-bubble", 4, 1, 9)
    assert info.value.rule == "schedule_rounds"
    with pytest.raises(UnsupportedPlanError) as info:
        check_schedule("zbv-zero-bubble", 2, 3, 8)
    assert info.value.rule == "schedule_chunks"


def test_the_plan_file_and_the_runtime_give_the_rules_text(plan):
    v = rules.batch_split(16, 2, 3)
    d = json.loads(json.dumps(plan.to_dict()))
    d["config"].update(micro_batch_size=3)
    with pytest.raises(InvalidPlanFile) as info:
        check_plan_file(d)
    assert v.problem in str(info.value) and v.fix in str(info.value)
    with pytest.raises(UnsupportedPlanError) as info:
        check_plan(dataclasses.replace(plan, config=plan.config.replace(micro_batch_size=3)))
    assert str(info.value) == v.text


def test_a_violation_is_a_frozen_record_of_a_known_rule():
    v = rules.cp_seq(3, 32)
    assert v == rules.Violation("cp_seq", "cp=3 does not divide the sequence length 32",
                                "a cp that divides it")
    assert v.text == "cp=3 does not divide the sequence length 32. Fix: a cp that divides it."
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.rule = "x"
    assert rules.cp_seq(4, 32) is None
    names = {rules.mesh_size(8, 3, 1, 1).rule, rules.tp_heads(3, 4, 2).rule,
             rules.tp_node(16, 8).rule, rules.ulysses_heads(2, 4, 4, 2).rule,
             rules.ep_needs_moe(2, 0).rule, rules.ep_split(3, 4, 8).rule,
             rules.expert_folding(3, 1, 8, 8).rule, rules.folding_sp(1, 2, False).rule,
             rules.deepep_ranks(1, 12).rule,
             rules.moe_sp(get_profile("torch"), 2, True).rule,
             rules.seq_split(get_profile("megatron"), 4098, 1, 2, False).rule,
             rules.batch_split(10, 4).rule, rules.pp_blocks(4, 2, 4).rule,
             rules.stage_cuts((1, 1), 1, 1).rule, rules.interleave_fill(4, 2, 6).rule,
             rules.schedule_rounds("interleaved-1f1b", 4, 9).rule,
             rules.pipeline_fill("1f1b", 4, 2).rule, rules.schedule_chunks("gpipe", 2).rule,
             rules.cp_seq(3, 32).rule}
    assert names == set(rules.RULES)


def test_framework_methods_delegate_to_the_rules():
    torch_ = get_profile("torch")
    v = rules.moe_sp(torch_, 2, True)
    assert torch_.moe_sp_violation(2, True) == f"{v.problem}; fix: {v.fix}"
    mega = get_profile("megatron")
    assert mega.seq_violation(4098, 1, 2, False) == rules.seq_split(mega, 4098, 1, 2, False).text
    assert mega.seq_violation(4096, 1, 2, False) is None
