"""``tinyllama``: TinyLlama's lit-gpt fork (2023) on Lightning Fabric's FSDP strategy (FSDP1,
:mod:`.fsdp1`) with hand-fused kernels. Capabilities as the torch profile."""

from __future__ import annotations

from dataclasses import replace

from ..choices import Choices, Fusion, compose
from ..vocabulary import DEFAULT_COST_SOURCES
from . import fsdp1, pytorch

LIT_GPT_FUSED = Fusion(
    name="lit-gpt-fused", summary="fused RMSNorm, SwiGLU, rotary and cross entropy",
    fusion="fused", eager_parts=(), sources={
        "fusion": "TinyLlama README 'Blazingly Fast' (2023): fused layernorm, fused swiglu, "
                  "fused cross entropy and fused rotary embedding from xformers and "
                  "flash-attn (lit_gpt/fused_rotary_embedding.py, lit_gpt/rmsnorm.py)",
        "eager_parts": DEFAULT_COST_SOURCES["eager_parts"]})

CHOICES: Choices = replace(fsdp1.CHOICES, fusion=LIT_GPT_FUSED)

PROFILE = compose(CHOICES, **pytorch.borrowed_capabilities(), name="tinyllama",
                  version="TinyLlama (lit-gpt fork, Lightning Fabric FSDP), 2023")
