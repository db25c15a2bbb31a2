"""Where the parts of a decoder-only model live, and how to run a slice of it.

The runtime needs four things of a model: its embedding, its list of decoder blocks, its final
norm and LM head, and a way to run blocks one after another on their own (a pipeline chunk holds
only some of them). An adapter gives those for one model family:

- autopar's own :class:`~autopar.models.transformer.Transformer` (``embed``, ``layers``, ``norm``,
  ``lm_head``; the shared RoPE module is reached through each block);
- Hugging Face Llama-family causal LMs (``model.embed_tokens``, ``model.layers``, ``model.norm``,
  ``model.rotary_emb``, ``lm_head``): Llama, Mistral, Qwen2 and others of that layout.

Chunks keep the original parameter names (``layers.3.attn.wq.weight``), so a chunk's state dict
matches the full model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .errors import UnsupportedPlanError


@dataclass(frozen=True)
class ModelAdapter:
    """Paths (dotted attribute names) of a model family's parts.

    Attributes:
        family: "autopar" or "hf-llama".
        embed: token embedding; ``pos_embed``: learned position embedding or "" (none).
        blocks: the ``nn.ModuleList`` of decoder blocks.
        norm: final norm; ``head``: LM head (``nn.Linear`` h -> vocab).
        rotary: a shared rotary module every chunk must hold ("" when blocks hold their own).
    """

    family: str
    embed: str
    blocks: str
    norm: str
    head: str
    pos_embed: str = ""
    rotary: str = ""

    def get(self, model: nn.Module, path: str) -> nn.Module | None:
        """The submodule at ``path``, or None (a path of "" or a part a chunk does not hold)."""
        if not path:
            return None
        module = model
        for part in path.split("."):
            module = getattr(module, part, None)
            if module is None:
                return None
        return module

    def run_block(self, chunk: nn.Module, block: nn.Module, x: torch.Tensor,
                  seq_len: int) -> torch.Tensor:
        """Run one decoder block on hidden states ``x`` of a sequence of ``seq_len`` tokens
        (``x`` may hold only this rank's part of the sequence under sequence parallelism;
        under context parallelism ``seq_len`` is this rank's share, at ``chunk.positions``)."""
        if self.family == "autopar":
            return block(x)
        rotary = self.get(chunk, self.rotary)
        cp = getattr(chunk, "cp", None)  # a Chunk's CP layout (the probe runs on the model)
        positions = (cp.positions(seq_len, device=x.device) if cp is not None
                     else torch.arange(seq_len, device=x.device)).unsqueeze(0)
        # HF rotary modules read only x's dtype and device, never its length.
        cos_sin = rotary(x if not hasattr(x, "to_local") else x.to_local(), positions)
        # attention_mask=None makes HF's SDPA path causal (is_causal=True), as the full model is.
        out = block(x, attention_mask=None, position_ids=positions, position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out


def adapter_for(model: nn.Module) -> ModelAdapter:
    """The adapter of ``model``'s family.

    Raises:
        UnsupportedPlanError: a model of neither layout.
    """
    from autopar.models.transformer import Transformer

    if isinstance(model, Transformer):
        return ModelAdapter("autopar", "embed", "layers", "norm", "lm_head",
                            pos_embed="pos_embed" if model.pos_embed is not None else "")
    inner = getattr(model, "model", None)
    if (inner is not None and isinstance(getattr(inner, "layers", None), nn.ModuleList)
            and hasattr(inner, "embed_tokens") and hasattr(model, "lm_head")):
        return ModelAdapter("hf-llama", "model.embed_tokens", "model.layers", "model.norm",
                            "lm_head", rotary="model.rotary_emb")
    raise UnsupportedPlanError(
        f"autopar.runtime cannot find the parts of a {type(model).__name__}: it knows autopar's "
        "Transformer and Hugging Face Llama-family causal LMs (model.embed_tokens, model.layers, "
        "model.norm, lm_head). Fix: build the model with autopar.models.build or transformers.")


def max_positions(model: nn.Module, adapter: ModelAdapter) -> tuple[int | None, bool]:
    """The longest sequence (tokens) ``model`` was built for, and whether a longer one fails.

    autopar's Transformer holds a RoPE or learned position table of ``config.seq_len`` rows: a
    longer input fails inside torch. Hugging Face Llama-family models compute rotary angles per
    position, so a sequence beyond ``config.max_position_embeddings`` runs, on positions the model
    was not built (or trained) for. Returns ``(None, False)`` when the model does not say.
    """
    config = getattr(model, "config", None)
    if adapter.family == "autopar":
        return config.seq_len, True
    limit = getattr(config, "max_position_embeddings", None)
    return (limit if isinstance(limit, int) else None), False


def tied_embeddings(model: nn.Module, adapter: ModelAdapter) -> bool:
    """True when the LM head's weight is the embedding's weight."""
    return adapter.get(model, adapter.head).weight is adapter.get(model, adapter.embed).weight


class Chunk(nn.Module):
    """A contiguous slice of the model: optionally the embedding, some blocks, optionally the
    final norm and head. Submodules sit at their original paths, so names match the full model.

    ``forward(x)``: token ids [b, s] (first chunk) or hidden states [b, s', h] -> hidden states,
    or logits [b, s, V] for the last chunk.
    """

    def __init__(self, model: nn.Module, adapter: ModelAdapter, first: int, stop: int,
                 has_embed: bool, has_head: bool) -> None:
        super().__init__()
        self.adapter = adapter
        self.block_ids = tuple(range(first, stop))
        self.has_embed, self.has_head = has_embed, has_head
        #: sequence-parallel degree, set by the TP step: hidden states between blocks then hold
        #: 1/sp_degree of the sequence.
        self.sp_degree = 1
        #: this rank's context-parallel layout (:class:`autopar.runtime.cp.CPLayout`), set by
        #: the CP step; None: the chunk sees whole sequences.
        self.cp = None
        blocks = adapter.get(model, adapter.blocks)
        parts = {adapter.blocks: nn.ModuleDict({str(i): blocks[i] for i in self.block_ids})}
        if has_embed:
            parts[adapter.embed] = adapter.get(model, adapter.embed)
            if adapter.pos_embed:
                parts[adapter.pos_embed] = adapter.get(model, adapter.pos_embed)
        if has_head:
            parts[adapter.norm] = adapter.get(model, adapter.norm)
            parts[adapter.head] = adapter.get(model, adapter.head)
        if adapter.rotary:
            parts[adapter.rotary] = adapter.get(model, adapter.rotary)
        for path, module in parts.items():
            _graft(self, path, module)
        self.extra_dropout = getattr(model, "drop", None) if adapter.family == "autopar" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ad = self.adapter
        if self.has_embed:
            seq_len = x.size(1)
            h = ad.get(self, ad.embed)(x)
            pos = ad.get(self, ad.pos_embed)
            if pos is not None:
                h = h + pos(self.positions(seq_len, x.device))
            if self.extra_dropout is not None:
                h = self.extra_dropout(h)
        else:
            h, seq_len = x, x.size(1) * self.sp_degree
        blocks = ad.get(self, ad.blocks)
        for i in self.block_ids:
            h = ad.run_block(self, blocks[str(i)], h, seq_len)
        if self.has_head:
            h = ad.get(self, ad.head)(ad.get(self, ad.norm)(h))
        return h


    def positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """Global positions (int64 [seq_len]) of the ``seq_len`` tokens this rank holds of each
        sequence: ``0..seq_len-1``, or its context-parallel share."""
        if self.cp is None:
            return torch.arange(seq_len, device=device)
        return self.cp.positions(seq_len, device=device)


def _graft(root: nn.Module, path: str, module: nn.Module) -> None:
    """Place ``module`` at dotted ``path`` under ``root``, creating empty containers on the way."""
    *parents, leaf = path.split(".")
    node = root
    for part in parents:
        if not hasattr(node, part):
            node.add_module(part, nn.Module())
        node = getattr(node, part)
    node.add_module(leaf, module)


def chunk_bounds(stage_blocks: tuple[int, ...]) -> list[tuple[int, int]]:
    """(first, stop) block indices of each chunk, from blocks per chunk in model order."""
    bounds, first = [], 0
    for n in stage_blocks:
        bounds.append((first, first + n))
        first += n
    return bounds
