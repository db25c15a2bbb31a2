"""What an exported file will really do: the configuration an exporter writes, re-estimated with
autopar's cost model, against the plan; and, when the framework cannot run the plan as
estimated, the nearest plan it can run.

An exporter maps the plan onto a framework's flags; where the framework lacks a choice it writes
the nearest one (ZeRO-3 becomes Megatron's distributed optimizer under pipelining, DeepSpeed
pipelines run ZeRO-1, interleaved chunks become equal, ...). :func:`verdict` estimates the
configuration actually written (``written``), under the same model, cluster and training
configuration, and returns lines for the export's warnings: step time and memory against the
plan's, whether it still fits, and, when it does not fit or the framework's profile refuses it,
the best plan found by searching again restricted to the framework
(``TrainingConfig(framework=...)``).

The cost model is the problem layer's (:func:`autopar.problem.plan_cost_model`); the search for
the nearest plan is above the runtime (:func:`autopar.alternatives.nearest`), reached through
:mod:`autopar.hooks` (docs/design.md, "Layer order").
"""

from __future__ import annotations

from dataclasses import replace

from .. import hooks
from ..config import ParallelConfig, TrainingConfig
from ..cost.model import CostModel
from ..errors import AutoparError
from ..frameworks import edits_text, with_edits
from ..graph import hf
from ..problem import plan_cost_model

#: GB in the printed verdicts: 1e9 bytes (decimal, as GPU datasheets).
GB = 1e9


def plans_cost_model(plan, train: TrainingConfig, profile=None) -> CostModel:
    """Cost model of the plan's model (from ``plan.model_config``, or a Hugging Face preset
    rebuilt on meta from its name) and cluster under ``train``, as the plan-file loader builds
    it (:func:`autopar.problem.plan_cost_model`; graphs cached).

    Raises:
        AutoparError: the model or cluster spec cannot be rebuilt.
    """
    config = dict(plan.model_config) if plan.model_config else None
    return plan_cost_model(config, plan.cluster, train, name=plan.model, profile=profile)


def describe(c: ParallelConfig) -> str:
    """One line naming a configuration's choices: degrees, ZeRO stage, recompute, micro-batch,
    schedule."""
    rc = c.recompute if isinstance(c.recompute, str) else "per-block " + "/".join(
        sorted(set(c.recompute)))
    v = f" v={c.virtual_stages}" if (c.virtual_stages or 1) > 1 else ""
    cp = f" ({c.cp_mode})" if c.cp > 1 else ""
    return (f"tp={c.tp} pp={c.pp} cp={c.cp}{cp} dp={c.dp} ZeRO-{c.zero_stage} recompute {rc} "
            f"micro-batch {c.micro_batch_size} {c.schedule}{v}")


def per_block_text(values, words: dict | None = None, runs_shown: int = 4) -> str:
    """A per-block tuple in words and counts, each value with its blocks as ranges, e.g.
    ``("full",) * 60 + ("none",) * 20`` -> ``"full on 60 of 80 blocks (0-59), none on 20
    (60-79)"``; ``words`` names values (e.g. ``{False: "kept gathered"}``); at most
    ``runs_shown`` ranges per value, then how many more."""
    values = tuple(values)
    order = list(dict.fromkeys(values))
    if len(order) == 1:
        return f"{(words or {}).get(order[0], order[0])} on all {len(values)} blocks"
    parts = []
    for i, v in enumerate(order):
        idx = [b for b, x in enumerate(values) if x == v]
        runs, start = [], idx[0]
        for a, b in zip(idx, idx[1:] + [None]):
            if b != a + 1:
                runs.append(f"{start}-{a}" if a > start else f"{start}")
                start = b
        shown = ", ".join(runs[:runs_shown]) + (
            f", and {len(runs) - runs_shown} more runs" if len(runs) > runs_shown else "")
        of = f" of {len(values)} blocks" if i == 0 else ""
        parts.append(f"{(words or {}).get(v, v)} on {len(idx)}{of} ({shown})")
    return ", ".join(parts)


#: How the per-block FSDP flags read (ParallelConfig.reshard_after_forward).
_RESHARD_WORDS = {True: "resharded after forward", False: "kept gathered to backward"}


def _value_text(name: str, value) -> str:
    """A configuration field's value for a person: per-block tuples in words and counts."""
    if name == "recompute" and isinstance(value, tuple):
        return f"per block: {per_block_text(value)}"
    if name == "reshard_after_forward":
        return ("every block resharded after forward" if value is None
                else f"per block: {per_block_text(value, _RESHARD_WORDS)}")
    return repr(value)


def _differences(planned: ParallelConfig, written: ParallelConfig) -> list[str]:
    out = []
    for name in ("tp", "pp", "cp", "dp", "zero_stage", "recompute", "sequence_parallel",
                 "micro_batch_size", "virtual_stages", "schedule", "stage_blocks", "cp_mode",
                 "reshard_after_forward"):
        a, b = getattr(planned, name), getattr(written, name)
        if a != b:
            out.append(f"{name} {_value_text(name, b)} (planned {_value_text(name, a)})")
    return out


def plan_edits(plan, framework: str) -> dict:
    """The plan's edits of ``framework``'s profile (``plan.profile_edits``); {} when the plan
    was costed for another framework (its edits are that one's) or with the stock profile."""
    return dict(getattr(plan, "profile_edits", None) or {}) \
        if framework == plan.train.framework else {}


def verdict(plan, written: ParallelConfig, framework: str,
            train: TrainingConfig | None = None, needs: str = "",
            wrote_edits: tuple[str, ...] = (),
            limits: dict | None = None,
            framework_cut: bool = False,
            runner_edits: dict | None = None) -> tuple[list[str], bool | None]:
    """Lines saying what the exported configuration will do under ``framework``.

    Args:
        plan: the :class:`autopar.Plan` exported.
        written: the configuration the exporter actually wrote, in autopar's terms.
        framework: the target's name (a key of :data:`autopar.frameworks.PROFILES`).
        train: the training configuration written, when it differs from ``plan.train`` (e.g.
            precision bf16 in place of fp8).
        needs: what the user must add before the file starts (e.g. torchtitan's model flavor);
            the lines then say what the file runs once that is done.
        wrote_edits: the plan's profile edits (``plan.profile_edits``) the file sets (e.g.
            Megatron-LM's ``--tp-comm-overlap``); the others are said, and the re-estimate runs
            the framework's defaults for them.
        limits: degrees the file's runner fixes beyond ``framework``'s profile (e.g. ``pp=1``
            for Accelerate, re-estimated under the torch profile): the nearest plan keeps them
            (:func:`autopar.alternatives.nearest`).
        framework_cut: ``written.stage_blocks`` is the cut the framework computes itself (e.g.
            DeepSpeed's partition by parameter count), so the profile's rule for planned cuts
            does not judge it.
        runner_edits: cost fields where the file's runner differs from ``framework``'s
            profile whatever the plan (:func:`autopar.frameworks.with_edits`' form, each with
            its source), e.g. Accelerate's torch context parallelism running fused attention
            where plan.apply's does not.

    Returns:
        (lines, fits). Lines for the export's warnings: the re-estimate (step time in seconds,
        memory in GB = 1e9 bytes, both against the plan's), "fits" or "DOES NOT FIT", and, when
        the framework cannot run the plan as estimated, the nearest plan it can run. ``fits``:
        the written configuration fits and the framework runs it; None when it could not be
        re-estimated (a plan without ``model_config``, e.g. from a user's module: the line
        says so).
    """
    edits = plan_edits(plan, framework)
    unwritten = {k: e for k, e in edits.items() if k not in wrote_edits}
    profile = with_edits(framework, {**(runner_edits or {}),
                                     **{k: e for k, e in edits.items() if k in wrote_edits}})
    train = replace(train or plan.train, framework=profile.name)
    pe = plan.estimate
    diffs = _differences(plan.config, written)
    edited = ([f"the plan was costed with edited {framework} profile fields this file does not "
               f"set ({edits_text(unwritten)}); the re-estimate runs {framework}'s defaults "
               "for them"] if unwritten else [])
    # exporters write recompute mixes in the framework's own patterns (Megatron's first-N
    # layers per stage, torchtitan's every N-th block), which the profile's one-policy rule for
    # the search does not cover: judge the rest
    judged = written.replace(recompute=_strongest(written.recompute))
    if framework_cut:
        judged = judged.replace(stage_blocks=None)
    refused = (profile.unsupported(judged)
               or profile.seq_violation(train.seq_len, written.tp, written.cp,
                                        bool(written.sequence_parallel)))
    same = (not diffs and train.precision == plan.train.precision and not unwritten
            and framework == plan.train.framework and not runner_edits)
    once = f"once {needs}, " if needs else ""
    if same and refused is None:
        return [f"re-estimated under {profile.name}: {once}this file runs the plan as estimated "
                f"({pe.step_time_s:.4g} s per step, {pe.memory_per_gpu_bytes / GB:.1f} GB of "
                f"{pe.memory_limit_bytes / GB:.1f} GB per GPU)"], pe.fits
    if not plan.model_config and plan.model not in hf.HF_PRESETS:
        return [f"not re-estimated: this file changes {', '.join(diffs) or 'the precision'} "
                "and the plan has no model_config to rebuild the model from. Fix: plan from a "
                "preset or model dict, or call autopar.estimate(model, cluster, train, "
                "<the written config>) yourself"], None
    try:
        cm = plans_cost_model(plan, train, profile)
        e = cm.estimate(written)
    except AutoparError as exc:
        return [f"not re-estimated: {exc}"], None
    fits = e.fits and refused is None
    what = (diffs or ([f"precision {train.precision}"] if train.precision != plan.train.precision
                      else []) or (["defaults for the edited fields"] if unwritten else [])
            or [f"the plan's own configuration, which was costed for {plan.train.framework}"])
    head = (f"re-estimated under {profile.name}, what this file runs"
            f"{' once ' + needs if needs else ''} ("
            f"{', '.join(what)}): "
            f"{e.step_time_s:.4g} s per step ({pct_text(e.step_time_s, pe.step_time_s)} vs the "
            f"plan's {pe.step_time_s:.4g} s), {e.memory_per_gpu_bytes / GB:.1f} GB per GPU "
            f"(plan {pe.memory_per_gpu_bytes / GB:.1f} GB{_moved(pe, e)}) of "
            f"{e.memory_limit_bytes / GB:.1f} GB: " + ("fits" if e.fits else "DOES NOT FIT"))
    lines = [*edited, head]
    # the headroom warning of what the file runs (its memory differs from the plan's)
    lines += [w for w in e.warnings if w.startswith("memory: ")]
    if refused is not None:
        lines.append(f"{profile.name} cannot run it as written: {refused}")
    if not fits:
        # a search: done above the runtime (autopar.alternatives.nearest)
        lines.append(hooks.call("nearest", cm, profile.name, pe, limits,
                                memory_margin=plan.search.memory_margin or None))
    return lines, fits


def _moved(plan_e, e) -> str:
    """"; gradients 8.7 -> 17.4 GB" for the parts of the peak rank's memory that moved by 0.5 GB
    or more between the plan's estimate and the file's (at most three, largest first): what the
    framework keeps differently, which the configuration changes alone do not say."""
    a, b = plan_e.memory_breakdown, e.memory_breakdown
    parts = ("weights", "gradients", "optimizer_states", "activations", "transient",
             "reserved")
    moved = sorted(((abs(getattr(b, k) - getattr(a, k)), k) for k in parts), reverse=True)
    words = [f"{k.replace('_', ' ')} {getattr(a, k) / GB:.1f} -> {getattr(b, k) / GB:.1f} GB"
             for d, k in moved[:3] if d >= 0.5 * GB]
    return "; " + ", ".join(words) if words else ""


def _strongest(recompute) -> str:
    modes = (recompute,) if isinstance(recompute, str) else recompute
    return max(modes, key=("none", "selective", "selective-op", "full").index)


def pct_text(x: float, ref: float) -> str:
    """``x`` against ``ref`` as a signed percentage, e.g. ``"+12.5%"``; ``"n/a"`` when
    ``ref`` is not positive."""
    return f"{100 * (x / ref - 1):+.1f}%" if ref > 0 else "n/a"
