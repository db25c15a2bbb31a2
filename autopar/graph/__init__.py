"""Extraction: an ``nn.Module`` (meta device is fine) -> :class:`ModelGraph` of layers and ops,
with FLOPs, bytes moved, activation and parameter sizes (see docs/graph.md).

``extract(model, seq_len)`` traces with torch.fx and falls back to torch.export for models fx
cannot trace (Hugging Face models).
"""

from .trace import extract
from .types import Layer, ModelGraph, Op

__all__ = ["extract", "ModelGraph", "Layer", "Op"]
