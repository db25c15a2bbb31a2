"""Named stack options (autopar.frameworks.options): the variants the validation corpus selects
from a record's text, selectable by a user too (--stack-option), recorded in plan files."""

from __future__ import annotations

import json

import pytest

import autopar
from autopar.cli import main
from autopar.errors import InvalidTrainingConfig
from autopar.frameworks import get_profile, profile_edits
from autopar.frameworks.options import STACK_OPTIONS, with_options

#: A framework each option applies to.
_FOR = {"torch-compile": "torch", "cuda-graphs": "megatron", "flash-attn-3": "torch", "hsdp": "fsdp1",
        "foreach-adamw": "torchtitan", "float8nocompile": "torchtitan",
        "replicated-qk-norm": "torchtitan", "fp32-reduce": "torch",
        "sac-redispatch": "torchtitan",
        "alltoall-2024": "megatron", "deepspeed-0.3": "deepspeed",
        "megatron-v1-model": "deepspeed", "llama3-fsdp": "inhouse-2024", "pithtrain": "fsdp1"}


@pytest.mark.parametrize("name", sorted(STACK_OPTIONS))
def test_every_option_edits_cost_fields_a_plan_file_records(name):
    stock = get_profile(_FOR[name])
    edited = with_options(stock, [name], gpus_per_node=8)
    edits = profile_edits(edited)      # cost fields only: would raise otherwise
    assert edits and all(e["source"] for e in edits.values())


def test_an_unknown_or_foreign_option_is_refused_with_the_ones_that_apply():
    with pytest.raises(InvalidTrainingConfig, match="not one autopar knows.*torch-compile"):
        with_options(get_profile("megatron"), ["turbo"], 8)
    with pytest.raises(InvalidTrainingConfig, match="Did you mean 'cuda-graphs'"):
        with_options(get_profile("megatron"), ["cuda-graph"], 8)
    with pytest.raises(InvalidTrainingConfig, match="is for torchtitan, not megatron.*"
                                                    "alltoall-2024"):
        with_options(get_profile("megatron"), ["foreach-adamw"], 8)


def test_the_cli_applies_notes_and_saves_them(capsys, tmp_path):
    common = ["--model", "tiny-llama", "--cluster", "1x8xH100", "--global-batch", "16",
              "--seq-len", "32", "--framework", "torchtitan"]
    f = tmp_path / "p.json"
    assert main(["plan", *common, "--stack-option", "torch-compile", "--out", str(f)]) == 0
    err = " ".join(capsys.readouterr().err.split())   # notes go to stderr
    assert "stack option torch-compile" in err
    edits = json.loads(f.read_text())["profile_edits"]
    assert edits["fusion"]["value"] == "compile"
    plan = autopar.Plan.from_json(f)     # the option travels with the plan
    assert plan.profile_edits == edits


def test_hybrid_sharding_shards_the_states_within_its_group():
    # PithTrain distributed.py "hsdp": non-expert states sharded over cp x ep, experts over cp;
    # autopar: dense over min(dp x cp, group), experts over group / ep (here 8 / 8 = 1)
    from autopar.api import model_graph
    from autopar.cost.model import CostModel
    moe = dict(name="hsdp-moe", family="llama", num_layers=2, hidden_size=256, num_heads=4,
               num_kv_heads=2, vocab_size=512, seq_len=128, ffn_hidden_size=512, num_experts=16,
               top_k=2, moe_ffn_hidden_size=256)
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=128, framework="fsdp1")
    graph = model_graph(moe, train)[0]
    cluster = autopar.Cluster.from_spec("2x8xH100")
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=16, ep=8, zero_stage=3, micro_batch_size=1)
    full = CostModel(graph, cluster, train)
    hsdp = CostModel(graph, cluster, train,
                     framework=with_options(get_profile("fsdp1"), ["hsdp"], 8))
    assert full.states.zero_groups(full.resolve(cfg)) == (16, 2)
    assert hsdp.states.zero_groups(hsdp.resolve(cfg)) == (8, 1)
    a, b = full.estimate(cfg).memory_breakdown, hsdp.estimate(cfg).memory_breakdown
    assert b.optimizer_states > a.optimizer_states and b.weights > a.weights


def test_the_pithtrain_option_prices_what_the_corpus_prices_for_a_pithtrain_run():
    """--stack-option pithtrain sets the same cost fields the validation corpus applies to a
    PithTrain record (stacks.pithtrain.with_pithtrain_fsdp / with_pithtrain_kernels), minus the
    memory conventions a plan file cannot carry."""
    from autopar.frameworks.stacks.pithtrain import with_pithtrain_fsdp, with_pithtrain_kernels
    chosen = with_options(get_profile("fsdp1"), ["pithtrain"], 8)
    option = profile_edits(chosen)
    corpus = with_pithtrain_kernels(with_pithtrain_fsdp(get_profile("fsdp1")))
    assert option["fusion"]["value"] == "compile"
    assert option["zero3_pp_root_regather"]["value"] is True
    assert option["grad_reduce_bytes"]["value"] == 4
    assert all(getattr(corpus, field) == getattr(chosen, field) for field in option)
    assert corpus.memory.pp_unsharded_bytes == 6


def test_flash_attention_3_speeds_up_hopper_attention_only():
    """flash-attn-3 prices FA3 (FlashAttention-3 paper: Hopper-only kernels) on an H100 and
    leaves an A100 at SDPA's FA2; at 16k tokens the attention share makes it visible."""
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=16384)
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=1,
                                 recompute="full")
    stock = get_profile("torch")
    fa3 = with_options(stock, ["flash-attn-3"], gpus_per_node=8)
    assert fa3.attention_kernel("hopper") == "fa3" and fa3.attention_kernel("ampere") == "fa2"
    assert stock.attention_kernel("hopper") == "fa2"
    hop = [autopar.estimate("llama3-8b", "1x8xH100", train, cfg, profile=p).step_time_s
           for p in (stock, fa3)]
    assert hop[1] < 0.95 * hop[0]
    amp = [autopar.estimate("llama3-8b", "1x8xA100-80GB", train, cfg, profile=p).step_time_s
           for p in (stock, fa3)]
    assert amp[1] == pytest.approx(amp[0], rel=1e-12)


def test_a_record_names_flash_attention_3_or_is_refused():
    from benchmarks.records import RecordError, parse
    from benchmarks.validation import attention_kernel, load_corpus
    raw = next(r for r in load_corpus()
               if r.get("id") == "trl-qwen3-30b-a3b-16xh100-fsdp2-dp16-16k-fa3-groupedmm-window")
    assert attention_kernel(parse(raw)) == "fa3"
    bad = json.loads(json.dumps(raw))
    bad["training"]["attention_kernel"] = "fa4"
    with pytest.raises(RecordError, match="attention_kernel 'fa4' is not one a record can name"):
        parse(bad)
