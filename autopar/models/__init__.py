"""Model descriptions: configs, published presets, and buildable ``nn.Module`` transformers.

``build("llama3-405b")`` gives a meta-device model (shapes only, no memory) for graph extraction;
``build("tiny-gpt", device="cpu", dtype=torch.float32)`` a real, deterministically initialised one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from autopar.errors import InvalidModelConfig
from autopar.models.config import ModelConfig
from autopar.models.presets import PRESETS, Preset, get_config, list_presets
from autopar.models.transformer import Transformer

__all__ = ["ModelConfig", "Preset", "PRESETS", "Transformer", "build", "get_config",
           "list_presets"]


def build(spec: str | Mapping[str, Any] | ModelConfig, *, device: str | torch.device = "meta",
          dtype: torch.dtype = torch.bfloat16, seed: int = 0,
          seq_len: int | None = None) -> Transformer:
    """Build the :class:`Transformer` for a preset name, published-plans model dict or config.

    The module tree is always constructed on the meta device (fast: llama3-405b takes well under a
    second) and cast to ``dtype``; for any other ``device`` the storage is then allocated there and
    filled by :meth:`Transformer.init_weights` with ``seed``, so real builds are deterministic and do
    not pay for torch's default init first. All parameters and buffers end up in ``dtype``.

    ``seq_len`` (tokens) overrides the config's maximum sequence length (the size of the RoPE or
    learned position table); a model must be built with at least the ``seq_len`` it trains on,
    e.g. ``build("llama3-8b", seq_len=plan.train.seq_len)``. None keeps the config's.

    Raises:
        InvalidModelConfig: unknown preset, invalid dict, ``dtype`` not a floating-point dtype,
            or ``seq_len`` not a positive int.
    """
    config = get_config(spec)
    if seq_len is not None and seq_len != config.seq_len:
        # ModelConfig validates the new value (positive int, within MAX_SIZE).
        config = ModelConfig.from_dict({**config.to_dict(), "seq_len": seq_len})
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidModelConfig(f"model {config.name!r}: dtype={dtype!r} is not a floating-point "
                                 "torch.dtype; fix: pass e.g. torch.bfloat16 or torch.float32")
    with torch.device("meta"):
        model = Transformer(config)
    model.to(dtype=dtype)
    device = torch.device(device)
    if device.type != "meta":
        model.to_empty(device=device)
        model.tie_weights()
        model.init_weights(seed)
    return model
