"""A DeepSpeed 0.19 config (``ds_config.json``, ``deepspeed/runtime/config.py``) for a plan."""

from __future__ import annotations

from dataclasses import replace

from ...frameworks import with_edits
from ...errors import AutoparError
from .common import (Export, balanced_cut, block_modes, finish, one_reshard_policy, own_rounds,
                     rank_order, strongest_mode, unwritten)
from ..verdict import per_block_text, plan_edits, plans_cost_model

def to_deepspeed_config(plan) -> Export:
    """A DeepSpeed config dict (``ds_config.json``) for ``plan``.

    Tensor parallelism maps to DeepSpeed's AutoTP (``tensor_parallel.autotp_size``); pipeline
    stages to the ``pipeline`` section, which a ``PipelineModule`` reads (partitioned by
    parameter count: DeepSpeed takes no explicit cut list; the cut it computes is estimated by
    :func:`parameter_cut` and re-estimated). Pipelines run ZeRO-1, one chunk per stage, 1F1B;
    CP ranks become data-parallel ranks; recompute is whole layers (under pipelining every
    layer, ``activation_checkpoint_interval`` 1, whatever the per-block plan). The written
    configuration is re-estimated (see :class:`Export`).

    An MoE capacity factor is set in the model code (``deepspeed.moe.layer.MoE(capacity_factor=
    ...)``), so the export warns that it is not written.
    """
    c, t = plan.config, plan.train
    warn: list[str] = []
    w = own_rounds(c, "deepspeed", warn).replace(placement=rank_order(c, "deepspeed", warn)[1])
    w = one_reshard_policy(c, w, "DeepSpeed", warn)
    mbs = c.micro_batch_size or t.micro_batch_size or 1
    cfg: dict = {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": t.global_batch_size // (mbs * c.dp),
        "zero_optimization": {"stage": c.zero_stage},
        "gradient_clipping": 1.0,
    }
    if c.zero_stage in (1, 2):
        # the overlap the re-estimate assumes (the deepspeed profile's: overlap_comm's default
        # for stages 1-2, deepspeed/runtime/zero/config.py overlap_comm_valid), not a faster
        # setting the estimate never priced; stage 3 keeps DeepSpeed's default (True), which
        # the profile's per-parameter gathers already describe
        cfg["zero_optimization"]["overlap_comm"] = _profile(plan).overlap_dp_grad_reduce
    if c.zero_stage == 2:
        cfg["zero_optimization"]["reduce_scatter"] = True
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
                    "(deepspeed.moe.layer.MoE(ep_size=...)), not in the JSON config; not set"
                    + ("" if t.moe_capacity_factor is not None else "; priced dropless, "
                       "MoE(drop_tokens=False), which pads every expert to the busiest one"))
    if t.moe_capacity_factor is not None:
        warn.append(f"moe_capacity_factor={t.moe_capacity_factor:g}: DeepSpeed sets it in the "
                    f"model code (deepspeed.moe.layer.MoE(capacity_factor="
                    f"{t.moe_capacity_factor:g}, drop_tokens=True)), not in the JSON config; "
                    "not set (every expert runs its padded capacity, as priced)")
    if c.folded:
        # deepspeed/utils/groups.py _create_expert_data_and_model_parallel: expert TP = TP,
        # expert-parallel groups inside the data-parallel group
        warn.append(f"expert_tp={c.etp} (MoE parallel folding): DeepSpeed's expert groups sit "
                    f"inside data parallelism with expert TP = tp; written with etp = tp={c.tp}")
        w = w.replace(expert_tp=None)
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
        balanced, how = parameter_cut(plan) if blocks else (None, "")
        # the plan's blocks per stage (an interleaved plan's chunks summed per stage)
        per_stage = tuple(sum(blocks[s::c.pp]) for s in range(c.pp)) if blocks else ()
        if blocks and balanced != per_stage:
            warn.append(f"stage cuts {blocks}: DeepSpeed's PipelineModule cannot take explicit "
                        f"cuts; used partition_method 'parameters', estimated as {balanced} "
                        f"({how})")
        if v > 1:
            warn.append(f"virtual_stages {v}: DeepSpeed has no interleaved schedule; used one "
                        "chunk per stage (1F1B)")
        if c.schedule not in (None, "1f1b", "interleaved-1f1b"):
            warn.append(f"schedule {c.schedule}: DeepSpeed's pipeline runs only its 1F1B-style "
                        "TrainSchedule (deepspeed/runtime/pipe/schedule.py)")
        w = w.replace(virtual_stages=1, schedule="1f1b", stage_blocks=balanced)
        if c.zero_stage >= 2:
            warn.append(f"zero_stage {c.zero_stage}: DeepSpeed pipeline parallelism supports "
                        "ZeRO-1 only; used stage 1")
            cfg["zero_optimization"] = {"stage": 1}
            w = w.replace(zero_stage=1)
    modes = block_modes(plan)
    if set(modes) != {"none"}:
        cfg["activation_checkpointing"] = {"partition_activations": False,
                                           "contiguous_memory_optimization": False}
        strongest = strongest_mode(modes)
        if c.pp > 1 and (len(set(modes)) > 1 or strongest != "full"):
            # pipe/module.py forward: with an interval N > 0 every run of N consecutive layers
            # is checkpointed where _is_checkpointable (by default: any layer with parameters);
            # the JSON has no per-layer choice (checkpointable_layers, by class name, is a
            # PipelineModule argument in the model code)
            warn.append(f"recompute ({per_block_text(modes)}): written as pipeline."
                        "activation_checkpoint_interval 1, with which DeepSpeed's PipelineModule "
                        "checkpoints every layer that has parameters (pipe/module.py forward, "
                        "_is_checkpointable), so all "
                        f"{len(modes)} blocks are recomputed whole: more recompute (and less "
                        "activation memory) than the plan's per-block choice; the re-estimate "
                        "prices full recompute on every block")
        elif len(set(modes)) > 1 or strongest in ("selective", "selective-op"):
            warn.append(f"recompute ({per_block_text(modes)}): DeepSpeed's activation "
                        "checkpointing recomputes "
                        "whole checkpointed layers (the model calls "
                        "deepspeed.checkpointing.checkpoint per block); checkpoint every block "
                        "marked full or selective")
        elif c.pp == 1:
            # the JSON section only configures the checkpointing the model code does
            warn.append("recompute full: the activation_checkpointing section only configures "
                        "DeepSpeed's checkpointing; the model must call "
                        "deepspeed.checkpointing.checkpoint around every block, or nothing is "
                        "recomputed and activation memory is far above the estimate")
        if c.pp > 1:
            cfg["pipeline"]["activation_checkpoint_interval"] = 1
            w = w.replace(recompute="full")   # the interval checkpoints every layer
        else:
            full = tuple("none" if x == "none" else "full" for x in modes)
            w = w.replace(recompute=full[0] if len(set(full)) == 1 else full)
    t_written = t if t.precision != "fp8" else replace(t, precision="bf16")
    if t.optimizer_offload:
        if c.zero_stage >= 1:
            # deepspeed/runtime/zero/config.py offload_optimizer (ZeRO-Offload, Ren et al. 2021)
            cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        else:
            warn.append("optimizer_offload: DeepSpeed offloads the optimizer under ZeRO 1-3 "
                        "only; not written at ZeRO-0")
            t_written = replace(t_written, optimizer_offload=False)
    if t.param_offload:
        if w.zero_stage == 3:
            # deepspeed/runtime/zero/offload_config.py offload_param: "Valid only with stage 3"
            cfg["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
        else:
            warn.append(f"param_offload: DeepSpeed offloads parameters under ZeRO-3 only "
                        f"(offload_param); not written at ZeRO-{w.zero_stage}")
            t_written = replace(t_written, param_offload=False)
    t_written = unwritten(t_written, "activation_offload", warn,
                          "activation_offload: not written (autopar prices torch's save_on_cpu; "
                          "DeepSpeed's activation_checkpointing.cpu_checkpointing offloads "
                          "partitioned checkpoints, which autopar does not price)")
    t_written = unwritten(t_written, "optimizer_state_dtype", warn,
                          f"optimizer_state_dtype {t.optimizer_state_dtype}: DeepSpeed's config "
                          "has no switch for the moments' dtype; used fp32")
    wrote = (("overlap_dp_grad_reduce",) if c.zero_stage in (1, 2)
             and "overlap_dp_grad_reduce" in plan_edits(plan, "deepspeed") else ())
    return finish(plan, cfg, warn, w, "deepspeed", comment="", train=t_written,
                  wrote_edits=wrote, framework_cut=c.pp > 1 and bool(c.stage_blocks))


def _profile(plan):
    """The deepspeed profile the plan was costed with (its edits applied)."""
    return with_edits("deepspeed", plan_edits(plan, "deepspeed"))


def partition_boundaries(weights: list[int], parts: int) -> list[int]:
    """The stage boundaries (``parts + 1`` layer indices, first 0, last ``len(weights)``) that
    DeepSpeed 0.19's ``partition_method='parameters'`` picks for per-layer parameter counts
    ``weights``: ``deepspeed/runtime/utils.py partition_balanced``, a dynamic programme over
    contiguous cuts that keeps, for the first i layers in j parts, the cut with the smallest
    (largest part - smallest part) given the best cut of the layers before it, a later cut
    winning a tie. With no more layers than parts each layer is its own part
    (``partition_uniform``).

    Raises:
        ValueError: ``parts`` < 1.
    """
    n = len(weights)
    if parts < 1:
        raise ValueError(f"parts={parts}: a pipeline has at least one stage")
    if n <= parts:
        return [min(p, n) for p in range(parts + 1)]
    inf = float("inf")
    prefix = [0]
    for x in weights:
        prefix.append(prefix[-1] + x)
    # best[i][j] = (cost, largest part, smallest part, where the last part starts)
    best = [[(inf, inf, inf, 0)] * (parts + 1) for _ in range(n + 1)]
    best[0][0] = (0, 0, inf, 0)
    for i in range(1, n + 1):
        for j in range(1, min(i, parts) + 1):
            pick = best[i][j]
            for k in range(i):
                last = prefix[i] - prefix[k]
                hi, lo = max(best[k][j - 1][1], last), min(best[k][j - 1][2], last)
                if hi - lo <= pick[0]:
                    pick = (hi - lo, hi, lo, k)
            best[i][j] = pick
    cuts = [n]
    for j in range(parts, 0, -1):
        cuts.append(best[cuts[-1]][j][3])
    return cuts[::-1]


def parameter_cut(plan) -> tuple[tuple[int, ...], str]:
    """(decoder blocks per stage under DeepSpeed's ``partition_method='parameters'``, how it was
    estimated). The PipelineModule is taken to hold one layer per graph layer: the embedding,
    each block, the head with the final norm; each weighs its parameters as DeepSpeed counts them
    (``_count_layer_params`` builds each layer: a ``deepspeed.moe.layer.MoE`` holds
    num_experts / ep_size local experts). Where the model cannot be rebuilt, or a stage would
    hold no block, the cut with equal block counts is used and said."""
    c = plan.config
    blocks = tuple(c.stage_blocks)
    try:
        layers = plans_cost_model(plan, plan.train).graph.layers
    except AutoparError:
        layers = None
    if layers is None or sum(1 for x in layers if x.kind == "block") != sum(blocks):
        return (balanced_cut(sum(blocks), c.pp),
                "equal block counts: the model's layers could not be rebuilt to weigh them")
    ep = max(1, c.ep)
    weights = [x.num_parameters - x.expert_parameters + x.expert_parameters // ep
               for x in layers]
    bounds = partition_boundaries(weights, c.pp)
    cut = tuple(sum(1 for x in layers[a:b] if x.kind == "block")
                for a, b in zip(bounds, bounds[1:]))
    if min(cut) == 0:
        return (balanced_cut(sum(blocks), c.pp),
                "equal block counts: DeepSpeed's parameter balance would leave a stage "
                "without a decoder block, which autopar does not price; use partition "
                "'uniform' or 'type:...' in the PipelineModule")
    return cut, ("DeepSpeed's partition_balanced over each layer's parameter count: the "
                 "embedding, one layer per block" + (f" with 1/{ep} of the experts (MoE(ep_size="
                                                     f"{ep}) builds only its local ones)"
                                                     if c.ep > 1 else "")
                 + ", the head; deepspeed/runtime/pipe/module.py _partition_layers")
