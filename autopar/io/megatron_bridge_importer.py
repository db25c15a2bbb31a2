"""Read Megatron-Bridge ``ConfigContainer`` overrides (the YAML
:mod:`autopar.runtime.export.megatron_bridge` writes, or any YAML with its section and field
names) into autopar's terms.

The fields are turned back into the Megatron-LM arguments they stand for and read by
:func:`autopar.io.megatron_importer.from_megatron_args`, so Megatron-LM's rules (the layer split
over the pipeline, the overlap flags) apply as they do to Megatron-LM's own arguments;
Megatron-Bridge's rules on top (``training/config.py`` at 067f987df03b) are checked here:
Megatron FSDP and torch FSDP2 are exclusive, and the distributed optimizer is on when either
``ddp`` or ``optimizer`` sets it.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidParallelConfig, MissingDependency
from .imported import Imported, read_source, refusal
from .megatron_importer import cp_mode, from_megatron_args

def _flag_table() -> dict[tuple[str, str], str]:
    """ConfigContainer (section, field) -> the Megatron-LM flag it stands for: the inverse of
    :data:`autopar.io.megatron_bridge_fields.FIELDS` (the optimizer section is read by
    :func:`_optimizer`), plus fields the export pins with no flag there (virtual stages, the
    layer count, uneven first/last stages)."""
    from .megatron_bridge_fields import FIELDS
    table = {where: flag for flag, where in FIELDS.items() if where[0] != "optimizer"}
    table.update({
        ("model", "virtual_pipeline_model_parallel_size"): "--num-virtual-stages-per-pipeline-rank",
        ("model", "num_layers"): "--num-layers",
        ("model", "num_layers_in_first_pipeline_stage"): "--decoder-first-pipeline-num-layers",
        ("model", "num_layers_in_last_pipeline_stage"): "--decoder-last-pipeline-num-layers",
        ("model", "account_for_embedding_in_pipeline_split"):
            "--account-for-embedding-in-pipeline-split",
        ("model", "account_for_loss_in_pipeline_split"): "--account-for-loss-in-pipeline-split",
        ("optimizer", "use_distributed_optimizer"): "--use-distributed-optimizer",
    })
    return table


_DTYPE_NAMES = {"torch.bfloat16": "bf16", "bfloat16": "bf16", "bf16": "bf16",
                "torch.float16": "fp16", "float16": "fp16", "fp16": "fp16",
                "torch.float32": "fp32", "float32": "fp32", "fp32": "fp32"}


def from_megatron_bridge_yaml(source: str | Path | dict) -> Imported:
    """Read Megatron-Bridge ConfigContainer overrides: a YAML path, its text, or the nested dict.

    Raises:
        InvalidParallelConfig: not YAML, or settings Megatron-Bridge or Megatron-LM would refuse
            (the rule quoted, with a fix).
        MissingDependency: PyYAML is not installed (Megatron-Bridge depends on it).
    """
    doc = source if isinstance(source, dict) else _load(source)
    notes: list[str] = []
    argv: list[str] = []
    table = _flag_table()
    seen: set[str] = set()
    ignored: list[str] = []
    for section, body in doc.items():
        if not isinstance(body, dict):
            continue
        for name, value in body.items():
            flag = table.get((section, name))
            if flag is None:
                if (section, name) not in _HANDLED:
                    ignored.append(f"{section}.{name}")
                continue
            if flag in seen or value is None or value is False:
                continue
            seen.add(flag)
            if value is True:
                argv.append(flag)
            elif isinstance(value, list):
                argv += [flag, *map(str, value)]
            elif flag in ("--exp-avg-dtype", "--exp-avg-sq-dtype"):
                argv += [flag, _DTYPE_NAMES.get(str(value), str(value))]
            else:
                argv += [flag, str(value)]
    model, ddp, dist = (doc.get(k) or {} for k in ("model", "ddp", "dist"))
    if dist.get("use_megatron_fsdp") and dist.get("use_torch_fsdp2"):
        raise refusal("Megatron-Bridge: use_megatron_fsdp and use_torch_fsdp2 are mutually "
                      "exclusive", "set one of dist.use_megatron_fsdp, dist.use_torch_fsdp2")
    if dist.get("use_megatron_fsdp") or ddp.get("use_megatron_fsdp"):
        argv.append("--use-torch-fsdp2")
        notes.append("Megatron FSDP (use_megatron_fsdp) is modelled as ZeRO-3 with torch "
                     "FSDP2's gathers.")
    argv += _precision(doc.get("mixed_precision"), model, notes)
    imp = from_megatron_args(argv)
    opt = doc.get("optimizer") or {}
    distributed = bool(ddp.get("use_distributed_optimizer") or opt.get("use_distributed_optimizer"))
    train = {**imp.train, **_optimizer(opt, distributed)}
    if "mixed_precision" in doc and doc["mixed_precision"] is None and \
            model.get("bf16") is False and model.get("fp16") is False:
        train["precision"] = "fp32"
    par = dict(imp.parallel)
    if model.get("context_parallel_size", 1) > 1 and model.get("cp_comm_type"):
        par["cp_mode"] = cp_mode(model["cp_comm_type"])
    if model.get("expert_model_parallel_size", 1) > 1:
        # unset: TransformerConfig's default, 'allgather' (megatron-core 0.16.1
        # transformer_config.py line 675)
        kind = model.get("moe_token_dispatcher_type") or "allgather"
        if kind == "flex" and model.get("moe_flex_dispatcher_backend") == "deepep":
            par["dispatcher"] = "deepep"
        elif kind in ("alltoall", "allgather"):
            par["dispatcher"] = kind
        else:
            notes.append(f"moe_token_dispatcher_type {kind!r} is modelled as all-to-all.")
    pp = int(model.get("pipeline_model_parallel_size") or 1)
    if pp > 1:
        # Megatron-Core runs 1F1B, interleaved when there are virtual stages (a layout's chunks
        # count them: megatron/core/transformer/pipeline_parallel_layer_layout.py)
        layout = model.get("pipeline_model_parallel_layout")
        v = (str(layout).count("|") + 1) // pp if layout else int(
            model.get("virtual_pipeline_model_parallel_size") or 1)
        par.setdefault("virtual_stages", v)
        par["schedule"] = "interleaved-1f1b" if v > 1 else "1f1b"
    order = ("tp", "cp", "pp", "dp") if dist.get("use_tp_pp_dp_mapping") else (
        "tp", "cp", "dp", "pp")
    par["placement"] = order
    if ignored:
        notes.append("ignored (not a parallelism or batch setting autopar models): "
                     + " ".join(ignored))
    return Imported(parallel=par, train=train, num_layers=imp.num_layers,
                    notes=imp.notes + tuple(notes), costs=imp.costs,
                    cost_sources=imp.cost_sources, layer_split=imp.layer_split)


#: Fields read here rather than through a Megatron-LM flag (so not reported as ignored).
_HANDLED = {("model", "cp_comm_type"), ("model", "moe_token_dispatcher_type"),
            ("model", "moe_flex_dispatcher_backend"), ("dist", "use_megatron_fsdp"),
            ("ddp", "use_megatron_fsdp"), ("dataset", "seq_length"), ("model", "bf16"),
            ("model", "fp16"), ("model", "gradient_accumulation_fusion"),
            ("model", "overlap_p2p_comm"), ("optimizer", "overlap_param_gather"),
            ("optimizer", "optimizer"), ("optimizer", "use_precision_aware_optimizer"),
            ("optimizer", "optimizer_cpu_offload"), ("optimizer", "exp_avg_dtype"),
            ("optimizer", "exp_avg_sq_dtype")}


def _optimizer(opt: dict, distributed: bool) -> dict:
    """TrainingConfig fields of the ``optimizer`` section (Megatron-Core OptimizerConfig at
    2a75ac12, megatron/core/optimizer/optimizer_config.py: its "adam" is AdamW; the
    precision-aware optimizer, which keeps bf16 moments, asserts adam and the distributed
    optimizer)."""
    train: dict = {}
    if opt.get("optimizer") in ("adam", "sgd"):
        train["optimizer"] = "adamw" if opt["optimizer"] == "adam" else "sgd"
    aware = bool(opt.get("use_precision_aware_optimizer"))
    if aware and opt.get("optimizer", "adam") != "adam":
        raise refusal("Megatron-Core: --use-precision-aware-optimizer only supported with adam",
                      "set optimizer.optimizer adam or use_precision_aware_optimizer false")
    if aware and not distributed:
        raise refusal("Megatron-Core: --use-precision-aware-optimizer only supported with "
                      "distributed optimizer", "set ddp.use_distributed_optimizer true")
    if opt.get("optimizer_cpu_offload"):
        train["optimizer_offload"] = True
    dtypes = {_DTYPE_NAMES.get(str(opt.get(k)), "fp32") for k in ("exp_avg_dtype",
                                                                  "exp_avg_sq_dtype")
              if opt.get(k) is not None}
    if "bf16" in dtypes and aware:
        train["optimizer_state_dtype"] = "bf16"
    return train


def _precision(name, model: dict, notes: list[str]) -> list[str]:
    """Megatron-LM precision flags for a mixed-precision recipe name (training/mixed_precision.py
    registers each with '_' and '-')."""
    if name is None:
        return ["--bf16"] if model.get("bf16") else ["--fp16"] if model.get("fp16") else []
    key = str(name).replace("-", "_")
    half = ["--fp16"] if key.startswith("fp16") else ["--bf16"]
    if "fp8" in key or "fp4" in key:
        if "fp8_delayed" not in key:
            notes.append(f"mixed_precision {name}: modelled as FP8 (autopar prices one FP8 "
                         "recipe).")
        return half + ["--fp8-format", "hybrid"]
    if key not in ("bf16_mixed", "fp16_mixed"):
        notes.append(f"mixed_precision {name}: not a recipe autopar knows; read as "
                     f"{half[0][2:]}.")
    return half


def _load(source) -> dict:
    text = read_source(source, "Megatron-Bridge overrides")
    try:
        import yaml
    except ImportError as exc:
        raise MissingDependency("reading Megatron-Bridge overrides needs PyYAML. Fix: pip install "
                                "pyyaml (megatron-bridge depends on it).") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidParallelConfig(f"the Megatron-Bridge overrides are not YAML: {exc}. Fix: "
                                    "pass the file autopar wrote.") from exc
    if not isinstance(doc, dict):
        raise refusal("Megatron-Bridge overrides are a mapping of ConfigContainer sections "
                      "(model, train, ddp, ...)", "pass the YAML autopar wrote")
    return doc
