"""Multi-token-prediction (MTP) layers added to an extracted graph.

DeepSeek-V3 (arXiv 2412.19437, section 2.2) trains with D sequential MTP modules. Module k
takes the previous depth's hidden states and the embeddings of the tokens k ahead, normalises
both (RMSNorm each), concatenates them and projects 2h -> h (``M_k``), runs one transformer
block ``TRM_k`` and predicts through the output head it shares with the main model, with its own
cross-entropy loss; the embedding and head weights are shared. Megatron-Core builds the same
(``megatron/core/transformer/multi_token_prediction.py``: ``enorm``, ``hnorm``, ``eh_proj``, a
decoder layer of the model's own spec, the shared output layer) and runs the MTP layers on the
last pipeline stage. transformers does not build them, so they are added to the graph here:

- a block per depth: a copy of the model's last block (DeepSeek-V3's MTP block has the MoE layer
  spec), with the 2h -> h projection as one more GEMM (kept whole under TP: an approximation of
  Megatron's column-parallel ``eh_proj``, a 2h x h GEMM beside a block of experts) whose 2h-wide
  input is saved for its backward, and the gather of the shifted tokens' embeddings, which reads
  the embedding table: the block uses the table's parameters as a tied head does
  (``Layer.shared_parameters``), so a pipeline stage that runs it without the embedding layer
  holds a copy of the table. Megatron-Core builds that copy (``megatron/core/models/gpt/
  gpt_model.py``: ``if self.pre_process or self.mtp_process: self.embedding = ...``, "we need to
  maintain a copy of embedding layer in the mtp process stage and tie it to the embedding in the
  pre processing stage"); DeepSeek-V3's DualPipe places the embedding and the MTP module on the
  same rank (section 3.2.3), where the stage stores the table once;
- a second pass through the head: the head layer's ops again (the output GEMM and the loss on the
  MTP hidden states) with no parameters of their own (the head is shared), so the head costs
  twice its compute and keeps twice its saved logits.

The copy's gradients are summed with the first stage's once per step
(:mod:`autopar.cost.embedding_sync`). Not counted: the two RMSNorms per depth (memory-bound work
of h per token) and the MTP final norm's h parameters.
"""

from __future__ import annotations

import dataclasses

from .types import ActivationBytes, Layer, ModelGraph, Op


def _projection(block: Layer, graph: ModelGraph, depth: int) -> Op:
    tokens = graph.seq_len * graph.micro_batch_size
    h, e = graph.hidden_size, graph.dtype_bytes
    return Op(name=f"mtp{depth}_eh_proj", kind="matmul", target="linear",
              fwd_flops=2.0 * tokens * 2 * h * h, bytes_read=(tokens * 2 * h + 2 * h * h) * e,
              bytes_written=tokens * h * e, num_parameters=2 * h * h, region="seq",
              gemm=(tokens, 2 * h, h))


def _gather(graph: ModelGraph, depth: int) -> Op:
    """The embedding lookup of depth ``depth``'s shifted tokens: the rows it reads and writes
    (tokens x h), and no parameters of its own (the table is the embedding layer's)."""
    rows = graph.seq_len * graph.micro_batch_size * graph.hidden_size * graph.dtype_bytes
    return Op(name=f"mtp{depth}_embedding", kind="embedding", target="embedding", fwd_flops=0.0,
              bytes_read=rows, bytes_written=rows, num_parameters=0, region="seq",
              tp_role="vocab")


def _table_parameters(graph: ModelGraph) -> int:
    """Parameter elements of the graph's embedding table (0 without an embedding layer)."""
    return sum(o.num_parameters for layer in graph.layers if layer.kind == "embedding"
               for o in layer.ops if o.kind == "embedding")


def with_mtp_layers(graph: ModelGraph, depths: int) -> ModelGraph:
    """``graph`` with ``depths`` MTP modules (module docstring): a block per depth before the
    head (using the embedding table as shared parameters), and the head's ops once more per
    depth.

    Args:
        graph: an extracted graph whose last layer is the head and which has blocks.
        depths: MTP modules D (DeepSeek-V3: 1); 0 returns ``graph`` unchanged.

    Raises:
        ValueError: ``depths`` is negative, or the graph has no block or no head to copy.
    """
    if depths < 0:
        raise ValueError(f"MTP depths must be >= 0, got {depths}")
    if depths == 0:
        return graph
    *body, head = graph.layers
    if head.kind != "head" or not graph.blocks:
        raise ValueError("multi-token prediction needs a graph with blocks and a head")
    last = graph.blocks[-1]
    e = graph.dtype_bytes
    tokens = graph.seq_len * graph.micro_batch_size
    table = _table_parameters(graph)
    added: list[Layer] = []
    for depth in range(1, depths + 1):
        proj = _projection(last, graph, depth)
        act = last.activations
        added.append(dataclasses.replace(
            last, name=f"mtp.{depth}", signature=f"{last.signature}|mtp",
            ops=(_gather(graph, depth), proj, *last.ops),
            num_parameters=last.num_parameters + proj.num_parameters + table,
            shared_parameters=last.shared_parameters + table,
            param_bytes=last.param_bytes + (proj.num_parameters + table) * e,
            fwd_flops=last.fwd_flops + proj.fwd_flops,
            bwd_flops=last.bwd_flops + 2 * proj.fwd_flops,
            activations=dataclasses.replace(act, seq=act.seq + tokens * 2 * graph.hidden_size * e),
            saved_by_op=(*last.saved_by_op, (proj.name, "seq", tokens * 2 * graph.hidden_size * e))))
    again = tuple(dataclasses.replace(o, name=f"{o.name}@mtp{d}", num_parameters=0)
                  for d in range(1, depths + 1) for o in head.ops)
    n = depths + 1
    act = head.activations
    head = dataclasses.replace(
        head, signature=f"{head.signature}|mtp{depths}", ops=(*head.ops, *again),
        fwd_flops=head.fwd_flops * n, bwd_flops=head.bwd_flops * n,
        activations=ActivationBytes(seq=act.seq * n, tp=act.tp * n, core=act.core * n,
                                    layer_input=act.layer_input * n),
        tp_row_outputs=head.tp_row_outputs * n, tp_column_inputs=head.tp_column_inputs * n,
        saved_by_op=tuple((op, part, b * n) for op, part, b in head.saved_by_op))
    layers = tuple(dataclasses.replace(layer, index=i)
                   for i, layer in enumerate((*body, *added, head)))
    return dataclasses.replace(
        graph, layers=layers,
        num_parameters=graph.num_parameters + sum(b.num_parameters - b.shared_parameters
                                                  for b in added),
        notes=(*graph.notes, f"{depths} multi-token-prediction module(s) added "
                             "(autopar.graph.mtp): a copy of the last block with its 2h -> h "
                             "projection each, and the shared head run once more each"))
