"""Context parallelism from plain collectives: each CP rank holds part of every sequence.

Why not ``torch.distributed.tensor.experimental.context_parallel``: it shards CUDA's flash /
efficient attention ops and does not run on CPU (docs/reference/platform.md, "Context parallelism on
CPU"). This implementation runs on any backend:

- **Split** (:func:`positions`): the sequence is cut into ``2 cp`` chunks and rank ``i`` holds
  chunks ``i`` and ``2 cp - 1 - i``, so every rank has the same causal work (the load-balanced
  split of Megatron-LM and torchtitan). When ``2 cp`` does not divide the sequence the split is
  contiguous (rank ``i`` holds the ``i``-th of ``cp`` chunks; the run says so in its notes).
- **Attention** (:func:`attention`): K and V are all-gathered over the CP group (Llama 3's
  all-gather CP, the plan's ``cp_mode="allgather"``) with the autograd-aware functional
  collective ``all_gather_single_autograd``, whose backward reduce-scatters the K/V gradients
  back to their owners; being a functional collective, selective recompute keeps its output
  instead of gathering again. Queries attend to keys at global positions ``<=`` their own
  (the causal mask offset by the rank's positions). ``cp_mode="ring"`` passes K/V blocks
  around the ring (one hop per step, each an all-to-all with a single non-empty split, i.e. a
  send/recv pair, autograd-aware) and merges the blocks' attention by log-sum-exp; it computes
  attention in plain tensor ops (no fused kernel): torch's ring ``context_parallel`` needs
  CUDA's attention kernels. ``cp_mode="ulysses"`` all-to-alls q, k and v from sequence to
  head sharding and back (DeepSpeed-Ulysses).
- **Positions**: rotary angles and learned position embeddings use global positions.
- **Loss**: each rank's loss is the mean over its tokens (the same count on every rank), and
  gradients are averaged over dp x cp (:mod:`autopar.runtime.dp`), so the step's gradient is
  that of the mean over all tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import _functional_collectives as funcol

from autopar.models.transformer import Attention

from .errors import UnsupportedPlanError


@dataclass(frozen=True)
class CPLayout:
    """This rank's place in its context-parallel group.

    Attributes:
        group: the CP process group; size: its ranks; rank: this rank's index in it.
        balanced: the load-balanced split (else contiguous).
        mode: "allgather" (K/V all-gathered), "ring" (K/V passed around the ring) or
            "ulysses" (all-to-all to head sharding).
    """

    group: object
    size: int
    rank: int
    balanced: bool
    mode: str = "allgather"

    def positions(self, local_len: int, rank: int | None = None,
                  device: torch.device | None = None) -> torch.Tensor:
        """Global positions (int64 [local_len]) of the tokens CP rank ``rank`` (default: this
        one) holds, when each rank holds ``local_len`` tokens."""
        r = self.rank if rank is None else rank
        if not self.balanced:
            return torch.arange(r * local_len, (r + 1) * local_len, device=device)
        half = local_len // 2
        first = torch.arange(r * half, (r + 1) * half, device=device)
        last = 2 * self.size - 1 - r
        return torch.cat([first, torch.arange(last * half, (last + 1) * half, device=device)])

    def split(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of ``t`` [b, s, ...] along dim 1.

        Raises:
            UnsupportedPlanError: ``s`` does not split into the layout's chunks.
        """
        chunks = 2 * self.size if self.balanced else self.size
        if t.size(1) % chunks:
            raise UnsupportedPlanError(
                f"a sequence of {t.size(1)} tokens does not split into {chunks} equal chunks "
                f"for context parallelism over {self.size} ranks. Fix: sequences of the plan's "
                "length.")
        local = t.size(1) // self.size
        return t.index_select(1, self.positions(local, device=t.device))


def layout(group, seq_len: int, cp_mode: str = "allgather") -> CPLayout:
    """The :class:`CPLayout` of this rank in ``group`` for sequences of ``seq_len`` tokens
    (balanced when ``2 * cp`` divides ``seq_len``), exchanging K/V by ``cp_mode``."""
    size = dist.get_world_size(group)
    return CPLayout(group, size, dist.get_rank(group), seq_len % (2 * size) == 0, cp_mode)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: CPLayout, *,
              dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence's keys.

    Args:
        q: [b, a, s_local, d]; k, v: [b, kv, s_local, d] (kv divides a), this rank's tokens.

    Returns:
        [b, a, s_local, d]. Differentiable: K/V gradients flow back to their owning ranks.
    """
    if cp.mode == "ulysses":
        return _ulysses(q, k, v, cp, dropout_p, scale)
    if cp.mode == "ring":
        return _ring(q, k, v, cp, dropout_p, scale)
    s = q.size(2)
    ks = funcol.all_gather_single_autograd(k.contiguous(), 2, cp.group)
    vs = funcol.all_gather_single_autograd(v.contiguous(), 2, cp.group)
    q_pos = cp.positions(s, device=q.device)
    k_pos = torch.cat([cp.positions(s, r, q.device) for r in range(cp.size)])
    mask = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)  # [s_local, s]: True = attend
    return F.scaled_dot_product_attention(q, ks, vs, attn_mask=mask, dropout_p=dropout_p,
                                          scale=scale, enable_gqa=ks.size(1) != q.size(1))


def _heads_to_sequence(t: torch.Tensor, cp: CPLayout) -> torch.Tensor:
    """[b, n, s_local, d] -> [b, n / cp, cp s_local, d]: all-to-all from sequence to head
    sharding (source rank r's tokens land r-th along the sequence)."""
    b, n, s, d = t.shape
    send = t.reshape(b, cp.size, n // cp.size, s, d).transpose(0, 1).contiguous()
    recv = funcol.all_to_all_single_autograd(send, None, None, cp.group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, n // cp.size, cp.size * s, d)


def _sequence_to_heads(t: torch.Tensor, cp: CPLayout) -> torch.Tensor:
    """The inverse of :func:`_heads_to_sequence`: [b, n / cp, cp s, d] -> [b, n, s, d]."""
    b, n_local, s_all, d = t.shape
    s = s_all // cp.size
    send = t.reshape(b, n_local, cp.size, s, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = funcol.all_to_all_single_autograd(send, None, None, cp.group)
    return recv.transpose(0, 1).reshape(b, cp.size * n_local, s, d)


def _ulysses(q, k, v, cp: CPLayout, dropout_p: float, scale: float | None) -> torch.Tensor:
    """DeepSpeed-Ulysses (Jacobs et al. 2023): all-to-all q, k, v from sequence to head
    sharding, full-sequence causal attention on a/cp heads, all-to-all back. Heads and KV heads
    must be divisible by cp (the search's rule for this mode)."""
    if q.size(1) % cp.size or k.size(1) % cp.size:
        raise UnsupportedPlanError(
            f"cp_mode 'ulysses' needs the (TP-local) heads {q.size(1)} and KV heads {k.size(1)} "
            f"divisible by cp={cp.size}. Fix: cp_mode='allgather'.")
    s = q.size(2)
    qs, ks, vs = (_heads_to_sequence(t, cp) for t in (q, k, v))
    pos = torch.cat([cp.positions(s, r, q.device) for r in range(cp.size)])
    mask = pos.unsqueeze(0) <= pos.unsqueeze(1)
    out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, dropout_p=dropout_p,
                                         scale=scale, enable_gqa=ks.size(1) != qs.size(1))
    return _sequence_to_heads(out, cp)


def _pass_on(t: torch.Tensor, cp: CPLayout) -> torch.Tensor:
    """``t`` sent to the next CP rank, the previous rank's received (one ring hop: an
    all-to-all with one non-empty split each way, autograd-aware; its backward is the hop
    reversed)."""
    n = t.numel()
    send = [0] * cp.size
    recv = [0] * cp.size
    send[(cp.rank + 1) % cp.size] = n
    recv[(cp.rank - 1) % cp.size] = n
    out = funcol.all_to_all_single_autograd(t.contiguous().reshape(-1), recv, send, cp.group)
    return out.reshape(t.shape)


def _ring(q, k, v, cp: CPLayout, dropout_p: float, scale: float | None) -> torch.Tensor:
    """Ring attention (Liu et al. 2023): K/V blocks travel around the CP ring, one hop per
    step; each block's attention is merged into the running result by its log-sum-exp
    (the online softmax of flash attention), so no rank holds more than two K/V blocks."""
    s = q.size(2)
    scale = q.size(-1) ** -0.5 if scale is None else scale
    groups = q.size(1) // k.size(1)
    q_pos = cp.positions(s, device=q.device)
    outs, lses = [], []
    kb, vb, src = k, v, cp.rank
    for step in range(cp.size):
        mask = cp.positions(s, src, q.device).unsqueeze(0) <= q_pos.unsqueeze(1)
        if bool(mask.any()):  # positions are known on every rank: no data-dependent collective
            kk, vv = kb.repeat_interleave(groups, 1), vb.repeat_interleave(groups, 1)
            scores = (q @ kk.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
            lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            # rows that see no key of this block: lse = -inf, weight 0 in the merge below
            p = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse))
            p = F.dropout(p, dropout_p) if dropout_p > 0 else p
            outs.append(p @ vv)
            lses.append(lse)
        if step < cp.size - 1:
            kb, vb, src = _pass_on(kb, cp), _pass_on(vb, cp), (src - 1) % cp.size
    total = torch.logsumexp(torch.stack(lses), dim=0)  # each query sees at least itself
    return sum(torch.exp(lse - total) * out for lse, out in zip(lses, outs))


def _hf_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  **kwargs):
    """Hugging Face attention-interface function (``AttentionInterface``): output
    [b, s, a, d] and no weights, as HF's SDPA function returns."""
    out = attention(query, key, value, module.autopar_cp, dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


#: Name under which :func:`_hf_attention` is registered with transformers.
HF_ATTENTION = "autopar_cp"


def apply_cp(blocks: nn.ModuleDict, family: str, cp: CPLayout) -> None:
    """Make every attention module of ``blocks`` context-parallel over ``cp``, in place.

    autopar blocks: the ``Attention`` becomes a :class:`ContextParallelAttention` (same
    parameters and names). Hugging Face blocks: their ``self_attn`` modules use the attention
    function :data:`HF_ATTENTION` (registered with transformers' ``AttentionInterface``);
    rotary positions come from the adapter (global positions).

    Raises:
        UnsupportedPlanError: a block without a known attention module.
    """
    for block in blocks.values():
        found = False
        for mod in block.modules():
            if family == "autopar" and isinstance(mod, Attention):
                mod.__class__ = ContextParallelAttention
                found = True
            elif family == "hf-llama" and hasattr(mod, "o_proj") and hasattr(mod, "config"):
                if getattr(mod.config, "sliding_window", None) is not None:
                    raise UnsupportedPlanError(
                        "context parallelism with sliding-window attention (config."
                        f"sliding_window={mod.config.sliding_window}) is not implemented: the "
                        "CP attention is plain causal. Fix: plan with cp=1.")
                _use_hf_attention(mod)
                found = True
            if found:
                mod.autopar_cp = cp
                break
        if not found:
            raise UnsupportedPlanError(
                f"context parallelism: no attention module found in {type(block).__name__}. "
                "Fix: plan with cp=1.")


def _use_hf_attention(mod: nn.Module) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(HF_ATTENTION, _hf_attention)
    mod.config._attn_implementation = HF_ATTENTION


class ContextParallelAttention(Attention):
    """autopar ``Attention`` over a context-parallel group (``autopar_cp``, a
    :class:`CPLayout`): queries, keys and values of this rank's tokens, rotary angles at their
    global positions, attention by :func:`attention`. Input [b, s_local, h] -> [b, s_local, h]."""

    autopar_cp: CPLayout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.wq(x).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.wk(x).unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.wv(x).unflatten(-1, (self.num_kv_heads, self.head_dim)).transpose(1, 2)
        if self.rope is not None:
            q, k = self.rope(q, k, self.autopar_cp.positions(x.size(1), device=x.device))
        out = attention(q, k, v, self.autopar_cp,
                        dropout_p=self.attention_dropout if self.training else 0.0)
        return self.wo(out.transpose(1, 2).flatten(2))
