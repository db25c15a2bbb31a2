"""Host time to issue a layer's kernels: the fixed cost that does not shrink with the work.

Mechanism. PyTorch runs a training step by having the host (Python, the dispatcher, then
``cudaLaunchKernel``) enqueue one kernel after another on the stream; the GPU runs them
asynchronously. When a kernel's GPU time is shorter than the host's time to issue the next one,
the queue drains and the GPU waits: the step is host-bound. Over one micro-batch's forward (or
backward) on one rank the stream therefore takes ``max(GPU seconds, kernels x host seconds per
op)`` (the host runs ahead while the GPU is the slower one, so only the excess is exposed).
:func:`autopar.cost.pipeline.timing.PipelineTimer.timing` charges that excess per rank, per
micro-batch and pass; the time breakdown shows it as ``host_exposed``.

Kernels are counted from the graph autopar extracts, per op as the fusion level launches them
(:func:`kernels`):

- a matmul: one GEMM forward; two backward (input and weight gradients, or both inputs' of a
  batched matmul: torch/csrc/autograd derivatives.yaml ``mm``: ``self: mm_mat1_backward``,
  ``mat2: mm_mat2_backward``);
- a fused attention: one kernel forward; three backward (FlashAttention-2,
  csrc/flash_attn/src/flash_bwd_launch_template.h ``run_flash_bwd_seqk_parallel``: the
  ``flash_bwd_dot_do_o_kernel`` pre-pass, ``flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel`` and
  ``flash_bwd_convert_dq_kernel``); unfused attention: the :data:`UNFUSED_ATTENTION_KERNELS`
  ops of autopar's own ring attention forward, twice as many backward;
- memory-bound ops: the kernels :func:`autopar.cost.compute.memory_bound_kernels` counts for
  the fusion level (eager: one per op, eight for an eager RMSNorm, the GLU activation apart;
  compile: one per TorchInductor chain; fused: one per fused op), and one backward kernel per
  forward kernel (each element-wise op's derivative, derivatives.yaml: a lower bound, an eager
  RMSNorm's backward launches more);
- recomputation re-issues what it repeats: the whole forward (full), the attention kernel
  (selective), the ops op-level SAC does not save (selective-op).

Not counted (so the host time is a lower bound): collectives' launches, FP8 cast and amax
kernels, the optimizer step and gradient clipping (each ``torch._foreach_*`` call launches one
multi-tensor-apply kernel per batch of at most 110 tensors (one list) to 36 (four lists: fused
Adam's params, grads, exp_avg, exp_avg_sq) and 320 blocks of 65,536-element chunks: torch
aten/src/ATen/native/cuda/MultiTensorApply.cuh
``depth_to_max_tensors = {110, 64, 48, 36, 30}``, ``depth_to_max_blocks``, ``kChunkSize``, on its
4 KB kernel-argument path; apex's multi_tensor_apply.cuh has the same limits. A launch covers up
to 320 x 65,536 = 21 M elements, so the step's HBM time dominates its issue time except on a
few million parameters per rank), autograd's accumulate-grad and module-hook work.

Host seconds per kernel: :attr:`autopar.cost.context.CostInputs.kernel_host_s`, the measured
dispatch rate :attr:`autopar.cost.params.CostParams.host_op_s`, or a stack's own per-kernel rate
where it is larger (:attr:`autopar.frameworks.FrameworkProfile.host_op_s_published`:
Megatron-Core and Transformer Engine's module code, inverted from host-bound published runs by
``benchmarks/host_rate.py``; docs/cost-model.md, Host issue time).
Under ``host_issue="cuda_graph"`` (:data:`autopar.frameworks.profiles.HOST_ISSUES`) a captured
step replays its kernels with one launch per graph: no per-kernel host time is charged.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.types import Layer
from .compute import memory_bound_kernels
from .memory import op_sac_saved
from .params import CostParams

#: Backward kernels of one fused attention call (FlashAttention-2's dot(dO, O) pre-pass, the
#: dQ/dK/dV kernel and the dQ conversion; module docstring).
FUSED_ATTENTION_BWD_KERNELS = 3
#: Forward kernels of an unfused attention (autopar/runtime/cp.py ``_ring``): q k^T, scale,
#: masked_fill, logsumexp, subtract, exp, p @ v.
UNFUSED_ATTENTION_KERNELS = 7


@dataclass(frozen=True)
class LayerKernels:
    """Kernels one layer launches per micro-batch on one rank.

    Attributes:
        fwd: forward kernels.
        bwd: backward kernels (no recomputation).
        recompute: kernels the recompute mode re-issues in backward.
    """

    fwd: int
    bwd: int
    recompute: int = 0


@dataclass(frozen=True)
class HostTime:
    """Host seconds to issue one layer's kernels for one micro-batch on one rank.

    Attributes:
        kernels: the kernel counts (:class:`LayerKernels`).
        fwd_s: forward issue seconds.
        bwd_s: backward issue seconds, recomputation included.
    """

    kernels: LayerKernels
    fwd_s: float
    bwd_s: float


def kernels(layer: Layer, fusion: str, eager_parts: tuple[str, ...] = (),
            mode: str = "none", recompute_ops: tuple[int, ...] | None = None) -> LayerKernels:
    """The kernels ``layer`` launches per micro-batch under ``fusion`` and recompute ``mode``
    (counting rules in the module docstring); ``recompute_ops``: under "selective", the ops
    of Megatron-Core modules other than the attention core that are recomputed
    (:func:`autopar.cost.selective.module_recompute`), each memory-bound one a kernel."""
    fwd = bwd = 0
    attention_fwd = 0
    for op in layer.ops:
        if op.kind == "matmul":
            fwd += 1
            bwd += 2
        elif op.kind == "attention":
            if op.fused:
                fwd += 1
                attention_fwd += 1
                bwd += FUSED_ATTENTION_BWD_KERNELS
            else:
                fwd += UNFUSED_ATTENTION_KERNELS
                attention_fwd += UNFUSED_ATTENTION_KERNELS
                bwd += 2 * UNFUSED_ATTENTION_KERNELS
    for _op, _nbytes, n, _bwd_bytes, _rep in memory_bound_kernels(layer, fusion, eager_parts):
        fwd += n
        bwd += n
    recompute = 0
    if layer.kind == "block":
        if mode == "full":
            recompute = fwd
        elif mode == "selective" and recompute_ops is not None:
            recompute = sum(_fwd_kernels(layer.ops[i]) for i in recompute_ops
                            if layer.ops[i].kind != "view")
        elif mode == "selective":
            recompute = attention_fwd
        elif mode == "selective-op":
            # the saved ops' forward kernels are not launched again (an unfused attention is
            # several kernels, not one)
            recompute = fwd - sum(_fwd_kernels(layer.ops[i]) for i in op_sac_saved(layer))
    return LayerKernels(fwd, bwd, recompute)


def _fwd_kernels(op) -> int:
    """Forward kernels of one matmul or attention op (as :func:`kernels` counts them)."""
    if op.kind == "attention" and not op.fused:
        return UNFUSED_ATTENTION_KERNELS
    return 1


def host_time(layer: Layer, *, fusion: str, eager_parts: tuple[str, ...] = (),
              mode: str = "none", host_issue: str = "per_kernel",
              host_op_s: float = CostParams.host_op_s,
              recompute_ops: tuple[int, ...] | None = None) -> HostTime:
    """Host seconds to issue ``layer``'s kernels for one micro-batch (:class:`HostTime`):
    the kernel count times ``host_op_s`` seconds per kernel (default: the measured
    :attr:`autopar.cost.params.CostParams.host_op_s`); zero seconds under
    ``host_issue="cuda_graph"``; ``recompute_ops`` as :func:`kernels`."""
    k = kernels(layer, fusion, eager_parts, mode, recompute_ops)
    per = host_op_s if host_issue == "per_kernel" else 0.0
    return HostTime(k, k.fwd * per, (k.bwd + k.recompute) * per)


def cached_host_time(memo: dict, layer: Layer, profile, host_op_s: float, mode: str,
                     recompute_ops: tuple[int, ...] | None) -> HostTime:
    """:func:`host_time` of ``layer`` under ``profile``'s fusion, eager parts and host issue,
    kept in ``memo`` by (signature, mode, ``recompute_ops``): the kernel counts read the layer's
    ops and the profile only, not the sharding."""
    key = (layer.signature, mode, recompute_ops)
    got = memo.get(key)
    if got is None:
        got = memo[key] = host_time(
            layer, fusion=profile.fusion, eager_parts=profile.eager_parts, mode=mode,
            host_issue=profile.host_issue, host_op_s=host_op_s, recompute_ops=recompute_ops)
    return got


def host_exposed_s(gpu_s: float, host_s: float) -> float:
    """Seconds the host adds to a pass whose stream work takes ``gpu_s``: what its issue time
    ``host_s`` exceeds it by (the host runs ahead of a slower GPU; module docstring)."""
    return max(0.0, host_s - gpu_s)
