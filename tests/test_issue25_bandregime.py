"""Issue 25 items 1 and 4: an estimate's band is its own regime's, and the regime is the issue's
(framework x precision x GPU generation x sharding kind x dense/MoE x scale bucket x model size
bucket, :class:`autopar.cost.regime.Regime`): a 64M-parameter model's runs on one node, or dense
runs, never band a 405B plan on 128 nodes or a MoE plan."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import autopar
from autopar.cost import published, regime
from autopar.cost.regime import Regime, band_for, experts_kind, scale_bucket, size_bucket


@pytest.mark.parametrize("nodes, name", [(1, "1 node"), (2, "2-64 nodes"), (64, "2-64 nodes"),
                                         (65, ">64 nodes"), (128, ">64 nodes")])
def test_scale_buckets(nodes, name):
    assert scale_bucket(nodes) == name


@pytest.mark.parametrize("params, name", [(64e6, "<3B"), (3e9 - 1, "<3B"), (3e9, "3-30B"),
                                          (29.9e9, "3-30B"), (30e9, "30-100B"),
                                          (100e9 - 1, "30-100B"), (100e9, ">100B"),
                                          (405e9, ">100B"), (1e12, ">100B")])
def test_size_buckets_hold_their_lower_bound(params, name):
    assert size_bucket(params) == name


def test_experts_of_a_model_and_of_a_record():
    assert experts_kind(0) == experts_kind(1) == "dense" and experts_kind(8) == "moe"
    from benchmarks import regimes
    assert regimes.experts({"model": {"num_experts": 8}}) == "moe"


def _graph(params, experts=0):
    return SimpleNamespace(num_parameters=params, num_experts=experts)


def _cluster(nodes, gpu="H100-SXM5-80GB"):
    return SimpleNamespace(num_nodes=nodes, device=SimpleNamespace(name=gpu))


def test_regime_of_reads_the_cluster_and_the_graph():
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=2048, framework="nemo")
    cfg = SimpleNamespace(tp=8, pp=16, cp=1, zero_stage=1)
    r = Regime.of(train, _cluster(128), _graph(405e9), cfg)
    assert r.key() == ("megatron", "bf16", "hopper", "pipeline", "dense", ">64 nodes", ">100B")
    assert Regime.of(train, _cluster(1), _graph(64e6), cfg).key()[4:] == ("dense", "1 node", "<3B")
    moe = Regime.of_kind(train, _cluster(4), _graph(47e9, experts=8), "tensor")
    assert moe.key()[3:] == ("tensor", "moe", "2-64 nodes", "30-100B")
    assert "megatron bf16 hopper pipeline, dense, >64 nodes, >100B parameters" in \
        band_for(r).describe()


def test_a_validated_cell_bands_only_its_own_scale_size_and_experts(monkeypatch):
    small = ("megatron", "bf16", "hopper", "pipeline", "dense", "1 node", "<3B")
    monkeypatch.setattr(published, "BANDS", {small: (0.92, -0.88, 13, 2)})
    regime.band_for.cache_clear()
    try:
        b = band_for(Regime(*small))
        assert b.validated and b.half_width == 0.92 and b.cell == small
        for other in (small[:5] + (">64 nodes", ">100B"), small[:4] + ("moe",) + small[5:],
                      small[:6] + ("3-30B",), small[:5] + ("2-64 nodes",) + small[6:]):
            b = band_for(Regime(*other))
            assert not b.validated and b.cell == other and b.records == 0
            assert b.text() == "± unknown (unvalidated regime)"
    finally:
        regime.band_for.cache_clear()


def test_the_table_is_keyed_by_the_full_regime():
    cells = [k for k in published.BANDS if regime.ANY not in k[1:]]
    assert cells and all(len(k) == len(regime.FIELDS) == 7 for k in published.BANDS)
    for k in cells:
        assert k[4] in ("dense", "moe") and k[5] in regime.SCALE_BUCKETS
        assert k[6] in {name for _, name in regime.SIZE_BUCKETS}


def test_a_moe_estimate_is_in_a_moe_regime():
    pytest.importorskip("transformers")
    cluster = autopar.Cluster.from_spec("1x8xH100-80GB")
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=256)
    e = autopar.estimate("hf-tiny-qwen3-moe", cluster, train, {"dp": 8})
    assert e.error_band.cell[4:] == ("moe", "1 node", "<3B")
    assert not e.error_band.validated   # no MoE run validates a regime


def test_refit_coverage_per_regime():
    """Bands refitted without each run's source: one line per band regime the other sources
    validate with at least MIN_COVERAGE_RUNS runs, its runs inside the band and the range."""
    from benchmarks import regimes
    NS = SimpleNamespace
    key = ("torch", "bf16", "ampere", "fsdp", "dense", "2-64 nodes", "3-30B")
    small = ("torch", "bf16", "hopper", "fsdp", "dense", "1 node", "<3B")
    # three sources of five runs each at residuals -10% .. -30%: leaving a source out leaves
    # ten runs of two sources, which validate the regime
    rows = [NS(error=-0.1 * (1 + i % 3), regime=key,
               rec=NS(id=f"r{s}{i}", source_key=f"s{s}")) for s in range(3) for i in range(5)]
    rows += [NS(error=-0.05, regime=small, rec=NS(id=f"q{i}", source_key="s0"))
             for i in range(4)]
    lines = regimes.refit_coverage(rows)
    assert lines[0].startswith("band coverage, bands refitted without the run's source: ")
    assert "of 15 runs" in lines[0] and "4 runs without one" in lines[0]
    per = lines[3:]
    assert len(per) == 1 and per[0].strip().startswith("/".join(key))
    # each band: the 7th of the other ten |residuals| (nearest rank, 68%) = 0.2, so 4 of each
    # source's 5 runs (0.1, 0.2, 0.3, 0.1, 0.2) fall inside
    n, hit = int(per[0].split()[-5]), int(per[0].split()[-4])
    assert (n, hit) == (15, 12) and "12 of 15 runs" in lines[0]
