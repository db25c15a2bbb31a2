"""The MoE router's training-only losses, added to an extracted graph.

The traced graph holds what the model's forward runs: the router GEMM, its score function and
top-k (of the transformers stand-in, :mod:`autopar.models.hf_equivalent`). Megatron-Core 0.16.1
computes more in training, on the router logits [T, E] (T tokens of the micro-batch, E routed
experts; the logits in the compute dtype, ``moe_router_dtype`` None), with its unfused kernels
(``moe_router_fusion=False``, its default):

- an auxiliary load-balancing loss (``aux_loss``, ``seq_aux_loss``, ``global_aux_loss``) when its
  coefficient is > 0 (moe/router.py ``routing``: ``compute_routing_scores_for_aux_loss`` then
  ``_apply_aux_loss`` / ``_apply_seq_aux_loss`` / ``_apply_global_aux_loss``, each returning at
  once for a 0 coefficient);
- the z-loss when ``moe_z_loss_coeff`` is set (moe/router.py ``apply_z_loss``; moe_utils.py
  ``z_loss_func``: ``torch.square(torch.logsumexp(logits, -1))``, its mean times the coefficient).

Both are memory-bound passes over [T, E]: each is added to every MoE block as one
``elementwise`` op with the bytes and kernels below (:data:`ROUTER_LOSS_KERNELS`), run where the
router runs (region "seq": split by TP only with sequence parallelism).

Not priced, and why: Sinkhorn routing (moe_utils.py ``sinkhorn``: ``while error > tol`` with
tol 1e-4, a data-dependent number of iterations, each synchronising with the host), the
[E]-sized all-reduce of tokens per expert each aux loss makes over the TP x CP group (and over
DP for ``global_aux_loss``), the expert-bias update (one [E] all-reduce per step,
finalize_model_grads), and the [T, E] scores an aux loss saves for its backward (fp32: 4 bytes
per element, against a layer's activations of tens of bytes per token x hidden).
"""

from __future__ import annotations

import dataclasses

from .types import Layer, ModelGraph, Op

#: Forward HBM bytes per [T, E] element of the aux loss, as ``a * d + b`` for logits of d bytes:
#: softmax scoring (moe_utils.py ``compute_routing_scores_for_aux_loss``): ``torch.softmax(
#: logits, dtype=float32)`` reads d, writes 4; ``torch.topk`` reads the fp32 scores (4); the
#: routing map ``torch.zeros_like(logits).int().scatter(...).bool()``: zeros write d, ``int``
#: reads d writes 4, ``bool`` reads 4 writes 1; the tokens per expert (``routing_map.sum(0)``)
#: read 1; ``switch_load_balancing_loss_func``'s ``probs.sum(dim=0)`` reads 4: 3d + 22.
#: Sigmoid scoring: ``torch.sigmoid`` (d + d), its row sum (d), the division (d + d), topk (d),
#: the same routing map (2d + 9), tokens per expert (1), ``probs.sum`` (d): 8d + 10.
AUX_LOSS_FWD_BYTES = {"softmax": (3, 22), "sigmoid": (8, 10)}
#: Backward bytes per element (the loss's gradient reaches the logits through the scores; the
#: routing map is not differentiated): softmax: ``sum``'s backward is an expanded view, the
#: fp32 softmax backward reads the saved output (4) and writes 4, the cast to the logits' dtype
#: reads 4 and writes d, and the gradient is added into the logits' (reads 2d, writes d):
#: 4d + 12. Sigmoid: the division's two gradients (write d; read d, write d, row sum read d), the
#: sum of both paths (read d, write d), ``sigmoid_backward`` (read 2d, write d), the add into
#: the logits' gradient (3d): 13d.
AUX_LOSS_BWD_BYTES = {"softmax": (4, 12), "sigmoid": (13, 0)}
#: z-loss bytes per element: forward ATen ``logsumexp`` (ReduceOps.cpp ``logsumexp_out_impl``:
#: ``amax`` reads d, ``self - maxes`` reads d writes d, ``exp_`` reads d writes d, ``sum`` reads
#: d): 6d; backward (derivatives.yaml ``logsumexp``: ``logsumexp_backward``, grad *
#: (self - result).exp(): the subtraction, exp and product each read d and write d, then the add
#: into the logits' gradient reads 2d and writes d): 9d.
Z_LOSS_FWD_BYTES = (6, 0)
Z_LOSS_BWD_BYTES = (9, 0)
#: Forward kernel launches of each: the [T, E] ones above (softmax scoring 8, sigmoid 11, z-loss
#: 4) plus those on [E] or [T] that finish the loss (the aux loss: its product with the tokens
#: per expert and the sum, 2; the z-loss: the row max's fill, log, add, square, mean and the
#: coefficient, 6). The backward is priced by its bytes (:func:`router_loss_backward_bytes`).
ROUTER_LOSS_KERNELS = {"router_aux_loss_softmax": 10, "router_aux_loss_sigmoid": 13,
                       "router_z_loss": 10}


def _bytes(rule: tuple[int, int], d: int, elements: int) -> int:
    return (rule[0] * d + rule[1]) * elements


def _rules(op: Op) -> tuple[tuple[int, int], tuple[int, int]]:
    if op.target == "router_z_loss":
        return Z_LOSS_FWD_BYTES, Z_LOSS_BWD_BYTES
    score = op.target.rsplit("_", 1)[1]
    return AUX_LOSS_FWD_BYTES[score], AUX_LOSS_BWD_BYTES[score]


def router_loss_backward_bytes(op: Op) -> float:
    """Backward HBM bytes of a router-loss op added by :func:`with_router_losses`, at the
    graph's micro-batch: its [T, E] element count is ``op.bytes_written`` and the logits'
    element size follows from its forward bytes (the rules are linear in it)."""
    fwd, bwd = _rules(op)
    elements = op.bytes_written
    d = ((op.bytes_read + op.bytes_written) / elements - fwd[1]) / fwd[0]
    return (bwd[0] * d + bwd[1]) * elements


def is_router_loss(op: Op) -> bool:
    """Whether ``op`` is a router loss :func:`with_router_losses` added."""
    return op.target in ROUTER_LOSS_KERNELS


def with_router_losses(graph: ModelGraph, *, score_function: str, aux_loss: bool,
                       z_loss: bool) -> ModelGraph:
    """``graph`` with the router's training-only losses (module docstring) in every MoE block,
    after its router op.

    Args:
        graph: an extracted graph (blocks with ``num_experts`` > 0 are MoE blocks).
        score_function: "softmax" or "sigmoid" (the aux loss scores as the router does).
        aux_loss: whether an auxiliary load-balancing loss is computed (coefficient > 0).
        z_loss: whether the z-loss is computed.

    Each op's ``bytes_read`` is its forward bytes less T x E, ``bytes_written`` T x E (the
    element count its backward is priced from, :func:`router_loss_backward_bytes`); the graph
    is returned unchanged when neither loss is on.
    """
    if not (aux_loss or z_loss) or not any(b.num_experts for b in graph.blocks):
        return graph
    d = graph.dtype_bytes
    tokens = graph.seq_len * graph.micro_batch_size
    layers = []
    for layer in graph.layers:
        if layer.kind != "block" or not layer.num_experts:
            layers.append(layer)
            continue
        elements = tokens * layer.num_experts
        added = []
        if z_loss:
            added.append(("router_z_loss", _bytes(Z_LOSS_FWD_BYTES, d, elements)))
        if aux_loss:
            added.append((f"router_aux_loss_{score_function}",
                          _bytes(AUX_LOSS_FWD_BYTES[score_function], d, elements)))
        new = [Op(name=target, kind="elementwise", target=target, fwd_flops=0.0,
                  bytes_read=nbytes - elements, bytes_written=elements, num_parameters=0,
                  region="seq") for target, nbytes in added]
        at = next((i + 1 for i, o in enumerate(layer.ops) if o.moe_role == "router"),
                  len(layer.ops))
        tag = "+".join(t for t, _ in added)
        layers.append(_with_ops(layer, at, new, tag))
    return dataclasses.replace(graph, layers=tuple(layers))


def _with_ops(layer: Layer, at: int, new: list[Op], tag: str) -> Layer:
    return dataclasses.replace(layer, ops=(*layer.ops[:at], *new, *layer.ops[at:]),
                               signature=f"{layer.signature}|{tag}")
