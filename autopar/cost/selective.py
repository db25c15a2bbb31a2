"""Megatron-Core's selective recomputation by submodule (``--recompute-granularity selective
--recompute-modules ...``) on autopar's op graph: which saved tensors each module drops, and
which ops' forward its backward repeats.

Megatron-Core (NVIDIA/Megatron-LM at d98e8a64) checkpoints each module in one of two ways
(``transformer_config.py`` ``recompute_modules``, line 560):

- normal checkpointing (``tensor_parallel.checkpoint``; "core_attn", "mlp", "moe",
  "shared_experts"): the module runs without saving anything but its inputs, and its forward
  runs again before its backward. Dropped: what the module's ops saved, less its input;
- output-discarding checkpointing (``CheckpointWithoutOutput``; "moe_act", "layernorm"): the
  function runs without autograd, its output is used by the next op (which saves it) and then
  freed (``discard_output_and_register_recompute``), to be recomputed from the kept input before
  that op's backward. Dropped: the function's output.

Where each module sits and which ops of an autopar block it covers (the block's ops in order:
input norm, attention, output projection, pre-MLP norm, MLP or MoE layer):

- "core_attn" (``attention.py`` ``_checkpointed_attention_forward``): the attention op; drops
  :attr:`~autopar.graph.types.ActivationBytes.core`, as autopar's "selective" always did;
- "layernorm" (``transformer_layer.py`` ``recompute_input_layernorm`` /
  ``recompute_pre_mlp_layernorm``, ``_run_input_layernorm``): a norm's output, for each norm that
  is a module of its own, not an ``IdentityOp`` fused into the next linear. In Megatron-Core's
  Transformer Engine layer spec (``models/gpt/gpt_layer_specs.py``
  ``get_gpt_layer_with_transformer_engine_submodules``) the input norm is its own module only
  before multi-latent attention (whose down projections are plain ``backend.linear()``; the QKV
  of standard attention is a ``TELayerNormColumnParallelLinear``), the pre-MLP norm only in MoE
  layers (``pre_mlp_layernorm=backend.layer_norm() if num_experts else IdentityOp``);
- "moe_act" (``moe/experts.py`` ``TEGroupedMLP.forward``, ``activation_recompute``): the routed
  experts' activation, whose output (the second expert GEMM's input) is dropped;
- "mla_up_proj" (``multi_latent_attention.py`` ``MLASelfAttention``, ``recompute_up_proj``: the
  query and key-value up projections and the rotary embedding run under
  ``CheckpointWithoutOutput``, whose output is discarded once the attention core has run,
  ``qkv_up_checkpoint.discard_output_and_register_recompute``): in a multi-latent attention
  block (one whose down projections, replicated GEMMs, precede the attention), the query, key
  and value the attention op saved are dropped (what it saved less its output), with the up
  projections' saved inputs: in the Transformer Engine spec the query and key-value norms are
  fused into the up projections (``gpt_layer_specs.py``: ``linear_q_up_proj`` /
  ``linear_kv_up_proj`` are ``column_parallel_layer_norm_linear()`` with ``qk_layernorm``,
  ``q_layernorm`` / ``kv_layernorm`` ``IdentityOp``), so the normed latents are inside the
  checkpoint, whose inputs are the down projections' outputs (``qkv_up_checkpoint.checkpoint(
  qkv_up_proj_and_rope_apply, q_compressed, kv_compressed, ...)``). The ops after the first down
  projection up to the attention, down projections apart, run again. A no-op
  elsewhere, and under "core_attn", which drops the attention's saved tensors already. DeepSeek-
  V3's recipe (arXiv 2412.19437 section 3.2.3: RMSNorm and MLA up-projection outputs
  recomputed, the SwiGLU output too) is "layernorm", "mla_up_proj", "moe_act";
- "moe" (``moe/moe_layer.py`` ``moe_layer_recompute``): the whole MoE layer, router, dispatch,
  experts, combine and shared experts; its forward repeats the dispatch and combine
  all-to-alls (priced in :mod:`autopar.cost.blocks`);
- "shared_experts" (``moe/moe_layer.py`` ``shared_experts_recompute``): the shared experts' MLP;
- "mlp" (``transformer_layer.py`` ``recompute_mlp``): a dense layer's MLP (with its fused
  pre-MLP norm; MoE layers ignore it). Its repeated TP collectives are not priced.

Sizes here are at the graph's micro-batch, unsharded, split into the parts of
:class:`~autopar.graph.types.ActivationBytes` (``seq``, ``tp``, ``core``), which
:func:`autopar.cost.memory.block_activation_bytes` shards.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_MODULES
from ..graph.types import Layer


@dataclass(frozen=True)
class ModuleRecompute:
    """What a set of checkpointed Megatron-Core submodules drops from one block and repeats.

    Attributes:
        seq, tp, core: bytes dropped from each part of the block's saved activations, at the
            graph's micro-batch, unsharded.
        ops: indices of ``layer.ops`` whose forward the backward runs again.
        dispatch: the MoE dispatch and combine all-to-alls run again ("moe").
        linear_seq, linear_tp: the part of ``seq`` / ``tp`` that is the saved inputs of
            checkpointed Linear ops (GEMMs that saved them first; a tensor another op saved
            first is not counted), whose FP8 copies go with them
            (:meth:`linear_dropped_bytes`). The norm outputs "layernorm" drops are not among
            them.
        norm_linear_seq: of ``seq``, the outputs of norms "layernorm" drops that only Linear
            ops keep (the input norm before multi-latent attention, read by the down
            projections ``linear_q_down_proj`` / ``linear_kv_down_proj``, Transformer Engine
            Linears, and counted by the graph at its first saver, a Linear). Under FP8 those
            Linears keep FP8 copies of their own, which ``CheckpointWithoutOutput`` does not
            discard: the drop takes only the training-dtype output, which no op keeps then
            (:meth:`norm_linear_dropped_bytes`). The pre-MLP norm's output is not among them:
            Megatron-Core's router keeps it in the training dtype
            (:func:`autopar.cost.memory.router_saved_delta`), and that tensor is what goes.
    """

    seq: float = 0.0
    tp: float = 0.0
    core: float = 0.0
    ops: tuple[int, ...] = ()
    dispatch: bool = False
    linear_seq: float = 0.0
    linear_tp: float = 0.0
    norm_linear_seq: float = 0.0

    def dropped_bytes(self, *, micro_batch: float, tp: int, cp: int,
                      sequence_parallel: bool) -> float:
        """Bytes dropped per micro-batch on one GPU, sharded as
        :func:`autopar.cost.memory.block_activation_bytes` shards each part (``seq`` by t only
        with sequence parallelism, ``tp`` and ``core`` by t, all by cp); ``micro_batch`` in
        units of the graph's micro-batch."""
        seq_div = tp if sequence_parallel else 1
        return (self.seq / seq_div + (self.tp + self.core) / tp) * micro_batch / cp

    def linear_dropped_bytes(self, *, micro_batch: float, tp: int, cp: int,
                             sequence_parallel: bool) -> float:
        """The checkpointed Linear inputs among :meth:`dropped_bytes` (``linear_seq``,
        ``linear_tp``), sharded alike: at the graph's dtype, where FP8 training kept them as
        FP8 copies (:func:`autopar.cost.memory.fp8_input_delta`), so the caller adds back
        what the FP8 count had already taken off."""
        seq_div = tp if sequence_parallel else 1
        return (self.linear_seq / seq_div + self.linear_tp / tp) * micro_batch / cp

    def norm_linear_dropped_bytes(self, *, micro_batch: float, tp: int, cp: int,
                                  sequence_parallel: bool) -> float:
        """The norm outputs among :meth:`dropped_bytes` that only Linear ops keep
        (``norm_linear_seq``), sharded as ``seq``: at the graph's dtype. Under FP8 Linear
        copies the caller adds them back whole: the graph's count of them had become the
        Linears' FP8 copies (:func:`autopar.cost.memory.fp8_input_delta`), which stay."""
        seq_div = tp if sequence_parallel else 1
        return self.norm_linear_seq / seq_div * micro_batch / cp


@dataclass(frozen=True)
class BlockParts:
    """Where a block's Megatron-Core submodules lie among its ops (indices into ``layer.ops``).

    Attributes:
        attention: the attention ops.
        input_norm: the input norm when it is a module of its own (before multi-latent
            attention), else None.
        pre_mlp_norm: the pre-MLP norm when it is a module of its own (MoE layers), else None.
        mlp: the ops after the attention's output projection, the pre-MLP norm first: the MLP
            or the MoE layer.
        moe_act: the routed experts' activation ops (between the two expert GEMMs).
        expert_out: the second (row-parallel) expert GEMM, or None.
        shared: the shared experts' ops, or ().
    """

    attention: tuple[int, ...]
    input_norm: int | None
    pre_mlp_norm: int | None
    mlp: tuple[int, ...]
    moe_act: tuple[int, ...]
    expert_out: int | None
    shared: tuple[int, ...]


def block_parts(layer: Layer) -> BlockParts:
    """The submodules of a decoder block as Megatron-Core's Transformer Engine spec builds them
    (module docstring), found from op kinds and TP roles: the output projection is the first
    row-parallel GEMM after the attention op; the norms are the sequence-region norms before the
    first GEMM and after the projection (query / key norms run in the TP region); the routed
    experts are the GEMMs with ``moe_role == "expert"``; the shared experts, the other column-
    to row-parallel GEMM pair of an MoE layer."""
    ops = layer.ops
    attention = tuple(i for i, o in enumerate(ops) if o.kind == "attention")
    start = attention[0] if attention else 0
    proj = next((i for i in range(start, len(ops)) if ops[i].kind == "matmul"
                 and ops[i].tp_role == "row" and not ops[i].moe_role), -1)
    first_mm = next((i for i, o in enumerate(ops) if o.kind == "matmul"), len(ops))
    input_norm = next((i for i in range(first_mm) if ops[i].kind == "norm"
                       and ops[i].region == "seq"), None)
    if input_norm is not None and (first_mm == len(ops) or ops[first_mm].tp_role):
        input_norm = None   # fused into the QKV linear (TELayerNormColumnParallelLinear)
    after = range(proj + 1, len(ops)) if proj >= 0 else range(0)
    norm = next((i for i in after if ops[i].kind == "norm" and ops[i].region == "seq"), None)
    mlp = tuple(range(norm, len(ops))) if norm is not None else ()
    moe = bool(layer.num_experts)
    experts = [i for i in mlp if ops[i].moe_role == "expert"]
    fc1 = next((i for i in experts if ops[i].tp_role == "column"), None)
    fc2 = next((i for i in experts if ops[i].tp_role == "row"), None)
    act = (tuple(i for i in range(fc1 + 1, fc2) if ops[i].kind != "view")
           if fc1 is not None and fc2 is not None else ())
    shared: tuple[int, ...] = ()
    if moe:
        col = next((i for i in mlp if ops[i].kind == "matmul" and not ops[i].moe_role
                    and ops[i].tp_role == "column"), None)
        row = next((i for i in mlp if col is not None and i > col and ops[i].kind == "matmul"
                    and not ops[i].moe_role and ops[i].tp_role == "row"), None)
        if col is not None and row is not None:
            shared = tuple(range(col, row + 1))
    return BlockParts(attention, input_norm, norm if moe else None, mlp, act, fc2, shared)


def module_recompute(layer: Layer, modules: tuple[str, ...]) -> ModuleRecompute:
    """What ``modules`` (names of :data:`autopar.config.RECOMPUTE_MODULES`) drop from decoder
    block ``layer`` and repeat (module docstring). A non-block layer, or one traced without
    :attr:`~autopar.graph.types.Layer.saved_by_op`, drops nothing beyond the attention core.

    Raises:
        ValueError: a name outside :data:`autopar.config.RECOMPUTE_MODULES`.
    """
    unknown = set(modules) - set(RECOMPUTE_MODULES)
    if unknown:
        raise ValueError(f"recompute modules {sorted(unknown)} are not priced; "
                         f"autopar prices {RECOMPUTE_MODULES}")
    parts = block_parts(layer) if layer.kind == "block" else None
    ops = layer.ops
    dropped = {"seq": 0.0, "tp": 0.0, "core": 0.0}
    linear = {"seq": 0.0, "tp": 0.0}   # of which checkpointed Linear inputs
    again: set[int] = set()
    if "core_attn" in modules:
        dropped["core"] += layer.activations.core
        if parts is not None:
            again.update(parts.attention)
    if parts is None or not layer.saved_by_op:
        return ModuleRecompute(core=dropped["core"], ops=tuple(sorted(again)))
    index = {o.name: i for i, o in enumerate(ops)}
    saved_at: dict[int, dict[str, int]] = {}
    for name, part, nbytes in layer.saved_by_op:
        i = index.get(name)
        if i is not None:
            saved_at.setdefault(i, {}).setdefault(part, 0)
            saved_at[i][part] += nbytes

    def drop_linear_input(i: int) -> None:
        # a checkpointed GEMM's saved input (and with it its FP8 copy under FP8)
        for part, nbytes in saved_at.get(i, {}).items():
            if part != "core":
                dropped[part] += nbytes
                linear[part] += nbytes

    def drop_saved(span, less: float = 0.0) -> None:
        # what the span's ops saved, less its input kept by the checkpoint (a "seq" tensor)
        seq = lin_seq = 0.0
        for i in span:
            for part, nbytes in saved_at.get(i, {}).items():
                if part == "core" and "core_attn" in modules:
                    continue   # counted once, with the attention core
                if part == "seq":
                    seq += nbytes
                    lin_seq += nbytes if _linear(ops[i]) else 0.0
                else:
                    dropped[part] += nbytes
                    linear[part] += nbytes if _linear(ops[i]) and part == "tp" else 0.0
        dropped["seq"] += max(0.0, seq - less)
        linear["seq"] += max(0.0, lin_seq - less)

    moe = bool(layer.num_experts)
    norms = [i for i in (parts.input_norm, parts.pre_mlp_norm) if i is not None]
    norm_linear = 0.0
    if "layernorm" in modules:
        for i in norms:
            dropped["seq"] += ops[i].bytes_written
            again.add(i)
        if parts.input_norm is not None and _first_saver_is_linear(
                ops, saved_at, parts.input_norm):
            # before multi-latent attention only the down projections (Linears) read it
            norm_linear += ops[parts.input_norm].bytes_written
    att = parts.attention[0] if parts.attention else None
    down = [i for i in range(att or 0) if ops[i].kind == "matmul" and not ops[i].tp_role]
    if "mla_up_proj" in modules and "core_attn" not in modules and down and att is not None:
        up = next((i for i in range(down[0], att) if ops[i].kind == "matmul"
                   and ops[i].tp_role), None)
        if up is not None:
            for part, nbytes in saved_at.get(att, {}).items():
                if part != "core":
                    dropped[part] += nbytes
            # the attention's output stays saved (its own backward needs it)
            out_part = ops[att].region if ops[att].region in ("seq", "tp") else "tp"
            dropped[out_part] = max(0.0, dropped[out_part] - ops[att].bytes_written)
            # the query / key-value norms are fused into the up projections
            # (TELayerNormColumnParallelLinear) inside the checkpoint: the up projections'
            # saved inputs (the normed latents) go too; the norms' own inputs, the down
            # projections' outputs, are the checkpoint's inputs and stay
            for i in range(up, att):
                if ops[i].kind == "matmul" and ops[i].tp_role:
                    drop_linear_input(i)
            again.update(i for i in range(down[0] + 1, att)
                         if not (ops[i].kind == "matmul" and not ops[i].tp_role))
    if moe and "moe" in modules:
        # the MoE layer after its (separate) pre-MLP norm; the norm's output, which its first
        # op saved, is the checkpoint's input: kept, or dropped above by "layernorm"
        body = parts.mlp[1:]
        pre_out = ops[parts.pre_mlp_norm].bytes_written if parts.pre_mlp_norm is not None else 0
        drop_saved(body, less=pre_out)
        again.update(body)
        return _done(dropped, again, linear, norm_linear, dispatch=True)
    if moe and "moe_act" in modules and parts.expert_out is not None:
        # the activation's output is what the second expert GEMM saved: its input
        drop_linear_input(parts.expert_out)
        again.update(parts.moe_act)
    if moe and "shared_experts" in modules and parts.shared:
        drop_saved(parts.shared)
        again.update(parts.shared)
    if not moe and "mlp" in modules and parts.mlp:
        # the fused pre-MLP norm and the MLP: the norm's own saved input is the checkpoint's
        drop_saved(parts.mlp[1:])
        again.update(parts.mlp)
    return _done(dropped, again, linear, norm_linear)


def _first_saver_is_linear(ops, saved_at: dict[int, dict[str, int]], norm: int) -> bool:
    """Whether the first op after norm ``ops[norm]`` that saved anything is a Linear
    (:func:`_linear`) whose saved "seq" bytes are the norm's output: the graph counts that
    output among the Linear-only inputs there."""
    j = next((i for i in range(norm + 1, len(ops)) if saved_at.get(i)), None)
    return (j is not None and _linear(ops[j])
            and saved_at[j].get("seq", 0) == ops[norm].bytes_written)


def _linear(op) -> bool:
    """Whether ``op`` is a Linear whose saved input the graph counts among the Linear-only
    inputs (:attr:`~autopar.graph.types.ActivationBytes.linear_seq`): a GEMM other than the
    router (which saves its own cast copies)."""
    return op.kind == "matmul" and op.moe_role != "router"


def _done(dropped: dict[str, float], again: set[int], linear: dict[str, float],
          norm_linear: float = 0.0, dispatch: bool = False) -> ModuleRecompute:
    return ModuleRecompute(seq=dropped["seq"], tp=dropped["tp"], core=dropped["core"],
                           ops=tuple(sorted(again)), dispatch=dispatch,
                           linear_seq=linear["seq"], linear_tp=linear["tp"],
                           norm_linear_seq=norm_linear)


def is_default(modules: tuple[str, ...]) -> bool:
    """Whether ``modules`` is Megatron-Core's default set (the attention core), which autopar's
    "selective" has always priced (:data:`autopar.config.DEFAULT_RECOMPUTE_MODULES`)."""
    return tuple(modules) == DEFAULT_RECOMPUTE_MODULES
