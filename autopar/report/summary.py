"""Plain-text reports of plans and estimates (units converted here, at the edge: GB = 1e9 bytes)."""

from __future__ import annotations

from collections import Counter


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


def recompute_text(recompute, stage_blocks) -> list[str]:
    """One line per pipeline chunk: its blocks and their recompute modes."""
    if isinstance(recompute, str):
        modes = None
    else:
        modes = list(recompute)
    lines, pos = [], 0
    for ci, n in enumerate(stage_blocks):
        if modes is None:
            what = recompute
        else:
            counts = Counter(modes[pos:pos + n])
            what = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
        lines.append(f"  chunk {ci}: blocks {pos}-{pos + n - 1} ({n}), recompute {what}")
        pos += n
    return lines


def estimate_lines(e) -> list[str]:
    """The numbers of an estimate, one per line."""
    c = e.config
    t = e.time_breakdown
    lines = [
        f"step time        {e.step_time_s:.3f} s   ({e.tokens_per_s:,.0f} tokens/s, "
        f"{e.seconds_per_billion_tokens / 3600:.2f} h per 1B tokens)",
        f"MFU / HFU        {e.mfu * 100:.1f}% / {e.hfu * 100:.1f}%",
        f"micro-batches    {e.num_micro_batches} of {c.micro_batch_size} per step "
        f"(gradient accumulation {e.num_micro_batches})",
        "time breakdown   " + ", ".join(f"{k} {v:.3f}s" for k, v in t.items() if v > 0),
        f"memory per GPU   {_gb(e.memory_per_gpu_bytes)} of {_gb(e.memory_limit_bytes)} "
        f"({'fits' if e.fits else 'DOES NOT FIT'}; peak on pipeline rank {e.peak_stage})",
        "  " + ", ".join(f"{k} {_gb(v)}" for k, v in e.memory_breakdown.items()),
    ]
    if e.comm_bytes_by_link:
        lines.append("communication    " + ", ".join(
            f"{k}: {_gb(e.comm_bytes_by_link[k])} in {e.comm_seconds_by_link.get(k, 0):.2f}s"
            for k in e.comm_bytes_by_link) + " per GPU per step (before overlap)")
    return lines


def config_text(c) -> str:
    """Degrees and choices of a config on one line."""
    rc = c.recompute if isinstance(c.recompute, str) else "per-block"
    return (f"tp={c.tp} pp={c.pp} dp={c.dp} cp={c.cp} sp={'on' if c.sequence_parallel else 'off'} "
            f"zero={c.zero_stage} recompute={rc} mbs={c.micro_batch_size} "
            f"v={c.virtual_stages} schedule={c.schedule}")


def plan_summary(plan) -> str:
    """The readable table :meth:`autopar.Plan.summary` returns."""
    e, c = plan.estimate, plan.config
    head = (f"autopar plan: {plan.model} on {plan.cluster} ({plan.world_size} GPUs), global batch "
            f"{plan.train.global_batch_size} x {plan.train.seq_len} tokens, {plan.train.precision}")
    lines = [head, "-" * len(head), "parallelism      " + config_text(c)]
    if e.group_links:
        lines.append("placement        " + ", ".join(
            f"{d} over {link}" for d, link in e.group_links.items() if link != "local"))
    lines.append(f"pipeline         {c.pp} stage(s) x {c.virtual_stages} chunk(s)")
    lines += recompute_text(c.recompute, c.stage_blocks)
    lines += estimate_lines(e)
    if plan.alternatives:
        lines.append("alternatives")
        for a in plan.alternatives:
            lines.append(f"  {a.step_time_s:.3f} s (+{(a.step_time_s / e.step_time_s - 1) * 100:.1f}%)"
                         f"  {_gb(a.memory_per_gpu_bytes)}  {config_text(a.config)}")
    s = plan.search
    lines.append(f"search           {s.evaluated} configurations, {s.meshes} meshes, "
                 f"{s.wall_s:.2f} s{'' if s.complete else ' (stopped by time limit: best so far)'}")
    return "\n".join(lines)
