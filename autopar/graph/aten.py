"""What an aten-level node of a ``torch.export`` graph is: kind, GEMM operands, GQA and MoE structure.

The exported graph is flat and low-level, so the structure the fx path reads from module calls is
recovered from the data flow: a GEMM whose operand traces back (through views) to a parameter is a
linear layer; the k/v operands of attention that trace back through ``unsqueeze/expand/reshape``
to a tensor with fewer heads are grouped-query attention's KV heads (HF's ``repeat_kv``); a linear
whose scores reach a ``topk`` is a MoE router. Nothing here reads module names.
"""

from __future__ import annotations

import dataclasses
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
                 "_assert_tensor_metadata", "sym_size", "lift_fresh_copy", "as_strided",
                 "narrow")
LINEAR_LIKE = _packets("linear", "mm", "addmm", "matmul", "bmm", "baddbmm", "_grouped_mm")
GROUPED_GEMM = _packets("_grouped_mm")
ATTENTION = _packets("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention",
                     "_scaled_dot_product_flash_attention_for_cpu")
SDPA = _packets("scaled_dot_product_attention")
NORMS = _packets("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm")
#: uninitialised allocations: no kernel runs (``torch.empty``; transformers' DeepSeek-V3 builds
#: its MLA keys in a ``new_empty`` tensor, then copies the two parts in)
ALLOCATIONS = _packets("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided")
RMS_NORMS = _packets("rms_norm", "_fused_rms_norm")
DROPOUTS = _packets("dropout", "native_dropout", "feature_dropout")
EMBEDDINGS = _packets("embedding")
LOSSES = _packets("cross_entropy_loss", "nll_loss", "nll_loss_nd")
TOPK = _packets("topk")
# the copies HF's repeat_kv makes to expand KV heads; a GQA kernel reads the KV heads directly
_REPEAT_KV = _packets("unsqueeze", "expand", "reshape", "view", "_unsafe_view", "clone",
                      "contiguous")
# ops a router's scores may pass through on their way to topk
_ROUTER_PATH = _packets("_to_copy", "to", "softmax", "_softmax", "sigmoid", "view", "reshape",
                        "add", "mul", "div", "masked_fill")


#: Custom ops that are ``aten._grouped_mm`` under another name, with its arguments (rows
#: [S, in], weights [E, in, out], group end offsets [E]): autopar's own for dtypes torch's meta
#: kernel refuses (:func:`autopar.models.moe.grouped_mm`) and transformers' fallback
#: (``transformers.integrations.moe._grouped_mm_fallback``, taken for non-bf16 weights).
GROUPED_GEMM_ALIASES = frozenset({"autopar::grouped_mm", "transformers::grouped_mm_fallback"})


def packet(target):
    """The overload packet of an aten OpOverload (``aten.linear.default`` -> ``aten.linear``);
    a :data:`GROUPED_GEMM_ALIASES` op -> ``aten._grouped_mm``."""
    p = getattr(target, "overloadpacket", target)
    if getattr(p, "_qualified_op_name", None) in GROUPED_GEMM_ALIASES:
        return aten._grouped_mm
    return p


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
    """MoE routers: {linear node whose scores reach a ``topk`` over all its outputs: that k}.

    Only a top-k over the router's full width selects experts: DeepSeek-V3's group-limited
    routing first takes top-2 inside each expert group ([tokens, groups, experts / groups]) and
    masks the losing groups (``masked_fill``) before the top-8 over all experts.
    """
    found: dict[fx.Node, int] = {}
    for n in graph.nodes:
        if n.op != "call_function" or packet(n.target) not in TOPK:
            continue
        k = n.args[1] if len(n.args) > 1 else n.kwargs.get("k", 0)
        width = _last_dim(n.args[0])
        cur = n.args[0]
        while isinstance(cur, fx.Node) and cur.op == "call_function":
            if packet(cur.target) in LINEAR_LIKE:
                if width is not None and width == _last_dim(cur):
                    found[cur] = int(k)
                break
            if packet(cur.target) not in _ROUTER_PATH:
                break
            cur = cur.args[0]
    return found


def _last_dim(node) -> int | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return int(val.shape[-1]) if isinstance(val, torch.Tensor) and val.dim() > 0 else None


def replicated_linears(graph: fx.Graph, params: set[str], norm_inputs: set[fx.Node]) -> set[fx.Node]:
    """Linears that tensor parallelism keeps whole: gates of width 1, and low-rank projections
    whose output a norm normalises per token.

    A norm over a token's features needs all of them, so a linear feeding one (through views
    and splits only, with the same rows: [.., tokens, features]) cannot be column-parallel; this
    is DeepSeek-V3's MLA ``q_a_proj`` and ``kv_a_proj_with_mqa`` (Megatron-Core MLA keeps its
    ``linear_q_down_proj`` and ``linear_kv_down_proj`` unsharded too). Per-head norms (Qwen3's
    ``q_norm`` on [.., tokens, heads, head_dim]) do not count: their rows are heads.
    ``norm_inputs`` are the activation inputs of norm modules (fused groups).
    """
    out: set[fx.Node] = set()
    for n in graph.nodes:
        if n.op != "call_function" or packet(n.target) not in LINEAR_LIKE:
            continue
        x, w = gemm_operands(n)
        val = n.meta.get("val")
        if x is None or traced_param(w, params) is None or not isinstance(val, torch.Tensor):
            continue
        if val.shape[-1] == 1:
            out.add(n)
            continue
        rows = tuple(val.shape[:-1])
        todo, seen = [n], set()
        while todo:  # the linear's output and its views (a residual add is not one)
            u = todo.pop()
            if u in seen:
                continue
            seen.add(u)
            uval = u.meta.get("val")
            if u in norm_inputs and isinstance(uval, torch.Tensor) and tuple(uval.shape[:-1]) == rows:
                out.add(n)
                break
            todo.extend(v for v in u.users if v.op == "call_function" and op_kind(v) == "view")
    return out


_SOFTMAX = _packets("softmax", "_softmax", "_safe_softmax")
_TRANSPOSES = _packets("transpose", "permute", "t")


@dataclasses.dataclass(frozen=True)
class EagerAttention:
    """An attention written as ``softmax(q @ k^T ...) @ v`` (HF ``eager_attention_forward``).

    ``out`` is the second GEMM (probabilities x values), where the fused kernel stands;
    ``inner`` the nodes from the first GEMM up to it (scores, scaling, mask, sinks, softmax,
    dropout), which a flash kernel never writes to memory; ``params`` the parameters they read
    (gpt-oss's per-head sinks); ``masked`` whether a mask tensor enters (a causal decoder mask).
    """

    q: fx.Node
    k: fx.Node
    v: fx.Node
    out: fx.Node
    inner: frozenset
    params: tuple
    masked: bool


def eager_attentions(graph: fx.Graph, params: set[str]) -> dict[fx.Node, EagerAttention]:
    """{second GEMM: :class:`EagerAttention`} for each eager attention in an exported graph.

    Found from the data flow: a GEMM of two activations, the second operand a transpose of the
    last two dims, whose output reaches (inside one module, through a softmax) the first operand
    of another activation x activation GEMM. A pattern whose intermediate values leave the module
    (probabilities returned to the caller and used) is left alone.
    """
    found: dict[fx.Node, EagerAttention] = {}
    for a in graph.nodes:
        if a.op != "call_function" or packet(a.target) not in LINEAR_LIKE \
                or packet(a.target) in GROUPED_GEMM:
            continue
        q, kt = a.args[0], a.args[1]
        if not isinstance(kt, fx.Node) or traced_param(kt, params) is not None \
                or traced_param(q, params) is not None or packet(kt.target) not in _TRANSPOSES:
            continue
        where = _module_path(a)
        inner, todo, outs = {a}, list(a.users), []
        ok = True
        while todo and ok:
            u = todo.pop()
            if u in inner or u in outs:
                continue
            if u.op != "call_function" or _module_path(u) != where:
                ok = False
            elif packet(u.target) in LINEAR_LIKE:
                outs.append(u)
            else:
                inner.add(u)
                todo.extend(u.users)
        if not ok or len(outs) != 1 or not any(packet(n.target) in _SOFTMAX for n in inner
                                              if n.op == "call_function"):
            continue
        out = outs[0]
        if out.args[0] not in inner or traced_param(out.args[1], params) is not None:
            continue
        sources = {a2 for n in inner for a2 in n.all_input_nodes if a2 not in inner}
        used = tuple(s for s in sources if traced_param(s, params) is not None)
        masked = any(s not in (q, kt) and s not in used and _floating_or_bool(s)
                     for s in sources)
        found[out] = EagerAttention(q, kt.args[0], out.args[1], out, frozenset(inner),
                                    tuple(traced_param(s, params) for s in used), masked)
    return found


def attention_mask_arg(n: fx.Node) -> fx.Node | None:
    """The ``attn_mask`` operand of an SDPA node, else None."""
    mask = n.args[3] if len(n.args) > 3 else n.kwargs.get("attn_mask")
    return mask if isinstance(mask, fx.Node) else None


def mask_only(graph: fx.Graph, eager: dict[fx.Node, EagerAttention]) -> set[fx.Node]:
    """Nodes whose results reach only attention masks: an SDPA's ``attn_mask`` or the inside of
    an eager attention (:func:`eager_attentions`).

    Why: Hugging Face builds the causal mask (``masking_utils.create_causal_mask``: position
    ranges, comparisons, ``[b, 1, s, s]`` boolean tensors) while tracing, but skips it in a
    training run without padding (``sdpa_mask``'s ``allow_is_causal_skip``: the kernel runs
    ``is_causal``), and a flash kernel never reads a causal mask; so these are not kernels of
    the run. A node with any other consumer (positions that also feed RoPE) is kept.
    """
    # what enters an eager attention other than through its q @ k^T GEMM is its mask
    inner = {m for e in eager.values() for m in e.inner if packet(m.target) not in LINEAR_LIKE}

    def check(u: fx.Node) -> bool:   # _assert_tensor_metadata: no result, no users
        return u.op == "call_function" and not u.users and u.meta.get("val") is None

    def masks(u: fx.Node, n: fx.Node) -> bool:
        return (u.op == "call_function" and packet(u.target) in SDPA
                and attention_mask_arg(u) is n and n not in u.args[:3])

    eager_nodes = {m for e in eager.values() for m in e.inner}
    found: set[fx.Node] = set()
    for n in reversed(graph.nodes):
        if n.op != "call_function" or n in eager_nodes or check(n):
            continue
        users = [u for u in n.users if not check(u)]
        if users and all(u in found or u in inner or masks(u, n) for u in users):
            found.add(n)
    found |= {u for n in found for u in n.users if check(u)}
    return found


def _module_path(n: fx.Node) -> str | None:
    stack = n.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else None


def _floating_or_bool(n: fx.Node) -> bool:
    val = n.meta.get("val")
    return isinstance(val, torch.Tensor) and (val.is_floating_point() or val.dtype == torch.bool)


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """The aten nodes of one call of a Python function that training replaces by a fused kernel.

    ``nodes``: the call's nodes in order; ``inputs``: floating tensors entering it; ``out``: its
    (first) floating output used after it.
    """

    nodes: frozenset
    inputs: tuple
    out: fx.Node


def kernel_calls(graph: fx.Graph, call: str) -> dict[fx.Node, KernelCall]:
    """{output node: :class:`KernelCall`} for each call of the function named ``call``.

    torch.export records each node's Python stack ("File ..., line N" then the code line, per
    frame); the frames inside the called function itself are not kept, so the run of nodes whose
    stack holds a line calling ``call(`` is that call (e.g. transformers'
    ``torch_chunk_gated_delta_rule``, the torch version of fla's kernel). That line need not be the
    innermost frame: transformers >= 5.25 routes the call through the ``kernels`` package's
    function wrapper (``kernels/_internals/layer/layer.py``, ``return func(*args, **kwargs)``),
    whose frame comes after it. The innermost line calling ``call(`` with its file and line number
    names the call.
    """
    runs: dict[tuple, list[fx.Node]] = {}
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        frames = (n.meta.get("stack_trace") or "").rstrip().splitlines()
        at = next((i for i in range(len(frames) - 1, -1, -1) if f"{call}(" in frames[i]), None)
        if at is not None:
            site = tuple(f.strip() for f in frames[max(at - 1, 0):at + 1])
            runs.setdefault((_module_path(n), site), []).append(n)
    found: dict[fx.Node, KernelCall] = {}
    for nodes in runs.values():
        inside = set(nodes)
        inputs = []
        for m in nodes:
            for a in m.all_input_nodes:
                if a not in inside and a not in inputs and _floating_or_bool(a):
                    inputs.append(a)
        outs = [m for m in nodes if _floating_or_bool(m)
                and any(u not in inside for u in m.users)]
        if outs:
            found[outs[0]] = KernelCall(frozenset(inside), tuple(inputs), outs[0])
    return found
