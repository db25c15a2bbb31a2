"""Megatron-Core's all-gather token dispatcher (issue 26 items 3-4): priced over the expert-TP x
EP group from megatron-core 0.16.1 token_dispatcher.py MoEAllGatherTokenDispatcher, run by the
Megatron family only, searched against all-to-all there, exported and imported, the default of
Megatron records that name no dispatcher, and refused by plan.apply."""

from __future__ import annotations

import pytest

import autopar
from autopar.config import DISPATCHERS
from autopar.cost.comm import Collectives
from autopar.cost.dispatch import allgather_time, allgather_traffic, dispatch_cost
from autopar.runtime.errors import UnsupportedPlanError
from autopar.frameworks import get_profile, with_host_rate
from autopar.search import space

_MOE = {"name": "moe-ag", "family": "llama", "num_layers": 2, "hidden_size": 1024,
        "num_heads": 16, "num_kv_heads": 4, "ffn_hidden_size": 2048, "vocab_size": 4096,
        "seq_len": 1024, "num_experts": 32, "top_k": 8, "moe_ffn_hidden_size": 256}


#: Megatron-Core priced without its per-kernel host rate: this toy MoE is host-bound under it
#: (autopar.cost.host), which would hide the dispatchers' GPU-side costs these tests compare
_GPU_SIDE = with_host_rate("megatron", 0.0, "test: the dispatchers' GPU-side costs alone")


def _train(**kw):
    return autopar.TrainingConfig(global_batch_size=32, seq_len=1024, micro_batch_size=1,
                                  framework="megatron", **kw)


def test_allgather_is_a_dispatcher_megatron_runs_and_torchtitan_refuses_with_a_fix():
    assert DISPATCHERS == ("alltoall", "deepep", "allgather")
    for name in ("megatron", "nemo"):
        assert "allgather" in get_profile(name).dispatchers
    for name in ("torchtitan", "torch", "deepspeed", "megatron-2023"):
        assert "allgather" not in get_profile(name).dispatchers
    c = autopar.ParallelConfig(tp=1, dp=8, ep=8, zero_stage=3, dispatcher="allgather")
    e = autopar.estimate(_MOE, "1x8xH100-80GB", autopar.TrainingConfig(
        global_batch_size=32, seq_len=1024, micro_batch_size=1, framework="torchtitan"), c)
    msg = " ".join(e.warnings)
    assert "no 'allgather' token dispatcher" in msg and "no all-gather dispatcher" in msg
    assert "Fix: dispatcher='alltoall'" in msg


def test_allgather_traffic_counts_the_gathered_group_tokens_map_and_probs():
    """A rank holding T = 4096 tokens of H = 1024 in bf16, E = 32 experts, over etp x ep = 8
    ranks: tokens G T H d = 8 x 4096 x 1024 x 2 = 64 MiB each way; probabilities G T E d =
    2 MiB; routing map G T E x 1 byte = 1 MiB."""
    t = allgather_traffic(4096 * 1024 * 2, 4096, 32, 8, 2)
    assert t.tokens == 8 * 4096 * 1024 * 2 == 67108864
    assert t.probs == 8 * 4096 * 32 * 2 == 2097152
    assert t.routing_map == 8 * 4096 * 32 == 1048576


def test_allgather_time_is_three_gathers_and_a_scatter_forward_and_their_adjoints():
    cl = autopar.Cluster.from_spec("1x8xH100-80GB")
    g = Collectives(cl, tuple(range(8)))
    t = allgather_traffic(4096 * 1024 * 2, 4096, 32, 8, 2)
    d = allgather_time(t, g)
    want = (2 * g.time("all_gather", t.tokens)
            + g.time("all_gather", t.probs) + g.time("all_gather", t.routing_map)
            + 2 * g.time("reduce_scatter", t.tokens) + g.time("reduce_scatter", t.probs))
    assert d.seconds == pytest.approx(want)
    assert d.load.intra_bytes > 0 and d.load.inter_bytes == 0
    # one rank: nothing moves
    assert allgather_time(allgather_traffic(1e6, 100, 32, 1, 2),
                          Collectives(cl, (0,))).seconds == 0.0
    with pytest.raises(ValueError, match="allgather_time"):
        dispatch_cost("allgather", 1e6, 32, 8, g)


def test_tp_ep_group_holds_the_tp_ranks_of_each_ep_rank():
    train = _train()
    cm = autopar.api.CostModel(autopar.api.model_graph(_MOE, train)[0],
                               autopar.Cluster.from_spec("2x8xH100-80GB"), train,
                               framework=get_profile("megatron"))
    c = cm.resolve(autopar.ParallelConfig(tp=2, dp=8, ep=4, sequence_parallel=True,
                                          dispatcher="allgather"))
    assert cm.group("tpep", c).ranks == (0, 1, 2, 3, 4, 5, 6, 7)
    f = cm.resolve(autopar.ParallelConfig(tp=2, dp=8, ep=4, expert_tp=1,
                                          sequence_parallel=True, dispatcher="allgather"))
    assert cm.group("tpep", f).ranks == (0, 1, 2, 3)
    assert cm.group("tpep", f).ranks == cm.group("ep", f).ranks   # etp 1: the EP group


def test_allgather_at_ep1_is_todays_expert_tp_gather_and_trades_against_alltoall_at_ep8():
    """ep = 1: the all-gather dispatcher gathers over TP only, what the TP collectives already
    price: the same estimate as all-to-all. ep = 8 x tp = 2 over two nodes (a 16-rank
    expert-TP x EP group): every rank gathers the group's 16 T tokens, where all-to-all sends
    top-k T and then gathers them over TP. Top-2: all-gather moves more bytes (its EP traffic
    3.83 ms, TP 0.81 -> 0.43 ms: the experts' TP gather goes with it), but all-to-all sends the
    busiest EP rank's rows of random routing (4.1% over the balanced share,
    capacity.random_routing_scale), which takes each peer's message past NCCL's next network
    chunk split (autopar.hardware.collectives.all_to_all_net_posts_s: twice the proxy's first
    posts): 4.68 ms of EP traffic, 10.77 against 9.54 ms a step (9.20 against 9.54 ms when the
    balanced share was priced exact; all-to-all's EP seconds include Megatron-Core's
    probabilities' all-to-all and counts' all-gather, tests/test_issue26_alltoall_metadata.py);
    top-8 of 32: all-to-all's routed copies outweigh it further."""
    est = {}
    for k in (2, 8):
        for ep in (1, 8):
            for d in ("alltoall", "allgather"):
                est[k, ep, d] = autopar.estimate(
                    {**_MOE, "top_k": k}, "2x8xH100-80GB", _train(),
                    autopar.ParallelConfig(tp=2, dp=8, ep=ep, sequence_parallel=True,
                                           dispatcher=d), profile=_GPU_SIDE)
    for k in (2, 8):
        a2a, ag = est[k, 1, "alltoall"], est[k, 1, "allgather"]
        assert ag.step_time_s == pytest.approx(a2a.step_time_s)
        assert ag.memory_per_gpu_bytes == a2a.memory_per_gpu_bytes
    a2a, ag = est[2, 8, "alltoall"], est[2, 8, "allgather"]
    assert (a2a.step_time_s, ag.step_time_s) == (pytest.approx(10.77e-3, rel=0.02),
                                                 pytest.approx(9.54e-3, rel=0.02))
    assert ag.time_breakdown.ep_comm == pytest.approx(3.83e-3, rel=0.02)
    assert a2a.time_breakdown.ep_comm == pytest.approx(4.68e-3, rel=0.02)
    assert ag.time_breakdown.tp_comm < a2a.time_breakdown.tp_comm
    assert ag.memory_per_gpu_bytes > a2a.memory_per_gpu_bytes   # the gathered [16 T, H]
    assert est[8, 8, "allgather"].step_time_s < est[8, 8, "alltoall"].step_time_s


def test_search_chooses_between_alltoall_and_allgather_when_asked_for_megatron_only():
    """The dispatcher is searched only under ``dispatcher="auto"`` (it doubles the MoE groups:
    opt-in); unpinned, the search keeps all-to-all as before."""
    meg, titan = get_profile("megatron"), get_profile("torchtitan")
    auto = {"dispatcher": "auto"}
    assert space.dispatchers(8, auto, meg) == ("alltoall", "allgather")
    assert space.dispatchers(1, auto, meg) == ("alltoall",)
    assert space.dispatchers(8, auto, titan) == ("alltoall",)
    assert space.dispatchers(8, {}, meg) == ("alltoall",)
    assert space.dispatchers(8, {"dispatcher": "deepep"}, meg) == ("deepep",)
    # top-8 of 32 under tp 2 = etp 2, ep 8 on two nodes: all-gather is the faster (the test
    # above), and "auto" finds it
    k8, at = {**_MOE, "top_k": 8}, {"tp": 2, "pp": 1, "ep": 8, "expert_tp": 2}
    chosen = autopar.optimize(k8, "2x8xH100-80GB", _train(), fixed={**at, **auto},
                              profile=_GPU_SIDE)
    assert chosen.config.dispatcher == "allgather"
    assert autopar.optimize(k8, "2x8xH100-80GB", _train(), fixed=at, profile=_GPU_SIDE
                            ).config.dispatcher == "alltoall"
    fixed = {"tp": 1, "pp": 1, "ep": 8}
    pinned = autopar.optimize(_MOE, "1x8xH100-80GB", _train(),
                              fixed={**fixed, "dispatcher": "allgather"})
    assert pinned.config.dispatcher == "allgather"
    assert "--moe-token-dispatcher-type allgather" in " ".join(pinned.to_megatron_args().value)


def test_megatron_import_reads_the_dispatcher_and_defaults_to_allgather():
    from autopar.io.megatron_importer import from_megatron_args
    base = "--tensor-model-parallel-size 2 --expert-model-parallel-size 8"
    assert from_megatron_args(base).parallel["dispatcher"] == "allgather"
    assert from_megatron_args(base + " --moe-token-dispatcher-type alltoall"
                              ).parallel["dispatcher"] == "alltoall"
    assert from_megatron_args(base + " --moe-token-dispatcher-type flex"
                              ).parallel["dispatcher"] == "deepep"
    seq = from_megatron_args(base + " --moe-token-dispatcher-type alltoall_seq")
    assert seq.parallel["dispatcher"] == "alltoall"
    assert any("alltoall_seq is not priced" in n for n in seq.notes)
    assert "dispatcher" not in from_megatron_args("--tensor-model-parallel-size 2").parallel


def test_plan_apply_refuses_an_allgather_plan_with_a_fix():
    from autopar.runtime.apply import check_moe
    c = autopar.ParallelConfig(tp=1, dp=4, ep=4, dispatcher="allgather")
    with pytest.raises(UnsupportedPlanError, match="all-to-all only.*Fix: plan with "
                                                   "dispatcher='alltoall'"):
        check_moe(c, [object()])
    check_moe(autopar.ParallelConfig(tp=1, dp=4, ep=4), [object()])   # all-to-all runs


def test_records_take_the_framework_default_when_the_dispatcher_is_null():
    pytest.importorskip("transformers")
    from benchmarks import records, validation
    from tests.test_issue26_records import _rec
    meg = records.parse(_rec(plan={"dispatcher": None}))
    assert "dispatcher" in meg.open_fields and "dispatcher" not in meg.fixed
    assert validation.framework_defaults(meg)["dispatcher"] == "allgather"
    swift = records.parse(_rec(plan={"dispatcher": None}, training={
        "framework": "ms-swift 3.4.0.dev0 Megatron-SWIFT (megatron-core 0.12)"}))
    assert validation.framework_defaults(swift)["dispatcher"] == "alltoall"
    titan = records.parse(_rec(plan={"dispatcher": None},
                               training={"framework": "torchtitan 0.2"}))
    assert validation.framework_defaults(titan).get("dispatcher") == "alltoall"
    stated = records.parse(_rec(plan={"dispatcher": "allgather"}))
    assert stated.fixed["dispatcher"] == "allgather" and "dispatcher" not in stated.open_fields
    assert records.parse(_rec()).fixed["dispatcher"] == "alltoall"
