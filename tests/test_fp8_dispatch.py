"""FP8 token dispatch (issue 26): a framework that dispatches MoE tokens in FP8 under FP8
training (DeepSeek-V3's HAI-LLM, the inhouse-2024 profile) moves 1 + 4/128 bytes per element
along the dispatch direction (forward dispatch, backward dispatch of the combine's gradient)
and the activation dtype in the two combines; every other stack dispatches in the activation
dtype. Time only: memory does not change."""

from __future__ import annotations

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.dispatch import (DEEPEP, FP8_1X128_BYTES, alltoall_time, deepep_time,
                                   dispatch_bytes_ratio, expected_distinct)
from autopar.cost.model import CostModel
from autopar.errors import InvalidTrainingConfig
from autopar.frameworks import PROFILES, get_profile
from autopar.frameworks.choices import ACTIVATION_DTYPE_DISPATCH
from autopar.frameworks.stacks import CHOICES, inhouse
from autopar.hardware.collectives import LinkLoad

GB = 1e9
FP8_RATIO = (1 + 4 / 128) / 2   # DeepEP tests' fp8_factor: 0.515625


def test_fp8_tile_bytes_and_the_ratio_per_precision():
    assert FP8_1X128_BYTES == 1.03125
    assert dispatch_bytes_ratio("fp8_1x128", "fp8", 2) == FP8_RATIO == 0.515625
    # FP8 dispatch feeds FP8 expert GEMMs: under any other precision the activation dtype
    for precision in ("bf16", "fp16"):
        assert dispatch_bytes_ratio("fp8_1x128", precision, 2) == 1.0
    assert dispatch_bytes_ratio("fp8_1x128", "fp32", 4) == 1.0
    assert dispatch_bytes_ratio("activation", "fp8", 2) == 1.0
    with pytest.raises(ValueError, match="unknown MoE dispatch dtype 'fp8'"):
        dispatch_bytes_ratio("fp8", "fp8", 2)


class _Group:
    """An EP group whose all-to-all takes 10 us + bytes / 50 GB/s and loads the NIC only."""

    def time(self, op: str, nbytes: float) -> float:
        assert op == "all_to_all"
        return 10e-6 + nbytes / (50 * GB)

    def load(self, op: str, nbytes: float) -> LinkLoad:
        return LinkLoad(inter_bytes=nbytes, inter_s=self.time(op, nbytes))


def test_alltoall_sends_the_two_dispatches_scaled_and_the_two_combines_whole():
    routed = 8 * 4096 * 7168 * 2          # top-8 copies of 4096 bf16 tokens of hidden 7168
    g = _Group()
    d = alltoall_time(routed, g, FP8_RATIO)
    assert d.seconds == pytest.approx(2 * g.time("all_to_all", routed * FP8_RATIO)
                                      + 2 * g.time("all_to_all", routed))
    assert d.seconds == pytest.approx(4 * 10e-6 + 2 * routed * (1 + FP8_RATIO) / (50 * GB))
    assert d.load.inter_bytes == pytest.approx(2 * routed * (1 + FP8_RATIO))
    assert d.seconds / alltoall_time(routed, g).seconds == pytest.approx(0.7578, abs=1e-3)


def test_deepep_scales_its_dispatch_rate_transfers_only():
    """EP 16 over 2 H800 nodes: each transfer RDMA-bound at the table's 43 GB/s (dispatch and
    combine alike), so the layer is 2 x 0.515625 + 2 transfers of the BF16 bytes."""
    tokens = 4096 * 7168 * 2
    ranks = tuple(range(16))
    bf16 = deepep_time(tokens, 256, 8, ranks, 8, 1, 200 * GB, 50 * GB)
    fp8 = deepep_time(tokens, 256, 8, ranks, 8, 1, 200 * GB, 50 * GB, DEEPEP, FP8_RATIO)
    per = tokens * expected_distinct(256, 8, 2) / (43 * GB)
    assert bf16.seconds == pytest.approx(4 * per)
    assert fp8.seconds == pytest.approx(2 * FP8_RATIO * per + 2 * per)
    assert fp8.load.inter_bytes == pytest.approx(bf16.load.inter_bytes * (1 + FP8_RATIO) / 2)
    assert fp8.load.intra_bytes == pytest.approx(bf16.load.intra_bytes * (1 + FP8_RATIO) / 2)
    # in one node: NVLink-bound, 153 GB/s dispatch and 158 GB/s combine
    one = deepep_time(tokens, 256, 8, tuple(range(8)), 8, 1, 200 * GB, 0.0, DEEPEP, FP8_RATIO)
    nvl = tokens * expected_distinct(256, 8, 8)
    assert one.seconds == pytest.approx(2 * nvl * FP8_RATIO / (153 * GB) + 2 * nvl / (158 * GB))


def test_profiles_name_and_source_their_dispatch_format():
    inh = get_profile("inhouse-2024")
    assert inh.moe_dispatch_dtype == "fp8_1x128"
    assert CHOICES["inhouse-2024"].names()["expert_dispatch"] == "fp8-1x128-dispatch"
    src = inh.cost_sources["moe_dispatch_dtype"]
    assert "2412.19437" in src and "3.3.3" in src
    assert "quantize the activation before MoE up-projections into FP8" in src
    assert "activation gradient before MoE down-projections" in src
    assert "combine components, we retain them in BF16" in src
    assert inhouse.FP8_DISPATCH.moe_dispatch_dtype == "fp8_1x128"
    for name, p in PROFILES.items():
        if name == "inhouse-2024":
            continue
        assert p.moe_dispatch_dtype == "activation", name
        # Megatron-Core's dispatcher moves the activation dtype too, with its probabilities'
        # all-to-all and counts' gather (stacks.megatron.MEGATRON_ALLTOALL_DISPATCH)
        # (DeepSpeed's names its padded expert buffers too: stacks.deepspeed.DEEPSPEED_MOE_DISPATCH;
        # plan.apply's dispatches again when a block is recomputed: stacks.pytorch.
        # PLAN_APPLY_DISPATCH, for the profiles built on the torch stack's choices)
        assert CHOICES[name].names()["expert_dispatch"] in (
            ACTIVATION_DTYPE_DISPATCH.name, "megatron-alltoall-0.13", "deepspeed-moe",
            "plan-apply-dispatch"), name
        src = p.cost_sources["moe_dispatch_dtype"]
        for where in ("token_dispatcher.py", "expert_parallel.py", "sharded_moe.py"):
            assert where in src, (name, where)


def test_the_field_is_validated_and_edited_with_a_source():
    inh = get_profile("inhouse-2024")
    with pytest.raises(InvalidTrainingConfig, match="moe_dispatch_dtype"):
        inh.with_costs({"moe_dispatch_dtype": "a guess"}, moe_dispatch_dtype="fp8")
    with pytest.raises(InvalidTrainingConfig, match="moe_dispatch_dtype needs a source"):
        inh.with_costs({}, moe_dispatch_dtype="activation")
    edited = get_profile("megatron").with_costs(
        {"moe_dispatch_dtype": "our fork dispatches FP8"}, moe_dispatch_dtype="fp8_1x128")
    assert edited.moe_dispatch_dtype == "fp8_1x128"
    assert hash(edited) != hash(get_profile("megatron"))


_MOE = {"name": "moe-2node", "family": "llama", "num_layers": 2, "hidden_size": 1024,
        "num_heads": 16, "num_kv_heads": 4, "ffn_hidden_size": 2048, "vocab_size": 4096,
        "seq_len": 1024, "num_experts": 32, "top_k": 8, "moe_ffn_hidden_size": 256}


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_inhouse_fp8_dispatch_lowers_exposed_ep_time_under_fp8_only(dispatcher):
    """A small MoE on 4 x 8 H800, ep 32, no DualPipe (all EP time exposed): under FP8 the
    inhouse-2024 profile's EP time is the activation-dtype dispatch's with the two
    dispatch-direction transfers' bytes scaled; under BF16 it is the same."""
    cfg = autopar.ParallelConfig(tp=1, pp=1, ep=32, dispatcher=dispatcher)
    inh = get_profile("inhouse-2024")
    act = inh.with_costs({"moe_dispatch_dtype": "test: activation dtype"},
                         moe_dispatch_dtype="activation")
    out = {}
    for precision in ("fp8", "bf16"):
        train = autopar.TrainingConfig(global_batch_size=32, seq_len=1024, micro_batch_size=1,
                                       precision=precision, framework="inhouse-2024")
        e_fp8, e_act = (autopar.estimate(_MOE, "4x8xH800-80GB", train, cfg, profile=p)
                        for p in (inh, act))
        assert e_fp8.memory_per_gpu_bytes == e_act.memory_per_gpu_bytes
        out[precision] = (e_fp8.time_breakdown.ep_comm, e_act.time_breakdown.ep_comm)
    fp8, act_fp8 = out["fp8"]
    linear = (1 + FP8_RATIO) / 2   # 0.758: what a time proportional to bytes gives
    if dispatcher == "deepep":     # DeepEP's table: seconds proportional to bytes, per rate
        d_bw, c_bw = DEEPEP.rdma_row(4)   # 4 nodes: 58 / 57 GB/s, RDMA-bound
        share = (FP8_RATIO / d_bw + 1 / c_bw) / (1 / d_bw + 1 / c_bw)
        assert fp8 == pytest.approx(share * act_fp8)
        assert share == pytest.approx(linear, abs=0.005)
    else:                          # NCCL's all-to-all: a fixed latency besides the bytes
        assert linear * act_fp8 < fp8 < act_fp8
    assert out["bf16"][0] == pytest.approx(out["bf16"][1])


@pytest.fixture(scope="module")
def deepseek_v3():
    from benchmarks import validation as v
    from benchmarks.records import parse
    raw = next(r for r in v.load_corpus() if isinstance(r, dict)
               and r.get("id") == "b-deepseek-v3-2048gpu")
    rec = parse(raw)
    train = v.training(rec)
    graph, _ = model_graph(rec.model, train)
    cfg = autopar.ParallelConfig(**{**v.framework_defaults(rec), **rec.fixed})
    prof = v.record_profile(rec)

    def run(profile):
        return CostModel(graph, rec.cluster, train, framework=profile).estimate(cfg)
    return prof, run


def test_deepseek_v3_record_dualpipe_hides_the_fp8_dispatch(deepseek_v3):
    """b-deepseek-v3-2048gpu (2,048 H800, pp16 ep64 DualPipe, FP8; measured 19.91 s a step,
    the whole-run average): dispatching in BF16, DualPipe hides most of the all-to-all and
    5.29 s stay exposed (23.92 s); in FP8 0.79 s stay exposed (19.86 s; 19.73 s before the
    Hopper GEMMs' second wave beside the DP collectives, tests/test_persistent_gemm_overlap.py;
    19.78 s before the MTP module's embedding gather, autopar.graph.mtp; 5.10 / 0.65 s of
    23.66 / 19.79 s before the busiest EP rank's 1.3% more rows of random routing,
    capacity.random_routing_scale, of which DualPipe hides none).
    Since the all-to-all pays its proxy's posts per remote peer (64 ranks over 8 nodes, NCCL's
    3 us each under the Simple protocol; autopar.hardware.collectives.all_to_all_net_posts_s)
    FP8's dispatch no longer hides whole (before: 4.41 s and 0 s exposed). Memory does not
    change."""
    prof, run = deepseek_v3
    assert prof.name == "inhouse-2024" and prof.moe_dispatch_dtype == "fp8_1x128"
    fp8 = run(prof)
    bf16 = run(prof.with_costs({"moe_dispatch_dtype": "test: BF16 dispatch"},
                               moe_dispatch_dtype="activation"))
    assert fp8.step_time_s == pytest.approx(19.86, abs=0.01)
    assert bf16.step_time_s == pytest.approx(23.92, abs=0.01)
    assert fp8.time_breakdown.ep_comm == pytest.approx(0.79, abs=0.01)
    assert bf16.time_breakdown.ep_comm == pytest.approx(5.29, abs=0.01)
    assert fp8.memory_per_gpu_bytes == bf16.memory_per_gpu_bytes
