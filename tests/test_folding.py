"""MoE parallel folding (issue 14 item 1): ``ParallelConfig.expert_tp``, the MoE layers' own
mapping etp x ep x expert-dp over the attention's tp x cp x dp ranks (Megatron-Core
parallel_state.py, transformer/moe/README.md "MoE Parallel Folding").

The small MoE is ``hf-tiny-deepseek-v3`` at 64 tokens, one sequence per micro-batch: two MoE
blocks, each with 8 routed experts (top-3) holding 49152 parameters (gate/up 8 x 64 x 64, down
8 x 32 x 64), a shared expert, hidden 64 (bf16: 64 x 64 x 2 = 8192 bytes of block output).
"""

from __future__ import annotations

import json

import pytest


import autopar
from autopar.cost import capacity
from autopar.cost import memory as mem
from autopar.cost.comm import split_expert_tp
from autopar.cost.model import CostModel
from autopar.errors import InvalidParallelConfig
from autopar.graph import extract, hf
from autopar.io.importers import from_megatron_args, from_torchtitan_toml


@pytest.fixture(scope="module")
def tiny():
    return extract(hf.build("hf-tiny-deepseek-v3"), 64, 1, name="tiny-dsv3")


def _cm(graph, spec="1x8xH100", framework="megatron", gbs=16):
    train = autopar.TrainingConfig(global_batch_size=gbs, seq_len=64, framework=framework)
    return CostModel(graph, autopar.Cluster.from_spec(spec), train)


def _cfg(**kw):
    base = dict(tp=2, pp=1, dp=4, cp=1, zero_stage=1, micro_batch_size=1,
                sequence_parallel=True)
    return autopar.ParallelConfig(**{**base, **kw})


def test_expert_tp_equal_to_tp_is_todays_plan():
    assert _cfg(ep=2, expert_tp=2) == _cfg(ep=2)
    assert _cfg(ep=2).expert_tp is None and _cfg(ep=2).etp == 2 and not _cfg(ep=2).folded
    assert _cfg(ep=8, expert_tp=1).folded and _cfg(ep=8, expert_tp=1).etp == 1
    with pytest.raises(InvalidParallelConfig):
        _cfg(expert_tp=0)


def test_the_small_moe_is_what_the_hand_numbers_assume(tiny):
    moe = [layer for layer in tiny.layers if layer.num_experts]
    assert len(moe) == 2
    assert {(layer.num_experts, layer.experts_per_token, layer.expert_parameters,
             layer.output_bytes) for layer in moe} == {(8, 3, 49152, 8192)}
    attn, experts = split_expert_tp(moe[0])
    # the routed experts' collectives: gate/up input and down output, 64 tokens x 3 x 64 x 2 B
    assert experts.tp_row_outputs == (24576,) and experts.tp_column_inputs == (24576,)
    assert sorted(attn.tp_row_outputs) == [8192, 8192]
    assert sorted(attn.tp_column_inputs) == [2048, 4096, 8192]


def test_folded_expert_memory_by_hand(tiny):
    layer = next(layer for layer in tiny.layers if layer.num_experts)
    # experts / (etp * ep): 49152 / (1 * 8); unfolded ep=2 under tp=2: 49152 / (2 * 2)
    assert mem.expert_params_per_rank(layer, 2, 8, 1) == 6144.0
    assert mem.expert_params_per_rank(layer, 2, 2) == 12288.0
    cm = _cm(tiny)
    f8, u2 = cm.stage_layout(cm.resolve(_cfg(ep=8, expert_tp=1)))[0], \
        cm.stage_layout(cm.resolve(_cfg(ep=2)))[0]
    # two MoE blocks: 2 x (12288 - 6144) fewer parameter elements per rank
    assert u2.params - f8.params == 12288.0
    # weights (bf16, 2 B) are not sharded by ZeRO-1
    assert u2.states[0] - f8.states[0] == pytest.approx(2 * 12288.0)
    # ZeRO-1 optimizer states of the experts: over the expert-DP group, tp*cp*dp / (ep*etp):
    # 8 / 8 = 1 rank folded (2 x 6144 elements, all held) vs dp*cp/ep = 2 unfolded
    # (2 x 12288 / 2): the same bytes
    assert f8.states[2] == pytest.approx(u2.states[2])
    # folded ep=4, etp=1: 4-way shards over an expert-DP group of 2, as unfolded ep=2, etp=tp=2
    f4 = cm.stage_layout(cm.resolve(_cfg(ep=4, expert_tp=1)))[0]
    assert f4.params == u2.params and f4.states == u2.states


def test_folded_communication_by_hand(tiny):
    cm = _cm(tiny)
    moe = next(i for i, layer in enumerate(tiny.layers) if layer.num_experts)
    fold = cm.resolve(_cfg(ep=8, expert_tp=1))
    plain = cm.resolve(_cfg(ep=2))
    bf, bp = cm.block_cost(moe, "none", fold), cm.block_cost(moe, "none", plain)
    # SP over tp=2: each reduce-scatter / all-gather puts half its message on the wire per GPU;
    # the attention's collectives (rows 8192, 8192; columns 4096, 2048, 8192), forward and
    # backward: 2 x (8192 + 8192 + 4096 + 2048 + 8192) / 2
    assert bf.tp_bytes == pytest.approx(30720.0)
    # unfolded, the routed experts' 24576-byte row output and column input ride the same group
    assert bp.tp_bytes == pytest.approx(30720.0 + 4 * 24576 / 2)
    # etp = 1: no expert-TP collectives. The all-to-all: 64 tokens / tp (SP) x 3 copies x 64 x 2
    # = 12288 bytes, (ep - 1) / ep of it leaves each rank, 4 times (dispatch and combine,
    # forward and backward). Megatron-Core's dispatcher also all-to-alls the rows'
    # probabilities (32 tokens x 3 copies x 2 bytes, forward and its gradient back) and
    # all-gathers the int64 counts of the 8 experts over the etp x ep ranks, forward only
    probs = 32 * 3 * 2
    # routed rows and their probabilities: the busiest EP rank's under random routing of 32
    # tokens a call (capacity.random_routing_scale: 1.116 at ep 8, 1.036 at ep 2)
    s8, s2 = (capacity.random_routing_scale(32, 3, 8, ep) for ep in (8, 2))
    assert cm.group("ep", fold).ranks == tuple(range(8))
    assert bf.ep_bytes == pytest.approx(((4 * 12288 + 2 * probs) * s8 + 8 * 8 * 8) * 7 / 8)
    assert cm.group("ep", plain).ranks == (0, 2)
    assert bp.ep_bytes == pytest.approx((4 * 12288 + 2 * probs) * s2 / 2 + 4 * 8 * 8 * 3 / 4)


def test_folded_expert_tp_collectives_by_hand(tiny):
    cm = _cm(tiny)
    moe = next(i for i, layer in enumerate(tiny.layers) if layer.num_experts)
    # tp=4 attention, etp=2 experts over ep=4: the expert-TP group is ranks (0, 1), the EP group
    # ranks 0, 2, 4, 6 of the stage
    c = cm.resolve(_cfg(tp=4, dp=2, ep=4, expert_tp=2))
    assert cm.group("etp", c).ranks == (0, 1)
    assert cm.group("ep", c).ranks == (0, 2, 4, 6)
    bc = cm.block_cost(moe, "none", c)
    # attention over tp=4: 3/4 of each message on the wire; experts over etp=2 on etp / tp of
    # the routed bytes (24576 x 2/4 = 12288), half on the wire, 4 collectives
    assert bc.tp_bytes == pytest.approx(2 * 30720 * 3 / 4 + 4 * 12288 / 2)


def test_folded_compute_keeps_flops_and_changes_the_expert_gemm_shape(tiny):
    cm = _cm(tiny)
    moe = next(i for i, layer in enumerate(tiny.layers) if layer.num_experts)
    a = cm.layer_time(moe, 1, 2, 1, True)
    b = cm.layer_time(moe, 1, 2, 1, True, etp=1)
    assert cm.layer_time(moe, 1, 2, 1, True, etp=2) == a
    assert a.fwd_flops == b.fwd_flops and a.bwd_flops == b.bwd_flops
    assert a.fwd_s != b.fwd_s   # (M, N / 2) at tp=2 vs (M / 2, N) at etp=1


def test_folding_rules():
    g = extract(hf.build("hf-tiny-deepseek-v3"), 64, 1, name="tiny-dsv3")
    cm = _cm(g)
    with pytest.raises(InvalidParallelConfig, match="divid"):   # ep*etp = 16 over 8 ranks
        cm.resolve(_cfg(ep=8, expert_tp=2, tp=4, dp=2))
    with pytest.raises(InvalidParallelConfig, match="sequence"):
        cm.resolve(_cfg(ep=8, expert_tp=1, sequence_parallel=False))
    # frameworks: Megatron any etp, torchtitan 1 or tp, plain torch and DeepSpeed etp = tp
    from autopar.frameworks import get_profile
    folded = _cfg(ep=8, expert_tp=1)
    assert get_profile("megatron").unsupported(folded) is None
    assert get_profile("torchtitan").unsupported(folded.replace(zero_stage=2)) is None
    assert "expert_tp" in get_profile("torchtitan").unsupported(
        _cfg(tp=4, dp=2, ep=2, expert_tp=2, zero_stage=2))
    assert "expert_tp" in get_profile("torch").unsupported(folded)
    assert "expert_tp" in get_profile("deepspeed").unsupported(folded.replace(
        sequence_parallel=False))


def test_search_finds_a_folded_plan_when_it_is_faster():
    """Qwen3-30B-A3B (128 experts of width 768, top-8) on 8 H100, Megatron: with the experts'
    TP equal to the attention's, every routed token's 8 copies are all-gathered and
    reduce-scattered over TP, and expert parallelism cannot exceed dp. Folding (etp = 1, ep over
    the TP and CP ranks) drops that traffic, so on a TP mesh the search picks it, faster than
    the best plan without folding there under the same cost model. (Over all meshes a plan
    without TP now comes within 0.3% of it: since each expert GEMM is priced on one local
    expert's rows, ep 4 without TP is as fast.)"""
    g = extract(hf.build("hf-qwen3-30b-a3b"), 4096, 1, name="qwen3-30b-a3b")
    cm = CostModel(g, autopar.Cluster.from_spec("1x8xH100"),
                   autopar.TrainingConfig(global_batch_size=64, seq_len=4096,
                                          framework="megatron"))
    from autopar.search.optimize import search
    folded = search(cm, {"tp": 4}, top_k=1).best
    plain = search(cm, {"tp": 4, "expert_tp": None}, top_k=1).best
    assert folded.config.folded and not plain.config.folded
    assert folded.config.ep > folded.config.dp   # beyond EP <= DP
    assert folded.step_time_s < plain.step_time_s
    # and under plain torch (etp = tp only) the search never folds
    torch_cm = CostModel(g, autopar.Cluster.from_spec("1x8xH100"),
                         autopar.TrainingConfig(global_batch_size=64, seq_len=4096))
    assert not search(torch_cm, {"tp": 2, "pp": 1}, top_k=1).best.config.folded


def _plan(graph_module, cluster, train, config):
    e = autopar.estimate(graph_module, cluster, train, config)
    return autopar.Plan(config=e.config, estimate=e, model="hf-tiny-deepseek-v3",
                        cluster=cluster.name, train=train)


def test_exports_round_trip_expert_tp():
    module = hf.build("hf-tiny-deepseek-v3")
    cluster = autopar.Cluster.from_spec("1x8xH100")
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=64, framework="megatron")
    plan = _plan(module, cluster, train, _cfg(ep=8, expert_tp=1))
    ex = plan.to_megatron_args()
    i = ex.value.index("--expert-tensor-parallel-size")
    assert ex.value[i + 1] == "1"
    back = from_megatron_args(ex.value)
    assert (back.parallel["ep"], back.parallel["expert_tp"]) == (8, 1)
    assert autopar.ParallelConfig(**{k: back.parallel[k] for k in ("tp", "ep", "expert_tp")}) \
        .expert_tp == 1
    # unfolded: no flag; Megatron's default (tp) reads back as None
    plain = _plan(module, cluster, train, _cfg(ep=2))
    assert "--expert-tensor-parallel-size" not in plain.to_megatron_args().value
    back = from_megatron_args(plain.to_megatron_args().value)
    assert autopar.ParallelConfig(tp=back.parallel["tp"], ep=back.parallel["ep"],
                                  expert_tp=back.parallel.get("expert_tp")).expert_tp is None
    # torchtitan: etp always written (its default is 1, not tp) and read back
    titan = autopar.TrainingConfig(global_batch_size=16, seq_len=64, framework="torchtitan")
    for cfg, etp in ((_cfg(ep=8, expert_tp=1, zero_stage=2), 1), (_cfg(ep=2, zero_stage=2), 2)):
        p = _plan(module, cluster, titan, cfg)
        ex = p.to_torchtitan_toml()
        doc = __import__("tomllib").loads(ex.text())
        assert doc["parallelism"]["expert_tensor_parallel_degree"] == etp
        imp = from_torchtitan_toml(ex.text())
        assert (imp.parallel["ep"], imp.parallel["expert_tp"]) == (cfg.ep, etp)
        assert autopar.ParallelConfig(tp=2, ep=cfg.ep, expert_tp=etp).expert_tp == cfg.expert_tp


def test_plan_files_keep_expert_tp_and_version_2_loads():
    module = hf.build("hf-tiny-deepseek-v3")
    cluster = autopar.Cluster.from_spec("1x8xH100")
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=64, framework="megatron")
    plan = _plan(module, cluster, train, _cfg(ep=8, expert_tp=1))
    d = json.loads(plan.to_json())
    assert d["version"] >= 3 and d["config"]["expert_tp"] == 1
    old = json.loads(_plan(module, cluster, train, _cfg(ep=2)).to_json())
    old["version"] = 2
    for cfg in (old["config"], old["estimate"]["config"]):
        del cfg["expert_tp"]
    from autopar.io.planfile import check_plan
    assert check_plan(old)["config"].expert_tp is None


def test_exporters_without_folding_say_so():
    module = hf.build("hf-tiny-deepseek-v3")
    cluster = autopar.Cluster.from_spec("1x8xH100")
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=64, framework="megatron")
    ex = _plan(module, cluster, train, _cfg(ep=8, expert_tp=1)).to_deepspeed_config()
    assert ex.written.expert_tp is None
    assert any("MoE parallel folding" in w for w in ex.warnings)
    # torchtitan runs etp 1 or tp: etp=2 under tp=4 is written as tp
    ex = _plan(module, cluster, train, _cfg(tp=4, dp=2, ep=2, expert_tp=2)).to_torchtitan_toml()
    assert __import__("tomllib").loads(ex.text())["parallelism"][
        "expert_tensor_parallel_degree"] == 4
    assert ex.written.expert_tp is None and any("1 or tp" in w for w in ex.warnings)
