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
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..errors import AutoparError, InvalidModelConfig, UntraceableModelError
from . import classify
from .assemble import add_loss, elem_bytes, finish_layer, logits_of, meta_map, reset_ops
from .measure import MeasuringInterpreter, Recorder, tensors_of
from .types import Layer, ModelGraph


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


#: torch functions of expert routing, which only the torch.export path recognises (router
#: linears, grouped expert GEMMs: :mod:`autopar.graph.aten`, :mod:`autopar.graph.export_run`)
_ROUTING = tuple(f for f in (torch.topk, getattr(torch, "_grouped_mm", None)) if f is not None)


def _check_no_routing(gm: fx.GraphModule, name: str) -> None:
    """Raise when block ``gm`` routes tokens to experts (a ``topk`` or a grouped GEMM): this
    interpreter prices neither (``_grouped_mm`` counts 0 FLOPs here) and keeps routers
    TP-sharded, so :func:`extract` takes the model through torch.export instead.

    Raises:
        UntraceableModelError: the block has such a call.
    """
    for n in gm.graph.nodes:
        if (n.op == "call_function" and n.target in _ROUTING) or (
                n.op == "call_method" and n.target == "topk"):
            raise UntraceableModelError(
                f"block {name} routes tokens to experts ({n.target}), which the torch.fx path "
                "does not model; measured through torch.export")


def _check_priced_modules(model: nn.Module) -> None:
    """Refuse a model holding ``nn.MultiheadAttention`` (or a torch ``nn.Transformer*`` layer
    built on it), which both extraction paths misprice: torch.fx keeps torch's modules whole
    and reads it as one element-wise op, and the torch.export path loses its fused attention
    kernel's projections and attention as well, so they would cost nothing (a model written
    with it came out 40% faster than the same shapes written with SDPA). Other torch modules
    with weights (a depthwise ``nn.Conv1d`` of a linear-attention layer) are priced where the
    graph knows them (:mod:`autopar.graph.classify`).

    Raises:
        InvalidModelConfig: naming the module and the fix.
    """
    for qualname, m in model.named_modules():
        if isinstance(m, nn.MultiheadAttention):
            raise InvalidModelConfig(
                f"{qualname or 'the model'} is a {type(m).__name__}, whose weight matrices and "
                "kernels autopar does not price (it would read the call as one element-wise "
                "op: its GEMMs and attention would cost nothing). Fix: write the layer with "
                "nn.Linear projections and F.scaled_dot_product_attention (as Hugging Face and "
                "torchtitan models do), or use a built-in preset.")


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
        shapes = tuple((tuple(t.shape), str(t.dtype)) for t in tensors_of(args))
        return f"{type(module).__qualname__}{params}{shapes}"

    def run_block(self, node: fx.Node, module: nn.Module, args, kwargs):
        sig = self.signature(module, (args, kwargs))
        x = tensors_of(args)[0]
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
            _check_no_routing(gm, name)
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
        return finish_layer(self.rec, self.meta_of, interp, index, name, kind, sig, inputs, output)


def extract(model: nn.Module, seq_len: int, micro_batch_size: int = 1, *,
            dtype: torch.dtype | None = None, flash_attention: bool = True,
            name: str | None = None) -> ModelGraph:
    """Extract the measured layer graph of a causal language model.

    torch.fx first (fast: repeated blocks traced once); where fx cannot trace or run the model
    (Hugging Face transformers 5.x models, data-dependent Python), ``torch.export`` on the meta
    device (:mod:`autopar.graph.export`); ``ModelGraph.method`` says which was used.

    Args:
        model: an ``nn.Module`` mapping ``input_ids`` [b, s] (int64) to logits [b, s, vocab]
            (a tensor, a tuple starting with it, or an object with ``.logits``); built on the
            meta device preferably (real tensors are replaced by meta stand-ins and the model is
            not modified).
        seq_len: tokens per sequence, s.
        micro_batch_size: sequences per micro-batch, b.
        dtype: compute dtype of parameters and activations (default: the model's own).
        flash_attention: model SDPA as flash attention (else as the unfused math path).
        name: name to record (default: the model class name).

    Returns:
        :class:`ModelGraph` with one :class:`Layer` for the embedding, each block and the head
        (final norm, LM head and a cross-entropy loss). FLOPs are FlopCounterMode's
        (multiply-add = 2), attention non-causal; sizes are for one micro-batch.

    Raises:
        UntraceableModelError: neither torch.fx nor torch.export can capture and run the model
            (the message names the module and operation that failed and what to do), or it
            returns no logits.
        InvalidModelConfig: the model holds a torch module neither path prices
            (``nn.MultiheadAttention``: :func:`_check_priced_modules`).
        ValueError: seq_len or micro_batch_size below 1.
    """
    if seq_len < 1 or micro_batch_size < 1:
        raise ValueError(f"seq_len and micro_batch_size must be >= 1; got {seq_len}, "
                         f"{micro_batch_size}")
    _check_priced_modules(model)
    try:
        return _extract_fx(model, seq_len, micro_batch_size, dtype, flash_attention, name)
    except Exception as exc:  # noqa: BLE001 - any fx failure means: try torch.export
        if isinstance(exc, AutoparError) and not isinstance(exc, UntraceableModelError):
            raise
        fx_error = _first_line(exc)
    from .export import extract_exported  # heavy path, imported only when needed

    return extract_exported(model, seq_len, micro_batch_size, dtype=dtype,
                            flash_attention=flash_attention, name=name, fx_error=fx_error)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _extract_fx(model: nn.Module, seq_len: int, micro_batch_size: int, dtype, flash_attention,
                name) -> ModelGraph:
    """The torch.fx path of :func:`extract` (same arguments and result; raises on any failure)."""
    block_type = find_block_type(model)
    gm = _trace(model, (block_type,) if block_type else (), "the model")
    meta_of = meta_map(model, dtype)
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
                                        output=tensors_of(args)[0])
            run.layers.append(split["embed"])
            reset_ops(top)
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
                reset_ops(top)
            head_index = len(run.layers)
            rec.layer = head_index
            head_input = tensors_of(run.last_block_out)
            logits = logits_of(output)
            loss = add_loss(top, rec, logits)
            head = run.finish(head_index, "head", "head", "head", top, inputs=head_input,
                              output=loss)
            run.layers.append(head)
    finally:
        model.train(was_training)
    layers = tuple(run.layers)
    blocks = [layer for layer in layers if layer.kind == "block"]
    hidden = blocks[0].output_bytes // (micro_batch_size * seq_len * elem_bytes(dtype, model)) \
        if blocks else 0
    return ModelGraph(
        name=name or type(model).__name__, seq_len=seq_len, micro_batch_size=micro_batch_size,
        dtype_bytes=elem_bytes(dtype, model), layers=layers,
        num_parameters=sum(meta_of[i].numel() for i in run.param_ids),
        hidden_size=int(hidden), vocab_size=int(vocab or 0), method="fx",
    )
