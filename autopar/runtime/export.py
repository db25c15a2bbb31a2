"""Exporters: a plan as Megatron-LM arguments, a torchtitan TOML, a DeepSpeed config.

Each returns an :class:`Export`: the value in the framework's form and ``warnings``, one line
per plan choice the framework cannot express, naming the nearest equivalent used. Nothing is
dropped silently; ``Export.text()`` puts the warnings in the output as comments. Each exporter
also builds the configuration it really writes (``Export.written``, in autopar's terms) and
re-estimates it under that framework (:mod:`autopar.runtime.verdict`): the last warnings say the
step time and memory of what the file runs against the plan's, whether it still fits, and when
not, the nearest plan the framework can run (its :mod:`autopar.frameworks` profile).

Which framework versions the names follow (see docs/runtime.md for how each was checked):
Megatron-LM ``megatron/training/arguments.py`` (core_r0.12 and later), torchtitan 0.2.x
(``torchtitan/config/job_config.py``; torchtitan 0.3 replaced TOML files with Python config
registries), DeepSpeed 0.19 (``deepspeed/runtime/config.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from ..config import ParallelConfig
from .errors import UnsupportedPlanError
from .verdict import verdict

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
        written: the configuration the value really runs, in autopar's terms (None for
            launchers, which run the plan as it is).
        fits: whether ``written`` fits in memory under autopar's re-estimate (None when not
            re-estimated).
    """

    value: object
    warnings: tuple[str, ...] = field(default=())
    comment: str = "#"
    written: ParallelConfig | None = None
    fits: bool | None = None

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


def _finish(plan, value, warn: list[str], written: ParallelConfig, framework: str,
            comment: str = "#", train=None) -> Export:
    """The export, with the re-estimate of ``written`` under ``framework`` appended."""
    lines, fits = verdict(plan, written, framework, train)
    return Export(value, tuple(warn + lines), comment=comment, written=written, fits=fits)


def _balanced(total: int, parts: int) -> tuple[int, ...]:
    q, r = divmod(total, parts)
    return tuple(q + (1 if i < r else 0) for i in range(parts))


def to_megatron_args(plan) -> Export:
    """Megatron-LM ``pretrain_gpt.py`` arguments for ``plan`` (DP is implied by the world size).

    Per-block recompute mixes become ``--recompute-method block`` with the most blocks fully
    recomputed in any stage; ZeRO-2 becomes the distributed optimizer (ZeRO-1), ZeRO-3 FSDP2
    (ZeRO-1 under pipeline or expert parallelism, which FSDP2 does not combine with); GPipe
    runs as 1F1B; interleaved chunks are equal (or interleaving is dropped); middle stages are
    cut evenly. The written configuration is re-estimated (see :class:`Export`).
    """
    c, t, m = plan.config, plan.train, plan.model_config or {}
    warn: list[str] = []
    w = c
    a = ["--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.pp),
         "--context-parallel-size", str(c.cp)]
    if c.sequence_parallel:
        a.append("--sequence-parallel")
    if c.ep > 1:
        a += ["--expert-model-parallel-size", str(c.ep)]
    if c.cp > 1:
        # Megatron-LM names the CP exchange: p2p (ring), a2a (Ulysses), all_gather
        # (megatron/core/transformer/transformer_config.py cp_comm_type)
        a += ["--cp-comm-type", {"ring": "p2p", "ulysses": "a2a",
                                 "allgather": "all_gather"}[c.cp_mode]]
    v = c.virtual_stages or 1
    blocks = c.stage_blocks or ()
    total = sum(blocks) if blocks else m.get("num_layers", 0)
    if v > 1 and blocks and not _uniform(blocks):
        if total % (c.pp * v) == 0:
            eq = (total // (c.pp * v),) * (c.pp * v)
            warn.append(f"non-uniform interleaved chunks {blocks}: Megatron gives every virtual "
                        f"stage the same layers; used {eq[0]} per virtual stage")
            w = w.replace(stage_blocks=eq)
            blocks = eq
        else:
            warn.append(f"interleaved chunks {blocks}: {total} layers do not split into "
                        f"{c.pp * v} equal chunks, which Megatron requires; interleaving "
                        "dropped (1F1B, one chunk per stage)")
            v, blocks = 1, _balanced(total, c.pp)
            w = w.replace(virtual_stages=1, schedule="1f1b", stage_blocks=blocks)
    if v > 1:
        a += ["--num-layers-per-virtual-pipeline-stage", str(blocks[0] if blocks else 1)]
    elif blocks and c.pp > 1 and not _uniform(blocks):
        cut = _megatron_cut(blocks)
        if cut != blocks:
            warn.append(f"stage cuts {blocks}: Megatron sets only the first and last stage's "
                        f"layers and splits the rest evenly; used {cut}")
            w = w.replace(stage_blocks=cut)
        if not _uniform(cut):
            a += ["--decoder-first-pipeline-num-layers", str(cut[0]),
                  "--decoder-last-pipeline-num-layers", str(cut[-1])]
    if c.schedule == "gpipe":
        warn.append("schedule gpipe: Megatron runs 1F1B (the same gradients, less activation "
                    "memory)")
        w = w.replace(schedule="1f1b")
    mbs = c.micro_batch_size or t.micro_batch_size or 1
    a += ["--micro-batch-size", str(mbs), "--global-batch-size", str(t.global_batch_size),
          "--seq-length", str(t.seq_len)]
    if c.zero_stage in (1, 2):
        a.append("--use-distributed-optimizer")
        if c.zero_stage == 2:
            warn.append("zero_stage 2: Megatron's distributed optimizer shards optimizer states "
                        "and reduce-scatters gradients but keeps a full gradient buffer (ZeRO-1 "
                        "memory)")
            w = w.replace(zero_stage=1)
    elif c.zero_stage == 3 and (c.pp > 1 or c.ep > 1 or m.get("tied_embeddings")
                                or t.precision == "fp16"):
        # arguments.py: --use-torch-fsdp2 asserts pipeline and expert parallel size 1,
        # --untie-embeddings-and-output-weights, and no fp16
        why = ("pipelining" if c.pp > 1 else "expert parallelism" if c.ep > 1 else
               "tied embeddings" if m.get("tied_embeddings") else "fp16")
        a.append("--use-distributed-optimizer")
        warn.append(f"zero_stage 3 with {why}: Megatron's FSDP2 path does not combine with it "
                    "(megatron/training/arguments.py); used the distributed optimizer (ZeRO-1)")
        w = w.replace(zero_stage=1)
    elif c.zero_stage == 3:
        a.append("--use-torch-fsdp2")
    rc_args, rc_written = _megatron_recompute(plan, warn)
    a += rc_args
    w = w.replace(recompute=rc_written)
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
    return _finish(plan, a, warn, w, "megatron")


def _megatron_cut(blocks: tuple[int, ...]) -> tuple[int, ...]:
    """The nearest cut Megatron expresses: the plan's first stage, the middle stages even, the
    remainder on the last stage (arguments.py checks the middle layers divide evenly)."""
    pp = len(blocks)
    if pp <= 2:
        return blocks
    total, first = sum(blocks), blocks[0]
    q = (total - first - blocks[-1]) // (pp - 2)
    return (first, *(q,) * (pp - 2), total - first - q * (pp - 2))


def _megatron_recompute(plan, warn: list[str]) -> tuple[list[str], str | tuple[str, ...]]:
    """(flags, the recompute written in autopar's terms: a mode or one mode per block)."""
    modes = _modes(plan)
    if len(set(modes)) == 1:
        mode = modes[0]
        return ({"none": [], "selective": ["--recompute-granularity", "selective"],
                 "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
                          "--recompute-num-layers", "1"]}[mode], plan.config.recompute)
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
        return ["--recompute-granularity", "selective"], "selective"
    written = tuple("full" if i < n_full else "none" for n in blocks for i in range(n))
    return (["--recompute-granularity", "full", "--recompute-method", "block",
             "--recompute-num-layers", str(n_full)], written)


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


#: torchtitan v0.2.2 torchtitan/models/llama3/__init__.py ``llama3_args``: flavor -> (layers,
#: hidden, heads, KV heads, FFN hidden (from ffn_dim_multiplier and multiple_of), vocabulary
#: (TransformerModelArgs default 128256), rope_theta).
TITAN_LLAMA3_FLAVORS = {
    "8B": (32, 4096, 32, 8, 14336, 128256, 500000.0),
    "70B": (80, 8192, 64, 8, 28672, 128256, 500000.0),
    "405B": (126, 16384, 128, 8, 53248, 128256, 500000.0),
}


def _titan_flavor(plan, warn: list[str]) -> dict:
    """torchtitan's model section: ``llama3`` and the flavor whose shape is the plan's model.

    Raises:
        UnsupportedPlanError: a model torchtitan has no architecture for (GPT: learned
            positions, LayerNorm, GELU, biases).
    """
    m = plan.model_config or {}
    if m and (m.get("family") == "gpt" or m.get("norm") == "layernorm"
              or m.get("position") not in (None, "rope")):
        raise UnsupportedPlanError(
            f"torchtitan has no architecture for {plan.model} (GPT-style: learned positions, "
            "LayerNorm, GELU, biases); a llama3 TOML would train a different model. Fix: "
            "export with plan.to_megatron_args() or plan.to_deepspeed_config().")
    shape = (m.get("num_layers"), m.get("hidden_size"), m.get("num_heads"),
             m.get("num_kv_heads") or m.get("num_heads"), m.get("ffn_hidden_size"),
             m.get("vocab_size"), float(m.get("rope_theta", 10000.0)))
    for flavor, known in TITAN_LLAMA3_FLAVORS.items():
        if shape == known:
            return {"name": "llama3", "flavor": flavor}
    name = str(plan.model)
    warn.append(
        f"model {name}: torchtitan has no llama3 flavor of this shape (it has "
        f"{', '.join(TITAN_LLAMA3_FLAVORS)}); flavor {name!r} written so torchtitan stops at "
        "an unknown flavor instead of training its debug model. Fix: add "
        f"llama3_args[{name!r}] = TransformerModelArgs(dim={shape[1]}, n_layers={shape[0]}, "
        f"n_heads={shape[2]}, n_kv_heads={shape[3]}, vocab_size={shape[5]}, "
        f"rope_theta={shape[6]:g}, ...) with the FFN size {shape[4]} in "
        "torchtitan/models/llama3/__init__.py")
    return {"name": "llama3", "flavor": name}


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
        UnsupportedPlanError: a GPT-style model (torchtitan has no such architecture).
    """
    c, t = plan.config, plan.train
    warn: list[str] = []
    w = c
    model = _titan_flavor(plan, warn)
    par: dict = {"tensor_parallel_degree": c.tp, "pipeline_parallel_degree": c.pp,
                 "context_parallel_degree": c.cp}
    if c.ep > 1:
        par["expert_parallel_degree"] = c.ep
    if c.cp > 1:
        if c.cp_mode == "ulysses":
            warn.append("cp_mode=ulysses: torchtitan has no Ulysses context parallelism; used "
                        "ring attention (context_parallel_rotate_method 'alltoall')")
            w = w.replace(cp_mode="ring")
        par["context_parallel_rotate_method"] = "allgather" if w.cp_mode == "allgather" \
            else "alltoall"
    model_parallel = c.tp > 1 or c.pp > 1 or c.cp > 1 or c.ep > 1
    if c.zero_stage >= 2 or (c.dp > 1 and (c.zero_stage == 1 or model_parallel)):
        zero = 3 if c.zero_stage == 3 else 2
        par.update(data_parallel_replicate_degree=1, data_parallel_shard_degree=c.dp,
                   fsdp_reshard_after_forward="always" if zero == 3 else "never")
        if c.zero_stage < 2:
            why = ("torchtitan has no optimizer-state-only sharding" if c.zero_stage == 1 and
                   not model_parallel else "torchtitan refuses DDP combined with TP/PP/CP "
                   "('DDP has not supported > 1D parallelism', models/llama3/infra/"
                   "parallelize.py)")
            warn.append(f"zero_stage {c.zero_stage}: {why}; used FSDP over the {c.dp} "
                        "data-parallel ranks without resharding after forward (ZeRO-2: less "
                        "memory, gradients reduce-scattered and parameters gathered once per "
                        "step)")
        w = w.replace(zero_stage=zero)
    else:
        par.update(data_parallel_replicate_degree=c.dp, data_parallel_shard_degree=1)
    if c.tp > 1 and not c.sequence_parallel:
        warn.append("sequence_parallel off: torchtitan always shards norms over the sequence "
                    "under TP (less memory, the same numbers)")
        w = w.replace(sequence_parallel=True)
    mbs = c.micro_batch_size or t.micro_batch_size or 1
    if c.pp > 1:
        sched = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
        par["pipeline_parallel_schedule"] = sched[c.schedule or "1f1b"]
        par["pipeline_parallel_microbatch_size"] = mbs
        if c.stage_blocks:
            par["module_fqns_per_model_part"] = _fqns_per_part(c.stage_blocks)
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
    ac, modes_written = _titan_ac(_modes(plan), warn)
    w = w.replace(recompute=modes_written if isinstance(c.recompute, tuple) else modes_written[0])
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
    return _finish(plan, "\n".join(lines), warn, w, "torchtitan", train=t_written)


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


def _titan_ac(modes, warn) -> tuple[dict, tuple[str, ...]]:
    """(activation_checkpoint section, the per-block modes it runs)."""
    kinds = set(modes)
    if len(kinds) == 1:
        mode = modes[0]
        return {"mode": mode} | ({"selective_ac_option": "op"} if mode == "selective"
                                 else {}), tuple(modes)
    full = [i for i, x in enumerate(modes) if x == "full"]
    every = full[0] + 1 if full else 0
    if kinds == {"none", "full"} and full == list(range(every - 1, len(modes), every)):
        return {"mode": "selective", "selective_ac_option": str(every)}, tuple(modes)
    strongest = _strongest(modes)
    warn.append(f"per-block recompute {modes}: torchtitan sets one mode for all blocks (or full "
                f"every N-th); used {strongest!r} everywhere (never more memory than planned)")
    return {"mode": strongest} | (
        {"selective_ac_option": "op"} if strongest == "selective" else {}), \
        (strongest,) * len(modes)


def to_deepspeed_config(plan) -> Export:
    """A DeepSpeed config dict (``ds_config.json``) for ``plan``.

    Tensor parallelism maps to DeepSpeed's AutoTP (``tensor_parallel.autotp_size``); pipeline
    stages to the ``pipeline`` section, which a ``PipelineModule`` reads (partitioned by
    parameter count: DeepSpeed takes no explicit cut list). Pipelines run ZeRO-1, one chunk per
    stage, 1F1B; CP ranks become data-parallel ranks; recompute is whole layers. The written
    configuration is re-estimated (see :class:`Export`).
    """
    c, t = plan.config, plan.train
    warn: list[str] = []
    w = c
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
            w = w.replace(sequence_parallel=False)
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
        w = w.replace(cp=1, dp=ds_dp, cp_mode="ring",
                      micro_batch_size=cfg["train_micro_batch_size_per_gpu"])
        warn.append(f"cp={c.cp}: DeepSpeed's nearest is Ulysses sequence parallelism "
                    "(sequence_parallel_size), which needs the model's attention wrapped; not "
                    f"set, so the {c.cp} CP ranks become data-parallel ranks ({batch_note}); "
                    "activation memory per GPU is higher than the plan's estimate")
    if c.pp > 1:
        v = c.virtual_stages or 1
        cfg["pipeline"] = {"stages": c.pp, "partition": "parameters",
                           "activation_checkpoint_interval": 0}
        blocks = c.stage_blocks or ()
        balanced = _balanced(sum(blocks), c.pp) if blocks else None
        if blocks and max(blocks) - min(blocks) > 1:
            warn.append(f"stage cuts {blocks}: DeepSpeed's PipelineModule cannot take explicit "
                        "cuts; used partition_method 'parameters' (balances parameter counts; "
                        f"estimated as {balanced})")
        if v > 1:
            warn.append(f"virtual_stages {v}: DeepSpeed has no interleaved schedule; used one "
                        "chunk per stage (1F1B)")
        if c.schedule == "gpipe":
            warn.append("schedule gpipe: DeepSpeed's pipeline runs its 1F1B-style TrainSchedule")
        w = w.replace(virtual_stages=1, schedule="1f1b", stage_blocks=balanced)
        if c.zero_stage >= 2:
            warn.append(f"zero_stage {c.zero_stage}: DeepSpeed pipeline parallelism supports "
                        "ZeRO-1 only; used stage 1")
            cfg["zero_optimization"] = {"stage": 1}
            w = w.replace(zero_stage=1)
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
            w = w.replace(recompute="full")   # the interval checkpoints every layer
        else:
            full = tuple("none" if x == "none" else "full" for x in modes)
            w = w.replace(recompute=full[0] if len(set(full)) == 1 else full)
    t_written = t if t.precision != "fp8" else replace(t, precision="bf16")
    return _finish(plan, cfg, warn, w, "deepspeed", comment="", train=t_written)
