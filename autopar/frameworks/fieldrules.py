"""The rule of every field of a framework profile, checked in one pass
(:func:`checked_fields`, used by :class:`~autopar.frameworks.profiles.FrameworkProfile` at
construction and by its ``with_costs``)."""

from __future__ import annotations

from types import MappingProxyType

from ..config import (ARCHITECTURES, ATTENTION_KERNELS, CP_MODES, DISPATCHERS, MESH_DIMS,
                      RECOMPUTE_MODES, RECOMPUTE_MODULES, SCHEDULES)
from .checks import FieldCheck
from .memory import MemoryConventions
from .seqrule import SeqLenRule
from .vocabulary import (CHUNK_RULES, COST_FIELDS, CP_ATTENTION_PATHS, CUT_RULES, EAGER_PARTS,
                         ETP_RULES, FUSED_OPTIMIZER_STEP_BYTES, FUSION_LEVELS, HOST_ISSUES,
                         MOE_CAPACITY_RULES, MOE_DISPATCH_DTYPES, STAGE_SPLITS, ZERO1_PARAM_SYNCS, ZERO1_PARTITIONS,
                         ZERO3_GATHERS)


_ZERO_STAGE_FIELDS = ("zero_stages", "zero_stages_with_tp", "zero_stages_with_pp",
                      "zero_stages_with_ep")
_BOOL_FIELDS = ("per_block_recompute", "recompute_first_n", "vp_group_tunable",
                "zero3_split_backward", "expert_parallel", "per_block_reshard",
                "overlap_dp_grad_reduce", "zero3_regather_per_micro_batch",
                "zero3_pp_root_regather", "zero3_pp_reduce_after_flush", "overlap_tp_comm",
                "zero1_grad_all_reduce", "fsdp2_copies", "tp_mlp_reduce_per_linear",
                "experts_tp_sharded", "zero2_grad_all_reduce", "zero2_reduce_per_step",
                "kv_heads_below_tp", "moe_tp_token_alltoall", "grad_reduce_fp16_in_fp16",
                "moe_probs_alltoall", "moe_counts_gather", "moe_sac_redispatch",
                "ulysses_kv_repeat")


def checked_fields(v: dict, check: FieldCheck, cost_fix: str,
                   capability_names: tuple[str, ...]) -> dict:
    """Every field of a framework profile (``v``: name -> value) checked against its rule
    (the class's Attributes), problems recorded in ``check``; returns the values normalised
    (lists as tuples, mappings read-only, numbers as int/float). ``cost_fix`` is the fix for a
    missing cost source (``{field}`` formatted), empty when the caller reports those itself;
    ``capability_names`` the fields that need a source in ``sources``."""
    out = dict(v)
    out["name"] = check.text("name", v["name"], "torch")
    out["version"] = check.text("version", v["version"], "torch 2.13")
    for f in _ZERO_STAGE_FIELDS:
        out[f] = check.names(f, v[f], (0, 1, 2, 3), (0, 1, 2, 3), what="ZeRO stages")
    out["schedules"] = check.names("schedules", v["schedules"], SCHEDULES, ("1f1b",))
    out["overlaps_ep_comm"] = check.names("overlaps_ep_comm", v["overlaps_ep_comm"], SCHEDULES,
                                          ())
    if isinstance(out["overlaps_ep_comm"], tuple) and isinstance(out["schedules"], tuple):
        extra = [s for s in out["overlaps_ep_comm"] if s not in out["schedules"]]
        if extra and set(extra) <= set(SCHEDULES):
            check.bad("overlaps_ep_comm", out["overlaps_ep_comm"],
                      f"{extra} not among the schedules it runs {list(out['schedules'])}",
                      tuple(s for s in out["overlaps_ep_comm"] if s in out["schedules"]))
    out["overlap_pp_p2p"] = check.names("overlap_pp_p2p", v["overlap_pp_p2p"], SCHEDULES,
                                        ("interleaved-1f1b",), what="schedule names")
    out["cp_modes"] = check.names("cp_modes", v["cp_modes"], CP_MODES, CP_MODES,
                                  what="empty: no context parallelism")
    out["recompute_modes"] = check.names("recompute_modes", v["recompute_modes"],
                                         RECOMPUTE_MODES, ("none", "full"), nonempty=True)
    out["recompute_modules"] = check.names("recompute_modules", v["recompute_modules"],
                                           RECOMPUTE_MODULES, ("core_attn", "moe_act"),
                                           what="empty: the attention core only")
    out["sequence_parallel"] = check.names("sequence_parallel", v["sequence_parallel"],
                                           (True, False), (True, False), nonempty=True,
                                           what="the values sequence_parallel may take")
    out["moe_sequence_parallel"] = check.names(
        "moe_sequence_parallel", v["moe_sequence_parallel"], (True, False), (True, False),
        nonempty=True, what="the values sequence_parallel may take on MoE layers")
    out["dispatchers"] = check.names("dispatchers", v["dispatchers"], DISPATCHERS,
                                     ("alltoall",), nonempty=True)
    out["eager_parts"] = check.names("eager_parts", v["eager_parts"], EAGER_PARTS, ())
    for f, choices in (("interleaved_chunks", CHUNK_RULES), ("stage_cuts", CUT_RULES),
                       ("expert_tensor_parallel", ETP_RULES), ("fusion", FUSION_LEVELS),
                       ("zero3_gather", ZERO3_GATHERS), ("zero1_param_sync", ZERO1_PARAM_SYNCS),
                       ("zero1_partition", ZERO1_PARTITIONS), ("host_issue", HOST_ISSUES),
                       ("moe_dispatch_dtype", MOE_DISPATCH_DTYPES),
                       ("moe_capacity_rule", MOE_CAPACITY_RULES)):
        out[f] = check.choice(f, v[f], choices, choices[0])
    for f in _BOOL_FIELDS:
        out[f] = check.boolean(f, v[f])
    out["grad_reduce_bytes"] = check.choice(
        "grad_reduce_bytes", v["grad_reduce_bytes"], (None, 1, 2, 4), 4,
        what="bytes per gradient element; None = the cost model's CostParams.grad_bytes")
    out["step_fixed_s"] = check.number("step_fixed_s", v["step_fixed_s"], 0, "seconds", 0.0)
    out["host_op_s_published"] = check.number(
        "host_op_s_published", v["host_op_s_published"], 0,
        "seconds per kernel; 0 = no published figure", 0.0)
    out["zero1_group_size"] = check.number(
        "zero1_group_size", v["zero1_group_size"], 1, "data-parallel ranks", 8, integer=True,
        none_means="the whole data-parallel group")
    out["sync_grad_bucket_elements"] = check.number(
        "sync_grad_bucket_elements", v["sync_grad_bucket_elements"], 0,
        "gradient elements per bucket; 0 = the reduction overlaps backward as a whole", 0,
        integer=True)
    out["optimizer_step_bytes"] = check.number(
        "optimizer_step_bytes", v["optimizer_step_bytes"], 1,
        "HBM bytes per optimizer-held parameter", FUSED_OPTIMIZER_STEP_BYTES, integer=True)
    out["zero_grad_copy_passes"] = check.number(
        "zero_grad_copy_passes", v["zero_grad_copy_passes"], 0,
        "passes over each gradient per backward", 0, integer=True)
    out["zero12_grad_copy_passes"] = check.number(
        "zero12_grad_copy_passes", v["zero12_grad_copy_passes"], 0,
        "passes over each gradient per ZeRO-1/2 reduction", 0, integer=True)
    for f, unit in (("zero0_grad_copy_passes", "passes over each gradient per ZeRO-0 reduction"),
                    ("zero0_step_bytes", "HBM bytes per parameter added to the ZeRO-0 step"),
                    ("zero0_step_host_ops_per_tensor",
                     "host-issued ops per gradient tensor of a host-synchronised check"),
                    ("zero1_step_bytes", "HBM bytes per parameter added to the ZeRO-1 step"),
                    ("zero1_step_host_ops_per_tensor",
                     "host-issued ops per gradient tensor of a host-synchronised check"),
                    ("zero3_persistent_elements",
                     "elements of the largest parameter tensor ZeRO-3 keeps whole; 0 = none"),
                    ("zero3_reduce_bucket_elements",
                     "gradient elements per ZeRO-3 reduce-scatter bucket; 0 = per tensor"),
                    ("moe_dispatch_sync_ops",
                     "host-issued ops after an MoE dispatcher's blocking reads; 0 = none")):
        out[f] = check.number(f, v[f], 0, unit, 0, integer=True)
    out["attention_kernels"] = check.mapping(
        "attention_kernels", v["attention_kernels"], ATTENTION_KERNELS, {"*": "fa2"},
        keys=("*", *(a for a in ARCHITECTURES if a)), required=("*",),
        what="GPU architecture -> attention kernel; '*' for any other")
    out["cp_attention"] = check.mapping(
        "cp_attention", v["cp_attention"], CP_ATTENTION_PATHS, {}, keys=CP_MODES,
        what="CP mode -> how a rank runs attention under it")
    out["placements"] = _placements(v["placements"], check)
    out["stage_split"] = check.choice("stage_split", v["stage_split"], STAGE_SPLITS, "middle")
    out["seq_rule"] = check.instance("seq_rule", v["seq_rule"], SeqLenRule, "SeqLenRule()")
    out["memory"] = check.instance("memory", v["memory"], MemoryConventions,
                                   "autopar.frameworks.memory.TORCH_MEMORY")
    out["sources"] = check.sources(
        "sources", v["sources"], capability_names,
        "sources={{..., '{field}': 'the framework file and flag it was read from'}}")
    if cost_fix:
        out["cost_sources"] = check.sources("cost_sources", v["cost_sources"], COST_FIELDS,
                                            cost_fix)
    else:
        out["cost_sources"] = MappingProxyType(dict(v["cost_sources"]))
    return out


def _placements(value, check: FieldCheck):
    """``placements``: a tuple (a list is converted) of rank orders, each ordering all of
    :data:`autopar.config.MESH_DIMS` once (innermost first); () for any order."""
    if isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, tuple):
        check.bad("placements", value, f"must be a tuple of rank orders, each of all of "
                  f"{list(MESH_DIMS)} innermost first; () for any order", (MESH_DIMS,))
        return value
    value = tuple(tuple(o) if isinstance(o, list) else o for o in value)
    bad = [o for o in value if not isinstance(o, tuple) or len(o) != len(MESH_DIMS)
           or sorted(map(str, o)) != sorted(MESH_DIMS)]
    if bad:
        check.bad("placements", value, f"{bad} not an order of all of {list(MESH_DIMS)} "
                  "(innermost first)", (MESH_DIMS,))
    return value
