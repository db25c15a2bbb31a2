"""Tensor and sequence parallelism: find each block's column/row linears, then shard them.

Roles follow the graph extractor's rule (:func:`autopar.graph.classify.linear_role`, Megatron-LM's
f/g regions): a linear fed by a replicated tensor is column-parallel, a linear fed by the output
of a column-parallel one is row-parallel. The rule is applied to the block's *autograd* graph,
recorded by running one block on a few tokens: unlike ``torch.fx`` this works for any eager model,
Hugging Face ones included (fx cannot trace those, see docs/reference/platform.md).

The sharding itself is torchtitan's Llama plan with ``parallelize_module``: column linears
``ColwiseParallel``, row linears ``RowwiseParallel``, the embedding vocabulary-parallel, the LM
head column-parallel with vocabulary-sharded logits for ``loss_parallel``; with sequence
parallelism the norms run ``SequenceParallel`` and the sublayer holding each column..row region
(attention, MLP) all-gathers its input once with ``PrepareModuleInput``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from autopar.graph import classify

from .adapters import Chunk, ModelAdapter
from .errors import UnsupportedPlanError

#: Attributes holding a head count that a module uses to reshape its local q/k/v; divided by
#: the TP degree (Hugging Face attention reshapes with -1 and needs no change).
_HEAD_ATTRS = ("num_heads", "num_kv_heads", "n_heads", "n_kv_heads", "num_key_value_heads")
#: Tokens in the probe forward: enough for every reshape, cheap for any model size.
_PROBE_TOKENS = 4


@dataclass(frozen=True)
class BlockTP:
    """Tensor-parallel roles in one decoder block (paths relative to the block).

    Attributes:
        column, row: linears sharded by output / input features.
        sublayers: (path, kwarg) of each module holding a column..row region (attention, MLP),
            and the keyword its hidden-state input is passed by ("" = first positional).
        norms: norm modules (run sequence-parallel under SP).
    """

    column: tuple[str, ...]
    row: tuple[str, ...]
    sublayers: tuple[tuple[str, str], ...]
    norms: tuple[str, ...]


def find_block_tp(model: nn.Module, adapter: ModelAdapter) -> BlockTP:
    """Roles of the linears of ``model``'s first block, from its autograd graph.

    Runs a deep copy of the block once on ``_PROBE_TOKENS`` random tokens (the model is left
    untouched).

    Raises:
        UnsupportedPlanError: the block's output is left sharded (a column linear without a row
            linear after it), so no Megatron-style split exists.
    """
    model_block = adapter.get(model, adapter.blocks)[0]
    block = copy.deepcopy(model_block)
    names = {m: n for n, m in block.named_modules()}
    out_of: dict[object, str] = {}  # grad_fn of a linear's output -> the linear's path
    roles: dict[str, str] = {}
    feeds: dict[str, set[str]] = {}  # row linear -> column linears of its region
    calls: dict[str, str] = {}

    def reached_columns(fn, seen: set) -> set[str]:
        # Walk back from fn to the block input; a linear's output ends the walk: a column one
        # opens a sharded region, anything else closes it.
        stack, found = [fn], set()
        while stack:
            f = stack.pop()
            if f is None or f in seen:
                continue
            seen.add(f)
            if f in out_of:
                if roles[out_of[f]] == "column":
                    found.add(out_of[f])
                continue
            stack.extend(nf for nf, _ in f.next_functions)
        return found

    def pre(mod, args, kwargs):
        name = names[mod]
        x = args[0] if args else next((v for v in kwargs.values() if torch.is_tensor(v)), None)
        if name not in calls:
            calls[name] = "" if args and torch.is_tensor(args[0]) else next(
                (k for k, v in kwargs.items() if torch.is_tensor(v)), "")
        if isinstance(mod, nn.Linear) and x is not None:
            cols = reached_columns(x.grad_fn, set())
            role, _ = classify.linear_role("tp" if cols else "seq", mod.out_features, None)
            roles[name] = role
            if role == "row":
                feeds[name] = cols

    def post(mod, args, out):
        if isinstance(mod, nn.Linear):
            out_of[out.grad_fn] = names[mod]

    hooks = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in names if m is not block]
    hooks += [m.register_forward_hook(post) for m in names if isinstance(m, nn.Linear)]
    hidden = adapter.get(model, adapter.embed).weight.shape[1]
    p = next(block.parameters())
    x = torch.randn(1, _PROBE_TOKENS, hidden, dtype=p.dtype, device=p.device, requires_grad=True)
    y = adapter.run_block(model, block, x, _PROBE_TOKENS)
    for h in hooks:
        h.remove()
    if reached_columns(y.grad_fn, set()):
        raise UnsupportedPlanError(
            f"{type(model_block).__name__}: a column-parallel linear's output reaches the block "
            "output without a row-parallel linear, so tensor parallelism cannot split this block. "
            "Fix: plan with tp=1.")
    sublayers = []
    for row, cols in feeds.items():
        path = _common_prefix([row, *cols])
        if path:
            sublayers.append((path, calls.get(path, "")))
    norms = tuple(n for m, n in names.items() if n and classify.is_norm_module(m))
    return BlockTP(
        column=tuple(n for n, r in roles.items() if r == "column"),
        row=tuple(n for n, r in roles.items() if r == "row"),
        sublayers=tuple(dict.fromkeys(sublayers)), norms=norms)


def _common_prefix(paths: list[str]) -> str:
    parts = [p.split(".")[:-1] for p in paths]
    out = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        out.append(level[0])
    return ".".join(out)


def check_tp(model: nn.Module, adapter: ModelAdapter, roles: BlockTP, tp: int) -> None:
    """Check that ``tp`` divides every sharded dimension and head count.

    Raises:
        UnsupportedPlanError: a dimension or head count ``tp`` does not divide.
    """
    block = adapter.get(model, adapter.blocks)[0]
    for path in roles.column + roles.row:
        lin = block.get_submodule(path)
        dim = lin.out_features if path in roles.column else lin.in_features
        if dim % tp:
            raise UnsupportedPlanError(f"tp={tp} does not divide {path}'s {dim} features.")
    for mod in block.modules():
        for attr in _HEAD_ATTRS:
            n = getattr(mod, attr, None)
            if isinstance(n, int) and n % tp:
                raise UnsupportedPlanError(f"tp={tp} does not divide {attr}={n}. Fix: a tp that "
                                           "divides the (kv) heads.")
    vocab = adapter.get(model, adapter.embed).weight.shape[0]
    if vocab % tp:
        raise UnsupportedPlanError(f"tp={tp} does not divide the vocabulary ({vocab}). Fix: pad "
                                   "the vocabulary to a multiple of tp.")


def apply_tp(chunk: Chunk, roles: BlockTP, tp_mesh, sequence_parallel: bool) -> None:
    """Shard ``chunk`` over ``tp_mesh`` in place; the LM head then returns vocabulary-sharded
    DTensor logits, to be reduced inside ``loss_parallel()``."""
    ad, sp = chunk.adapter, sequence_parallel
    seq = Shard(1) if sp else Replicate()
    plan: dict = {}
    if chunk.has_embed:
        if sp and ad.pos_embed:
            raise UnsupportedPlanError(
                "sequence parallelism with learned position embeddings is not supported by the "
                "runtime. Fix: plan with sequence_parallel=False.")
        plan[ad.embed] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    for i in chunk.block_ids:
        prefix = f"{ad.blocks}.{i}."
        gathered = {p for p, _ in roles.sublayers} if sp else set()
        for c in roles.column:
            # A column linear outside any sublayer gathers the sequence itself.
            own = sp and not any(c.startswith(g + ".") for g in gathered)
            plan[prefix + c] = ColwiseParallel(input_layouts=Shard(1) if own else Replicate())
        for r in roles.row:
            plan[prefix + r] = RowwiseParallel(output_layouts=seq)
        if sp:
            for n in roles.norms:
                plan[prefix + n] = SequenceParallel()
            for path, kw in roles.sublayers:
                plan[prefix + path] = (
                    PrepareModuleInput(input_kwarg_layouts={kw: Shard(1)},
                                       desired_input_kwarg_layouts={kw: Replicate()})
                    if kw else PrepareModuleInput(input_layouts=(Shard(1),),
                                                  desired_input_layouts=(Replicate(),)))
        tp = tp_mesh.size()
        for mod in ad.get(chunk, ad.blocks)[str(i)].modules():
            for attr in _HEAD_ATTRS:
                if isinstance(getattr(mod, attr, None), int):
                    setattr(mod, attr, getattr(mod, attr) // tp)
    if chunk.has_head:
        if sp:
            plan[ad.norm] = SequenceParallel()
        plan[ad.head] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1),
                                        use_local_output=False)
    parallelize_module(chunk, tp_mesh, plan)
    chunk.sp_degree = tp_mesh.size() if sp else 1
