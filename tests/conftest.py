"""Shared fixtures: small graphs and clusters extracted once per session."""

from __future__ import annotations

import pytest

import autopar
from autopar.api import model_graph


@pytest.fixture(scope="session")
def graph_7b():
    """llama2-7b at seq 4096, bf16, flash attention."""
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096)
    return model_graph("llama2-7b", train)[0]


@pytest.fixture(scope="session")
def graph_gpt22b_unfused():
    """Korthikanti's 22B GPT (48 x 6144, 64 heads) at seq 2048 with unfused attention."""
    cfg = {"name": "gpt-22b", "family": "gpt", "num_layers": 48, "hidden_size": 6144,
           "num_heads": 64, "vocab_size": 51200, "seq_len": 2048}
    train = autopar.TrainingConfig(global_batch_size=4, seq_len=2048, flash_attention=False)
    return model_graph(cfg, train)[0]


@pytest.fixture(scope="session")
def dense_or_tiny_moe():
    """``make(kind, cfg)``: the CostModel of the dense model dict ``cfg`` (kind "dense") or of
    a tiny DeepSeek-V3 (kind "moe": dense then MoE blocks, expert parallelism) on 16
    A100-40GB, global batch 64 x 4096 tokens: memory binds for part of the space."""
    from autopar.cost.model import CostModel

    def make(kind: str, cfg: dict) -> CostModel:
        train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096)
        if kind == "dense":
            graph = model_graph(cfg, train)[0]
        else:
            pytest.importorskip("transformers")
            from autopar.graph import extract, hf
            graph = extract(hf.build("hf-tiny-deepseek-v3"), 4096, 1)
        return CostModel(graph, autopar.Cluster.from_spec("2x8xA100-40GB"), train)
    return make
