"""Read an Accelerate launch YAML into autopar's terms, refusing what Accelerate or DeepSpeed
would refuse (with its rule and a fix).

It returns an :class:`~autopar.io.imported.Imported`. The rules are the frameworks' own, at the
versions the exporter writes for (:mod:`autopar.runtime.export.accelerate`):

- Accelerate 1.16 ``utils/dataclasses.py`` (``FullyShardedDataParallelPlugin``: FSDP2 takes a
  bool ``reshard_after_forward`` and no ``LOCAL_STATE_DICT``; activation-checkpointing offload
  needs activation checkpointing; ``DeepSpeedPlugin``: a ``deepspeed_config_file`` excludes the
  YAML's DeepSpeed fields), ``parallelism_config.py`` (the degrees multiply to
  ``num_processes``; FSDP needs a dp-shard or cp dimension; no CP over pure replication),
  ``commands/launch.py`` (``parallelism_config`` only with FSDP version 2);
- DeepSpeed 0.19 ``deepspeed/runtime/config.py`` ``_batch_assertion``: train_batch_size =
  micro-batch x gradient accumulation x data-parallel size.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import InvalidParallelConfig, MissingDependency
from .imported import Imported, read_source, refusal

_ACC_PRECISION = {"bf16": "bf16", "fp16": "fp16", "no": "fp32", "fp8": "fp8"}


def from_accelerate_yaml(source: str | Path) -> Imported:
    """Read an ``accelerate launch --config_file`` YAML (a path or its text): distributed type
    FSDP (version 1 or 2, with ``parallelism_config``), DEEPSPEED or MULTI_GPU. The batch comes
    from autopar's ``# autopar-script:`` line when present (Accelerate takes it from the script).

    Raises:
        InvalidParallelConfig: not YAML, an unknown key or distributed type, or a setting
            Accelerate or DeepSpeed would refuse (the rule is quoted, with a fix).
        MissingDependency: PyYAML is not installed (Accelerate depends on it).
    """
    text = read_source(source, "Accelerate config")
    try:
        import yaml
    except ImportError as exc:
        raise MissingDependency("reading an Accelerate YAML needs PyYAML. Fix: pip install "
                                "pyyaml (accelerate depends on it).") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidParallelConfig(f"the Accelerate config is not YAML: {exc}. Fix: pass the "
                                    "file accelerate config wrote.") from exc
    if not isinstance(doc, dict) or "distributed_type" not in doc:
        # config_args.py process_config: "A `distributed_type` must be specified"
        raise refusal("Accelerate: a `distributed_type` must be specified in the config file",
                      "add distributed_type: FSDP (or DEEPSPEED, MULTI_GPU)")
    kind = str(doc["distributed_type"])
    world = int(doc.get("num_processes") or 1)
    par: dict = {}
    train: dict = {"precision": _ACC_PRECISION.get(str(doc.get("mixed_precision", "no")), "fp32")}
    notes: list[str] = []
    accum = None
    if kind == "MULTI_GPU":
        par.update(dp=world, zero_stage=0)
    elif kind == "FSDP":
        _accelerate_fsdp(doc.get("fsdp_config") or {}, doc.get("parallelism_config") or {},
                         world, par, train, notes)
    elif kind == "DEEPSPEED":
        accum = _accelerate_deepspeed(doc.get("deepspeed_config") or {}, world, par, train,
                                      notes)
    else:
        raise refusal(f"Accelerate distributed_type {kind}: autopar reads FSDP, DEEPSPEED and "
                      "MULTI_GPU", "for MEGATRON_LM pass its arguments with --megatron-args")
    script = _batch_line(text)
    if script:
        _check_batch(script, par, accum, kind, train, notes)
        if "gradient_checkpointing" in script and kind != "FSDP":
            par["recompute"] = "full" if script["gradient_checkpointing"] else "none"
    else:
        notes.append("no '# autopar-script:' line: the micro-batch is the script's DataLoader "
                     "batch size per process; give it (and the global batch) with the flags.")
    return Imported(parallel=par, train=train, notes=tuple(notes))


def _accelerate_fsdp(fsdp: dict, pc: dict, world: int, par: dict, train: dict,
                     notes: list[str]) -> None:
    version = int(fsdp.get("fsdp_version", 1))
    if pc and version != 2:
        # commands/launch.py _validate_launch_command
        raise refusal("Accelerate: you cannot use `--use_parallelism_config` without "
                      "`--use_fsdp` and `--fsdp_version=2`", "set fsdp_config.fsdp_version: 2")
    reshard = fsdp.get("fsdp_reshard_after_forward", True if version == 2 else "FULL_SHARD")
    if version == 2:
        if not isinstance(reshard, bool):
            # utils/dataclasses.py FullyShardedDataParallelPlugin.__post_init__
            raise refusal(f"Accelerate FSDP2: reshard_after_forward must be a bool (got "
                          f"{reshard!r}); sharding strategies are FSDP1's",
                          "write fsdp_reshard_after_forward: true (ZeRO-3) or false")
        if str(fsdp.get("fsdp_state_dict_type", "")) == "LOCAL_STATE_DICT":
            raise refusal("Accelerate FSDP2 does not support LOCAL_STATE_DICT",
                          "use SHARDED_STATE_DICT or FULL_STATE_DICT")
        if fsdp.get("fsdp_forward_prefetch"):
            raise refusal("Accelerate: forward_prefetch is not yet implemented in FSDP2",
                          "remove fsdp_forward_prefetch or use fsdp_version 1")
        zero = 3 if reshard else 2
    else:
        strategy = str(fsdp.get("fsdp_sharding_strategy", reshard)).upper()
        zero = {"FULL_SHARD": 3, "1": 3, "SHARD_GRAD_OP": 2, "2": 2, "NO_SHARD": 0, "3": 0,
                "HYBRID_SHARD": 3, "4": 3, "HYBRID_SHARD_ZERO2": 2, "5": 2}.get(strategy)
        if zero is None:
            raise refusal(f"Accelerate FSDP1 sharding strategy {strategy!r} is not one of "
                          "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2",
                          "pick one of them")
        if strategy.startswith("HYBRID") or strategy in ("4", "5"):
            notes.append("HYBRID_SHARD is modelled as sharding over all of dp (undercounts "
                         "model-state memory).")
        notes.append("FSDP1 (fsdp_version 1) is priced as FSDP2 (choose framework fsdp1 for "
                     "its flat-parameter copies).")
    if fsdp.get("fsdp_activation_checkpointing_offload") and not fsdp.get(
            "fsdp_activation_checkpointing"):
        raise refusal("Accelerate: `activation_checkpointing_offload=True` requires "
                      "`activation_checkpointing=True`",
                      "set fsdp_activation_checkpointing: true")
    size = {k: int(pc.get(f"parallelism_config_{k}_size", 1) or 1)
            for k in ("dp_replicate", "dp_shard", "tp", "cp", "sp")}
    if pc:
        total = size["dp_replicate"] * size["dp_shard"] * size["tp"] * size["cp"] * size["sp"]
        if total != world:
            # parallelism_config.py _validate_accelerator
            raise refusal(f"Accelerate: ParallelismConfig total_size ({total}) does not match "
                          f"num_processes ({world})",
                          "make dp_replicate x dp_shard x tp x cp equal num_processes")
        if size["dp_shard"] == 1 and size["cp"] == 1:
            raise refusal("Accelerate: FSDP is enabled but the parallelism config has no "
                          "dimension for FSDP to shard across (both dp_shard_size and cp_size "
                          "are 1)", "lower tp_size to leave ranks for dp_shard_size")
        if size["cp"] > 1 and size["dp_replicate"] > 1 and size["dp_shard"] == 1:
            raise refusal("Accelerate: context parallelism cannot be used with pure data "
                          "parallelism (dp_replicate_size > 1 and dp_shard_size == 1)",
                          "set dp_shard_size > 1")
        if size["sp"] > 1:
            raise refusal("Accelerate sp_size (DeepSpeed ALST/Ulysses) runs under the "
                          "DeepSpeed plugin, not FSDP", "use cp_size with FSDP")
        if size["dp_replicate"] > 1:
            notes.append(f"HSDP (dp_replicate {size['dp_replicate']}) is modelled as ZeRO over "
                         "all of dp, which undercounts model-state memory.")
        par.update(tp=size["tp"], cp=size["cp"], dp=size["dp_replicate"] * size["dp_shard"])
        if size["cp"] > 1:
            strategy = str(pc.get("parallelism_config_cp_comm_strategy", "allgather"))
            par["cp_mode"] = "allgather" if strategy == "allgather" else "ring"
        if size["tp"] > 1:
            par["sequence_parallel"] = False
    else:
        par["dp"] = world
    par["zero_stage"] = zero
    par["recompute"] = "full" if fsdp.get("fsdp_activation_checkpointing") else "none"
    if fsdp.get("fsdp_offload_params"):
        train.update(param_offload=True, optimizer_offload=True)


def _accelerate_deepspeed(ds: dict, world: int, par: dict, train: dict,
                          notes: list[str]) -> int | None:
    if ds.get("deepspeed_config_file"):
        given = sorted(k for k in ds if k not in ("deepspeed_config_file",
                                                    "deepspeed_multinode_launcher",
                                                    "zero3_init_flag"))
        if given:
            # utils/dataclasses.py DeepSpeedPlugin._deepspeed_config_checks
            raise refusal(f"Accelerate: when using `deepspeed_config_file`, the accelerate "
                          f"config variables {given} are ignored",
                          "set them in the DeepSpeed JSON and remove them from the YAML")
        raise refusal("the YAML points to a DeepSpeed JSON (deepspeed_config_file), which "
                      "autopar does not read from here",
                      "write zero_stage, gradient_accumulation_steps and offload in "
                      "deepspeed_config, or plan from the JSON's values with the flags")
    zero = int(ds.get("zero_stage", 2))   # DeepSpeedPlugin's default stage
    if zero not in (0, 1, 2, 3):
        raise refusal(f"DeepSpeed zero_stage {zero} is not 0-3", "write 0, 1, 2 or 3")
    off_param = str(ds.get("offload_param_device", "none"))
    off_opt = str(ds.get("offload_optimizer_device", "none"))
    if off_param != "none" and zero != 3:
        # deepspeed/runtime/zero/offload_config.py offload_param: "Valid only with stage 3"
        raise refusal(f"DeepSpeed offload_param is valid only with ZeRO stage 3 (zero_stage "
                      f"{zero})", "set zero_stage: 3 or offload_param_device: none")
    if "nvme" in (off_param, off_opt):
        notes.append("NVMe offload is priced as CPU offload.")
    par.update(dp=world, zero_stage=zero)
    train.update(optimizer_offload=off_opt != "none" and zero >= 1, param_offload=off_param != "none")
    accum = ds.get("gradient_accumulation_steps")
    return int(accum) if accum not in (None, "auto") else None


_SCRIPT = re.compile(r"^# autopar-script:(.*)$", re.MULTILINE)


def _batch_line(text: str) -> dict:
    m = _SCRIPT.search(text)
    if not m:
        return {}
    out: dict = {}
    for part in m.group(1).split():
        key, _, value = part.partition("=")
        out[key] = int(value) if value.isdigit() else value == "true"
    return out


def _check_batch(batch: dict, par: dict, accum: int | None, kind: str, train: dict,
                 notes: list[str]) -> None:
    mbs, gas = batch.get("per_device_batch_size"), batch.get("gradient_accumulation_steps")
    gbs = batch.get("global_batch_size")
    if accum is not None and gas is not None and accum != gas:
        raise refusal(f"deepspeed_config.gradient_accumulation_steps {accum} differs from the "
                      f"batch line's {gas}", "make them equal")
    dp = par.get("dp", 1)
    if mbs and gas and gbs and mbs * gas * dp != gbs:
        rule = ("DeepSpeed: train_batch_size is not equal to micro_batch_per_gpu * "
                "gradient_acc_step * world_size" if kind == "DEEPSPEED" else
                "Accelerate: the global batch is the per-process batch x gradient accumulation "
                "x data-parallel processes")
        raise refusal(f"{rule} ({gbs} != {mbs} * {gas} * {dp})",
                      f"use gradient_accumulation_steps {gbs // (mbs * dp)} if it divides, or "
                      "change the batch")
    if mbs:
        par["micro_batch_size"] = train["micro_batch_size"] = mbs
    if gbs:
        train["global_batch_size"] = gbs
    if batch.get("seq_len"):
        train["seq_len"] = batch["seq_len"]
