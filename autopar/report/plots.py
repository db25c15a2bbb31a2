"""Pictures of a plan: the pipeline schedule of one step, memory per pipeline stage, the
time/memory Pareto front, and a step-time comparison of plans. PNG files, or matplotlib axes.

matplotlib is optional (``pip install "autopar[plot]"``); it is imported inside the functions, and
a missing install raises :class:`MissingDependency` (an :class:`~autopar.errors.AutoparError`).

    from autopar.report import plots
    plots.plot_schedule(plan.estimate, "schedule.png")
    plots.plot_memory(plan.estimate, "memory.png")
    plots.plot_pareto(result.pareto, "pareto.png", best=plan.estimate, reference=hand_tuned)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

from ..cost.pipeline.orders import SPLIT_BACKWARD, rank_orders, stage_rank
from ..cost.pipeline.replay import replay
from ..cost.types import Estimate
from ..errors import (AutoparError, MissingDependency, OutputError,  # noqa: F401
                      output_error)   # AutoparError, MissingDependency: re-exported
from .summary import plural

if TYPE_CHECKING:
    from matplotlib.axes import Axes

PathLike = str | os.PathLike | None

#: Colours of the schedule's parts and of memory components (colour-blind-safe Okabe-Ito).
COLORS = {"forward": "#0072B2", "backward": "#E69F00", "communication": "#CC79A7",
          "bubble": "#DDDDDD", "dp_sync": "#D55E00", "optimizer": "#009E73",
          "weights": "#0072B2", "gradients": "#56B4E9", "optimizer_states": "#009E73",
          "activations": "#E69F00", "transient": "#CC79A7", "reserved": "#999999",
          "compute": "#0072B2", "tp_comm": "#CC79A7", "cp_comm": "#F0E442",
          "pp_comm": "#56B4E9", "dp_comm_exposed": "#D55E00", "overlap_slowdown": "#8C3A00",
          "dp_copies": "#B07A52"}


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingDependency(
            "plots need matplotlib, which is not installed. Fix: pip install "
            "\"autopar[plot]\" (from a clone: pip install -e \".[plot]\"; or pip install "
            "matplotlib).") from exc
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    return plt


def check_plot_path(path) -> str:
    """The file matplotlib writes for the picture path ``path``: ``path``, or ``path + ".png"``
    when it has no extension (matplotlib's default format); a path with an extension
    matplotlib cannot write is refused.

    Raises:
        OutputError: the path, the formats matplotlib writes and the fix.
        MissingDependency: matplotlib is not installed.
    """
    _pyplot()
    from matplotlib.backend_bases import FigureCanvasBase
    ext = os.path.splitext(str(path))[1][1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if ext and ext not in formats:
        raise OutputError(f"cannot write {path}: matplotlib writes no '.{ext}' pictures (it "
                          f"writes {', '.join(sorted(formats))}). Fix: end the file name with "
                          ".png (or one of those).")
    return str(path) if ext else f"{path}.png"


def _save(fig, path, dpi: int) -> None:
    """Write the figure; an unwritable path or an extension matplotlib cannot write is an
    :class:`~autopar.errors.OutputError`."""
    try:
        check_plot_path(path)
        fig.savefig(path, dpi=dpi)
    except OutputError:
        raise
    except OSError as exc:
        raise output_error(path, exc) from exc
    except ValueError as exc:  # matplotlib refuses the file name in another way
        raise OutputError(f"cannot write {path}: {exc}. Fix: a file name ending in .png.") \
            from exc
    finally:
        _pyplot().close(fig)


def _finish(fig, ax, path):
    if path is not None:
        fig.tight_layout()
        _save(fig, path, 120)
    return ax


def _axes(ax, size):
    plt = _pyplot()
    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=size)
    return fig, ax


# -- pipeline schedule ---------------------------------------------------------------------------
def _rank_order(rank: int, p: int, v: int, m: int, schedule: str | None,
                group: int | None = None) -> list[tuple[str, int, int]]:
    """(kind, chunk, micro-batch) in the order one pipeline rank runs them: the cost model's
    order (:func:`autopar.cost.pipeline.orders.rank_orders`: 1F1B, interleaved 1F1B, in
    Megatron-LM's order with a micro-batch ``group``, and GPipe), its global stages read as the
    rank's chunks."""
    name = schedule or "1f1b"
    if v > 1 and name == "1f1b":
        name = "interleaved-1f1b"
    return [(kind, stage // p, j) for kind, stage, j in rank_orders(name, p, m, v, group)[rank]]


def schedule_events(est: Estimate) -> list[tuple[int, str, float, float, int, int]]:
    """Simulate one step's pipeline: ``(rank, "F"|"B", start_s, duration_s, chunk, micro_batch)``.

    Each rank runs its operations in the schedule's order (1F1B, interleaved 1F1B or GPipe); a
    forward waits for the previous virtual stage's forward of the same micro-batch, a backward
    for the next virtual stage's backward. Durations: the rank's ``stage_fwd_s`` / ``stage_bwd_s``
    divided by its chunks (pipeline sends included, as in the cost model).
    """
    c = est.config
    p, v, m = c.pp, c.virtual_stages or 1, est.num_micro_batches
    fwd = list(est.stage_fwd_s) or [t / 3 for t in est.stage_time_s]
    bwd = list(est.stage_bwd_s) or [2 * t / 3 for t in est.stage_time_s]
    if p > 1 and c.schedule in SPLIT_BACKWARD:
        return _split_events(est, fwd, bwd)
    orders = [_rank_order(r, p, v, m, c.schedule, c.vp_group) for r in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    pos = [0] * p
    events = []
    last_vs = p * v - 1
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, j, i = orders[r][pos[r]]
                vs = j * p + r
                if kind == "F":
                    dep = None if vs == 0 else ("F", vs - 1, i)
                else:
                    dep = ("F", vs, i) if vs == last_vs else ("B", vs + 1, i)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done.get(dep, 0.0) if dep else 0.0)
                dur = (fwd[r] if kind == "F" else bwd[r]) / v
                done[(kind, vs, i)] = start + dur
                free[r] = start + dur
                events.append((r, kind, start, dur, j, i))
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for the orders above; guard against a hang
            raise AutoparError("pipeline schedule simulation deadlocked (a bug in autopar).")
    return events


def _split_events(est: Estimate, fwd: list[float], bwd: list[float]) -> list[tuple]:
    """:func:`schedule_events` of a split-backward schedule (interleaved zero bubble, ZBV,
    DualPipeV): torch's action order replayed (:mod:`autopar.cost.pipeline.orders`); kinds "F",
    "B" (full backward), "I" (input gradient), "W" (weight gradient); chunks are the rank's local
    index (0 .. v-1)."""
    c = est.config
    p, v, m = c.pp, c.virtual_stages, est.num_micro_batches
    wgt = list(est.stage_wgrad_s) or [0.0] * p
    out: list = []
    replay(rank_orders(c.schedule, p, m, v), p * v, c.schedule, tuple(f / v for f in fwd),
           tuple((b - w) / v for b, w in zip(bwd, wgt)), tuple(w / v for w in wgt), events=out)
    local = {}
    for r in range(p):
        mine = sorted(s for s in range(p * v) if stage_rank(s, p, c.schedule) == r)
        local.update({s: k for k, s in enumerate(mine)})
    return [(r, "B" if kind == "O" else kind, s, d, local[stage], mb)
            for r, kind, s, d, stage, mb in out]


def _window(events, p: int, v: int, end: float):
    """(W, R): show [0, W] and [R, end] of the step when the steady state in between is long."""
    per_op = max(e[3] for e in events)  # the longest op (a backward chunk)
    warm0 = p - 1 if v == 1 else 2 * (p - 1) + (v - 1) * p  # rank 0's warm-up forwards
    w = (warm0 + p + 4) * 1.5 * per_op
    if 2.4 * w >= end:
        return end, end
    return w, end - w


def plot_schedule(est: Estimate, path: PathLike = None, *, ax: Axes | None = None,
                  title: str | None = None) -> Axes:
    """Timeline of one training step: pipeline ranks x time, forward / backward / communication /
    idle (bubble), then the exposed data-parallel sync and the optimizer step.

    With many micro-batches the long steady state in the middle is cut out (a break marker says
    how many seconds): the warm-up and cool-down, where the bubble is, stay readable. The x axis
    keeps real step times.

    Args:
        est: an :class:`Estimate` (``autopar.estimate(...)`` or ``plan.estimate``).
        path: write a PNG here (and close the figure) when given.
        ax: draw into these matplotlib axes instead of a new figure.
        title: the axes title (default: the config and the bubble share).

    Returns:
        The matplotlib axes.

    Raises:
        MissingDependency: matplotlib is not installed.
    """
    c = est.config
    fig, ax = _axes(ax, (13, 1.4 + 0.45 * c.pp))
    events = schedule_events(est)
    tb = est.time_breakdown
    work = tb.compute + tb.tp_comm + tb.cp_comm + tb.pp_comm
    comm_share = (work - tb.compute) / work if work > 0 else 0.0
    end = max(s + d for _, _, s, d, _, _ in events)
    w_left, r_right = _window(events, c.pp, c.virtual_stages or 1, end)
    gap = 0.04 * (w_left + end - r_right) if r_right > w_left else 0.0
    shift = r_right - w_left - gap

    def pieces(s: float, d: float):
        """Displayed (start, width) pieces of the real interval [s, s + d]."""
        e = s + d
        out = []
        if s < w_left:
            out.append((s, min(e, w_left) - s))
        if e > r_right and r_right > w_left:
            a = max(s, r_right)
            out.append((a - shift, e - a))
        elif r_right <= w_left and s >= w_left:
            out.append((s, d))
        return out

    boxes = {(r, k): [] for r in range(c.pp) for k in ("forward", "backward", "communication")}
    for r, kind, s, d, _, _ in events:
        name = "forward" if kind == "F" else "backward"
        boxes[(r, name)] += pieces(s, d * (1 - comm_share))
        if comm_share > 0:
            boxes[(r, "communication")] += pieces(s + d * (1 - comm_share), d * comm_share)
    tail = [("dp_sync", tb.dp_comm_exposed + tb.overlap_slowdown + tb.dp_copies),
            ("optimizer", tb.optimizer)]
    disp_end = end - (shift if r_right > w_left else 0.0)
    for r in range(c.pp):
        y = c.pp - 1 - r
        ax.broken_barh([(0, disp_end)], (y - 0.4, 0.8), color=COLORS["bubble"], lw=0)
        for name in ("forward", "backward", "communication"):
            if boxes[(r, name)]:
                ax.broken_barh(boxes[(r, name)], (y - 0.4, 0.8), color=COLORS[name], lw=0)
        t = disp_end
        for name, d in tail:
            if d > 0:
                ax.broken_barh([(t, d)], (y - 0.4, 0.8), color=COLORS[name], lw=0)
                t += d
    if r_right > w_left:
        ax.axvspan(w_left, w_left + gap, color="white", zorder=4)
        ax.text(w_left + gap / 2, c.pp / 2 - 0.5, f"{r_right - w_left:,.1f} s of steady state cut",
                rotation=90, ha="center", va="center", fontsize=8, zorder=5)
        from matplotlib.ticker import FuncFormatter
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda x, _: "" if w_left < x < w_left + gap else
            f"{x if x <= w_left else x + shift:,.{1 if end < 100 else 0}f}"))
    shown = sum(1 for ev in events if pieces(ev[2], ev[3]))
    if shown <= 80:
        for r, kind, s, d, j, i in events:
            for a, width in pieces(s, d):
                ax.text(a + width / 2, c.pp - 1 - r, f"{kind}{i}", ha="center", va="center",
                        fontsize=6, color="white")
    from matplotlib.patches import Patch
    labels = [("forward", "forward"), ("backward", "backward (incl. recompute)"),
              ("communication", "TP/CP/PP comm. share"), ("bubble", "idle (bubble)"),
              ("dp_sync", "exposed DP sync"), ("optimizer", "optimizer step")]
    ax.legend(handles=[Patch(color=COLORS[k], label=t) for k, t in labels],
              loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    step = max(1, c.pp // 16)
    ax.set_yticks([c.pp - 1 - r for r in range(0, c.pp, step)])
    ax.set_yticklabels([f"rank {r}" for r in range(0, c.pp, step)])
    ax.set_ylabel("pipeline rank")
    ax.set_xlabel("time in the step (s)")
    ax.set_xlim(0, disp_end + sum(d for _, d in tail))
    bubble = 100 * tb.bubble / est.step_time_s
    ax.set_title(title or (f"One step: {c.schedule}, pp={c.pp} v={c.virtual_stages}, "
                           f"{plural(est.num_micro_batches, 'micro-batch', 'micro-batches')} "
                           "(simulated order); "
                           f"{est.step_time_s:.2f} s/step, bubble {bubble:.1f}%"), fontsize=10)
    return _finish(fig, ax, path)


# -- memory --------------------------------------------------------------------------------------
def plot_memory(est: Estimate, path: PathLike = None, *, ax: Axes | None = None,
                title: str | None = None) -> Axes:
    """Memory per pipeline rank, stacked by component (weights, gradients, optimizer states,
    activations, transient, reserved), against the GPU's memory (dashed line).

    Returns:
        The matplotlib axes. Raises MissingDependency without matplotlib.
    """
    fig, ax = _axes(ax, (max(6, 0.45 * est.config.pp + 4), 4.5))
    rows = [r.as_dict() for r in (est.stage_memory_breakdown or (est.memory_breakdown,))]
    comps = list(rows[0].keys())
    xs = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for k in comps:
        vals = [r.get(k, 0.0) / 1e9 for r in rows]
        ax.bar(xs, vals, bottom=bottom, color=COLORS.get(k), label=k.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    limit = est.memory_limit_bytes / 1e9
    ax.axhline(limit, color="#D55E00", ls="--", lw=1.5, label=f"GPU memory {limit:.0f} GB")
    step = max(1, len(rows) // 16)
    ax.set_xticks(xs[::step])
    ax.set_xticklabels([str(x) for x in xs[::step]])
    ax.set_xlabel("pipeline rank")
    ax.set_ylabel("memory per GPU (GB)")
    ax.set_ylim(0, max(limit, max(bottom)) * 1.15)
    c = est.config
    ax.set_title(title or (f"Memory per GPU by pipeline rank: tp={c.tp} pp={c.pp} dp={c.dp} "
                           f"cp={c.cp} zero={c.zero_stage} ({'fits' if est.fits else 'DOES NOT FIT'})"),
                 fontsize=10)
    handles, labels = ax.get_legend_handles_labels()  # top of the stack first
    ax.legend(handles[::-1], labels[::-1], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _finish(fig, ax, path)


# -- Pareto front --------------------------------------------------------------------------------
#: Drawing order of the Pareto plot, bottom to top: the front (line and dots), the alternatives
#: (many of them are points of the front: drawn below it they were hidden), then the best and the
#: reference plans.
PARETO_ZORDER = {"front": 3, "alternatives": 4, "marked": 5}


def _short(c) -> str:
    rc = c.recompute if isinstance(c.recompute, str) else "mixed"
    return f"tp{c.tp} pp{c.pp} dp{c.dp} cp{c.cp} z{c.zero_stage} {rc}"


def plot_pareto(front: Sequence[Estimate], path: PathLike = None, *,
                best: Estimate | None = None, alternatives: Sequence[Estimate] = (),
                reference: Estimate | None = None, reference_label: str = "hand-tuned",
                ax: Axes | None = None, title: str | None = None) -> Axes:
    """Step time against peak memory per GPU: the Pareto front of fitting plans (no plan is both
    faster and smaller), the best plan, other candidates, and a hand-tuned plan when given.

    Args:
        front: estimates on the front (``SearchResult.pareto``).
        best: the chosen plan's estimate (starred).
        alternatives: other estimates to show (purple dots with a black edge, drawn above the
            front so that those on it stay visible).
        reference: a hand-tuned configuration's estimate (red cross; may not fit).
        reference_label: its legend text.

    Returns:
        The matplotlib axes. Raises MissingDependency without matplotlib.
    """
    fig, ax = _axes(ax, (8, 5.5))
    front = sorted(front, key=lambda e: e.memory_per_gpu_bytes)
    if front:
        ax.plot([e.memory_per_gpu_bytes / 1e9 for e in front], [e.step_time_s for e in front],
                "o-", color="#0072B2", ms=5, drawstyle="steps-post", label="Pareto front",
                zorder=PARETO_ZORDER["front"])
    if alternatives:  # above the front: alternatives often lie on it
        ax.scatter([a.memory_per_gpu_bytes / 1e9 for a in alternatives],
                   [a.step_time_s for a in alternatives], color="#CC79A7", s=48,
                   edgecolor="black", linewidths=0.8, label="top alternatives",
                   zorder=PARETO_ZORDER["alternatives"])
    limits = [e.memory_limit_bytes for e in [*front, best, reference] if e is not None]
    if limits:
        ax.axvline(limits[0] / 1e9, color="#D55E00", ls="--", lw=1.2,
                   label=f"GPU memory {limits[0] / 1e9:.0f} GB")
    if best is not None:
        ax.scatter([best.memory_per_gpu_bytes / 1e9], [best.step_time_s], marker="*", s=260,
                   color="#009E73", edgecolor="black", zorder=PARETO_ZORDER["marked"],
                   label=f"chosen: {_short(best.config)}")
    if reference is not None:
        ax.scatter([reference.memory_per_gpu_bytes / 1e9], [reference.step_time_s], marker="X",
                   s=160, color="#D55E00", edgecolor="black", zorder=PARETO_ZORDER["marked"],
                   label=f"{reference_label}: {_short(reference.config)}"
                         f"{'' if reference.fits else ' (OOM)'}")
    ys = [e.step_time_s for e in [*front, *alternatives, best, reference] if e is not None]
    log = bool(ys) and max(ys) > 4 * min(ys)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel("step time (s, log scale)" if log else "step time (s)")
    ax.grid(alpha=0.3)
    ax.set_title(title or "Time/memory trade-off of fitting plans", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    return _finish(fig, ax, path)


# -- comparison ----------------------------------------------------------------------------------
def plot_comparison(estimates: list[tuple[str, Estimate]], path: PathLike = None, *,
                    ax: Axes | None = None, title: str | None = None) -> Axes:
    """Step time of several plans as horizontal bars stacked by component (compute, TP/CP/PP
    communication, bubble, exposed DP sync, compute slowed by the DP sync, optimizer); plans
    that do not fit are marked OOM.

    Returns:
        The matplotlib axes. Raises MissingDependency without matplotlib.
    """
    fig, ax = _axes(ax, (11, 1.2 + 0.6 * len(estimates)))
    parts = [e.time_breakdown.as_dict() for _, e in estimates]
    keys = list(dict.fromkeys(k for tb in parts for k in tb))
    ys = list(range(len(estimates)))[::-1]
    left = [0.0] * len(estimates)
    for k in keys:
        vals = [tb.get(k, 0.0) for tb in parts]
        ax.barh(ys, vals, left=left, color=COLORS.get(k), label=k.replace("_", " "))
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{n}{'' if e.fits else ' (OOM)'}" for n, e in estimates], fontsize=8)
    for y, (_, e) in zip(ys, estimates):
        ax.text(e.step_time_s, y, f" {e.step_time_s:.1f} s, MFU {e.mfu * 100:.0f}%",
                va="center", fontsize=8)
    ax.set_xlabel("step time (s)")
    ax.set_xlim(0, max(left) * 1.25)
    ax.set_title(title or "Step time by component", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _finish(fig, ax, path)


def plot_overview(est: Estimate, path: PathLike, *, front: Sequence[Estimate] = (),
                  alternatives: Sequence[Estimate] = (), reference: Estimate | None = None,
                  reference_label: str = "hand-tuned") -> PathLike:
    """One PNG with the schedule timeline on top, memory per stage and (when ``front`` is given)
    the Pareto front below.

    Raises:
        MissingDependency: matplotlib is not installed.
    """
    plt = _pyplot()
    fig = plt.figure(figsize=(15, 10.5))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1.2])
    plot_schedule(est, ax=fig.add_subplot(grid[0, :]))
    pareto = bool(front) or reference is not None
    plot_memory(est, ax=fig.add_subplot(grid[1, 0] if pareto else grid[1, :]))
    if pareto:
        plot_pareto(front, ax=fig.add_subplot(grid[1, 1]), best=est, alternatives=alternatives,
                    reference=reference, reference_label=reference_label)
    fig.tight_layout()
    _save(fig, path, 110)
    return path
