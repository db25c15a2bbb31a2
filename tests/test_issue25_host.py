"""Issue 25 item 3: the host's time to issue kernels (autopar.cost.host)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.host import (FUSED_ATTENTION_BWD_KERNELS, UNFUSED_ATTENTION_KERNELS,
                               HostTime, LayerKernels, host_exposed_s, host_time, kernels)
from autopar.cost.model import CostModel
from autopar.cost.params import CostParams
from autopar.errors import InvalidTrainingConfig
from autopar.frameworks import PROFILES, get_profile
from autopar.frameworks.choices import CUDA_GRAPHS, PER_KERNEL_LAUNCH, with_choice
from autopar.frameworks.profiles import HOST_ISSUES

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def llama_block():
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=4096)
    graph = model_graph("llama3-8b", train)[0]
    return graph.blocks[0]


def _estimate(model, spec, train, config, profile):
    graph = model_graph(model, train)[0]
    return CostModel(graph, autopar.Cluster.from_spec(spec), train,
                     framework=profile).estimate(config)


def test_host_time_per_op_is_the_measured_h200_figure():
    rows = json.loads((ROOT / "benchmarks/data/gpu/h200_sweep.json").read_text())
    tiny = next(r for r in rows["memory_bound"] if r["op"] == "tiny kernel (launch)")
    assert CostParams().host_op_s == pytest.approx(tiny["s"], rel=1e-3)


def test_kernels_are_counted_from_the_graph_per_fusion_level(llama_block):
    matmuls = sum(o.kind == "matmul" for o in llama_block.ops)
    attention = sum(o.kind == "attention" and o.fused for o in llama_block.ops)
    assert (matmuls, attention) == (7, 1)
    eager, compiled, fused = (kernels(llama_block, f) for f in ("eager", "compile", "fused"))
    # compile fuses point-wise chains, hand-fused stacks fuse norms: fewer kernels than eager
    assert compiled.fwd < fused.fwd < eager.fwd
    for k in (eager, compiled, fused):
        memory_bound = k.fwd - matmuls - attention
        # GEMMs: 1 forward, 2 backward; FlashAttention-2: 1 forward, 3 backward; element-wise
        # ops one backward kernel each
        assert k.bwd == 2 * matmuls + FUSED_ATTENTION_BWD_KERNELS * attention + memory_bound
        assert k.recompute == 0


def test_recomputation_reissues_what_it_repeats(llama_block):
    base = kernels(llama_block, "fused")
    assert kernels(llama_block, "fused", mode="full").recompute == base.fwd
    assert kernels(llama_block, "fused", mode="selective").recompute == 1
    op = kernels(llama_block, "fused", mode="selective-op").recompute
    assert 0 < op < base.fwd
    # op-level SAC keeps the attention's output: an unfused attention's several forward
    # kernels are not launched again, so the recomputed count is the same as with a fused one
    # (the 4 odd-numbered of 7 matmuls and the attention are saved)
    assert op == base.fwd - 4 - 1
    ops = tuple(replace(o, fused=False) if o.kind == "attention" else o for o in llama_block.ops)
    unfused = replace(llama_block, ops=ops)
    k = kernels(unfused, "fused", mode="selective-op")
    assert k.recompute == k.fwd - 4 - UNFUSED_ATTENTION_KERNELS == op


def test_host_seconds_are_kernels_times_the_time_per_op_and_nil_under_cuda_graphs(llama_block):
    h = host_time(llama_block, fusion="eager", mode="full", host_op_s=1e-5)
    assert isinstance(h, HostTime) and isinstance(h.kernels, LayerKernels)
    assert h.fwd_s == pytest.approx(h.kernels.fwd * 1e-5)
    assert h.bwd_s == pytest.approx((h.kernels.bwd + h.kernels.recompute) * 1e-5)
    g = host_time(llama_block, fusion="eager", mode="full", host_issue="cuda_graph")
    assert (g.fwd_s, g.bwd_s) == (0.0, 0.0) and g.kernels == h.kernels
    assert host_exposed_s(2.0, 1.0) == 0.0 and host_exposed_s(1.0, 3.0) == 2.0


def test_stock_profiles_issue_per_kernel_with_a_source():
    assert HOST_ISSUES == ("per_kernel", "cuda_graph")
    for name, profile in PROFILES.items():
        assert profile.host_issue == "per_kernel", name
        assert profile.cost_sources["host_issue"].strip(), name
    graphs = with_choice(get_profile("torch"), CUDA_GRAPHS)
    assert graphs.host_issue == "cuda_graph" and "CUDA Graphs" in graphs.cost_sources["host_issue"]
    assert PER_KERNEL_LAUNCH.host_issue == "per_kernel"
    with pytest.raises(InvalidTrainingConfig):
        get_profile("torch").with_costs({"host_issue": "test"}, host_issue="lazy")


def test_a_small_model_is_host_bound_and_cuda_graphs_remove_it():
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=512)
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=8, zero_stage=0, micro_batch_size=2)
    torch = get_profile("torch")
    eager = _estimate("tiny-llama", "1x8xH100", train, cfg, torch)
    graphed = _estimate("tiny-llama", "1x8xH100", train, cfg, with_choice(torch, CUDA_GRAPHS))
    tb = eager.time_breakdown
    assert tb.host_exposed > 0 and graphed.time_breakdown.host_exposed == 0
    assert eager.step_time_s == pytest.approx(graphed.step_time_s + tb.host_exposed)
    assert tb.total == pytest.approx(eager.step_time_s, rel=1e-12)
    # host-bound: the step no longer follows the GPU's speed (same step on A100 and H100)
    a100 = _estimate("tiny-llama", "1x8xA100-80GB", train, cfg, torch)
    assert a100.step_time_s == pytest.approx(eager.step_time_s, rel=0.05)
    # torch.compile issues fewer kernels: a shorter host-bound step (its exposed part may
    # grow, as its GPU time shrinks more)
    compiled = _estimate("tiny-llama", "1x8xH100", train, cfg,
                         torch.with_costs({"fusion": "test"}, fusion="compile"))
    assert 0 < compiled.time_breakdown.host_exposed
    assert compiled.step_time_s < eager.step_time_s


def test_a_large_model_is_not_host_bound_and_costs_as_before():
    """A Llama 3 8B block at 4096 tokens has GPU work enough to hide its host time; under
    Megatron-Core's per-kernel rate (~115 us) only the small layers outside the blocks show a
    little (under 1% of the step)."""
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=4096)
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=1)
    for fw in ("torch", "torchtitan", "megatron"):
        profile = get_profile(fw)
        e = _estimate("llama3-8b", "1x8xH100", train, cfg, profile)
        g = _estimate("llama3-8b", "1x8xH100", train, cfg, with_choice(profile, CUDA_GRAPHS))
        if fw == "megatron":
            assert 0 <= e.time_breakdown.host_exposed < 0.01 * e.step_time_s
            assert e.step_time_s == pytest.approx(g.step_time_s, rel=0.01)
        else:
            assert e.time_breakdown.host_exposed == 0.0, fw
            assert e.step_time_s == g.step_time_s, fw


def test_plan_files_without_host_exposed_still_read():
    from autopar.cost.types import TimeBreakdown
    d = dict(compute=1.0, tp_comm=0.0, cp_comm=0.0, ep_comm=0.0, pp_comm=0.0, bubble=0.0,
             dp_comm_exposed=0.0, overlap_slowdown=0.0, dp_copies=0.0, optimizer=0.0,
             fixed_step=0.0)
    tb = TimeBreakdown.from_dict(d)
    assert tb.host_exposed == 0.0 and "host_exposed" in tb.absent and tb.as_dict() == d


def _host_note(e):
    notes = [w for w in e.warnings if w.startswith("host time:")]
    assert len(notes) <= 1
    return notes[0] if notes else None


def test_megatron_prices_its_stack_host_rate_and_says_so():
    """Megatron-Core/TE's per-kernel host rate, fitted to the measured runs of the stack's
    public sources (benchmarks/data/host/stack_host_rates.json, the least macro MAPE), is
    priced: a small model's step is host-bound where the measured dispatch rate alone (8.13 us)
    hides it, the step equals re-pricing with that rate as CostParams.host_op_s, and the
    estimate's note names the rate, its origin and the fixes."""
    import json
    from pathlib import Path
    meg = get_profile("megatron")
    rates = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "host"
                        / "stack_host_rates.json").read_text())
    assert meg.host_op_s_published == pytest.approx(rates["rate_s"], rel=1e-3)
    assert len(rates["sources"]) >= 3
    assert "stack_host_rates.json" in meg.cost_sources["host_op_s_published"]
    assert get_profile("nemo").host_op_s_published == meg.host_op_s_published
    for name in ("torch", "torchtitan", "deepspeed", "megatron-2023", "inhouse-2024"):
        assert get_profile(name).host_op_s_published == 0.0, name
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=1024)
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    e = _estimate("gpt-1.7b", "1x8xH100", train, cfg, meg)
    note = _host_note(e)
    assert note is not None and "cuda-graphs" in note and "module code" in note
    assert "from: the per-kernel host rate (0-300 us, 5 us steps) with the least mean over" in note
    assert f"at {meg.host_op_s_published * 1e6:.3g} us of host time each" in note
    assert e.time_breakdown.host_exposed > 0.1 * e.step_time_s
    graph = model_graph("gpt-1.7b", train)[0]
    raw = CostModel(graph, autopar.Cluster.from_spec("1x8xH100"), train, framework=meg,
                    params=replace(CostParams(), host_op_s=meg.host_op_s_published))
    assert raw.estimate(cfg).step_time_s == pytest.approx(e.step_time_s, rel=1e-9)
    # without the stack rate only the measured dispatch rate is priced: no host time shows
    bare = _estimate("gpt-1.7b", "1x8xH100", train, cfg,
                     meg.with_costs({"host_op_s_published": "test"}, host_op_s_published=0.0))
    assert bare.time_breakdown.host_exposed == 0.0 and bare.step_time_s < 0.9 * e.step_time_s


def test_no_host_time_note_under_cuda_graphs_other_stacks_or_enough_work():
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=1024)
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    meg = get_profile("megatron")
    graphed = _estimate("gpt-1.7b", "1x8xH100", train, cfg, with_choice(meg, CUDA_GRAPHS))
    assert _host_note(graphed) is None and graphed.time_breakdown.host_exposed == 0.0
    assert with_choice(meg, CUDA_GRAPHS).host_op_s_published == 0.0
    assert _host_note(_estimate("gpt-1.7b", "1x8xH100", train, cfg, get_profile("torch"))) is None
    # a Llama-3-8B block at 4096 tokens: enough GPU work per kernel, nothing to note
    big = autopar.TrainingConfig(global_batch_size=8, seq_len=4096)
    e = _estimate("llama3-8b", "1x8xH100", big,
                  autopar.ParallelConfig(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1),
                  meg)
    assert _host_note(e) is None


def test_a_negative_published_host_time_is_refused():
    with pytest.raises(InvalidTrainingConfig, match="host_op_s_published"):
        get_profile("megatron").with_costs({"host_op_s_published": "test"},
                                           host_op_s_published=-1e-6)


def test_stack_host_rates_file_is_the_corpus_output():
    """benchmarks/data/host/stack_host_rates.json is what `python -m benchmarks.host_rate`
    computes from the development split (regenerate with --write): the stack rate has the least
    mean over sources of their MAPE on the grid, each source's leave-one-source-out rate the
    least over the others', and a source's curve is its runs' mean absolute error."""
    from benchmarks import host_rate
    data = host_rate.compute()
    assert data == host_rate._load(), "run `python -m benchmarks.host_rate --write`"
    grid = host_rate.GRID
    assert len(data["sources"]) >= 10 and data["rate_s"] in grid

    def macro(keys, i):
        return sum(data["sources"][k]["mape"][i] for k in keys) / len(keys)

    keys = list(data["sources"])
    best = grid.index(data["rate_s"])
    assert all(macro(keys, best) <= macro(keys, i) + 1e-9 for i in range(len(grid)))
    for key, src in data["sources"].items():
        runs = list(src["runs"].values())
        assert src["mape"][best] == pytest.approx(sum(abs(e[best]) for e in runs) / len(runs),
                                                  abs=2e-6)
        others = [k for k in keys if k != key]
        loso = grid.index(host_rate.loso_rate(key, data))
        assert all(macro(others, loso) <= macro(others, i) + 1e-9 for i in range(len(grid)))
    assert host_rate.loso_rate("a source with no run of the stack", data) is None


def test_a_user_set_host_rate_is_priced_and_quoted_and_bad_ones_are_refused():
    """with_host_rate sets a stack's rate with its source, which the host note quotes; a rate
    below zero, not a number, or without a source is refused with a fix, and a profile given
    as TrainingConfig.framework is sent to profile= instead of dumping its repr."""
    from autopar.frameworks import with_host_rate
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=1024)
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    mine = with_host_rate("megatron", 100e-6, "our nsys trace of 2026-12")
    e = autopar.estimate("gpt-1.7b", "1x8xH100", train, cfg, profile=mine)
    note = _host_note(e)
    assert note is not None and "from: our nsys trace of 2026-12" in note
    assert "at 100 us of host time each" in note
    for bad in (-1.0, float("nan"), "abc", True):
        with pytest.raises(InvalidTrainingConfig, match="finite number >= 0"):
            with_host_rate("megatron", bad, "x")
    with pytest.raises(InvalidTrainingConfig, match="must say where the rate comes from"):
        with_host_rate("megatron", 1e-4, " ")
    with pytest.raises(InvalidTrainingConfig, match="pass the profile as profile=") as info:
        autopar.TrainingConfig(global_batch_size=8, seq_len=1024, framework=mine)
    assert len(str(info.value)) < 400
