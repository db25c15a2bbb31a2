"""Issue 26: Megatron-Core's selective recompute by submodule (--recompute-modules) and the
embedding / loss counted as pipeline layers (--account-for-*-in-pipeline-split).

Byte values are the tensors Megatron-Core's checkpoints drop, from the shapes of a tiny Qwen3-style
MoE (b = 1, s = 256, h = 256, 8 experts top-2 of width 128, bf16): the expert activation's output
is the second expert GEMM's input, s k f x 2 bytes; the pre-MLP norm's output s h x 2 bytes.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.cost import memory as mem  # noqa: E402
from autopar.cost.model import CostModel  # noqa: E402
from autopar.cost.selective import block_parts, module_recompute  # noqa: E402
from autopar.io.importers import from_megatron_args  # noqa: E402
from autopar.models import ModelConfig  # noqa: E402
from autopar.problem import model_graph  # noqa: E402
from autopar.runtime.export import to_megatron_args  # noqa: E402
from benchmarks import validation  # noqa: E402
from benchmarks.records import DEFAULT_PLANS, parse  # noqa: E402

S, H, K, F = 256, 256, 2, 128
MOE = dict(name="tiny-qwen3-moe", family="llama", num_layers=4, hidden_size=H, num_heads=4,
           num_kv_heads=2, head_dim=64, vocab_size=512, seq_len=S, ffn_hidden_size=512,
           num_experts=8, top_k=K, moe_ffn_hidden_size=F, qk_norm=True)
TRAIN = autopar.TrainingConfig(global_batch_size=64, seq_len=S, framework="megatron")
MOE_RECORDS = DEFAULT_PLANS.parent / "published_runs_moe.json"


@pytest.fixture(scope="module")
def moe_graph():
    return model_graph(ModelConfig.from_dict(MOE), TRAIN)[0]


@pytest.fixture(scope="module")
def xtuner():
    return {r["id"]: r for r in json.loads(MOE_RECORDS.read_text())
            if r["id"].startswith("moe-xtuner-qwen3-235b")}


def test_modules_are_stored_one_way():
    c = autopar.ParallelConfig(recompute="selective", recompute_modules=["layernorm", "moe_act"])
    assert c.recompute_modules == ("moe_act", "layernorm")   # Megatron's order
    # the default (the attention core): one spelling, None
    assert autopar.ParallelConfig(recompute="selective",
                                  recompute_modules=("core_attn",)).recompute_modules is None
    assert autopar.ParallelConfig(recompute="selective").selective_modules == ("core_attn",)
    with pytest.raises(autopar.InvalidParallelConfig, match="mamba"):
        autopar.ParallelConfig(recompute="selective", recompute_modules=("mamba",))


def test_each_module_drops_the_tensors_its_checkpoint_frees(moe_graph):
    block = moe_graph.blocks[0]
    parts = block_parts(block)
    # Qwen3 attention: the input norm is fused into the QKV linear (TE spec), the MoE layer's
    # pre-MLP norm is a module of its own
    assert parts.input_norm is None and parts.pre_mlp_norm is not None
    act = module_recompute(block, ("moe_act",))
    assert (act.seq, act.tp, act.core) == (0, S * K * F * 2, 0)
    assert not act.dispatch and len(act.ops) == 2      # the GLU product and its cast
    norm = module_recompute(block, ("layernorm",))
    assert (norm.seq, norm.tp) == (S * H * 2, 0) and norm.ops == (parts.pre_mlp_norm,)
    # the whole MoE layer: everything its ops saved but its input (the norm's output), which
    # "layernorm" drops too; the dispatch all-to-alls run again
    moe = module_recompute(block, ("moe",))
    both = module_recompute(block, ("moe", "layernorm"))
    assert moe.dispatch and both.seq - moe.seq == S * H * 2 and both.tp == moe.tp
    assert moe.tp >= act.tp and moe.seq + moe.tp < block.activations.total
    # the attention core alone is Korthikanti's selective recompute, as autopar priced it
    core = module_recompute(block, ("core_attn",))
    kw = dict(micro_batch=1.0, tp=2, cp=1, sequence_parallel=True)
    assert core.dropped_bytes(**kw) == pytest.approx(
        mem.block_activation_bytes(block, "none", **kw)
        - mem.block_activation_bytes(block, "selective", **kw))


def test_dense_mlp_module_keeps_only_its_input():
    dense = {k: v for k, v in MOE.items() if k not in ("num_experts", "top_k",
                                                       "moe_ffn_hidden_size")}
    block = model_graph(ModelConfig.from_dict({**dense, "name": "tiny-dense"}), TRAIN)[0].blocks[0]
    mlp = module_recompute(block, ("mlp",))
    # fc1's input (the norm's output, s h) and the gate/up output and GLU product (3 s f)
    assert (mlp.seq, mlp.tp) == (S * H * 2, 3 * S * 512 * 2)
    assert module_recompute(block, ("moe_act",)).tp == 0     # no experts: nothing to drop


def test_modules_order_time_and_memory(moe_graph):
    # without Megatron-Core's counts' all-gather, which a recompute repeats whole, not x 1.5
    # (tests/test_issue26_alltoall_metadata.py)
    prof = autopar.frameworks.get_profile("megatron").with_costs(
        {"moe_counts_gather": "test"}, moe_counts_gather=False)
    cm = CostModel(moe_graph, autopar.Cluster.custom(1, 8, "H100-80GB"), TRAIN, framework=prof)
    base = dict(tp=2, pp=1, dp=4, ep=4, sequence_parallel=True, zero_stage=1,
                micro_batch_size=1)
    est = {name: cm.estimate(autopar.ParallelConfig(**base, **kw)) for name, kw in (
        ("none", dict(recompute="none")),
        ("select", dict(recompute="selective", recompute_modules=("moe_act", "layernorm"))),
        ("moe", dict(recompute="selective", recompute_modules=("moe", "layernorm"))),
        ("full", dict(recompute="full")))}
    order = ["none", "select", "moe", "full"]
    times = [est[n].step_time_s for n in order]
    acts = [est[n].memory_breakdown.activations for n in order]
    assert times == sorted(times) and acts == sorted(acts, reverse=True)
    # the MoE recompute repeats the dispatch and combine forward: 1.5 x the all-to-all time
    assert est["moe"].time_breakdown.ep_comm == pytest.approx(
        1.5 * est["none"].time_breakdown.ep_comm)


def test_only_megatron_runs_module_recompute_and_its_export_reads_back(moe_graph):
    plan = dict(tp=1, pp=1, dp=8, ep=4, recompute="selective",
                recompute_modules=("moe_act", "layernorm"))
    cluster = autopar.Cluster.custom(1, 8, "H100-80GB")
    with pytest.raises(autopar.AutoparError, match="recompute the modules"):
        autopar.optimize(MOE, cluster, autopar.TrainingConfig(global_batch_size=64, seq_len=S),
                         fixed=plan)
    p = autopar.optimize(MOE, cluster, TRAIN, fixed=plan)
    assert "recompute=selective[moe_act+layernorm]" in p.summary()
    args = to_megatron_args(p).value
    i = args.index("--recompute-modules")
    assert args[i - 1] == "selective" and args[i + 1:i + 3] == ["moe_act", "layernorm"]
    back = from_megatron_args(" ".join(["--num-layers", "4", *args]))
    assert back.parallel["recompute_modules"] == ("moe_act", "layernorm")
    # plan files: version 4 and later keep the modules; a version-3 file (no such key) loads
    # as the attention core
    d = json.loads(p.to_json())
    assert d["version"] >= 4 and d["config"]["recompute_modules"] == ["moe_act", "layernorm"]
    assert autopar.Plan.from_json(p.to_json()).config.recompute_modules == ("moe_act",
                                                                             "layernorm")
    d["version"] = 3
    for cfg in (d["config"], d["estimate"]["config"]):
        del cfg["recompute_modules"], cfg["vp_group"]
    from autopar.io.planfile import check_plan
    assert check_plan(d)["config"].recompute_modules is None


def test_xtuner_records_count_embedding_and_loss_as_layers(xtuner):
    """94 layers over pp32 x vpp3 = 96 chunks: the first chunk holds the embedding only, the
    last the loss only (Megatron-LM get_num_layers_to_build with both account-for flags)."""
    deep = parse(xtuner["moe-xtuner-qwen3-235b-256xh800-tp2-ep8-pp32-vpp3-mbs4-full"])
    assert deep.fixed["stage_blocks"] == (0,) + (1,) * 94 + (0,)
    pp8 = parse(xtuner["moe-xtuner-qwen3-235b-256xh800-tp2-ep8-pp8-select"])
    assert pp8.fixed["stage_blocks"] == (11,) + (12,) * 6 + (11,)
    assert pp8.fixed["recompute_modules"] == ("moe_act", "layernorm")


def test_xtuner_moe_recompute_record_is_estimated(xtuner):
    """tp1 ep8 pp32 vpp3 with --recompute-modules moe layernorm, 22.946 s measured."""
    rec = parse(xtuner["moe-xtuner-qwen3-235b-256xh800-tp1-ep8-pp32-vpp3-mbs1-moerecompute"])
    row = validation.evaluate(rec, spread=False)
    assert row.fits and abs(row.error) < 0.10


def test_plan_apply_refuses_module_recompute():
    from types import SimpleNamespace

    from autopar.runtime.errors import UnsupportedPlanError
    from autopar.runtime.validate import check_plan
    plan = SimpleNamespace(config=autopar.ParallelConfig(
        dp=8, ep=4, recompute="selective", recompute_modules=("moe",)), train=TRAIN)
    with pytest.raises(UnsupportedPlanError, match="to_megatron_args"):
        check_plan(plan)


def test_mla_up_proj_drops_the_query_key_value_the_attention_saved(mixed, moe_graph):
    """Megatron-Core's "mla_up_proj" (multi_latent_attention.py recompute_up_proj) frees the
    up projections' outputs once the attention core ran: what the attention op saved less its
    output; with the query / key-value norms fused into the up projections inside the
    checkpoint (Transformer Engine spec), the up projections' saved inputs (the normed
    latents) go too. The norms, up projections and rotary ops run again, the down
    projections do not. A block without latent attention, or one that recomputes the
    attention core already, drops nothing more."""
    from autopar.cost.selective import ModuleRecompute, module_recompute
    cm, _ = mixed
    block = next(b for b in cm.graph.blocks if b.num_experts)
    att = block_parts(block).attention[0]
    saved = sum(n for name, part, n in block.saved_by_op
                if name == block.ops[att].name and part != "core")
    ups = {o.name for o in block.ops[:att] if o.kind == "matmul" and o.tp_role}
    up_in = sum(n for name, part, n in block.saved_by_op if name in ups and part != "core")
    assert len(ups) == 2 and up_in > 0
    r = module_recompute(block, ("mla_up_proj",))
    assert r.seq + r.tp == pytest.approx(saved - block.ops[att].bytes_written + up_in)
    assert r.linear_seq + r.linear_tp == pytest.approx(up_in)   # Linear inputs among them
    assert r.tp > 0 and r.core == 0
    again = [block.ops[i] for i in r.ops]
    assert all(i < att for i in r.ops)
    assert any(o.kind == "matmul" and o.tp_role == "column" for o in again)   # up projections
    assert sum(o.kind == "norm" for o in again) == 2                         # their norms
    assert not any(o.kind == "matmul" and not o.tp_role for o in again)      # not the down ones
    both = module_recompute(block, ("core_attn", "mla_up_proj"))
    assert both.tp == module_recompute(block, ("core_attn",)).tp
    plain = moe_graph.blocks[0]   # grouped-query attention: nothing to drop
    assert module_recompute(plain, ("mla_up_proj",)) == ModuleRecompute()


def test_fp8_checkpointed_linear_input_goes_at_its_fp8_bytes(moe_graph):
    """Under FP8 a Linear keeps its input as an FP8 copy (Megatron: 1 byte per element,
    MemoryConventions.fp8_input_saved_bytes); "moe_act" checkpoints the expert activation and
    frees the second expert GEMM's input with that copy: the activations fall by s k f x 1
    byte, not by the bf16 tensor (s k f x 2) the graph counts."""
    act = module_recompute(moe_graph.blocks[0], ("moe_act",))
    assert (act.linear_seq, act.linear_tp) == (0, S * K * F * 2)
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=S, framework="megatron",
                                   precision="fp8")
    cm = CostModel(moe_graph, autopar.Cluster.custom(1, 8, "H100-80GB"), train)
    index = next(i for i, layer in enumerate(moe_graph.layers) if layer.num_experts)
    base = dict(tp=1, pp=1, dp=8, ep=4, zero_stage=1, micro_batch_size=1)

    def kept(**kw):
        c = cm.resolve(autopar.ParallelConfig(**base, **kw))
        return cm.block_cost(index, c.recompute, c).act_bytes

    dropped = kept(recompute="none") - kept(recompute="selective", recompute_modules=("moe_act",))
    assert dropped == pytest.approx(S * K * F * 1)
