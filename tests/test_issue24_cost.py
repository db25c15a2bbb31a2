"""Issue 24 item 2: the cost model split by question, typed breakdowns, and a graph priced only
at the sequence length it was measured at."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import autopar
from autopar import Plan
from autopar.api import model_graph
from autopar.cost.memory import MemoryBreakdown
from autopar.cost.model import CostModel
from autopar.cost.pipeline.timing import PipelineTiming
from autopar.cost.types import Estimate, GroupLinks, LinkComm, TimeBreakdown
from autopar.errors import InvalidPlanFile, InvalidTrainingConfig

TINY = dict(name="tiny", family="llama", num_layers=4, hidden_size=64, num_heads=4,
            vocab_size=128, seq_len=64)
COST = Path(autopar.__file__).parent / "cost"


def _train(seq_len: int = 64) -> autopar.TrainingConfig:
    return autopar.TrainingConfig(global_batch_size=16, seq_len=seq_len)


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel(model_graph(TINY, _train())[0], autopar.Cluster.from_spec("2x8xA100-80GB"),
                     _train())


def test_a_graph_at_another_sequence_length_is_refused_naming_both_and_the_fix():
    graph = model_graph(TINY, _train(32))[0]
    assert graph.seq_len == 32
    with pytest.raises(InvalidTrainingConfig) as info:
        CostModel(graph, autopar.Cluster.from_spec("1x8xA100-80GB"), _train(64))
    text = str(info.value)
    assert "seq_len=32" in text and "seq_len=64" in text
    assert "Fix: re-extract" in text and "TrainingConfig(seq_len=32)" in text


def test_rebuilding_at_another_sequence_length_is_refused(cm):
    with pytest.raises(InvalidTrainingConfig, match="seq_len=128"):
        cm.rebuilt(train=_train(128))
    assert cm.rebuilt(train=dataclasses.replace(cm.train, global_batch_size=32)).train \
        .global_batch_size == 32


def test_the_api_builds_the_graph_at_the_training_length():
    # the preset path grows the preset's positions to the training length: still priced
    e = autopar.estimate(TINY, "1x8xA100-80GB", _train(128), autopar.ParallelConfig(tp=2))
    assert e.step_time_s > 0


def test_breakdowns_are_records_that_add_up(cm):
    e = cm.estimate(autopar.ParallelConfig(tp=2, pp=2, dp=4, zero_stage=1))
    tb = e.time_breakdown
    assert isinstance(tb, TimeBreakdown) and isinstance(e.memory_breakdown, MemoryBreakdown)
    assert tb.total == pytest.approx(e.step_time_s, rel=1e-12)
    assert list(tb.as_dict()) == list(TimeBreakdown.names())
    assert all(isinstance(m, MemoryBreakdown) for m in e.stage_memory_breakdown)
    assert e.memory_breakdown is e.stage_memory_breakdown[e.peak_stage]
    assert e.memory_per_gpu_bytes == e.memory_breakdown.total
    assert [lc.link for lc in e.comm_by_link] == sorted(lc.link for lc in e.comm_by_link)
    assert all(isinstance(lc, LinkComm) and lc.dims for lc in e.comm_by_link)
    assert isinstance(e.group_links, GroupLinks) and e.group_links.tp == "nvlink"
    assert e.link_comm("no-such-link") == LinkComm("no-such-link", 0.0, 0.0, ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        tb.compute = 0.0


def test_the_step_time_less_dp_reads_the_record(cm):
    c = autopar.ParallelConfig(tp=1, pp=2, dp=8, zero_stage=3)
    fresh = cm.rebuilt()
    first = fresh.step_without_dp_s(c)
    tb = cm.estimate(c).time_breakdown
    assert first == cm.estimate(c).step_time_s - (tb.dp_comm_exposed + tb.overlap_slowdown
                                                  + tb.dp_copies)


def test_pipeline_timing_is_a_frozen_record(cm):
    c = cm.resolve(autopar.ParallelConfig(tp=1, pp=2, dp=8))
    pt = cm.pipeline.timing(c, cm.stage_layout(c))
    assert isinstance(pt, PipelineTiming) and len(pt.stage_fwd) == 2
    assert pt.stage_time[pt.bottleneck] == max(pt.stage_time)
    assert pt is cm.pipeline.timing(c.replace(zero_stage=2), cm.stage_layout(c))


def test_the_plan_json_layout_is_unchanged(cm):
    e = cm.estimate(autopar.ParallelConfig(tp=2, pp=2, dp=4))
    d = e.to_dict()
    assert tuple(d) == Estimate.JSON_KEYS
    assert d["time_breakdown"] == {k: getattr(e.time_breakdown, k) for k in TimeBreakdown.names()}
    assert d["comm_bytes_by_link"] == {lc.link: lc.nbytes for lc in e.comm_by_link}
    assert d["comm_seconds_by_link"] == {lc.link: lc.seconds for lc in e.comm_by_link}
    assert d["comm_dims_by_link"] == {lc.link: lc.dims for lc in e.comm_by_link}
    assert d["group_links"] == {"tp": "nvlink", "cp": "local", "pp": "infiniband", "dp": "nvlink",
                                "ep": "local"}
    assert d["stage_memory_breakdown"] == [m.as_dict() for m in e.stage_memory_breakdown]


@pytest.fixture(scope="module")
def plan_dict():
    plan = autopar.optimize(TINY, "1x8xA100-80GB", _train(),
                            fixed={"pp": 2, "virtual_stages": 1, "zero_stage": 1})
    return json.loads(plan.to_json())


def test_an_older_plan_file_without_the_newer_components_loads(plan_dict):
    d = json.loads(json.dumps(plan_dict))
    for e in (d["estimate"], *d["alternatives"]):
        for key in ("overlap_slowdown", "dp_copies", "fixed_step"):
            del e["time_breakdown"][key]
        e["comm_dims_by_link"] = None
        del e["group_links"]["ep"]
    plan = Plan.from_json(json.dumps(d))   # checked for form, then re-estimated
    assert plan.estimate.time_breakdown.absent == frozenset()
    assert plan.summary()
    # a stored breakdown read back keeps what it lacked out of what it writes
    old = d["alternatives"][0]["time_breakdown"]
    tb = TimeBreakdown.from_dict(old)
    assert tb.overlap_slowdown == tb.dp_copies == tb.fixed_step == 0.0
    assert tb.as_dict() == old and tb.total == pytest.approx(sum(old.values()))
    links = GroupLinks.from_dict({"dp": "infiniband", "tp": "nvlink"})
    assert links.as_dict() == {"dp": "infiniband", "tp": "nvlink"} and links.ep is None


def test_a_breakdown_with_an_unknown_component_is_refused(plan_dict):
    d = json.loads(json.dumps(plan_dict))
    d["estimate"]["time_breakdown"]["warp_drive"] = 1.0
    with pytest.raises(InvalidPlanFile, match=r"estimate.time_breakdown has unknown key"):
        Plan.from_json(json.dumps(d))


def test_cost_modules_are_small_and_costmodel_thin():
    sizes = {p.relative_to(COST).as_posix(): len(p.read_text().splitlines())
             for p in COST.rglob("*.py")}
    assert max(sizes.values()) <= 450, sizes
    assert sizes["model.py"] < 400


def test_a_plan_whose_model_name_was_edited_alone_is_refused(plan_dict):
    d = json.loads(json.dumps(plan_dict))
    if d.get("model_config") is None:
        pytest.skip("the fixture's plan has no model_config")
    d["model"] = "llama2-13b"
    with pytest.raises(InvalidPlanFile, match=r"model 'llama2-13b' but model_config describes 'tiny'"):
        Plan.from_json(json.dumps(d))
