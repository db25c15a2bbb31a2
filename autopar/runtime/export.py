"""Exporters: a plan as Megatron-LM arguments, a torchtitan TOML, a DeepSpeed config.

Each returns an :class:`Export`: the value in the framework's form and ``warnings``, one line
per plan choice the framework cannot express, naming the nearest equivalent used. Nothing is
dropped silently; ``Export.text()`` puts the warnings in the output as comments.

Which framework versions the names follow (see docs/runtime.md for how each was checked):
Megatron-LM ``megatron/training/arguments.py`` (core_r0.12 and later), torchtitan 0.2.x
(``torchtitan/config/job_config.py``; torchtitan 0.3 replaced TOML files with Python config
registries), DeepSpeed 0.19 (``deepspeed/runtime/config.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

#: Megatron-LM flags this exporter may emit (all defined in megatron/training/arguments.py).
MEGATRON_FLAGS = frozenset({
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--sequence-parallel", "--num-layers-per-virtual-pipeline-stage",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--micro-batch-size", "--global-batch-size", "--seq-length", "--max-position-embeddings",
    "--use-distributed-optimizer", "--use-torch-fsdp2", "--recompute-granularity",
    "--recompute-method", "--recompute-num-layers", "--bf16", "--fp16", "--fp8-format",
    "--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
    "--group-query-attention", "--num-query-groups", "--vocab-size", "--normalization",
    "--norm-epsilon", "--swiglu", "--position-embedding-type", "--rotary-base",
    "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--attention-dropout",
    "--hidden-dropout", "--optimizer", "--expert-model-parallel-size", "--cp-comm-type",
})

_MODE_ORDER = ("none", "selective", "full")


@dataclass(frozen=True)
class Export:
    """An exported plan.

    Attributes:
        value: the framework's form (list of CLI arguments, TOML text, JSON-able dict, or a
            command/script string).
        warnings: plan choices the framework cannot express, each with the nearest equivalent
            that ``value`` uses instead.
        comment: the comment prefix of the text form ("#"; "" for JSON, which has none).
    """

    value: object
    warnings: tuple[str, ...] = field(default=())
    comment: str = "#"

    def text(self) -> str:
        """The value as text, warnings first as comments (for JSON: under ``"_autopar_warnings"``,
        a key DeepSpeed ignores)."""
        if isinstance(self.value, dict):
            d = dict(self.value)
            if self.warnings:
                d["_autopar_warnings"] = list(self.warnings)
            return json.dumps(d, indent=2) + "\n"
        body = " ".join(self.value) if isinstance(self.value, list) else str(self.value)
        head = "".join(f"{self.comment} autopar: {w}\n" for w in self.warnings)
        return head + body + ("" if body.endswith("\n") else "\n")


def _modes(plan) -> tuple[str, ...]:
    c = plan.config
    if isinstance(c.recompute, str):
        n = sum(c.stage_blocks) if c.stage_blocks else (
            (plan.model_config or {}).get("num_layers") or 1)
        return (c.recompute,) * n
    return tuple(c.recompute)


def _strongest(modes) -> str:
    return max(modes, key=_MODE_ORDER.index)


def _uniform(blocks: tuple[int, ...]) -> bool:
    return len(set(blocks)) <= 1


def to_megatron_args(plan) -> Export:
    """Megatron-LM ``pretrain_gpt.py`` arguments for ``plan`` (DP is implied by the world size).

    Per-block recompute mixes become ``--recompute-method block`` with the most blocks fully
    recomputed in any stage; ZeRO-2 becomes the distributed optimizer (ZeRO-1), ZeRO-3 FSDP2.
    """
    c, t, m = plan.config, plan.train, plan.model_config or {}
    warn: list[str] = []
    a = ["--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.pp),
         "--context-parallel-size", str(c.cp)]
    if c.sequence_parallel:
        a.append("--sequence-parallel")
    if c.ep > 1:
        a += ["--expert-model-parallel-size", str(c.ep)]
    if c.cp > 1:
        # Megatron-LM names the CP exchange: p2p (ring), a2a (Ulysses), all_gather
        a += ["--cp-comm-type", {"ring": "p2p", "ulysses": "a2a",
                                 "allgather": "all_gather"}[c.cp_mode]]
    v = c.virtual_stages or 1
    blocks = c.stage_blocks or ()
    if v > 1:
        if blocks and not _uniform(blocks):
            warn.append(f"non-uniform interleaved chunks {blocks}: Megatron gives every virtual "
                        f"stage the same layers; used {max(blocks)} per virtual stage")
        a += ["--num-layers-per-virtual-pipeline-stage", str(max(blocks) if blocks else 1)]
    elif blocks and c.pp > 2 and not _uniform(blocks[1:-1]):
        warn.append(f"stage cuts {blocks}: Megatron sets only the first and last stage's layers "
                    "and splits the rest evenly; middle stages are split evenly")
    if v == 1 and blocks and c.pp > 1 and not _uniform(blocks):
        a += ["--decoder-first-pipeline-num-layers", str(blocks[0]),
              "--decoder-last-pipeline-num-layers", str(blocks[-1])]
    if c.schedule == "gpipe":
        warn.append("schedule gpipe: Megatron runs 1F1B (the same gradients, less activation "
                    "memory)")
    mbs = c.micro_batch_size or t.micro_batch_size or 1
    a += ["--micro-batch-size", str(mbs), "--global-batch-size", str(t.global_batch_size),
          "--seq-length", str(t.seq_len)]
    if c.zero_stage in (1, 2):
        a.append("--use-distributed-optimizer")
        if c.zero_stage == 2:
            warn.append("zero_stage 2: Megatron's distributed optimizer shards optimizer states "
                        "and reduce-scatters gradients but keeps a full gradient buffer (ZeRO-1 "
                        "memory)")
    elif c.zero_stage == 3 and c.pp > 1:
        a.append("--use-distributed-optimizer")
        warn.append("zero_stage 3 with pipelining: Megatron's FSDP2 path does not combine with "
                    "pipeline parallelism; used the distributed optimizer (ZeRO-1)")
    elif c.zero_stage == 3:
        a.append("--use-torch-fsdp2")
    a += _megatron_recompute(plan, warn)
    a += {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": [],
          "fp8": ["--bf16", "--fp8-format", "hybrid"]}[t.precision]
    a += _megatron_model(m, t)
    if t.optimizer in ("adam", "adamw"):
        a += ["--optimizer", "adam"]
        if t.optimizer == "adam":
            warn.append("optimizer adam: Megatron's adam is AdamW (decoupled weight decay); set "
                        "--weight-decay 0 for plain Adam")
    else:
        a += ["--optimizer", "sgd"]
    return Export(a, tuple(warn))


def _megatron_recompute(plan, warn: list[str]) -> list[str]:
    modes = _modes(plan)
    if set(modes) == {"none"}:
        return []
    if set(modes) == {"selective"}:
        return ["--recompute-granularity", "selective"]
    if set(modes) == {"full"}:
        return ["--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1"]
    # A mix: Megatron's "block" method fully recomputes the first N layers of each stage.
    c = plan.config
    blocks = c.stage_blocks or (len(modes),)
    per_stage, first = [], 0
    for n in blocks:
        per_stage.append(sum(1 for x in modes[first:first + n] if x == "full"))
        first += n
    n_full = max(per_stage)
    warn.append(f"per-block recompute {modes}: Megatron recomputes the first N layers of every "
                f"stage; used full recompute of the first {n_full} layers per stage"
                + (", selective blocks not recomputed" if "selective" in modes else ""))
    if n_full == 0:
        return ["--recompute-granularity", "selective"]
    return ["--recompute-granularity", "full", "--recompute-method", "block",
            "--recompute-num-layers", str(n_full)]


def _megatron_model(m: dict, t) -> list[str]:
    if not m:
        return ["--max-position-embeddings", str(t.seq_len)]
    a = ["--num-layers", str(m["num_layers"]), "--hidden-size", str(m["hidden_size"]),
         "--num-attention-heads", str(m["num_heads"]), "--ffn-hidden-size",
         str(m["ffn_hidden_size"]), "--vocab-size", str(m["vocab_size"]),
         "--max-position-embeddings", str(max(m["seq_len"], t.seq_len)),
         "--norm-epsilon", str(m.get("norm_eps", 1e-5)),
         "--attention-dropout", str(m.get("attention_dropout", 0.0)),
         "--hidden-dropout", str(m.get("hidden_dropout", 0.0))]
    if m.get("num_kv_heads") and m["num_kv_heads"] != m["num_heads"]:
        a += ["--group-query-attention", "--num-query-groups", str(m["num_kv_heads"])]
    if m.get("norm") == "rmsnorm":
        a += ["--normalization", "RMSNorm"]
    if m.get("mlp") == "swiglu":
        a.append("--swiglu")
    if m.get("position") == "rope":
        a += ["--position-embedding-type", "rope", "--rotary-base",
              str(int(m.get("rope_theta", 10000)))]
    if m.get("bias") is False:
        a.append("--disable-bias-linear")
    if m.get("tied_embeddings") is False:
        a.append("--untie-embeddings-and-output-weights")
    return a


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def to_torchtitan_toml(plan) -> Export:
    """A torchtitan (0.2.x) job TOML for ``plan``; stage cuts, interleaved chunks included, are
    exact through ``module_fqns_per_model_part`` (torchtitan's Llama names)."""
    c, t = plan.config, plan.train
    warn: list[str] = []
    par: dict = {"tensor_parallel_degree": c.tp, "pipeline_parallel_degree": c.pp,
                 "context_parallel_degree": c.cp}
    if c.ep > 1:
        par["expert_parallel_degree"] = c.ep
    if c.cp > 1 and c.cp_mode != "ring":
        warn.append(f"cp_mode={c.cp_mode}: torchtitan's context parallelism is ring attention "
                    "(rotate method allgather or alltoall only within the ring); set "
                    "parallelism.context_parallel_rotate_method by hand")
    if c.zero_stage >= 2:
        par.update(data_parallel_replicate_degree=1, data_parallel_shard_degree=c.dp,
                   fsdp_reshard_after_forward="always" if c.zero_stage == 3 else "never")
    else:
        par.update(data_parallel_replicate_degree=c.dp, data_parallel_shard_degree=1)
        if c.zero_stage == 1:
            warn.append("zero_stage 1: torchtitan has no optimizer-state-only sharding; used "
                        "replicated data parallelism (DDP)")
    if c.tp > 1 and not c.sequence_parallel:
        warn.append("sequence_parallel off: torchtitan always shards norms over the sequence "
                    "under TP (less memory, the same numbers)")
    if c.pp > 1:
        sched = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
        par["pipeline_parallel_schedule"] = sched[c.schedule or "1f1b"]
        par["pipeline_parallel_microbatch_size"] = c.micro_batch_size or 1
        if c.stage_blocks:
            par["module_fqns_per_model_part"] = _fqns_per_part(c.stage_blocks)
    mbs = c.micro_batch_size or t.micro_batch_size or 1
    if c.pp == 1 and mbs * c.dp != t.global_batch_size:
        warn.append(f"micro-batch {mbs}: outside pipelining torchtitan accumulates gradients "
                    "over local_batch_size / (global_batch_size / dp) steps; micro-batching "
                    "follows from the batch sizes below")
    train = {"local_batch_size": t.global_batch_size // c.dp,
             "global_batch_size": t.global_batch_size, "seq_len": t.seq_len,
             "mixed_precision_param": "float32" if t.precision == "fp32" else "bfloat16",
             "mixed_precision_reduce": "float32"}
    if t.precision in ("fp16", "fp8"):
        warn.append(f"precision {t.precision}: torchtitan trains in bf16 (fp8 needs a float8 "
                    "model converter); used bf16")
    ac = _titan_ac(_modes(plan), warn)
    opt = {"name": "AdamW" if t.optimizer in ("adam", "adamw") else "SGD"}
    if t.optimizer == "adam":
        opt["weight_decay"] = 0.0
    model = {"name": "llama3"}
    sections = {"job": {"description": f"autopar plan for {plan.model} on {plan.cluster}"},
                "model": model, "training": train, "parallelism": par,
                "activation_checkpoint": ac, "optimizer": opt}
    lines = []
    for name, kv in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in kv.items()]
        lines.append("")
    return Export("\n".join(lines), tuple(warn))


def _fqns_per_part(stage_blocks) -> list[list[str]]:
    parts, first = [], 0
    for i, n in enumerate(stage_blocks):
        part = (["tok_embeddings"] if i == 0 else []) + [
            f"layers.{b}" for b in range(first, first + n)]
        if i == len(stage_blocks) - 1:
            part += ["norm", "output"]
        parts.append(part)
        first += n
    return parts


def _titan_ac(modes, warn) -> dict:
    kinds = set(modes)
    if len(kinds) == 1:
        mode = modes[0]
        return {"mode": mode} | ({"selective_ac_option": "op"} if mode == "selective" else {})
    full = [i for i, x in enumerate(modes) if x == "full"]
    every = full[0] + 1 if full else 0
    if kinds == {"none", "full"} and full == list(range(every - 1, len(modes), every)):
        return {"mode": "selective", "selective_ac_option": str(every)}
    strongest = _strongest(modes)
    warn.append(f"per-block recompute {modes}: torchtitan sets one mode for all blocks (or full "
                f"every N-th); used {strongest!r} everywhere (never more memory than planned)")
    return {"mode": strongest} | (
        {"selective_ac_option": "op"} if strongest == "selective" else {})


def to_deepspeed_config(plan) -> Export:
    """A DeepSpeed config dict (``ds_config.json``) for ``plan``.

    Tensor parallelism maps to DeepSpeed's AutoTP (``tensor_parallel.autotp_size``); pipeline
    stages to the ``pipeline`` section, which a ``PipelineModule`` reads (partitioned by
    parameter count: DeepSpeed takes no explicit cut list).
    """
    c, t = plan.config, plan.train
    warn: list[str] = []
    mbs = c.micro_batch_size or t.micro_batch_size or 1
    cfg: dict = {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": t.global_batch_size // (mbs * c.dp),
        "zero_optimization": {"stage": c.zero_stage},
        "gradient_clipping": 1.0,
    }
    if c.zero_stage == 2:
        cfg["zero_optimization"].update(overlap_comm=True, reduce_scatter=True)
    if t.precision in ("bf16", "fp8"):
        cfg["bf16"] = {"enabled": True}
        if t.precision == "fp8":
            warn.append("precision fp8: DeepSpeed's config has no fp8 switch (Transformer "
                        "Engine layers do it in the model); used bf16")
    elif t.precision == "fp16":
        cfg["fp16"] = {"enabled": True}
    opt = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}[t.optimizer]
    cfg["optimizer"] = {"type": opt, "params": {"lr": 3e-4}}
    if c.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": c.tp}
        if c.sequence_parallel:
            warn.append("sequence_parallel: DeepSpeed AutoTP has no Megatron-style sequence "
                        "parallelism (its sequence_parallel_size is Ulysses, a different "
                        "scheme); used TP without SP")
    if c.ep > 1:
        warn.append(f"ep={c.ep}: DeepSpeed sets expert parallelism in the model code "
                    "(deepspeed.moe.layer.MoE(ep_size=...)), not in the JSON config; not set")
    if c.cp > 1:
        # without CP, DeepSpeed's data-parallel size is dp * cp: keep the batch arithmetic true
        ds_dp = c.dp * c.cp
        accum = t.global_batch_size // (mbs * ds_dp)
        if accum >= 1 and accum * mbs * ds_dp == t.global_batch_size:
            cfg["gradient_accumulation_steps"] = accum
            batch_note = (f"gradient_accumulation_steps set to {accum} for DeepSpeed's "
                          f"data-parallel size {ds_dp}")
        else:
            cfg["train_micro_batch_size_per_gpu"] = 1
            cfg["gradient_accumulation_steps"] = max(1, t.global_batch_size // ds_dp)
            batch_note = (f"micro-batch 1 and gradient_accumulation_steps "
                          f"{cfg['gradient_accumulation_steps']} for DeepSpeed's data-parallel "
                          f"size {ds_dp}; check the global batch is a multiple of {ds_dp}")
        warn.append(f"cp={c.cp}: DeepSpeed's nearest is Ulysses sequence parallelism "
                    "(sequence_parallel_size), which needs the model's attention wrapped; not "
                    f"set, so the {c.cp} CP ranks become data-parallel ranks ({batch_note}); "
                    "activation memory per GPU is higher than the plan's estimate")
    if c.pp > 1:
        v = c.virtual_stages or 1
        cfg["pipeline"] = {"stages": c.pp, "partition": "parameters",
                           "activation_checkpoint_interval": 0}
        blocks = c.stage_blocks or ()
        if blocks and not _uniform(blocks):
            warn.append(f"stage cuts {blocks}: DeepSpeed's PipelineModule cannot take explicit "
                        "cuts; used partition_method 'parameters' (balances parameter counts)")
        if v > 1:
            warn.append(f"virtual_stages {v}: DeepSpeed has no interleaved schedule; used one "
                        "chunk per stage (1F1B)")
        if c.schedule == "gpipe":
            warn.append("schedule gpipe: DeepSpeed's pipeline runs its 1F1B-style TrainSchedule")
        if c.zero_stage >= 2:
            warn.append(f"zero_stage {c.zero_stage}: DeepSpeed pipeline parallelism supports "
                        "ZeRO-1 only; used stage 1")
            cfg["zero_optimization"] = {"stage": 1}
    modes = _modes(plan)
    if set(modes) != {"none"}:
        cfg["activation_checkpointing"] = {"partition_activations": False,
                                           "contiguous_memory_optimization": False}
        strongest = _strongest(modes)
        if len(set(modes)) > 1 or strongest == "selective":
            warn.append(f"recompute {modes}: DeepSpeed's activation checkpointing recomputes "
                        "whole checkpointed layers (the model calls "
                        "deepspeed.checkpointing.checkpoint per block); checkpoint every block "
                        "marked full or selective")
        if c.pp > 1:
            cfg["pipeline"]["activation_checkpoint_interval"] = 1
    return Export(cfg, tuple(warn), comment="")
