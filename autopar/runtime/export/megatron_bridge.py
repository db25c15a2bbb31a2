"""Megatron-Bridge (NeMo's Python recipes over Megatron-Core) ``ConfigContainer`` overrides for a
plan, as YAML.

Megatron-Bridge documents YAML overrides of a recipe (``docs/recipe-usage.md``, "YAML"):
``OmegaConf.merge`` of the file onto ``create_omegaconf_dict_config(cfg)``, then
``apply_overrides`` (``training/utils/omegaconf_utils.py``). The file sets the plan's
parallelism, batch, recompute, precision, optimizer and data-parallel choices in the sections
``model`` (``GPTModelProvider``, a Megatron-Core ``TransformerConfig``), ``train``, ``dataset``,
``ddp``, ``optimizer``, ``dist`` and ``mixed_precision``; the model's shape comes from the
recipe of its family and is only stated in a comment.

Megatron-Bridge runs Megatron-Core with Megatron-LM's training loop, so the plan is first
written as Megatron-LM arguments (:func:`.megatron.to_megatron_args`: the same warnings, written
configuration and re-estimate under the ``megatron`` profile) and each argument is renamed to its
``ConfigContainer`` field (:data:`autopar.io.megatron_bridge_fields.FIELDS`). Field names follow
Megatron-Bridge at :data:`autopar.io.megatron_bridge_fields.BRIDGE_VERSION` and the Megatron-LM
it pins; ``tests/data/megatron_bridge_schema.json`` (``benchmarks/megatron_bridge_schema.py``)
records them, since megatron-bridge needs Python 3.12
and cannot be installed where autopar is tested.
"""

from __future__ import annotations

import json

from ...io.megatron_bridge_fields import BRIDGE_VERSION, FIELDS
from .common import Export
from .megatron import to_megatron_args

#: Switches written false when the Megatron-LM arguments leave them out, so a recipe's own
#: setting cannot change what was estimated (Megatron-LM's default for each is off).
_OFF = ("--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
        "--overlap-param-gather", "--use-torch-fsdp2", "--use-tp-pp-dp-mapping",
        "--tp-comm-overlap", "--use-precision-aware-optimizer", "--optimizer-cpu-offload")

#: Fields set to Megatron-LM's default when the arguments leave them out (a recipe may set
#: them: recompute, an uneven first/last stage, the pipeline split's extra layers).
_RESET = {("model", "recompute_granularity"): None, ("model", "recompute_method"): None,
          ("model", "recompute_num_layers"): None,
          ("model", "pipeline_model_parallel_layout"): None,
          ("model", "num_layers_in_first_pipeline_stage"): None,
          ("model", "num_layers_in_last_pipeline_stage"): None,
          ("model", "account_for_embedding_in_pipeline_split"): False,
          ("model", "account_for_loss_in_pipeline_split"): False}

#: autopar precision -> Megatron-Bridge's registered mixed-precision recipe
#: (training/mixed_precision.py; "hybrid" with the delayed scaling Megatron-LM's --fp8-format
#: hybrid defaults to).
MIXED_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed",
                   "fp8": "bf16_with_fp8_delayed_scaling_mixed", "fp32": None}

#: Megatron-LM's optimizer-state dtype names -> the torch dtype strings Megatron-Bridge's
#: apply_overrides turns back into dtypes (utils/activation_map.py str_to_dtype).
_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}


def to_megatron_bridge(plan) -> Export:
    """Megatron-Bridge ``ConfigContainer`` overrides for ``plan`` (YAML text; ``Export.value`` is
    the nested dict). The written configuration, warnings and re-estimate are Megatron-LM's
    (:func:`autopar.runtime.to_megatron_args`): Megatron-Bridge runs Megatron-Core's schedules,
    optimizer and recompute the same way.
    """
    mlm = to_megatron_args(plan)
    flags = _flags(mlm.value)
    doc: dict[str, dict] = {s: {} for s in ("model", "train", "dataset", "ddp", "optimizer",
                                            "dist")}
    for flag, values in flags.items():
        if flag in FIELDS:
            section, name = FIELDS[flag]
            doc[section][name] = _value(flag, values)
    for flag in _OFF:
        section, name = FIELDS[flag]
        doc[section].setdefault(name, False)
    for (section, name), value in _RESET.items():
        doc[section].setdefault(name, value)
    w = mlm.written
    model = doc["model"]
    model["virtual_pipeline_model_parallel_size"] = (w.virtual_stages if w.pp > 1 and
                                                     (w.virtual_stages or 1) > 1 else None)
    model.setdefault("expert_model_parallel_size", 1)
    if w.ep > 1:
        model["expert_tensor_parallel_size"] = w.etp
    if "--no-gradient-accumulation-fusion" in flags:
        model["gradient_accumulation_fusion"] = False
    if "--no-overlap-p2p-communication" in flags:
        model["overlap_p2p_comm"] = False
    doc["dataset"]["seq_length"] = model["seq_length"]
    # the distributed optimizer and its gather overlap are each one setting in two places, on
    # when either is (config.py _validate_and_sync_distributed_optimizer_settings); Megatron
    # FSDP is not what was priced
    for name in ("use_distributed_optimizer", "overlap_param_gather"):
        doc["optimizer"][name] = doc["ddp"][name]
    doc["dist"]["use_megatron_fsdp"] = False
    notes = [f"Megatron-Bridge ConfigContainer overrides ({BRIDGE_VERSION}): merge onto the "
             "recipe of the model's family with OmegaConf, then apply_overrides "
             "(docs/recipe-usage.md, YAML); the notes below name Megatron-LM's flags, written "
             "here as their ConfigContainer fields"]
    precision = plan.train.precision
    doc["mixed_precision"] = MIXED_PRECISION[precision]
    if precision == "fp32":
        model["bf16"] = model["fp16"] = False
        if w.pp > 1:
            # a dtype field the recipe left None takes a YAML string as it is
            # (omegaconf_utils.py _apply_overrides converts only fields holding a dtype)
            notes.append("fp32 with pipelining: Megatron-Core needs model.pipeline_dtype; set "
                         "cfg.model.pipeline_dtype = torch.float32 in Python (the YAML cannot "
                         "give a dtype to a field the recipe left None)")
    if not doc["ddp"]["overlap_grad_reduce"]:
        notes.append("ddp.overlap_grad_reduce false: estimated as Megatron-LM's default (no "
                     "overlap), which Megatron-Bridge's recipes turn on (e.g. "
                     "recipes/llama/h100/llama3.py cfg.ddp.overlap_grad_reduce = True); with it "
                     "on the step runs faster than this estimate")
    if doc["optimizer"]["use_precision_aware_optimizer"] and not \
            doc["optimizer"]["use_distributed_optimizer"]:
        notes.append("optimizer.use_precision_aware_optimizer without the distributed optimizer: "
                     "Megatron-Core's OptimizerConfig asserts it ('only supported with "
                     "distributed optimizer', optimizer_config.py), so this file will not start; "
                     "plan with zero_stage 1 or optimizer_state_dtype fp32 and no offload")
    head = _model_comment(plan)
    return Export(doc, tuple(notes) + mlm.warnings, comment="#", written=w, fits=mlm.fits,
                  body=head + _yaml(doc))


def _flags(argv: list[str]) -> dict[str, list[str]]:
    """Megatron-LM arguments as flag -> its values (empty for a switch)."""
    out: dict[str, list[str]] = {}
    flag = None
    for tok in argv:
        if tok.startswith("--"):
            flag = tok
            out[flag] = []
        elif flag is not None:
            out[flag].append(tok)
    return out


def _value(flag: str, values: list[str]):
    if flag == "--recompute-modules":
        return list(values)
    if not values:
        return True
    v = values[0]
    if flag in ("--exp-avg-dtype", "--exp-avg-sq-dtype"):
        return _DTYPES[v]
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def _model_comment(plan) -> str:
    m = plan.model_config or {}
    keys = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
            "vocab_size", "num_experts", "top_k")
    shape = ", ".join(f"{k}={m[k]}" for k in keys if m.get(k))
    return (f"# autopar: planned for {plan.model}" + (f" ({shape})" if shape else "")
            + "; start from Megatron-Bridge's recipe of that model\n")


def _yaml(doc: dict) -> str:
    """``doc`` as block YAML with JSON scalars (strings quoted, null, lists in brackets)."""
    lines = []
    for section, value in doc.items():
        if isinstance(value, dict):
            lines.append(f"{section}:")
            lines += [f"  {k}: {json.dumps(v)}" for k, v in value.items()]
        else:
            lines.append(f"{section}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"
