"""Rich tables of plans, estimates and comparisons, for the command line (units converted here,
at the edge: GB = 1e9 bytes, times in seconds or milliseconds as labelled)."""

from __future__ import annotations

from collections import Counter

from rich.table import Table

from ..cost.pipeline.orders import stage_rank
from ..cost.types import Estimate, GroupLinks
from .explain import Comparison, config_diff, link_name
from ..search.robust import passed_over, passed_over_note
from .summary import accumulation_why, gap_text, group_text, plural, reshard_text, runner_up_note

_DIMS = (("tp", "tensor parallel"), ("cp", "context parallel"), ("pp", "pipeline parallel"),
         ("dp", "data parallel"))


def _table(title: str, **kw) -> Table:
    """A table whose title is never wrapped (its minimum width is the title's)."""
    return Table(title=title, title_justify="left", min_width=len(title) + 1, **kw)


def _gb(x: float) -> str:
    return f"{x / 1e9:,.1f}"


def _domain(cluster) -> tuple[str, str]:
    """(the intra-node link class, what to add after its name) for a cluster whose node is a
    rack-scale domain (NVL72: "inside one 72-GPU NVLink domain") or a mesh (xGMI: how many of
    the peer links a group uses); ("", "") otherwise or without a cluster."""
    if cluster is None:
        return "", ""
    intra = cluster.link_classes[0]
    if cluster.domain_text():
        return intra, f" (inside one {cluster.gpus_per_node}-GPU domain)"
    if cluster.intra_link.mesh_links:
        return intra, f" (mesh: a group of k uses k-1 of {cluster.intra_link.mesh_links} links)"
    return "", ""


def degrees_table(e: Estimate, cluster=None) -> Table:
    """Mesh degrees, which link class each dimension's groups cross, and the other choices;
    given the ``cluster``, a node that is a rack-scale NVLink domain (NVL72) gets a row saying
    so and the groups inside it are marked."""
    c = e.config
    t = _table("Parallelism and placement")
    t.add_column("dimension")
    t.add_column("degree", justify="right")
    t.add_column("groups cross")
    links = e.group_links or GroupLinks()
    intra, note = _domain(cluster)

    def crossed(kind):
        return link_name(kind) + (note if intra and kind == intra else "")

    for dim, words in _DIMS:
        deg = getattr(c, dim)
        t.add_row(f"{dim} ({words})", str(deg), crossed(links.of(dim)) if deg > 1 else "-")
    if c.ep > 1 or c.folded:  # experts split over ep of the dp x cp ranks, and / or cut by etp
        t.add_row("ep (expert parallel)", str(c.ep), crossed(links.ep) if c.ep > 1 else "-")
        if c.folded:
            t.add_row("expert tp (MoE folding)", str(c.etp),
                      crossed(links.etp) if c.etp > 1 and links.etp else "-")
        t.add_row("token dispatcher", c.dispatcher,
                  "DeepEP: a token sent once per node" if c.dispatcher == "deepep" else "")
    if cluster is not None and cluster.domain_text():
        net = link_name(cluster.link_classes[1]) if cluster.num_nodes > 1 else "no link"
        t.add_row("node (scale-up domain)", f"{cluster.gpus_per_node} GPUs",
                  f"{cluster.domain_text()}; {cluster.num_nodes} such node"
                  f"{'s' if cluster.num_nodes != 1 else ''} joined by {net}")
    rc = c.recompute if isinstance(c.recompute, str) else "per block (see stages)"
    t.add_row("sequence parallelism", "on" if c.sequence_parallel else "off", "")
    t.add_row("ZeRO stage", str(c.zero_stage), f"over dp x cp = {c.dp * c.cp}" if c.zero_stage else "")
    if reshard_text(c):
        t.add_row("FSDP reshard", "per block", reshard_text(c))
    t.add_row("recompute", rc, "")
    t.add_row("schedule", f"{c.schedule}, v={c.virtual_stages}" if c.pp > 1 else
              "- (no pipeline)", group_text(c))
    m = e.num_micro_batches
    t.add_row("micro-batch", plural(c.micro_batch_size, "sequence"),
              f"{plural(m, 'micro-batch', 'micro-batches')} per step per data-parallel replica "
              f"({accumulation_why(c, m)})")
    return t


def _ranges(blocks: list[int]) -> str:
    if not blocks:
        return "-"
    out, start, prev = [], blocks[0], blocks[0]
    for b in blocks[1:] + [None]:
        if b is not None and b == prev + 1:
            prev = b
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if b is not None:
            start = prev = b
    if len(out) > 4:
        return ", ".join(out[:3]) + f", ... ({len(out)} chunks)"
    return ", ".join(out)


def stage_rows(e: Estimate) -> list[dict]:
    """Per pipeline rank: its decoder blocks, extra layers, recompute modes and costs (chunks
    placed as :func:`autopar.cost.pipeline.orders.stage_rank` places them)."""
    c = e.config
    counts = list(c.stage_blocks or (0,))
    nblocks = sum(counts)
    modes = c.block_recompute(nblocks) if nblocks else ()
    starts = [sum(counts[:i]) for i in range(len(counts))]
    rows = []
    for rank in range(c.pp):
        # chunk ci's rank as the cost model places it (a V for zbv-zero-bubble/dualpipev)
        chunks = [ci for ci in range(len(counts)) if stage_rank(ci, c.pp, c.schedule) == rank]
        blocks = [b for ci in chunks for b in range(starts[ci], starts[ci] + counts[ci])]
        extra = []
        if 0 in chunks:
            extra.append("embedding")
        if len(counts) - 1 in chunks:
            extra.append("head")
        mix = Counter(modes[b] for b in blocks)
        rows.append({
            "rank": rank, "blocks": blocks, "extra": extra,
            "recompute": {k: mix[k] for k in sorted(mix)},
            "fwd_s": e.stage_fwd_s[rank] if e.stage_fwd_s else None,
            "bwd_s": e.stage_bwd_s[rank] if e.stage_bwd_s else None,
            "memory_bytes": e.stage_memory_bytes[rank],
        })
    return rows


def stages_table(e: Estimate) -> Table:
    """Pipeline ranks: blocks (layers), recompute per block, time per micro-batch (the host
    issue time no GPU work hides included, as the title says when there is any), memory."""
    host = " fwd/bwd include the exposed host issue time;" if e.time_breakdown.host_exposed else ""
    t = _table(f"Pipeline stages (per micro-batch;{host} memory is the rank's peak, * the "
               "highest)")
    for col, just in (("rank", "right"), ("blocks (layers)", "left"), ("# blocks", "right"),
                      ("recompute", "left"), ("fwd ms", "right"), ("bwd ms", "right"),
                      ("memory GB", "right")):
        t.add_column(col, justify=just)
    for r in stage_rows(e):
        blocks = _ranges(r["blocks"]) + ("" if not r["extra"] else " + " + ", ".join(r["extra"]))
        rc = ", ".join(f"{k} x{v}" for k, v in r["recompute"].items()) or "-"
        mark = " *" if r["rank"] == e.peak_stage else ""
        t.add_row(str(r["rank"]), blocks, str(len(r["blocks"])), rc,
                  "-" if r["fwd_s"] is None else f"{r['fwd_s'] * 1e3:,.1f}",
                  "-" if r["bwd_s"] is None else f"{r['bwd_s'] * 1e3:,.1f}",
                  _gb(r["memory_bytes"]) + mark)
    return t


def performance_table(e: Estimate) -> Table:
    """Step time, throughput, MFU/HFU and the step's time breakdown."""
    t = _table("Step time")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("share", justify="right")
    t.add_row("step time", f"{e.step_time_s:,.3f} s"
              + (f" {e.error_band.text()}" if e.error_band else ""), "100%")
    for k, v in e.time_breakdown.as_dict().items():
        if v > 0:
            # MoE folding: the expert-TP group's collectives are priced with TP's
            label = f"{k} (incl. expert tp)" if k == "tp_comm" and e.config.folded else k
            # below a millisecond in ms, so a small component does not read 0.000 s
            t.add_row(f"  {label}", f"{v:,.3f} s" if v >= 1e-3 else f"{v * 1e3:.3f} ms",
                      f"{100 * v / e.step_time_s:.1f}%")
    t.add_row("tokens/s (cluster)", f"{e.tokens_per_s:,.0f}", "")
    t.add_row("MFU / HFU", f"{e.mfu * 100:.1f}% / {e.hfu * 100:.1f}%", "")
    return t


def memory_table(e: Estimate) -> Table:
    """Peak memory per GPU by component, against the GPU's memory."""
    verdict = "fits" if e.fits else "DOES NOT FIT"
    t = _table(f"Memory per GPU (pipeline rank {e.peak_stage}): {verdict}")
    t.add_column("component")
    t.add_column("GB", justify="right")
    for k, v in e.memory_breakdown.as_dict().items():
        t.add_row(k, _gb(v))
    t.add_row("total", _gb(e.memory_per_gpu_bytes), style="bold")
    # the column is GB (1e9); the GiB figure is the one GPU tools print
    t.add_row(f"usable GPU memory ({e.memory_limit_bytes / 2**30:.1f} GiB = "
              f"{_gb(e.memory_limit_bytes)} GB)", _gb(e.memory_limit_bytes))
    return t


def comm_table(e: Estimate) -> Table:
    """Communication of one GPU per step by link class: bytes on the wire it sends (ring
    factors applied: :attr:`Estimate.comm_by_link`), seconds before overlap, and which
    dimensions use each link."""
    t = _table("Communication per GPU per step (one GPU of the slowest pipeline rank)")
    t.add_column("link")
    t.add_column("sent on the wire, GB", justify="right")
    t.add_column("seconds (before overlap)", justify="right")
    t.add_column("used by")
    users: dict[str, list[str]] = {lc.link: list(lc.dims) for lc in e.comm_by_link
                                   if lc.dims is not None}
    if any(lc.dims is None for lc in e.comm_by_link):   # plan files of earlier versions:
        users = {}                                       # the bottleneck links
        for dim, link in (e.group_links.as_dict() if e.group_links else {}).items():
            if getattr(e.config, dim) > 1:
                users.setdefault(link, []).append(dim)
    for lc in e.comm_by_link:
        dims = [d if d != "tp" or not e.config.folded else "tp (incl. expert tp)"
                for d in users.get(lc.link, [])]
        t.add_row(link_name(lc.link), _gb(lc.nbytes), f"{lc.seconds:,.2f}", ", ".join(dims))
    return t


_ALTERNATIVES_TITLE = ("Top alternatives, one per kind of plan (differences from the {base}; "
                       "tie = equal step time, simpler plan first)")


def alternatives_table(best: Estimate, alts, money: list[dict] | None = None,
                       title: str = _ALTERNATIVES_TITLE, objective: str = "fastest") -> Table:
    """Runner-up estimates: step time, slowdown (:func:`autopar.report.summary.gap_text`: "tie"
    when equal within the search's tolerance), memory, MFU and what differs from ``best``;
    with ``money`` (one :func:`autopar.report.advice.run_cost` dict per row, best first) also days and
    cost of the whole run. Under the robust ``objective`` a first alternative faster than
    ``best`` is the fastest plan it passed over, noted so
    (:func:`autopar.search.robust.passed_over_note`), and row 0 and the columns call ``best``
    "chosen", not "best". ``title`` may hold ``{base}``, replaced by that word."""
    faster = passed_over(best, alts, objective)
    base = "best" if faster is None else "chosen"
    t = _table(title.replace("{base}", "best" if faster is None else "chosen plan"))
    for col in ("#", "step s", f"vs {base}", "memory GB", "MFU", f"differs from {base}"):
        t.add_column(col, justify="left" if col.startswith("differs") else "right")
    if money:
        t.add_column("days", justify="right")
        t.add_column(f"cost, {money[0].get('currency', 'USD')}", justify="right")
    for i, a in enumerate([best, *alts]):
        diff = (("(best)" if faster is None else f"(chosen by the {objective} objective)")
                if i == 0 else (", ".join(config_diff(best.config, a.config)) or "same"))
        row = [str(i), f"{a.step_time_s:,.3f}",
               "" if i == 0 else gap_text(a.step_time_s, best.step_time_s),
               _gb(a.memory_per_gpu_bytes) + ("" if a.fits else " OOM"),
               f"{a.mfu * 100:.1f}%", diff]
        if money:
            m = money[i]
            row += [f"{m['days']:,.1f}", "-" if m["cost"] is None else f"{m['cost']:,.0f}"]
        t.add_row(*row)
    note = (f"alternative 1 is {passed_over_note(best, faster)}" if faster is not None
            else runner_up_note(best, alts))
    if note:
        t.caption, t.caption_justify = f"note: {note}", "left"
    return t


def money_table(rows: list[tuple[str, Estimate, dict]], tokens: float) -> Table:
    """Wall-clock days, GPU-hours and cost of training on ``tokens`` tokens, per plan, each
    with its step time's error band (days, GPU-hours and cost scale with the step time)."""
    t = _table(f"Whole run: {tokens:.3g} tokens")
    currency = rows[0][2].get("currency", "USD") if rows else "USD"
    for col in ("plan", "tokens/s", "days", "GPU-hours", f"cost, {currency}", "band"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for name, e, m in rows:
        band = e.error_band.text() if e.error_band is not None else "± unknown"
        t.add_row(name, f"{e.tokens_per_s:,.0f}", f"{m['days']:,.1f}", f"{m['gpu_hours']:,.0f}",
                  "-" if m["cost"] is None else f"{m['cost']:,.0f}", band)
    t.caption, t.caption_justify = ("days, GPU-hours and cost scale with the step time: each "
                                    "carries its band"), "left"
    return t


def fixes_table(base: Estimate, fixes: list[tuple[str, Estimate]], margin: float = 0.0) -> Table:
    """Changes to an estimate's config, each re-estimated: memory, fit, time, MFU. A fitting
    change that leaves less than ``margin`` (a fraction) of the GPU's memory free, the search's
    memory margin, reads "yes, <margin free"."""
    t = _table("What to change to fit (each re-estimated)")
    for col in ("change", "memory GB", "fits", "step s", "vs yours", "MFU / HFU"):
        t.add_column(col, justify="left" if col == "change" else "right")
    for text, e in fixes:
        free = 1.0 - e.memory_per_gpu_bytes / e.memory_limit_bytes
        fits = ("no" if not e.fits else "yes" if free >= margin else
                f"yes, {free:.0%} free < {margin:.0%}")
        t.add_row(text, _gb(e.memory_per_gpu_bytes), fits,
                  f"{e.step_time_s:,.3f}", f"{100 * (e.step_time_s / base.step_time_s - 1):+.1f}%",
                  f"{e.mfu * 100:.1f}% / {e.hfu * 100:.1f}%")
    floor = _common_floor([e for _t, e in fixes if not e.fits])
    if floor is not None:
        t.caption, t.caption_justify = (
            f"note: several changes stop at the same {floor / 1e9:.1f} GB: past them the peak "
            "is the model states and the optimizer step's working memory, which recomputation "
            "and SP do not lower (more GPUs, ZeRO or a larger tp/pp do)"), "left"
    return t


def _common_floor(rows: list[Estimate]) -> float | None:
    """The peak (bytes) two or more non-fitting changes share to a part in a thousand, the
    lowest such; None when none do."""
    peaks = sorted(e.memory_per_gpu_bytes for e in rows)
    for a, b in zip(peaks, peaks[1:]):
        if b <= a * (1 + 1e-3):
            return a
    return None


def comparison_table(comps: list[Comparison], complete: bool = True) -> Table:
    """One row per compared plan: slowdown, MFU, memory and the largest differences
    (``complete`` False: the base is the best plan a stopped search found, and is named so)."""
    base = "chosen" if complete else "found"
    # under the robust objective the chosen plan need not be the fastest: "why it wins" was
    # untrue above the faster plan it passed over
    t = _table("Why this plan was chosen (differences: compared plan minus it)" if complete else
               "The plan found before the search stopped, against other layouts (differences: "
               "compared plan minus the plan found)")
    for col in ("plan", "config", "step s", f"vs {base}", "MFU", "memory GB",
                "largest differences"):
        t.add_column(col, justify="right" if col in ("step s", f"vs {base}", "MFU", "memory GB")
                     else "left")
    for cmp in comps:
        o = cmp.other
        parts = [d.short() for d in cmp.time[:2]]
        if cmp.memory:
            parts.append(cmp.memory[0].short())
        c = o.config
        t.add_row(cmp.name, f"tp={c.tp} pp={c.pp} dp={c.dp} cp={c.cp} zero={c.zero_stage} "
                  f"rc={c.recompute if isinstance(c.recompute, str) else 'mixed'} "
                  f"mbs={c.micro_batch_size} v={c.virtual_stages} {c.schedule}"
                  + (f" ep={c.ep}" if c.ep > 1 else "")
                  + (f" etp={c.etp}" if c.folded else ""),
                  f"{o.step_time_s:,.3f}", gap_text(o.step_time_s, cmp.base.step_time_s),
                  f"{o.mfu * 100:.1f}%",
                  _gb(o.memory_per_gpu_bytes) + ("" if o.fits else " OOM"), "; ".join(parts))
    return t


def _count(n: int) -> str:
    """A parameter count for a person: 6.74B, 152.4K (B = 1e9, M = 1e6, K = 1e3)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:,.{2 if n < 10 * scale else 1}f}{unit}"
    return str(n)


def model_row(name: str, config, source: str = "") -> dict:
    """One preset as plain JSON: its name, family, parameter count and shape (counts); for a
    mixture of experts its routed experts, top-k and expert FFN width; MTP modules; and where
    its numbers come from. ``ffn_hidden`` is the dense layers' width (None when every layer
    is MoE); ``moe`` and ``latent_attention`` say whether it has routed experts and MLA."""
    dense = not config.is_moe or any(not config.moe_layer(i) for i in range(config.num_layers))
    return {"name": name, "family": config.family, "parameters": config.num_parameters,
            "layers": config.num_layers, "hidden": config.hidden_size,
            "heads": config.num_heads, "kv_heads": config.num_kv_heads,
            "ffn_hidden": config.ffn_hidden_size if dense else None,
            "experts": config.num_experts, "top_k": config.top_k,
            "expert_ffn_hidden": config.moe_ffn_hidden_size,
            "moe": config.is_moe, "latent_attention": config.uses_mla,
            "mtp_layers": config.mtp_layers, "vocabulary": config.vocab_size,
            "context_length": config.seq_len, "source": source}


def hf_models_table(rows: list[dict]) -> Table:
    """Hugging Face presets (:func:`autopar.graph.hf.describe` dicts): the transformers class
    traced on meta, layers, hidden size, routed experts and top-k, and vocabulary (counts)."""
    t = _table("Hugging Face presets (transformers models traced on meta; need autopar\\[hf]; "
               "experts: routed, top-k)")
    for title in ("name", "transformers class", "layers", "hidden", "experts", "vocabulary"):
        t.add_column(title, justify="left" if title in ("name", "transformers class") else "right")
    for r in rows:
        experts = (f"{r['experts']:,} top-{r['top_k']}" if r.get("experts") else "-")
        t.add_row(r["name"], r["model_class"],
                  *(f"{r[k]:,}" if isinstance(r[k], int) else "-" for k in ("layers", "hidden")),
                  experts, f"{r['vocabulary']:,}" if isinstance(r["vocabulary"], int) else "-")
    return t


def models_table(rows: list[dict]) -> Table:
    """Model presets (:func:`model_row` dicts): parameters (B = 1e9), layers, hidden size,
    attention and KV heads, FFN width, vocabulary and context length (tokens)."""
    t = _table("Model presets (family: the block's norm, MLP and positions, MoE: routed experts; "
               "parameters: B = 1e9, M = 1e6, with any MTP module; KV heads: MLA for latent "
               "attention; context length in tokens; FFN: dense layers; experts: routed, top-k, "
               "FFN each)")
    cols = (("name", "name"), ("family", "family"), ("parameters", "parameters"),
            ("layers", "layers"), ("hidden", "hidden"), ("heads", "heads"),
            ("KV heads", "kv_heads"), ("FFN", "ffn_hidden"), ("experts", "experts"),
            ("vocabulary", "vocabulary"), ("context", "context_length"))
    for title, _ in cols:
        t.add_column(title, justify="left" if title in ("name", "family") else "right")
    for r in rows:
        cells = {k: (_count(v) if k == "parameters" else f"{v:,}" if isinstance(v, int)
                     else "-" if v is None else str(v)) for k, v in r.items()}
        if r.get("mtp_layers"):
            cells["layers"] += f" + {r['mtp_layers']} MTP"
        if r.get("moe"):
            cells["family"] += " MoE"
        if r.get("latent_attention"):   # keys and values come from a shared latent, not heads
            cells["kv_heads"] = "MLA"
        cells["experts"] = (f"{r['experts']} top-{r['top_k']} x {r['expert_ffn_hidden']:,}"
                            if r.get("experts") else "-")
        t.add_row(*(cells[k] for _, k in cols))
    return t
