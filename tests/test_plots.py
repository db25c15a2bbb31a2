"""Plots write non-empty PNGs, from Python and from the CLI; the schedule simulation is sound."""

from __future__ import annotations

import pytest

import autopar
from autopar.report import plots
from autopar.api import search_plan
from autopar.problem import Problem

pytest.importorskip("matplotlib")

TRAIN = autopar.TrainingConfig(global_batch_size=32, seq_len=512)


@pytest.fixture(scope="module")
def problem():
    return Problem.build("tiny-llama", "2x4xA100-80GB", TRAIN)


def _png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    return data


@pytest.mark.parametrize("pp, v", [(4, 1), (2, 2)])
def test_schedule_simulation_orders_and_bounds(problem, pp, v):
    est = problem.estimate(autopar.ParallelConfig(pp=pp, micro_batch_size=2, virtual_stages=v))
    events = plots.schedule_events(est)
    m = est.num_micro_batches
    assert len(events) == 2 * pp * v * m         # every chunk runs F and B of every micro-batch
    end = max(s + d for _, _, s, d, _, _ in events)
    busy = max(sum(d for r, _, _, d, _, _ in events if r == rank) for rank in range(pp))
    assert end >= busy                           # no rank does two things at once
    for rank in range(pp):
        spans = sorted((s, s + d) for r, _, s, d, _, _ in events if r == rank)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))
    # the simulated pipeline is close to the cost model's pipeline time (step minus tail)
    tb = est.time_breakdown
    tail = tb.dp_comm_exposed + tb.overlap_slowdown + tb.dp_copies + tb.optimizer
    assert end == pytest.approx(est.step_time_s - tail, rel=0.15)


def test_plots_write_pngs(problem, tmp_path):
    plan, result = search_plan(problem, top_k=3)
    ref = problem.estimate(autopar.ParallelConfig(tp=2, pp=2))
    plots.plot_schedule(plan.estimate, tmp_path / "s.png")
    plots.plot_memory(ref, tmp_path / "m.png")
    plots.plot_pareto(result.pareto, tmp_path / "p.png", best=plan.estimate,
                      alternatives=plan.alternatives, reference=ref)
    plots.plot_comparison([("best", plan.estimate), ("tp2 pp2", ref)], tmp_path / "c.png")
    plots.plot_overview(ref, tmp_path / "o.png", front=result.pareto, reference=ref)
    for name in "smpco":
        _png(tmp_path / f"{name}.png")


def test_cli_plot_flags(tmp_path, capsys):
    from autopar.cli import main
    args = ["--model", "tiny-llama", "--cluster", "2x4xA100-80GB", "--global-batch", "32",
            "--seq-len", "512"]
    assert main(["plan", *args, "--plot", str(tmp_path / "plan.png"), "--compare-pp", "2"]) == 0
    assert main(["estimate", *args, "--pp", "2", "--plot", str(tmp_path / "est.png")]) == 0
    assert main(["explain", *args, "--plot", str(tmp_path / "why.png")]) == 0
    for name in ("plan", "est", "why"):
        _png(tmp_path / f"{name}.png")


def test_a_picture_format_matplotlib_cannot_write_is_refused_before_the_search(tmp_path,
                                                                              capsys, problem):
    # the new-user pass of 2026-12-07: --plot plan.txt failed after the search with "Fix: choose
    # a path in an existing, writable folder", and --plot plan said "wrote plan" of plan.png
    from autopar.cli import main
    args = ["--model", "tiny-llama", "--cluster", "2x4xA100-80GB", "--global-batch", "32",
            "--seq-len", "512"]
    assert main(["plan", *args, "--plot", str(tmp_path / "plan.txt")]) == 2
    err = capsys.readouterr().err
    assert "OutputError: cannot write" in err and "matplotlib writes no '.txt' pictures" in err
    assert "Fix: end the file name with .png" in err and "searching" not in err
    assert main(["estimate", *args, "--plot", str(tmp_path / "est")]) == 0
    assert f"wrote {tmp_path / 'est.png'}" in capsys.readouterr().err
    _png(tmp_path / "est.png")
    with pytest.raises(autopar.errors.OutputError, match="no '.doc' pictures"):
        plots.plot_memory(problem.estimate(autopar.ParallelConfig()), tmp_path / "m.doc")
    assert plots.check_plot_path("a/b.svg") == "a/b.svg"


def test_missing_matplotlib_is_our_error(monkeypatch, problem):
    import builtins
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", fake)
    est = problem.estimate(autopar.ParallelConfig())
    with pytest.raises(autopar.errors.AutoparError, match="pip install"):
        plots.plot_memory(est, "never.png")


def test_pareto_alternatives_are_drawn_above_the_front(problem):
    """A new user's report: alternatives that lie on the front were hidden under its line and
    dots. Each is now drawn above them, larger than a front dot, in its own colour, and the
    rendered pixel at its centre has that colour."""
    import numpy as np
    from matplotlib.colors import to_rgba
    plan, result = search_plan(problem, top_k=3)
    front = sorted(result.pareto, key=lambda e: e.memory_per_gpu_bytes)
    assert len(front) >= 3
    on_front = front[1:3]   # alternatives that are points of the front: the hidden case
    ax = plots.plot_pareto(front, best=plan.estimate, alternatives=on_front)
    try:
        line = next(ln for ln in ax.get_lines() if ln.get_label() == "Pareto front")
        alts = next(c for c in ax.collections if c.get_label() == "top alternatives")
        best = next(c for c in ax.collections if c.get_label().startswith("chosen:"))
        assert line.get_zorder() < alts.get_zorder() < best.get_zorder()
        assert alts.get_visible() and alts.get_alpha() in (None, 1.0)
        assert alts.get_sizes()[0] > line.get_markersize() ** 2      # both in points^2
        face = alts.get_facecolors()[0]
        assert not np.allclose(face, to_rgba(line.get_color()))       # not the front's blue
        assert np.allclose(alts.get_edgecolors()[0], to_rgba("black"))
        assert np.allclose(alts.get_offsets(), [(e.memory_per_gpu_bytes / 1e9, e.step_time_s)
                                                for e in on_front])
        fig = ax.figure
        fig.canvas.draw()
        rgba = np.asarray(fig.canvas.buffer_rgba())
        height = rgba.shape[0]
        for x, y in ax.transData.transform(alts.get_offsets()):
            pixel = rgba[int(round(height - y)), int(round(x))] / 255.0
            assert np.allclose(pixel, face, atol=0.02), (pixel, face)
    finally:
        plots._pyplot().close(ax.figure)


@pytest.mark.parametrize("m, group", [(6, None), (6, 6), (8, None), (10, 5)])
def test_schedule_picture_runs_the_cost_models_order(m, group):
    # the picture replays the order the memory walk counts (orders.rank_orders), also where
    # pp does not divide m and no Megatron micro-batch group is set (torch's one round of 6)
    from autopar.cost.pipeline.orders import rank_orders
    p, v = 4, 2
    for r in range(p):
        drawn = plots._rank_order(r, p, v, m, None, group)
        assert drawn == [(k, s // p, j) for k, s, j in rank_orders("interleaved-1f1b", p, m, v,
                                                                     group)[r]]
        assert len(drawn) == 2 * v * m
    # rank 0 with torch's round of 6 warms up (v - 1) 6 + 2 (p - 1) = 12 forwards, all of the
    # step's 12, before its first backward (the picture used to draw Megatron's default group
    # of pp = 4 here, 10 forwards first: an order Megatron refuses for 6 micro-batches)
    first_b = [k for k, _, _ in plots._rank_order(0, p, v, 6, None, None)].index("B")
    assert first_b == 12
