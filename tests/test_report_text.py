"""What a person reads says what it means: micro-batches, plurals, bytes on the wire, presets."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

import autopar
from autopar.cli import main
from autopar.cost.params import CostParams
from autopar.report import tables
from autopar.report.summary import plural

TINY8 = autopar.Cluster.custom(1, 8, "A100-80GB")


def _plan(gbs: int, **fixed) -> autopar.Plan:
    return autopar.optimize("tiny-llama", TINY8, autopar.TrainingConfig(global_batch_size=gbs,
                                                                        seq_len=32), fixed=fixed)


def _text(table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


def test_summary_says_what_the_micro_batches_are():
    # was "micro-batches    4 of 2 per step (gradient accumulation 4)"
    plan = _plan(16, pp=2, dp=2, tp=2, micro_batch_size=2)
    text = plan.summary()
    assert ("micro-batch      2 sequences, 4 per step per data-parallel replica (gradient "
            "accumulation x pipeline)") in text
    assert "of 2 per step" not in text and "stage(s)" not in text
    assert "pipeline         2 stages x " in text


def test_one_micro_batch_is_singular_everywhere():
    plan = _plan(8, pp=1, dp=8, tp=1, micro_batch_size=1)
    assert plan.estimate.num_micro_batches == 1
    table = _text(tables.degrees_table(plan.estimate))
    assert "1 micro-batch per step" in table and "1 micro-batches" not in table  # was plural
    assert "1 sequence " in table
    assert "1 sequence, 1 per step per data-parallel replica (no gradient accumulation)" \
        in plan.summary()
    assert plural(1, "mesh", "meshes") == "1 mesh" and plural(3, "GPU") == "3 GPUs"


def test_communication_is_bytes_on_the_wire_and_says_so():
    # ZeRO-0 over 8 GPUs: one ring all-reduce of the gradients per step. Each GPU sends
    # 2(n-1)/n = 1.75 x the message; the table used to show the message (1 x).
    plan = _plan(8, pp=1, dp=8, tp=1, micro_batch_size=1, zero_stage=0)
    message = autopar.models.get_config("tiny-llama").num_parameters * CostParams().grad_bytes
    assert plan.estimate.link_comm("nvlink").nbytes == pytest.approx(1.75 * message, rel=1e-12)
    table = _text(tables.comm_table(plan.estimate))
    assert "sent on the wire, GB" in table and "seconds (before overlap)" in table
    assert "bytes on the wire" in plan.summary()


def test_models_lists_size_and_shape(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for text in ("parameters", "KV heads", "vocabulary", "context", "llama2-70b", "69.0B",
                 "128,256", "8,192"):
        assert text in out, text
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    r = rows["llama2-70b"]
    assert (r["layers"], r["hidden"], r["heads"], r["kv_heads"], r["vocabulary"],
            r["context_length"]) == (80, 8192, 64, 8, 32000, 4096)
    built = autopar.models.build("llama2-70b")   # meta device: shapes only
    assert r["parameters"] == sum(p.numel() for p in built.parameters()) == 68_976_648_192


@pytest.mark.parametrize("name", ["tiny-gpt", "gpt-1.7b", "llama3-8b"])
def test_parameter_count_matches_the_built_module(name):
    built = autopar.models.build(name)
    assert autopar.models.get_config(name).num_parameters == sum(
        p.numel() for p in built.parameters())


def test_pipeline_bytes_are_what_each_rank_sends():
    # pp=2 across two nodes (dp=4 inside each): rank 0 sends each micro-batch's activation
    # [1, 32, 64] bf16 forward, rank 1 its gradient backward; either way one GPU sends 2 x 4096
    # bytes over InfiniBand. Both directions used to be charged to rank 0 (16,384) and none to
    # the last rank (0 GB "used by pp").
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=32)
    plan = autopar.optimize("tiny-llama", autopar.Cluster.custom(2, 4, "A100-80GB"), train,
                            fixed=dict(pp=2, dp=4, tp=1, micro_batch_size=1, zero_stage=0,
                                       virtual_stages=1, placement=("tp", "cp", "dp", "pp")))
    e = plan.estimate
    assert e.group_links.pp == "infiniband" and e.group_links.dp == "nvlink"
    assert e.num_micro_batches == 2  # 8 sequences over dp=4, one per micro-batch
    assert e.link_comm("infiniband").nbytes == pytest.approx(2 * 32 * 64 * 2)


def test_config_diff_names_what_per_block_values_are():
    # the alternatives table read "recompute per-block->per-block" when two per-block
    # assignments differed, and stage cuts were also called "per-block"
    from autopar.config import ParallelConfig
    from autopar.report.explain import config_diff

    a = ParallelConfig(tp=1, pp=2, dp=1, micro_batch_size=1, zero_stage=0,
                       recompute=("full", "full", "none", "none"), stage_blocks=(2, 2))
    b = ParallelConfig(tp=1, pp=2, dp=1, micro_batch_size=1, zero_stage=0,
                       recompute=("full", "none", "none", "none"), stage_blocks=(1, 3))
    diff = config_diff(a, b)
    assert "recompute 2 full+2 none->1 full+3 none" in diff
    assert "cuts 2/2->1/3" in diff


def test_config_diff_names_every_field_that_differs():
    # plans differing only in ep (or reshard_after_forward) were listed as "same"
    from autopar.config import ParallelConfig
    from autopar.report.explain import config_diff
    a = ParallelConfig(tp=1, dp=8, ep=1, zero_stage=3)
    assert config_diff(a, ParallelConfig(tp=1, dp=8, ep=2, zero_stage=3)) == ["ep 1->2"]
    kept = ParallelConfig(tp=1, dp=8, ep=1, zero_stage=3, reshard_after_forward=(True, False))
    # in the plan table's words and count (blocks kept gathered); was "reshard default->1/2
    # blocks", which counted the blocks that reshard
    assert config_diff(a, kept) == ["FSDP keeps 0->1 of 2 blocks gathered"]
    assert config_diff(kept, a) == ["FSDP keeps 1->0 of 2 blocks gathered"]
    assert config_diff(a, a) == []


def test_a_compute_difference_names_the_work_split_before_the_recomputation():
    # the new-user pass of 2026-12-07 (second): "+9.64 s of compute (recompute 9 selective+71
    # none vs 12 selective+68 none)" blamed more compute on less recomputation, where the
    # plans also differed in tp and cp
    from autopar.api import model_graph
    from autopar.cost.model import CostModel
    from autopar.report.explain import compare
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096)
    cm = CostModel(model_graph("llama3-8b", train)[0], autopar.Cluster.from_spec("1x8xH100"),
                   train)
    base = cm.estimate(autopar.ParallelConfig(tp=2, dp=4, recompute="full"))
    other = cm.estimate(autopar.ParallelConfig(tp=4, dp=2, recompute="selective"))
    words = {d.component: d.words for d in compare(base, other, "x").time}["compute"]
    assert words == "compute (tp 4 vs 2, dp 2 vs 4, recompute selective vs full)"
    same = cm.estimate(autopar.ParallelConfig(tp=2, dp=4, recompute="selective"))
    words = {d.component: d.words for d in compare(base, same, "x").time}["compute"]
    assert words == "compute (recompute selective vs full)"


def test_long_stage_cuts_are_shown_as_runs():
    from autopar.config import ParallelConfig
    from autopar.report.explain import config_diff
    a = ParallelConfig(pp=16, stage_blocks=(2,) * 16)
    b = ParallelConfig(pp=16, stage_blocks=(1,) + (2,) * 14 + (3,))
    assert config_diff(a, b) == ["cuts 2*16->1/2*14/3"]


def test_plans_that_keep_fsdp_blocks_gathered_say_so():
    from types import SimpleNamespace

    from autopar.report.summary import config_text, reshard_text
    kept = autopar.ParallelConfig(dp=8, zero_stage=3, reshard_after_forward=(False,) * 3 + (True,))
    assert reshard_text(kept) == "FSDP keeps 3 of 4 blocks gathered forward to backward"
    assert config_text(kept).endswith("(FSDP keeps 3 of 4 blocks gathered forward to backward)")
    for c in (autopar.ParallelConfig(dp=8, zero_stage=3),
              autopar.ParallelConfig(dp=8, zero_stage=3, reshard_after_forward=(True,) * 4),
              SimpleNamespace(zero_stage=1)):
        assert reshard_text(c) == ""


def test_summary_names_the_rank_each_pipeline_chunk_runs_on():
    # a new user's trial: Plan.summary listed "chunk 0..7" where the CLI table says "rank"
    from autopar.cost.pipeline.orders import stage_rank
    plan = _plan(64, pp=2, virtual_stages=2, schedule="interleaved-1f1b")
    c = plan.config
    lines = [line.strip() for line in plan.summary().splitlines()
             if line.strip().startswith("chunk ")]
    assert len(lines) == c.pp * c.virtual_stages
    for ci, line in enumerate(lines):
        assert line.startswith(f"chunk {ci} (rank {stage_rank(ci, c.pp, c.schedule)}): blocks ")


def test_an_unvalidated_regime_says_what_a_band_needs_in_one_threshold():
    from autopar.cost.regime import MIN_RECORDS, VALIDATED_RUNS, VALIDATED_SOURCES, ErrorBand
    band = ErrorBand(half_width=None, bias=None, records=0, sources=0,
                     cell=("torch", "bf16", "hopper", "data", "dense", "1 node", "<3B"),
                     quantile=0.6827, measured_range=None)
    text = band.describe()
    assert f"at most {MIN_RECORDS - 1} published runs, where a band needs at least " \
           f"{VALIDATED_RUNS} runs from {VALIDATED_SOURCES} sources" in text
    assert "fewer than" not in text
