"""A model built on ``nn.MultiheadAttention`` is refused with a fix rather than priced as if its
projections and attention cost nothing (a new user's report of 2026-12-07: 40% faster than the
same shapes written with SDPA)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autopar


class _Block(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Linear(d, d)

    def forward(self, x):
        y = self.norm(x)
        return x + self.attn(y, y, y)[0] + self.mlp(y)


class _LM(nn.Module):
    def __init__(self, d: int = 64, h: int = 4, layers: int = 2, vocab: int = 128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(_Block(d, h) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def test_multihead_attention_is_refused_naming_the_module_and_the_fix():
    with torch.device("meta"):
        model = _LM()
    with pytest.raises(autopar.AutoparError,
                       match=r"blocks\.0\.attn is a MultiheadAttention.*Fix: .*"
                             r"scaled_dot_product_attention"):
        autopar.estimate(model, "1x8xH100", autopar.TrainingConfig(global_batch_size=8,
                                                                   seq_len=32),
                         autopar.ParallelConfig(tp=1, pp=1, dp=8))
