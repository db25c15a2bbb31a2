"""An ``accelerate launch --config_file`` YAML (Hugging Face Accelerate 1.16) for a plan: the FSDP
plugin (FSDP2, with Accelerate's ``ParallelismConfig`` for tensor and context parallelism) or the
DeepSpeed plugin (ZeRO over data parallelism).

Names follow accelerate 1.16.0: ``commands/config/config_args.py`` (``ClusterConfig``, which
refuses unknown top-level keys), ``commands/config/cluster.py`` (the keys ``accelerate config``
writes), ``utils/launch.py`` (how launch turns them into the plugins' environment),
``utils/dataclasses.py`` (``FullyShardedDataParallelPlugin``, ``DeepSpeedPlugin``) and
``parallelism_config.py``. Accelerate runs no pipeline and no expert parallelism; its DeepSpeed
plugin runs data parallelism only. What it cannot run is mapped to the nearest configuration it
can (said in the warnings) and re-estimated under the matching profile: ``torch`` (FSDP2,
DTensor TP, torch context parallelism) for the FSDP plugin, ``deepspeed`` for the DeepSpeed
plugin.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import UnsupportedPlanError
from ..verdict import per_block_text
from .common import (Export, block_modes, finish, node_layout, one_reshard_policy, own_rounds,
                     rank_order, unwritten)

#: ``plugin`` -> (accelerate's ``distributed_type``, the autopar profile that prices it, the
#: degrees Accelerate fixes whatever that profile allows).
PLUGINS = {"fsdp": ("FSDP", "torch", {"pp": 1, "ep": 1}),
           "deepspeed": ("DEEPSPEED", "deepspeed", {"tp": 1, "pp": 1, "cp": 1, "ep": 1})}

#: The comment line that carries what Accelerate takes from the training script, not from its
#: config file: the DataLoader's batch size per process, ``Accelerator(
#: gradient_accumulation_steps=...)`` and, outside the FSDP plugin, whether the model calls
#: ``gradient_checkpointing_enable()``; :func:`autopar.io.plugin_importers.from_accelerate_yaml`
#: reads it back.
SCRIPT_TAG = "# autopar-script:"

_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no", "fp8": "bf16"}

#: Where Accelerate's FSDP plugin gets its context parallelism (the ``runner_edits`` of its
#: re-estimate under the torch profile).
TORCH_CP = ("accelerate 1.16.0 accelerator.py Accelerator._prepare_cp: torch.distributed.tensor."
            "experimental.context_parallel on the 'cp' mesh with set_rotate_method("
            "cp_comm_strategy), which runs torch's SDPA (a fused kernel) on each chunk pair: "
            "every CP mode fused")


def to_accelerate_config(plan, plugin: str = "fsdp") -> Export:
    """The ``accelerate launch --config_file`` YAML for ``plan`` with Accelerate's FSDP plugin
    (``plugin="fsdp"``: always FSDP2, tensor and context parallelism through
    ``parallelism_config``; a plan without ZeRO-2/3 sharding is written as ZeRO-2, said in a
    warning; pipeline stages become data-parallel ranks) or its DeepSpeed plugin
    (``"deepspeed"``: ZeRO 0-3 over every rank). ``num_machines`` and ``num_processes`` (all machines' processes) come
    from the cluster. What the script sets is written as a comment (:data:`SCRIPT_TAG`): its DataLoader batch
    size per process, gradient accumulation steps and (outside FSDP) gradient checkpointing.

    Raises:
        UnsupportedPlanError: an unknown ``plugin``, or a plan that drops MoE tokens at a
            capacity (set in the model code, which autopar does not write).
    """
    if plugin not in PLUGINS:
        raise UnsupportedPlanError(f"Accelerate plugin {plugin!r}: autopar writes {', '.join(PLUGINS)}. "
                                   "Fix: to_accelerate_config(plan, plugin='fsdp').")
    c, t = plan.config, plan.train
    if t.moe_capacity_factor is not None:
        raise UnsupportedPlanError(
            f"moe_capacity_factor={t.moe_capacity_factor}: Accelerate has no expert capacity "
            "setting (the model code drops tokens or not). Fix: plan with "
            "moe_capacity_factor=None, or export for Megatron-LM (to_megatron_args).")
    kind, framework, limits = PLUGINS[plugin]
    warn: list[str] = []
    w = own_rounds(c, "accelerate", warn).replace(placement=rank_order(c, "accelerate", warn)[1])
    w = one_reshard_policy(c, w, "Accelerate", warn)
    w = _fold_into_dp(c, w, limits, warn)
    nodes, per_node, layout_warn = node_layout(plan)
    warn += layout_warn
    mbs, accum = _batch(w, t, warn)
    w = w.replace(micro_batch_size=mbs)
    doc: dict = {"compute_environment": "LOCAL_MACHINE", "debug": False,
                 "distributed_type": kind, "downcast_bf16": "no",
                 "machine_rank": 0, "main_training_function": "main",
                 "mixed_precision": _PRECISION[t.precision],
                 "num_machines": nodes, "num_processes": nodes * per_node,
                 "rdzv_backend": "static", "same_network": True, "use_cpu": False}
    t_written = t
    if t.precision == "fp8":
        warn.append("precision fp8: Accelerate's fp8 needs an fp8_config backend (Transformer "
                    "Engine, torchao or MS-AMP) that autopar does not price; used bf16")
        t_written = replace(t, precision="bf16")
    t_written = unwritten(t_written, "optimizer_state_dtype", warn,
                          f"optimizer_state_dtype {t.optimizer_state_dtype}: Accelerate's config "
                          "has no switch for the moments' dtype; used fp32")
    t_written = unwritten(t_written, "activation_offload", warn,
                          "activation_offload: not written (autopar prices torch's save_on_cpu; "
                          "fsdp_activation_checkpointing_offload offloads checkpoints, which "
                          "autopar does not price)")
    if plugin == "fsdp":
        w, t_written = _fsdp(doc, c, w, t_written, warn)
    else:
        w, t_written = _deepspeed(doc, w, t_written, accum, warn)
    w = _recompute(plan, w, doc, warn)
    ckpt = "" if "fsdp_config" in doc else \
        f" gradient_checkpointing={str(w.recompute == 'full').lower()}"
    text = _yaml(doc) + (f"{SCRIPT_TAG} per_device_batch_size={mbs} gradient_accumulation_steps="
                         f"{accum} global_batch_size={t.global_batch_size} seq_len={t.seq_len}"
                         f"{ckpt}\n")
    # Accelerate's context parallelism is torch's own context_parallel, fused SDPA per chunk
    # (plan.apply's torch profile computes ring hops in plain ops)
    runner = {"cp_attention": {"value": {}, "source": TORCH_CP}} if w.cp > 1 and \
        plugin == "fsdp" else None
    return finish(plan, text, warn, w, framework, train=t_written, limits=limits,
                  runner_edits=runner)


def _fold_into_dp(c, w, limits: dict, warn: list[str]):
    """``w`` with the degrees Accelerate's plugin cannot run (``limits``) turned into data
    parallelism, each said in ``warn``."""
    folded = {k: getattr(c, k) for k in limits if getattr(c, k) > 1}
    # the data-parallel ranks once the pipeline stages are folded in
    dp = c.dp * (c.pp if "pp" in folded else 1)
    if c.tp > 1 and "tp" not in limits and dp == 1 and c.cp == 1:
        # parallelism_config.py _validate_accelerator: FSDP needs a dp_shard or cp dimension
        folded["tp"] = c.tp
    if not folded:
        return w
    ranks = 1
    for k in ("tp", "pp", "cp"):
        if k in folded:
            ranks *= folded[k]
    why = {"pp": "Accelerate has no pipeline parallelism",
           "ep": "Accelerate has no expert parallelism (each rank holds every expert)",
           "tp": "its DeepSpeed plugin runs data parallelism only" if "tp" in limits else
                 "Accelerate's FSDP needs a data-parallel shard or CP dimension beside TP "
                 "(ParallelismConfig._validate_accelerator)",
           "cp": "its DeepSpeed plugin runs data parallelism only (Ulysses needs "
                 "parallelism_config sp_size and the model's attention wrapped)"}
    for k, v in folded.items():
        warn.append(f"{k}={v}: {why[k]}; written as data parallelism")
    changes = dict(dp=c.dp * ranks, **{k: 1 for k in folded})
    if "pp" in folded:
        changes.update(virtual_stages=None, schedule=None, stage_blocks=None)
    if "ep" in folded or c.folded and "tp" in folded:
        changes.update(expert_tp=None, dispatcher="alltoall")
    if "tp" in folded:
        changes.update(sequence_parallel=False)
    if "cp" in folded:
        changes.update(cp_mode="ring")
    return w.replace(**changes)


def _batch(w, t, warn: list[str]) -> tuple[int, int]:
    """(sequences per process per forward, gradient accumulation steps) for ``w``'s data
    parallelism: the planned micro-batch, or the largest one at most that size that keeps the
    global batch whole when data parallelism grew (ranks of unsupported dimensions)."""
    mbs = w.micro_batch_size or t.micro_batch_size or 1
    per_rank, rest = divmod(t.global_batch_size, w.dp)
    if rest or per_rank == 0:
        warn.append(f"global batch {t.global_batch_size}: not a multiple of the {w.dp} "
                    "data-parallel ranks written; micro-batch 1, adjust the batch by hand")
        return 1, max(1, per_rank)
    if per_rank % mbs:
        new = max(d for d in range(1, min(mbs, per_rank) + 1) if per_rank % d == 0)
        warn.append(f"micro-batch {mbs}: {per_rank} sequences per data-parallel rank do not "
                    f"split into it over {w.dp} ranks; used {new}")
        mbs = new
    return mbs, per_rank // mbs


def _fsdp(doc: dict, c, w, t, warn: list[str]):
    """Fill ``doc`` for the FSDP plugin (FSDP2 always, ZeRO-0 and ZeRO-1 plans as ZeRO-2: FSDP2's
    ``fully_shard`` has no unsharded mode); returns (written config, written train)."""
    if w.zero_stage < 2:
        if w.zero_stage == 1:
            why = "FSDP has no optimizer-state-only sharding"
        elif w.tp > 1 or w.cp > 1:
            why = ("Accelerate runs tensor and context parallelism under FSDP2 only (launch.py: "
                   "parallelism_config needs --use_fsdp and --fsdp_version=2)")
        else:
            why = ("the plan shards nothing and FSDP2 always shards (fully_shard has no "
                   "NO_SHARD; to run the plan as planned, as DDP, launch with accelerate "
                   "launch --multi_gpu and no FSDP config)")
        warn.append(f"zero_stage {w.zero_stage}: {why}; used FSDP2 without resharding after "
                    "forward (ZeRO-2: less memory, gradients reduce-scattered)")
        w = w.replace(zero_stage=2)
    fsdp = {"fsdp_version": 2, "fsdp_reshard_after_forward": w.zero_stage == 3,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": False, "fsdp_activation_checkpointing": False}
    if t.param_offload and w.zero_stage == 3:
        # utils/dataclasses.py: FSDP2's cpu_offload is a CPUOffloadPolicy (parameters,
        # gradients and optimizer states together, as autopar.cost.offload prices it)
        fsdp["fsdp_offload_params"] = True
    elif t.param_offload or t.optimizer_offload:
        warn.append("offload: FSDP2 offloads parameters, gradients and optimizer states together "
                    "(fsdp_offload_params) and only under ZeRO-3 with param_offload; not written")
        t = replace(t, param_offload=False, optimizer_offload=False)
    doc["fsdp_config"] = fsdp
    if w.tp > 1 or w.cp > 1:
        if w.tp > 1:
            warn.append("tp: Accelerate applies the model's Hugging Face tp_plan (load it with "
                        "from_pretrained(..., tp_plan='auto')); a model without one cannot use "
                        "tp_size")
            if w.sequence_parallel:
                warn.append("sequence_parallel: the Hugging Face tp_plans Accelerate applies keep "
                            "norms replicated over the sequence; written without SP (more "
                            "activation memory)")
                w = w.replace(sequence_parallel=False)
        par = {"parallelism_config_dp_replicate_size": 1,
               "parallelism_config_dp_shard_size": w.dp,
               "parallelism_config_tp_size": w.tp, "parallelism_config_cp_size": w.cp}
        if w.cp > 1:
            if w.cp_mode == "ulysses":
                warn.append("cp_mode=ulysses: Accelerate's FSDP path has torch's ring context "
                            "parallelism only (Ulysses is its DeepSpeed sp_size); used ring")
                w = w.replace(cp_mode="ring")
            par["parallelism_config_cp_backend"] = "torch"
            par["parallelism_config_cp_comm_strategy"] = ("allgather" if w.cp_mode == "allgather"
                                                          else "alltoall")
        doc["parallelism_config"] = par
    return w, t


def _deepspeed(doc: dict, w, t, accum: int, warn: list[str]):
    """Fill ``doc`` for the DeepSpeed plugin; returns (written config, written train)."""
    ds = {"zero_stage": w.zero_stage, "gradient_accumulation_steps": accum,
          "gradient_clipping": 1.0, "offload_optimizer_device": "none",
          "offload_param_device": "none", "zero3_init_flag": w.zero_stage == 3}
    if w.zero_stage == 3:
        ds["zero3_save_16bit_model"] = True
    if t.optimizer_offload and w.zero_stage >= 1:
        ds["offload_optimizer_device"] = "cpu"
    elif t.optimizer_offload:
        warn.append("optimizer_offload: DeepSpeed offloads the optimizer under ZeRO 1-3 only; "
                    "not written at ZeRO-0")
        t = replace(t, optimizer_offload=False)
    if t.param_offload and w.zero_stage == 3:
        ds["offload_param_device"] = "cpu"
    elif t.param_offload:
        warn.append(f"param_offload: DeepSpeed offloads parameters under ZeRO-3 only; not "
                    f"written at ZeRO-{w.zero_stage}")
        t = replace(t, param_offload=False)
    doc["deepspeed_config"] = ds
    return w, t


def _recompute(plan, w, doc: dict, warn: list[str]):
    """Recompute: the FSDP plugin checkpoints every wrapped block or none
    (``fsdp_activation_checkpointing``); under DeepSpeed the model does it
    (``model.gradient_checkpointing_enable()``). Either way every block marked is recomputed
    whole."""
    modes = block_modes(plan)
    if set(modes) == {"none"}:
        return w
    if "fsdp_config" in doc:
        doc["fsdp_config"]["fsdp_activation_checkpointing"] = True
        how, script = "Accelerate's fsdp_activation_checkpointing checkpoints every wrapped block", ""
    else:
        script = "the model must call model.gradient_checkpointing_enable()"
        how = f"this Accelerate plugin has no checkpointing switch; {script}, which checkpoints every block"
    if set(modes) != {"full"}:
        warn.append(f"recompute ({per_block_text(modes)}): {how} whole; used full on every "
                    "block (never more memory than planned)")
    elif script:
        warn.append(f"recompute full: {script}, or nothing is recomputed and activation memory "
                    "is far above the estimate")
    return w.replace(recompute="full")


def _yaml_scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return f"'{v}'" if v in ("no", "yes", "true", "false") else str(v)


def _yaml(doc: dict) -> str:
    """``doc`` (two levels of scalars) as YAML, keys sorted as ``accelerate config`` writes."""
    lines = []
    for k in sorted(doc):
        v = doc[k]
        if isinstance(v, dict):
            lines.append(f"{k}:")
            lines += [f"  {kk}: {_yaml_scalar(vv)}" for kk, vv in sorted(v.items())]
        else:
            lines.append(f"{k}: {_yaml_scalar(v)}")
    return "\n".join(lines) + "\n"
