"""FSDP's fp32 gradient reduction as a stack option (``fp32-reduce``) and as a record states it
(``training.grad_reduce_dtype``); a trainer on stock FSDP2 priced as FSDP2, not FSDP1."""

import json

import pytest

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.frameworks import get_profile
from autopar.frameworks.options import with_options
from autopar.frameworks.stacks.pytorch import with_fp32_reduce
from benchmarks.records import RecordError, parse
from benchmarks.validation import DATA_DIR, profile_name, record_profile

_LM = dict(name="fp32-reduce-lm", family="llama", num_layers=2, hidden_size=256, num_heads=4,
           num_kv_heads=4, ffn_hidden_size=512, vocab_size=1024, seq_len=128)


def _dp_bytes(profile, zero_stage):
    cluster = autopar.Cluster.from_spec("2x8xH100")
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=128, precision="bf16")
    graph, _ = model_graph(_LM, train)
    cm = CostModel(graph, cluster, train, framework=profile)
    e = cm.estimate(autopar.ParallelConfig(dp=16, zero_stage=zero_stage, micro_batch_size=1))
    return sum(c.nbytes for c in e.comm_by_link if c.link == "infiniband")


def test_fp32_reduce_doubles_the_gradient_part_of_the_traffic_only():
    stock = get_profile("torch")
    fp32 = with_options(stock, ["fp32-reduce"], gpus_per_node=8)
    assert stock.grad_reduce_bytes is None and fp32.grad_reduce_bytes == 4
    assert "reduce_dtype=torch.float32" in fp32.cost_sources["grad_reduce_bytes"]
    # ZeRO-0: one gradient all-reduce, 2 -> 4 bytes; ZeRO-3: parameters gathered twice in bf16
    # (forward, backward) plus the gradient reduce-scatter, 2 + 2 + 2 -> 2 + 2 + 4 bytes
    assert _dp_bytes(fp32, 0) == pytest.approx(2 * _dp_bytes(stock, 0), rel=1e-9)
    assert _dp_bytes(fp32, 3) == pytest.approx(_dp_bytes(stock, 3) * 8 / 6, rel=1e-9)


def _moe2(rid):
    raw = json.loads((DATA_DIR / "published_runs_moe2.json").read_text())
    return next(r for r in raw if r["id"] == rid)


def test_an_fsdp2_trainer_record_is_priced_as_stock_fsdp2_reducing_in_fp32():
    raw = _moe2("moe2-kempnerforge-e8-top2-8xh200-fsdp8-fullac-packed")
    rec = parse(raw)
    assert "FSDP2" in rec.framework and rec.grad_reduce_dtype == "fp32"
    assert profile_name(rec) == "torch"
    profile = record_profile(rec)
    assert profile.grad_reduce_bytes == 4 and profile.fsdp2_copies
    # without the field, the stack's default (torch MixedPrecisionPolicy: the param dtype)
    plain = parse({**raw, "training": {k: v for k, v in raw["training"].items()
                                        if k != "grad_reduce_dtype"}})
    assert record_profile(plain).grad_reduce_bytes is None


def test_a_reduce_dtype_autopar_does_not_read_is_refused():
    raw = _moe2("moe2-kempnerforge-e8-top2-8xh200-fsdp8-fullac-packed")
    with pytest.raises(RecordError, match="grad_reduce_dtype 'bf16' is not read"):
        parse({**raw, "training": {**raw["training"], "grad_reduce_dtype": "bf16"}})


def test_pithtrain_keeps_its_own_fsdp2_loop():
    raw = json.loads((DATA_DIR / "published_runs_moe.json").read_text())
    raw = next(r for r in raw if "pithtrain" in r["id"])
    rec = parse(raw)
    assert profile_name(rec) == "fsdp1"
    assert record_profile(rec).grad_reduce_bytes == 4
    assert with_fp32_reduce(get_profile("fsdp1")).grad_reduce_bytes == 4
