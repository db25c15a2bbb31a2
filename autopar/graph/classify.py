"""Which kind of op an fx node is, and how tensor parallelism sees it.

Kinds are read from what the node calls (module type or function), never from module names.
Tensor-parallel regions follow Megatron-LM's rule and are found by propagation over the graph
(Shoeybi et al. 2019, section 3): a linear fed by a replicated ("seq") tensor is column-parallel
and yields a sharded ("tp") tensor; a linear fed by a sharded tensor is row-parallel and yields a
replicated one; every other op keeps the region of its inputs.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

_VIEW_METHODS = {
    "view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "flatten",
    "unflatten", "split", "chunk", "size", "dim", "type_as", "to", "float", "half", "bfloat16",
    "view_as", "narrow", "t", "unbind", "contiguous",
}
_VIEW_FUNCTIONS = {
    operator.getitem, getattr, torch.reshape, torch.transpose, torch.permute, torch.flatten,
    torch.unsqueeze, torch.squeeze, torch.split, torch.chunk, torch.narrow, torch.t, torch.unbind,
}
_MATMUL_FUNCTIONS = {torch.matmul, torch.bmm, torch.mm, torch.baddbmm, torch.addmm, operator.matmul,
                     F.linear, torch.einsum}
_NORM_FUNCTIONS = {F.layer_norm, F.rms_norm, F.group_norm}
_DROPOUT_FUNCTIONS = {F.dropout}
_LOSS_FUNCTIONS = {F.cross_entropy, F.nll_loss}


def is_norm_module(module: nn.Module) -> bool:
    """True for normalisation modules, torch's or a model's own (class name ending in ``Norm``).

    Treated as one op (a leaf) so that a hand-written RMSNorm counts as one memory-bound op.
    """
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)) or type(
        module
    ).__name__.lower().endswith("norm")


def module_kind(module: nn.Module) -> str:
    """Op kind of a leaf module call."""
    if isinstance(module, nn.Linear):
        return "matmul"
    if isinstance(module, nn.Embedding):
        return "embedding"
    if is_norm_module(module):
        return "norm"
    if isinstance(module, nn.Dropout):
        return "dropout"
    if isinstance(module, (nn.CrossEntropyLoss, nn.NLLLoss)):
        return "loss"
    return "elementwise"


def function_kind(target) -> str:
    """Op kind of a call_function node's target."""
    if target is F.scaled_dot_product_attention:
        return "attention"
    if target in _MATMUL_FUNCTIONS:
        return "matmul"
    if target in _NORM_FUNCTIONS:
        return "norm"
    if target in _DROPOUT_FUNCTIONS:
        return "dropout"
    if target in _LOSS_FUNCTIONS:
        return "loss"
    if target is F.embedding:
        return "embedding"
    if target in _VIEW_FUNCTIONS:
        return "view"
    return "elementwise"


def method_kind(name: str) -> str:
    """Op kind of a call_method node."""
    if name in _VIEW_METHODS:
        return "view"
    if name in ("matmul", "bmm", "mm"):
        return "matmul"
    return "elementwise"


def is_linear(kind: str, target, module: nn.Module | None) -> bool:
    """True for a linear layer (module or F.linear): the ops TP shards by column or row."""
    return kind == "matmul" and (isinstance(module, nn.Linear) or target is F.linear)


def linear_role(input_region: str, out_features: int, vocab_size: int | None) -> tuple[str, str]:
    """(tp_role, output region) of a linear layer given the region of its input.

    A linear that projects to the vocabulary is the vocabulary-parallel LM head: its logits stay
    sharded for a vocabulary-parallel cross entropy (Megatron-LM ``vocab_parallel_cross_entropy``).
    """
    if input_region == "seq":
        if vocab_size is not None and out_features == vocab_size:
            return "vocab", "tp"
        return "column", "tp"
    return "row", "seq"


def target_name(node_target, module: nn.Module | None) -> str:
    """A short printable name for what a node calls."""
    if module is not None:
        return type(module).__name__
    if isinstance(node_target, str):
        return node_target
    return getattr(node_target, "__name__", repr(node_target))
