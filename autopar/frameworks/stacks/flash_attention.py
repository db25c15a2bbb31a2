"""``flash-attention-training``: the training code of the flash-attention repository (2022,
``training/``: PyTorch Lightning DDP with FlashAttention v1). Costed as the torch profile with
FlashAttention-1; capabilities as the torch profile."""

from __future__ import annotations

from dataclasses import replace

from ..choices import AttentionKernels, Choices, capabilities_of, compose
from . import pytorch

FLASH_V1 = AttentionKernels(
    name="flash-attn-v1", summary="FlashAttention v1 (flash_attn 0.x CUDA kernels)",
    attention_kernels={"*": "fa1"}, sources={
        "attention_kernels": "flash-attention v1 training code (training/, 2022): the "
                             "FlashAttention-1 kernels of the repository"})

CHOICES: Choices = replace(pytorch.CHOICES, attention=FLASH_V1)

PROFILE = compose(CHOICES, **capabilities_of(pytorch.PROFILE), name="flash-attention-training",
                  version="flash-attention training code (Lightning DDP, FlashAttention v1), "
                          "2022")
