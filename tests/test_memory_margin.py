"""memory_margin: the search keeps a fraction of each GPU's memory free for the memory model's
error (autopar.search.margin), and reports the plan against the GPU's real capacity."""

from __future__ import annotations

import math
import re

import pytest

import autopar
from autopar.cli import main

TRAIN = autopar.TrainingConfig(global_batch_size=64, seq_len=4096)
CLUSTER = "1x8xA100-40GB"


@pytest.fixture(scope="module")
def plans():
    # at no margin the plan fills 99.98% of the 42.5 GB an A100-40GB shows
    return {m: autopar.optimize("llama2-13b", CLUSTER, TRAIN, memory_margin=m)
            for m in (0.0, 0.1)}


def test_the_margin_is_kept_and_the_plan_reported_on_the_real_gpu(plans):
    free, tight = plans[0.1], plans[0.0]
    limit = tight.estimate.memory_limit_bytes
    assert free.estimate.memory_limit_bytes == limit          # the GPU's own capacity
    assert free.estimate.memory_per_gpu_bytes <= 0.9 * limit < tight.estimate.memory_per_gpu_bytes
    assert free.estimate.fits and free.search.memory_margin == 0.1
    # the tight plan says it may not fit and which margin to search with
    from autopar.search.margin import default_margin
    assert any("may not fit on the first try" in w
               and f"memory_margin >= {default_margin():g}" in w
               for w in tight.estimate.warnings), tight.estimate.warnings
    assert free.estimate.step_time_s >= tight.estimate.step_time_s   # room costs time, or nothing
    assert all(a.memory_per_gpu_bytes <= 0.9 * limit for a in (*free.alternatives, *free.pareto))
    # the same configuration estimated directly gives the same numbers
    again = autopar.estimate("llama2-13b", CLUSTER, TRAIN, free.config)
    assert again.step_time_s == free.estimate.step_time_s
    assert again.memory_per_gpu_bytes == free.estimate.memory_per_gpu_bytes


def test_the_margin_survives_the_plan_file(plans):
    loaded = autopar.Plan.from_json(plans[0.1].to_json())
    assert loaded.search.memory_margin == 0.1 and loaded.config == plans[0.1].config
    assert "memory_margin" not in plans[0.0].to_dict()["search"]   # old plans keep their bytes


@pytest.mark.parametrize("bad", [-0.1, 0.6, "10%", True])
def test_a_bad_margin_is_our_error(bad):
    with pytest.raises(autopar.InvalidSearchOption, match="memory_margin"):
        autopar.optimize("tiny-llama", CLUSTER, dict(global_batch_size=16, seq_len=64),
                         memory_margin=bad)


def test_infeasible_within_the_margin_says_so():
    with pytest.raises(autopar.InfeasibleError) as info:
        autopar.optimize("llama2-13b", CLUSTER, TRAIN, memory_margin=0.5)
    msg = str(info.value)
    assert "infeasible within memory_margin=0.5 (21.2 GB per GPU kept free" in msg, msg
    assert re.search(r"fills \d+\.\d% of the GPU's memory", msg) \
        and "memory_margin=0 (--memory-margin 0)" in msg
    assert "--optimizer-offload" in msg   # the changes that make room are still named
    # nothing fits without the margin either: that is the reason given, at the GPU's capacity
    with pytest.raises(autopar.InfeasibleError) as info:
        autopar.optimize("llama2-70b", CLUSTER, TRAIN)
    assert "no plan fits in 42 GB per A100-SXM4-40GB" in str(info.value)
    assert "margin" not in str(info.value)


def test_the_default_margin_is_the_measured_band():
    from autopar.cost import published
    from autopar.search.margin import default_margin
    from autopar.cost.regime import room_for
    assert default_margin() == room_for(published.MEMORY_BAND[4]) > 0
    # a problem with room under the measured band's margin (llama2-13b fills a 40 GB A100 to
    # the last byte at no margin: too tight for an 18% one)
    plan = autopar.optimize("llama2-13b", "1x8xA100-80GB", TRAIN)
    assert plan.search.memory_margin == default_margin()
    assert plan.estimate.memory_per_gpu_bytes <= (1 - default_margin()) * \
        plan.estimate.memory_limit_bytes
    assert not any("may not fit" in w for w in plan.estimate.warnings)


def test_cli_margin(capsys):
    code = main(["plan", "--model", "tiny-llama", "--cluster", CLUSTER, "--global-batch", "16",
                 "--seq-len", "64", "--memory-margin", "0.25"])
    out = capsys.readouterr().out
    assert code == 0 and "25% of each GPU's memory kept free" in out
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--model", "tiny-llama", "--cluster", CLUSTER, "--memory-margin", "2"])
    assert exc.value.code == 2 and "not a fraction" in capsys.readouterr().err


def test_mixtures_of_experts_keep_their_own_measured_margin():
    """The default margin is the measured band of the model's kind: a MoE plan keeps what MoE
    peaks missed by, a dense plan what dense peaks missed by (autopar.cost.regime.memory_band)."""
    from autopar.cost import published
    from autopar.search.margin import check_margin, default_margin
    for moe, band in ((False, published.MEMORY_BAND), (True, published.MOE_MEMORY_BAND)):
        short = band[4]
        assert default_margin(moe) == math.ceil(round(short / (1 + short) * 100, 6)) / 100
        # a plan at (1 - margin) of the GPU grown by that shortfall still fits; 1% less would not
        m = default_margin(moe)
        assert (1 - m) * (1 + short) <= 1 + 1e-9
        assert m == 0 or (1 - (m - 0.01)) * (1 + short) > 1
        assert check_margin(None, moe) == default_margin(moe)
    assert check_margin(0.05, True) == 0.05   # a chosen margin is kept whatever the kind
