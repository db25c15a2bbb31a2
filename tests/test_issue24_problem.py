"""Issue 24 item 1: one problem layer (model -> graph -> cost model) for every caller; the plan is
data; the searches the report and the exports show are above them (autopar.alternatives); the
CLI in modules of one job each. The import rules themselves are tests/test_layout.py's."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autopar
from autopar import hooks
from autopar.alternatives import named_alternatives, nearest
from autopar.api import search_plan
from autopar.errors import InvalidModelConfig, InvalidPlanFile
from autopar.frameworks import get_profile
from autopar.models import get_config
from autopar.problem import Problem, model_config_of, model_graph, plan_cost_model

ROOT = Path(__file__).resolve().parents[1]
TRAIN = autopar.TrainingConfig(global_batch_size=16, seq_len=32)
CLUSTER = "1x8xA100-80GB"


def test_a_problem_is_frozen_and_its_parts_are_its_cost_models():
    p = Problem.build("tiny-llama", CLUSTER, TRAIN, memory_margin=0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.memory_margin = 0.2
    cm = p.cost_model
    assert (p.graph, p.cluster, p.train, p.params, p.profile) == (
        cm.graph, cm.cluster, cm.train, cm.params, cm.profile)
    assert p.profile.name == "torch" and p.cluster.world_size == 8
    assert p.model_config == get_config("tiny-llama").to_dict()
    assert p.memory_margin == 0.1


def test_every_form_of_a_model_reaches_one_graph():
    """A preset name, its dict and its ModelConfig extract one graph (the problem layer's
    cache), which the api, a plan file's re-estimate and an export's verdict all use."""
    cfg = get_config("tiny-llama")
    graphs = [model_graph(m, TRAIN)[0] for m in ("tiny-llama", cfg.to_dict(), cfg)]
    assert graphs[0] is graphs[1] is graphs[2]
    cm = plan_cost_model(cfg.to_dict(), CLUSTER, TRAIN)
    assert cm.graph is graphs[0]
    assert Problem.build(cfg, CLUSTER, TRAIN).graph is graphs[0]


def test_the_api_estimates_through_the_problem_layer():
    config = autopar.ParallelConfig(tp=2, dp=4)
    assert autopar.estimate("tiny-llama", CLUSTER, TRAIN, config) == \
        Problem.build("tiny-llama", CLUSTER, TRAIN).estimate(config)
    assert Problem.build("tiny-llama", CLUSTER, TRAIN).estimate({"tp": 2, "dp": 4}) == \
        Problem.build("tiny-llama", CLUSTER, TRAIN).estimate(config)


def test_model_config_of_is_public_and_says_what_it_takes():
    assert model_config_of("tiny-llama") == get_config("tiny-llama")
    assert model_config_of("hf-tiny-llama") is None            # traced from its module
    assert model_config_of(torch.nn.Linear(2, 2)) is None
    with pytest.raises(InvalidModelConfig, match="nn.Module, a preset name"):
        model_config_of(3)


def test_a_plan_file_without_its_model_names_what_to_pass():
    with pytest.raises(InvalidPlanFile, match="model=module"):
        plan_cost_model(None, CLUSTER, TRAIN, name="my-module")
    with pytest.raises(InvalidPlanFile, match="cluster="):
        plan_cost_model(get_config("tiny-llama").to_dict(), "my-cluster", TRAIN)


def test_every_service_a_lower_layer_calls_is_provided_by_the_package():
    assert hooks.provided() == set(hooks.SERVICES)
    with pytest.raises(KeyError, match="unknown service"):
        hooks.provide("nope", print)


def test_the_plan_module_loads_no_report_runtime_or_reestimate():
    """A plan is data: importing it loads none of the layers its methods reach through hooks."""
    code = ("import json, sys, autopar.plan\n"
            "print(json.dumps([m for m in ('autopar.report', 'autopar.runtime', "
            "'autopar.reestimate', 'autopar.api', 'autopar.alternatives', 'autopar.calibrate') "
            "if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_a_plan_keeps_its_methods_and_its_loading_re_estimates(tmp_path):
    plan = autopar.optimize("tiny-llama", CLUSTER, TRAIN, top_k=1)
    from autopar.report.summary import plan_summary
    assert plan.summary() == plan_summary(plan) and "MFU" in plan.summary()
    path = tmp_path / "plan.json"
    plan.to_json(path)
    d = json.loads(path.read_text())
    d["estimate"]["step_time_s"] = 123.0          # a written number is never trusted
    loaded = autopar.Plan.from_dict(d)
    assert loaded.estimate == plan.estimate and loaded.to_json() == plan.to_json()
    assert "--tensor-model-parallel-size" in " ".join(plan.to_megatron_args().value)


def test_explains_searches_and_the_nearest_plan_are_above_report_and_runtime():
    import autopar.report.explain as explain
    import autopar.runtime.verdict as verdict
    for name in ("search_plan", "best_under", "named_alternatives"):
        assert not hasattr(explain, name)
    assert not hasattr(verdict, "nearest")
    problem = Problem.build("tiny-llama", CLUSTER, TRAIN)
    plan, result = search_plan(problem, top_k=2)
    assert plan.estimate == result.best
    comps, skipped = named_alternatives(problem, plan)
    assert comps and all(c.base == plan.estimate for c in comps)
    assert all(isinstance(s, str) for s in skipped)
    mega = Problem.build("tiny-llama", CLUSTER, TRAIN, framework=get_profile("megatron"))
    line = nearest(mega.cost_model, "megatron", plan.estimate)
    assert line.startswith("nearest plan megatron can run: ") and "s per step" in line


def test_cli_modules_are_small_and_keep_one_job():
    cli = ROOT / "autopar" / "cli"
    sizes = {p.name: len(p.read_text().splitlines()) for p in cli.glob("*.py")}
    assert {"parser.py", "inputs.py", "output.py", "exports.py", "commands.py"} <= set(sizes)
    assert max(sizes.values()) < 400, sizes
