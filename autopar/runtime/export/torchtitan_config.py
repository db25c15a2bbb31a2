"""A torchtitan >= 0.3 job for a plan: a Python config file (torchtitan 0.3 replaced TOML job
files with ``Trainer.Config`` dataclasses returned by a function that ``--module`` and
``--config`` name: pytorch/torchtitan #2386, ``torchtitan/config/manager.py``).

The file starts from torchtitan's own registry function for the model (e.g.
``torchtitan.models.llama3.config_registry.llama3_8b``: its dataset, optimizer and step count)
and sets what the plan decides, one ``config.<section>.<field> = value`` per line, so
:func:`autopar.io.titan_config.from_torchtitan_config` reads it back without running it. Names
follow torchtitan 0.3.0 (``config/configs.py`` ParallelismConfig, TrainingConfig,
CompileConfig; ``trainer.py`` Trainer.Config; ``distributed/activation_checkpoint.py``).
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import UnsupportedPlanError
from .common import (Export, block_modes, finish, one_reshard_policy, own_rounds, rank_order,
                     torchrun_command)
from .torchtitan import (TITAN_LLAMA3_FLAVORS, TITAN_SCHEDULES, fqns_per_part, titan_ac,
                         titan_batch_check, titan_data_parallel, titan_offload, titan_refuses,
                         titan_router, without_mtp)

#: The framework profile the file is re-estimated under (:mod:`autopar.frameworks.stacks`).
FRAMEWORK = "torchtitan-0.3"
#: The function a file defines (its ``--config``).
CONFIG_FUNCTION = "autopar_plan"

#: torchtitan 0.3.0 models/llama3/config_registry.py: flavor -> the function that trains it.
TITAN3_LLAMA3_BASES = {"8B": "llama3_8b", "70B": "llama3_70b", "405B": "llama3_405b"}

#: autopar presets with a torchtitan 0.3.0 flavor of another model: preset -> (torchtitan
#: model, flavor). Sources: models/qwen3/__init__.py (``qwen3_configs``),
#: models/deepseek_v3/__init__.py (``deepseekv3_configs``).
TITAN3_PRESETS = {"qwen3-30b-a3b": ("qwen3", "30B-A3B"), "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
                  "deepseek-v2": ("deepseek_v3", "236B"), "deepseek-v3": ("deepseek_v3", "671B")}

#: The registry function a MoE model's file starts from (its MoE trainer settings) when its
#: flavor has none of its own: models/qwen3/config_registry.py ``qwen3_30b_a3b``,
#: models/deepseek_v3/config_registry.py ``deepseek_v3_16b``.
TITAN3_MOE_BASES = {"qwen3": "qwen3_30b_a3b", "deepseek_v3": "deepseek_v3_16b"}

#: MoE flavors with a registry function of their own in torchtitan 0.3.0: (model, flavor) ->
#: function (models/deepseek_v3/config_registry.py ``deepseek_v3_671b``, ``deepseek_v3_16b``;
#: models/qwen3/config_registry.py ``qwen3_30b_a3b``; there is none for 236B or 235B-A22B).
TITAN3_OWN_BASES = {("deepseek_v3", "671B"): "deepseek_v3_671b",
                    ("deepseek_v3", "16B"): "deepseek_v3_16b",
                    ("qwen3", "30B-A3B"): "qwen3_30b_a3b"}

#: What the file keeps from the registry function it starts from, and what it sets itself.
_BASE_KEPT = ("dataloader, optimizer, lr_scheduler, training.steps, checkpoint and "
              "hf_assets_path (the tokenizer)")
_BASE_SET = ("model_spec, the loss, parallelism, training batch/sequence/precision, "
             "activation_checkpoint and compile")

#: autopar's dispatchers -> torchtitan 0.3's ``moe_comm_backend``
#: (models/common/config_utils.py make_token_dispatcher_config: standard, deepep, hybridep,
#: minimal_async_ep).
TITAN3_DISPATCHERS = {"alltoall": "standard", "deepep": "deepep"}


def to_torchtitan_config(plan) -> Export:
    """A torchtitan >= 0.3 Python config for ``plan`` (its text is the ``value``; save it as
    ``NAME.py`` and run ``torchrun ... -m torchtitan.train --module NAME --config
    autopar_plan`` from its folder).

    What 0.3 runs differently from v0.2.2 (:func:`autopar.runtime.to_torchtitan_toml`), each
    said in a warning and re-estimated: experts are never tensor-parallel (#3167: the sparse
    mesh is pp x dp_replicate x efsdp x ep, ``distributed/parallel_dims.py``), so a plan with
    expert TP > 1 is written with expert TP 1; context parallelism all-gathers K/V (the
    ``flex`` attention llama3 uses, ``distributed/context_parallel/api.py``), so ring and
    Ulysses are written as all-gather; recompute is one policy for all blocks (no every-N-th
    option); fp8 is the Float8 model converter; CUDA graphs are disabled where torchtitan
    refuses them (pipelining, expert-parallel dispatch). The file is re-estimated under the
    ``torchtitan-0.3`` profile, whose nearest runnable plan keeps these rules. Multi-token
    prediction is built (``num_mtp_layers``, ``MTPLoss``) where torchtitan runs it (deepseek_v3
    without pipeline or context parallelism) and left out otherwise, the stage cuts then
    listing the decoder layers only (:func:`_mtp_written`). The file starts from the flavor's
    own registry function (``deepseek_v3_671b`` for DeepSeek-V3) where torchtitan has one, and
    says in a comment which base it uses and what it overrides.

    Raises:
        UnsupportedPlanError: a GPT-style model, or a plan that drops MoE tokens at a capacity
            (torchtitan's MoE is dropless).
    """
    c, t = plan.config, plan.train
    if t.moe_capacity_factor is not None:
        raise UnsupportedPlanError(
            f"moe_capacity_factor={t.moe_capacity_factor}: torchtitan's MoE is dropless (no "
            "capacity factor in its token dispatchers), so the plan's token dropping cannot be "
            "written. Fix: plan with moe_capacity_factor=None, or export for Megatron-LM.")
    m = plan.model_config or {}
    titan_refuses(plan, m)
    warn: list[str] = []
    w = own_rounds(c, "torchtitan", warn).replace(placement=rank_order(c, "torchtitan", warn)[1])
    w = one_reshard_policy(c, w, FRAMEWORK, warn)
    par: dict = {"tensor_parallel_degree": c.tp, "enable_sequence_parallel": True,
                 "pipeline_parallel_degree": c.pp, "context_parallel_degree": c.cp,
                 "expert_parallel_degree": c.ep}
    if (c.ep > 1 or (plan.model_config or {}).get("num_experts")) and c.etp != 1:
        warn.append(f"expert_tp={c.etp}: torchtitan 0.3 has no expert tensor parallelism "
                    "(#3167; its experts are sharded over ep within dp_shard x cp x tp, "
                    "distributed/parallel_dims.py); written with expert TP 1")
        w = w.replace(expert_tp=1)
    if c.ep == 1 and c.dispatcher == "deepep":
        w = w.replace(dispatcher="alltoall")   # no MoE traffic to dispatch with ep = 1
    if c.cp > 1 and c.cp_mode != "allgather":
        warn.append(f"cp_mode={c.cp_mode}: torchtitan 0.3 context parallelism all-gathers K/V "
                    "(llama3's flex attention, distributed/context_parallel/api.py "
                    "flex_cp_allgather); written as allgather")
        w = w.replace(cp_mode="allgather")
    dp_keys, w = titan_data_parallel(c, w, warn)
    par.update(dp_keys)
    if c.tp > 1 and not c.sequence_parallel:
        warn.append("sequence_parallel off: written with parallelism.enable_sequence_parallel "
                    "on (autopar's torchtitan-0.3 profile runs TP with SP only)")
        w = w.replace(sequence_parallel=True)
    mbs = c.micro_batch_size or t.micro_batch_size or 1
    schedule = c.schedule or "1f1b"
    if c.pp > 1 and schedule == "dualpipe":
        warn.append("schedule dualpipe: torchtitan has no bidirectional DualPipe; written as "
                    "DualPipeV on the same ranks, which keeps one copy of the parameters")
        w, schedule = w.replace(schedule="dualpipev"), "dualpipev"
    par["pipeline_parallel_schedule"] = TITAN_SCHEDULES[schedule]
    par["pipeline_parallel_microbatch_size"] = mbs if c.pp > 1 else 1
    mtp = _mtp_written(plan, m, c, warn)
    cuts = without_mtp(c.stage_blocks, int(m.get("mtp_layers") or 0) - mtp)
    par["module_fqns_per_model_part"] = (fqns_per_part(cuts, head="lm_head")
                                         if c.pp > 1 and cuts else None)
    local = t.global_batch_size // c.dp if c.pp > 1 else mbs
    train = {"local_batch_size": local, "global_batch_size": t.global_batch_size,
             "seq_len": t.seq_len,
             "mixed_precision_param": "float32" if t.precision == "fp32" else "bfloat16",
             "mixed_precision_reduce": "float32"}
    warn += titan_batch_check(train, par, c.dp, mbs, t.global_batch_size)
    t_written = t
    if t.precision == "fp16":
        warn.append("precision fp16: torchtitan trains in bf16 (TrainingConfig."
                    "mixed_precision_param is bfloat16 or float32); used bf16")
        t_written = replace(t, precision="bf16")
    offload, t_written = titan_offload(t_written, w, warn, "0.3")
    train["enable_cpu_offload"] = offload
    # trainer.py Trainer.Config._validate_cuda_graphs: CUDA graphs (on by default) refuse
    # pipelining and the all-to-all / DeepEP dispatchers, which synchronise with the host
    graphs_refused = c.pp > 1 or c.ep > 1
    train["disable_cuda_graphs"] = graphs_refused
    if not graphs_refused:
        warn.append("CUDA graphs: on (torchtitan 0.3's default, trainer.py wrap_with_cuda_graph); "
                    "autopar prices each kernel's launch, so a step bound by launches may run "
                    "faster than estimated")
    ac, modes = titan_ac(block_modes(plan), warn, every_nth=False)
    w = w.replace(recompute=modes[0])      # one policy for every block (no every-N-th option)
    compiled = (getattr(plan, "profile_edits", None) or {}).get("fusion", {}).get("value") \
        == "compile" and plan.train.framework in ("torchtitan", FRAMEWORK)
    if t.optimizer != "adamw":
        # same optimizer-state memory and step cost for Adam and AdamW; SGD keeps less
        warn.append(f"optimizer {t.optimizer}: not written; the file keeps the registry "
                    "function's AdamW (default_adamw, components/optimizer/optimizer.py)"
                    + ("; set its weight_decay to 0 for plain Adam" if t.optimizer == "adam"
                       else ""))
    model, needs = _model_lines(plan, m, w, t_written, compiled, warn, mtp)
    sets = [f"    config.{section}.{k} = {v!r}" for section, kv in
             (("parallelism", par), ("training", train)) for k, v in kv.items()]
    ac_line = {"none": "None", "full": "FullAC.Config()"}.get(ac["mode"], "SelectiveAC.Config()")
    run, _ = torchrun_command(plan, "-m", ("torchtitan.train", "--module", "NAME", "--config",
                                           CONFIG_FUNCTION))
    text = "\n".join([
        f'"""autopar plan for {_plain(plan.model)} on {_plain(plan.cluster)}, for torchtitan >= 0.3.',
        "",
        f"Save as NAME.py and run from its folder: PYTHONPATH=. {run}",
        '"""', "", *model["imports"],
        "from torchtitan.config import CompileConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        "", *model["defs"], "",
        f"def {CONFIG_FUNCTION}():",
        f"    config = config_registry.{model['base']}()",
        *model["base_note"],
        *model["body"], *sets,
        f"    config.activation_checkpoint = {ac_line}",
        f"    config.compile = CompileConfig(enable={compiled})",
        "    return config", ""])
    return finish(plan, text, warn, w, FRAMEWORK, train=t_written, needs=needs,
                  wrote_edits=("fusion",) if compiled else ())


def titan3_module(plan, m: dict) -> str:
    """The torchtitan 0.3 model (``llama3``, ``qwen3`` or ``deepseek_v3``) a plan's file names:
    a preset's (:data:`TITAN3_PRESETS`), else deepseek_v3 for latent attention, qwen3 for other
    experts or qk-norm, llama3 for a dense model."""
    if not (m.get("num_experts") or m.get("kv_lora_rank") or m.get("qk_norm")):
        return "llama3"
    return TITAN3_PRESETS.get(str(plan.model), ("deepseek_v3" if m.get("kv_lora_rank")
                                                 else "qwen3", None))[0]


def _mtp_written(plan, m: dict, c, warn: list[str]) -> int:
    """How many of the plan's multi-token-prediction (MTP) modules the file builds, the rest
    said in ``warn``. torchtitan 0.3.0 has MTP in deepseek_v3 only (model_registry(...,
    num_mtp_layers=N), models/deepseek_v3/mtp.py MTPDecoder with MTPLoss) and refuses it with
    pipeline or context parallelism (MTPDecoder.Config.update_from_config raises
    NotImplementedError 'MTP does not support pipeline parallelism yet' / '... context
    parallelism yet')."""
    n = int(m.get("mtp_layers") or 0)
    if not n:
        return 0
    name, module = str(plan.model), titan3_module(plan, m)
    if module == "deepseek_v3" and c.pp == 1 and c.cp == 1:
        return n
    why = (f"torchtitan 0.3's {module} model has none (MTP is in deepseek_v3 only)"
           if module != "deepseek_v3" else
           "torchtitan 0.3's deepseek_v3 has MTP (model_registry(num_mtp_layers=...)) but "
           "refuses it with " + ("pipeline" if c.pp > 1 else "context") + " parallelism "
           "(models/deepseek_v3/mtp.py MTPDecoder.Config.update_from_config: NotImplementedError)")
    cut = (" module_fqns_per_model_part lists the decoder layers only, so the last stage has "
           f"{n} block(s) fewer than planned;" if c.pp > 1 and c.stage_blocks else "")
    warn.append(f"model {name}: {n} multi-token-prediction module(s) planned; {why}, so the file "
                f"trains without them;{cut} the re-estimate still prices them as planned (an "
                "upper bound on time and memory)")
    return 0


def _model_lines(plan, m: dict, w, t, compiled: bool, warn: list[str],
                 mtp: int = 0) -> tuple[dict, str]:
    """(the file's model part: imports, definitions, the base registry function, a comment on
    what the file keeps from it, and the lines that set ``config.model_spec`` and the loss, what
    the user must add first); ``mtp``: MTP modules to build (deepseek_v3 only)."""
    name = str(plan.model)
    moe = bool(m.get("num_experts") or m.get("kv_lora_rank") or m.get("qk_norm"))
    converters = ""
    if t.precision == "fp8":
        # components/quantization/float8.py Float8LinearConverter (torchao; SM89 or later)
        converters = (", converters=[Float8LinearConverter.Config(filter_fqns=['lm_head'], "
                      f"model_compile_enabled={compiled})]")
    imports = (["from torchtitan.components.quantization import Float8LinearConverter"]
               if converters else [])
    imports.append("from torchtitan.models.common.config_utils import decoder_vocab_size")
    defs: list[str] = []
    needs = ""
    if moe:
        titan_router(plan, m, warn)
        module, flavor = TITAN3_PRESETS.get(name, ("deepseek_v3" if m.get("kv_lora_rank")
                                                   else "qwen3", name))
        base = TITAN3_OWN_BASES.get((module, flavor), TITAN3_MOE_BASES[module])
        if name not in TITAN3_PRESETS:
            needs = f"the flavor {flavor!r} is added"
            warn.append(f"model {name}: no torchtitan 0.3 flavor has its shape; written as "
                        f"torchtitan's {module} model with flavor {flavor!r}, which stops at "
                        f"load until you register it in torchtitan/models/{module}/__init__.py "
                        "with the plan's sizes")
        backend = TITAN3_DISPATCHERS[w.dispatcher]
        extra = f", num_mtp_layers={mtp}" if mtp else ""
        spec = f"model_registry({flavor!r}, moe_comm_backend={backend!r}{extra}{converters})"
    else:
        module = "llama3"
        shape = (m.get("num_layers"), m.get("hidden_size"), m.get("num_heads"),
                 m.get("num_kv_heads") or m.get("num_heads"), m.get("ffn_hidden_size"),
                 m.get("vocab_size"), float(m.get("rope_theta", 10000.0)))
        flavor = next((f for f, s in TITAN_LLAMA3_FLAVORS.items() if s == shape), None)
        if flavor is None and not m:
            flavor = name
            needs = f"the flavor {flavor!r} is added"
            warn.append(f"model {name}: the plan has no model_config, so no torchtitan flavor "
                        f"can be written for it; flavor {name!r} written, which stops at load "
                        "until you add it to torchtitan.models.llama3.llama3_configs")
        elif flavor is None:
            flavor = name
            defs = _llama3_flavor(name, shape, plan.train.seq_len, m, warn)
            imports += ["from torchtitan.models.common import ComplexRoPE, Embedding, Linear, "
                        "RMSNorm",
                        "from torchtitan.models.llama3 import (Llama3Model, _EMBEDDING_INIT, "
                        "_NORM_INIT, _build_llama3_layers,",
                        "                                      _output_linear_init, "
                        "llama3_configs)"]
        base = TITAN3_LLAMA3_BASES.get(flavor, "llama3_8b")
        spec = f"model_registry({flavor!r}{converters})"
        own = flavor in TITAN3_LLAMA3_BASES
    if moe:
        own = (module, flavor) in TITAN3_OWN_BASES
    imports.insert(0, f"from torchtitan.models.{module} import config_registry, model_registry")
    body = [f"    config.model_spec = {spec}"]
    if mtp:
        # models/deepseek_v3/config_registry.py deepseek_v3_debugmodel_mtp: MTP needs MTPLoss
        imports.append("from torchtitan.models.deepseek_v3.mtp import MTPLoss")
        body.append("    config.loss = MTPLoss.Config("
                    "global_vocab_size=decoder_vocab_size(config.model_spec))")
        warn.append(f"model {name}: {mtp} multi-token-prediction module(s) written "
                    f"(model_registry(num_mtp_layers={mtp}) with MTPLoss, its default "
                    "mtp_scale 0.3)")
    else:
        body.append("    config.loss.loss_fn.global_vocab_size = "
                    "decoder_vocab_size(config.model_spec)")
    if own:
        note = [f"    # {base}: the registry function of flavor {flavor!r}; kept from it: "
                f"{_BASE_KEPT}; set below: {_BASE_SET}"]
    else:
        note = [f"    # torchtitan 0.3.0 has no registry function for flavor {flavor!r}: {base} "
                f"is the base for its trainer settings only; kept from it: {_BASE_KEPT} (set "
                f"hf_assets_path to {name}'s tokenizer); set below: {_BASE_SET}"]
    return {"imports": imports, "defs": defs, "base": base, "body": body,
            "base_note": note}, needs


def _llama3_flavor(name: str, shape: tuple, seq_len: int, m: dict, warn: list[str]) -> list[str]:
    """Lines that register a llama3 flavor of ``shape`` as torchtitan 0.3.0 defines its own
    (models/llama3/__init__.py ``_8b``: the module's private builders, RoPE without Llama 3.1
    scaling)."""
    layers, dim, heads, kv, ffn, vocab, theta = shape
    if m.get("kv_channels") and m["kv_channels"] * heads != dim:
        warn.append(f"model {name}: head size {m['kv_channels']} is not hidden / heads; "
                    "torchtitan's llama3 uses hidden / heads")
    fn = "_" + "".join(ch if ch.isalnum() else "_" for ch in name)
    return [
        f"def {fn}(attn_backend, tp_gemm_backend='default'):",
        f"    # {name}, registered as torchtitan registers its own llama3 flavors",
        "    return Llama3Model.Config(",
        f"        dim={dim}, vocab_size={vocab},",
        f"        tok_embeddings=Embedding.Config(num_embeddings={vocab}, embedding_dim={dim},",
        "                                        param_init=_EMBEDDING_INIT),",
        f"        norm=RMSNorm.Config(normalized_shape={dim}, param_init=_NORM_INIT),",
        f"        lm_head=Linear.Config(in_features={dim}, out_features={vocab},",
        f"                              param_init=_output_linear_init({dim})),",
        "        layers=_build_llama3_layers(",
        f"            n_layers={layers}, dim={dim}, n_heads={heads}, n_kv_heads={kv}, "
        f"hidden_dim={ffn},",
        f"            rope=ComplexRoPE.Config(dim={dim // heads}, max_seq_len={seq_len}, "
        f"theta={theta!r}),",
        "            attn_backend=attn_backend, tp_gemm_backend=tp_gemm_backend))",
        "",
        "",
        f"llama3_configs[{name!r}] = {fn}",
        ""]


def _plain(x) -> str:
    """``x`` as text safe inside the file's docstring."""
    return str(x).replace("\\", "/").replace('"', "'")
