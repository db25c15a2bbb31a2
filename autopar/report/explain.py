"""Why one plan beats another, and what to change to fit: comparisons of Estimates, component by
component, re-estimated with the same cost model.

    problem = Problem.build("llama2-70b", "4x8xA100-80GB", TrainingConfig(1024, 4096))
    plan, result = autopar.api.search_plan(problem)
    for name, fixed in canonical_alternatives(problem):
        alt, note = autopar.alternatives.best_under(problem, fixed)   # those choices pinned
        print(compare(plan.estimate, alt, name, note).sentence())

The searches (the best plan under pinned choices, the comparisons of ``autopar explain``:
:func:`autopar.alternatives.named_alternatives`) are above the report (docs/design.md, "Layer
order"); this module compares estimates it is given and re-estimates one configuration at most.

Everything is in SI (seconds, bytes); the sentences convert at the edge (GB = 1e9 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..config import ParallelConfig
from ..cost.types import Estimate
from ..errors import AutoparError
from ..frameworks import rules
# defined here before the problem layer (autopar.problem); importable from here as before
from ..problem import Problem

#: How link classes are written in sentences.
LINK_NAMES = {"nvlink": "NVLink", "nvswitch": "NVSwitch", "pcie": "PCIe",
              "infiniband": "InfiniBand", "roce": "RoCE", "efa": "EFA", "ethernet": "Ethernet",
              "xgmi": "Infinity Fabric", "local": "no link"}

#: Which mesh dimension's link each time component travels over (``dp_copies`` crosses none:
#: the sharded-DP implementation's copies in GPU memory on the compute stream, see
#: :class:`autopar.cost.types.Estimate`).
_COMPONENT_DIM = {"tp_comm": "tp", "cp_comm": "cp", "pp_comm": "pp", "dp_comm_exposed": "dp",
                  "overlap_slowdown": "dp"}

_TIME_WORDS = {"compute": "compute", "tp_comm": "TP all-reduce/all-gather",
               "cp_comm": "context-parallel K/V exchange", "pp_comm": "pipeline send/recv",
               "bubble": "pipeline bubble", "dp_comm_exposed": "exposed data-parallel sync",
               "overlap_slowdown": "compute slowed by the data-parallel sync beside it",
               "dp_copies": "sharded data parallelism's GPU-memory copies around its gathers "
                            "and reduce-scatters (on the compute stream, no link)",
               "optimizer": "optimizer step",
               "fixed_step": "the framework profile's fixed cost per step"}

_MEMORY_WORDS = {"optimizer_states": "optimizer states", "transient": "transient buffers"}

#: Configuration fields shown when two plans differ.
#: every field of the plan's configuration (a field left out read as "same" in the diffs of
#: plans that differed only in it, e.g. ep)
CONFIG_FIELDS = tuple(f.name for f in fields(ParallelConfig))


def fmt_s(x: float, signed: bool = False) -> str:
    """Seconds for reading: ``"12.35 s"``, or ``"3.2 ms"`` / ``"45 us"`` below 0.1 s."""
    sign = "+" if signed else ""
    if abs(x) >= 0.1 or x == 0:
        return f"{x:{sign},.2f} s"
    if abs(x) >= 1e-4:
        return f"{x * 1e3:{sign}.2f} ms"
    return f"{x * 1e6:{sign}.1f} us"


def link_name(kind: str | None) -> str:
    """A link class as written in sentences (``infiniband`` -> ``InfiniBand``)."""
    return LINK_NAMES.get(kind or "local", str(kind))


def config_diff(base: ParallelConfig, other: ParallelConfig) -> list[str]:
    """The fields where ``other`` differs from ``base``, as ``"tp 2->8"`` strings; FSDP's
    per-block ``reshard_after_forward`` as the blocks it keeps gathered, in the plan table's
    words (:func:`autopar.report.summary.reshard_text`): ``"FSDP keeps 0->22 of 32 blocks
    gathered"``, when both plans are ZeRO-3 (else the ZeRO change says it)."""
    out = []
    for name in CONFIG_FIELDS:
        a, b = getattr(base, name, None), getattr(other, name, None)
        if _inert(name, base, other):
            continue
        if name == "placement":
            from ..config import DEFAULT_PLACEMENT
            a, b = "-".join(a or DEFAULT_PLACEMENT), "-".join(b or DEFAULT_PLACEMENT)
        if name == "reshard_after_forward" and a != b and not (
                base.zero_stage == other.zero_stage == 3):
            continue   # only ZeRO-3 gathers: the zero change says it (no count of "kept")
        if name == "reshard_after_forward" and a != b:
            # None: every block reshards (ZeRO-3's default), i.e. none is kept gathered
            blocks = len(a if a is not None else b)
            ka, kb = _kept(a), _kept(b)
            out.append(f"FSDP keeps {ka}->{kb} of {blocks} blocks gathered" if ka != kb else
                       f"FSDP keeps {ka} of {blocks} blocks gathered (other blocks)")
        elif a != b:
            out.append(f"{_SHORT.get(name, name)} {_value(a)}->{_value(b)}")
    return out


#: Configuration fields under the short names the plan table uses.
_SHORT = {"sequence_parallel": "sp", "zero_stage": "zero", "micro_batch_size": "mbs",
          "virtual_stages": "v", "stage_blocks": "cuts"}


def _inert(name: str, base: ParallelConfig, other: ParallelConfig) -> bool:
    """Whether field ``name`` means nothing in both configs, so a difference in it is no
    difference: the CP mode without CP, SP without TP, the dispatcher without EP, an expert TP
    left to its default that equals the one given (etp defaults to tp)."""
    if name == "cp_mode":
        return base.cp == other.cp == 1
    if name == "sequence_parallel":
        return base.tp == other.tp == 1
    if name == "dispatcher":
        return base.ep == other.ep == 1
    if name == "expert_tp":
        a = base.expert_tp if base.expert_tp is not None else base.tp
        b = other.expert_tp if other.expert_tp is not None else other.tp
        return a == b
    return False


def _kept(reshard: tuple[bool, ...] | None) -> int:
    """Blocks FSDP keeps gathered forward to backward under ``reshard_after_forward`` (False
    entries; None: every block reshards)."""
    return 0 if reshard is None else sum(1 for x in reshard if not x)


def _value(v) -> str:
    if v is None:   # a choice left to its default (e.g. expert_tp: etp = tp)
        return "default"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, tuple) and all(isinstance(x, str) for x in v):
        # per-block recompute: how many blocks take each mode ("per-block" alone read the same
        # on both sides of a difference)
        counts = {m: v.count(m) for m in dict.fromkeys(v)}
        return "+".join(f"{n} {m}" for m, n in counts.items())
    if isinstance(v, tuple) and len(v) > 8:
        # many stage cuts: runs of equal counts ("2*62/3/1"), else the line fills the screen
        runs: list[list] = []
        for x in v:
            if runs and runs[-1][0] == x:
                runs[-1][1] += 1
            else:
                runs.append([x, 1])
        return "/".join(f"{x}*{n}" if n > 1 else str(x) for x, n in runs)
    if isinstance(v, tuple):
        return "/".join(str(x) for x in v)  # stage cuts: blocks per stage
    return str(v)


@dataclass(frozen=True)
class Difference:
    """One component that differs between two estimates.

    Attributes:
        kind: "time" (seconds per step), "memory" (bytes on the peak GPU) or "comm" (seconds of
            communication per step on one link class, before overlap).
        component: the key (``tp_comm``, ``activations``, ``infiniband``...).
        base / other: its value in the reference and the compared estimate.
        words: how a sentence names it (with the link it crosses when it is communication).
    """

    kind: str
    component: str
    base: float
    other: float
    words: str

    @property
    def delta(self) -> float:
        """other - base."""
        return self.other - self.base

    def short(self) -> str:
        """E.g. ``"tp_comm +12.3 s"`` (tables)."""
        if self.kind == "memory":
            return f"{self.component} {self.delta / 1e9:+.1f} GB"
        return f"{self.component} {fmt_s(self.delta, True)}"

    def phrase(self) -> str:
        """E.g. ``"+12.3 s of TP all-reduce/all-gather on InfiniBand"``."""
        if self.kind == "memory":
            return f"{self.delta / 1e9:+.1f} GB of {self.words}"
        return f"{fmt_s(self.delta, True)} of {self.words}"


@dataclass(frozen=True)
class Comparison:
    """An estimate set against a reference (usually the best plan).

    Attributes:
        name: what the compared plan is ("TP=8 inside each node", "alternative 2", ...).
        base / other: the reference and the compared estimate (``other`` may not fit).
        time: time components that differ, largest absolute difference first.
        memory: memory components that differ, largest first.
        comm: communication seconds per link class that differ, largest first.
        note: why no fitting plan exists under this name, when none does.
        base_name: how sentences name ``base`` ("the best"; "the plan found" when a stopped
            search found it).
    """

    name: str
    base: Estimate
    other: Estimate
    time: tuple[Difference, ...]
    memory: tuple[Difference, ...]
    comm: tuple[Difference, ...]
    note: str = ""
    base_name: str = "the best"

    @property
    def slowdown_s(self) -> float:
        """Step-time difference (seconds, positive when ``other`` is slower)."""
        return self.other.step_time_s - self.base.step_time_s

    def sentence(self, top: int = 3) -> str:
        """The comparison in words and numbers."""
        o, b = self.other, self.base
        pct = 100 * self.slowdown_s / b.step_time_s
        verdict = "slower" if self.slowdown_s > 0 else "faster"
        diff = ", ".join(config_diff(b.config, o.config)) or "same configuration"
        if abs(pct) < 0.05:
            head = f"{self.name} ({diff}): same step time as {self.base_name} within 0.05%"
        else:
            head = (f"{self.name} ({diff}): {fmt_s(abs(self.slowdown_s))}/step {verdict} "
                    f"({pct:+.1f}%), MFU {o.mfu * 100:.1f}% vs {b.mfu * 100:.1f}%")
        if not o.fits:
            head += (f"; does NOT fit: {o.memory_per_gpu_bytes / 1e9:.1f} GB per GPU of "
                     f"{o.memory_limit_bytes / 1e9:.0f} GB")
        parts = [d.phrase() for d in self.time[:top] if abs(d.delta) >= 0.005 * b.step_time_s]
        text = head + "."
        if parts:
            text += " Mainly " + ", ".join(parts) + "."
        mem = [d.phrase() for d in self.memory[:2] if abs(d.delta) >= 0.5e9]
        if mem:
            text += (f" Memory {o.memory_per_gpu_bytes / 1e9:.1f} vs "
                     f"{b.memory_per_gpu_bytes / 1e9:.1f} GB: " + ", ".join(mem) + ".")
        if self.note:
            text += " " + self.note
        return text

    def to_dict(self) -> dict:
        """Plain-JSON form (seconds and bytes)."""
        def rows(ds):
            return [{"component": d.component, "base": d.base, "other": d.other,
                     "delta": d.delta, "words": d.words} for d in ds]
        return {"name": self.name, "sentence": self.sentence(),
                "config": self.other.config.to_dict(),
                "config_diff": config_diff(self.base.config, self.other.config),
                "step_time_s": self.other.step_time_s, "slowdown_s": self.slowdown_s,
                "mfu": self.other.mfu, "hfu": self.other.hfu, "fits": self.other.fits,
                "memory_per_gpu_bytes": self.other.memory_per_gpu_bytes,
                "time": rows(self.time), "memory": rows(self.memory), "comm": rows(self.comm),
                "note": self.note}


def _time_words(key: str, est: Estimate, ref: Estimate) -> str:
    words = _TIME_WORDS.get(key, key.replace("_", " "))
    dim = _COMPONENT_DIM.get(key)
    if dim:
        # the link of the plan that spends the time (a saving names the other plan's link)
        mine = est.time_breakdown.as_dict().get(key, 0.0)
        theirs = ref.time_breakdown.as_dict().get(key, 0.0)
        src = est if getattr(est.config, dim) > 1 and mine >= theirs else ref
        if getattr(src.config, dim) <= 1:
            src = est
        words += f" on {link_name(src.group_links.of(dim) if src.group_links else None)}"
    if key == "compute" and est.config.recompute != ref.config.recompute:
        # the recomputation is one cause of a compute difference among others: the per-GPU
        # share of the work (tp, cp, dp, micro-batch, ...) is named first where it changes too
        also = [f"{_SHORT.get(f, f)} {_value(getattr(est.config, f))} vs "
                f"{_value(getattr(ref.config, f))}"
                for f in _WORK_FIELDS if getattr(est.config, f) != getattr(ref.config, f)]
        words += " (" + "".join(a + ", " for a in also) + (
            f"recompute {_value(est.config.recompute)} vs {_value(ref.config.recompute)})")
    return words


#: Fields whose change moves a GPU's compute besides its recomputation.
_WORK_FIELDS = ("tp", "cp", "pp", "dp", "micro_batch_size", "ep", "expert_tp",
                "sequence_parallel")


def compare(base: Estimate, other: Estimate, name: str, note: str = "") -> Comparison:
    """Set ``other`` against ``base`` component by component (time, memory, comm per link)."""
    def diffs(kind, a: dict, b: dict, words):
        keys = list(dict.fromkeys([*a, *b]))
        out = [Difference(kind, k, float(a.get(k, 0.0)), float(b.get(k, 0.0)), words(k))
               for k in keys if a.get(k, 0.0) != b.get(k, 0.0)]
        return tuple(sorted(out, key=lambda d: -abs(d.delta)))
    return Comparison(
        name=name, base=base, other=other,
        time=diffs("time", base.time_breakdown.as_dict(), other.time_breakdown.as_dict(),
                   lambda k: _time_words(k, other, base)),
        memory=diffs("memory", base.memory_breakdown.as_dict(), other.memory_breakdown.as_dict(),
                     lambda k: _MEMORY_WORDS.get(k, k.replace("_", " "))),
        comm=diffs("comm", {lc.link: lc.seconds for lc in base.comm_by_link},
                   {lc.link: lc.seconds for lc in other.comm_by_link},
                   lambda k: f"communication on {link_name(k)} (before overlap)"),
        note=note)


def canonical_alternatives(problem: Problem) -> list[tuple[str, dict]]:
    """Named layouts people reach for, as ``fixed=`` choices (the rest is searched):
    TP over one node, TP spanning two nodes, pure data parallelism with ZeRO-3 (FSDP), and a
    pipeline-heavy layout. Layouts the model or cluster forbids are left out."""
    cm = problem.cost_model
    g, cl = cm.graph, cm.cluster
    world = cl.world_size
    out: list[tuple[str, dict]] = [(name, {"tp": tp, "cp": 1}) for tp, name in _tp_layouts(problem)
                                   if _tp_refusal(problem, tp) is None]
    if world > 1:   # on one GPU there is no data-parallel rank to shard with
        out.append(("pure data parallel with ZeRO-3 (FSDP)",
                    {"tp": 1, "pp": 1, "cp": 1, "zero_stage": 3}))
    blocks = max(g.num_blocks, 1)
    pps = [p for p in range(2, min(blocks, world) + 1)
           if rules.mesh_size(world, 1, p, 1) is None
           and rules.batch_split(cm.train.global_batch_size, world // p) is None]
    if pps:
        out.append((f"pipeline-heavy PP={pps[-1]}", {"tp": 1, "cp": 1, "pp": pps[-1]}))
    return out


def left_out_notes(problem: Problem) -> list[str]:
    """Why each layout of :func:`canonical_alternatives` is left out, one sentence each (none
    when all are compared): a tensor-parallel layout the rules refuse, ZeRO-3 on one GPU."""
    cl = problem.cluster
    world = cl.world_size
    out = []
    if world == 1:
        out.append("pure data parallel with ZeRO-3 (FSDP): on one GPU there is no "
                   "data-parallel rank to shard the model states with.")
    for tp, name in _tp_layouts(problem):
        broken = _tp_refusal(problem, tp)
        if broken is None:
            continue
        if broken.rule == "tp_experts":
            out.append(f"{name}: {broken.problem} ({broken.fix}).")
        elif broken.rule == "mesh_size":
            out.append(f"{name} is not possible: the cluster has {world} GPU"
                       f"{'' if world == 1 else 's'} ({cl.num_nodes} node"
                       f"{'' if cl.num_nodes == 1 else 's'}).")
        else:
            out.append(f"{name} is not possible: {broken.problem}.")
    return out


def _tp_layouts(problem: Problem) -> tuple[tuple[int, str], ...]:
    """(tp, name) of the two tensor-parallel layouts compared: TP over one node, over two (TP
    across nodes on purpose, so the ``tp_node`` rule does not apply)."""
    node = problem.cluster.gpus_per_node
    return ((node, f"TP={node} inside each node"), (2 * node, f"TP={2 * node} across two nodes"))


def _tp_refusal(problem: Problem, tp: int) -> rules.Violation | None:
    """The first rule a ``tp`` (pp = cp = 1) layout breaks on this model and cluster, or None;
    heads read as the search space reads them (unknown counts as 1)."""
    g, profile = problem.cost_model.graph, problem.cost_model.profile
    broken = (rules.mesh_size(problem.cluster.world_size, tp, 1, 1)
              or rules.tp_heads(tp, g.attention_heads or 1, g.kv_heads or 1,
                                profile.kv_heads_below_tp))
    if broken is None and tp > 1 and g.num_experts and not profile.experts_tp_sharded:
        # the search leaves these out too (autopar.search.space.meshes): the cost model would
        # price the experts split over TP, which this framework does not do
        return rules.Violation(
            "tp_experts", f"{profile.name} keeps experts whole on every TP rank, which the cost "
                          "model does not price (it splits them), so it is not compared",
            "--framework megatron or torchtitan, which split experts over TP")
    return broken


def tp_across_nodes(problem: Problem, est: Estimate) -> tuple[str, Estimate] | None:
    """``est`` re-estimated with its TP groups laid across nodes (every other mesh dimension
    placed inside TP, so TP ranks are strided), or None when that keeps TP inside a node."""
    from ..config import MESH_DIMS
    c = est.config
    others = [d for d in MESH_DIMS if d != "tp" and getattr(c, d) > 1]
    if c.tp == 1 or not others:
        return None
    order = tuple(others + ["tp"] + [d for d in MESH_DIMS if d != "tp" and d not in others])
    try:
        moved = problem.cost_model.estimate(c.replace(placement=order))
    except AutoparError:
        return None
    link = moved.group_links.tp if moved.group_links else None
    if link == (est.group_links.tp if est.group_links else None):
        return None
    stride = 1
    for d in others:
        stride *= getattr(c, d)
    return f"TP={c.tp} across nodes (ranks strided by {stride}, over {link_name(link)})", moved


#: The note on a layout faster than the plan of a search that was stopped (time limit, Ctrl-C).
UNREACHED = ("Faster than the plan found: the search was stopped before it reached this "
             "layout.")
