"""Read Colossal-AI booster plugin arguments (the JSON :mod:`autopar.runtime.export.colossalai`
writes) into autopar's terms, refusing what the plugin's ``__init__`` asserts against (Colossal-AI
0.5.0, ``colossalai/booster/plugin``), with the assertion and a fix."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InvalidParallelConfig
from .imported import Imported, read_source, refusal

#: Colossal-AI 0.5.0 plugins autopar reads (colossalai/booster/plugin).
COLOSSALAI_PLUGINS = ("HybridParallelPlugin", "MoeHybridParallelPlugin", "GeminiPlugin",
                      "LowLevelZeroPlugin")


def from_colossalai_plugin(source: str | Path | dict, world_size: int | None = None) -> Imported:
    """Read Colossal-AI plugin arguments: the JSON autopar writes (``{"plugin", "kwargs",
    "autopar"}``; a path, its text or the dict). ``world_size``: the processes, when the JSON
    has no ``autopar.world_size`` (Colossal-AI takes it from the launcher).

    Raises:
        InvalidParallelConfig: not JSON, an unknown plugin, or arguments the plugin's
            ``__init__`` asserts against (the assertion quoted, with a fix).
    """
    if isinstance(source, dict):
        doc = source
    else:
        try:
            doc = json.loads(read_source(source, "Colossal-AI plugin JSON"))
        except json.JSONDecodeError as exc:
            raise InvalidParallelConfig(f"the Colossal-AI plugin file is not JSON: {exc}. Fix: "
                                        "pass the JSON autopar wrote.") from exc
    plugin, kw = doc.get("plugin"), dict(doc.get("kwargs") or {})
    extra = dict(doc.get("autopar") or {})
    if plugin not in COLOSSALAI_PLUGINS:
        raise refusal(f"Colossal-AI plugin {plugin!r}: autopar reads "
                      f"{', '.join(COLOSSALAI_PLUGINS)}", "name one of them in \"plugin\"")
    world = extra.get("world_size") or world_size
    notes: list[str] = []
    precision = kw.get("precision", "fp16")
    train: dict = {"precision": "fp8" if kw.get("use_fp8") else precision}
    if plugin == "LowLevelZeroPlugin":
        par = _colossal_llz(kw, precision)
    elif plugin == "GeminiPlugin":
        par = _colossal_gemini(kw, precision, world, train, notes)
    else:
        par = _colossal_hybrid(kw, plugin, precision, world, notes)
    if kw.get("cpu_offload"):
        train["optimizer_offload"] = True
    if world:
        mp = par.get("tp", 1) * par.get("pp", 1) * par.get("cp", 1)
        par["dp"] = world // mp
    if extra.get("gradient_checkpointing"):
        par["recompute"] = "full"
    elif "gradient_checkpointing" in extra:
        par["recompute"] = "none"
    mbs = kw.get("microbatch_size") if par.get("pp", 1) > 1 else extra.get(
        "dataloader_batch_size")
    if mbs:
        par["micro_batch_size"] = train["micro_batch_size"] = int(mbs)
    for key in ("global_batch_size", "seq_len"):
        if extra.get(key):
            train[key] = int(extra[key])
    return Imported(parallel=par, train=train, notes=tuple(notes))


def _colossal_llz(kw: dict, precision: str) -> dict:
    stage = kw.get("stage", 1)
    if stage not in (1, 2):   # low_level_zero_plugin.py
        raise refusal(f"Colossal-AI: LowLevelZeroPlugin only supports stage 1/2 training "
                      f"(stage {stage})", "use GeminiPlugin for ZeRO-3, or stage 1 or 2")
    if precision not in ("fp16", "bf16", "fp32"):
        raise refusal(f"Colossal-AI: LowLevelZeroPlugin only supports fp16, bf16, fp32 "
                      f"(precision {precision!r})", "pick one of them")
    return {"zero_stage": stage}


def _colossal_gemini(kw: dict, precision: str, world, train: dict, notes: list[str]) -> dict:
    if precision not in ("fp16", "bf16"):   # gemini_plugin.py SUPPORTED_PRECISION
        raise refusal(f"Colossal-AI: precision {precision} is not supported by GeminiPlugin "
                      "(fp16, bf16)", "use bf16")
    tp, extra_dp = int(kw.get("tp_size", 1)), int(kw.get("extra_dp_size", 1))
    if world and world % (tp * extra_dp):
        raise refusal(f"Colossal-AI Gemini: the global group size ({world}) can't be evenly "
                      f"divided by the subgroup size (tp_size {tp} x extra_dp_size {extra_dp})",
                      "choose tp_size dividing the processes")
    if extra_dp > 1:
        notes.append(f"extra_dp_size {extra_dp}: ZeRO-3 over part of dp is modelled as over all.")
    if float(kw.get("shard_param_frac", 1.0)) < 1.0:
        notes.append("shard_param_frac < 1 (some parameters replicated) is modelled as full "
                     "ZeRO-3.")
    if float(kw.get("offload_param_frac", 0.0)) > 0:
        train["param_offload"] = True
    if float(kw.get("offload_optim_frac", 0.0)) > 0:
        train["optimizer_offload"] = True
    return {"tp": tp, "zero_stage": 3,
            "sequence_parallel": bool(kw.get("enable_sequence_parallelism")) and tp > 1}


def _colossal_hybrid(kw: dict, plugin: str, precision: str, world, notes: list[str]) -> dict:
    if "tp_size" not in kw or "pp_size" not in kw:
        raise refusal(f"Colossal-AI {plugin} needs tp_size and pp_size", "give both (1 for none)")
    tp, pp = int(kw["tp_size"]), int(kw["pp_size"])
    zero = int(kw.get("zero_stage", 0))
    if world and world % (tp * pp):
        raise refusal(f"Colossal-AI: world size {world} is not divisible by tp_size {tp} * "
                      f"pp_size {pp}", "choose tp and pp whose product divides the processes")
    if zero not in (0, 1, 2):
        raise refusal(f"Colossal-AI {plugin}: zero_stage {zero} is not 0, 1 or 2",
                      "use GeminiPlugin for ZeRO-3")
    if precision not in ("fp16", "bf16", "fp32"):
        raise refusal(f"Colossal-AI: precision {precision!r} is not fp16, bf16 or fp32",
                      "pick one of them")
    par: dict = {"tp": tp, "pp": pp}
    if plugin == "MoeHybridParallelPlugin" and zero == 2:
        notes.append("MoeHybridParallelPlugin turns zero_stage 2 into 1 (ZeRO-2 can hang when "
                     "some experts get no tokens).")
        zero = 1
    if pp > 1:
        style = kw.get("pp_style", "1f1b")
        chunks = int(kw.get("num_model_chunks", 1))
        if style not in ("1f1b", "interleaved", "zbv"):
            raise refusal(f"Colossal-AI: unsupported pipeline parallelism style {style!r}",
                          "use 1f1b, interleaved or zbv")
        if style == "1f1b" and chunks != 1:
            raise refusal("Colossal-AI: num_model_chunks must be 1 when using 1f1b",
                          "set num_model_chunks 1 or pp_style interleaved")
        if style == "interleaved" and chunks < 2:
            raise refusal("Colossal-AI: number of model chunks must be > 1 when using "
                          "interleaved", "set num_model_chunks 2 or more")
        if style == "zbv" and chunks != 2:
            raise refusal("Colossal-AI: num_model_chunks must be 2 when using zero bubble "
                          "pipeline", "set num_model_chunks 2")
        if kw.get("num_microbatches") is None and kw.get("microbatch_size") is None:
            raise refusal("Colossal-AI: num_microbatches or microbatch_size must be specified "
                          "when using pipeline parallelism", "give microbatch_size")
        if zero > 1:
            raise refusal("Colossal-AI: to avoid prohibitive gradient synchronization costs, "
                          "zero stage must be 0 or 1 when using pipeline parallelism",
                          "set zero_stage 1")
        par["virtual_stages"] = chunks
        par["schedule"] = {"1f1b": "1f1b", "interleaved": "interleaved-1f1b",
                           "zbv": "zbv-zero-bubble"}[style]
        cuts = kw.get("num_layers_per_stage")
        if cuts is not None:
            if len(cuts) != pp:   # pipeline/stage_manager.py
                raise refusal(f"Colossal-AI: num_layers_per_stage has {len(cuts)} entries for "
                              f"{pp} stages", f"give {pp} layer counts")
            par["stage_blocks"] = tuple(int(x) for x in cuts)
    par["zero_stage"] = zero
    _colossal_sp(kw, plugin, tp, par)
    if plugin == "MoeHybridParallelPlugin":
        ep = int(kw.get("ep_size", 1))
        dp = world // (tp * pp * par.get("cp", 1)) if world else None
        if dp and dp % ep:
            raise refusal(f"Colossal-AI: dp_size should be divisible by ep_size (dp_size={dp}, "
                          f"ep_size={ep})", "choose ep_size dividing the data-parallel size")
        par["ep"] = ep
    inner = ("tp", "cp") if kw.get("sequence_parallelism_mode") == "ring_attn" else ("cp", "tp")
    outside = kw.get("moe_dp_outside" if plugin.startswith("Moe") else "dp_outside", True)
    par["placement"] = inner + (("pp", "dp") if outside else ("dp", "pp"))
    return par


def _colossal_sp(kw: dict, plugin: str, tp: int, par: dict) -> None:
    sp_size = kw.get("sp_size")
    if not kw.get("enable_sequence_parallelism"):
        if sp_size not in (None, 1):
            raise refusal("Colossal-AI: you should not set sp_size when sequence parallelism "
                          "is not enabled", "set enable_sequence_parallelism true or drop sp_size")
        par["sequence_parallel"] = False
        return
    mode = kw.get("sequence_parallelism_mode") or "all_to_all"
    modes = ("split_gather", "ring", "all_to_all") + (
        ("ring_attn",) if plugin == "HybridParallelPlugin" else ())
    if mode not in modes:
        raise refusal(f"Colossal-AI {plugin}: sequence parallelism mode {mode} is not in the "
                      f"supported list {list(modes)}", "pick one of them")
    if mode in ("split_gather", "ring"):
        if tp <= 1:
            raise refusal(f"Colossal-AI: sequence parallelism mode {mode} must be enabled when "
                          "using tensor parallelism", "set tp_size > 1 or use all_to_all")
        par["sequence_parallel"] = True
        return
    par["cp"] = int(sp_size or 1)
    par["cp_mode"] = "ring" if mode == "ring_attn" else "ulysses"
    par["sequence_parallel"] = False
