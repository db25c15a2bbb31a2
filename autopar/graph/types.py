"""The operator graph as pure data: ops grouped into layers, measured on meta tensors.

All sizes are for ONE micro-batch of the extraction's ``micro_batch_size`` sequences of ``seq_len``
tokens, in the model's parameter dtype, with no parallelism applied. Every quantity here is linear in
the micro-batch size, so the cost model scales it; sharding (TP, SP, CP) is applied by the cost model
from the per-op ``region`` and TP roles recorded here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

#: Op kinds the extractor tells apart.
OP_KINDS = (
    "matmul",      # linear layers and other GEMMs
    "attention",   # scaled-dot-product attention (modelled as flash attention)
    "norm",        # LayerNorm / RMSNorm
    "embedding",   # table lookups
    "dropout",
    "loss",        # cross entropy
    "elementwise", # activations, residual adds, RoPE arithmetic
    "view",        # reshapes, transposes, slicing: no data moved
)

#: Where a tensor lives with respect to tensor parallelism (Megatron-LM's f/g regions):
#: "seq" tensors are replicated under TP and sharded over the sequence only with SP;
#: "tp" tensors lie between a column-parallel and a row-parallel linear and are sharded by TP.
REGIONS = ("seq", "tp")


@dataclass(frozen=True)
class Op:
    """One operation of a layer.

    Attributes:
        name: fx node name, unique within its layer.
        kind: one of :data:`OP_KINDS`.
        target: the called function, method or module type, for display.
        fwd_flops: forward FLOPs (multiply-add = 2 FLOPs) counted by
            ``torch.utils.flop_counter.FlopCounterMode``; attention by FlopCounterMode's own SDPA
            rule (non-causal: 4*b*heads*s*s*head_dim), see :mod:`autopar.graph.kernels`.
        bytes_read: bytes of tensor inputs and parameters read.
        bytes_written: bytes of tensor outputs.
        num_parameters: parameter elements this op owns (0 for a second use of a shared weight).
        region: "seq" or "tp", see :data:`REGIONS`.
        tp_role: "column", "row", "vocab" (vocabulary-parallel embedding or head) or "".
        causal: for attention, whether the mask is causal (half the FLOPs are skipped in practice).
        gemm: for a linear layer, its GEMM as (M, K, N): M rows (tokens), K input features,
            N output features; the cost model's matmul-efficiency curve reads it. Empty otherwise.
            For a grouped expert GEMM, M is the rows over all experts (tokens x experts_per_token).
        fused: False only for unfused (math-path) attention.
        moe_role: "router" (the gate linear whose scores feed a top-k; replicated under TP),
            "expert" (a GEMM over a stacked [experts, ...] weight: kind is still "matmul", its
            FLOPs count the routed rows only, i.e. active parameters) or "".
        window: for attention with a limited span, the tokens each query sees: the sliding
            window (itself and window - 1 before it) or, with ``chunked``, the chunk length;
            0 for full attention. ``fwd_flops`` already counts only the span (see
            :mod:`autopar.graph.spans`).
        chunked: True for chunked attention (Llama 4), False for a sliding window.
    """

    name: str
    kind: str
    target: str
    fwd_flops: float
    bytes_read: int
    bytes_written: int
    num_parameters: int
    region: str
    tp_role: str = ""
    causal: bool = False
    gemm: tuple[int, ...] = ()
    fused: bool = True
    moe_role: str = ""
    window: int = 0
    chunked: bool = False


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes a layer saves for its backward pass, per micro-batch, split by how they shard.

    Korthikanti et al. 2022 (arXiv 2205.05198), section 4: ``seq`` bytes are the "10 sbh" part
    replicated under TP (sharded only with sequence parallelism), ``tp`` the "24 sbh / t" part,
    ``core`` the attention-internal bytes that selective recomputation drops (the 5as^2b terms
    without flash attention, the softmax statistics with it). ``layer_input`` is what full
    recomputation keeps (the 2sbh checkpoint).

    Of ``seq`` and ``tp``, the inputs of Linear ops (GEMMs against a weight, MoE routers left
    out) that a framework may keep in FP8 instead
    (:attr:`autopar.frameworks.MemoryConventions.fp8_input_saved_bytes`): ``linear_seq`` /
    ``linear_tp`` those only Linear ops keep (a norm's output, a gated unit's output),
    ``linear_shared_seq`` / ``linear_shared_tp`` those another op keeps as well (the attention
    output, which the attention kernel keeps for its own backward). 0 for graphs built
    without a trace.
    """

    seq: int
    tp: int
    core: int
    layer_input: int
    linear_seq: int = 0
    linear_tp: int = 0
    linear_shared_seq: int = 0
    linear_shared_tp: int = 0

    @property
    def total(self) -> int:
        """All saved bytes with no recomputation and no sharding."""
        return self.seq + self.tp + self.core


@dataclass(frozen=True)
class Layer:
    """A contiguous group of ops: the embedding, one decoder block, or the head (norm, LM head, loss).

    Attributes:
        index: position in the model, 0-based.
        name: module path (e.g. ``layers.3``) or ``embed`` / ``head``.
        kind: "embedding", "block" or "head".
        signature: equal for repeated blocks of the same structure and shapes; the extractor
            measures each signature once and the search treats equal signatures as one.
        ops: the layer's ops in execution order.
        num_parameters: parameter elements used by the layer (a weight tied with another layer
            counts in both; :attr:`ModelGraph.num_parameters` counts it once).
        param_bytes: bytes of those parameters in the model's dtype.
        fwd_flops / bwd_flops: FLOPs of the forward and of the backward pass (input and weight
            gradients), measured with FlopCounterMode; attention backward by its SDPA rule.
        activations: :class:`ActivationBytes` saved for backward.
        output_bytes: bytes of the layer's output (what a pipeline stage boundary sends).
        tp_row_outputs: bytes of each row-parallel output (one TP all-reduce, or reduce-scatter with
            SP, in forward; found from the graph, not from module names).
        tp_column_inputs: bytes of each distinct input of a group of column-parallel linears
            (one TP all-reduce in backward; an all-gather in forward with SP).
        attention_heads / kv_heads: heads seen at the attention op (0 when the layer has none).
        shared_parameters: elements of :attr:`num_parameters` that an earlier layer uses too
            (a tied LM head); a pipeline stage holding both layers stores them once.
        num_experts / experts_per_token: for a mixture-of-experts block, the experts of its
            stacked expert weights and the router's top-k (0 for dense layers). Expert
            parallelism (EP) must divide ``num_experts``.
        saved_by_op: :attr:`activations` by the op that saved each tensor first, as
            ``(op name, part, bytes)`` with part "seq", "tp" or "core" (the
            :class:`ActivationBytes` part it counts in; a part's entries sum to it). Read by
            :mod:`autopar.cost.selective` (what a checkpointed submodule drops); empty for
            layers built without a trace.
    """

    index: int
    name: str
    kind: str
    signature: str
    ops: tuple[Op, ...]
    num_parameters: int
    param_bytes: int
    fwd_flops: float
    bwd_flops: float
    activations: ActivationBytes
    output_bytes: int
    tp_row_outputs: tuple[int, ...] = ()
    tp_column_inputs: tuple[int, ...] = ()
    attention_heads: int = 0
    kv_heads: int = 0
    shared_parameters: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    saved_by_op: tuple[tuple[str, str, int], ...] = ()

    @cached_property
    def expert_parameters(self) -> int:
        """Parameter elements of MoE expert GEMMs (sharded by expert parallelism; computed once
        per layer: the search asks for it per pipeline rank it prices)."""
        return sum(o.num_parameters for o in self.ops if getattr(o, "moe_role", "") == "expert")

    @cached_property
    def tp_sharded_parameters(self) -> int:
        """Parameter elements in ops TP shards (column, row, vocabulary-parallel; computed once
        per layer)."""
        return sum(o.num_parameters for o in self.ops if o.tp_role) + (
            self.shared_parameters if any(o.tp_role == "vocab" for o in self.ops) else 0)

    @property
    def matmul_fwd_flops(self) -> float:
        """Forward FLOPs of GEMMs (the part that runs at tensor-core speed)."""
        return sum(o.fwd_flops for o in self.ops if o.kind == "matmul")

    @property
    def attention_fwd_flops(self) -> float:
        """Forward FLOPs of attention ops (non-causal count)."""
        return sum(o.fwd_flops for o in self.ops if o.kind == "attention")

    @property
    def memory_bound_bytes(self) -> int:
        """Bytes moved by ops that are not GEMMs or attention (norms, elementwise, dropout, loss)."""
        return sum(
            o.bytes_read + o.bytes_written
            for o in self.ops
            if o.kind not in ("matmul", "attention", "view")
        )


@dataclass(frozen=True)
class ModelGraph:
    """A model as a sequence of measured layers, for one micro-batch.

    Attributes:
        name: the model's name (preset name or class name).
        seq_len: tokens per sequence.
        micro_batch_size: sequences per micro-batch the sizes were measured at.
        dtype_bytes: bytes per parameter/activation element of the model's dtype.
        layers: embedding, blocks, head, in order.
        num_parameters: unique parameter elements (tied weights once).
        hidden_size: width of the residual stream (from the block output shape).
        vocab_size: rows of the (vocabulary-parallel) embedding.
        method: "fx" or "export": how the graph was extracted.
        notes: how the extraction went (e.g. why torch.fx was not used).
        warnings: what about the model and the training config the user should know before
            trusting a plan of it (e.g. a sequence longer than the model's positions); every
            :class:`autopar.cost.types.Estimate` of the graph carries them.
    """

    name: str
    seq_len: int
    micro_batch_size: int
    dtype_bytes: int
    layers: tuple[Layer, ...]
    num_parameters: int
    hidden_size: int
    vocab_size: int
    method: str = "fx"
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    @cached_property
    def forward_flops(self) -> float:
        """Forward FLOPs of one micro-batch (FLOPs)."""
        return sum(layer.fwd_flops for layer in self.layers)

    @cached_property
    def backward_flops(self) -> float:
        """Backward FLOPs of one micro-batch (FLOPs)."""
        return sum(layer.bwd_flops for layer in self.layers)

    @cached_property
    def blocks(self) -> tuple[Layer, ...]:
        """The repeated decoder blocks."""
        return tuple(layer for layer in self.layers if layer.kind == "block")

    @cached_property
    def num_blocks(self) -> int:
        """How many decoder blocks the model has."""
        return len(self.blocks)

    @cached_property
    def attention_heads(self) -> int:
        """Attention (query) heads per block; TP must divide it."""
        return max((layer.attention_heads for layer in self.layers), default=0)

    @cached_property
    def kv_heads(self) -> int:
        """Key/value heads per block (GQA); TP must divide it."""
        return max((layer.kv_heads for layer in self.layers), default=0)

    @cached_property
    def num_experts(self) -> int:
        """Experts per MoE block (0 for a dense model); expert parallelism must divide it."""
        return max((layer.num_experts for layer in self.layers), default=0)
