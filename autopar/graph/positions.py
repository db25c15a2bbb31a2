"""Say when a training sequence is longer than the model's positions.

The cost model prices any sequence length, but a model has a number of positions it was built
or trained for (``ModelConfig.seq_len``, Hugging Face ``config.max_position_embeddings``).
The warning rides on the graph (:attr:`ModelGraph.warnings`), so every estimate of it, and every
plan loaded from a file, carries it.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from .types import ModelGraph


def max_positions(module: nn.Module) -> tuple[int | None, str]:
    """A Hugging Face model's ``config.max_position_embeddings`` (None when it has none) and
    its position kind: "learned" when an embedding table has that many rows (GPT-2's ``wpe``),
    else "rope"."""
    cfg = getattr(module, "config", None)
    limit = getattr(cfg, "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return None, "rope"
    vocab = getattr(cfg, "vocab_size", None)
    learned = any(isinstance(m, nn.Embedding) and m.num_embeddings == limit != vocab
                  for m in module.modules())
    return limit, "learned" if learned else "rope"


def with_position_warning(graph: ModelGraph, limit: int | None, position: str,
                          grown: bool = False) -> ModelGraph:
    """``graph`` with a warning when its sequence is longer than the model's ``limit``
    positions: a learned table (GPT-style) cannot index past its rows (a preset's is costed
    ``grown`` to the sequence: a different model than the one named); rotary positions (RoPE)
    run past the limit, on positions the model was not trained on."""
    if limit is None or graph.seq_len <= limit:
        return graph
    if position == "learned" and grown:
        what = (f"its learned position table is costed with {graph.seq_len} rows, so this is a "
                f"larger model than {graph.name} as published")
    elif position == "learned":
        what = f"its learned position table has {limit} rows, so it cannot run this sequence"
    else:
        what = "its rotary positions run past them, on positions it was not trained on"
    text = (f"seq_len {graph.seq_len} is beyond {graph.name}'s {limit} positions: {what}. "
            f"Fix: seq_len <= {limit}, or a model with a longer context")
    return dataclasses.replace(graph, warnings=(*graph.warnings, text))
