"""Read Megatron-LM command-line arguments into autopar's terms (:func:`from_megatron_args`).

It returns an :class:`~autopar.io.imported.Imported`: the :class:`~autopar.config.ParallelConfig`
fields, the :class:`~autopar.config.TrainingConfig` fields they set, and notes on what was
approximated or ignored. Nothing is executed; unknown flags are listed in ``notes``, never an
error.

Mappings (Megatron-LM's own ``arguments.py``):

======================================================  =======================================
Megatron-LM                                              autopar
======================================================  =======================================
``--tensor-model-parallel-size``                         ``tp``
``--pipeline-model-parallel-size``                       ``pp``
``--context-parallel-size``                              ``cp``
``--cp-comm-type p2p|a2a|all_gather`` (one for all)      ``cp_mode`` ring / ulysses / allgather
``--sequence-parallel``                                  ``sequence_parallel``
``--recompute-granularity full|selective``               ``recompute``
``--recompute-activations``                              ``recompute="selective"``
``--recompute-modules`` (with selective)                 ``recompute_modules``
``--recompute-method block --recompute-num-layers N``    full on the first N blocks of each chunk
``--use-distributed-optimizer``                          ``zero_stage=1``
``--use-torch-fsdp2``                                    ``zero_stage=3``
``--micro-batch-size`` / ``--global-batch-size``         micro-batch / global batch
``--num-layers-per-virtual-pipeline-stage N``            ``virtual_stages = layers / (pp N)``
``--num-virtual-stages-per-pipeline-rank``               ``virtual_stages``
``--virtual-pipeline-model-parallel-size`` (older name)  ``virtual_stages``
``--decoder-first/last-pipeline-num-layers``             ``stage_blocks`` as Megatron splits
``--account-for-embedding/loss-in-pipeline-split``       ``stage_blocks`` as Megatron splits
``--pipeline-model-parallel-layout``                     ``stage_blocks``, ``virtual_stages``
``--microbatch-group-size-per-virtual-pipeline-stage``   ``vp_group`` (with virtual stages)
``--seq-length``                                         ``seq_len``
``--hidden-size``, ``--num-attention-heads``, ...         checked against the model (model_shape)
``--expert-model-parallel-size``                         ``ep``
``--expert-tensor-parallel-size``                        ``expert_tp`` (MoE parallel folding)
``--bf16`` / ``--fp16`` / ``--fp8-format``               precision
``--moe-expert-capacity-factor``                         ``moe_capacity_factor``
``--moe-pad-expert-input-to-capacity``                   ``moe_pad_to_capacity``
``--moe-router-score-function``                          model ``router_score_function``
``--moe-router-load-balancing-type``                     model ``router_load_balancing``
``--moe-aux-loss-coeff``                                 model ``router_aux_loss_coeff``
``--moe-router-enable-expert-bias``                      model ``router_expert_bias``
``--moe-z-loss-coeff``                                   model ``router_z_loss_coeff``
======================================================  =======================================

Megatron-LM refuses layer counts its pipeline cannot split (e.g. 46 layers on pp=4 without
uneven-stage flags); the importer refuses them too, with the layers of ``--num-layers`` when given
and with the model's in :meth:`Imported.complete`
(:meth:`~autopar.frameworks.layersplit.MegatronLayerSplit.chunks`).
"""

from __future__ import annotations

import argparse
import difflib
import shlex

from ..errors import InvalidParallelConfig
from ..frameworks.layersplit import MegatronLayerSplit, layout_chunks
from ..models.config import ROUTER_LOAD_BALANCING, ROUTER_SCORE_FUNCTIONS
from .imported import Imported, refusal

#: Megatron-Core cp_comm_type -> autopar's cp_mode (transformer_config.py: "p2p", "all_gather",
#: "a2a" or "a2a+p2p", per layer).
CP_MODES = {"p2p": "ring", "a2a": "ulysses", "all_gather": "allgather"}


class _Parser(argparse.ArgumentParser):
    """argparse that raises our error instead of exiting."""

    def error(self, message):  # noqa: D401 - argparse hook
        raise InvalidParallelConfig(f"cannot read the Megatron-LM arguments: {message}. Fix: "
                                    "give them as Megatron-LM's command line takes them, e.g. "
                                    "\"--tensor-model-parallel-size 4 --sequence-parallel\".")


#: Megatron-LM's model-shape flags -> the autopar.models.ModelConfig field each must match
#: (checked against the model estimated, as --num-layers is; --num-query-groups only with
#: --group-query-attention, arguments.py).
_SHAPE_FLAGS = {"hidden-size": "hidden_size", "num-attention-heads": "num_heads",
                "ffn-hidden-size": "ffn_hidden_size", "num-query-groups": "num_kv_heads",
                "vocab-size": "vocab_size"}


def _megatron_parser() -> argparse.ArgumentParser:
    p = _Parser(add_help=False, allow_abbrev=False)
    for name in ("tensor-model-parallel-size", "pipeline-model-parallel-size",
                 "context-parallel-size", "micro-batch-size", "global-batch-size", "seq-length",
                 "num-layers-per-virtual-pipeline-stage", "virtual-pipeline-model-parallel-size",
                 "num-virtual-stages-per-pipeline-rank", "decoder-first-pipeline-num-layers",
                 "decoder-last-pipeline-num-layers",
                 "num-layers", "recompute-num-layers", "expert-model-parallel-size",
                 "expert-tensor-parallel-size", "data-parallel-size",
                 "microbatch-group-size-per-virtual-pipeline-stage", *_SHAPE_FLAGS):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--group-query-attention", action="store_true")
    p.add_argument("--pipeline-model-parallel-layout", default=None)
    # arguments.py: one value, or one per layer (transformer_config.py cp_comm_type)
    p.add_argument("--cp-comm-type", nargs="+", default=None)
    for name in ("sequence-parallel", "recompute-activations", "use-distributed-optimizer",
                 "use-torch-fsdp2", "bf16", "fp16", "use-flash-attn", "overlap-grad-reduce",
                 "overlap-param-gather", "tp-comm-overlap", "no-overlap-p2p-communication",
                 "overlap-p2p-communication", "account-for-embedding-in-pipeline-split",
                 "account-for-loss-in-pipeline-split"):
        p.add_argument(f"--{name}", action="store_true")
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--recompute-method", choices=["uniform", "block"], default=None)
    p.add_argument("--recompute-modules", nargs="+", default=None)
    p.add_argument("--fp8-format", default=None)
    p.add_argument("--moe-token-dispatcher-type", default=None)
    p.add_argument("--moe-flex-dispatcher-backend", default=None)
    p.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    p.add_argument("--moe-pad-expert-input-to-capacity", action="store_true")
    # router settings (Megatron-Core transformer_config.py moe_router_*; lists as arguments.py
    # takes them, one value per load-balancing type)
    p.add_argument("--moe-router-score-function", default=None)
    p.add_argument("--moe-router-load-balancing-type", nargs="+", default=None)
    p.add_argument("--moe-aux-loss-coeff", type=float, nargs="+", default=None)
    p.add_argument("--moe-router-enable-expert-bias", action="store_true")
    p.add_argument("--moe-z-loss-coeff", type=float, default=None)
    return p


def cp_mode(kinds) -> str:
    """autopar's ``cp_mode`` for Megatron-Core's ``cp_comm_type`` (one name, or one per layer).

    Raises:
        InvalidParallelConfig: a2a+p2p (hierarchical, not modelled), an unknown name, or layers
            that differ (one mode per plan).
    """
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    bad = next((k for k in kinds if k not in CP_MODES), None)
    if bad is not None:
        raise refusal(f"Megatron-Core: cp_comm_type {bad!r} is not one of {', '.join(CP_MODES)} "
                      "(a2a+p2p, hierarchical, is not modelled)", "use p2p, a2a or all_gather")
    if len(set(kinds)) > 1:
        raise refusal(f"Megatron-Core: cp_comm_type differs by layer ({', '.join(sorted(set(kinds)))}"
                      "); autopar prices one context-parallel mode per plan",
                      "give one cp_comm_type for every layer")
    return CP_MODES[kinds[0]]


def from_megatron_args(text: str | list[str]) -> Imported:
    """Read Megatron-LM command-line arguments (a string as on the command line, or a list).

    Args:
        text: e.g. ``"--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2
            --sequence-parallel --recompute-granularity full --use-distributed-optimizer
            --micro-batch-size 1 --global-batch-size 1024 --seq-length 4096"``.

    Returns:
        :class:`Imported`; flags autopar does not model are named in ``notes``.

    Raises:
        InvalidParallelConfig: unbalanced quotes, a value that is not a number, or (with
            ``--num-layers``) a layer count Megatron-LM cannot split over the pipeline as the
            flags ask (:meth:`MegatronLayerSplit.chunks`).
    """
    try:
        argv = shlex.split(text) if isinstance(text, str) else list(text)
    except ValueError as exc:
        raise InvalidParallelConfig(f"cannot split the Megatron-LM arguments: {exc}.") from exc
    ns, unknown = _megatron_parser().parse_known_args(argv)
    par: dict = {}
    train: dict = {}
    notes: list[str] = []
    first_n = None
    for src, dst in (("tensor_model_parallel_size", "tp"), ("pipeline_model_parallel_size", "pp"),
                     ("context_parallel_size", "cp")):
        if getattr(ns, src) is not None:
            par[dst] = getattr(ns, src)
    if ns.data_parallel_size is not None:
        par["dp"] = ns.data_parallel_size
    if ns.cp_comm_type and (ns.context_parallel_size or 1) > 1:
        par["cp_mode"] = cp_mode(ns.cp_comm_type)
    if ns.sequence_parallel:
        par["sequence_parallel"] = True
    if ns.recompute_granularity:
        par["recompute"] = ns.recompute_granularity
        if ns.recompute_granularity == "selective" and ns.recompute_modules:
            # Megatron-Core's checkpointed submodules (autopar.cost.selective); a name autopar
            # does not price is refused by ParallelConfig
            par["recompute_modules"] = tuple(ns.recompute_modules)
        if (ns.recompute_granularity == "full" and ns.recompute_method == "block"
                and ns.recompute_num_layers is not None):
            # the first N layers of every pipeline chunk, applied per block in
            # Imported.complete once the chunks are known
            first_n = ns.recompute_num_layers
        elif ns.recompute_granularity == "full" and (ns.recompute_num_layers or 1) > 1:
            notes.append(f"--recompute-method uniform --recompute-num-layers "
                         f"{ns.recompute_num_layers} (groups of layers checkpointed together) "
                         "is modelled as full recomputation of every block: the same "
                         "recompute time, more memory than the groups keep.")
    elif ns.recompute_activations:
        par["recompute"] = "selective"
    if ns.use_distributed_optimizer:
        par["zero_stage"] = 1
    if ns.use_torch_fsdp2:  # arguments.py: Megatron-Core's torch FSDP2 path (fully_shard)
        par["zero_stage"] = 3
    if ns.micro_batch_size is not None:
        par["micro_batch_size"] = ns.micro_batch_size
        train["micro_batch_size"] = ns.micro_batch_size
    if ns.global_batch_size is not None:
        train["global_batch_size"] = ns.global_batch_size
    if ns.seq_length is not None:
        train["seq_len"] = ns.seq_length
    split = _megatron_split(ns, notes)
    shape = {field: getattr(ns, flag.replace("-", "_")) for flag, field in _SHAPE_FLAGS.items()
             if getattr(ns, flag.replace("-", "_")) is not None}
    if not ns.group_query_attention:
        shape.pop("num_kv_heads", None)   # Megatron-LM reads it only with GQA on
    if ns.num_layers is not None:
        # Megatron-LM refuses these arguments as given: so does the import
        pp = par.get("pp", 1)
        chunks = split.chunks(ns.num_layers, pp)
        if split.sets_virtual_stages:
            par["virtual_stages"] = len(chunks) // pp
        if len(set(chunks)) > 1:
            par["stage_blocks"] = chunks
    elif split.virtual_stages is not None:
        par["virtual_stages"] = split.virtual_stages
    elif split.layers_per_virtual_stage is not None:
        notes.append("--num-layers-per-virtual-pipeline-stage needs --num-layers to give the "
                     "virtual stage count; the model's block count is used instead.")
    group = ns.microbatch_group_size_per_virtual_pipeline_stage
    if group is not None:
        if (par.get("virtual_stages") or 1) > 1 or split.layers_per_virtual_stage is not None:
            # interleaved 1F1B's micro-batch group (model_parallel_config.py
            # microbatch_group_size_per_vp_stage)
            par["vp_group"] = group
        else:
            notes.append(f"--microbatch-group-size-per-virtual-pipeline-stage {group} is "
                         "ignored: without virtual pipeline stages Megatron-LM runs 1F1B, "
                         "which has no micro-batch groups.")
    if ns.fp8_format:
        train["precision"] = "fp8"
    elif ns.fp16:
        train["precision"] = "fp16"
    elif ns.bf16:
        train["precision"] = "bf16"
    if ns.expert_model_parallel_size is not None:
        par["ep"] = ns.expert_model_parallel_size
    if ns.expert_tensor_parallel_size is not None:
        # None when equal to tp (ParallelConfig stores that mapping one way)
        par["expert_tp"] = ns.expert_tensor_parallel_size
    if (ns.expert_model_parallel_size or 1) > 1:
        par["dispatcher"] = _megatron_dispatcher(ns, notes)
    if ns.moe_expert_capacity_factor is not None and ns.moe_expert_capacity_factor >= 0:
        # transformer_config.py: a negative factor means None (dropless)
        train["moe_capacity_factor"] = ns.moe_expert_capacity_factor
        train["moe_pad_to_capacity"] = ns.moe_pad_expert_input_to_capacity
    costs, sources = _megatron_overlaps(ns, par, notes)
    model_fields = _megatron_router(ns, notes)
    flags = [u for u in unknown if u.startswith("--")]
    if flags:
        # a flag one letter or two off one the import reads is likely that flag misspelt (a
        # Megatron-LM flag autopar does not read is ignored as well, so it is not refused)
        known = list(_megatron_parser()._option_string_actions)
        said = [f"{f} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(
            f.split("=")[0], known, n=1, cutoff=0.9)) else f for f in flags]
        notes.append("ignored (not a parallelism or batch setting autopar models): "
                     + " ".join(said))
    # a word that is neither a flag nor the value after an unknown flag is a typo (a flag
    # written without its "--"), which Megatron-LM itself refuses: say so, with the flag meant
    stray = [u for i, u in enumerate(unknown)
             if not u.startswith("-") and (i == 0 or not unknown[i - 1].startswith("--"))]
    if stray:
        known = _megatron_parser()._option_string_actions   # argparse keeps its flags here
        meant = [f"--{w}" for w in stray if f"--{w}" in known]
        notes.append("ignored, not a flag (Megatron-LM flags start with --; it would refuse "
                     "them): " + " ".join(stray)
                     + (f"; did you mean {' '.join(meant)}?" if meant else ""))
    return Imported(parallel=par, train=train, num_layers=ns.num_layers, notes=tuple(notes),
                    costs=costs, cost_sources=sources,
                    layer_split=split, model_fields=model_fields, recompute_first_n=first_n,
                    model_shape=shape)


def _megatron_dispatcher(ns, notes: list) -> str:
    """The autopar dispatcher (:data:`autopar.config.DISPATCHERS`) of the parsed
    ``--moe-token-dispatcher-type`` and ``--moe-flex-dispatcher-backend``: absent = Megatron-Core's
    default, ``allgather`` (transformer_config.py moe_token_dispatcher_type, megatron-core 0.16.1
    line 675, and arguments.py's default since 2024-01); ``flex`` with the DeepEP backend (its
    default) = ``deepep``; what autopar does not price (``alltoall_seq``, the HybridEP and
    NCCL-EP backends) is modelled as ``alltoall`` and named in ``notes``."""
    kind = ns.moe_token_dispatcher_type or "allgather"
    if kind in ("allgather", "alltoall"):
        return kind
    if kind == "flex" and (ns.moe_flex_dispatcher_backend or "deepep") == "deepep":
        return "deepep"
    what = (f"--moe-token-dispatcher-type {kind}" if kind != "flex" else
            f"--moe-flex-dispatcher-backend {ns.moe_flex_dispatcher_backend}")
    notes.append(f"{what} is not priced; modelled as the all-to-all dispatcher.")
    return "alltoall"


def _megatron_router(ns, notes: list) -> dict:
    """ModelConfig router fields from Megatron-LM's router flags (only those given). Megatron
    combines several load-balancing types (a list, with one coefficient each); autopar models
    one: the first is taken, with its coefficient, and a note says so."""
    out: dict = {}
    score = ns.moe_router_score_function
    if score is not None and score not in ROUTER_SCORE_FUNCTIONS:
        # Megatron-LM d98e8a64 also offers 'sqrtsoftplus'
        notes.append(f"--moe-router-score-function {score}: not modelled (autopar knows "
                     f"{', '.join(ROUTER_SCORE_FUNCTIONS)}); the model's own is kept")
    elif score is not None:
        out["router_score_function"] = score
    types, coeffs = ns.moe_router_load_balancing_type, ns.moe_aux_loss_coeff
    if types and types[0] not in ROUTER_LOAD_BALANCING:
        notes.append(f"--moe-router-load-balancing-type {types[0]}: not modelled (autopar knows "
                     f"{', '.join(ROUTER_LOAD_BALANCING)}); the model's own is kept")
        types = coeffs = None
    if types:
        out["router_load_balancing"] = types[0]
        if len(types) > 1:
            notes.append(f"--moe-router-load-balancing-type {' '.join(types)}: autopar models "
                         f"one load-balancing type; {types[0]} taken")
    if coeffs:
        out["router_aux_loss_coeff"] = coeffs[0]
    if ns.moe_router_enable_expert_bias:
        out["router_expert_bias"] = True
    if ns.moe_z_loss_coeff is not None:
        out["router_z_loss_coeff"] = ns.moe_z_loss_coeff
    return out


def _megatron_split(ns, notes: list) -> MegatronLayerSplit:
    """Megatron-LM's flags that split the layers over pipeline chunks, as one record."""
    vpp = ns.num_virtual_stages_per_pipeline_rank
    if ns.virtual_pipeline_model_parallel_size is not None:
        # Megatron-LM's name from 2021 (commit dd88906264, renamed in dcef906978), still NeMo's
        if vpp is not None and vpp != ns.virtual_pipeline_model_parallel_size:
            raise InvalidParallelConfig(
                f"--virtual-pipeline-model-parallel-size {ns.virtual_pipeline_model_parallel_size}"
                f" and --num-virtual-stages-per-pipeline-rank {vpp} disagree. Fix: give one "
                "(--num-virtual-stages-per-pipeline-rank is Megatron-LM's current name).")
        vpp = ns.virtual_pipeline_model_parallel_size
    if ns.pipeline_model_parallel_layout and "m" in "".join(
            layout_chunks(ns.pipeline_model_parallel_layout)):
        notes.append("the layout's MTP layers ('m') are not modelled.")
    return MegatronLayerSplit(
        first=ns.decoder_first_pipeline_num_layers, last=ns.decoder_last_pipeline_num_layers,
        embedding=ns.account_for_embedding_in_pipeline_split,
        loss=ns.account_for_loss_in_pipeline_split, virtual_stages=vpp,
        layers_per_virtual_stage=ns.num_layers_per_virtual_pipeline_stage,
        layout=ns.pipeline_model_parallel_layout,
        overlap_p2p=not ns.no_overlap_p2p_communication)


def _megatron_overlaps(ns, par: dict, notes: list) -> tuple[dict, dict]:
    """The megatron profile's overlap cost fields that Megatron-LM's overlap flags set
    (megatron/training/arguments.py at d98e8a64: --overlap-grad-reduce, --overlap-param-gather,
    which needs it, --tp-comm-overlap, --no-overlap-p2p-communication; the pre-2023-10 spelling
    --overlap-p2p-communication turns on what is now the default)."""
    costs: dict = {}
    sources: dict = {}
    if ns.overlap_grad_reduce:
        costs["overlap_dp_grad_reduce"] = True
        sources["overlap_dp_grad_reduce"] = "imported --overlap-grad-reduce" + (
            " --overlap-param-gather" if ns.overlap_param_gather else "")
        if ns.overlap_param_gather and par.get("zero_stage") not in (1, 3):
            notes.append("--overlap-param-gather without --use-distributed-optimizer (or "
                         "Megatron FSDP): Megatron-LM refuses it ('--overlap-param-gather only "
                         "supported with distributed optimizer, megatron fsdp, or dist_muon').")
        if par.get("zero_stage") == 1 and not ns.overlap_param_gather:
            notes.append("--overlap-grad-reduce without --overlap-param-gather: the distributed "
                         "optimizer's parameter all-gather is costed as overlapped too (autopar "
                         "has one switch for both).")
    elif ns.overlap_param_gather:
        notes.append("--overlap-param-gather without --overlap-grad-reduce: Megatron-LM refuses "
                     "it ('Must use --overlap-param-gather with --overlap-grad-reduce'); costed "
                     "without either overlap.")
    if ns.tp_comm_overlap:
        costs["overlap_tp_comm"] = True
        sources["overlap_tp_comm"] = "imported --tp-comm-overlap"
    if ns.no_overlap_p2p_communication:
        costs["overlap_pp_p2p"] = ()
        sources["overlap_pp_p2p"] = "imported --no-overlap-p2p-communication"
    return costs, sources
