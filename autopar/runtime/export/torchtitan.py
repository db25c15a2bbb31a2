"""A torchtitan v0.2.2 job TOML for a plan (``torchtitan/config/job_config.py``; torchtitan 0.3
replaced TOML files with Python config registries)."""

from __future__ import annotations

import json
from dataclasses import replace

from ..errors import UnsupportedPlanError
from ..verdict import per_block_text
from .common import (Export, block_modes, finish, one_reshard_policy, own_rounds, rank_order,
                     strongest_mode, unwritten)

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


#: torchtitan v0.2.2 torchtitan/models/llama3/__init__.py ``llama3_args``: flavor -> (layers,
#: hidden, heads, KV heads, FFN hidden (from ffn_dim_multiplier and multiple_of), vocabulary
#: (TransformerModelArgs default 128256), rope_theta).
TITAN_LLAMA3_FLAVORS = {
    "8B": (32, 4096, 32, 8, 14336, 128256, 500000.0),
    "70B": (80, 8192, 64, 8, 28672, 128256, 500000.0),
    "405B": (126, 16384, 128, 8, 53248, 128256, 500000.0),
}


def titan_refuses(plan, m: dict) -> None:
    """Refuse a model torchtitan has no architecture for (v0.2.2 and 0.3 alike).

    Raises:
        UnsupportedPlanError: a GPT-style model (learned positions, LayerNorm, GELU, biases),
            or an MLP other than SwiGLU (torchtitan 0.3.0 models/common/feed_forward.py
            ``FeedForward``, "SwiGLU feed-forward module shared across models": no GeGLU).
    """
    if m and (m.get("family") == "gpt" or m.get("norm") == "layernorm"
              or m.get("position") not in (None, "rope")):
        raise UnsupportedPlanError(
            f"torchtitan has no architecture for {plan.model} (GPT-style: learned positions, "
            "LayerNorm, GELU, biases); a llama3 config would train a different model. Fix: "
            "export with plan.to_megatron_args() or plan.to_deepspeed_config().")
    if m and m.get("mlp") not in (None, "swiglu"):
        raise UnsupportedPlanError(
            f"torchtitan has no model with the {m['mlp']} MLP of {plan.model}: its decoder "
            "models share one SwiGLU FeedForward (models/common/feed_forward.py), so a llama3 "
            "config would train SwiGLU instead. Fix: export with plan.to_megatron_bridge() "
            "(Megatron-Core builds GeGLU from gated_linear_unit=True, activation_func=gelu) "
            "or plan.to_deepspeed_config().")


def titan_router(plan, m: dict, warn: list[str]) -> None:
    """Warn how the plan's MoE router is set in torchtitan 0.3.0 and what it lacks: its router
    (models/common/moe.py ``TokenChoiceTopKRouter.Config``) has ``score_func`` ("sigmoid" by
    default, Megatron-Core's is "softmax") and ``MoE.Config.load_balance_coeff`` (aux-loss-free
    expert bias, on at 1e-3 by default, None = off); it has no auxiliary loss, z-loss or
    Sinkhorn routing. Nothing for a dense model, or one routed as torchtitan's defaults route."""
    if not m.get("num_experts"):
        return
    score = m.get("router_score_function", "softmax")
    bias = "1e-3" if m.get("router_expert_bias") else "None"
    if (score, bias) != ("sigmoid", "1e-3"):
        warn.append(f"model {plan.model}: set torchtitan's router as planned: "
                    f"score_func={score!r}, load_balance_coeff={bias} (expert bias "
                    f"{'on' if bias != 'None' else 'off'}; torchtitan's defaults are 'sigmoid' "
                    "and 1e-3)")
    missing = [what for what, on in (
        (f"{m.get('router_load_balancing')} load-balancing loss",
         (m.get("router_aux_loss_coeff") or 0) > 0
         and str(m.get("router_load_balancing", "")).endswith("aux_loss")),
        ("z-loss", m.get("router_z_loss_coeff") is not None),
        ("Sinkhorn routing", m.get("router_load_balancing") == "sinkhorn")) if on]
    if missing:
        warn.append(f"model {plan.model}: torchtitan's MoE computes no {', '.join(missing)} "
                    "(models/common/moe.py); it trains without them, and the estimate prices "
                    "them as planned")


def titan_flavor(plan, warn: list[str]) -> dict:
    """torchtitan's model section: ``llama3`` and the flavor whose shape is the plan's model.

    Raises:
        UnsupportedPlanError: a model torchtitan has no architecture for (GPT: learned
            positions, LayerNorm, GELU, biases).
    """
    m = plan.model_config or {}
    titan_refuses(plan, m)
    if m and (m.get("num_experts") or m.get("kv_lora_rank") or m.get("qk_norm")):
        titan_router(plan, m, warn)
        return _titan_moe_model(plan, m, warn)
    shape = (m.get("num_layers"), m.get("hidden_size"), m.get("num_heads"),
             m.get("num_kv_heads") or m.get("num_heads"), m.get("ffn_hidden_size"),
             m.get("vocab_size"), float(m.get("rope_theta", 10000.0)))
    for flavor, known in TITAN_LLAMA3_FLAVORS.items():
        if shape == known:
            return {"name": "llama3", "flavor": flavor}
    name = str(plan.model)
    if not m:
        # a module's or Hugging Face preset's plan: no shape to write a flavor from
        warn.append(
            f"model {name}: the plan has no model_config, so no torchtitan flavor can be matched "
            f"or written for it; flavor {name!r} written so torchtitan stops at an unknown "
            "flavor instead of training its debug model. Fix: register a flavor of that name "
            "with the model's sizes in the torchtitan model it matches (llama3 for a dense "
            "Llama-shaped model; its MoE models, e.g. deepseek_v3 or llama4, for experts)")
        return {"name": "llama3", "flavor": name}
    warn.append(
        f"model {name}: torchtitan has no llama3 flavor of this shape (it has "
        f"{', '.join(TITAN_LLAMA3_FLAVORS)}); flavor {name!r} written so torchtitan stops at "
        "an unknown flavor instead of training its debug model. Fix: add "
        f"llama3_args[{name!r}] = TransformerModelArgs(dim={shape[1]}, n_layers={shape[0]}, "
        f"n_heads={shape[2]}, n_kv_heads={shape[3]}, vocab_size={shape[5]}, "
        f"rope_theta={shape[6]:g}, ...) with the FFN size {shape[4]} in "
        "torchtitan/models/llama3/__init__.py")
    return {"name": "llama3", "flavor": name}


def _titan_moe_model(plan, m: dict, warn: list[str]) -> dict:
    """torchtitan's model section for a config with experts, latent attention or qk-norm: not
    llama3 (which has none of them) but the torchtitan model that has them (v0.2.2
    torchtitan/models: ``deepseek_v3`` with MLA and shared experts, ``qwen3`` with qk-norm,
    ``llama4`` for other experts), under a flavor the user registers with the plan's sizes."""
    name = str(plan.model)
    model = "deepseek_v3" if m.get("kv_lora_rank") else "qwen3" if m.get("qk_norm") else "llama4"
    sizes = ", ".join(f"{k}={m[k]}" for k in (
        "num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
        "num_experts", "top_k", "moe_ffn_hidden_size", "num_shared_experts", "first_dense_layers",
        "moe_layer_interval", "kv_lora_rank", "q_lora_rank", "kv_channels") if m.get(k))
    warn.append(
        f"model {name}: experts, latent attention or qk-norm, which torchtitan's llama3 does not "
        f"have: written as torchtitan's {model} model with flavor {name!r}, so torchtitan stops "
        "at an unknown flavor instead of training another model. Fix: register that flavor in "
        f"torchtitan/models/{model}/__init__.py with the plan's sizes ({sizes})")
    if m.get("mtp_layers"):
        cut = (" module_fqns_per_model_part lists the decoder layers only, so the last stage "
               f"has {m['mtp_layers']} block(s) fewer than planned;"
               if plan.config.pp > 1 and plan.config.stage_blocks else "")
        warn.append(f"model {name}: {m['mtp_layers']} multi-token-prediction module(s) planned; "
                    "torchtitan v0.2.2's models have none (multi-token prediction arrived in "
                    "0.3's deepseek_v3: --export torchtitan-0.3), so the file trains without "
                    f"them;{cut} the re-estimate still prices them as planned (an upper bound "
                    "on time and memory)")
    return {"name": model, "flavor": name}


def titan_batch_check(train: dict, par: dict, dp: int, micro_batch: int,
                      global_batch: int) -> list[str]:
    """Warnings where torchtitan's batch arithmetic differs from the plan's.

    torchtitan v0.2.2 ``train.py``: gradient accumulation steps = global_batch_size /
    (local_batch_size * dp) (dp = replicate x shard, CP excluded), asserting divisibility;
    without pipelining one forward runs ``local_batch_size`` sequences; with pipelining
    (``distributed/pipeline_parallel.py``) a step splits local_batch_size into
    local_batch_size / pipeline_parallel_microbatch_size micro-batches of
    pipeline_parallel_microbatch_size sequences.

    Args:
        train, par: the TOML's training and parallelism sections.
        dp: data-parallel degree; micro_batch: the plan's sequences per forward;
        global_batch: the plan's sequences per optimizer step.
    """
    local, gbs = train["local_batch_size"], train["global_batch_size"]
    out = []
    if gbs != global_batch or gbs % (local * dp):
        out.append(f"torchtitan global_batch_size {gbs} vs local_batch_size {local} x dp {dp}: "
                   f"not the plan's {global_batch} sequences per step in whole accumulation "
                   "steps")
    per_forward = par.get("pipeline_parallel_microbatch_size", 1) if \
        par.get("pipeline_parallel_degree", 1) > 1 else local
    if per_forward != micro_batch:
        out.append(f"torchtitan runs {per_forward} sequences per forward, the plan "
                   f"{micro_batch} (activation memory scales with it)")
    return out


#: autopar's schedule names -> torchtitan's ``pipeline_parallel_schedule`` values (torch's class
#: names without "Schedule", resolved by ``torch.distributed.pipelining.schedules.
#: get_schedule_class`` in torchtitan/distributed/pipeline_parallel.py).
TITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                   "interleaved-zero-bubble": "InterleavedZeroBubble",
                   "zbv-zero-bubble": "ZBVZeroBubble", "dualpipev": "DualPipeV"}


def to_torchtitan_toml(plan) -> Export:
    """A torchtitan (v0.2.2, job_config.py) job TOML for ``plan``; stage cuts, interleaved
    chunks included, are exact through ``module_fqns_per_model_part`` (torchtitan's Llama
    names).

    Batch: without pipelining ``local_batch_size`` is the plan's micro-batch and torchtitan
    accumulates gradients global_batch_size / (local_batch_size x dp) times; with pipelining
    ``local_batch_size`` is the per-replica batch, split into micro-batches of
    ``pipeline_parallel_microbatch_size`` (see :func:`titan_batch_check`). Data parallelism: DDP
    only for pure data parallelism without ZeRO (torchtitan refuses DDP with TP/PP/CP), FSDP2
    otherwise (ZeRO-1 and ZeRO-0 under model parallelism run as FSDP without resharding after
    forward, ZeRO-2 memory). The written configuration is re-estimated (see :class:`Export`).

    Raises:
        UnsupportedPlanError: a GPT-style model (torchtitan has no such architecture), or a
            plan that drops MoE tokens at a capacity (torchtitan's MoE is dropless).
    """
    c, t = plan.config, plan.train
    if t.moe_capacity_factor is not None:
        # torchtitan models/moe/moe.py MoEArgs: no capacity field, every routed token computed
        raise UnsupportedPlanError(
            f"moe_capacity_factor={t.moe_capacity_factor}: torchtitan's MoE is dropless (its "
            "MoEArgs has no capacity factor), so the plan's token dropping cannot be written; "
            "running it dropless would compute other tokens than the plan prices. Fix: plan "
            "with moe_capacity_factor=None, or export for Megatron-LM (to_megatron_args).")
    warn: list[str] = []
    w = own_rounds(c, "torchtitan", warn).replace(placement=rank_order(c, "torchtitan", warn)[1])
    w = one_reshard_policy(c, w, "torchtitan", warn)
    model = titan_flavor(plan, warn)
    par: dict = {"tensor_parallel_degree": c.tp, "pipeline_parallel_degree": c.pp,
                 "context_parallel_degree": c.cp}
    if c.ep > 1:
        par["expert_parallel_degree"] = c.ep
        # always written: torchtitan's default is 1, not tp (job_config.py Parallelism.
        # expert_tensor_parallel_degree), so an unfolded plan with tp > 1 needs tp here
        etp = c.etp
        if etp not in (1, c.tp):
            # distributed/parallel_dims.py: "Currently we only support ETP=TP or ETP=1"
            warn.append(f"expert_tp={etp}: torchtitan runs expert tensor parallelism 1 or tp "
                        f"only; written with etp = tp={c.tp}")
            w, etp = w.replace(expert_tp=None), c.tp
        par["expert_tensor_parallel_degree"] = etp
        if c.dispatcher == "deepep":
            if etp == 1:
                # job_config.py Parallelism.expert_parallel_comm_backend (v0.2.2)
                par["expert_parallel_comm_backend"] = "deepep"
            else:
                # models/llama4/infra/parallelize.py: "DeepEP with Expert Tensor Parallelism
                # (ETP) is not supported yet"
                warn.append(f"dispatcher deepep with expert_tensor_parallel_degree {etp}: "
                            "torchtitan runs DeepEP only with etp 1; written with the "
                            "all-to-all dispatcher")
                w = w.replace(dispatcher="alltoall")
    elif c.dispatcher == "deepep":
        w = w.replace(dispatcher="alltoall")   # no MoE traffic to dispatch with ep = 1
    if c.cp > 1:
        if c.cp_mode == "ulysses":
            warn.append("cp_mode=ulysses: torchtitan has no Ulysses context parallelism; used "
                        "ring attention (context_parallel_rotate_method 'alltoall')")
            w = w.replace(cp_mode="ring")
        par["context_parallel_rotate_method"] = "allgather" if w.cp_mode == "allgather" \
            else "alltoall"
    dp_keys, w = titan_data_parallel(c, w, warn)
    par.update(dp_keys)
    if c.tp > 1 and not c.sequence_parallel:
        warn.append("sequence_parallel off: torchtitan always shards norms over the sequence "
                    "under TP (less memory, the same numbers)")
        w = w.replace(sequence_parallel=True)
    mbs = c.micro_batch_size or t.micro_batch_size or 1
    if c.pp > 1 and c.schedule == "dualpipe":
        warn.append("schedule dualpipe: torchtitan has no bidirectional DualPipe (torch 2.13 "
                    "pipelining has ScheduleDualPipeV only); written as DualPipeV on the same "
                    "ranks, which keeps one copy of the parameters")
        w = w.replace(schedule="dualpipev")
        c = c.replace(schedule="dualpipev")
    if c.pp > 1:
        par["pipeline_parallel_schedule"] = TITAN_SCHEDULES[c.schedule or "1f1b"]
        if c.schedule == "dualpipev" and c.ep > 1 and set(block_modes(plan)) != {"none"}:
            # dual_pipe_v.get_dual_pipe_v_flag raises NotImplementedError for EP + DualPipeV +
            # activation checkpointing while the overlap is on (the default)
            par["pipeline_parallel_expert_parallel_overlap"] = False
            warn.append("schedule dualpipev with ep > 1 and recompute: torchtitan's all-to-all "
                        "overlap refuses activation checkpointing; written with "
                        "pipeline_parallel_expert_parallel_overlap = false (the all-to-alls are "
                        "not hidden, as estimated)")
        par["pipeline_parallel_microbatch_size"] = mbs
        if c.stage_blocks:
            # the MTP blocks (after every decoder layer) are not torchtitan modules
            mtp = int((plan.model_config or {}).get("mtp_layers") or 0)
            par["module_fqns_per_model_part"] = fqns_per_part(without_mtp(c.stage_blocks, mtp))
        local = t.global_batch_size // c.dp   # all of a step's micro-batches in one schedule
    else:
        local = mbs                           # one forward; torchtitan accumulates the rest
    train = {"local_batch_size": local, "global_batch_size": t.global_batch_size,
             "seq_len": t.seq_len,
             "mixed_precision_param": "float32" if t.precision == "fp32" else "bfloat16",
             "mixed_precision_reduce": "float32"}
    warn += titan_batch_check(train, par, c.dp, mbs, t.global_batch_size)
    t_written = t
    if t.precision in ("fp16", "fp8"):
        warn.append(f"precision {t.precision}: torchtitan trains in bf16 (fp8 needs a float8 "
                    "model converter); used bf16")
        t_written = replace(t, precision="bf16")
    offload, t_written = titan_offload(t_written, w, warn, "v0.2.2")
    if offload:
        train["enable_cpu_offload"] = True
    ac, modes_written = titan_ac(block_modes(plan), warn)
    # one mode for every block is one plan, one spelling (the str)
    w = w.replace(recompute=modes_written[0] if len(set(modes_written)) == 1 else modes_written)
    opt = {"name": "AdamW" if t.optimizer in ("adam", "adamw") else "SGD"}
    if t.optimizer == "adam":
        opt["weight_decay"] = 0.0
    sections = {"job": {"description": f"autopar plan for {plan.model} on {plan.cluster}"},
                "model": model, "training": train, "parallelism": par,
                "activation_checkpoint": ac, "optimizer": opt}
    lines = []
    for name, kv in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in kv.items()]
        lines.append("")
    known = model["flavor"] in TITAN_LLAMA3_FLAVORS
    return finish(plan, "\n".join(lines), warn, w, "torchtitan", train=t_written,
                  needs="" if known else f"the flavor {model['flavor']!r} is added")


def titan_data_parallel(c, w, warn: list[str]):
    """(the data-parallel keys of torchtitan's parallelism section, ``w`` with the ZeRO stage
    they run). The same in v0.2.2 and 0.3 (``config/job_config.py`` / ``config/configs.py``
    Parallelism): DDP (replicate) only for pure data parallelism without ZeRO, FSDP2 (shard)
    otherwise; ZeRO-1, and ZeRO-0 under model parallelism, run as FSDP without resharding after
    forward (ZeRO-2 memory). The profile (:mod:`autopar.frameworks.stacks.torchtitan`) has the
    same rule."""
    model_parallel = c.tp > 1 or c.pp > 1 or c.cp > 1 or c.ep > 1
    if c.zero_stage >= 2 or (c.dp > 1 and (c.zero_stage == 1 or model_parallel)):
        zero = 3 if c.zero_stage == 3 else 2
        if c.zero_stage < 2:
            why = ("torchtitan has no optimizer-state-only sharding" if c.zero_stage == 1 and
                   not model_parallel else "autopar's torchtitan profile runs TP/PP/CP/EP "
                   "with FSDP only (v0.2.2 refuses DDP there: 'DDP has not supported > 1D "
                   "parallelism', models/llama3/infra/parallelize.py)")
            warn.append(f"zero_stage {c.zero_stage}: {why}; used FSDP over the {c.dp} "
                        "data-parallel ranks without resharding after forward (ZeRO-2: less "
                        "memory, gradients reduce-scattered and parameters gathered once per "
                        "step)")
        keys = dict(data_parallel_replicate_degree=1, data_parallel_shard_degree=c.dp,
                    fsdp_reshard_after_forward="always" if zero == 3 else "never")
        return keys, w.replace(zero_stage=zero)
    return dict(data_parallel_replicate_degree=c.dp, data_parallel_shard_degree=1), w


def titan_offload(t, w, warn: list[str], version: str):
    """(whether to write ``training.enable_cpu_offload``, ``t`` as written): torchtitan offloads
    only through FSDP2's CPUOffloadPolicy (parameters, gradients and optimizer states together,
    as :mod:`autopar.cost.offload` prices it: ``training.enable_cpu_offload`` in v0.2.2 and 0.3),
    has no activation offload and keeps optimizer states in the parameters' dtype."""
    offload = bool(t.param_offload and w.zero_stage == 3)
    if t.param_offload and not offload:
        warn.append(f"param_offload: torchtitan offloads FSDP shards only; not written at "
                    f"ZeRO-{w.zero_stage}")
        t = replace(t, param_offload=False)
    t = unwritten(t, "activation_offload", warn, f"activation_offload: not written "
                  f"(torchtitan {version} has no activation offload option)")
    if t.optimizer_offload and not offload:
        warn.append("optimizer_offload: torchtitan offloads only everything together "
                    "(training.enable_cpu_offload: parameters, gradients and optimizer states "
                    "through FSDP2's CPUOffloadPolicy); not written, the optimizer stays on the GPU")
        t = replace(t, optimizer_offload=False)
    t = unwritten(t, "optimizer_state_dtype", warn,
                  f"optimizer_state_dtype {t.optimizer_state_dtype}: torchtitan's optimizers "
                  "keep states in the parameters' dtype (fp32 shards); used fp32")
    return offload, t


def without_mtp(stage_blocks, n: int):
    """``stage_blocks`` with the last ``n`` blocks (the MTP modules, after every decoder layer)
    taken off the last stages."""
    if not stage_blocks or n <= 0:
        return stage_blocks
    cuts = list(stage_blocks)
    for i in reversed(range(len(cuts))):
        take = min(n, cuts[i])
        cuts[i] -= take
        n -= take
        if not n:
            break
    return tuple(cuts)


def fqns_per_part(stage_blocks, head: str = "output") -> list[list[str]]:
    parts, first = [], 0
    for i, n in enumerate(stage_blocks):
        part = (["tok_embeddings"] if i == 0 else []) + [
            f"layers.{b}" for b in range(first, first + n)]
        if i == len(stage_blocks) - 1:
            part += ["norm", head]
        parts.append(part)
        first += n
    return parts


def titan_ac(modes, warn, every_nth: bool = True) -> tuple[dict, tuple[str, ...]]:
    """(activation_checkpoint section, the per-block modes it runs); ``every_nth``: torchtitan
    has v0.2.2's ``selective_ac_option`` N (full recompute of every N-th block; 0.3 has not)."""
    if "selective" in modes:
        # torchtitan's selective mode is op-level SAC, which keeps less than the attention-core
        # recompute planned: never more memory than planned, a little more recompute time
        warn.append("recompute 'selective' (attention core): torchtitan has op-level selective "
                    "checkpointing instead (selective_ac_option 'op', autopar's 'selective-op'); "
                    "used it")
        modes = tuple("selective-op" if m == "selective" else m for m in modes)
    kinds = set(modes)
    if len(kinds) == 1:
        mode = modes[0]
        if mode == "selective-op":
            return {"mode": "selective", "selective_ac_option": "op"}, tuple(modes)
        return {"mode": mode}, tuple(modes)
    full = [i for i, x in enumerate(modes) if x == "full"]
    every = full[0] + 1 if full else 0
    if every_nth and kinds == {"none", "full"} and \
            full == list(range(every - 1, len(modes), every)):
        return {"mode": "selective", "selective_ac_option": str(every)}, tuple(modes)
    strongest = strongest_mode(modes)
    warn.append(f"per-block recompute ({per_block_text(modes)}): torchtitan sets one mode "
                "for all blocks" + (" (or full every N-th)" if every_nth else "") +
                f"; used {strongest!r} everywhere (never more memory than planned)")
    section = ({"mode": "selective", "selective_ac_option": "op"} if strongest == "selective-op"
               else {"mode": strongest})
    return section, (strongest,) * len(modes)
