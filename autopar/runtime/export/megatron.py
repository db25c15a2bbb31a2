"""Megatron-LM ``pretrain_gpt.py`` arguments for a plan (flags from
``megatron/training/arguments.py``, core_r0.12 and later)."""

from __future__ import annotations

from dataclasses import replace

from ...frameworks.rules import first_n_modes
from ..verdict import per_block_text, plan_edits
from .common import Export, block_modes, finish, one_reshard_policy, rank_order, uniform

#: Megatron-LM flags this exporter may emit (all defined in megatron/training/arguments.py).
MEGATRON_FLAGS = frozenset({
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--sequence-parallel", "--num-layers-per-virtual-pipeline-stage",
    "--microbatch-group-size-per-virtual-pipeline-stage",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--micro-batch-size", "--global-batch-size", "--seq-length", "--max-position-embeddings",
    "--use-distributed-optimizer", "--use-torch-fsdp2", "--recompute-granularity",
    "--recompute-method", "--recompute-num-layers", "--bf16", "--fp16", "--fp8-format",
    "--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
    "--group-query-attention", "--num-query-groups", "--vocab-size", "--normalization",
    "--norm-epsilon", "--swiglu", "--squared-relu", "--position-embedding-type", "--rotary-base",
    "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--attention-dropout",
    "--hidden-dropout", "--optimizer", "--expert-model-parallel-size", "--cp-comm-type",
    "--use-tp-pp-dp-mapping", "--no-gradient-accumulation-fusion",
    "--pipeline-model-parallel-layout", "--use-precision-aware-optimizer",
    "--optimizer-cpu-offload", "--exp-avg-dtype", "--exp-avg-sq-dtype",
    # the profile edits a plan was costed with (_overlap_flags)
    "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
    "--no-overlap-p2p-communication",
    # models with experts or latent attention (_megatron_moe_model)
    "--kv-channels", "--qk-layernorm", "--multi-latent-attention", "--kv-lora-rank",
    "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--q-lora-rank", "--num-experts",
    "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-layer-freq",
    "--moe-token-dispatcher-type", "--moe-grouped-gemm", "--moe-shared-expert-intermediate-size",
    "--moe-flex-dispatcher-backend",
    "--expert-tensor-parallel-size", "--mtp-num-layers",
    # token dropping (autopar.cost.capacity)
    "--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity",
    # router settings (ModelConfig router_*; _megatron_router)
    "--moe-router-score-function", "--moe-router-load-balancing-type", "--moe-aux-loss-coeff",
    "--moe-router-enable-expert-bias", "--moe-z-loss-coeff",
})


def to_megatron_args(plan) -> Export:
    """Megatron-LM ``pretrain_gpt.py`` arguments for ``plan`` (DP is implied by the world size).

    Per-block recompute mixes become ``--recompute-method block`` with the most blocks fully
    recomputed in any stage; ZeRO-2 becomes the distributed optimizer (ZeRO-1), ZeRO-3 FSDP2
    (ZeRO-1 under pipeline or expert parallelism, which FSDP2 does not combine with); GPipe
    runs as 1F1B, the zero-bubble and V-shaped schedules as (interleaved) 1F1B; uneven stage
    cuts and interleaved chunks are written exactly with ``--pipeline-model-parallel-layout``.
    The written configuration is re-estimated (see :class:`Export`).
    """
    c, t, m = plan.config, plan.train, plan.model_config or {}
    warn: list[str] = []
    w = one_reshard_policy(c, c, "Megatron-LM", warn)
    a = ["--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.pp),
         "--context-parallel-size", str(c.cp)]
    if c.sequence_parallel:
        a.append("--sequence-parallel")
    order_flags, placement = rank_order(c, "megatron", warn)
    a += order_flags
    w = w.replace(placement=placement)
    if c.ep > 1:
        a += ["--expert-model-parallel-size", str(c.ep)]
    if c.folded:
        # MoE parallel folding (arguments.py --expert-tensor-parallel-size, default tp)
        a += ["--expert-tensor-parallel-size", str(c.etp)]
    if c.cp > 1:
        # Megatron-LM names the CP exchange: p2p (ring), a2a (Ulysses), all_gather
        # (megatron/core/transformer/transformer_config.py cp_comm_type)
        a += ["--cp-comm-type", {"ring": "p2p", "ulysses": "a2a",
                                 "allgather": "all_gather"}[c.cp_mode]]
    v = c.virtual_stages or 1
    blocks = c.stage_blocks or ()
    mtp = int(m.get("mtp_layers") or 0)
    if blocks and c.pp > 1 and (not uniform(blocks) or mtp):
        # any cut, interleaved chunks included, exactly (arguments.py
        # --pipeline-model-parallel-layout, parsed by megatron/core/transformer/
        # pipeline_parallel_layer_layout.py: chunks in model order, '|' between them); with
        # MTP blocks always, since --num-layers counts decoder layers only
        a += ["--pipeline-model-parallel-layout", pipeline_layout(blocks, mtp)]
    elif v > 1:
        a += ["--num-layers-per-virtual-pipeline-stage", str(blocks[0] if blocks else 1)]
    if v > 1 and c.vp_group is not None:
        # interleaved 1F1B's micro-batch group (model_parallel_config.py
        # microbatch_group_size_per_vp_stage; default pp)
        a += ["--microbatch-group-size-per-virtual-pipeline-stage", str(c.vp_group)]
    if c.schedule == "gpipe":
        warn.append("schedule gpipe: Megatron runs 1F1B (the same gradients, less activation "
                    "memory)")
        w = w.replace(schedule="1f1b")
    elif c.pp > 1 and c.schedule in ("interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev",
                                     "dualpipe"):
        nearest = "interleaved-1f1b" if v > 1 else "1f1b"
        warn.append(f"schedule {c.schedule}: Megatron-LM has no zero-bubble or V-shaped "
                    "schedule (megatron/core/pipeline_parallel/schedules.py runs 1F1B and "
                    f"interleaved 1F1B); written as {nearest} with the same chunks, placed "
                    "round-robin over the pipeline ranks")
        w = w.replace(schedule=nearest)
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
        # arguments.py validate_args: "--use-torch-fsdp2 is not supported with gradient
        # accumulation fusion", which is on by default
        a += ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]
    rc_args, rc_written = _megatron_recompute(plan, warn)
    a += rc_args
    w = w.replace(recompute=rc_written)
    a += {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": [],
          "fp8": ["--bf16", "--fp8-format", "hybrid"]}[t.precision]
    a += _megatron_model(m, t, c.dispatcher)
    if m.get("mlp") == "geglu":
        warn.append("mlp geglu: Megatron-LM's arguments have no GeGLU flag (arguments.py has "
                    "--swiglu, --squared-relu and --quick-geglu, a different activation); "
                    "Megatron-Core builds GeGLU from TransformerConfig gated_linear_unit=True "
                    "with activation_func=F.gelu (transformer/mlp.py bias_geglu_impl, "
                    "tanh-GELU), as Megatron-Bridge's Gemma providers set it. As written these "
                    "arguments build a two-matrix GELU MLP. Fix: set those two fields in the "
                    "model provider (e.g. start from Megatron-Bridge's Gemma recipe)")
    if t.moe_capacity_factor is not None:
        # token dropping as autopar.cost.capacity prices it (Megatron-Core transformer_config.py
        # moe_expert_capacity_factor / moe_pad_expert_input_to_capacity)
        a += ["--moe-expert-capacity-factor", str(t.moe_capacity_factor)]
        if t.moe_pad_to_capacity:
            a.append("--moe-pad-expert-input-to-capacity")
    if not m:
        warn.append(f"model {plan.model}: its shape is not written (a plan of a module or a "
                    "Hugging Face preset has no model_config). Fix: add the model's own "
                    "arguments (--num-layers, --hidden-size, --num-attention-heads, "
                    "--ffn-hidden-size, --vocab-size...; for MoE --num-experts, "
                    "--moe-router-topk) before running")
    if t.optimizer in ("adam", "adamw"):
        a += ["--optimizer", "adam"]
        if t.optimizer == "adam":
            warn.append("optimizer adam: Megatron's adam is AdamW (decoupled weight decay); set "
                        "--weight-decay 0 for plain Adam")
    else:
        a += ["--optimizer", "sgd"]
    # arguments.py: --optimizer-cpu-offload needs --use-precision-aware-optimizer, which also
    # takes the moments' dtypes (--exp-avg-dtype / --exp-avg-sq-dtype)
    if t.optimizer_offload or t.optimizer_state_dtype == "bf16":
        a += ["--use-precision-aware-optimizer"]
    if t.optimizer_offload:
        a += ["--optimizer-cpu-offload"]
    if t.optimizer_state_dtype == "bf16":
        a += ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    t_written = None
    if t.param_offload or t.activation_offload:
        warn.append("param_offload / activation_offload: not written (autopar has no source "
                    "that Megatron-LM offloads parameters, nor prices its activation offload)")
        t_written = replace(t, param_offload=False, activation_offload=False)
    flags, wrote = _overlap_flags(plan, w)
    a += flags
    return finish(plan, a, warn, w, "megatron", train=t_written, wrote_edits=wrote)


def _overlap_flags(plan, w) -> tuple[list[str], tuple[str, ...]]:
    """Megatron-LM flags for the plan's edits of the megatron profile's overlaps
    (``plan.profile_edits``; arguments.py at d98e8a64: --overlap-grad-reduce, with
    --overlap-param-gather under the distributed optimizer, which needs it; --tp-comm-overlap;
    --no-overlap-p2p-communication), and the edits they set."""
    edits = plan_edits(plan, "megatron")
    flags, wrote = [], []
    value = {k: e["value"] for k, e in edits.items()}
    if value.get("overlap_dp_grad_reduce") is True:
        flags.append("--overlap-grad-reduce")
        if w.zero_stage == 1:
            flags.append("--overlap-param-gather")
        wrote.append("overlap_dp_grad_reduce")
    if value.get("overlap_tp_comm") is True:
        # arguments.py asserts sequence parallelism for it; without it (or TP) the edit was
        # not costed either, so the file runs the estimate without the flag
        if w.tp > 1 and w.sequence_parallel:
            flags.append("--tp-comm-overlap")
        wrote.append("overlap_tp_comm")
    if "overlap_pp_p2p" in value and not value["overlap_pp_p2p"]:
        flags.append("--no-overlap-p2p-communication")
        wrote.append("overlap_pp_p2p")
    return flags, tuple(wrote)


def pipeline_layout(blocks: tuple[int, ...], mtp: int = 0) -> str:
    """Megatron-LM's layout string for decoder blocks per pipeline chunk in model order
    (``pp x virtual_stages`` entries): ``E`` the embedding, ``t`` a decoder layer, ``m`` a
    multi-token-prediction layer (the model's last ``mtp`` blocks), ``L`` the loss, ``|`` between
    chunks, ``t*n`` for n layers; e.g. (11, 12, 12, 11) -> ``Et*11|t*12|t*12|t*11L``, and with
    ``mtp=1`` ``Et*11|t*12|t*12|t*10mL``. Megatron-Core checks the ``t`` count against
    ``--num-layers`` and the ``m`` count against ``--mtp-num-layers``, MTP after every decoder
    layer (megatron/core/transformer/pipeline_parallel_layer_layout.py
    ``validate_layer_layout``).
    """
    parts = []
    left = sum(blocks) - mtp    # decoder layers not yet placed
    for n in blocks:
        t = max(0, min(n, left))
        left -= t
        parts.append((f"t*{t}" if t else "") + "m" * (n - t))
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "L"
    return "|".join(parts)


def _megatron_recompute(plan, warn: list[str]) -> tuple[list[str], str | tuple[str, ...]]:
    """(flags, the recompute written in autopar's terms: a mode or one mode per block)."""
    modes = block_modes(plan)
    if "selective-op" in modes:
        # no op-level SAC in Megatron-LM: full recompute keeps less (never more memory)
        warn.append("recompute 'selective-op' (torchtitan's op-level checkpointing): Megatron-LM "
                    "has no op-level policy (--recompute-granularity full | selective); used full")
        modes = tuple("full" if m == "selective-op" else m for m in modes)
        if len(set(modes)) == 1:
            return (["--recompute-granularity", "full", "--recompute-method", "uniform",
                     "--recompute-num-layers", "1"], "full")
    # Megatron-Core's submodules of a selective block (transformer_config.py recompute_modules;
    # --recompute-modules, nargs "+" from that field: megatron/training/argument_utils.py):
    # written only when not the default core_attn
    selective = ["--recompute-granularity", "selective"]
    if plan.config.recompute_modules is not None:
        selective += ["--recompute-modules", *plan.config.recompute_modules]
    if len(set(modes)) == 1:
        mode = modes[0]
        return ({"none": [], "selective": selective,
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
    if n_full == 0:
        # a mix of selective and none: Megatron's selective applies to every layer
        warn.append(f"per-block recompute ({per_block_text(modes)}): Megatron-LM has no per-layer "
                    "choice of selective recompute; used selective recompute on every layer")
        return selective, "selective"
    warn.append(f"per-block recompute ({per_block_text(modes)}): Megatron recomputes the "
                "first N layers of every "
                f"stage; used full recompute of the first {n_full} layers per stage"
                + (", selective blocks not recomputed" if "selective" in modes else ""))
    written = first_n_modes(tuple(blocks), n_full)
    return (["--recompute-granularity", "full", "--recompute-method", "block",
             "--recompute-num-layers", str(n_full)], written)


def _megatron_model(m: dict, t, dispatcher: str = "alltoall") -> list[str]:
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
    elif m.get("mlp") == "squared-relu":
        a.append("--squared-relu")
    if m.get("position") == "rope":
        a += ["--position-embedding-type", "rope", "--rotary-base",
              str(int(m.get("rope_theta", 10000)))]
    if m.get("bias") is False:
        a.append("--disable-bias-linear")
    if m.get("tied_embeddings") is False:
        a.append("--untie-embeddings-and-output-weights")
    return a + _megatron_moe_model(m, dispatcher)


def _megatron_moe_model(m: dict, dispatcher: str = "alltoall") -> list[str]:
    """The expert and attention-variant flags of an autopar ``ModelConfig`` dict (arguments.py's
    MoE and MLA groups), with the plan's token ``dispatcher``. The MoE layer pattern is written as the list expression
    ``--moe-layer-freq`` takes, since an integer N there makes layer 0 MoE (``i % N == 0``)
    where autopar's (and transformers') rule makes layer N-1 the first."""
    a: list[str] = []
    if m.get("kv_channels"):
        a += ["--kv-channels", str(m["kv_channels"])]
    if m.get("qk_norm"):
        a.append("--qk-layernorm")
    if m.get("kv_lora_rank"):
        a += ["--multi-latent-attention", "--kv-lora-rank", str(m["kv_lora_rank"]),
              "--qk-head-dim", str(m["qk_nope_head_dim"]), "--qk-pos-emb-head-dim",
              str(m["qk_rope_head_dim"]), "--v-head-dim", str(m["v_head_dim"])]
        if m.get("q_lora_rank"):
            a += ["--q-lora-rank", str(m["q_lora_rank"])]
    if m.get("mtp_layers"):
        a += ["--mtp-num-layers", str(m["mtp_layers"])]
    if not m.get("num_experts"):
        return a
    first, every = m.get("first_dense_layers", 0), m.get("moe_layer_interval", 1)
    layers = m["num_layers"]
    pattern = [int(i >= first and (i + 1) % every == 0) for i in range(layers)]
    runs: list[list[int]] = []
    for bit in pattern:
        if runs and runs[-1][0] == bit:
            runs[-1][1] += 1
        else:
            runs.append([bit, 1])
    # the plan's dispatcher, as autopar priced it (autopar.cost.dispatch): alltoall, allgather
    # (Megatron's default, written all the same), or DeepEP through the flex dispatcher
    # (transformer_config.py moe_token_dispatcher_type 'flex', moe_flex_dispatcher_backend
    # 'deepep'). Grouped GEMM: the expert kernel autopar prices (one GEMM per local expert set)
    flags = (["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
             if dispatcher == "deepep" else ["--moe-token-dispatcher-type", dispatcher])
    a += ["--num-experts", str(m["num_experts"]), "--moe-router-topk", str(m["top_k"]),
          "--moe-ffn-hidden-size", str(m["moe_ffn_hidden_size"]),
          "--moe-layer-freq", "+".join(f"[{bit}]*{n}" for bit, n in runs),
          *flags, "--moe-grouped-gemm"]
    if m.get("shared_expert_ffn_hidden_size"):
        a += ["--moe-shared-expert-intermediate-size", str(m["shared_expert_ffn_hidden_size"])]
    return a + _megatron_router(m)


def _megatron_router(m: dict) -> list[str]:
    """The router flags of an autopar ``ModelConfig`` dict that differ from Megatron-Core's
    defaults (:data:`autopar.models.config.ROUTER_DEFAULTS`; arguments.py
    --moe-router-score-function, --moe-router-load-balancing-type, --moe-aux-loss-coeff,
    --moe-router-enable-expert-bias, --moe-z-loss-coeff)."""
    a: list[str] = []
    if m.get("router_score_function", "softmax") != "softmax":
        a += ["--moe-router-score-function", m["router_score_function"]]
    if m.get("router_load_balancing", "aux_loss") != "aux_loss":
        a += ["--moe-router-load-balancing-type", m["router_load_balancing"]]
    if m.get("router_aux_loss_coeff"):
        a += ["--moe-aux-loss-coeff", repr(float(m["router_aux_loss_coeff"]))]
    if m.get("router_expert_bias"):
        a.append("--moe-router-enable-expert-bias")
    if m.get("router_z_loss_coeff") is not None:
        a += ["--moe-z-loss-coeff", repr(float(m["router_z_loss_coeff"]))]
    return a
