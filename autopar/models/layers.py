"""The layers a decoder block and a mixture-of-experts layer share: RMSNorm, the two MLPs and
the norm choice (:mod:`autopar.models.transformer`, :mod:`autopar.models.moe`).

Shapes: b = batch, s = sequence, h = hidden, f = ffn.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autopar.models.config import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), as in Llama: x / rms(x) * weight.

    ``weight``: [dim], initialised to ones; ``eps`` is added to the mean square. Computes in the
    input dtype. Input [..., dim] -> output of the same shape.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)


class MLP(nn.Module):
    """GPT MLP: ``fc1`` h -> f, exact (erf) GELU as Megatron's default (or squared ReLU,
    ``torch.pow(F.relu(x), 2)`` as Megatron-LM's ``--squared-relu``), ``fc2`` f -> h.

    Input [b, s, h] -> output [b, s, h]; biases iff ``config.bias``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.ffn_hidden_size, bias=config.bias)
        self.fc2 = nn.Linear(config.ffn_hidden_size, config.hidden_size, bias=config.bias)
        self.squared_relu = config.mlp == "squared-relu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        y = torch.pow(F.relu(y), 2) if self.squared_relu else F.gelu(y)
        return self.fc2(y)


class SwiGLU(nn.Module):
    """Gated MLP (Shazeer 2020, arXiv 2002.05202): ``w2(act(w1 x) * w3 x)``; w1 gate and w3 up
    are h -> f, w2 f -> h. ``act`` is SiLU (SwiGLU, Llama) or, for ``mlp="geglu"``, GELU with
    the tanh approximation (GeGLU as Gemma's ``gelu_pytorch_tanh`` and Megatron-Core's fused
    ``bias_geglu``).

    f is ``width`` when given (a shared expert), else ``config.ffn_hidden_size``.
    Input [b, s, h] -> output [b, s, h]; biases iff ``config.bias``.
    """

    def __init__(self, config: ModelConfig, width: int | None = None) -> None:
        super().__init__()
        h, f = config.hidden_size, width or config.ffn_hidden_size
        self.w1 = nn.Linear(h, f, bias=config.bias)
        self.w3 = nn.Linear(h, f, bias=config.bias)
        self.w2 = nn.Linear(f, h, bias=config.bias)
        self.geglu = config.mlp == "geglu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.w1(x)
        gate = F.gelu(gate, approximate="tanh") if self.geglu else F.silu(gate)
        return self.w2(gate * self.w3(x))


def make_norm(config: ModelConfig) -> nn.Module:
    """The norm layer of ``config`` over h features: ``nn.LayerNorm`` (with a bias iff
    ``config.bias``) or :class:`RMSNorm` (weight only)."""
    if config.norm == "rmsnorm":
        return RMSNorm(config.hidden_size, eps=config.norm_eps)
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.bias)
