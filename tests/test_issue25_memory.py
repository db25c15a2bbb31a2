"""Issue 25 items 2-3 on memory: out-of-memory cases and the kind of a published peak in the
record schema, the ``--memory`` report of OOM cases and of runs that ran (margin 0), and
sourced memory mechanisms (pure bf16 training, DeepSpeed's gradient bucket buffer).

Every record used here is a development-split record (benchmarks/data/locked_split.json) or a
copy of one with a field changed; no locked record is estimated."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

import autopar
from autopar.cost.model import CostModel
from autopar.api import as_cluster, model_graph
from autopar.cost.memory import MemoryBreakdown, optimizer_state_bytes_per_param
from autopar.frameworks import get_profile, with_pure_bf16
from autopar.frameworks.memory import DEEPSPEED_MEMORY, TORCH_MEMORY, pure_bf16
from benchmarks import validation
from benchmarks.records import memory_kind, memory_rank, parse

GIB = 2 ** 30
TORCHTUNE = "mem-torchtune-llama3.2-3b-1xa100-packed"


def _estimate(model, cluster, train, cfg, profile):
    """An estimate under ``profile`` through the cost model (a memory option is not one a plan
    records, so autopar.estimate refuses it: see autopar.frameworks.with_pure_bf16)."""
    graph, _ = model_graph(model, train)
    return CostModel(graph, as_cluster(cluster), train, framework=profile).estimate(
        autopar.ParallelConfig(**cfg))


def test_memory_kinds_are_read_from_the_records_words():
    assert memory_kind("peak reserved (torchtitan max_reserved_gib, GiB)") == "reserved"
    assert memory_kind("peak allocated (Megatron mem-max-allocated-bytes, last rank)") \
        == "allocated"
    assert memory_kind("torch.cuda.max_memory_allocated (peak allocated; unit not "
                       "stated)") == "allocated"
    assert memory_kind("peak active bytes (GiB)") == "active"
    assert memory_kind("nvidia-smi memory used") == "device"
    assert memory_kind(None) is None and memory_kind("GPU memory") is None
    assert memory_rank("peak allocated (Megatron mem-max-allocated-bytes, last rank)") == "last"
    assert memory_rank("peak reserved") == "peak" and memory_rank(None) == "peak"


def test_an_oom_record_parses_with_its_fields(dev):
    raw = copy.deepcopy(dev[TORCHTUNE])
    raw["measured"] = {"oom": True, "memory_gib": None, "step_time_s": None,
                       "memory_at_oom_gib": 73.15, "oom_phase": "first backward"}
    raw["training"]["fp8_recipe"] = "tensorwise"
    rec = parse(raw)
    assert rec.oom and not rec.ran
    assert rec.memory_at_oom_gib == 73.15 and rec.oom_phase == "first backward"
    assert rec.fp8_recipe == "tensorwise"
    ran = parse(dev[TORCHTUNE])
    assert ran.ran and not ran.oom and ran.memory_kind == "active"


def test_each_kind_is_compared_with_its_counter():
    b = MemoryBreakdown(10 * GIB, 2 * GIB, 4 * GIB, 8 * GIB, 1 * GIB, 3 * GIB)
    outside = 2e9
    assert b.counted("allocated", outside) == b.counted("active", outside) == 25 * GIB
    assert b.counted("reserved", outside) == b.total - outside
    assert b.counted(None, outside) == b.counted("device", outside) == 28 * GIB
    # reserved never below allocated
    assert MemoryBreakdown(1, 0, 0, 0, 0, 1).counted("reserved", 2e9) == 1
    with pytest.raises(ValueError):
        b.counted("cached", outside)


def test_a_row_compares_the_published_counter_on_the_published_rank(dev):
    row = validation.evaluate(parse(dev["mem-megatron-ci-gpt-7b-8xa100-tp4-pp1-2025-10-21"]),
                              spread=False)
    kinds = dict(row.memory_kinds)
    assert row.memory_as_published() == kinds[("allocated", "last")]
    assert kinds[("allocated", "peak")] < row.memory_gib   # reserved memory not counted


def test_the_memory_report_counts_oom_cases_and_runs_that_ran(dev):
    ran = validation.evaluate(parse(dev[TORCHTUNE]), spread=False)
    raw = copy.deepcopy(dev[TORCHTUNE])
    raw["id"] = "synthetic-oom"
    raw["measured"] = {"oom": True}
    raw["training"].update(global_batch_size=16, micro_batch_size=16)   # 8x the batch
    oom = validation.evaluate(parse(raw), spread=False)
    assert not oom.fits
    lines = validation.memory([ran, oom], None, [("refused-oom", "MoE model not read: x")],
                              [raw, {"id": "refused-oom", "measured": {"oom": True}}])
    assert "OOM cases predicted out of memory: 1 of 1 (1 refused)" in lines
    assert "runs that ran predicted to fit at margin 0: 1 of 1" in lines
    assert any(line.startswith("ok    OOM synthetic-oom") for line in lines)
    assert any(line.startswith("refused OOM refused-oom") for line in lines)
    assert f"memory MAPE {abs(ran.memory_as_published() / 60.0 - 1) * 100:.1f}% over 1 runs" \
        in lines


def test_pure_bf16_keeps_eight_bytes_per_parameter_and_moves_no_time():
    conv = pure_bf16(TORCH_MEMORY)
    assert (conv.weight_bytes, conv.grad_bytes, conv.master_weight_bytes, conv.moment_bytes,
            conv.optimizer_step_temp_bytes) == (2, 2, 0, 2, 2)
    assert optimizer_state_bytes_per_param("adamw", 0, "fp32", 2) == 4
    assert optimizer_state_bytes_per_param("adamw", 4, "fp32") == 12
    assert "zeros_like" in conv.sources["moment_bytes"]
    base = get_profile("inhouse-2024")
    bf16 = with_pure_bf16(base)
    assert bf16.memory.moment_bytes == 2 and base.memory.moment_bytes is None
    train = autopar.TrainingConfig(global_batch_size=2, seq_len=4096, micro_batch_size=2)
    cfg = dict(tp=1, pp=1, dp=1, micro_batch_size=2, zero_stage=0)
    a, b = (_estimate("llama2-7b", "1x1xA100-80GB", replace(train, framework="inhouse-2024"),
                      cfg, p) for p in (base, bf16))
    assert a.step_time_s == b.step_time_s
    states = lambda e: (e.memory_breakdown.weights + e.memory_breakdown.gradients  # noqa: E731
                        + e.memory_breakdown.optimizer_states)
    assert states(b) == pytest.approx(states(a) * 8 / 18, rel=1e-9)


def test_the_torchtune_records_train_in_pure_bf16(dev):
    rec = parse(dev[TORCHTUNE])
    assert validation.conventions(rec).master_weight_bytes == 0
    assert validation.conventions(rec).moment_bytes == 2
    row = validation.evaluate(rec, spread=False)
    assert row.fits      # it ran on an 80 GB A100


def test_deepspeed_holds_its_reduction_bucket_through_backward():
    assert DEEPSPEED_MEMORY.grad_bucket_elements == 500_000_000
    assert "reduce_bucket_size" in DEEPSPEED_MEMORY.sources["grad_bucket_elements"]
    assert TORCH_MEMORY.grad_bucket_elements == 0
    ds = get_profile("deepspeed")
    none = replace(ds, memory=replace(DEEPSPEED_MEMORY, grad_bucket_elements=0))
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096, micro_batch_size=1,
                                   framework="deepspeed")
    for zero in (1, 2, 3):
        cfg = dict(tp=1, pp=1, dp=8, micro_batch_size=1, zero_stage=zero)
        with_b, without = (_estimate("llama2-7b", "1x8xA100-80GB", train, cfg, p)
                           for p in (ds, none))
        assert with_b.step_time_s == without.step_time_s
        assert with_b.memory_breakdown.transient - without.memory_breakdown.transient \
            == pytest.approx(1e9)


def test_fused_losses_keep_bf16_logits():
    foundry, fa = get_profile("llm-foundry").memory, get_profile("flash-attention-training").memory
    assert (foundry.loss_saved_bytes, foundry.loss_work_bytes) == (2, 2)
    assert (fa.loss_saved_bytes, fa.loss_work_bytes) == (2, 0)
    assert TORCH_MEMORY.loss_saved_bytes == 4 and "fused_crossentropy" in \
        foundry.sources["loss_saved_bytes"]
    # the head's saved bytes and the loss's working bytes move by exactly the bytes per logit
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=2048, micro_batch_size=8,
                                   framework="llm-foundry")
    torch_like = replace(get_profile("llm-foundry"), memory=replace(
        foundry, loss_saved_bytes=4, loss_work_bytes=8))
    cfg = dict(tp=1, pp=1, dp=8, micro_batch_size=8, zero_stage=3)
    fused, plain = (_estimate("llama2-7b", "1x8xA100-80GB", train, cfg, p)
                    for p in (get_profile("llm-foundry"), torch_like))
    assert fused.step_time_s == plain.step_time_s
    assert fused.memory_per_gpu_bytes < plain.memory_per_gpu_bytes


@pytest.mark.parametrize("rid", ["llmfoundry-a100-80g-mpt-760m-s2048-g8-mb24-ga2",
                                 "llmfoundry-a100-40g-mpt-125m-s2048-g8-mb26-ga3",
                                 "flashattn-train-gpt3-355m-8xa100"])
def test_published_runs_with_a_fused_loss_fit(dev, rid):
    """They ran: at margin 0 they are predicted to fit (before the fused losses were modelled
    they were predicted at 93, 50 and 100 GiB on 79 / 40 / 79 GiB GPUs)."""
    assert validation.evaluate(parse(dev[rid]), spread=False).fits
