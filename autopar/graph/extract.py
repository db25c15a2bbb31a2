"""``extract(model, seq_len)``: an ``nn.Module`` on the meta device -> :class:`ModelGraph`.

How: find the repeated decoder blocks (the largest ``nn.ModuleList`` of one block class), trace the
model with ``torch.fx`` keeping blocks as single calls, and trace one block of each structure on its
own. Then interpret on meta tensors under FlopCounterMode and saved-tensor hooks
(:mod:`autopar.graph.measure`). Top-level ops before the first block form the ``embed`` layer, ops
after the last block plus a cross-entropy loss form the ``head`` layer. A block whose signature
(class, parameter shapes, input shapes) was measured before is not run again.
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..errors import UntraceableModelError
from . import classify
from .measure import MeasuringInterpreter, Recorder, _nbytes, _tensors
from .types import ActivationBytes, Layer, ModelGraph


class _Tracer(fx.Tracer):
    """Keeps torch.nn modules, norm modules and the given block classes as single calls."""

    def __init__(self, block_types: tuple[type, ...]):
        super().__init__()
        self.block_types = block_types

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if self.block_types and isinstance(m, self.block_types):
            return True
        return classify.is_norm_module(m) or super().is_leaf_module(m, qualname)


def find_block_type(model: nn.Module) -> type | None:
    """Class of the repeated decoder block: the ModuleList of one class holding most parameters."""
    best, best_params = None, -1
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            kinds = {type(m) for m in module}
            if len(kinds) != 1:
                continue
            n = sum(p.numel() for p in module.parameters())
            if n > best_params:
                best, best_params = type(module[0]), n
    return best


def _trace(module: nn.Module, block_types: tuple[type, ...], what: str) -> fx.GraphModule:
    try:
        graph = _Tracer(block_types).trace(module)
    except Exception as exc:  # fx raises many types; all mean "cannot trace"
        raise UntraceableModelError(
            f"torch.fx could not trace {what} ({type(module).__name__}): "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. "
            "Fix: remove data-dependent Python control flow from its forward, or mark the "
            "failing submodule as a leaf."
        ) from exc
    return fx.GraphModule(module, graph)


def _meta_map(model: nn.Module, dtype: torch.dtype | None) -> dict[int, torch.Tensor]:
    """Meta stand-ins for every parameter and buffer, in the compute dtype, tied weights shared."""
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


class _Extraction:
    """One extraction run; owns every cache (block traces, measured signatures)."""

    def __init__(self, model, block_type, meta_of, recorder):
        self.model, self.block_type, self.meta_of, self.rec = model, block_type, meta_of, recorder
        self.block_graphs: dict[str, fx.GraphModule] = {}
        self.measured: dict[str, Layer] = {}
        self.layers: list[Layer] = []
        self.output_shapes: dict[str, tuple] = {}
        self.param_ids: set[int] = set()
        self.last_block_out = None

    def signature(self, module, args) -> str:
        params = tuple((n, tuple(p.shape)) for n, p in module.named_parameters())
        shapes = tuple((tuple(t.shape), str(t.dtype)) for t in _tensors(args))
        return f"{type(module).__qualname__}{params}{shapes}"

    def run_block(self, node: fx.Node, module: nn.Module, args, kwargs):
        sig = self.signature(module, (args, kwargs))
        x = _tensors(args)[0]
        index = len(self.layers)
        name = node.target if isinstance(node.target, str) else node.name
        self.param_ids.update(id(p) for p in module.parameters())
        if sig in self.measured:
            done = self.measured[sig]
            self.layers.append(Layer(**{**done.__dict__, "index": index, "name": name}))
            shape, dtype = self.output_shapes[sig]
            # a non-leaf: FlopCounterMode's module tracker cannot hook a leaf under autograd.grad
            out = torch.empty(shape, dtype=dtype, device="meta").requires_grad_().clone()
            self.rec.layer = len(self.layers)
            self.last_block_out = out
            return out
        gm = self.block_graphs.get(type(module).__qualname__ + str(id(module)))
        if gm is None:
            gm = _trace(module, (), f"block {name}")
        interp = MeasuringInterpreter(gm, self.meta_of, self.rec)
        for ph, a in zip([n for n in gm.graph.nodes if n.op == "placeholder"], list(args)):
            interp.region[ph] = "seq" if isinstance(a, torch.Tensor) and a.requires_grad \
                else "const"
        self.rec.layer = index
        out = interp.run(*args, **kwargs)
        layer = self.finish(index, name, "block", sig, interp, inputs=[x], output=out)
        self.measured[sig] = layer
        self.output_shapes[sig] = (tuple(out.shape), out.dtype)
        self.layers.append(layer)
        self.rec.layer = len(self.layers)
        self.last_block_out = out
        return out

    def finish(self, index, name, kind, sig, interp, inputs, output) -> Layer:
        """Measure the backward FLOPs and collect saved bytes of the layer just run."""
        self.param_ids.update(interp.layer_params)
        params = [self.meta_of[i] for i in interp.layer_params]
        wrt = [t for t in inputs if t.requires_grad] + [p for p in params if p.requires_grad]
        outs = [t for t in _tensors(output) if t.requires_grad]
        before = self.rec.flop_counter.get_total_flops()
        if outs and wrt:
            torch.autograd.grad(outs, wrt, grad_outputs=[torch.ones_like(t) for t in outs],
                                allow_unused=True, retain_graph=True)
        bwd = self.rec.flop_counter.get_total_flops() - before + self.rec.extra_bwd_flops
        self.rec.extra_bwd_flops = 0.0
        seq = tp = core = 0
        for s in self.rec.saved.values():
            if s.layer != index:
                continue
            if s.core_producer and s.savers_core:
                core += s.nbytes
            elif s.region == "tp":
                tp += s.nbytes
            else:
                seq += s.nbytes
        ops = tuple(interp.ops)
        rows = tuple(o.bytes_written for o in ops if o.tp_role == "row")
        col_inputs = {}
        for node, op in zip(interp.op_nodes, ops):
            if node is not None and op.tp_role == "column":
                src = node.args[0]
                col_inputs[src] = _nbytes(interp.env[src])
        heads = getattr(interp, "heads", (0, 0))
        return Layer(
            index=index, name=name, kind=kind, signature=sig, ops=ops,
            num_parameters=sum(p.numel() for p in params),
            param_bytes=sum(_nbytes(p) for p in params),
            fwd_flops=float(sum(o.fwd_flops for o in ops)), bwd_flops=float(bwd),
            activations=ActivationBytes(seq=seq, tp=tp, core=core,
                                        layer_input=sum(_nbytes(t) for t in inputs
                                                        if t.is_floating_point())),
            output_bytes=sum(_nbytes(t) for t in _tensors(output)),
            tp_row_outputs=rows, tp_column_inputs=tuple(col_inputs.values()),
            attention_heads=heads[0], kv_heads=heads[1],
            shared_parameters=sum(p.numel() for p in params) - sum(o.num_parameters for o in ops),
        )


def _logits(output) -> torch.Tensor:
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


def extract(model: nn.Module, seq_len: int, micro_batch_size: int = 1, *,
            dtype: torch.dtype | None = None, flash_attention: bool = True,
            name: str | None = None) -> ModelGraph:
    """Extract the measured layer graph of a causal language model.

    Args:
        model: an ``nn.Module`` mapping ``input_ids`` [b, s] (int64) to logits [b, s, vocab];
            built on the meta device preferably (real tensors are replaced by meta stand-ins and
            the model is not modified).
        seq_len: tokens per sequence, s.
        micro_batch_size: sequences per micro-batch, b.
        dtype: compute dtype of parameters and activations (default: the model's own).
        flash_attention: model SDPA as flash attention (else as the unfused math path).
        name: name to record (default: the model class name).

    Returns:
        :class:`ModelGraph` with one :class:`Layer` for the embedding, each block and the head.

    Raises:
        UntraceableModelError: torch.fx cannot trace the model, or it returns no logits.
        ValueError: seq_len or micro_batch_size below 1.
    """
    if seq_len < 1 or micro_batch_size < 1:
        raise ValueError(f"seq_len and micro_batch_size must be >= 1; got {seq_len}, "
                         f"{micro_batch_size}")
    block_type = find_block_type(model)
    gm = _trace(model, (block_type,) if block_type else (), "the model")
    meta_of = _meta_map(model, dtype)
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    vocab = embeddings[0].num_embeddings if embeddings else None
    excluded = {t.untyped_storage()._cdata for t in meta_of.values()}
    was_training = model.training
    model.train()
    counter = FlopCounterMode(display=False)
    rec = Recorder(flop_counter=counter, excluded=excluded, vocab_size=vocab, flash=flash_attention)
    run = _Extraction(model, block_type, meta_of, rec)
    top = MeasuringInterpreter(gm, meta_of, rec, block_runner=None,
                               is_block=lambda m: block_type is not None and isinstance(m, block_type))
    ids = torch.zeros((micro_batch_size, seq_len), dtype=torch.long, device="meta")
    split: dict = {"ops_before": 0, "embed": None}

    def block_runner(node, module, args, kwargs):
        if split["embed"] is None:
            split["embed"] = run.finish(0, "embed", "embedding", "embed", top, inputs=[],
                                        output=_tensors(args)[0])
            run.layers.append(split["embed"])
            top.ops.clear()
            top.op_nodes.clear()
            top.layer_params.clear()
        return run.run_block(node, module, args, kwargs)

    top.block_runner = block_runner
    try:
        with counter, torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
            rec.layer = 0
            output = top.run(ids)
            if split["embed"] is None:  # no blocks at all: everything is "embed"
                split["embed"] = run.finish(0, "embed", "embedding", "embed", top, inputs=[],
                                            output=output)
                run.layers.append(split["embed"])
                top.ops.clear()
                top.op_nodes.clear()
                top.layer_params.clear()
            head_index = len(run.layers)
            rec.layer = head_index
            head_input = _tensors(run.last_block_out)
            logits = _logits(output)
            loss = _loss(top, rec, logits)
            head = run.finish(head_index, "head", "head", "head", top, inputs=head_input,
                              output=loss)
            run.layers.append(head)
    finally:
        model.train(was_training)
    layers = tuple(run.layers)
    blocks = [layer for layer in layers if layer.kind == "block"]
    hidden = blocks[0].output_bytes // (micro_batch_size * seq_len * _elem(dtype, model)) \
        if blocks else 0
    return ModelGraph(
        name=name or type(model).__name__, seq_len=seq_len, micro_batch_size=micro_batch_size,
        dtype_bytes=_elem(dtype, model), layers=layers,
        num_parameters=sum(meta_of[i].numel() for i in run.param_ids),
        hidden_size=int(hidden), vocab_size=int(vocab or 0), method="fx",
    )


def _elem(dtype, model) -> int:
    if dtype is not None:
        return torch.empty((), dtype=dtype).element_size()
    for p in model.parameters():
        if p.is_floating_point():
            return p.element_size()
    return 4


def _loss(top: MeasuringInterpreter, rec: Recorder, logits: torch.Tensor) -> torch.Tensor:
    """Cross entropy in fp32 over the logits, recorded as the head's last op (Megatron upcasts)."""
    from .types import Op

    rec.op_name, rec.op_is_core, rec.op_region, rec.op_kind = "loss", False, "tp", "loss"
    before = rec.flop_counter.get_total_flops()
    flat = logits.float().reshape(-1, logits.shape[-1])
    labels = torch.zeros(flat.shape[0], dtype=torch.long, device="meta")
    loss = F.cross_entropy(flat, labels)
    top.op_nodes.append(None)
    top.ops.append(Op(name="loss", kind="loss", target="cross_entropy",
                      fwd_flops=float(rec.flop_counter.get_total_flops() - before),
                      bytes_read=_nbytes(logits), bytes_written=_nbytes(flat),
                      num_parameters=0, region="tp"))
    return loss
