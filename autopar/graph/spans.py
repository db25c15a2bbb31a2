"""How far back each query of an attention layer looks: full, sliding window or chunked.

Hugging Face models pass sliding-window and chunked attention to SDPA as a materialised boolean
mask, so the exported graph does not say what the mask holds; the attention module does
(``sliding_window``, ``layer_type`` / ``config.layer_types``, ``config.attention_chunk_size``).

Convention (see docs/graph.md, "Sliding-window and chunked attention"): an attention op's FLOPs
are counted as the project counts full attention, i.e. non-causal, *twice* the causal work less
the diagonal, so that the cost model's causal half (``causal_attention_work = 0.5``) is what a
window-aware kernel executes: FlashAttention-2/3 with ``window_size`` and FlexAttention with a
block mask skip the key blocks outside the window (Dao 2023, section 3.1; torch FlexAttention
``create_block_mask``). HF's own SDPA path computes the full s x s scores and masks them; a
training run at sequence lengths where the window matters does not use it.
"""

from __future__ import annotations

from torch import nn

#: Span kinds: every earlier key, the last ``window`` keys, or the keys of the query's chunk.
SPAN_KINDS = ("full", "sliding", "chunked")


def attention_span(module: nn.Module | None) -> tuple[str, int]:
    """(kind, tokens) of the attention computed inside an HF attention module.

    ``("sliding", w)``: each query sees itself and the w - 1 keys before it (HF
    ``sliding_window_causal_mask``: ``kv_idx > q_idx - w``); ``("chunked", c)``: the keys of its
    own c-token chunk up to itself (HF ``chunked_causal_mask``, Llama 4); ``("full", 0)``
    otherwise, also for modules that are not HF attention modules.
    """
    if module is None:
        return "full", 0
    cfg = getattr(module, "config", None)
    idx = getattr(module, "layer_idx", None)
    types = getattr(cfg, "layer_types", None)
    layer_type = getattr(module, "layer_type", None)
    if layer_type is None and types and isinstance(idx, int) and idx < len(types):
        layer_type = types[idx]
    if layer_type == "chunked_attention" and getattr(cfg, "attention_chunk_size", None):
        return "chunked", int(cfg.attention_chunk_size)
    window = getattr(module, "sliding_window", None)
    if window is None and cfg is not None and (
            layer_type == "sliding_attention"
            or (layer_type is None and getattr(cfg, "use_sliding_window", True))):
        window = getattr(cfg, "sliding_window", None)
    if isinstance(window, int) and window > 0:
        return "sliding", window
    return "full", 0


def counted_pairs(s: int, kind: str, window: int) -> int:
    """Query-key pairs the project counts for causal attention over ``s`` tokens with this span.

    Full: s^2 (non-causal count; a causal kernel executes s(s+1)/2 = (s^2 + s)/2). For any span,
    2 x (pairs a causal kernel executes) - s, which is s^2 for a span >= s:
    sliding w: executed sum_i min(i+1, w) = s*w - w(w-1)/2 for s >= w;
    chunked c: executed sum over chunks of n(n+1)/2 (n = c, the last one s mod c), counted
    sum of n^2.
    """
    if kind == "sliding" and 0 < window < s:
        executed = s * window - window * (window - 1) // 2
        return 2 * executed - s
    if kind == "chunked" and 0 < window < s:
        full, rest = divmod(s, window)
        return full * window * window + rest * rest
    return s * s
