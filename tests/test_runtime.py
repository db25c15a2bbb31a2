"""Runtime equivalence: a plan applied with gloo on several CPU processes trains like one process.

Each case takes a plan from ``autopar.optimize`` with ``fixed=`` shapes, applies it in N forked
ranks (heavy imports done once here, in the parent; FileStore rendezvous; 60 s timeout, see
docs/reference/platform.md) and checks three Adam steps against full-batch single-process training:
the same losses, and parameters within 1e-5.
"""

from __future__ import annotations

import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import autopar
from autopar.runtime import apply, lm_loss

STEPS, GBS, SEQ, LR = 3, 8, 32, 1e-4
TOL = 1e-5
TIMEOUT_S = 60
TRAIN = autopar.TrainingConfig(global_batch_size=GBS, seq_len=SEQ, precision="fp32",
                               optimizer="adam")

#: name -> (world size, fixed= choices)
CASES = {
    "dp4": (4, dict(dp=4, tp=1, pp=1, zero_stage=0, micro_batch_size=1)),
    "tp2xdp2-fsdp2": (4, dict(tp=2, dp=2, pp=1, zero_stage=2, sequence_parallel=False)),
    "tp2-sp": (2, dict(tp=2, dp=1, pp=1, sequence_parallel=True, micro_batch_size=4)),
    "pp2xtp2-1f1b": (4, dict(pp=2, tp=2, dp=1, schedule="1f1b", micro_batch_size=2,
                             sequence_parallel=True)),
    "pp2xdp2-fsdp3": (4, dict(pp=2, dp=2, tp=1, zero_stage=3, schedule="1f1b",
                              micro_batch_size=1, stage_blocks=(1, 3))),
    "pp2xdp2xtp2-recompute": (8, dict(pp=2, dp=2, tp=2, zero_stage=1, schedule="1f1b",
                                      micro_batch_size=1, sequence_parallel=False,
                                      recompute=("full", "selective", "none", "full"))),
    "pp2-interleaved-v2": (2, dict(pp=2, dp=1, tp=1, virtual_stages=2,
                                   schedule="interleaved-1f1b", micro_batch_size=2)),
}


def _plan(case: str) -> autopar.Plan:
    world, fixed = CASES[case]
    return autopar.optimize("tiny-llama", autopar.Cluster.custom(1, world, "A100-80GB"), TRAIN,
                            fixed=fixed)


def _build(family: str) -> torch.nn.Module:
    if family == "autopar":
        return autopar.models.build("tiny-llama", device="cpu", dtype=torch.float32, seed=0)
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=SEQ, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).float()


def _logits(model, ids):
    out = model(ids)
    return out if torch.is_tensor(out) else out.logits


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, 256, (GBS, SEQ + 1), generator=g)
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


@pytest.fixture(scope="module", params=["autopar", "hf"])
def reference(request):
    """(family, data, losses, final parameters) of one process training on the full batch."""
    if request.param == "hf":
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, data = _build(request.param), _data()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for x, y in data:
        loss = lm_loss(_logits(model, x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return request.param, data, torch.tensor(losses), params


def _worker(rank, world, store_path, plan, family, data, ref_losses, ref_params):
    torch.set_num_threads(1)  # 8 ranks share 2 cores
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    try:
        run = apply(plan, _build(family), lr=LR)
        losses = torch.tensor([run.step(x, y) for x, y in data])
        diff = (losses - ref_losses).abs().max().item()
        assert diff <= TOL, f"rank {rank}: losses {losses.tolist()} vs {ref_losses.tolist()}"
        params = run.full_state_dict()
        assert params, f"rank {rank} holds no parameters"
        for name, p in params.items():
            d = (p - ref_params[name]).abs().max().item()
            assert d <= TOL, f"rank {rank}: {name} differs by {d:.3g}"
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, fn, *args) -> None:
    """Run ``fn(rank, world, store_path, *args)`` in ``world`` forked ranks; re-raise a rank's
    failure; fail after :data:`TIMEOUT_S`."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        ctx = mp.start_processes(fn, args=(world, store, *args), nprocs=world, join=False,
                                 start_method="fork")
        deadline = time.monotonic() + TIMEOUT_S
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                pytest.fail(f"ranks did not finish within {TIMEOUT_S} s")


@pytest.mark.parametrize("case", list(CASES))
def test_plan_trains_like_one_process(case, reference):
    family, data, ref_losses, ref_params = reference
    plan = _plan(case)
    run_ranks(plan.world_size, _worker, plan, family, data, ref_losses, ref_params)
