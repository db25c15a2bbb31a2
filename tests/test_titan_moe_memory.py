"""torchtitan's memory under op-level selective checkpointing of a mixture of experts and under
a compiled loss (issue 26: the xiao-hu/torchtitan Qwen3-30B-A3B records, predicted 2.4-3x their
reserved peak before): routed expert GEMMs run as ``torch._grouped_mm``, which no save list
holds, and a compiled cross entropy keeps the bf16 logits instead of fp32 log-probabilities."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autopar.cost import memory as mem
from autopar.frameworks import get_profile, with_compiled_loss
from autopar.frameworks.stacks.torchtitan import COMPILED_LOSS_SINCE
from benchmarks import validation
from benchmarks.compiled_loss import OUT
from benchmarks.records import parse

TITAN_EP4 = "moe2-titanfork-qwen3-30b-a3b-8xh200-exp6-ep4-lbs6-s8192-sac-compile"


def _record(rid: str):
    return parse(next(r for r in validation.load_corpus() if r["id"] == rid))


@pytest.fixture(scope="module")
def moe_block():
    rec = _record(TITAN_EP4)
    graph, _ = validation.model_graph(rec.model, validation.training(rec))
    return next(layer for layer in graph.layers if layer.kind == "block")


def test_op_sac_neither_keeps_nor_counts_grouped_expert_gemms(moe_block):
    ops = moe_block.ops
    experts = [i for i, o in enumerate(ops) if o.kind == "matmul" and o.moe_role == "expert"]
    plain = [i for i, o in enumerate(ops) if o.kind == "matmul" and o.moe_role != "expert"]
    assert len(experts) == 2 and len(plain) == 5    # up+gate, down; q, k, v, o, router gate
    saved = mem.op_sac_saved(moe_block)
    assert not set(experts) & set(saved)
    # every other plain matmul from the first on (q, v, router gate), and the attention
    attention = [i for i, o in enumerate(ops) if o.kind == "attention"]
    assert saved == tuple(sorted(plain[0::2] + attention))
    kept = mem.op_sac_bytes(moe_block, micro_batch=1, tp=1, cp=1, sequence_parallel=False)
    assert kept == pytest.approx(moe_block.activations.layer_input
                                 + sum(ops[i].bytes_written for i in saved))


def test_under_tp_an_moe_block_keeps_one_reduce_scatter_of_its_output(moe_block):
    """Sequence parallelism's reduce-scatter outputs are saved (reduce_scatter_tensor is in the
    save list): the attention output projection's and the MoE module's combined output, once at
    [tokens, hidden] / tp, not the routed expert GEMM's top_k copies (torchtitan's
    PrepareModuleInputOutput on the MoE module). The titanfork tp4 records were 22-26% heavy
    before."""
    ops = moe_block.ops
    tp = 4
    sp = mem.op_sac_bytes(moe_block, micro_batch=1, tp=tp, cp=1, sequence_parallel=True)
    layer_input = moe_block.activations.layer_input
    dense_rows = [o for o in ops if o.tp_role == "row" and o.moe_role != "expert"]
    assert len(dense_rows) == 1      # the attention output projection
    scattered = sum(o.bytes_written for o in dense_rows) / tp + layer_input / tp
    # the saved ops under sequence parallelism: row-parallel outputs whole, the rest / tp
    saved = sum(ops[i].bytes_written / (1 if ops[i].tp_role == "row" else tp)
                for i in mem.op_sac_saved(moe_block))
    assert sp == pytest.approx(layer_input / tp + saved + scattered)
    expert_out = next(o for o in ops if o.moe_role == "expert" and o.tp_role == "row")
    assert expert_out.bytes_written > 4 * layer_input   # top_k copies: what is no longer kept


def test_compiled_loss_keeps_the_logits_in_their_dtype():
    base = get_profile("torchtitan")
    assert (base.memory.loss_saved_bytes, base.memory.loss_work_bytes) == (4, 8)
    p = with_compiled_loss(base, "a test")
    assert (p.memory.loss_saved_bytes, p.memory.loss_work_bytes) == (2, 2)
    assert "compiled_loss.py" in p.memory.sources["loss_saved_bytes"]
    assert p.name == base.name and p.fusion == base.fusion


def test_compiled_loss_convention_is_what_was_measured():
    # benchmarks/compiled_loss.py on this machine's CPU, torch 2.13 Inductor: the compiled loss
    # keeps 2 bytes a logit (eager 4) and its code allocates one logit-sized bf16 buffer
    data = json.loads(Path(OUT).read_text())
    p = with_compiled_loss("torchtitan", "a test")
    assert data["compiled_saved_bytes_per_logit"] == pytest.approx(
        p.memory.loss_saved_bytes, abs=0.01)
    assert data["eager_saved_bytes_per_logit"] == pytest.approx(
        get_profile("torchtitan").memory.loss_saved_bytes, abs=0.01)
    assert data["compiled_logit_sized_buffers"] == ["bfloat16"]
    assert p.memory.loss_work_bytes == 2


@pytest.mark.parametrize("rid, compiled_loss", [
    (TITAN_EP4, True),   # torchtitan 2025-12, compiled
    ("moe2-titanfork-qwen3-30b-a3b-8xh200-exp1-tp4-ep2-etp4-lbs2-s4096-fullac-eager", False),
    # torchtitan 2025-01 compiled: before COMPILED_LOSS_SINCE the loss stayed eager
    ("mem-float8nocompile-llama3-8b-8xh100-seq4096-noac-fp8-compile", False),
    # the model eager, the loss compiled (training.loss_compiled: compile.components ["loss"])
    ("new4-titan1610-dsv3-16b-8xh100-fsdp8-ep8-lbs8-sacop-sdpa", True),
    ("mem-oom-titan-dsv3-16b-8xh100-80gb-default-toml", True)])
def test_records_run_the_loss_their_torchtitan_ran(rid, compiled_loss):
    prof = validation.record_profile(_record(rid))
    assert (prof.memory.loss_saved_bytes == 2) is compiled_loss
    assert COMPILED_LOSS_SINCE == "2025-04-02"


def test_a_compiled_loss_alone_changes_the_head_memory_only():
    rec = _record("new4-titan1610-dsv3-16b-8xh100-fsdp8-ep8-lbs8-sacop-sdpa")
    assert rec.loss_compiled and rec.torch_compile is False
    prof = validation.record_profile(rec)
    assert prof.fusion == get_profile("torchtitan").fusion      # the model stays eager
    raw = {**rec.raw, "training": {k: v for k, v in rec.raw["training"].items()
                                   if k != "loss_compiled"}}
    assert validation.record_profile(parse(raw)).memory.loss_saved_bytes == 4
