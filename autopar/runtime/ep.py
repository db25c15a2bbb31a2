"""Expert parallelism: each MoE layer's experts split over the ``ep`` ranks of an EP group,
tokens dispatched to their experts' ranks and combined back with ``all_to_all_single``.

The expert layout is Hugging Face's stacked-experts module (transformers 5.x, e.g.
``MixtralExperts``): ``gate_up_proj`` [E, 2f, h], ``down_proj`` [E, h, f], ``act_fn``, and
``forward(hidden [T, h], top_k_index [T, k], top_k_weights [T, k])``. EP rank ``r`` keeps experts
``r E/ep .. (r+1) E/ep - 1`` (Megatron-LM's contiguous split). Per step of a layer:

1. the (token, expert) pairs are sorted by expert; the count per expert is exchanged
   (``all_to_all_single`` of E integers, no gradient);
2. the token rows go to their experts' ranks (``all_to_all_single`` with uneven splits,
   autograd-aware: its backward is the reverse all-to-all);
3. each local expert runs on its rows; the results go back by the reverse all-to-all and are
   weighted by the router and summed per token, as the unsplit module does.

Expert gradients: rank ``r``'s expert receives the gradient of every EP peer's tokens, so the
DP reduction over the ranks holding the same experts (edp x cp) divides by dp x cp, not by
their number (:mod:`autopar.runtime.dp`).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd

from .errors import UnsupportedPlanError

_EXPERT_PARAMS = ("gate_up_proj", "down_proj")


def find_experts(module: nn.Module) -> list[nn.Module]:
    """The stacked-experts modules under ``module`` (those with 3-D ``gate_up_proj`` and
    ``down_proj`` parameters and a ``num_experts``)."""
    return [m for m in module.modules()
            if all(isinstance(getattr(m, n, None), nn.Parameter) and getattr(m, n).ndim == 3
                   for n in _EXPERT_PARAMS) and isinstance(getattr(m, "num_experts", None), int)]


def apply_ep(experts: list[nn.Module], group) -> None:
    """Keep this rank's experts of each module and dispatch tokens over ``group``, in place.

    Raises:
        UnsupportedPlanError: the EP degree does not divide a module's expert count.
    """
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    for m in experts:
        if m.num_experts % ep:
            raise UnsupportedPlanError(
                f"ep={ep} does not divide the {m.num_experts} experts of a MoE layer. Fix: an "
                "ep dividing the expert count.")
        local = m.num_experts // ep
        for n in _EXPERT_PARAMS:
            full = getattr(m, n)
            part = full.detach()[rank * local:(rank + 1) * local].clone()
            setattr(m, n, nn.Parameter(part, requires_grad=full.requires_grad))
        m.__class__ = _expert_parallel_class(type(m))
        m.ep_group, m.ep_size, m.local_experts = group, ep, local


def is_expert_param(module: nn.Module, name: str) -> bool:
    """True when parameter ``name`` of ``module`` belongs to an expert-parallel module."""
    path, _, leaf = name.rpartition(".")
    return leaf in _EXPERT_PARAMS and getattr(module.get_submodule(path), "ep_size", 0) > 0


def dispatch_forward(m: nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor) -> torch.Tensor:
    """The expert-parallel forward of stacked-experts module ``m`` (see module docstring).

    Args:
        hidden: [T, h] this rank's tokens; top_k_index: [T, k] int64 global expert ids;
            top_k_weights: [T, k] router weights.

    Returns:
        [T, h]: for each token the weighted sum of its k experts' outputs.
    """
    group, ep, local = m.ep_group, m.ep_size, m.local_experts
    k = top_k_index.size(1)
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    counts = torch.bincount(flat, minlength=m.num_experts)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    send_splits = counts.view(ep, local).sum(1).tolist()
    recv_per_expert = recv_counts.view(ep, local)
    recv_splits = recv_per_expert.sum(1).tolist()
    rows = all_to_all_single_autograd(hidden[token], recv_splits, send_splits, group)
    # received rows: by source rank, then by local expert; run each local expert on its rows
    expert_of = torch.repeat_interleave(torch.arange(local, device=hidden.device).repeat(ep),
                                        recv_per_expert.flatten())
    outs, where = [], []
    for e in range(local):
        idx = (expert_of == e).nonzero().squeeze(1)
        x = rows[idx]
        gate, up = F.linear(x, m.gate_up_proj[e]).chunk(2, dim=-1)
        outs.append(F.linear(m.act_fn(gate) * up, m.down_proj[e]))
        where.append(idx)
    y = torch.cat(outs).index_select(0, torch.argsort(torch.cat(where)))
    back = all_to_all_single_autograd(y, send_splits, recv_splits, group)
    w = top_k_weights.reshape(-1)[order].unsqueeze(1).to(back.dtype)
    return torch.zeros_like(hidden).index_add(0, token, back * w)


@functools.cache
def _expert_parallel_class(base: type) -> type:
    """A subclass of ``base`` whose forward is :func:`dispatch_forward` (one per base class:
    swapping ``__class__`` keeps parameter names, as FSDP2's ``fully_shard`` does)."""
    return type(f"ExpertParallel{base.__name__}", (base,),
                {"forward": dispatch_forward,
                 "__doc__": f"{base.__name__} with experts split over an EP group "
                            "(autopar.runtime.ep)."})
