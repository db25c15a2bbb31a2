"""Running an exported (aten-level) graph: the interpreter and the fused-module groups.

Part of the torch.export path (:mod:`autopar.graph.export`): :class:`ExportInterpreter` adapts the
fx path's :class:`~autopar.graph.measure.MeasuringInterpreter` to aten ops (see
:mod:`autopar.graph.aten`), runs norm and activation modules' decompositions as one fused kernel
(:func:`fused_groups`), attention as flash attention on the KV heads, and grouped expert GEMMs
by :func:`~autopar.graph.kernels.grouped_gemm_flops`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
from torch import nn

from . import aten as A
from . import classify
from ..errors import UntraceableModelError
from .kernels import (ATTENTION_BACKWARD_RATIO, GEMM_BACKWARD_RATIO, FusedActivationMeta,
                      FusedNormMeta, GatedDeltaRuleSavesMeta, grouped_gemm_flops)
from .measure import MeasuringInterpreter
from .spans import counted_pairs


def _is_activation(module: nn.Module) -> bool:
    cls = type(module)
    return cls.__module__ == "torch.nn.modules.activation" or "Activation" in cls.__name__ \
        or cls.__name__.endswith(("GELU", "SiLU"))


def _floating(val) -> bool:
    if isinstance(val, (list, tuple)):
        return any(_floating(v) for v in val)
    return isinstance(val, torch.Tensor) and val.is_floating_point()


@dataclasses.dataclass
class _Group:
    """Nodes of one norm/activation module call, run as one fused op at ``out``."""
    kind: str                 # "norm" or "elementwise"
    x: fx.Node                # the one activation entering the module
    params: list[fx.Node]
    out: fx.Node
    inner: list[fx.Node]
    module: str = ""          # the module's class name (``LlamaRMSNorm``): the op's target


class ExportInterpreter(MeasuringInterpreter):
    """Measures an exported (aten-level) graph; see :class:`MeasuringInterpreter` for what is
    recorded per op. Parameters are placeholders here (``param_nodes``: name -> original tensor)."""

    def __init__(self, gm, meta_of, rec, param_nodes: dict[str, torch.Tensor],
                 groups: dict[fx.Node, _Group], on_node,
                 spans: dict[fx.Node, tuple[str, int]] | None = None,
                 eager: dict[fx.Node, A.EagerAttention] | None = None,
                 scans: dict[fx.Node, A.KernelCall] | None = None):
        super().__init__(gm, meta_of, rec)
        # gated delta rules (Qwen3-Next) in their torch form: FLOPs as run, saves as fla's kernel
        self.scans = scans or {}
        self.scan_nodes = {m for c in self.scans.values() for m in c.nodes}
        self.spans = spans or {}  # attention node -> (span kind, tokens), see spans.py
        self.param_nodes = param_nodes
        self.groups = groups
        self.eager = eager or {}  # eager attentions, run as one flash kernel at their last GEMM
        self.inner = {n for g in groups.values() for n in g.inner}
        self.inner |= {n for e in self.eager.values() for n in e.inner}
        self.inner |= A.mask_only(gm.graph, self.eager)  # not run in training (aten.mask_only)
        self.on_node = on_node
        self.routers = A.routers(gm.graph)
        self.replicated = A.replicated_linears(
            gm.graph, set(param_nodes), {g.x for g in groups.values() if g.kind == "norm"})
        self._routed_fraction = 1.0
        self._tokens = 0
        # batched GEMMs over stacked expert weights with all tokens in every expert (HF Llama 4)
        widths = {v.meta["val"].shape[-1] for v in self.routers}
        self._dense_routing = any(
            A.packet(n.target) is torch.ops.aten.bmm and self._expert_stack(n) in widths
            for n in gm.graph.nodes if n.op == "call_function")
        self.gqa_views: set[fx.Node] = set()
        self.kv_of: dict[fx.Node, fx.Node] = {}
        self.param_views: dict[fx.Node, object] = {}
        self.heads = self.experts = (0, 0)
        for n in gm.graph.nodes:
            operands = ()
            if n.op == "call_function" and A.packet(n.target) in A.SDPA:
                operands = (n.args[0], *n.args[1:3])
            elif n in self.eager:
                operands = (self.eager[n].q, self.eager[n].k, self.eager[n].v)
            if operands:
                q = operands[0].meta.get("val")
                for operand in operands[1:]:
                    src, chain = A.kv_source(operand, q.shape[1])
                    if src is not None:
                        self.kv_of[operand] = src
                        self.gqa_views.update(chain)

    def run_node(self, n: fx.Node):
        self.on_node(n)
        # after this layer's router: what dense-routed experts save is kept at top-k size
        self.rec.routed_rows = (self.experts[0], self._tokens, self.experts[1] / self.experts[0]) \
            if self._dense_routing and self.experts[1] else None
        self.rec.suppress = n in self.scan_nodes
        if n in self.inner:  # computed by its group's fused op
            self._node = n
            return None
        return super().run_node(n)

    # -- hooks -----------------------------------------------------------------------------------
    def node_kind(self, n, module):
        if n in self.eager:
            return "attention"
        if n in self.groups:
            return self.groups[n].kind
        if n in self.gqa_views or (n.op == "call_function"
                                   and A.packet(n.target) in A.ALLOCATIONS):
            return "view"
        return A.op_kind(n)

    def input_regions(self, n):
        sources = [self.groups[n].x] if n in self.groups else n.all_input_nodes
        # integer tensors (token ids, positions, MoE routing indices) carry no TP region
        return {self.region.get(a) for a in sources if _floating(a.meta.get("val"))} - {
            None, "const"}

    def linear_out_features(self, n, module, kind):
        x, w = A.gemm_operands(n)
        if x is None or n in self.routers or A.traced_param(w, set(self.param_nodes)) is None:
            return None  # routers stay replicated; activation x activation GEMMs are not linears
        if n in self.replicated and "tp" not in self.input_regions(n):
            # gates and normed low-rank projections would be column-parallel: they stay whole
            # (aten.replicated_linears); a row-parallel linear's output is whole after its
            # all-reduce, so Gemma 3's norm right after o_proj does not count
            return None
        return n.meta["val"].shape[-1]

    def is_linear(self, n, out_features):
        # replicated linears (MLA's down projections, gates) count too; routers do not
        x, w = A.gemm_operands(n)
        return (x is not None and n not in self.routers
                and A.traced_param(w, set(self.param_nodes)) is not None)

    def matmul_input(self, n):
        return A.gemm_operands(n)[0]

    def gemm_dims(self, n, inputs, result):
        x = self.env[self.matmul_input(n)]
        rows = round(x.numel() // x.shape[-1] * self._routed_fraction)
        return (rows, x.shape[-1], result.shape[-1])

    def _expert_stack(self, n) -> int | None:
        """Leading dim of the 3-D parameter a GEMM's weight operand is a view of, else None."""
        w = A.traced_param(A.gemm_operands(n)[1], set(self.param_nodes))
        val = w.meta.get("val") if w is not None else None
        return int(val.shape[0]) if isinstance(val, torch.Tensor) and val.dim() == 3 else None

    def _dense_routed(self, n) -> bool:
        """A batched GEMM over a stacked [experts, ...] weight with every token in every expert
        (HF Llama 4: zero scores for the experts a token is not routed to)."""
        if A.packet(n.target) is not torch.ops.aten.bmm or not self.experts[1]:
            return False
        return self._expert_stack(n) == self.experts[0]

    def op_extras(self, n):
        kind, window = self.spans.get(n, ("full", 0))
        if kind != "full":
            return {"window": window, "chunked": kind == "chunked"}
        if n in self.routers:
            return {"moe_role": "router"}
        if n.op == "call_function" and (A.packet(n.target) in A.GROUPED_GEMM
                                         or self._dense_routed(n)):
            return {"moe_role": "expert"}
        return {}

    def op_target(self, n, module):
        # as the fx path names them: a fused module by its class (what eager pricing reads, e.g.
        # an RMSNorm run as its decomposition, autopar.cost.compute), an aten op by its name
        # without the overload (aten.silu.default -> "silu", as F.silu)
        if n in self.groups:
            return self.groups[n].module
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            return n.target.overloadpacket.__name__
        return super().op_target(n, module)

    def read_tensors(self, n, args, kwargs):
        if n.op == "call_function" and A.packet(n.target) in A.SDPA:
            # a GQA flash kernel reads q and the KV heads (not repeat_kv's copies), and a causal
            # one no mask (HF materialises the causal mask; training runs is_causal)
            return [self.env[self.kv_of.get(a, a)] for a in n.args[:3]]
        return super().read_tensors(n, args, kwargs)

    def materializes(self, n, args, result):
        # repeat_kv's expand + reshape copies the KV heads in eager PyTorch, but the GQA
        # attention kernel reads the KV heads themselves (kv_of), so no copy is run
        if n.op == "call_function" and A.packet(n.target) in A.ALLOCATIONS:
            return False  # an uninitialised allocation runs no kernel
        return n not in self.gqa_views and super().materializes(n, args, result)

    def activation_input(self, n):
        if n in self.groups:  # a decomposed activation module, fused
            return self.groups[n].x if self.groups[n].kind == "elementwise" else None
        if n.op == "call_function" and A.packet(n.target) in (torch.ops.aten.silu,
                                                                  torch.ops.aten.gelu):
            return n.args[0] if isinstance(n.args[0], fx.Node) else None
        return None

    def is_mul(self, n):
        return n.op == "call_function" and A.packet(n.target) is torch.ops.aten.mul

    # -- execution -------------------------------------------------------------------------------
    def fetch_args_kwargs_from_env(self, n):
        if n in self.eager:  # the kernel reads q, k and v (the KV heads, not repeat_kv's copies)
            e = self.eager[n]
            return tuple(self.env[self.kv_of.get(x, x)] for x in (e.q, e.k, e.v)), {}
        if n in self.groups:
            g = self.groups[n]
            return (self.env[g.x], *[self.env[p] for p in g.params]), {}
        return super().fetch_args_kwargs_from_env(n)

    def call_function(self, target, args, kwargs):
        n = self._node
        used = self.groups[n].params if n in self.groups else (
            list(self.eager[n].params) if n in self.eager else n.all_input_nodes)
        origins = [self.param_nodes[a.name] if a.name in self.param_nodes
                   else self.param_views.get(a) for a in used]
        origins = [o for o in origins if o is not None]
        if origins and n not in self.groups and A.op_kind(n) == "view" and len(used) == 1:
            # a transposed or reshaped weight (MoE expert stacks): the parameter belongs to
            # the op that consumes the view, so that it is sharded with that GEMM
            self.param_views[n] = origins[0]
        else:
            for original in origins:
                self.layer_params[id(original)] = original
        if n in self.groups:
            return self._fused(self.groups[n], args)
        p = A.packet(target)
        if p in A.SDPA:
            return self._sdpa(n, *args, **kwargs)
        if n in self.eager:
            out = self._attention(*args)
            self._attention_causal = self.eager[n].masked
            self._count_span(n, args[0], args[1])
            # the eager GEMM's layout [b, h, s, d]; the next transpose makes it [b, s, h, d]
            return out.to(n.meta["val"].dtype)
        if p in A.ATTENTION:  # fused variants: run as they are (they save what flash saves)
            q, k = args[0], args[1]
            self._heads, self._score_bytes = (q.shape[1], k.shape[1]), 0
            self._attention_causal = bool(kwargs.get("is_causal", False))
        self._routed_fraction = 1.0
        before = self.rec.flop_counter.get_total_flops()
        result = super().call_function(target, args, kwargs)
        if self._dense_routed(n):
            # a training kernel runs each token through its top-k experts only: count those rows
            # (tokens x k of the E x tokens computed), forward and backward
            self._routed_fraction = self.experts[1] / self.experts[0]
            full = self.rec.flop_counter.get_total_flops() - before
            self._flops_override = full * self._routed_fraction
            self.rec.extra_bwd_flops += GEMM_BACKWARD_RATIO * (self._flops_override - full)
        if p in A.GROUPED_GEMM:
            flops = grouped_gemm_flops(args[0].shape, args[1].shape)
            self._flops_override = flops
            self.rec.extra_bwd_flops += GEMM_BACKWARD_RATIO * flops
            self.experts = (args[1].shape[0], self.experts[1])
        if n in self.routers:
            self.experts = (result.shape[-1], self.routers[n])
            self._tokens = result.numel() // result.shape[-1]
        if n in self.scans:
            self.rec.suppress = False
            result = GatedDeltaRuleSavesMeta.apply(result, *self._delta_rule_inputs(self.scans[n]))
        return result

    def _delta_rule_inputs(self, call: A.KernelCall) -> list[torch.Tensor]:
        """(q, k, v, g, beta) of a gated delta rule call: the 4-D inputs in order of use (q and
        k first), the 3-D ones (g in fp32, beta in the activations' dtype)."""
        values = [self.env[a] for a in call.inputs]
        four = [v for v in values if v.dim() == 4]
        three = sorted((v for v in values if v.dim() == 3), key=lambda v: v.element_size())
        if len(four) != 3 or len(three) != 2:
            raise UntraceableModelError(
                f"a gated delta rule call has inputs {[tuple(v.shape) for v in values]}; "
                "expected q, k, v [b, s, heads, d] and g, beta [b, s, heads]. Fix: report the "
                "model; its linear-attention layer differs from transformers' Qwen3-Next.")
        return [*four, three[1], three[0]]

    def _fused(self, g: _Group, args):
        x = args[0]
        if g.kind == "norm":
            weights = [t for t in args[1:] if t.dim() == 1]
            out = FusedNormMeta.apply(x, weights[0] if weights else None)
        else:
            out = FusedActivationMeta.apply(x)
        dtype = g.out.meta["val"].dtype
        return out if out.dtype == dtype else out.to(dtype)

    def _sdpa(self, n, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
        # GQA: read the KV heads themselves, as a GQA flash kernel does, not repeat_kv's copies
        k = self.env[self.kv_of[n.args[1]]] if n.args[1] in self.kv_of else k
        v = self.env[self.kv_of[n.args[2]]] if n.args[2] in self.kv_of else v
        out = self._attention(q, k, v, None, dropout_p, is_causal, scale)
        # a mask [.., s, s] in a decoder LM is the causal mask (HF materialises it; its nodes
        # are not run here, aten.mask_only, so the node says whether there is one)
        self._attention_causal = bool(is_causal) or A.attention_mask_arg(n) is not None
        self._count_span(n, q, k)
        return out

    def _count_span(self, n, q, k) -> None:
        """Count only the keys a window-aware kernel visits (spans.py)."""
        kind, window = self.spans.get(n, ("full", 0))
        s_q, s_k = q.shape[-2], k.shape[-2]
        if kind != "full" and s_q == s_k:
            # a window-aware kernel skips the keys outside the span (spans.py)
            full = self._flops_override
            counted = full * counted_pairs(s_q, kind, window) / (s_q * s_k)
            self.rec.extra_bwd_flops += ATTENTION_BACKWARD_RATIO * (counted - full)
            self._flops_override = counted


def fused_groups(graph: fx.Graph, modules: dict[str, nn.Module],
                  params: set[str]) -> dict[fx.Node, _Group]:
    """{group output node: group} for runs of >= 2 nodes inside one norm or activation module
    with one activation in and out, and for a norm module's single ``rms_norm`` node."""
    runs: list[tuple[str, list[fx.Node]]] = []
    for n in graph.nodes:
        stack = n.meta.get("nn_module_stack")
        fqn = list(stack.values())[-1][0] if (n.op == "call_function" and stack) else None
        if runs and fqn is not None and runs[-1][0] == fqn:
            runs[-1][1].append(n)
        else:
            runs.append((fqn, [n]))
    groups: dict[fx.Node, _Group] = {}
    for fqn, nodes in runs:
        module = modules.get(fqn) if fqn is not None else None
        # a norm module that runs as one aten rms_norm (F.rms_norm: autopar's RMSNorm) is the
        # same fused kernel as a decomposed one; run alone, its composite saves an fp32 copy
        single_norm = len(nodes) == 1 and A.packet(nodes[0].target) in A.RMS_NORMS
        if module is None or (len(nodes) < 2 and not single_norm):
            continue
        kind = "norm" if classify.is_norm_module(module) else (
            "elementwise" if _is_activation(module) else None)
        inside = set(nodes)
        outside = {a for m in nodes for a in m.all_input_nodes if a not in inside}
        acts = [a for a in outside if a.name not in params]
        used_out = [m for m in nodes if any(u not in inside for u in m.users)]
        val = used_out[0].meta.get("val") if len(used_out) == 1 else None
        if kind is None or len(acts) != 1 or val is None or not isinstance(
                acts[0].meta.get("val"), torch.Tensor) or acts[0].meta["val"].shape != val.shape:
            continue
        out = used_out[0]
        groups[out] = _Group(kind, acts[0], sorted((a for a in outside if a.name in params),
                                                   key=lambda a: a.name),
                             out, [m for m in nodes if m is not out], type(module).__name__)
    return groups
