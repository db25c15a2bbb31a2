"""Field inputs of issue 13 (memory side): published or well-known outcomes the memory model must
reproduce, each through ``autopar.estimate`` with an explicit configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import autopar
from autopar import ParallelConfig, TrainingConfig
from autopar.errors import InvalidTrainingConfig
from autopar.hardware.devices import get_device

GIB = 2 ** 30
DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"


def test_unfused_attention_7b_micro_batch_16_runs_out_of_memory():
    """Llama 2 7B, 8 A100-80GB, ZeRO-3, micro-batch 16 x 4096, full recompute, no flash: the
    fp32 score tensor of one layer alone is 16 x 32 x 4096^2 x 4 bytes = 32 GiB."""
    train = TrainingConfig(global_batch_size=128, seq_len=4096, micro_batch_size=16,
                           flash_attention=False)
    e = autopar.estimate("llama2-7b", "1x8xA100-80GB", train,
                         ParallelConfig(dp=8, zero_stage=3, recompute="full", micro_batch_size=16))
    assert not e.fits
    # the working memory of one recomputed layer holds more than the fp32 scores
    assert e.memory_breakdown.transient > 32 * GIB
    # the same run with flash attention fits
    flash = autopar.estimate("llama2-7b", "1x8xA100-80GB",
                             TrainingConfig(global_batch_size=128, seq_len=4096,
                                            micro_batch_size=16),
                             ParallelConfig(dp=8, zero_stage=3, recompute="full",
                                            micro_batch_size=16))
    assert flash.fits


@pytest.mark.parametrize("local_batch, recompute, fits", [
    (1, "selective-op", True), (2, "selective-op", False), (2, "full", True)])
def test_llama2_70b_torchtitan_fsdp_64_gpus(local_batch, recompute, fits):
    """Llama 2 70B on 64 A100-80GB, FSDP, seq 4096, torchtitan: op-level SAC fits at local
    batch 1 and not at 2; full checkpointing fits at 2."""
    train = TrainingConfig(global_batch_size=64 * local_batch, seq_len=4096,
                           micro_batch_size=local_batch, framework="torchtitan")
    e = autopar.estimate("llama2-70b", "8x8xA100-80GB", train,
                         ParallelConfig(dp=64, zero_stage=3, recompute=recompute,
                                        micro_batch_size=local_batch))
    assert e.fits is fits


@pytest.mark.parametrize("offload, fits", [(False, False), (True, True)])
def test_llama3_8b_zero2_one_gpu_fits_only_with_optimizer_offload(offload, fits):
    """Llama 3 8B, Adam, ZeRO-2 on one A100-80GB: the optimizer states alone (12 bytes x 8B)
    exceed the GPU; with them offloaded to the CPU it fits."""
    train = TrainingConfig(global_batch_size=1, seq_len=8192, micro_batch_size=1,
                           optimizer="adam", optimizer_offload=offload, framework="deepspeed")
    e = autopar.estimate("llama3-8b", "1x1xA100-80GB", train,
                         ParallelConfig(dp=1, zero_stage=2, recompute="full", micro_batch_size=1))
    assert e.fits is fits
    assert (e.memory_breakdown.optimizer_states == 0) is offload


def _record(rid: str):
    from benchmarks.records import parse
    from benchmarks.validation import corpus_files
    for f in corpus_files():   # the record files (not locked_split.json)
        for r in json.loads(f.read_text()):
            if r["id"] == rid:
                return parse(r)
    raise KeyError(rid)


def test_llama31_405b_torchtitan_pipeline_keeps_parameters_unsharded():
    """Llama 3.1 405B, TP8 PP8 FSDP8, torchtitan: under PP, FSDP keeps each stage's bf16
    parameters and fp32 gradients unsharded across micro-batches (6 bytes per stage parameter),
    so the memory is far above the 16 bytes / 8 of fully sharded states."""
    from benchmarks import validation
    rec = _record("torchtitan-llama3.1-405b-512xh100-tp8pp8fsdp8-1f1b")
    row = validation.evaluate(rec, spread=False)
    assert row.fits
    stage_params = 405e9 / 64
    assert row.memory_gib * GIB > 6 * stage_params
    # still under the published 82.5 GiB (about -31%): the remaining gap is open, not tuned away
    assert 0.6 < row.memory_gib / 82.5 < 1.0


def test_llama31_405b_interleaved_uses_less_memory_than_1f1b():
    """torchtitan (2024-12) measured 82.5 GiB under 1F1B and 72.7 GiB under interleaved 1F1B.
    Under PP, FSDP keeps a stage's fp32 gradients unsharded from its first backward until its
    last (torch.distributed.pipelining stage.py, FSDP2 to_accumulated_grad_if_needed). A 1F1B
    rank's single stage starts its backward when its activations peak; an interleaved rank's
    earlier stage has not, so its gradients are not yet there (held_chunks_at_peak)."""
    from benchmarks import validation
    one = validation.evaluate(_record("torchtitan-llama3.1-405b-512xh100-tp8pp8fsdp8-1f1b"),
                              spread=False)
    inter = validation.evaluate(
        _record("torchtitan-llama3.1-405b-512xh100-tp8pp8fsdp8-interleaved-1f1b"), spread=False)
    assert inter.memory_gib < one.memory_gib


def test_interleaved_rank_holds_only_its_later_chunks_gradients_at_its_peak():
    """Llama 3.1 405B, TP8 PP8 FSDP8, 8 micro-batches of 4, torchtitan: the unsharded bytes on
    rank 0 are the bf16 parameters of both its chunks (2 bytes) plus the fp32 gradients (4) of
    its later chunk only; under 1F1B all 6 bytes of its one chunk."""
    from benchmarks import validation
    from autopar.api import model_graph
    from autopar.cost.model import CostModel
    rec = _record("torchtitan-llama3.1-405b-512xh100-tp8pp8fsdp8-interleaved-1f1b")
    train = validation.training(rec)
    cm = CostModel(model_graph(rec.model, train)[0], rec.cluster, train,
                   framework=validation.record_profile(rec),
                   conventions=validation.conventions(rec))
    base = dict(tp=8, pp=8, dp=8, zero_stage=3, recompute="full", sequence_parallel=True,
                micro_batch_size=4)
    inter = cm.stage_layout(cm.resolve(ParallelConfig(**base, schedule="interleaved-1f1b",
                                                      virtual_stages=2)))[0]
    one = cm.stage_layout(cm.resolve(ParallelConfig(**base, schedule="1f1b")))[0]
    assert one.gather_bytes == pytest.approx(6 * one.params)
    _layers, mine, _groups, chunks = cm.rank_layers(8, cm.resolve(ParallelConfig(
        **base, schedule="interleaved-1f1b", virtual_stages=2)).stage_blocks,
        "interleaved-1f1b")[0]
    from autopar.cost.memory import layer_params_per_rank
    later = sum(layer_params_per_rank(cm.graph.layers[i], 8) for i in chunks[mine[1]])
    assert inter.gather_bytes == pytest.approx(2 * inter.params + 4 * later, rel=1e-6)
    # the last rank's head (its chunk holds one micro-batch at the peak, the rank's first
    # chunk eight): the head's log-probabilities count once, not at the rank's mean of 4.5
    last = cm.stage_layout(cm.resolve(ParallelConfig(**base, schedule="interleaved-1f1b",
                                                     virtual_stages=2)))[7]
    head = [li for li in last.layers if cm.graph.layers[li].kind == "head"]
    assert last.flight == 4.5 and [last.flight_of(li) for li in head] == [1.0]


def test_visible_capacity_is_what_torch_reports():
    """An "80 GB" A100 shows 79.25 GiB to torch (its OOM message's "total capacity")."""
    dev = get_device("A100-SXM4-80GB")
    assert dev.visible_memory_bytes == pytest.approx(79.25 * GIB)
    assert dev.visible_memory_bytes < dev.memory_bytes + 6e9
    e = autopar.estimate("tiny-llama", "1x8xA100-80GB",
                         TrainingConfig(global_batch_size=8, seq_len=256),
                         ParallelConfig(dp=8))
    assert e.memory_limit_bytes == dev.visible_memory_bytes


def test_bf16_optimizer_states_take_less_memory():
    base = dict(global_batch_size=8, seq_len=1024, micro_batch_size=1)
    cfg = ParallelConfig(dp=8, zero_stage=1)
    fp32 = autopar.estimate("llama3-8b", "1x8xA100-80GB", TrainingConfig(**base), cfg)
    bf16 = autopar.estimate("llama3-8b", "1x8xA100-80GB",
                            TrainingConfig(**base, optimizer_state_dtype="bf16"), cfg)
    # Adam moments 8 -> 4 bytes, master copy kept: K 12 -> 8
    assert bf16.memory_breakdown.optimizer_states == pytest.approx(
        fp32.memory_breakdown.optimizer_states * 8 / 12)
    with pytest.raises(InvalidTrainingConfig, match="optimizer_state_dtype"):
        TrainingConfig(**base, optimizer_state_dtype="fp16")


def test_megatron_keeps_fp32_main_grads_and_fp8_weight_copies():
    cfg = ParallelConfig(tp=8, dp=1, zero_stage=1, sequence_parallel=True, micro_batch_size=1)
    kw = dict(global_batch_size=1, seq_len=2048, micro_batch_size=1)
    torch_ = autopar.estimate("llama3-8b", "1x8xH100-80GB", TrainingConfig(**kw), cfg)
    mega = autopar.estimate("llama3-8b", "1x8xH100-80GB",
                            TrainingConfig(**kw, framework="megatron"), cfg)
    assert mega.memory_breakdown.gradients == pytest.approx(
        2 * torch_.memory_breakdown.gradients)
    bf16 = autopar.estimate("llama3-8b", "1x8xH100-80GB",
                            TrainingConfig(**kw, framework="megatron"), cfg)
    fp8 = autopar.estimate("llama3-8b", "1x8xH100-80GB",
                           TrainingConfig(**kw, framework="megatron", precision="fp8"), cfg)
    assert fp8.memory_per_gpu_bytes > bf16.memory_per_gpu_bytes


def test_op_sac_keeps_less_than_selective_and_more_than_full():
    train = TrainingConfig(global_batch_size=8, seq_len=2048, micro_batch_size=1)
    acts = {}
    for mode in ("none", "selective", "selective-op", "full"):
        e = autopar.estimate("llama2-7b", "1x8xA100-80GB", train,
                             ParallelConfig(dp=8, zero_stage=3, recompute=mode,
                                            micro_batch_size=1))
        acts[mode] = (e.memory_breakdown.activations, e.step_time_s)
    assert acts["full"][0] < acts["selective-op"][0] < acts["selective"][0] < acts["none"][0]
    # op SAC recomputes more than the attention core, less than the whole block
    assert acts["selective"][1] < acts["selective-op"][1] < acts["full"][1]


def test_offloaded_optimizer_pays_the_pcie_round_trip():
    """ZeRO-Offload moves every gradient to the host and every updated parameter back: at least
    (2 + 2) bytes per parameter over PCIe Gen4 x16 (32e9 B/s) for Llama 3 8B on one A100, about
    1 s, where the on-GPU step takes 0.25 s (DeepSpeed's FusedAdam, clipping and mixed-precision
    copies: 52 bytes per parameter at HBM speed; the offloaded step was costed as free)."""
    kw = dict(global_batch_size=1, seq_len=8192, micro_batch_size=1, optimizer="adam",
              framework="deepspeed")
    cfg = ParallelConfig(dp=1, zero_stage=2, recompute="full", micro_batch_size=1)
    on = autopar.estimate("llama3-8b", "1x1xA100-80GB", TrainingConfig(**kw, optimizer_offload=True),
                          cfg)
    off = autopar.estimate("llama3-8b", "1x1xA100-80GB", TrainingConfig(**kw), cfg)
    params = 8.03e9
    assert on.time_breakdown.optimizer >= 0.99 * params * 4 / 32e9
    assert on.time_breakdown.optimizer > 3 * off.time_breakdown.optimizer
