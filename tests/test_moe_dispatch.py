"""MoE token dispatchers (issue 26): DeepEP's dispatch and combine priced from its published
bandwidths (autopar.cost.dispatch), selectable per plan, exported, and read from records; and
Megatron-Core's tensor parallelism above the KV heads."""

from __future__ import annotations

import math

import pytest

import autopar
from autopar.config import DISPATCHERS
from autopar.cost.dispatch import DEEPEP, deepep_time, expected_distinct
from autopar.errors import InfeasibleError, InvalidParallelConfig
from autopar.frameworks import get_profile, rules, with_host_rate

GB = 1e9


def test_expected_distinct_bins_is_the_hypergeometric_miss():
    # 256 experts on 2 nodes of 128, top-8: 2 (1 - C(128, 8) / C(256, 8))
    want = 2 * (1 - math.comb(128, 8) / math.comb(256, 8))
    assert expected_distinct(256, 8, 2) == pytest.approx(want, rel=1e-12)
    assert expected_distinct(256, 8, 1) == 1.0
    assert expected_distinct(256, 1, 32) == pytest.approx(1.0)
    assert expected_distinct(8, 8, 8) == pytest.approx(8.0)   # every expert: every bin
    with pytest.raises(ValueError, match="evenly"):
        expected_distinct(10, 2, 4)


def test_deepep_reproduces_its_readme_bandwidth_at_ep16():
    """DeepEP docs/legacy.md, H800 + CX7: EP 16 internode dispatch and combine 43 GB/s (RDMA,
    logical bytes: one per token and destination node). 4096 tokens x 7168 x 1 byte (FP8);
    2 nodes: the RDMA leg is the bottleneck, so each transfer takes logical bytes / 43 GB/s."""
    tokens = 4096 * 7168 * 1
    d = deepep_time(tokens, 256, 8, tuple(range(16)), 8, 1, 200 * GB, 50 * GB)
    per = tokens * expected_distinct(256, 8, 2) / (43 * GB)
    assert d.seconds == pytest.approx(4 * per)          # 2 dispatches + 2 combines
    assert d.seconds == pytest.approx(5.44e-3, rel=0.01)
    # at EP 32 (4 nodes) the table's 58 / 57 GB/s
    d32 = deepep_time(tokens, 256, 8, tuple(range(32)), 8, 1, 200 * GB, 50 * GB)
    b = tokens * expected_distinct(256, 8, 4)
    assert d32.seconds == pytest.approx(2 * b / (58 * GB) + 2 * b / (57 * GB))


def test_deepep_intranode_is_nvlink_bound_and_scales_with_the_link():
    """EP 8 in one node: 153 GB/s dispatch, 158 GB/s combine on H800's 200 GB/s NVLink; on
    H100's 450 GB/s the same share of the link."""
    tokens = 4096 * 7168 * 2
    ranks = expected_distinct(256, 8, 8)
    h800 = deepep_time(tokens, 256, 8, tuple(range(8)), 8, 1, 200 * GB, 0.0)
    want = 2 * tokens * ranks / (153 * GB) + 2 * tokens * ranks / (158 * GB)
    assert h800.seconds == pytest.approx(want)
    assert h800.load.inter_bytes == 0
    h100 = deepep_time(tokens, 256, 8, tuple(range(8)), 8, 1, 450 * GB, 0.0)
    assert h100.seconds == pytest.approx(want * 200 / 450)


def test_deepep_sends_a_token_once_per_node_where_alltoall_sends_every_copy():
    """Across nodes DeepEP's network bytes are the distinct destination nodes (at most the
    node count), NCCL's all-to-all the k routed copies: top-8 over 4 nodes, about 3.6 copies
    of the token leave the rank instead of 8 (x the off-node share)."""
    tokens = 1e6
    d = deepep_time(tokens, 128, 8, tuple(range(32)), 8, 1, 450 * GB, 50 * GB)
    off_node = tokens * expected_distinct(128, 8, 4) * 3 / 4
    assert d.load.inter_bytes == pytest.approx(4 * off_node)
    assert expected_distinct(128, 8, 4) < 4 < 8


def test_deepep_holds_twenty_sms():
    # deep_ep/buffer.py Buffer.num_sms = 20; H800 / H100 SXM have 132 SMs
    assert DEEPEP.num_sms == 20
    assert DEEPEP.sm_share(132) == pytest.approx(20 / 132)
    assert DEEPEP.sm_share(0) == 0.0


def test_dispatcher_is_a_validated_plan_field():
    assert DISPATCHERS == ("alltoall", "deepep", "allgather")
    assert autopar.ParallelConfig().dispatcher == "alltoall"
    with pytest.raises(InvalidParallelConfig, match="dispatcher 'flex' is not one of"):
        autopar.ParallelConfig(dispatcher="flex")


_QWEN_MOE = {"name": "moe-2node", "family": "llama", "num_layers": 2, "hidden_size": 1024,
             "num_heads": 16, "num_kv_heads": 4, "ffn_hidden_size": 2048, "vocab_size": 4096,
             "seq_len": 1024, "num_experts": 32, "top_k": 8, "moe_ffn_hidden_size": 256}


def _estimate(dispatcher: str, framework: str = "megatron", spec: str = "4x8xH800-80GB"):
    train = autopar.TrainingConfig(global_batch_size=32, seq_len=1024, micro_batch_size=1,
                                   framework=framework)
    cfg = autopar.ParallelConfig(tp=1, pp=1, ep=32, dispatcher=dispatcher)
    # this toy MoE is host-bound at Megatron-Core's per-kernel rate, which would hide the
    # dispatchers' GPU-side costs: priced without it
    profile = (with_host_rate(framework, 0.0, "test: the dispatchers' GPU-side costs alone")
               if get_profile(framework).host_op_s_published else None)
    return autopar.estimate(_QWEN_MOE, spec, train, cfg, profile=profile)


def test_deepep_prices_less_expert_traffic_than_alltoall_across_nodes():
    a2a, deep = _estimate("alltoall"), _estimate("deepep")
    assert deep.step_time_s < a2a.step_time_s
    assert deep.config.dispatcher == "deepep"


def test_deepep_without_expert_parallelism_still_moves_tokens_to_the_expert_tp_shards():
    """At ep = 1 no DeepEP dispatch runs; the folded experts' tokens still reach their expert-TP
    shards, priced as the all-to-all dispatcher's gather (it was dropped: a pinned DeepEP plan
    at ep 1 came out faster than any plan the search found)."""
    train = autopar.TrainingConfig(global_batch_size=32, seq_len=1024, micro_batch_size=1,
                                   framework="megatron")
    est = {d: autopar.estimate(_QWEN_MOE, "2x8xH800-80GB", train, autopar.ParallelConfig(
        tp=2, pp=1, ep=1, expert_tp=8, sequence_parallel=True, dispatcher=d))
        for d in ("alltoall", "deepep")}
    assert est["deepep"].step_time_s == pytest.approx(est["alltoall"].step_time_s)
    assert est["deepep"].time_breakdown.tp_comm == pytest.approx(est["alltoall"].time_breakdown.tp_comm)
    assert est["alltoall"].time_breakdown.tp_comm > 0


def test_a_framework_without_deepep_says_so():
    e = _estimate("deepep", framework="deepspeed")
    assert any("no 'deepep' token dispatcher" in w for w in e.warnings)
    titan = get_profile("torchtitan")
    assert "deepep" in titan.dispatchers and "deepep" in get_profile("megatron").dispatchers


def test_megatron_export_writes_the_flex_deepep_dispatcher():
    train = autopar.TrainingConfig(global_batch_size=32, seq_len=1024, micro_batch_size=1,
                                   framework="megatron")
    plan = autopar.optimize(_QWEN_MOE, "4x8xH800-80GB", train,
                            fixed={"tp": 1, "pp": 1, "ep": 32, "dispatcher": "deepep"})
    assert plan.config.dispatcher == "deepep"   # a pin the search keeps
    args = " ".join(plan.to_megatron_args().value)
    assert "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep" in args
    a2a = autopar.optimize(_QWEN_MOE, "4x8xH800-80GB", train, fixed={"tp": 1, "pp": 1, "ep": 32})
    assert a2a.config.dispatcher == "alltoall"   # not searched: the default
    assert "--moe-token-dispatcher-type alltoall" in " ".join(a2a.to_megatron_args().value)


def test_tp_above_kv_heads_is_legal_only_where_the_framework_gathers_them():
    assert rules.tp_heads(8, 32, 4) is not None
    v = rules.tp_heads(8, 32, 4)
    assert "use tp in [1, 2, 4]" in v.text
    assert rules.tp_heads(8, 32, 4, kv_below_tp=True) is None
    assert rules.tp_heads(16, 32, 4, kv_below_tp=True) is None
    bad = rules.tp_heads(6, 32, 4, kv_below_tp=True)
    assert bad is not None and "divide or be a multiple of the 4 KV heads" in bad.text
    assert get_profile("megatron").kv_heads_below_tp
    assert not get_profile("torch").kv_heads_below_tp


def test_megatron_tp8_over_four_kv_heads_prices_the_qkv_gather():
    """Megatron-Core attention.py: with 4 query groups under tp 8 each rank all-gathers the
    fused QKV output over TP (and reduce-scatters its gradient): more TP traffic than the same
    model with 8 KV heads, whose projections split without a gather; torch refuses tp 8."""
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=1024, micro_batch_size=1,
                                   framework="megatron")
    dense = {k: v for k, v in _QWEN_MOE.items()
             if k not in ("num_experts", "top_k", "moe_ffn_hidden_size")}
    cfg = autopar.ParallelConfig(tp=8, sequence_parallel=True)
    e4, e8 = (autopar.estimate({**dense, "num_kv_heads": kv}, "1x8xH100-80GB", train, cfg)
              for kv in (4, 8))
    assert e4.time_breakdown.tp_comm > e8.time_breakdown.tp_comm
    with pytest.raises(InvalidParallelConfig, match="tp=8 must divide the 16 attention heads "
                                                    "and 4 KV heads"):
        autopar.estimate(dense, "1x8xH100-80GB",
                         autopar.TrainingConfig(global_batch_size=8, seq_len=1024,
                                                micro_batch_size=1), cfg)


def test_deepep_across_efa_nodes_is_refused_and_never_searched():
    """DeepEP's internode kernels need GPU-initiated RDMA, which EFA lacks (rules.deepep_fabric):
    a plan naming it is refused with the fix, the search picks another dispatcher, and within a
    node (NVLink only) or over InfiniBand it stays a choice."""
    from autopar.frameworks.rules import deepep_fabric
    assert deepep_fabric(1, 16, "efa", 8).rule == "deepep_fabric"
    assert "dispatcher='alltoall'" in deepep_fabric(1, 16, "efa", 8).fix
    assert deepep_fabric(1, 8, "efa", 8) is None            # one node: NVLink kernels
    assert deepep_fabric(1, 16, "efa", 72) is None          # inside one NVL72 domain
    assert deepep_fabric(1, 16, "infiniband", 8) is None
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=256, framework="megatron")
    moe = {"name": "m", "family": "llama", "num_layers": 2, "hidden_size": 256, "num_heads": 4,
           "vocab_size": 1000, "seq_len": 256, "num_experts": 16, "top_k": 2,
           "moe_ffn_hidden_size": 128}
    with pytest.raises(autopar.InvalidParallelConfig, match="deepep' over EFA"):
        autopar.estimate(moe, "2x8xH100-80GB+32xefa-v2-100g", train,
                         autopar.ParallelConfig(dp=16, ep=16, dispatcher="deepep"))
    plan = autopar.optimize(moe, "2x8xH100-80GB+32xefa-v2-100g", train, fixed={"ep": 16})
    assert plan.config.dispatcher != "deepep"


def test_records_read_deepep_and_refuse_it_over_efa():
    pytest.importorskip("transformers")
    from benchmarks import records
    from tests.test_issue26_records import _rec
    ib = records.parse(_rec(plan={"dispatcher": "flex/deepep"},
                            cluster={"num_gpus": 16, "inter_node": "8x InfiniBand NDR"}))
    assert ib.fixed["dispatcher"] == "deepep"
    assert records.parse(_rec()).fixed["dispatcher"] == "alltoall"
    # over EFA the record parses and the library's rule refuses its estimate (deepep_fabric)
    efa = records.parse(_rec(plan={"dispatcher": "flex/deepep", "tp": 2, "dp": 8, "ep": 8,
                                   "sequence_parallel": True},
                             cluster={"num_gpus": 16,
                                      "inter_node": "32x 100 Gbps EFA per node (AWS p5.48xlarge)"}))
    from benchmarks import validation
    with pytest.raises(autopar.InvalidParallelConfig, match="deepep' over EFA"):
        validation.evaluate(efa, spread=False)
    with pytest.raises(records.RecordError, match="'hybridep' token dispatcher"):
        records.parse(_rec(plan={"dispatcher": "hybridep"}))


def test_deepep_buffers_are_reserved_outside_the_allocator():
    from autopar.cost.dispatch import deepep_buffer_bytes
    # csrc/config.hpp at one node (no RDMA): 10 channels x 8 ranks x ((2 x 1 + 3) x 4 bytes
    # + 256 receive tokens x (8192 + 8 + 1024 + 512 + 512) bytes), 128-aligned, and the 32 MiB
    # workspace (LEGACY_NUM_WORKSPACE_BYTES); no NVSHMEM inside one node
    assert deepep_buffer_bytes(8, 4096) == (-(-(10 * 8 * (5 * 4 + 256 * 10248)) // 128) * 128
                                            + 32 * 2 ** 20)
    assert deepep_buffer_bytes(1, 4096) == 0
    # across nodes NVSHMEM's heap joins (512 MiB chunks); more ranks, more buffer
    assert deepep_buffer_bytes(16, 4096) > deepep_buffer_bytes(8, 4096) + 2 ** 29
    assert deepep_buffer_bytes(160, 7168) > deepep_buffer_bytes(64, 7168) > 0


def test_a_deepep_plan_reserves_its_buffers():
    from autopar.cost.dispatch import deepep_buffer_bytes
    a2a, deep = _estimate("alltoall"), _estimate("deepep")
    c = deep.config
    hidden = _QWEN_MOE["hidden_size"]
    extra = deep.memory_breakdown.reserved - a2a.memory_breakdown.reserved
    # the buffers, plus the allocator's fragmentation share of whatever else differs
    assert extra == pytest.approx(deepep_buffer_bytes(c.etp * c.ep, hidden), rel=0.05)
    # outside torch's allocator: max_memory_allocated does not see them
    assert deep.memory_breakdown.allocated == pytest.approx(a2a.memory_breakdown.allocated,
                                                            rel=0.02)


def test_deepep_runs_only_the_group_sizes_its_kernels_are_compiled_for():
    """DeepEP csrc/kernels/legacy/launch.cuh: SWITCH_RANKS 2, 4, 8 inside a node;
    SWITCH_RDMA_RANKS 2, 3, 4, 6, 8, 12, 16, 18, 20 groups of 8 NVLink peers across nodes."""
    assert rules.DEEPEP_RANKS == (2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144, 160)
    for etp, ep in ((1, 2), (1, 8), (2, 8), (1, 24), (4, 8), (1, 160), (8, 20)):
        assert rules.deepep_ranks(etp, ep, 8) is None, (etp, ep)
    for etp, ep in ((1, 3), (1, 6), (1, 12), (1, 40), (1, 80), (1, 256), (3, 4)):
        v = rules.deepep_ranks(etp, ep, 8)
        assert v.rule == "deepep_ranks" and f"{etp}*{ep} = {etp * ep} ranks" in v.problem
        assert v.fix.endswith("dispatcher='alltoall'")
    assert rules.deepep_ranks(1, 12).fix.startswith("ep in [2, 4, 8, 16, 24, 32, 48, ")
    assert rules.deepep_ranks(2, 6).fix.startswith("ep in [2, 4, 8, 12, 16, 24, ")
    # whole NVLink groups per node: 8 ranks over nodes of 4 GPUs cannot share IPC buffers
    v = rules.deepep_ranks(1, 8, 4)
    assert "whole groups of 8" in v.problem and v.fix == "ep in [2, 4] at expert_tp=1, or " \
        "dispatcher='alltoall'"
    assert rules.deepep_ranks(1, 16, 4).rule == "deepep_ranks"
    assert rules.deepep_ranks(1, 4, 4) is None and rules.deepep_ranks(1, 16, 72) is None
    assert rules.deepep_ranks(1, 8, 72) is None and rules.deepep_ranks(1, 8, 12) is not None
    # the fix names only sizes that also divide the experts and the GPUs (a new user's
    # deepseek-v2, 160 experts, on 40 GPUs: ep 5 -> [2, 4, 8], not 16 or 24)
    assert rules.deepep_ranks(1, 5, 8, 160, 40).fix == ("ep in [2, 4, 8] at expert_tp=1, or "
                                                        "dispatcher='alltoall'")


def test_a_pinned_ep_that_divides_no_experts_names_deepep_sizes_under_deepep():
    """The divisibility fix under dispatcher='deepep' keeps the ep values DeepEP runs too."""
    from autopar.errors import InfeasibleError
    model = dict(_QWEN_MOE, num_experts=160)
    train = autopar.TrainingConfig(global_batch_size=40, seq_len=256, framework="megatron")
    with pytest.raises(InfeasibleError, match=r"ep=24 does not divide.*Fix: ep in \[1, 2, 4, 8\],"):
        autopar.optimize(model, "5x8xH100", train, fixed=dict(ep=24, dispatcher="deepep"))


def test_a_fixed_deepep_plan_of_an_unsupported_size_is_refused():
    model = dict(_QWEN_MOE, num_experts=48)
    train = autopar.TrainingConfig(global_batch_size=48, seq_len=1024, micro_batch_size=1,
                                   framework="megatron")
    with pytest.raises(InvalidParallelConfig) as info:   # 12 ranks: no kernel
        autopar.estimate(model, "6x8xH800-80GB", train,
                         autopar.ParallelConfig(tp=1, pp=1, ep=12, dispatcher="deepep"))
    assert info.value.rule == "deepep_ranks"
    assert "expert_tp*ep = 1*12 = 12 ranks" in str(info.value)
    assert "Fix: ep in [2, 4, 8, 16, 24" in str(info.value)
    # the same plan under all-to-all runs, and so does DeepEP over 24 ranks
    autopar.estimate(model, "6x8xH800-80GB", train,
                     autopar.ParallelConfig(tp=1, pp=1, ep=12, dispatcher="alltoall"))
    autopar.estimate(model, "6x8xH800-80GB", train,
                     autopar.ParallelConfig(tp=1, pp=1, ep=24, dispatcher="deepep"))


def test_the_search_offers_no_deepep_plan_its_kernels_cannot_run():
    model = dict(_QWEN_MOE, num_experts=48)
    train = autopar.TrainingConfig(global_batch_size=48, seq_len=1024, micro_batch_size=1,
                                   framework="megatron")
    plan = autopar.optimize(model, "6x8xH800-80GB", train, top_k=20,
                            fixed={"tp": 1, "pp": 1, "cp": 1, "dispatcher": "deepep"})
    seen = {(c.etp, c.ep) for c in (plan.config, *(a.config for a in plan.alternatives))}
    # expert_tp x ep groups of 2 ... 48 ranks, none of 6, 12 (etp 1) or 36
    assert len(seen) > 10 and {t * e for t, e in seen} <= set(rules.DEEPEP_RANKS), seen
    assert (1, 12) not in seen and (1, 6) not in seen
    # pinned to a size DeepEP has no kernel for, the search says so
    with pytest.raises(InfeasibleError) as info:
        autopar.optimize(model, "6x8xH800-80GB", train,
                         fixed={"tp": 1, "pp": 1, "ep": 12, "expert_tp": 1, "dispatcher": "deepep"})
    assert info.value.rule == "deepep_ranks"
    assert str(info.value).startswith("no legal parallel layout for moe-2node on 48 GPUs: "
                                      "dispatcher 'deepep' runs its expert-TP x EP group of "
                                      "expert_tp*ep = 1*12 = 12 ranks only at [2, 4, 8, 16, ")
    # with expert_tp open, ep 12 pairs with expert_tp 2 (24 ranks; priced without the
    # per-kernel host rate, under which this toy MoE is host-bound and expert_tp 4 ties)
    plan = autopar.optimize(model, "6x8xH800-80GB", train,
                            fixed={"tp": 1, "pp": 1, "ep": 12, "dispatcher": "deepep"},
                            profile=with_host_rate("megatron", 0.0, "test: GPU-side costs"))
    assert (plan.config.etp, plan.config.ep) == (2, 12)


def test_nvshmem_heap_maps_whole_512_mib_chunks():
    from autopar.cost.dispatch import nvshmem_heap_bytes
    mib = 2 ** 20
    assert nvshmem_heap_bytes(0) == 0
    # NVSHMEM's own first chunk holds a buffer up to 512 MiB - 10 MiB - 128 bytes
    assert nvshmem_heap_bytes(93 * 10 ** 6) == 512 * mib
    assert nvshmem_heap_bytes(502 * mib - 128) == 512 * mib
    # beyond it a second mapping of (buffer + 128) rounded up to 512 MiB
    assert nvshmem_heap_bytes(502 * mib - 127) == 1024 * mib
    assert nvshmem_heap_bytes(1024 * mib - 128) == 1536 * mib
    assert nvshmem_heap_bytes(1024 * mib) == 2048 * mib


def test_deepep_across_nodes_holds_the_nvshmem_heap_beside_its_buffers():
    from autopar.cost.dispatch import deepep_buffer_bytes, deepep_buffer_hints
    nvl, rdma = deepep_buffer_hints(16, 7168)
    # 10 channels x 2 RDMA ranks x ((8 x 2 + 2) x 2 x 4 + 140 x 2 x (16392 + 16)) + 1 MiB
    # (92_936_256), 128-aligned
    assert rdma == 92_936_320 == -(-(10 * 2 * (18 * 8 + 140 * 2 * 16408) + 2 ** 20) // 128) * 128
    assert deepep_buffer_hints(8, 7168)[1] == 0
    assert deepep_buffer_bytes(16, 7168) == nvl + 32 * 2 ** 20 + 512 * 2 ** 20
