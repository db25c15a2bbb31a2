"""The ``torch.export`` path of :func:`autopar.graph.extract`, for models torch.fx cannot trace.

How: find the repeated decoder blocks (the largest ``nn.ModuleList`` of one class) and keep one
representative of each distinct block structure; export the model with only those blocks
(``torch.export`` on meta tensors; a 126-block model exports as a 1-block one, so a 405B config
takes seconds), then interpret the flat aten graph on meta tensors like the fx path does. Nodes are
grouped into layers by the block index in their ``nn_module_stack``; nodes before the first block
form ``embed``, after the last ``head`` (plus a cross-entropy loss). Each representative's measured
layer stands for every block with its structure. The model's module list is swapped for the
export and always restored.

Kernels as a training run executes them (:mod:`autopar.graph.kernels`): attention as flash
attention on the KV heads (HF's ``repeat_kv`` copies become views), a norm module's decomposition
(HF RMSNorm: to/pow/mean/rsqrt/mul) as one fused norm, an activation module's decomposition (HF
``gelu_new``) as one fused activation, MoE expert GEMMs (``_grouped_mm``) by
:func:`~autopar.graph.kernels.grouped_gemm_flops`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import io
import linecache
import logging
import os
import re
import sys

import torch
import torch.fx as fx
from torch import nn
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils.flop_counter import FlopCounterMode

from ..errors import UntraceableModelError
from . import aten as A
from .assemble import (add_loss, elem_bytes, finish_layer, logits_of, meta_copy, meta_map,
                       on_meta, reset_ops)
from .export_run import ExportInterpreter, fused_groups
from .measure import Recorder
from .needs import LM_FIX, LM_NEEDS
from .spans import attention_span
from .types import Layer, ModelGraph

# attributes that differ between otherwise identical blocks and do not change the computation
_POSITION_ATTR = re.compile(r"(idx|index|layer_id|layer_number|layer_num)$")


@contextlib.contextmanager
def quiet_torch_logs():
    """Silence torch's own loggers (``torch`` and every ``torch.*`` one) for the duration.

    Why: when a model cannot run under torch.export, torch logs full tracebacks on stderr
    (e.g. ``torch._subclasses.fake_tensor`` logs "failed while attempting to run meta for
    aten.mm.default" with ``log.exception``) before raising; autopar turns the exception into an
    :class:`~autopar.errors.UntraceableModelError` naming the module and the fix, so the logged
    traceback is noise. torch registers a stderr handler on many of its loggers with
    ``propagate=False``, so each one's level is raised above CRITICAL and restored after.
    """
    loggers = [logging.getLogger("torch")] + [
        lg for name, lg in sorted(logging.root.manager.loggerDict.items())
        if name.startswith("torch.") and isinstance(lg, logging.Logger)]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.CRITICAL + 1)
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextlib.contextmanager
def _held_output():
    """Hold what is printed to stdout and stderr; print it only if the block succeeds.

    Why: when torch.export fails on a data-dependent branch it prints the partial graph it
    traced (``print(e.partial_fx_graph, file=sys.stderr)`` in torch/export/_trace.py
    ``_log_export_wrapper``), about 50 lines per attempt, before raising; autopar raises its
    own error naming the module, the line and the fix instead.
    """
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield
    sys.stdout.write(out.getvalue())
    sys.stderr.write(err.getvalue())


def find_block_list(model: nn.Module) -> tuple[str, nn.ModuleList] | tuple[None, None]:
    """(path, list) of the repeated decoder blocks: the one-class ModuleList with most parameters."""
    best, best_params = (None, None), -1
    for path, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 \
                and len({type(m) for m in module}) == 1:
            n = sum(p.numel() for p in module.parameters())
            if n > best_params:
                best, best_params = (path, module), n
    return best


def block_fingerprint(block: nn.Module) -> tuple:
    """What decides a block's computation: class, parameter shapes and dtypes, and the scalar
    attributes of its submodules (e.g. HF's ``attention_type``), positional indices excluded."""
    params = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in block.named_parameters())
    attrs = []
    for path, m in block.named_modules():
        for key, value in sorted(vars(m).items()):
            if isinstance(value, (bool, int, float, str)) and not key.startswith("_") \
                    and not _POSITION_ATTR.search(key):
                attrs.append((path, key, value))
    return type(block).__qualname__, params, tuple(attrs)


def _inputs_kwargs(model: nn.Module, ids: torch.Tensor) -> tuple[tuple, dict]:
    params = inspect.signature(model.forward).parameters
    kwargs = {"use_cache": False} if "use_cache" in params else {}
    if "input_ids" in params:
        return (), {"input_ids": ids, **kwargs}
    return (ids,), kwargs


def _export(model, ids, path, blocks, keep: list[int]):
    """Export ``model`` with its block list cut to ``keep``; returns (program, placeholder values
    by name, parameter placeholders by name, module by path)."""
    parent, _, attr = path.rpartition(".") if path else ("", "", "")
    owner = model.get_submodule(parent) if parent else model
    if path is not None:
        setattr(owner, attr, nn.ModuleList([blocks[i] for i in keep]))
    try:
        args, kwargs = _inputs_kwargs(model, ids)
        with _held_output():
            program = torch.export.export(model, args, kwargs)
        values, params = {}, {}
        user = iter(list(args) + list(kwargs.values()))
        for spec in program.graph_signature.input_specs:
            name, kind = spec.arg.name, spec.kind.name
            if kind == "PARAMETER":
                params[name] = values[name] = model.get_parameter(spec.target)
            elif kind == "BUFFER":
                values[name] = model.get_buffer(spec.target)
            elif kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
                values[name] = program.constants[spec.target]
            else:
                values[name] = next(user, None)
        modules = dict(model.named_modules())
    finally:
        if path is not None:
            setattr(owner, attr, blocks)
    return program, values, params, modules


def _layer_keys(graph: fx.Graph, path: str | None) -> dict[fx.Node, object]:
    """Layer of each node: a block position (int), "embed" before the blocks, "head" after."""
    keys: dict[fx.Node, object] = {}
    prefix = f"{path}." if path else None
    current: object = "embed"
    last_block = -1
    for i, n in enumerate(n for n in graph.nodes if n.op == "call_function"):
        for fqn, _ in (n.meta.get("nn_module_stack") or {}).values():
            if prefix and fqn.startswith(prefix):
                current, last_block = int(fqn[len(prefix):].split(".")[0]), i
                break
        keys[n] = current  # model-level nodes between blocks belong to the block before
    for i, n in enumerate(keys):
        if i > last_block >= 0:
            keys[n] = "head"
    return keys


def _signature(nodes: list[fx.Node], cls: str, spans: dict) -> str:
    # the attention span is in the signature: a sliding-window and a global layer run the same
    # ops on the same shapes (only the mask differs) but cost differently
    parts = [f"{spans[n]}" for n in nodes if n in spans]
    for n in nodes:
        val = n.meta.get("val")
        shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None
        parts.append(f"{A.packet(n.target)}{shape}{getattr(val, 'dtype', '')}")
    return f"{cls}:{hashlib.sha1('|'.join(parts).encode()).hexdigest()[:16]}"


def _spans(graph: fx.Graph, modules: dict[str, nn.Module],
           eager: dict) -> dict[fx.Node, tuple[str, int]]:
    """{attention node: (span kind, tokens)} for attention nodes that do not see every key,
    read from the attention module the node runs in (:func:`~autopar.graph.spans.attention_span`).
    ``eager``: eager attentions by their last GEMM (:func:`~autopar.graph.aten.eager_attentions`)."""
    out = {}
    for n in graph.nodes:
        if n not in eager and (n.op != "call_function" or A.packet(n.target) not in A.ATTENTION):
            continue
        stack = n.meta.get("nn_module_stack") or {}
        module = modules.get(list(stack.values())[-1][0]) if stack else None
        span = attention_span(module)
        if span[0] != "full":
            out[n] = span
    return out


def _failure(model: nn.Module, exc: BaseException, fx_error: str) -> UntraceableModelError:
    """An error naming the innermost module of ``model`` on the traceback and the line of the
    model's own code (not torch's) where it failed."""
    names = {id(m): (p or "<root>") for p, m in model.named_modules()}
    where, line, place = type(model).__name__, "", ""
    # the model's own code: not torch's, nor autopar's (which only called torch.export)
    library = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    tb = exc.__traceback__
    while tb is not None:
        frame, code = tb.tb_frame, tb.tb_frame.f_code
        # the module a method runs on: its first argument, whatever it is named
        owner = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
        if id(owner) in names:
            where = f"'{names[id(owner)]}' ({type(owner).__name__})"
        if not code.co_filename.startswith(library):
            text = linecache.getline(code.co_filename, tb.tb_lineno).strip()
            if text:
                line = text
                place = f"{os.path.basename(code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    text = str(exc).strip().splitlines()
    data_dependent = (isinstance(exc, GuardOnDataDependentSymNode)
                      or "data-dependent" in str(exc).lower())
    at = f" at `{line}` ({place})" if line else ""
    if data_dependent:
        return UntraceableModelError(
            f"cannot capture {type(model).__name__}: module {where} reads a tensor's value in "
            f"Python (a branch on a tensor, .item(), .tolist()){at}; autopar traces on meta "
            "tensors, which have shapes but no values, so neither torch.fx nor torch.export can "
            "follow it. Fix: compute both sides and select with torch.where (or torch.cond), or "
            "move the check out of forward.")
    # a shape or dtype error: the model does not take token ids as an LM does
    fix = (f"That module cannot run on token ids [batch, seq] (int64) passed as input_ids. "
           f"{LM_NEEDS}. {LM_FIX}.")
    return UntraceableModelError(
        f"cannot capture {type(model).__name__}: torch.fx failed ({fx_error}); torch.export failed "
        f"in module {where}{at}: {type(exc).__name__}: {text[0].rstrip('.') if text else ''}. "
        f"{fix}")


def extract_exported(model: nn.Module, seq_len: int, micro_batch_size: int, *,
                     dtype: torch.dtype | None, flash_attention: bool, name: str | None,
                     fx_error: str = "not tried") -> ModelGraph:
    """:func:`autopar.graph.extract` through ``torch.export`` (same arguments and result).

    Returns a :class:`ModelGraph` with ``method="export"``; FLOPs from FlopCounterMode per aten
    op (multiply-add = 2), attention by :func:`~autopar.graph.kernels.sdpa_forward_flops`
    (non-causal), grouped expert GEMMs by :func:`~autopar.graph.kernels.grouped_gemm_flops`.

    Raises:
        UntraceableModelError: torch.export cannot capture the model, or the captured graph
            cannot run on meta tensors; the message names the module and op and what to do.
    """
    if not on_meta(model):
        # torch.export records the devices real tensors are on (Hugging Face RoPE moves its
        # inv_freq buffer with ``.to(x.device)``), and the captured graph then copies meta
        # tensors to the CPU, which fails: export a meta copy, as for a model built on meta
        model = meta_copy(model)
    path, blocks = find_block_list(model)
    n_blocks = len(blocks) if blocks is not None else 0
    fingerprints = [block_fingerprint(b) for b in blocks] if blocks is not None else []
    reps: list[int] = []
    rep_of: list[int] = []
    for fp in fingerprints:
        if fp not in [fingerprints[r] for r in reps]:
            reps.append(len(rep_of))
        rep_of.append([fingerprints[r] for r in reps].index(fp))
    ids = torch.zeros((micro_batch_size, seq_len), dtype=torch.long, device="meta")
    was_training = model.training
    model.train()
    with quiet_torch_logs():
        try:
            try:
                program, values, params, modules = _export(model, ids, path, blocks, reps)
            except Exception:  # noqa: BLE001 - a cut model may break; the whole one is the fallback
                if len(reps) == n_blocks:
                    raise
                reps, rep_of = list(range(n_blocks)), list(range(n_blocks))
                program, values, params, modules = _export(model, ids, path, blocks, reps)
        except Exception as exc:  # noqa: BLE001 - torch.export raises many types
            raise _failure(model, exc, fx_error) from exc
        finally:
            model.train(was_training)
        return _measure(model, program, values, params, modules, path, reps, rep_of, seq_len,
                        micro_batch_size, dtype, flash_attention, name, fx_error)


def _measure(model, program, values, params, modules, path, reps, rep_of, seq_len, mbs, dtype,
             flash, name, fx_error) -> ModelGraph:
    gm = program.graph_module
    meta_of = meta_map(model, dtype)
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    vocab = getattr(getattr(model, "config", None), "vocab_size", None) or (
        embeddings[0].num_embeddings if embeddings else None)
    counter = FlopCounterMode(display=False)
    rec = Recorder(flop_counter=counter, excluded={t.untyped_storage()._cdata
                                                   for t in meta_of.values()},
                   vocab_size=vocab, flash=flash)
    keys = _layer_keys(gm.graph, path)
    nodes_of: dict[object, list[fx.Node]] = {}
    for n, k in keys.items():
        nodes_of.setdefault(k, []).append(n)
    order = list(nodes_of)
    groups = fused_groups(gm.graph, modules, set(params))
    eager = A.eager_attentions(gm.graph, set(params))
    spans = _spans(gm.graph, modules, eager)
    measured: dict[object, Layer] = {}
    state = {"key": order[0] if order else "embed"}

    def boundary(key, index):
        """Finish layer ``key``: its inputs come from earlier layers, outputs go to later ones."""
        inside = set(nodes_of.get(key, ()))
        ins = {a for m in inside for a in m.all_input_nodes if a not in inside}
        outs = [m for m in inside if any(u not in inside for u in m.users)]
        inputs = [interp.env[a] for a in ins if isinstance(interp.env.get(a), torch.Tensor)
                  and a.name not in values and interp.env[a].requires_grad]
        output = [interp.env[m] for m in outs if isinstance(interp.env.get(m), torch.Tensor)]
        # what flows on is the residual stream; masks, positions and RoPE tables are recomputable
        output = [t for t in output if t.requires_grad] or output
        cls = type(modules.get(f"{path}.{key}")).__name__ if isinstance(key, int) else str(key)
        sig = _signature(nodes_of[key], cls, spans) if isinstance(key, int) else str(key)
        kind = "block" if isinstance(key, int) else "embedding"
        measured[key] = finish_layer(rec, meta_of, interp, index, str(key), kind, sig, inputs,
                                     output)
        reset_ops(interp)

    def on_node(n):
        key = keys.get(n)
        if key is None or key == state["key"]:
            return
        boundary(state["key"], order.index(state["key"]))
        state["key"] = key
        rec.layer = order.index(key)
        # only the head's linear may be the vocabulary-parallel LM head (a block's MLP can be as
        # wide as the vocabulary)
        rec.vocab_size = None if isinstance(key, int) else vocab
        # cut autograd at the layer's inputs (as the fx path's stand-ins do), so that measuring
        # this layer's backward never runs earlier layers' (a tied LM head reaches the embedding)
        inside = set(nodes_of[key])
        for a in {a for m in inside for a in m.all_input_nodes if a not in inside}:
            v = interp.env.get(a)
            if isinstance(v, torch.Tensor) and v.requires_grad and a.name not in values:
                interp.env[a] = v.detach().requires_grad_().view_as(v)

    placeholder_values = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = values.get(n.name)
        v = meta_of.get(id(v), v) if isinstance(v, torch.Tensor) else v
        if isinstance(v, torch.Tensor) and v.device.type != "meta":
            v = torch.empty(v.shape, dtype=v.dtype, device="meta")
        placeholder_values.append(v)
    scans = A.kernel_calls(gm.graph, "chunk_gated_delta_rule")
    interp = ExportInterpreter(gm, meta_of, rec, params, groups, on_node, spans, eager, scans)
    for n in gm.graph.nodes:
        if n.op == "placeholder" and n.name in values and n.name not in \
                program.graph_signature.user_inputs:
            interp.region[n] = "const"
    rec.layer = 0
    try:
        with counter, torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
            outputs = interp.run(*placeholder_values)
            head_key = state["key"]
            if head_key != "head":  # the graph ended inside a block: an empty head
                boundary(head_key, order.index(head_key))
                head_key = "head"
                order.append(head_key)
            rec.layer = order.index(head_key)
            block_outs = [interp.env[a] for a in {a for m in nodes_of.get("head", ())
                                                  for a in m.all_input_nodes}
                          if keys.get(a) != "head" and a.name not in values
                          and isinstance(interp.env.get(a), torch.Tensor)
                          and interp.env[a].requires_grad]
            loss = add_loss(interp, rec, logits_of(outputs))
            measured[head_key] = finish_layer(rec, meta_of, interp, order.index(head_key), "head",
                                              "head", "head", block_outs, loss)
    except UntraceableModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - report the node that failed
        node = getattr(interp, "_node", None)
        stack = (node.meta.get("nn_module_stack") or {}) if node is not None else {}
        where = list(stack.values())[-1][0] if stack else "<root>"
        raise UntraceableModelError(
            f"the torch.export graph of {type(model).__name__} does not run on meta tensors: op "
            f"{getattr(node, 'target', '?')} in module '{where}' failed with "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}. Fix: "
            "build the model on the meta device with standard ops, or make that module a leaf "
            "torch.fx can trace.") from exc
    return _assemble(model, measured, path, rep_of, seq_len, mbs, dtype, name, fx_error)


def _assemble(model, measured, path, rep_of, seq_len, mbs, dtype, name, fx_error) -> ModelGraph:
    """Lay out embed, one layer per block (its representative's measurement) and head."""
    layers = [dataclasses.replace(measured["embed"], index=0, name="embed", kind="embedding")] \
        if "embed" in measured else []
    for j, r in enumerate(rep_of):
        layers.append(dataclasses.replace(measured[r], index=len(layers), name=f"{path}.{j}",
                                          kind="block"))
    layers.append(dataclasses.replace(measured["head"], index=len(layers)))
    blocks = [layer for layer in layers if layer.kind == "block"]
    elem = elem_bytes(dtype, model)
    hidden = blocks[0].output_bytes // (mbs * seq_len * elem) if blocks else 0
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    vocab = getattr(getattr(model, "config", None), "vocab_size", None) or (
        embeddings[0].num_embeddings if embeddings else 0)
    return ModelGraph(
        name=name or type(model).__name__, seq_len=seq_len, micro_batch_size=mbs,
        dtype_bytes=elem, layers=tuple(layers),
        num_parameters=sum(p.numel() for p in model.parameters()),
        hidden_size=int(hidden), vocab_size=int(vocab or 0), method="export",
        notes=(f"torch.fx: {fx_error}",),
    )
