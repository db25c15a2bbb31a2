"""Colossal-AI booster plugin arguments for a plan: which plugin (``HybridParallelPlugin``,
``MoeHybridParallelPlugin``, ``GeminiPlugin``, ``LowLevelZeroPlugin``) and its keyword arguments,
as JSON (``plugin_class(**doc["kwargs"])``).

Names and rules follow Colossal-AI at 4f9953be (version.txt 0.5.0; PyPI 0.5.0 pins
torch<=2.5.1, so autopar's tests check the output against a recorded schema,
``tests/data/colossalai_plugins.json``, written by ``benchmarks/colossalai_plugins.py``):
``colossalai/booster/plugin/hybrid_parallel_plugin.py`` (zero_stage 0-2, 0-1 with pipelining;
sequence-parallel modes; the process-group mesh (dp, pp, tp, sp), or (pp, dp, tp, sp) with
``dp_outside=False``, tp and sp swapped for ``ring_attn``), ``moe_hybrid_parallel_plugin.py``
(ep_size divides dp; ZeRO-2 turned into 1), ``gemini_plugin.py`` (ZeRO-3 chunks, tp_size, no
pipeline, fp16/bf16 only), ``low_level_zero_plugin.py`` (stage 1-2) and
``pipeline/stage_manager.py`` (``num_layers_per_stage``: one entry per stage, non-interleaved).

autopar has no Colossal-AI profile: the written configuration is re-estimated under ``torch``
(stock torch.distributed), which prices Colossal-AI's own ZeRO, shardformer layers and pipeline
schedules only approximately (said in the warnings).
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import UnsupportedPlanError
from ..verdict import per_block_text
from .common import (Export, balanced_cut, block_modes, finish, one_reshard_policy, own_rounds,
                     unwritten)

#: The Colossal-AI source the names were read from.
COLOSSALAI_VERSION = "Colossal-AI 0.5.0 (4f9953be335ef371b3848719ddafe596c01ecd37)"

#: autopar's CP exchanges -> HybridParallelPlugin ``sequence_parallelism_mode`` (shardformer
#: SUPPORT_SP_MODE): "ring_attn" is zigzag ring attention over sp_size ranks, "all_to_all" is
#: DeepSpeed-Ulysses-style head scattering.
CP_MODES = {"ring": "ring_attn", "ulysses": "all_to_all"}

_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp8": "bf16"}


def to_colossalai_plugin(plan) -> Export:
    """Colossal-AI plugin arguments for ``plan``: ``{"plugin": name, "kwargs": {...},
    "autopar": {...}}``; the ``autopar`` section holds what the training script sets itself
    (world size, DataLoader batch per data-parallel rank, gradient accumulation, whether to call
    ``model.gradient_checkpointing_enable()``). Plain ZeRO-3 is Gemini, ZeRO-1/2 over data
    parallelism alone LowLevelZero, experts MoeHybridParallel, everything else HybridParallel.

    Raises:
        UnsupportedPlanError: a plan that drops MoE tokens at a capacity (set in the model code).
    """
    c, t = plan.config, plan.train
    if t.moe_capacity_factor is not None:
        raise UnsupportedPlanError(
            f"moe_capacity_factor={t.moe_capacity_factor}: Colossal-AI sets expert capacity in "
            "the model code, not in the plugin. Fix: plan with moe_capacity_factor=None, or "
            "export for Megatron-LM (to_megatron_args).")
    warn = [f"autopar has no {COLOSSALAI_VERSION} profile: re-estimated under torch, which "
            "prices its ZeRO, shardformer layers and schedules approximately"]
    w = one_reshard_policy(c, own_rounds(c, "Colossal-AI", warn), "Colossal-AI", warn)
    mbs = c.micro_batch_size or t.micro_batch_size or 1
    common = {"precision": _PRECISION[t.precision], "enable_flash_attention": t.flash_attention,
              "max_norm": 1.0}
    t_written = t
    if t.precision == "fp8":
        common["use_fp8"] = True   # hybrid_parallel_plugin.py use_fp8: fp8 linear layers
    plugin, kwargs, w = _choose(c, w, warn)
    kwargs.update(common)
    if plugin == "GeminiPlugin":
        if t.precision == "fp32":
            warn.append("precision fp32: Gemini trains in fp16 or bf16 only; used bf16")
            kwargs["precision"], t_written = "bf16", replace(t, precision="bf16")
        kwargs["placement_policy"] = "static"
        kwargs["offload_param_frac"] = 1.0 if t.param_offload else 0.0
        kwargs["offload_optim_frac"] = 1.0 if (t.optimizer_offload or t.param_offload) else 0.0
    elif t.param_offload:
        warn.append(f"param_offload: {plugin} offloads the optimizer only (cpu_offload); "
                    "parameters stay on the GPU")
        t_written = replace(t_written, param_offload=False)
    if plugin != "GeminiPlugin" and t.optimizer_offload:
        if w.zero_stage >= 1:
            kwargs["cpu_offload"] = True
        else:
            warn.append("optimizer_offload: Colossal-AI offloads the optimizer under ZeRO only; "
                        "not written at ZeRO-0")
            t_written = replace(t_written, optimizer_offload=False)
    t_written = unwritten(t_written, "activation_offload", warn,
                          "activation_offload: Colossal-AI's plugins have no activation offload; "
                          "not written")
    t_written = unwritten(t_written, "optimizer_state_dtype", warn,
                          f"optimizer_state_dtype {t.optimizer_state_dtype}: the plugins keep "
                          "fp32 master states; used fp32")
    if w.pp > 1:
        kwargs["microbatch_size"] = mbs   # one step's batch per dp rank runs as micro-batches
        batch, accum = t.global_batch_size // w.dp, 1
    else:
        batch, accum = mbs, max(1, t.global_batch_size // (mbs * w.dp))
    modes = block_modes(plan)
    ckpt = set(modes) != {"none"}
    if ckpt:
        if set(modes) != {"full"}:
            warn.append(f"recompute ({per_block_text(modes)}): Colossal-AI checkpoints whole "
                        "layers (model.gradient_checkpointing_enable()); used full on every "
                        "block (never more memory than planned)")
        w = w.replace(recompute="full")
    doc = {"plugin": plugin, "kwargs": kwargs,
           "autopar": {"world_size": w.tp * w.pp * w.cp * w.dp, "global_batch_size":
                       t.global_batch_size, "dataloader_batch_size": batch,
                       "gradient_accumulation_steps": accum, "seq_len": t.seq_len,
                       "gradient_checkpointing": ckpt, "written_for": COLOSSALAI_VERSION}}
    return finish(plan, doc, warn, w.replace(micro_batch_size=mbs), "torch", comment="",
                  train=t_written)


def _choose(c, w, warn: list[str]):
    """(plugin name, its parallel kwargs, the written configuration)."""
    model_parallel = c.tp > 1 or c.pp > 1 or c.cp > 1
    if c.ep > 1:
        return _hybrid(c, w, warn, moe=True)
    if c.zero_stage == 3 and c.pp == 1 and c.cp == 1:
        sp = c.tp > 1 and c.sequence_parallel
        # gemini_plugin.py: mesh (zero, extra_dp, tp), tp innermost; SP as split_gather
        return "GeminiPlugin", {"tp_size": c.tp, "enable_sequence_parallelism": sp}, _placed(
            c, w, ("tp", "dp"), warn)
    if c.zero_stage in (1, 2) and not model_parallel:
        return "LowLevelZeroPlugin", {"stage": c.zero_stage}, w
    return _hybrid(c, w, warn, moe=False)


def _hybrid(c, w, warn: list[str], moe: bool):
    name = "MoeHybridParallelPlugin" if moe else "HybridParallelPlugin"
    kw: dict = {"tp_size": c.tp, "pp_size": c.pp}
    if moe:
        kw["ep_size"] = c.ep
        if c.folded:
            warn.append(f"expert_tp={c.etp}: MoeHybridParallelPlugin splits experts over ep "
                        f"inside data parallelism with the attention's tp; written with etp = "
                        f"tp={c.tp}")
            w = w.replace(expert_tp=None)
        if c.dispatcher == "deepep":
            warn.append("dispatcher deepep: Colossal-AI dispatches with all-to-all; used it")
            w = w.replace(dispatcher="alltoall")
    zero = c.zero_stage
    if zero == 3:
        why = ("Gemini (its ZeRO-3) has no pipeline" if c.pp > 1 else
               "Gemini (its ZeRO-3) has no context parallelism" if c.cp > 1 else
               "MoeHybridParallelPlugin has no ZeRO-3")
        zero = 1 if c.pp > 1 or moe else 2
        warn.append(f"zero_stage 3: {why}; used HybridParallelPlugin zero_stage {zero}")
    if c.pp > 1 and zero == 2:
        # hybrid_parallel_plugin.py: "zero stage must be 0 or 1 when using pipeline parallelism"
        warn.append("zero_stage 2: Colossal-AI runs ZeRO 0 or 1 with pipeline parallelism; used 1")
        zero = 1
    if moe and zero == 2:
        # moe_hybrid_parallel_plugin.py turns ZeRO-2 into 1 ("program hang when some experts
        # are not routed")
        warn.append("zero_stage 2: MoeHybridParallelPlugin runs ZeRO-1 instead; used 1")
        zero = 1
    kw["zero_stage"] = zero
    w = w.replace(zero_stage=zero)
    sp_mode = None
    if c.cp > 1:
        mode = c.cp_mode
        if mode == "allgather" or (moe and mode == "ring"):
            # moe_hybrid_parallel_plugin.py sets sp_size for all_to_all only
            new = "ulysses" if moe else "ring"
            why = ("MoeHybridParallelPlugin runs all_to_all only" if moe
                   else "Colossal-AI has no all-gather CP")
            warn.append(f"cp_mode={mode}: {why}; used {new} ({CP_MODES[new]})")
            mode = new
            w = w.replace(cp_mode=mode)
        sp_mode = CP_MODES[mode]
        kw.update(enable_sequence_parallelism=True, sequence_parallelism_mode=sp_mode,
                  sp_size=c.cp)
        if c.tp > 1 and c.sequence_parallel:
            warn.append(f"sequence_parallel with cp: Colossal-AI's {sp_mode} mode splits the "
                        "sequence over the sp ranks only; TP activations stay whole over the "
                        "sequence (more activation memory)")
            w = w.replace(sequence_parallel=False)
    elif c.tp > 1 and c.sequence_parallel:
        sp_mode = "split_gather"   # Megatron-style SP over the TP group
        kw.update(enable_sequence_parallelism=True, sequence_parallelism_mode=sp_mode)
    if c.pp > 1:
        w = _pipeline(c, w, kw, warn)
    # mesh (dp, pp, tp, sp), or (pp, dp, tp, sp) with dp_outside=False; ring_attn swaps tp/sp
    inner = ("tp", "cp") if sp_mode == "ring_attn" else ("cp", "tp")
    want = tuple(d for d in (c.placement or ("tp", "cp", "dp", "pp")) if getattr(c, d) > 1)
    dp_first = want.index("dp") < want.index("pp") if c.dp > 1 and c.pp > 1 else True
    if not moe:
        kw["dp_outside"] = not dp_first
    else:
        kw["moe_dp_outside"] = not dp_first
    order = inner + (("dp", "pp") if dp_first else ("pp", "dp"))
    return name, kw, _placed(c, w, order, warn)


def _pipeline(c, w, kw: dict, warn: list[str]):
    v = c.virtual_stages or 1
    schedule = c.schedule or ("interleaved-1f1b" if v > 1 else "1f1b")
    if schedule in ("zbv-zero-bubble", "dualpipev", "dualpipe", "interleaved-zero-bubble"):
        # pp_style "zbv" needs scheduler_nodes, a Python schedule graph a JSON cannot hold
        warn.append(f"schedule {schedule}: Colossal-AI's zero-bubble V schedule needs "
                    "scheduler_nodes built in Python; written as interleaved 1F1B with "
                    f"{max(v, 2)} chunks per stage")
        v, schedule = max(v, 2), "interleaved-1f1b"
    elif schedule == "gpipe":
        warn.append("schedule gpipe: Colossal-AI runs 1F1B or interleaved; used 1F1B")
        schedule = "1f1b" if v == 1 else "interleaved-1f1b"
    kw["pp_style"] = "1f1b" if v == 1 else "interleaved"
    kw["num_model_chunks"] = v
    cuts = c.stage_blocks
    if cuts and v == 1:
        kw["num_layers_per_stage"] = list(cuts)
    elif cuts and len(set(cuts)) > 1:
        cuts = balanced_cut(sum(cuts), c.pp * v)
        warn.append(f"stage cuts {c.stage_blocks}: Colossal-AI takes num_layers_per_stage for "
                    f"non-interleaved pipelines only (pipeline/stage_manager.py); its default "
                    f"split is estimated as {cuts}")
    return w.replace(virtual_stages=v, schedule=schedule, stage_blocks=cuts)


def _placed(c, w, order: tuple[str, ...], warn: list[str]):
    """``w`` laid out as Colossal-AI builds ``order`` (innermost first), said when it is not the
    plan's placement."""
    real = tuple(d for d in order if getattr(c, d) > 1)
    want = tuple(d for d in (c.placement or ("tp", "cp", "dp", "pp")) if getattr(c, d) > 1)
    full = order + tuple(d for d in ("tp", "cp", "dp", "pp") if d not in order)
    if real != want:
        warn.append(f"rank placement {'-'.join(want)} (innermost first): Colossal-AI's mesh "
                    f"for these plugin arguments is {'-'.join(real)}; the groups are laid out so")
    return w.replace(placement=full)
