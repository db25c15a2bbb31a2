"""How far to trust an estimate (issue 13 a, b): the error band of its regime and the
MFU-plausibility warning, both from tables generated from the published-run corpus
(`python -m benchmarks.bands --write`); the tables must match a new run over the corpus."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

import autopar
from autopar.cli import main
from autopar.cost import published
from autopar.cost.regime import (ANY, BAND_QUANTILE, LEVELS, MIN_RECORDS, VALIDATED_RUNS,
                                 VALIDATED_SOURCES, Regime, band_for, gpu_generation,
                                 mfu_ceiling, nearest_rank, plausibility_warnings,
                                 sharding_kind)
from autopar.report.summary import runner_up_note

H100 = autopar.Cluster.custom(1, 8, "H100-SXM5-80GB")
H100x2 = autopar.Cluster.from_spec("2x8xH100-80GB")


@pytest.fixture(scope="module")
def corpus_points():
    # the whole corpus estimated once (about a minute on one core)
    from benchmarks.bands import points
    pts, _ = points()
    return pts


def test_tables_are_the_corpus_output(corpus_points):
    from benchmarks.bands import COMMAND, TABLE, render
    assert TABLE.read_text() == render(corpus_points), (
        f"autopar/cost/published.py differs from the corpus: run `{COMMAND}`")


def test_each_band_covers_its_quantile_of_its_runs(corpus_points):
    for cell, (half, bias, n, sources) in published.BANDS.items():
        errs = [p.residual for p in corpus_points
                if all(c in (ANY, k) for c, k in zip(cell, p.key))
                and not (p.key[0] == ANY and cell[0] != ANY)]
        assert len(errs) == n >= MIN_RECORDS, cell
        inside = sum(abs(e) <= half + 1e-4 for e in errs)
        assert inside >= BAND_QUANTILE * n, cell
        assert abs(sum(errs) / n - bias) < 1e-4 and 1 <= sources <= n


def test_mfu_ceilings_are_the_best_measured(corpus_points):
    for (fw, prec, gpu, experts), (mfu, rid, _) in published.MFU_CEILINGS.items():
        mine = [p for p in corpus_points if p.key[1:3] == (prec, gpu) and p.key[4] == experts
                and fw in (ANY, p.key[0])]
        best = max(mine, key=lambda p: p.measured_mfu)
        assert round(best.measured_mfu, 4) == mfu and 0 < mfu < 1
        assert rid in {p.id for p in mine if round(p.measured_mfu, 4) == mfu}


@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=50))
def test_nearest_rank_is_a_value_covering_the_quantile(values):
    q = nearest_rank(values)
    assert q in values
    assert sum(v <= q for v in values) >= BAND_QUANTILE * len(values)
    assert sum(v < q for v in values) < BAND_QUANTILE * len(values)


def test_regimes_and_fallback():
    assert gpu_generation("A100-SXM4-80GB[memory_gib=40]") == "ampere"
    assert gpu_generation("H200-SXM-141GB") == "hopper"
    assert gpu_generation("GB200") == "blackwell" and gpu_generation("MI250X") == "mi250x"
    assert sharding_kind(8, 4, 1, 1) == "pipeline" and sharding_kind(1, 1, 2, 3) == "tensor"
    assert sharding_kind(1, 1, 1, 3) == "fsdp" and sharding_kind(1, 1, 1, 1) == "data"
    exact = Regime("torch", "bf16", "hopper", "fsdp", "dense", "2-64 nodes", "3-30B")
    b = band_for(exact)
    assert b.cell == exact.key() and b.validated                    # 18 runs of its own
    assert b.records >= VALIDATED_RUNS and b.sources >= VALIDATED_SOURCES
    # no torchtitan bf16 pipeline runs: unvalidated, no band borrowed from a coarser cell
    b = band_for(Regime("torchtitan", "bf16", "hopper", "pipeline", "dense", "2-64 nodes", "3-30B"))
    assert not b.validated and b.half_width is None and b.bias is None
    assert b.cell[1:4] == ("bf16", "hopper", "pipeline") and b.records == 0
    assert "unknown" in b.text() and "unvalidated regime" in b.describe()
    # a cell with runs but fewer than VALIDATED_RUNS (torch FSDP of 30-100B models on 2-64
    # Hopper nodes: 9 runs)
    few = Regime("torch", "bf16", "hopper", "fsdp", "dense", "2-64 nodes", "30-100B")
    row = published.BANDS.get(few.key())
    if row is not None and (row[2] < VALIDATED_RUNS or row[3] < VALIDATED_SOURCES):
        b = band_for(few)
        assert not b.validated and b.records == row[2] and str(row[2]) in b.describe()
    # an unknown GPU: unvalidated
    assert not band_for(Regime("megatron", "bf16", "mi250x", "pipeline", "dense", "1 node",
                               "<3B")).validated
    assert all(len(level) == 7 for level in LEVELS) and LEVELS[-1] == (False,) * 7


def test_plausibility_warning_above_the_best_published_only():
    r = Regime("megatron", "bf16", "hopper", "pipeline", "dense", ">64 nodes", ">100B")
    best = mfu_ceiling("megatron", "bf16", "hopper")
    assert best.cell == ("megatron", "bf16", "hopper", "dense")
    assert plausibility_warnings(best.mfu, r) == ()
    (w,) = plausibility_warnings(best.mfu + 0.01, r)
    assert best.record in w and "megatron" in w and "optimistic" in w
    # a framework with no fp16 Volta run: the best of any framework there, if any
    row = mfu_ceiling("torchtitan", "fp16", "volta")
    assert row is None or row.cell == (ANY, "fp16", "volta", "dense")
    assert plausibility_warnings(0.99, Regime("torch", "fp32", "volta", "data", "dense", "1 node",
                                              "<3B")) == ()


def test_a_dense_plan_is_not_held_to_a_mixture_of_experts_figure():
    # a dense bf16 plan on Blackwell was warned against the best MoE run there (Qwen3-30B-A3B,
    # 15.7%): an MoE step's all-to-alls and small expert GEMMs say nothing of a dense model's
    moe = mfu_ceiling("torchtitan", "bf16", "blackwell", "moe")
    assert moe is not None and moe.cell[3] == "moe"
    dense = mfu_ceiling("torchtitan", "bf16", "blackwell", "dense")
    assert dense is None or dense.cell[3] == "dense"
    r = Regime("torchtitan", "bf16", "blackwell", "fsdp-zero3", "dense", "1 node", "3-30B")
    assert all(moe.record not in w for w in plausibility_warnings(moe.mfu + 0.05, r))
    (w,) = plausibility_warnings(moe.mfu + 0.05, Regime(
        "torchtitan", "bf16", "blackwell", "fsdp-zero3", "moe", "1 node", "30-100B"))
    assert moe.record in w and "mixtures of experts" in w


@pytest.fixture(scope="module")
def megatron_8b_plan():
    """Llama 3 8B searched for Megatron on 8 H100 (global batch 64 x 4096), once for the
    module: a regime the corpus does not validate."""
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096, framework="megatron")
    return autopar.optimize("llama3-8b", H100, train)


@pytest.fixture(scope="module")
def fsdp_8b_plan():
    """Llama 3 8B under torch FSDP (ZeRO-3, no tp/pp) on 2 x 8 H100: torch x bf16 x Hopper x
    FSDP x dense x 2-64 nodes x 3-30B, a validated regime (18 runs of 4 sources; the same on one
    node has 14 runs of a single source)."""
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096)
    return autopar.optimize("llama3-8b", H100x2, train,
                            fixed={"tp": 1, "pp": 1, "cp": 1, "zero_stage": 3})


def test_every_estimate_carries_its_band_and_the_summary_prints_it(fsdp_8b_plan):
    plan = fsdp_8b_plan
    e = plan.estimate
    assert e.error_band is not None and e.error_band.validated
    assert 0 < e.error_band.half_width < 1
    assert e.error_band.cell == ("torch", "bf16", "hopper", "fsdp", "dense", "2-64 nodes", "3-30B")
    assert all(a.error_band is not None for a in plan.alternatives)
    text = plan.summary()
    assert f"{e.step_time_s:.3f} s {e.error_band.text()}" in text
    assert "published runs" in text
    d = json.loads(plan.to_json())
    assert d["estimate"]["error_band"]["half_width"] == e.error_band.half_width
    assert d["estimate"]["warnings"] == list(e.warnings)
    loaded = autopar.Plan.from_json(plan.to_json())          # re-estimated, same band
    assert loaded.estimate.error_band == e.error_band


def test_an_unvalidated_regime_says_so_and_borrows_no_band(megatron_8b_plan):
    """Issue 25 item 4: too few validating runs -> "± unknown", never a coarser cell's band."""
    plan = megatron_8b_plan
    band = plan.estimate.error_band
    assert not band.validated and band.half_width is None and band.bias is None
    assert band.cell[0] == "megatron"
    text = plan.summary()
    assert f"{plan.estimate.step_time_s:.3f} s ± unknown (unvalidated regime)" in text
    assert "unvalidated regime (megatron bf16 hopper" in text
    d = json.loads(plan.to_json())
    assert d["estimate"]["error_band"]["half_width"] is None
    assert autopar.Plan.from_json(plan.to_json()).estimate.error_band == band
    # no band, so no claim that the runner-up is inside it
    near = replace(plan.estimate, step_time_s=plan.estimate.step_time_s * 1.001)
    assert runner_up_note(plan.estimate, (near,)) is None


def test_runner_up_inside_the_band_is_reported(fsdp_8b_plan):
    plan = fsdp_8b_plan
    best, band = plan.estimate, plan.estimate.error_band
    near = replace(best, step_time_s=best.step_time_s * (1 + band.half_width / 2))
    far = replace(best, step_time_s=best.step_time_s * (1 + 2 * band.half_width))
    assert "inside the best plan's" in runner_up_note(best, (near,))
    assert runner_up_note(best, (far,)) is None and runner_up_note(best, ()) is None
    shown = replace(plan, alternatives=(near,)).summary()
    assert "cannot tell them apart" in shown
    assert "cannot tell" not in replace(plan, alternatives=(far,)).summary()


def test_cli_json_has_band_and_warnings(capsys):
    rc = main(["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100-80GB",
               "--global-batch", "64", "--seq-len", "4096", "--framework", "megatron",
               "--tp", "1", "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["error_band"]["cell"][0] == "megatron" and isinstance(d["warnings"], list)


@pytest.mark.parametrize("kind, band", [("dense", "MEMORY_BAND"), ("moe", "MOE_MEMORY_BAND")])
def test_memory_band_covers_its_quantile(corpus_points, kind, band):
    """Each model kind's memory band is its own runs' (dense models' peaks never widen by the
    mixtures of experts', nor the other way)."""
    from benchmarks.bands import memory_residuals
    half, bias, runs, worst, short = getattr(published, band)
    errs = memory_residuals(corpus_points, experts=kind)
    assert len(errs) == runs >= MIN_RECORDS
    assert sum(abs(e) <= half + 1e-4 for e in errs) >= BAND_QUANTILE * runs
    assert abs(sum(errs) / runs - bias) < 1e-4
    assert abs(max(1 / (1 + e) - 1 for e in errs) - worst) < 1e-4
    # the one-sided shortfall: BAND_QUANTILE of the runs' peaks at most that far above
    growth = [max(1 / (1 + e) - 1, 0.0) for e in errs]   # 0: at or below prediction
    assert sum(g <= short + 1e-4 for g in growth) >= BAND_QUANTILE * runs
    assert sum(g < short - 1e-4 for g in growth) < BAND_QUANTILE * runs
    assert 0 < len(errs) < len(memory_residuals(corpus_points))


def test_a_plan_without_room_for_the_memory_error_is_warned():
    from autopar.cost.regime import headroom_warnings
    short = published.MEMORY_BAND[4]
    limit = 80e9
    tight = limit / (1 + 0.5 * short)           # within the measured growth: warned
    roomy = limit / (1 + short) * 0.999         # that growth still fits
    assert headroom_warnings(tight, limit) and "may not fit on the first try" in \
        headroom_warnings(tight, limit)[0]
    assert headroom_warnings(roomy, limit) == ()
    assert headroom_warnings(limit * 1.01, limit) == ()   # does not fit: the verdict says so
