"""What an aten-level node of a ``torch.export`` graph is: kind, GEMM operands, GQA and MoE structure.

The exported graph is flat and low-level, so the structure the fx path reads from module calls is
recovered from the data flow: a GEMM whose operand traces back (through views) to a parameter is a
linear layer; the k/v operands of attention that trace back through ``unsqueeze/expand/reshape``
to a tensor with fewer heads are grouped-query attention's KV heads (HF's ``repeat_kv``); a linear
whose scores reach a ``topk`` is a MoE router. Nothing here reads module names.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

aten = torch.ops.aten


def _packets(*names: str) -> frozenset:
    # getattr: some ops do not exist in every torch version
    return frozenset(getattr(aten, n) for n in names if hasattr(aten, n))


VIEWS = _packets("view", "_unsafe_view", "reshape", "transpose", "t", "permute", "unsqueeze",
                 "squeeze", "expand", "slice", "select", "split", "split_with_sizes", "chunk",
                 "unbind", "alias", "detach", "contiguous", "flatten", "unflatten",
                 "_assert_tensor_metadata", "sym_size", "lift_fresh_copy", "as_strided")
LINEAR_LIKE = _packets("linear", "mm", "addmm", "matmul", "bmm", "baddbmm", "_grouped_mm")
GROUPED_GEMM = _packets("_grouped_mm")
ATTENTION = _packets("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention",
                     "_scaled_dot_product_flash_attention_for_cpu")
SDPA = _packets("scaled_dot_product_attention")
NORMS = _packets("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm")
DROPOUTS = _packets("dropout", "native_dropout", "feature_dropout")
EMBEDDINGS = _packets("embedding")
LOSSES = _packets("cross_entropy_loss", "nll_loss", "nll_loss_nd")
TOPK = _packets("topk")
# the copies HF's repeat_kv makes to expand KV heads; a GQA kernel reads the KV heads directly
_REPEAT_KV = _packets("unsqueeze", "expand", "reshape", "view", "_unsafe_view", "clone",
                      "contiguous")
# ops a router's scores may pass through on their way to topk
_ROUTER_PATH = _packets("_to_copy", "to", "softmax", "_softmax", "sigmoid", "view", "reshape",
                        "add", "mul", "div")


def packet(target):
    """The overload packet of an aten OpOverload (``aten.linear.default`` -> ``aten.linear``)."""
    return getattr(target, "overloadpacket", target)


def op_kind(n: fx.Node) -> str:
    """Op kind (:data:`autopar.graph.types.OP_KINDS`) of an aten call_function node."""
    if n.target is operator.getitem:
        return "view"
    p = packet(n.target)
    if p in ATTENTION:
        return "attention"
    if p in LINEAR_LIKE:
        return "matmul"
    if p in NORMS:
        return "norm"
    if p in DROPOUTS:
        return "dropout"
    if p in EMBEDDINGS:
        return "embedding"
    if p in LOSSES:
        return "loss"
    if p in VIEWS:
        return "view"
    return "elementwise"


def gemm_operands(n: fx.Node) -> tuple[fx.Node | None, fx.Node | None]:
    """(activation, weight) operand nodes of a GEMM node; (None, None) for other nodes.

    ``linear(x, w, b)``, ``addmm(b, x, w)`` (HF GPT-2's Conv1D, weight [in, out]),
    ``mm/matmul/bmm/_grouped_mm(x, w, ...)``.
    """
    p = packet(n.target)
    if p not in LINEAR_LIKE:
        return None, None
    if p is aten.addmm or p is aten.baddbmm:
        return n.args[1], n.args[2]
    return n.args[0], n.args[1]


def traced_param(node, params: set[str]) -> fx.Node | None:
    """The parameter placeholder ``node`` is a view of (through transposes/reshapes), or None."""
    while isinstance(node, fx.Node):
        if node.op == "placeholder":
            return node if node.name in params else None
        if node.op != "call_function" or packet(node.target) not in VIEWS:
            return None
        node = node.args[0]
    return None


def kv_source(node: fx.Node, q_heads: int) -> tuple[fx.Node | None, list[fx.Node]]:
    """For an attention k/v operand: (the tensor with the KV heads, the repeat_kv nodes after it).

    Walks back through ``unsqueeze/expand/reshape`` to a 4-D [b, kv, s, d] tensor with fewer heads
    than the queries that divide them (grouped-query attention, Ainslie et al. 2023); returns
    (None, []) when the operand already has all query heads.
    """
    want = node.meta.get("val")
    chain: list[fx.Node] = []
    cur = node
    while (isinstance(cur, fx.Node) and cur.op == "call_function"
           and packet(cur.target) in _REPEAT_KV and isinstance(want, torch.Tensor)):
        chain.append(cur)
        cur = cur.args[0]
        val = cur.meta.get("val") if isinstance(cur, fx.Node) else None
        if (isinstance(val, torch.Tensor) and val.dim() == 4 and val.shape[1] < q_heads
                and q_heads % val.shape[1] == 0 and tuple(val.shape[2:]) == tuple(want.shape[2:])):
            return cur, chain
    return None, []


def routers(graph: fx.Graph) -> dict[fx.Node, int]:
    """MoE routers: {linear node whose scores reach a ``topk``: that topk's k}."""
    found: dict[fx.Node, int] = {}
    for n in graph.nodes:
        if n.op != "call_function" or packet(n.target) not in TOPK:
            continue
        k = n.args[1] if len(n.args) > 1 else n.kwargs.get("k", 0)
        cur = n.args[0]
        while isinstance(cur, fx.Node) and cur.op == "call_function":
            if packet(cur.target) in LINEAR_LIKE:
                found[cur] = int(k)
                break
            if packet(cur.target) not in _ROUTER_PATH:
                break
            cur = cur.args[0]
    return found
