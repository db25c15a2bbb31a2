"""Issue 26: published MoE runs parse into autopar inputs, and what autopar does not price is
refused with its reason; a grouped expert GEMM is priced per local expert."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.cost.model import CostModel  # noqa: E402
from autopar.problem import model_graph  # noqa: E402
from benchmarks import records, validation  # noqa: E402

_MOE = {
    "id": "m", "source": "Report A 2025, Table 1", "source_quote": "'step 1.0 s'",
    "model": {"name": "moe-tiny", "family": "moe", "num_layers": 4, "hidden_size": 256,
              "num_heads": 4, "num_kv_heads": 4, "ffn_hidden_size": 512, "vocab_size": 1024,
              "seq_len": 256, "tied_embeddings": False, "num_experts": 8, "top_k": 2,
              "moe_ffn_hidden_size": 128, "num_shared_experts": None, "first_dense_layers": 1,
              "head_dim": None},
    "cluster": {"gpu": "H100-SXM5-80GB", "num_gpus": 8, "gpus_per_node": 8},
    "training": {"global_batch_size": 16, "micro_batch_size": 1, "precision": "bf16",
                 "optimizer": "adam", "flash_attention": True, "framework": "megatron-lm (2025)"},
    "plan": {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "ep": 4, "etp": None, "virtual_stages": None,
             "sequence_parallel": False, "recompute": "none", "zero_stage": 1, "schedule": None,
             "dispatcher": "alltoall", "capacity_factor": None},
    "measured": {"step_time_s": 1.0},
}


def _rec(**sections) -> dict:
    """``_MOE`` with the given sections' keys replaced, e.g. ``_rec(plan={"ep": 2})``."""
    r = copy.deepcopy(_MOE)
    for section, values in sections.items():
        r[section].update(values)
    return r


def test_moe_record_parses_with_its_expert_mapping():
    rec = records.parse(_rec())
    m = rec.model
    assert (m.family, m.num_experts, m.top_k, m.moe_ffn_hidden_size) == ("llama", 8, 2, 128)
    assert (m.num_shared_experts, m.first_dense_layers) == (0, 1)   # null: none
    assert rec.fixed["ep"] == 4 and "expert_tp" not in rec.fixed   # Megatron: etp = tp
    assert "ep" not in rec.open_fields
    titan = records.parse(_rec(training={"framework": "torchtitan (2025)"}))
    assert titan.fixed["expert_tp"] == 1 and "etp" in dict(titan.assumed)
    assert records.parse(_rec(plan={"etp": 2, "tp": 2, "dp": 4})).fixed["expert_tp"] == 2


def test_an_unpublished_network_is_the_librarys_default_node_of_that_size():
    # two nodes of 4 H200 with the fabric unpublished: the board's NICs, one per GPU at most
    # (catalog.Box.nics, as Cluster.from_spec builds "2x4xH200-SXM-141GB"), not the 8 of a
    # full HGX board
    rec = records.parse(_rec(cluster={"gpu": "H200-SXM-141GB", "num_gpus": 8,
                                      "gpus_per_node": 4, "inter_node": None}))
    assert rec.cluster.nics_per_node == 4
    assert rec.cluster.nics_per_node == autopar.Cluster.from_spec(
        "2x4xH200-SXM-141GB").nics_per_node
    assert "inter_node" in dict(rec.assumed)


@pytest.mark.parametrize("change, reason", [
    ({"dispatcher": "flex/hybridep"}, "'flex/hybridep' token dispatcher"),
])
def test_what_autopar_does_not_price_is_refused(change, reason):
    with pytest.raises(records.RecordError, match="not modelled") as err:
        records.parse(_rec(plan=change))
    assert reason in str(err.value)
    assert records.parse(_rec(model={"mtp_layers": 1})).model.mtp_layers == 1


def test_capacity_factor_record_parses_into_the_training_config():
    """Token dropping is priced (autopar.cost.capacity): the record's factor, and padding only
    where it says so (Megatron-Core's default is off)."""
    train = records.parse(_rec(plan={"capacity_factor": 1.0})).train
    assert (train.moe_capacity_factor, train.moe_pad_to_capacity) == (1.0, False)
    padded = records.parse(_rec(plan={"capacity_factor": 2.0, "pad_to_capacity": True})).train
    assert (padded.moe_capacity_factor, padded.moe_pad_to_capacity) == (2.0, True)
    assert records.parse(_rec()).train.moe_capacity_factor is None


def test_optimizer_state_dtype_is_read_from_the_record():
    """training.optimizer_state_dtype (DeepSeek-V3's BF16 AdamW moments, arXiv 2412.19437
    section 3.3.3): absent or null is fp32."""
    assert records.parse(_rec()).train.optimizer_state_dtype == "fp32"
    bf16 = records.parse(_rec(training={"optimizer_state_dtype": "bf16"})).train
    assert bf16.optimizer_state_dtype == "bf16"
    dsv3 = next(r for r in validation.load_corpus() if r.get("id") == "b-deepseek-v3-2048gpu")
    assert records.parse(dsv3).train.optimizer_state_dtype == "bf16"
    assert "track the first and second moments" in dsv3["source_quote"]


def test_dualpipev_record_takes_its_two_chunks():
    rec = records.parse(_rec(plan={"pp": 2, "dp": 4, "schedule": "dualpipev"}))
    assert validation.framework_defaults(rec)["virtual_stages"] == 2


def test_expert_gemm_efficiency_reads_one_local_experts_rows():
    """Fewer experts per rank (more EP) means more rows per expert GEMM: the same expert
    FLOPs take less time at ep 8 (one expert per rank) than at ep 1 (eight), even with the
    busiest rank's excess rows of random routing (capacity.random_routing_scale), and the
    default (the search's bound: balanced rows, one expert's GEMM) is the fastest."""
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=256)
    model = {k: v for k, v in _MOE["model"].items() if v is not None}
    graph, _ = model_graph({**model, "family": "llama"}, train)
    cm = CostModel(graph, autopar.Cluster.from_spec("1x8xH100-80GB"), train)
    moe = next(b.index for b in graph.blocks if b.num_experts)
    t1, t8, bound = (cm.layer_time(moe, 1, 1, 1, False, ep=e) for e in (1, 8, None))
    assert t8.fwd_flops > t1.fwd_flops == bound.fwd_flops
    assert t1.fwd_s > t8.fwd_s > bound.fwd_s


def _published(rid: str) -> dict:
    from benchmarks.validation import load_corpus
    return next(r for r in load_corpus() if isinstance(r, dict) and r.get("id") == rid)


def test_mixtral_8x7b_megatron_report_within_15_percent():
    """The one Mixtral report of issue 26 that traces to a public, not held-out source
    (benchmarks/data/moe_reports.md): step time within 15% under Megatron-LM's defaults, with
    Megatron-Core's host rate fitted without this source (benchmarks.host_rate.loso_rate).
    Before the rate was priced: 3.604 s (-34.9%); at the first rule's 189 us: ~9.1 s (+65%)."""
    rec = records.parse(_published("moer-mlm756-mixtral8x7b-h100-16gpu-tp2-ep8"))
    assert rec.measured_step_s == pytest.approx(5.539)
    row = validation.evaluate(rec, spread=False)
    assert row.predicted_s == pytest.approx(rec.measured_step_s, rel=0.15)


def test_an_expert_parallelism_that_does_not_divide_the_experts_says_so():
    pytest.importorskip("transformers")
    with pytest.raises(autopar.AutoparError, match=r"ep=3 does not divide the model's 4 experts"
                                                   r".*ep in \[1, 2, 4\]"):
        autopar.optimize("hf-tiny-mixtral", "1x8xH100",
                         autopar.TrainingConfig(global_batch_size=16, seq_len=32),
                         fixed=dict(ep=3))


def test_mixtral_report_is_host_bound_and_its_own_rate_reproduces_it():
    """What autopar says of Megatron-LM #756: under Megatron-Core's per-kernel host rate its
    step is host-bound (a third or more of it host time), and the grid rate its own run alone
    gives (benchmarks/data/host/stack_host_rates.json) prices it within 2% of the measured
    5.539 s: the mechanism fits the run."""
    from benchmarks import host_rate
    rec = records.parse(_published("moer-mlm756-mixtral8x7b-h100-16gpu-tp2-ep8"))
    row = validation.evaluate(rec, spread=False)
    assert row.host_share > 1 / 3
    own = host_rate._load()["sources"][records.source_key(rec.raw)]["rate_s"]
    assert 80e-6 < own < 200e-6
    mine = validation.evaluate(rec, spread=False, host_rate=own)
    assert mine.predicted_s == pytest.approx(rec.measured_step_s, rel=0.02)
