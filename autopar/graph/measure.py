"""Run an fx graph on meta tensors and measure every op: FLOPs, bytes, saved activations.

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode`` around each node (attention by the
rule in :mod:`autopar.graph.kernels`). Saved activations come from autograd itself:
``torch.autograd.graph.saved_tensors_hooks`` sees every tensor an op keeps for backward; storages
are deduplicated (a tensor saved by three linears counts once) and parameters and buffers are not
activations. Nothing here reads module names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from . import classify
from .kernels import (ATTENTION_BACKWARD_RATIO, UNFUSED_SCORE_BYTES, FlashAttentionMeta,
                      FusedGLUMeta, FusedNormMeta, sdpa_forward_flops)
from .types import Op


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def tensors_of(value) -> list[torch.Tensor]:
    """Tensors inside a (nested) fx value."""
    out: list[torch.Tensor] = []
    fx.node.map_aggregate(value, lambda v: out.append(v) if isinstance(v, torch.Tensor) else None)
    return out


def tensor_nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements (numel x element size)."""
    return t.numel() * t.element_size()


@dataclass
class _Saved:
    nbytes: int
    region: str
    layer: int
    core_producer: bool
    savers_core: bool = True
    saver: str = ""     # the op that saved it first (Recorder.op_name)


@dataclass
class Recorder:
    """Mutable state of one extraction: which op runs now, what has been saved and by whom.

    Lives for one call of :func:`autopar.graph.extract`; never shared.
    """

    flop_counter: FlopCounterMode
    excluded: set[int]                        # storages of parameters and buffers
    vocab_size: int | None = None
    flash: bool = True
    layer: int = 0
    op_name: str = ""
    op_is_core: bool = False
    op_region: str = "seq"
    op_kind: str = ""
    saved: dict[int, _Saved] = field(default_factory=dict)
    producers: dict[int, tuple[str, bool]] = field(default_factory=dict)  # key -> (region, core)
    keep_alive: list[torch.Tensor] = field(default_factory=list)
    seen_params: set[int] = field(default_factory=set)
    extra_bwd_flops: float = 0.0
    #: (experts E, tokens T, k / E) while a "dense-routed" MoE layer runs (every token through
    #: every expert, HF Llama 4): saved tensors of E x T rows are kept at k / E of their size,
    #: what a top-k kernel keeps; None otherwise
    routed_rows: tuple[int, int, float] | None = None
    #: True while ops run that a fused kernel replaces (their saves are the kernel's, not theirs)
    suppress: bool = False
    #: True while a Linear op runs (a GEMM against a weight, not a MoE router)
    op_linear: bool = False
    #: per saved storage, whether Linear ops (True) and other ops (False) saved it
    saver_linear: dict[int, set[bool]] = field(default_factory=dict)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """saved_tensors_hooks pack hook: attribute a saved storage to the running op."""
        key = _storage_key(t)
        if key in self.excluded or self.suppress:
            return t
        self.saver_linear.setdefault(key, set()).add(self.op_linear)
        entry = self.saved.get(key)
        if entry is None:
            region, core = self.producers.get(key, (self.op_region, self.op_is_core))
            nbytes = t.untyped_storage().nbytes()
            if self.op_kind == "dropout" and key not in self.producers:
                # a dropout mask: GPU kernels keep it as one byte per element (torch's CPU/meta
                # kernels use the input dtype); Korthikanti et al. 2022 count 1 byte too
                nbytes = t.numel()
            if self.routed_rows is not None:
                e, tokens, frac = self.routed_rows
                if tuple(t.shape[:2]) == (e, tokens) or (t.dim() and t.shape[0] == e * tokens):
                    nbytes = round(nbytes * frac)
            self.saved[key] = _Saved(nbytes, region, self.layer, core, self.op_is_core,
                                     self.op_name)
            self.keep_alive.append(t)
        else:
            entry.savers_core = entry.savers_core and self.op_is_core
        return t

    def produced(self, value, region: str, core: bool) -> None:
        """Note the region of each tensor an op produced, for the tensors later saved."""
        for t in tensors_of(value):
            key = _storage_key(t)
            if key not in self.producers and key not in self.excluded:
                self.producers[key] = (region, core)
                self.keep_alive.append(t)

    def linear_input_bytes(self, layer: int) -> dict[str, int]:
        """Saved bytes of layer ``layer`` that Linear ops keep, as the
        :class:`autopar.graph.types.ActivationBytes` fields ``linear_seq``, ``linear_tp`` (kept
        by Linear ops only) and ``linear_shared_seq``, ``linear_shared_tp`` (kept by another op
        too), split by region as ``seq`` and ``tp`` are."""
        out = dict.fromkeys(("linear_seq", "linear_tp", "linear_shared_seq",
                             "linear_shared_tp"), 0)
        for key, s in self.saved.items():
            savers = self.saver_linear.get(key, set())
            if s.layer != layer or True not in savers or (s.core_producer and s.savers_core):
                continue
            shared = "_shared" if False in savers else ""
            out[f"linear{shared}_{'tp' if s.region == 'tp' else 'seq'}"] += s.nbytes
        return out

    def new_params(self, params: list[torch.Tensor]) -> int:
        """Elements of parameters not seen before (tied weights count once)."""
        n = 0
        for p in params:
            if id(p) not in self.seen_params:
                self.seen_params.add(id(p))
                n += p.numel()
        return n


class MeasuringInterpreter(fx.Interpreter):
    """Interprets a traced module on meta tensors, recording one :class:`Op` per node.

    Args:
        gm: the traced module; its parameters are replaced by ``meta_of`` at every use.
        meta_of: map from ``id(original tensor)`` to its meta stand-in (shared by tied weights).
        recorder: the extraction's :class:`Recorder`.
        regions: initial regions of placeholders (default "seq").
        block_runner: called for ``call_module`` nodes of block modules: ``(node, module, args)``.
    """

    def __init__(self, gm: fx.GraphModule, meta_of: dict[int, torch.Tensor], recorder: Recorder,
                 block_runner=None, is_block=lambda m: False):
        super().__init__(gm, garbage_collect_values=False)
        self.meta_of = meta_of
        self.rec = recorder
        self.block_runner = block_runner
        self.is_block = is_block
        self.region: dict[fx.Node, str] = {}
        self.ops: list[Op] = []
        self.op_nodes: list[fx.Node | None] = []
        self.layer_params: dict[int, torch.Tensor] = {}
        self.on_block = None

    # -- parameters ----------------------------------------------------------------------------
    def _meta(self, t):
        return self.meta_of.get(id(t), t) if isinstance(t, torch.Tensor) else t

    def fetch_attr(self, target: str):
        value = super().fetch_attr(target)
        if isinstance(value, nn.Parameter):
            self.layer_params[id(value)] = value
        return self._meta(value)

    # -- dispatch ------------------------------------------------------------------------------
    def call_module(self, target, args, kwargs):
        module = self.module.get_submodule(target)
        if self.is_block(module) and self.block_runner is not None:
            return self.block_runner(self._node, module, args, kwargs)
        sub = {}
        for name, t in list(module.named_parameters(remove_duplicate=False)) + list(
            module.named_buffers(remove_duplicate=False)
        ):
            sub[name] = self._meta(t)
            if isinstance(t, nn.Parameter):
                self.layer_params[id(t)] = t
        if classify.is_norm_module(module) and len(args) == 1 and not kwargs:
            return FusedNormMeta.apply(args[0], sub.get("weight"))
        return torch.func.functional_call(module, sub, args, kwargs, tie_weights=False)

    def call_function(self, target, args, kwargs):
        if target is torch.nn.functional.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        return super().call_function(target, args, kwargs)

    def _attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        flops = sdpa_forward_flops(q.shape, k.shape, v.shape)
        self.rec.extra_bwd_flops += ATTENTION_BACKWARD_RATIO * flops
        self._flops_override = flops
        self._attention_causal = bool(is_causal)
        self._heads = (q.shape[1], k.shape[1])
        b, h, s_q, _ = q.shape
        self._score_bytes = 0 if self.rec.flash else UNFUSED_SCORE_BYTES * b * h * s_q * k.shape[-2]
        return FlashAttentionMeta.apply(q, k, v, self.rec.flash, dropout_p > 0)

    # -- gated linear units ------------------------------------------------------------------------
    def activation_input(self, n: fx.Node) -> fx.Node | None:
        """The input node of a pointwise activation node (SiLU, GELU), else None."""
        if n.op == "call_function" and n.target in _ACTIVATIONS and n.args:
            return n.args[0] if isinstance(n.args[0], fx.Node) else None
        if n.op == "call_module":
            module = self.module.get_submodule(n.target)
            if isinstance(module, (nn.SiLU, nn.GELU)) and n.args:
                return n.args[0] if isinstance(n.args[0], fx.Node) else None
        return None

    def is_mul(self, n: fx.Node) -> bool:
        """True for an elementwise product of two tensors."""
        return (n.op == "call_function" and n.target in (operator.mul, torch.mul)) or (
            n.op == "call_method" and n.target == "mul")

    def _plan_glu(self) -> None:
        """Find act(a) * b pairs, to run them as one fused GLU kernel (see FusedGLUMeta)."""
        self._glu_act: dict[fx.Node, fx.Node] = {}
        self._glu_mul: dict[fx.Node, tuple[fx.Node, fx.Node]] = {}
        for n in self.module.graph.nodes:
            src = self.activation_input(n)
            users = list(n.users)
            if src is None or len(users) != 1 or not self.is_mul(users[0]):
                continue
            mul = users[0]
            others = [a for a in mul.args if isinstance(a, fx.Node) and a is not n]
            if len(others) == 1 and len(mul.args) == 2:
                self._glu_act[n] = src
                self._glu_mul[mul] = (src, others[0])

    # -- hooks a subclass for another IR (torch.export's aten graph) overrides --------------------
    def node_kind(self, n: fx.Node, module: nn.Module | None) -> str:
        """Op kind of a node, one of :data:`autopar.graph.types.OP_KINDS`."""
        if module is not None:
            return classify.module_kind(module)
        if n.op == "call_function":
            return classify.function_kind(n.target)
        return classify.method_kind(n.target)

    def input_regions(self, n: fx.Node) -> set[str]:
        """Regions of the node's activation inputs ("const" and unknown left out)."""
        return {self.region.get(a) for a in n.all_input_nodes} - {None, "const"}

    def linear_out_features(self, n: fx.Node, module: nn.Module | None, kind: str) -> int | None:
        """Output features of a TP-shardable linear layer; None when the node is not one."""
        if not classify.is_linear(kind, n.target, module):
            return None
        if module is not None:
            return module.out_features
        weight = n.args[1] if len(n.args) > 1 else n.kwargs.get("weight")
        return self.env[weight].shape[0]  # F.linear: the weight's rows

    def is_linear(self, n: fx.Node, out_features: int | None) -> bool:
        """True for a GEMM against a weight that is not a MoE router (what an FP8 framework
        runs in FP8): here, a TP-shardable linear (``out_features`` not None)."""
        return out_features is not None

    def gemm_dims(self, n: fx.Node, inputs: list[torch.Tensor], result) -> tuple[int, ...]:
        """(M, K, N) of a linear layer's GEMM from its input and output."""
        out = tensors_of(result)[0]
        return (inputs[0].numel() // inputs[0].shape[-1], inputs[0].shape[-1], out.shape[-1])

    def matmul_input(self, n: fx.Node) -> fx.Node:
        """The activation operand of a linear node (what TP all-gathers for a column linear)."""
        return n.args[0]

    def op_extras(self, n: fx.Node) -> dict:
        """Extra :class:`Op` fields for a node (the export interpreter adds ``moe_role``)."""
        return {}

    def op_target(self, n: fx.Node, module: nn.Module | None) -> str:
        """The :attr:`Op.target` of a node: the module class, or the function or method name."""
        return classify.target_name(n.target, module)

    def read_tensors(self, n: fx.Node, args, kwargs) -> list[torch.Tensor]:
        """The tensors the node's kernel reads (its :attr:`Op.bytes_read`): its tensor arguments."""
        return tensors_of((args, kwargs))

    def materializes(self, n: fx.Node, args, result) -> bool:
        """True when a node classified as a view runs as a copy kernel (:func:`_materializes`)."""
        return _materializes(args, result)

    # -- per node ------------------------------------------------------------------------------
    def run_node(self, n: fx.Node):
        self._node = n
        if not hasattr(self, "_glu_act"):
            self._plan_glu()
        if n.op in ("placeholder", "output", "get_attr"):
            result = super().run_node(n)
            if n.op == "placeholder":
                self.region[n] = self.region.get(n, "seq")
            elif n.op == "get_attr":
                self.region[n] = "const"
            return result
        module = self.module.get_submodule(n.target) if n.op == "call_module" else None
        if module is not None and self.is_block(module):
            return super().run_node(n)
        kind = self.node_kind(n, module)
        in_regions = self.input_regions(n)
        region = "tp" if "tp" in in_regions else "seq"
        role = ""
        out_features = self.linear_out_features(n, module, kind) if kind == "matmul" else None
        if out_features is not None:
            role, region = classify.linear_role(region, out_features, self.rec.vocab_size)
        if kind == "embedding" and self.rec.vocab_size is not None and _table_rows(
                self, n, module) == self.rec.vocab_size:
            role = "vocab"
        self.region[n] = region
        self.rec.op_name, self.rec.op_is_core, self.rec.op_region = n.name, kind == "attention", region
        self.rec.op_kind = kind
        self.rec.op_linear = kind == "matmul" and self.is_linear(n, out_features)
        params_before = set(self.layer_params)
        flops_before = self.rec.flop_counter.get_total_flops()
        self._flops_override = None
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        if n in self._glu_act:  # computed inside the fused GLU at its product
            result = self.env[self._glu_act[n]]
            kind = "view"
        elif n in self._glu_mul:
            a, b = self._glu_mul[n]
            result = FusedGLUMeta.apply(self.env[a], self.env[b])
        else:
            result = getattr(self, n.op)(n.target, args, kwargs)
            if kind == "view" and self.materializes(n, args, result):
                kind = "elementwise"
        flops = self.rec.flop_counter.get_total_flops() - flops_before
        if self._flops_override is not None:  # attention, grouped GEMMs: our own rule
            flops = self._flops_override
        self.rec.produced(result, region, kind == "attention")
        new = [self.layer_params[i] for i in set(self.layer_params) - params_before]
        inputs = self.read_tensors(n, args, kwargs)
        # a parameter passed as an argument (an aten linear's weight) is read once, not again as
        # the op's new parameter
        passed = {_storage_key(t) for t in inputs}
        new_read = [m for m in (self._meta(p) for p in new) if _storage_key(m) not in passed]
        gemm: tuple[int, ...] = ()
        if out_features is not None and inputs:
            gemm = self.gemm_dims(n, inputs, result)
        self.op_nodes.append(n)
        self.ops.append(Op(
            name=n.name, kind=kind, target=self.op_target(n, module),
            fwd_flops=float(flops),
            bytes_read=sum(tensor_nbytes(t) for t in inputs + new_read)
            + (self._score_bytes if kind == "attention" else 0),
            bytes_written=0 if kind == "view" else sum(tensor_nbytes(t) for t in tensors_of(result)),
            num_parameters=self.rec.new_params(new), region=region, tp_role=role,
            causal=kind == "attention" and getattr(self, "_attention_causal", False),
            gemm=gemm, fused=not (kind == "attention" and not self.rec.flash),
            **self.op_extras(n),
        ))
        if kind == "attention":
            self.heads = self._heads
        return result


def _materializes(args, result) -> bool:
    """True when a call classified as a view (:func:`autopar.graph.classify.method_kind`) made a
    new tensor: a dtype cast (``.float()``, ``.to(dtype)``, ``.type_as``), ``.contiguous()`` or a
    ``reshape`` / ``flatten`` of a tensor whose strides allow no view, or indexing by a tensor.
    Eager PyTorch runs each as a copy kernel (read the input, write the result); a view, or a
    cast to the dtype the tensor already has, returns the input or a view of it (``_is_view``)
    and moves nothing."""
    source = args[0] if args else None
    if not isinstance(source, torch.Tensor) or not isinstance(result, torch.Tensor):
        return False
    return result is not source and not result._is_view()


#: Pointwise activations a gated linear unit may use.
_ACTIVATIONS = (F.silu, F.gelu)


def _table_rows(interp: MeasuringInterpreter, n: fx.Node, module: nn.Module | None) -> int | None:
    """Rows of an embedding's table (module or functional/aten embedding)."""
    if module is not None:
        return getattr(module, "num_embeddings", None)
    weight = n.args[0] if n.target is not torch.nn.functional.embedding else n.args[1]
    value = interp.env.get(weight) if isinstance(weight, fx.Node) else None
    return value.shape[0] if isinstance(value, torch.Tensor) and value.dim() == 2 else None
