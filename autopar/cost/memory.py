"""Memory per GPU: model states by ZeRO stage, activations by recompute mode and schedule.

Model states (Rajbhandari et al. 2020, ZeRO, Figure 1 with K optimizer bytes per parameter, Psi
parameters on the rank after TP and PP):
  stage 0: (w + g + K) Psi;  1: (w + g) Psi + K Psi / d;  2: w Psi + (g + K) Psi / d;
  3: (w + g + K) Psi / d  (+ one layer's gathered parameters in flight).
Activations per block per micro-batch from the graph's measured saved bytes, sharded as
Korthikanti et al. 2022 Table 2 (the ``seq`` part by t only with SP, the ``tp`` part by t,
everything by cp); selective recompute drops the attention core, full recompute keeps only the
block input. Micro-batches in flight per pipeline rank i of p: 1F1B min(m, p - i); interleaved
1F1B with v chunks: (p - i - 1) * 2 + (v - 1) * p + 1 chunk-micro-batches (Narayanan et al. 2021,
Megatron-LM's warm-up count); GPipe: all m; the split-backward schedules (interleaved zero
bubble, ZBV, DualPipeV): counted along torch's own action order, a micro-batch held from its
forward to its weight-gradient pass (:func:`autopar.cost.pipeline.orders.peak_in_flight`);
DeepSeek's DualPipe along its own step, pp + 1 whole stages
(:func:`autopar.cost.pipeline.orders.dualpipe_stage_peak`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import CC9_ARCHITECTURES
from ..graph.types import Layer
from .pipeline.orders import SPLIT_BACKWARD, dualpipe_stage_peak, rank_peak_in_flight
from .qk_norm import whole_head_ops
# re-exported: their callers read them as memory.X
from .saved_adjust import (chunked_loss_bytes, fp8_input_delta,  # noqa: F401
                           moe_saved_delta, routed_saved_bytes, router_saved_delta)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU (one pipeline rank) at its peak.

    Attributes:
        weights, gradients, optimizer_states: model states.
        activations: saved activations of all micro-batches in flight.
        transient: working memory of the layer being computed (its full activations when it is
            recomputed, gathered ZeRO-3 parameters), plus torch's cuBLAS workspaces
            (:func:`cublas_workspace_bytes`).
        reserved: context, workspaces and NCCL buffers outside the allocator, plus what the
            allocator reserves beyond its allocated peak (fragmentation, a fraction of the other
            components; :class:`~autopar.cost.params.CostParams`).
    """

    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    transient: float
    reserved: float

    @property
    def total(self) -> float:
        """Peak bytes on the GPU."""
        return (self.weights + self.gradients + self.optimizer_states + self.activations
                + self.transient + self.reserved)

    @property
    def allocated(self) -> float:
        """Bytes in tensors at the peak (torch.cuda.max_memory_allocated's counter,
        allocated_bytes.all.peak): every component but :attr:`reserved`."""
        return self.total - self.reserved

    def counted(self, kind: str | None, outside_allocator: float) -> float:
        """The peak as a counter of ``kind`` reports it (``outside_allocator``: the part of
        :attr:`reserved` outside torch's allocator, :attr:`autopar.CostParams.reserved_bytes`).

        - "allocated" and "active" (allocated_bytes / active_bytes.all.peak of
          torch.cuda.memory_stats; active also counts blocks freed but still awaiting their
          stream's use, which this model does not separate): :attr:`allocated`.
        - "reserved" (reserved_bytes.all.peak, torch.cuda.max_memory_reserved): the total less
          the memory outside the allocator (CUDA context, NCCL buffers; torch's cuBLAS
          workspaces are inside it, :func:`cublas_workspace_bytes`).
        - "device" or None (nvidia-smi, mem_get_info, or not stated): :attr:`total`.

        Source: c10/cuda/CUDACachingAllocator.cpp (DeviceStats: allocated_bytes, reserved_bytes,
        active_bytes; reserved counts the segments cudaMalloc'ed by the allocator, allocated
        the blocks handed to tensors, so reserved >= allocated).
        """
        if kind in ("allocated", "active"):
            return self.allocated
        if kind == "reserved":
            return max(self.allocated, self.total - outside_allocator)
        if kind in (None, "device"):
            return self.total
        raise ValueError(f"memory kind {kind!r}: one of allocated, active, reserved, device")

    def as_dict(self) -> dict[str, float]:
        """Components by name, in bytes."""
        return {"weights": self.weights, "gradients": self.gradients,
                "optimizer_states": self.optimizer_states, "activations": self.activations,
                "transient": self.transient, "reserved": self.reserved}


def layer_params_per_rank(layer: Layer, tp: int, count_shared: bool = True,
                          ep: int = 1, etp: int | None = None) -> float:
    """Parameter elements of ``layer`` on one rank: TP-sharded linears / tp, routed MoE experts
    / (etp * ep) (``etp``: expert tensor parallelism, None = tp; Megatron-Core splits each
    expert's matrices over the expert-tensor-parallel group and the experts over the
    expert-parallel group: parallel_state.py expert RankGenerator), norms and routers
    replicated."""
    total = layer.num_parameters - (0 if count_shared else layer.shared_parameters)
    sharded = layer.tp_sharded_parameters - (0 if count_shared else layer.shared_parameters)
    experts = layer.expert_parameters
    return (sharded - experts) / tp + experts / ((etp or tp) * ep) + (total - sharded)


def expert_params_per_rank(layer: Layer, tp: int, ep: int, etp: int | None = None) -> float:
    """MoE expert parameter elements of ``layer`` on one rank: / (etp * ep), etp None = tp."""
    return layer.expert_parameters / ((etp or tp) * ep)


def kept_params_per_rank(layer: Layer, tp: int, ep: int) -> float:
    """Parameter elements of ``layer`` one rank holds gathered from forward to backward when
    the layer does not reshard after forward under FSDP (ZeRO-3): all but its MoE experts, which
    are sharded apart and reshard (autopar/runtime/dp.py ``apply_fsdp``)."""
    return layer_params_per_rank(layer, tp, ep=ep) - expert_params_per_rank(layer, tp, ep)


def model_state_bytes(params: float, zero_stage: int, dp: int, weight_bytes: int,
                      grad_bytes: int, optimizer_bytes: int) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes on one rank for ``params`` elements.

    Source: ZeRO (Rajbhandari et al. 2020), section 5; stage 1 shards optimizer states, 2 also
    gradients, 3 also parameters over the data-parallel group of size ``dp``.
    """
    w, g, k = weight_bytes * params, grad_bytes * params, optimizer_bytes * params
    if zero_stage >= 1:
        k /= dp
    if zero_stage >= 2:
        g /= dp
    if zero_stage >= 3:
        w /= dp
    return w, g, k


def block_activation_bytes(layer: Layer, mode: str, *, micro_batch: int, tp: int, cp: int,
                           sequence_parallel: bool) -> float:
    """Bytes one layer keeps for backward per micro-batch under a recompute mode.

    Korthikanti et al. 2022, Table 2: no recompute sbh(10 + 24/t + 5as/(ht)) without SP,
    sbh(34 + 5as/h)/t with SP; selective drops the 5as/h terms; full keeps 2sbh (/t with SP);
    "selective-op" keeps what :func:`op_sac_bytes` counts.
    """
    a = layer.activations
    seq_div = tp if sequence_parallel else 1
    scale = micro_batch / cp
    if mode == "selective-op":
        return op_sac_bytes(layer, micro_batch=micro_batch, tp=tp, cp=cp,
                            sequence_parallel=sequence_parallel)
    if mode == "full":
        return a.layer_input * scale / seq_div
    kept = a.seq / seq_div + a.tp / tp
    if mode == "none":
        kept += a.core / tp
    return kept * scale


#: Bytes per element an RMSNorm run as eager PyTorch ops keeps for backward beyond the fused
#: kernel's saved input (what the graph counts, :class:`autopar.graph.kernels.FusedNormMeta`).
#: The eager composite (Hugging Face LlamaRMSNorm, torchtitan/torchtune RMSNorm, torch's
#: composite ``rms_norm``): ``x.float()`` saves nothing; ``pow(xf, 2)`` saves ``xf`` and
#: ``xf * rsqrt(...)`` saves ``xf`` and the per-row rsqrt (tools/autograd/derivatives.yaml
#: ``pow.Tensor_Scalar: pow_backward(grad, self, exponent)``, ``mul.Tensor: other / self``);
#: ``.type_as(x)`` saves nothing; ``weight * normed`` saves ``normed`` in the input dtype. Saved:
#: the fp32 copy (4) and the normalised tensor (the input dtype's bytes), not the input itself:
#: 4 bytes per element more than the fused kernel's input (2 + 4 - 2 in bf16; 4 + 4 - 4 in fp32).
EAGER_RMSNORM_SAVED_EXTRA_BYTES = 4
#: Activations the graph folds into a fused gated linear unit act(a) * b (recorded as a view at
#: the activation, :class:`autopar.graph.kernels.FusedGLUMeta`); their eager kernels are costed
#: in :mod:`autopar.cost.compute` (``EAGER_GLU_ACT_PASSES``).
GLU_ACTIVATIONS = ("silu", "gelu")


def eager_saved_bytes(layer: Layer, *, fusion: str, eager_parts: tuple[str, ...] = (),
                      dtype_bytes: int, micro_batch: float, tp: int, cp: int,
                      sequence_parallel: bool) -> float:
    """Bytes one layer keeps per micro-batch beyond the graph's fused count when ops the graph
    folds into fused kernels run as eager PyTorch ops (``fusion="eager"``, or ``eager_parts``
    "glu" for a GLU outside it):

    - an RMSNorm: :data:`EAGER_RMSNORM_SAVED_EXTRA_BYTES` per element of its output (sharded
      as the norm runs: by t only with sequence parallelism);
    - a gated linear unit act(a) * b: ``F.silu(a) * b`` keeps act(a) beside ``a`` and ``b``
      (``silu`` saves its input, ``mul`` both operands: derivatives.yaml ``silu: self``,
      ``mul.Tensor``), where the graph's fused GLU (:class:`autopar.graph.kernels.FusedGLUMeta`,
      recorded as a view at the activation) keeps ``a`` and ``b`` only: one more tensor of
      ``a``'s size and dtype, sharded by t.

    A LayerNorm (aten ``native_layer_norm``, one kernel in eager PyTorch) and a non-gated
    activation (the fused kernel saves what the eager op saves) add nothing. Under the eager
    part "tp_replicated_qk_norm" (:mod:`autopar.cost.qk_norm`) the per-head norms run on whole
    heads: what they save (the graph's count and the eager extra) is not sharded by t. Scales
    with ``micro_batch`` (in units of the graph's micro-batch) / cp.
    """
    eager = fusion == "eager"
    glu = eager or "glu" in eager_parts
    seq_div = tp if sequence_parallel else 1
    whole = whole_head_ops(layer, tp, eager_parts)
    extra = 0.0
    if whole:
        names = {layer.ops[i].name for i in whole}
        extra = sum(b - b / tp for name, part, b in layer.saved_by_op
                    if part == "tp" and name in names)
    for i, op in enumerate(layer.ops):
        if eager and op.kind == "norm" and "rmsnorm" in op.target.lower():
            elements = op.bytes_written / dtype_bytes
            extra += EAGER_RMSNORM_SAVED_EXTRA_BYTES * elements / (1 if i in whole else seq_div)
        elif glu and op.kind == "view" and op.target.lower() in GLU_ACTIVATIONS:
            extra += op.bytes_read / tp
    return extra * micro_batch / cp


def kv_repeat_bytes(layer: Layer, *, micro_batch: float, tp: int, cp: int) -> float:
    """Bytes one layer's fused attention keeps per micro-batch beyond the graph's count when K
    and V are repeated to every query head before it
    (:attr:`autopar.frameworks.MemoryConventions.kv_repeat_saved`): the kernel keeps K and V
    at the width of Q, 2 x its bytes, where the graph's native grouped-query kernel keeps the
    kv heads' (what the op reads beside Q): 3 x bytes written - bytes read per attention op
    (its output has Q's shape), 0 for multi-head attention. Sharded by t (heads), scaled by
    ``micro_batch`` (in units of the graph's micro-batch) / cp."""
    extra = 0.0
    for op in layer.ops:
        if op.kind == "attention" and op.fused and op.bytes_written:
            extra += max(0.0, 3.0 * op.bytes_written - op.bytes_read)
    return extra * micro_batch / (tp * cp)


def in_flight(schedule: str, stage: int, pp: int, num_micro_batches: int, virtual: int,
              group: int | None = None) -> float:
    """Micro-batches (times chunks) whose activations pipeline rank ``stage`` holds at its peak,
    in units of "one micro-batch through one chunk" (under DualPipe a stage is two of the
    rank's chunks: 2 x :func:`~autopar.cost.pipeline.orders.dualpipe_stage_peak` for even pp).
    Interleaved 1F1B: Megatron-LM's warm-up ``2 (pp - stage - 1) + (v - 1) N`` plus the one
    in its first steady step, N the micro-batch ``group`` (None = pp; schedules.py
    ``get_pp_rank_microbatches``).

    Raises:
        ValueError: a split-backward schedule that cannot order these counts.
    """
    m = num_micro_batches
    if schedule == "dualpipe" and pp > 1 and pp % 2 == 0:
        # each DualPipe stage is two of the rank's V chunks (autopar.config.V_SCHEDULES)
        return 2.0 * dualpipe_stage_peak(pp, m, stage)
    if schedule in SPLIT_BACKWARD and pp > 1:
        return float(rank_peak_in_flight(schedule, pp, m, virtual, stage))
    if pp == 1:
        return 1.0 * virtual if schedule != "gpipe" else float(m * virtual)
    if schedule == "gpipe":
        return float(m * virtual)
    if schedule == "interleaved-1f1b" and virtual > 1:
        return float(min(m * virtual, (pp - stage - 1) * 2 + (virtual - 1) * (group or pp) + 1))
    return float(min(m, pp - stage))


def op_sac_saved(layer: Layer) -> tuple[int, ...]:
    """Indices of ``layer.ops`` whose outputs torchtitan's op-level selective checkpointing
    keeps: every attention op and every odd-numbered matmul (the 1st, 3rd, ...) of the block,
    routed expert GEMMs neither kept nor counted.

    Source: torchtitan v0.2.2 ``distributed/activation_checkpoint.py`` ``_custom_policy``
    (saves the outputs of the ops in ``models/llama3/infra/parallelize.py``
    ``_op_sac_save_list``: aten.mm, the SDPA kernels, reduce_scatter_tensor, max, "except every
    second mm": ``meta[mm_count] % 2 == 0`` is recomputed); everything else is recomputed.
    A routed expert GEMM (``moe_role == "expert"``) runs as ``torch._grouped_mm``, which no
    save list holds and the mm counter does not count (``models/qwen3|llama4|deepseek_v3/infra/
    parallelize.py`` at torchtitan 1bd2548b1, 2025-12; the shared default list of
    ``distributed/activation_checkpoint.py`` at b5bcd76c6, 2026-08, and torch 2.13's
    ``get_default_op_list().compute_intensive_ops``): it is recomputed and not counted.
    """
    saved, mm = [], 0
    for i, op in enumerate(layer.ops):
        if op.kind == "attention":
            saved.append(i)
        elif op.kind == "matmul" and op.moe_role != "expert":
            mm += 1
            if mm % 2 == 1:
                saved.append(i)
    return tuple(saved)


def op_sac_bytes(layer: Layer, *, micro_batch: float, tp: int, cp: int,
                 sequence_parallel: bool) -> float:
    """Bytes one block keeps per micro-batch under op-level selective checkpointing: its input
    (the checkpoint's argument) plus the outputs :func:`op_sac_saved` names, sharded as the ops
    run: column-parallel matmul and attention outputs by tp, a row-parallel matmul's output as
    the unreduced partial sum (full size), plus its reduce-scatter output (/tp) under sequence
    parallelism (reduce_scatter_tensor is in the save list). A routed expert GEMM's output (top_k
    routed copies of each token) is not reduce-scattered: the MoE module's combined output is,
    once, at the block's hidden size (torchtitan's ``PrepareModuleInputOutput`` on the MoE
    module: Partial -> Shard(1); ``models/*/infra/parallelize.py``), so an MoE block keeps one
    [tokens, hidden] / tp there. Everything scales with ``micro_batch`` (in units of the
    graph's micro-batch) / cp. Attention's fp32 log-sum-exp (1/64 of its output at head dim
    128) is left out.
    """
    seq_div = tp if sequence_parallel else 1
    kept = layer.activations.layer_input / seq_div
    saved = set(op_sac_saved(layer))
    scattered = sequence_parallel and tp > 1
    moe_output = False   # an MoE block's combined output, reduce-scattered once
    for i, op in enumerate(layer.ops):
        if op.tp_role == "row" and scattered:
            if op.moe_role == "expert":
                moe_output = True
            else:
                kept += op.bytes_written / tp
        if i not in saved:
            continue
        if op.kind == "attention" or op.tp_role in ("column", "vocab"):
            kept += op.bytes_written / tp
        elif op.tp_role == "row":
            kept += op.bytes_written
        else:
            kept += op.bytes_written / (tp if op.region == "tp" else seq_div)
    if moe_output:
        kept += layer.activations.layer_input / tp
    return kept * micro_batch / cp


def unfused_score_elements(layer: Layer, *, tokens: float, dtype_bytes: int) -> float:
    """Attention-score elements (b x heads x s_q x s_k) of the layer's unfused attention ops for
    ``tokens`` = b x s_q tokens, 0 when its attention is fused.

    From the SDPA FLOP rule (:func:`autopar.graph.kernels.sdpa_forward_flops`,
    2 b h s_q s_k (d + d_v)) and the output b s_q h d_v, taking d = d_v (true of every preset;
    not of multi-head latent attention).
    """
    n = 0.0
    for op in layer.ops:
        if op.kind != "attention" or op.fused or not op.bytes_written:
            continue
        heads = max(1, layer.attention_heads)
        d_v = op.bytes_written / dtype_bytes / (tokens * heads)
        n += op.fwd_flops / (4.0 * d_v)
    return n


def optimizer_state_bytes_per_param(optimizer: str, master_bytes: int, state_dtype: str,
                                    moment_bytes: int | None = None) -> int:
    """K, the optimizer-state bytes per parameter: a master copy plus the moments.

    Source: Rajbhandari et al. 2020 (ZeRO) section 3.1: mixed-precision Adam keeps an fp32 master
    copy, momentum and variance (K = 4 + 2 x 4 = 12); SGD with momentum one moment (K = 8).
    Moments in bf16 take 2 bytes each (Megatron-LM --exp-avg-dtype / --exp-avg-sq-dtype bf16).
    ``moment_bytes``: bytes per moment element the framework keeps whatever ``state_dtype``
    says (torch optimizers on bf16 parameters: torch/optim/adamw.py ``_init_group``
    ``torch.zeros_like(p)``, 2); None: from ``state_dtype``.
    """
    moments = {"adam": 2, "adamw": 2, "sgd": 1}[optimizer]
    each = moment_bytes if moment_bytes is not None else (2 if state_dtype == "bf16" else 4)
    return master_bytes + moments * each


#: Architectures whose default cuBLAS workspace is 32 MiB in torch
#: (aten/src/ATen/cuda/CublasHandlePool.cpp ``parseChosenWorkspaceSize``: "32MiB for Hopper and
#: Blackwell", ``4096 * 8 * 1024`` for compute capability 9.x, 10.x, 12.x; earlier releases
#: sm90 only, before Blackwell existed).
CUBLAS_32MIB_ARCHITECTURES = CC9_ARCHITECTURES
#: cuBLAS workspaces a training step holds: torch keeps one per thread and stream that issues
#: cuBLAS calls (CublasHandlePool.cpp: a ``thread_local`` workspace map keyed by device and
#: stream, earlier a map keyed by the thread's own handle and stream), and a step issues them from
#: two threads: the Python thread runs forward, the autograd engine's device thread runs
#: backward (torch/csrc/autograd/engine.cpp ``Engine::start_device_threads``: one worker thread
#: per device, which executes the CUDA backward functions).
CUBLAS_WORKSPACES_PER_STEP = 2


def cublas_workspace_bytes(architecture: str) -> float:
    """Bytes of torch's cuBLAS workspaces on one GPU during training, allocated through the
    caching allocator and held for the whole step (so counted by ``memory_allocated`` and
    ``max_memory_reserved``, not outside the allocator): :data:`CUBLAS_WORKSPACES_PER_STEP` x
    the default size, 32 MiB on :data:`CUBLAS_32MIB_ARCHITECTURES`, else ``:4096:2:16:8``
    (2 x 4 MiB + 8 x 16 KiB = 8.125 MiB).

    Source: aten/src/ATen/cuda/CublasHandlePool.cpp: ``getNewWorkspace`` returns
    ``c10::cuda::CUDACachingAllocator::get()->allocate(getChosenWorkspaceSize())``;
    ``parseChosenWorkspaceSize`` gives the defaults above (``CUBLAS_WORKSPACE_CONFIG`` unset).
    The cuBLASLt workspace shares it by default (``unified_cublas_and_lt_workspaces``).
    """
    each = (4096 * 8 * 1024 if architecture in CUBLAS_32MIB_ARCHITECTURES
            else 4096 * 1024 * 2 + 16 * 1024 * 8)
    return float(CUBLAS_WORKSPACES_PER_STEP * each)
