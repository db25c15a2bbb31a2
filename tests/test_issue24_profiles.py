"""Issue 24 item 3: framework implementations as named choices, in the library.

Every profile is built from one named, sourced choice per mechanism; every stack the benchmark
scores is a selectable library profile; and ``benchmarks/`` builds no profile of its own."""

from __future__ import annotations

import ast
import json
from dataclasses import fields
from pathlib import Path

import pytest

import autopar
from autopar.cli import main
from autopar.config import FRAMEWORKS
from autopar.errors import InvalidTrainingConfig
from autopar.frameworks import PROFILES, get_profile, profile_edits, shard_within, with_edits
from autopar.frameworks.choices import (FSDP2, TORCH_COMPILE, Choices, OptimizerStep,
                                        ShardedDataParallel, with_choice)
from autopar.frameworks.profiles import COST_FIELDS, FSDP1_GRAD_COPY_PASSES
from autopar.frameworks.stacks import CHOICES
from autopar.frameworks.stacks.internevo import INTERNEVO_MEMORY
from autopar.frameworks.stacks.nemo import MEMORY as NEMO_MEMORY

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
#: Names whose presence in replace()'s first argument (or in what that name was assigned from)
#: marks it as a profile or memory conventions.
_PROFILE_WORDS = ("profile", "PROFILE", "memory", "MEMORY", "conventions", "MEGATRON", "TORCH",
                  "DEEPSPEED")


def profile_constructions(source: str) -> list[str]:
    """Calls in ``source`` that build a framework profile or memory conventions:
    ``FrameworkProfile(...)``, ``MemoryConventions(...)``, ``compose(...)``,
    ``.with_costs(...)``, and ``dataclasses.replace`` on a value that reads as a profile or
    conventions (its expression, or what the name was assigned from, names one)."""
    tree = ast.parse(source)
    assigned: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    assigned.setdefault(t.id, []).append(ast.unparse(node.value))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name in ("FrameworkProfile", "MemoryConventions", "compose", "with_costs"):
            found.append(ast.unparse(node)[:80])
        elif name == "replace" and node.args:
            first = node.args[0]
            texts = [ast.unparse(first)]
            if isinstance(first, ast.Name):
                texts += assigned.get(first.id, [])
            if any(w in t for t in texts for w in _PROFILE_WORDS):
                found.append(ast.unparse(node)[:80])
    return found


def test_the_checker_catches_each_way_of_building_a_profile():
    old = """
from dataclasses import replace
NEMO = replace(MEGATRON_MEMORY, grad_bytes=2)
a = MEGATRON.with_costs({"x": "y"}, overlap_dp_grad_reduce=True)
b = FrameworkProfile(name="x")
p = get_profile("torch")
c = replace(p, fusion="fused")
d = dataclasses.replace(record_profile(rec), fusion="fused")
m = MemoryConventions(grad_bytes=2)
ok = replace(rec.train, framework="nemo")
"""
    assert len(profile_constructions(old)) == 6
    assert profile_constructions("x = replace(rec.train, framework=name)\n"
                                 "cfg = replace(cfg, stage_blocks=cut)\n") == []


def test_benchmarks_construct_no_profile():
    """The corpus is scored through the public API only: a profile name, library options
    (with_choice, shard_within) and the profile's memory conventions."""
    offenders = {p.name: found for p in sorted(BENCHMARKS.rglob("*.py"))
                 if (found := profile_constructions(p.read_text()))}
    assert offenders == {}


def test_every_profile_is_built_from_one_sourced_choice_per_mechanism():
    assert tuple(PROFILES) == tuple(CHOICES) == FRAMEWORKS
    kinds = [f.name for f in fields(Choices)]
    for name, profile in PROFILES.items():
        choices = CHOICES[name]
        covered = [f for c in choices.each() for f in c.cost_fields()]
        assert sorted(covered) == sorted(COST_FIELDS)           # each field in one mechanism
        for field, value in choices.costs().items():
            assert getattr(profile, field) == value, (name, field)
            assert profile.cost_sources[field] == choices.cost_sources()[field]
        assert set(choices.names()) == set(kinds)
        assert all(c.summary and c.name for c in choices.each())


def test_a_choice_without_a_source_is_refused_with_its_fix():
    with pytest.raises(InvalidTrainingConfig, match="step_fixed_s needs a source"):
        OptimizerStep(name="x", summary="y", optimizer_step_bytes=40, step_fixed_s=0.0,
                      sources={"optimizer_step_bytes": "z"})
    with pytest.raises(InvalidTrainingConfig, match="not a field it sources"):
        ShardedDataParallel(**{**{f: getattr(FSDP2, f) for f in FSDP2.cost_fields()},
                               "name": "x", "summary": "y",
                               "sources": {**FSDP2.sources, "fusion": "z"}})


def test_the_published_stacks_are_library_profiles():
    fsdp1, foundry = get_profile("fsdp1"), get_profile("llm-foundry")
    assert fsdp1.zero_grad_copy_passes == FSDP1_GRAD_COPY_PASSES and not fsdp1.fsdp2_copies
    assert foundry.grad_reduce_bytes == 4 and foundry.attention_kernel("ampere") == "fa1"
    assert get_profile("tinyllama").fusion == "fused"
    assert get_profile("flash-attention-training").attention_kernel("ampere") == "fa1"
    nemo = get_profile("nemo")
    assert nemo.overlap_dp_grad_reduce and nemo.memory is NEMO_MEMORY
    assert nemo.memory.grad_bytes == 2
    assert get_profile("megatron").overlap_pp_p2p == ("interleaved-1f1b",)
    assert get_profile("megatron-2023").overlap_pp_p2p == ()
    assert "4eeff55d1f" in get_profile("megatron-2023").cost_sources["overlap_pp_p2p"]
    inhouse = get_profile("inhouse-2024")
    assert inhouse.overlap_dp_grad_reduce and not inhouse.fsdp2_copies
    assert "not published" in inhouse.cost_sources["overlap_dp_grad_reduce"]
    evo, evo_fsdp = get_profile("internevo"), get_profile("internevo-fsdp")
    assert evo.memory is INTERNEVO_MEMORY[1] and evo_fsdp.memory is INTERNEVO_MEMORY[3]
    assert evo.optimizer_step_bytes == 122 and evo.zero1_param_sync == "broadcast"
    # the layer split is the profile's: InternEvo puts the extra blocks on the last stages
    assert evo.split_stages(32, 5) == (6, 6, 6, 7, 7)
    assert evo.split_stages(32, 5, virtual_stages=2) is None
    assert get_profile("megatron").split_stages(32, 5) is None


def test_options_on_top_of_a_profile_travel_with_a_plan():
    hsdp = shard_within("fsdp1", 8)
    assert hsdp.zero1_group_size == 8 and "HYBRID_SHARD" in hsdp.cost_sources["zero1_group_size"]
    assert shard_within("internevo", 4).zero1_group_size == 4
    with pytest.raises(InvalidTrainingConfig, match="no option to shard within"):
        shard_within("torch", 8)
    compiled = with_choice(get_profile("fsdp1"), TORCH_COMPILE)
    assert compiled.fusion == "compile"
    edits = profile_edits(compiled)
    assert set(edits) == {"fusion"}
    assert with_edits("fsdp1", edits) == compiled


def test_a_published_stack_is_selectable_by_name():
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=32, framework="internevo")
    cfg = autopar.ParallelConfig(tp=1, pp=2, dp=4, zero_stage=1, micro_batch_size=1)
    by_name = autopar.estimate("tiny-llama", "1x8xA100-80GB", train, cfg)
    by_profile = autopar.estimate("tiny-llama", "1x8xA100-80GB",
                                  autopar.TrainingConfig(global_batch_size=16, seq_len=32),
                                  cfg, profile=get_profile("internevo"))
    assert by_name.step_time_s == pytest.approx(by_profile.step_time_s)
    plain = autopar.estimate("tiny-llama", "1x8xA100-80GB",
                             autopar.TrainingConfig(global_batch_size=16, seq_len=32), cfg)
    assert by_name.step_time_s != pytest.approx(plain.step_time_s)


def test_cli_plans_for_a_published_stack_and_writes_it_in_the_plan_file(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["plan", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB", "--global-batch",
               "16", "--seq-len", "32", "--framework", "nemo", "--json", "--out", str(out)])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["train"]["framework"] == "nemo"
    assert autopar.Plan.from_json(out).train.framework == "nemo"


def test_fsdp1_runs_no_zero1_and_its_search_never_plans_one():
    # torch.distributed.fsdp.ShardingStrategy has no optimizer-state-only sharding: the new-user
    # pass saw `--framework fsdp1` return zero_stage 1
    prof = get_profile("fsdp1")
    assert prof.zero_stages == (0, 2, 3) and 1 not in prof.zero_options(2, 2, 1, 1)
    assert "ShardingStrategy" in prof.sources["zero_stages"]
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=512, framework="fsdp1")
    plan = autopar.optimize("tiny-llama", autopar.Cluster.from_spec("2x8xH100"), train)
    assert all(e.config.zero_stage != 1 for e in (plan.estimate, *plan.alternatives))
    with pytest.raises(autopar.AutoparError, match="ZeRO-1"):
        autopar.optimize("tiny-llama", autopar.Cluster.from_spec("2x8xH100"), train,
                         fixed={"zero_stage": 1})
