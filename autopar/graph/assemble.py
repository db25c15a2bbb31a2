"""Turn what an interpreter measured into :class:`Layer` records; shared by the fx and export paths.

A layer is finished right after its forward ran: its backward FLOPs are measured by differentiating
its outputs with respect to its inputs and parameters (autograd stops at the layer's inputs, so
only this layer's backward runs), and the saved tensors attributed to it by the
:class:`~autopar.graph.measure.Recorder` are split by region (Korthikanti et al. 2022, section 4).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UntraceableModelError
from .measure import MeasuringInterpreter, Recorder, tensor_nbytes, tensors_of
from .types import ActivationBytes, Layer, Op


def meta_map(model: nn.Module, dtype: torch.dtype | None) -> dict[int, torch.Tensor]:
    """Meta stand-ins for every parameter and buffer, in the compute dtype, tied weights shared.

    Keys are ``id(original tensor)``; floating tensors are cast to ``dtype`` when given.
    """
    out: dict[int, torch.Tensor] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in out:
            continue
        target = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        if t.device.type == "meta" and t.dtype == target:
            out[id(t)] = t
        else:
            out[id(t)] = torch.empty(t.shape, dtype=target, device="meta").requires_grad_(
                t.requires_grad)
    return out


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are on the meta device, dtypes kept and
    tied weights still tied; no tensor data is copied (a real model's weights are not duplicated
    in memory) and ``model`` is not changed. Equal to ``copy.deepcopy(model).to("meta")``.
    """
    memo: dict = {}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in memo:
            m = torch.empty_like(t, device="meta")
            memo[id(t)] = (nn.Parameter(m, requires_grad=t.requires_grad)
                           if isinstance(t, nn.Parameter) else m)
    return copy.deepcopy(model, memo)


def on_meta(model: nn.Module) -> bool:
    """Whether every parameter and buffer of ``model`` is on the meta device."""
    return all(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])


def elem_bytes(dtype: torch.dtype | None, model: nn.Module) -> int:
    """Bytes per element of the compute dtype (``dtype``, else the model's first float param)."""
    if dtype is not None:
        return torch.empty((), dtype=dtype).element_size()
    for p in model.parameters():
        if p.is_floating_point():
            return p.element_size()
    return 4


def finish_layer(rec: Recorder, meta_of: dict[int, torch.Tensor], interp: MeasuringInterpreter,
                 index: int, name: str, kind: str, sig: str, inputs: list[torch.Tensor],
                 output) -> Layer:
    """Measure the backward FLOPs and collect the saved bytes of the layer just run.

    Args:
        rec: the extraction's recorder (its FlopCounterMode must be active).
        meta_of: parameter stand-ins by ``id`` of the original tensor.
        interp: the interpreter holding this layer's ops, op nodes and parameters.
        index, name, kind, sig: the layer's :class:`Layer` identity fields.
        inputs: the layer's activation inputs (what full recomputation keeps).
        output: the layer's output value(s).

    Returns:
        The :class:`Layer`; backward FLOPs are FlopCounterMode's plus the extra backward FLOPs the
        interpreter added for ops it models itself (attention, grouped GEMMs).
    """
    params = [meta_of.get(i, p) for i, p in interp.layer_params.items()]
    wrt = [t for t in inputs if t.requires_grad] + [p for p in params if p.requires_grad]
    outs = [t for t in tensors_of(output) if t.requires_grad]
    before = rec.flop_counter.get_total_flops()
    if outs and wrt:
        torch.autograd.grad(outs, wrt, grad_outputs=[torch.ones_like(t) for t in outs],
                            allow_unused=True, retain_graph=True)
    bwd = rec.flop_counter.get_total_flops() - before + rec.extra_bwd_flops
    rec.extra_bwd_flops = 0.0
    seq = tp = core = 0
    by_op: dict[tuple[str, str], int] = {}
    for s in rec.saved.values():
        if s.layer != index:
            continue
        if s.core_producer and s.savers_core:
            core += s.nbytes
            part = "core"
        elif s.region == "tp":
            tp += s.nbytes
            part = "tp"
        else:
            seq += s.nbytes
            part = "seq"
        by_op[s.saver, part] = by_op.get((s.saver, part), 0) + s.nbytes
    ops = tuple(interp.ops)
    rows = tuple(o.bytes_written for o in ops if o.tp_role == "row")
    col_inputs = {}
    for node, op in zip(interp.op_nodes, ops):
        if node is not None and op.tp_role == "column":
            src = interp.matmul_input(node)
            col_inputs[src] = tensor_nbytes(interp.env[src])
    heads = getattr(interp, "heads", (0, 0))
    experts = getattr(interp, "experts", (0, 0))
    n_params = sum(p.numel() for p in params)
    return Layer(
        index=index, name=name, kind=kind, signature=sig, ops=ops,
        num_parameters=n_params, param_bytes=sum(tensor_nbytes(p) for p in params),
        fwd_flops=float(sum(o.fwd_flops for o in ops)), bwd_flops=float(bwd),
        activations=ActivationBytes(seq=seq, tp=tp, core=core,
                                    layer_input=sum(tensor_nbytes(t) for t in inputs
                                                    if t.is_floating_point()),
                                    **rec.linear_input_bytes(index)),
        output_bytes=sum(tensor_nbytes(t) for t in tensors_of(output)),
        tp_row_outputs=rows, tp_column_inputs=tuple(col_inputs.values()),
        attention_heads=heads[0], kv_heads=heads[1],
        shared_parameters=n_params - sum(o.num_parameters for o in ops),
        num_experts=experts[0], experts_per_token=experts[1],
        saved_by_op=tuple((op, part, n) for (op, part), n in by_op.items()),
    )


def reset_ops(interp: MeasuringInterpreter) -> None:
    """Start a new layer on the same interpreter (regions and values are kept)."""
    interp.ops.clear()
    interp.op_nodes.clear()
    interp.layer_params.clear()
    interp.heads = (0, 0)
    interp.experts = (0, 0)


def logits_of(output) -> torch.Tensor:
    """The logits [b, s, vocab] in a model's output (tensor, tuple/list, dict, or ``.logits``).

    Raises:
        UntraceableModelError: no logits found.
    """
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, dict) and "logits" in output:
        return output["logits"]
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise UntraceableModelError(
        f"the model returned {type(output).__name__}; autopar needs logits [batch, seq, vocab] "
        "(a tensor, a tuple starting with it, or an object with .logits)."
    )


def add_loss(interp: MeasuringInterpreter, rec: Recorder, logits: torch.Tensor) -> torch.Tensor:
    """Cross entropy in fp32 over the logits, recorded as the head's last op (Megatron upcasts).

    FLOPs: FlopCounterMode counts none for cross entropy (no GEMM); its bytes are the logits read
    and their fp32 copy written.
    """
    rec.op_name, rec.op_is_core, rec.op_region, rec.op_kind = "loss", False, "tp", "loss"
    before = rec.flop_counter.get_total_flops()
    flat = logits.float().reshape(-1, logits.shape[-1])
    labels = torch.zeros(flat.shape[0], dtype=torch.long, device="meta")
    loss = F.cross_entropy(flat, labels)
    interp.op_nodes.append(None)
    interp.ops.append(Op(name="loss", kind="loss", target="cross_entropy",
                         fwd_flops=float(rec.flop_counter.get_total_flops() - before),
                         bytes_read=tensor_nbytes(logits), bytes_written=tensor_nbytes(flat),
                         num_parameters=0, region="tp"))
    return loss
