"""Issue 26: DeepSeek's bidirectional DualPipe as a schedule: DualPipeV's order on the same
ranks (the same bubble up to the stage size), with each stage's parameters on two ranks and its
activations counted along DualPipe's own step (pp + 1 stages, deepseek-ai/DualPipe README)."""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar.config import SCHEDULES
from autopar.cost.model import CostModel
from autopar.errors import InvalidParallelConfig
from autopar.runtime.errors import UnsupportedPlanError
from autopar.problem import model_graph
from autopar.runtime.validate import check_schedule

TRAIN = autopar.TrainingConfig(global_batch_size=32, seq_len=32, micro_batch_size=1)
BASE = dict(tp=1, pp=2, dp=4, zero_stage=1, recompute="none")


# a stack that runs both (torch's profile with DualPipe added), so only the schedule differs
BOTH = dataclasses.replace(autopar.frameworks.get_profile("torch"), schedules=SCHEDULES)


def _estimate(schedule: str):
    graph, _ = model_graph("tiny-llama", TRAIN)
    cm = CostModel(graph, autopar.Cluster.from_spec("1x8xH100"), TRAIN, framework=BOTH)
    return cm.estimate(autopar.ParallelConfig(**BASE, schedule=schedule))


def test_dualpipe_times_as_dualpipev_and_keeps_two_parameter_copies():
    v, d = _estimate("dualpipev"), _estimate("dualpipe")
    assert d.config.virtual_stages == 2
    assert d.time_breakdown.bubble == pytest.approx(v.time_breakdown.bubble, rel=1e-9)
    b_v, b_d = v.memory_breakdown, d.memory_breakdown
    assert b_d.weights == pytest.approx(2 * b_v.weights)
    assert b_d.gradients == pytest.approx(2 * b_v.gradients)
    assert b_d.optimizer_states == pytest.approx(2 * b_v.optimizer_states)


def test_dualpipe_is_what_only_its_stack_runs():
    with pytest.raises(InvalidParallelConfig, match="2 chunks"):
        autopar.ParallelConfig(**BASE, schedule="dualpipe", virtual_stages=3)
    assert "dualpipe" not in autopar.frameworks.get_profile("torch").schedules
    assert "dualpipe" not in autopar.frameworks.get_profile("torchtitan").schedules
    assert "dualpipe" in autopar.frameworks.get_profile("inhouse-2024").schedules
    with pytest.raises(UnsupportedPlanError, match="dualpipev"):
        check_schedule("dualpipe", 2, 2, 8)
    # the default search never returns a schedule plan.apply cannot run
    plan = autopar.optimize("tiny-llama", "1x8xH100", TRAIN, fixed=dict(pp=2))
    assert plan.config.schedule != "dualpipe"


def test_pinning_a_schedule_the_framework_lacks_names_its_schedules():
    with pytest.raises(autopar.AutoparError, match="torch does not run the pipeline schedule "
                                                   "'dualpipe'.*inhouse-2024"):
        autopar.optimize("tiny-llama", "1x8xH100", TRAIN, fixed=dict(schedule="dualpipe"))


@pytest.mark.parametrize("pp", [2, 4, 8, 16])
def test_dualpipe_holds_pp_plus_one_stages(pp):
    """deepseek-ai/DualPipe README: "Activation Per Device" PP+1 for DualPipe on PP devices
    (one micro-batch through one stage each); its step is DualPipeV's on pp / 2 ranks with
    m / 2 micro-batches. A stage is two of the rank's V chunks, so the in-flight count in chunk
    units is 2 (pp + 1), where DualPipeV's own order on pp ranks holds 2 pp + 1."""
    from autopar.cost import memory as mem
    from autopar.cost.pipeline.orders import dualpipe_stage_peak
    for m in (2 * pp, 2 * pp + 1, 6 * pp):
        for r in range(pp):
            assert dualpipe_stage_peak(pp, m, r) == pp + 1
            assert mem.in_flight("dualpipe", r, pp, m, 2) == 2 * (pp + 1)
            assert mem.in_flight("dualpipev", r, pp, m, 2) == 2 * pp + 1
    with pytest.raises(ValueError, match="even"):
        dualpipe_stage_peak(3, 12, 0)
    with pytest.raises(ValueError, match="micro-batches"):
        dualpipe_stage_peak(pp, 2 * pp - 1, 0)


def test_dualpipe_caches_fp8_weights_of_both_copies():
    """Transformer Engine's FP8 weight cache (MemoryConventions.fp8_weight_cache_bytes) is per
    module: DualPipe's two copies of a stage are two modules, two caches."""
    from autopar.frameworks.memory import MEGATRON_MEMORY
    fp8 = dataclasses.replace(TRAIN, precision="fp8")
    graph, _ = model_graph("tiny-llama", fp8)
    cm = CostModel(graph, autopar.Cluster.from_spec("1x8xH100"), fp8,
                   framework=dataclasses.replace(BOTH, memory=MEGATRON_MEMORY))
    gathered = {}
    for schedule in ("dualpipev", "dualpipe"):
        c = cm.resolve(autopar.ParallelConfig(**BASE, schedule=schedule))
        gathered[schedule] = [st.gather_bytes for st in cm.stage_layout(c)]
    assert all(v > 0 for v in gathered["dualpipev"])
    assert gathered["dualpipe"] == pytest.approx([2 * v for v in gathered["dualpipev"]])
