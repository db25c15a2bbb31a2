"""Plain-text reports of plans and estimates (units converted here, at the edge: GB = 1e9 bytes)."""

from __future__ import annotations

from collections import Counter

from ..cost.capacity import capacity_text
from ..cost.offload import offload_text
from ..cost.pipeline.orders import stage_rank
from ..search.ranking import TIE_RTOL, tied
from ..search.robust import objective_text, passed_over, passed_over_note


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``"1 sequence"``, ``"2 sequences"``, ``"3 micro-batches"``: a count with its noun in the
    right number (``word`` singular; ``many`` the plural, default ``word + "s"``)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def accumulation_why(c, num_micro_batches: int) -> str:
    """Why a step of the resolved config ``c`` runs ``num_micro_batches`` micro-batches per
    data-parallel replica: "gradient accumulation", "gradient accumulation x pipeline" (the
    pipeline needs them in flight; gradients still accumulate over all), or "no gradient
    accumulation" (one)."""
    if num_micro_batches == 1:
        return "no gradient accumulation"
    return "gradient accumulation x pipeline" if c.pp > 1 else "gradient accumulation"


def micro_batch_text(c, num_micro_batches: int) -> str:
    """``"2 sequences, 4 per step per data-parallel replica (gradient accumulation x
    pipeline)"``: the micro-batch size of the resolved config ``c`` and how many a step takes."""
    return (f"{plural(c.micro_batch_size, 'sequence')}, {num_micro_batches:,} per step per "
            f"data-parallel replica ({accumulation_why(c, num_micro_batches)})")


def gap_text(step_time_s: float, best_s: float) -> str:
    """How much slower ``step_time_s`` is than ``best_s`` (seconds), for a person: "tie" when
    equal within :data:`autopar.search.ranking.TIE_RTOL`, else a signed percentage with enough
    digits that a real difference never reads "+0.0%"."""
    if tied(step_time_s, best_s):
        return "tie"
    pct = 100 * (step_time_s / best_s - 1)
    if abs(pct) >= 0.1:
        return f"{pct:+.1f}%"
    if abs(pct) >= 0.001:
        return f"{pct:+.3f}%"
    return f"{'+' if pct > 0 else '-'}<0.001%"


def recompute_text(recompute, stage_blocks, pp: int = 1, schedule: str | None = None
                   ) -> list[str]:
    """One line per pipeline chunk: the pipeline rank it runs on (as the cost model places it,
    :func:`autopar.cost.pipeline.orders.stage_rank`), its blocks and their recompute modes."""
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
        rank = stage_rank(ci, pp, schedule) if pp > 1 else 0
        lines.append(f"  chunk {ci} (rank {rank}): blocks {pos}-{pos + n - 1} ({n}), "
                     f"recompute {what}")
        pos += n
    return lines


def runner_up_note(best, alternatives) -> str | None:
    """The sentence saying the runner-up (``alternatives[0]``) is slower than ``best`` by less
    than ``best``'s expected error band (the cost model cannot rank the two), or None."""
    band = getattr(best, "error_band", None)
    if not alternatives or band is None or band.half_width is None:
        return None   # an unvalidated regime says so in the trust lines
    a = alternatives[0]
    if a.step_time_s > best.step_time_s * (1 + band.half_width):
        return None
    return (f"the runner-up ({a.step_time_s:.3f} s, {gap_text(a.step_time_s, best.step_time_s)})"
            f" lies inside the best plan's {band.text()} error band: the cost model cannot tell "
            "them apart; measure both before choosing")


def trust_lines(e) -> list[tuple[str, str]]:
    """(label, text) of how far to trust estimate ``e``: its expected error band
    (:class:`autopar.cost.regime.ErrorBand`) and its plausibility warnings."""
    band = getattr(e, "error_band", None)
    out = [("expected error", band.describe())] if band else []
    return out + [("warning", w) for w in getattr(e, "warnings", ())]


def estimate_lines(e) -> list[str]:
    """The numbers of an estimate, one per line: step time with its expected error band
    (:class:`autopar.cost.regime.ErrorBand`), plausibility warnings, MFU, memory, comm."""
    c = e.config
    t = e.time_breakdown
    band = getattr(e, "error_band", None)
    lines = [
        f"step time        {e.step_time_s:.3f} s{' ' + band.text() if band else ''}   "
        f"({e.tokens_per_s:,.0f} tokens/s, "
        f"{e.seconds_per_billion_tokens / 3600:.2f} h per 1B tokens)",
    ]
    lines += [f"{k:16s} {v}" for k, v in trust_lines(e)]
    lines += [
        f"MFU / HFU        {e.mfu * 100:.1f}% / {e.hfu * 100:.1f}%",
        f"micro-batch      {micro_batch_text(c, e.num_micro_batches)}",
        "time breakdown   " + ", ".join(f"{k} {v:.3f}s" for k, v in t.as_dict().items()
                                          if v > 0),
        f"memory per GPU   {_gb(e.memory_per_gpu_bytes)} of {_gb(e.memory_limit_bytes)} "
        f"({'fits' if e.fits else 'DOES NOT FIT'}; peak on pipeline rank {e.peak_stage})",
        "  " + ", ".join(f"{k} {_gb(v)}" for k, v in e.memory_breakdown.as_dict().items()),
    ]
    if e.comm_by_link:
        lines.append("communication    " + ", ".join(
            f"{lc.link}: {_gb(lc.nbytes)} sent in {lc.seconds:.2f}s"
            for lc in e.comm_by_link) + " per GPU per step (bytes on the wire; seconds "
            "before overlap)")
    return lines


def reshard_text(c) -> str:
    """How many decoder blocks FSDP keeps gathered from forward to backward
    (``ParallelConfig.reshard_after_forward`` False), e.g. "FSDP keeps 80 of 80 blocks
    gathered"; "" when it reshards every block (the default) or the plan is not ZeRO-3."""
    r = getattr(c, "reshard_after_forward", None)
    if c.zero_stage != 3 or r is None or all(r):
        return ""
    return f"FSDP keeps {sum(1 for x in r if not x)} of {len(r)} blocks gathered forward to backward"


def config_text(c) -> str:
    """Degrees and choices of a config on one line."""
    rc = c.recompute if isinstance(c.recompute, str) else "per-block"
    modules = getattr(c, "recompute_modules", None)
    if modules:   # Megatron-Core's --recompute-modules of the selective blocks
        rc += f"[{'+'.join(modules)}]"
    kept = reshard_text(c)
    return (f"tp={c.tp} pp={c.pp} dp={c.dp} cp={c.cp}" + (f" ep={c.ep}" if c.ep > 1 else "")
            + f" sp={'on' if c.sequence_parallel else 'off'} "
            f"zero={c.zero_stage} recompute={rc} mbs={c.micro_batch_size} "
            f"v={c.virtual_stages} schedule={c.schedule}"
            + (f" vp_group={c.vp_group}" if getattr(c, "vp_group", None) else "")
            + (f" ({kept})" if kept else ""))


def group_text(c) -> str:
    """The micro-batch group of an interleaved schedule (:attr:`autopar.config.ParallelConfig.
    vp_group`) in words, "" when the schedule groups by its own default."""
    n = getattr(c, "vp_group", None)
    if not n or (c.virtual_stages or 1) <= 1:
        return ""
    return (f"{plural(n, 'micro-batch', 'micro-batches')} per chunk in turn (Megatron-LM "
            "--microbatch-group-size-per-virtual-pipeline-stage)")


def plan_summary(plan) -> str:
    """The readable table :meth:`autopar.Plan.summary` returns."""
    e, c = plan.estimate, plan.config
    head = (f"autopar plan: {plan.model} on {plan.cluster} ({plural(plan.world_size, 'GPU')}), "
            f"global batch {plan.train.global_batch_size} x {plan.train.seq_len} tokens, "
            f"{plan.train.precision}{offload_text(plan.train)}{capacity_text(plan.train)}")
    lines = [head, "-" * len(head), "parallelism      " + config_text(c)]
    edits = getattr(plan, "profile_edits", None)
    if edits:
        lines.append(f"framework        {plan.train.framework}, costed with edited profile "
                     f"fields: " + ", ".join(f"{k}={v['value']!r} ({v['source']})"
                                             for k, v in sorted(edits.items())))
    if e.group_links and e.group_links.as_dict():
        lines.append("placement        " + ", ".join(
            f"{d} over {link}" for d, link in e.group_links.as_dict().items()
            if link != "local"))
    lines.append(f"pipeline         {plural(c.pp, 'stage')} x {plural(c.virtual_stages, 'chunk')}")
    lines += recompute_text(c.recompute, c.stage_blocks, c.pp, c.schedule)
    lines += estimate_lines(e)
    if plan.alternatives:
        lines.append(f"alternatives     (one per kind of plan; \"tie\": equal step time within "
                     f"{TIE_RTOL:g}, the simpler plan ranks first)")
        objective = getattr(plan.search, "objective", "fastest")
        faster = passed_over(e, plan.alternatives, objective)
        for i, a in enumerate(plan.alternatives):
            lines.append(f"  {a.step_time_s:.3f} s ({gap_text(a.step_time_s, e.step_time_s)})"
                         f"  {_gb(a.memory_per_gpu_bytes)}  {config_text(a.config)}")
            if i == 0 and faster is not None:
                lines.append(f"    note: {passed_over_note(e, faster)}")
        note = None if faster is not None else runner_up_note(e, plan.alternatives)
        if note:
            lines.append(f"  note: {note}")
    s = plan.search
    objective = getattr(s, "objective", "fastest")
    lines.append(f"objective        {objective_text(e, plan.alternatives, objective)}")
    lines.append(f"search           {plural(s.evaluated, 'configuration')} estimated, "
                 f"{plural(s.meshes, 'mesh', 'meshes')} in the space, "
                 f"{s.wall_s:.2f} s{'' if s.complete else ' (stopped early: best so far)'}")
    return "\n".join(lines)
