"""Calibration constants of the cost model, in one place, each with its source.

Every factor the cost model applies to a datasheet figure lives here, is documented, and can be
overridden (``CostParams(matmul_efficiency=0.7)``) for calibration against one's own measurements.
None is fitted per record of the reference data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from ..config import ATTENTION_KERNELS  # noqa: F401  (re-exported: the kernels attention_efficiency is keyed by)


@dataclass(frozen=True)
class CostParams:
    """Efficiency factors and fixed overheads.

    Attributes:
        matmul_efficiency: fraction of dense peak a large GEMM reaches, per GPU architecture
            (:attr:`autopar.hardware.Device.architecture`). Sources (docs/reference/
            hardware_and_formulas.md, "Measured single-GPU ceilings"): Ampere, Azure's A100-80GB
            FP16 GEMM at 16k^3 = 256.5 TFLOP/s = 82% of 312; Hopper, Azure's H200 GEMM at
            1366 TFLOP/s = 69% of the 1979 FP8 peak (the same GH100 tensor cores as H100/H800).
            BF16 agrees: bf16 GEMMs of 4096 and more in every dimension measured on one H200
            reach 0.61-0.73 of the 989 TFLOP/s peak, median 0.70, and FP8 ones 0.59-0.68 of 1979
            (``benchmarks/data/gpu/h200_sweep.json``; ``tests/test_gpu_data.py``).
            Blackwell and AMD CDNA 3/4 (no measurement of ours): the lowest best-shape BF16
            figure of their parts in the ml-engineering MAMF table (compute/accelerator/
            README.md, "Maximum Achievable Matmul FLOPS comparison table", 2025-26 rows; an upper
            bound, as H100's 0.803 there is above the 0.69 measured): Blackwell GB200 1822.0 of
            2500 = 0.729 (B200 0.776, B300 0.786); CDNA 3 MI300X 668.4 of 1300 = 0.514 (MI325X
            0.604); CDNA 4 MI355X 1565.0 TFLOP/s of its 2516.6 dense peak = 0.622 (the table
            divides by 2300, the MI350X's). Unvalidated: no training run on these parts is in
            the corpus. Other architectures without a measurement use the Ampere figure.
            Public cross-checks
            (docs/reference/hardware_and_formulas.md, "Public matmul ceilings";
            ``tests/test_issue25_compute.py``): Horace He (thonking.ai, 2024) measured cuBLAS
            8192^3 on an A100 at 257 TFLOP/s with random inputs (0.82, power-limited: zeros ran
            at 295); Stas Bekman's ml-engineering MAMF table (best shape of a search, an upper
            bound) gives A100 SXM 0.859, H100 SXM 0.801, GH200 0.830 of the BF16 peak. Clocks
            under the power cap are inside these measured figures (no further clock factor;
            ``Device.clock_scale`` applies only to a limit set below the TDP); no public figure
            supports a lower ceiling.
        matmul_half_size: GEMM dimension (elements) at which a dimension's efficiency factor is
            one half of the large-size value: f(x) = x / (x + half); a scalar for every
            architecture, or a mapping per architecture (``half_size``; Ampere's, else 128, for
            one it lacks). Small and skinny GEMMs fill fewer tensor-core tiles; 128 is one CTA
            tile of cuBLAS's large kernels (assumption). Against public and measured figures
            (docs/reference/hardware_and_formulas.md, "Public matmul ceilings";
            ``tests/test_issue25_compute.py``): on Ampere no per-shape sweep was found (at the
            two A100 MAMF best shapes, 128 predicts 10% and 13% below the best of a search, an
            upper bound); on Hopper the H200 sweep's bf16 GEMMs that are not launch-bound (50
            over 30 us) do not lose efficiency with the dimension: their least-squares half-size
            is 0 (rms 0.036 against 0.079 for 128; 128 predicts the training-shaped ones 5.6%
            slow on average). That fit is not the default: on the development split it moves
            Hopper's bias from -9.6% to -11.8% (macro -16.4% to -17.2%), i.e. the Hopper runs'
            missing time is elsewhere, and a GEMM rate nearer the microbenchmark only widens
            the gap until that is modelled (``CostParams(matmul_half_size={"ampere": 128.0,
            "hopper": 0.0})`` applies it).
        attention_efficiency: fraction of the BF16 dense peak a fused attention kernel reaches on
            its executed (causal) work, per ``"kernel/architecture"`` (kernels:
            :data:`ATTENTION_KERNELS`). Sources: Dao 2023 (FlashAttention-2, arXiv 2307.08691):
            FlashAttention-1 reaches 25-40% of A100 peak, FlashAttention-2 50-73% (0.30 and 0.60
            taken, inside each range); Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608):
            FlashAttention-2 reaches 35% of H100 peak, FlashAttention-3 up to 75% forward with a
            slower backward (0.60 taken for forward and backward together). Hopper FA2 and cuDNN
            (the fused attention Transformer Engine runs) are measured on one H200 at head dim
            128, sequence -> infinity (``attention_shape``'s fit): 0.34 and 0.58 of the BF16
            peak forward+backward (``benchmarks/data/gpu/h200_sweep.json``). A kernel without a
            figure for an architecture falls back to its own Ampere figure, then to
            ``"fa2/<architecture>"``, then to ``"fa2/ampere"``. Efficiency is against the BF16
            peak also in FP8 runs (attention stays BF16). ``fa1/hopper`` has no measurement: an
            Ampere-era kernel (mma.sync, no TMA/wgmma) keeps its speed relative to
            FlashAttention-2 on Hopper, so it is taken as fa2/hopper x fa1/ampere / fa2/ampere =
            0.34 x 0.30 / 0.60 = 0.17 (derived, not fitted).
            ``efficient`` is SDPA's memory-efficient backend (the xFormers CUTLASS kernel), the
            one that runs when an explicit mask is passed: measured on one H200 at 0.145 of the
            BF16 peak forward+backward (head dim 128, sequence 8k-32k,
            ``benchmarks/data/gpu/h200_sweep.json``); on Ampere, unmeasured, taken as fa1's
            0.30 (an mma.sync kernel of the same generation; assumption).
        attention_shape: per kernel, ``(head_dim_half, seq_half)``: how a fused attention
            kernel's efficiency falls at small head dims and short sequences,
            ``f = (128 + k) / 128 * d / (d + k) * L / (L + s_half)`` for head dim ``d`` and ``L``
            keys per query block (the sequence, or the window, per context-parallel rank).
            Mechanism: a tile's softmax work (exponentials on the SFU) does not shrink with the
            head dim while its matmul work does, and every query block pays a fixed prologue and
            epilogue (loading Q, rescaling and writing O and the log-sum-exp) amortised over the
            keys it visits, with half-wasted diagonal tiles under a causal mask. Values: least
            squares over the forward+backward times measured on one H200
            (``benchmarks/data/gpu/h200_sweep.json``: 21 shapes per kernel, head dims 64/128,
            sequences 512-32768; max error 1.7% for FA2, 5% for cuDNN): ``fa2`` (21, 740),
            ``cudnn`` (53, 620). Unmeasured kernels borrow the nearest design: ``fa1`` takes
            FA2's, ``fa3`` cuDNN's (both Hopper warp-specialised kernels; assumption),
            ``efficient`` FA2's (its H200 efficiency at s=512 is 0.53 of its long-sequence one,
            FA2's shape gives 0.41). The
            ``attention_efficiency`` figures are at head dim 128 and long sequences, where
            ``f`` -> 1. A calibrated scalar ``attention_efficiency`` (``autopar calibrate``,
            measured at the planned shape) is used as is.
        attention_backward_efficiency: a fused kernel's backward efficiency relative to its
            forward's (the figures above are for forward and backward together). Measured on
            one H200: 0.88 for both FA2 and cuDNN at head dim 128 (forward 0.37 / 0.64 of peak,
            backward 0.33 / 0.56; ``benchmarks/data/gpu``); Shah et al. 2024 also report a
            slower backward.
        causal_attention_work: fraction of the counted (non-causal) attention FLOPs a causal
            kernel executes: 0.5 (the upper triangle is skipped).
        hbm_efficiency: fraction of HBM bandwidth memory-bound kernels reach. Source: STREAM
            1.6-1.75 TB/s of 2.039 on A100-80GB (reference file) -> 0.82.
        kernel_launch_s: floor per memory-bound kernel (launch + tail), 5 us (typical CUDA launch
            latency; assumption).
        host_op_s: host seconds to issue one kernel when the host issues them one by one
            (:attr:`autopar.frameworks.FrameworkProfile.host_issue` ``per_kernel``; costed by
            :mod:`autopar.cost.host`): Python, the PyTorch dispatcher and ``cudaLaunchKernel``.
            Measured on one H200 (torch 2.11, CUDA 13.0, ``benchmarks/data/gpu/h200_sweep.json``
            ``memory_bound`` row "tiny kernel (launch)": back-to-back ``x.add_(1.0)`` on a
            one-element tensor, CUDA events, 200 calls): 8.13 us per op, GPU work nil, so the
            host's issue rate alone. A lower bound for a model's op (no autograd recording, no
            module hooks); the host CPU of that machine, not the training clusters'.
        grad_bytes: bytes per gradient element (2: bf16 gradients and reduction, as NeMo's
            distributed optimizer does; set 4 for fp32 main grads as Megatron's default DDP).
        (The optimizer step's bytes per parameter depend on the optimizer's implementation,
        not on the GPU: :attr:`autopar.frameworks.FrameworkProfile.optimizer_step_bytes`.)
        dp_overlap: fraction of a compute window that can hide the tensor-parallel collectives
            Transformer Engine overlaps with GEMMs (``tp_comm_overlap``) and ring-attention
            transfers: those kernels take SMs and HBM bandwidth from the compute they overlap.
            0.8 is an assumption to be calibrated by measurement. (Data-parallel collectives
            no longer use it: their cost beside compute is the slowdown of the SMs NCCL holds,
            :func:`autopar.cost.comm.overlapped_comm`, with the whole window.)
        reserved_bytes: memory per GPU outside the framework's allocator: CUDA context, NCCL
            buffers and library handles (assumption: 2e9 bytes; the CUDA context alone measured
            0.55e9 on an H200 with torch 2.11: total_memory - mem_get_info free after init).
            torch's cuBLAS workspaces are not here: they come from the caching allocator
            (:func:`autopar.cost.memory.cublas_workspace_bytes`).
        fragmentation: memory the caching allocator reserves beyond the allocated peak, as a
            fraction of that peak: 0.05 (measured on one H200, ten plan.apply runs,
            benchmarks/data/gpu/h200_sweep.json: max_memory_reserved / max_memory_allocated
            - 1 from 0.035 to 0.076, mean 0.047).
    """

    matmul_efficiency: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({"ampere": 0.82, "hopper": 0.69,
                                                  "blackwell": 0.729, "cdna3": 0.514,
                                                  "cdna4": 0.622}))
    matmul_half_size: float | Mapping[str, float] = 128.0
    attention_efficiency: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({
            "fa1/ampere": 0.30, "fa2/ampere": 0.60, "cudnn/ampere": 0.60,
            "fa1/hopper": 0.17, "fa2/hopper": 0.34, "fa3/hopper": 0.60, "cudnn/hopper": 0.58,
            "efficient/ampere": 0.30, "efficient/hopper": 0.145}))
    attention_shape: Mapping[str, tuple[float, float]] = field(
        default_factory=lambda: MappingProxyType({
            "fa1": (21.0, 740.0), "fa2": (21.0, 740.0), "cudnn": (53.0, 620.0),
            "fa3": (53.0, 620.0), "efficient": (21.0, 740.0)}))
    attention_backward_efficiency: float = 0.88
    causal_attention_work: float = 0.5
    hbm_efficiency: float = 0.82
    kernel_launch_s: float = 5e-6
    host_op_s: float = 8.13e-6
    grad_bytes: int = 2
    dp_overlap: float = 0.8
    reserved_bytes: float = 2e9
    fragmentation: float = 0.05

    def __hash__(self) -> int:
        half = self.matmul_half_size
        return hash((tuple(sorted(self.matmul_efficiency.items())),
                     tuple(sorted(self.attention_efficiency.items())),
                     half if isinstance(half, (int, float)) else tuple(sorted(half.items()))))

    def attention_ceiling(self, kernel: str, architecture: str) -> float:
        """Fraction of the BF16 peak the fused attention ``kernel`` reaches on ``architecture``
        (fallbacks in the class docstring)."""
        eff = self.attention_efficiency
        if isinstance(eff, (int, float)):
            return float(eff)
        for key in (f"{kernel}/{architecture}", f"{kernel}/ampere", f"fa2/{architecture}",
                    "fa2/ampere"):
            if key in eff:
                return eff[key]
        raise ValueError(f"no attention efficiency for {kernel}/{architecture} nor fa2/ampere")

    def attention_shape_factor(self, kernel: str, head_dim: float, keys: float) -> float:
        """Efficiency factor of a fused ``kernel`` at ``head_dim`` and ``keys`` per query block,
        relative to head dim 128 and long sequences (``attention_shape``); 1.0 when the
        efficiency is a calibrated scalar or a size is unknown (0)."""
        if isinstance(self.attention_efficiency, (int, float)) or head_dim <= 0 or keys <= 0:
            return 1.0
        k, s_half = self.attention_shape.get(kernel, self.attention_shape.get("fa2", (0, 0)))
        return (128.0 + k) / 128.0 * head_dim / (head_dim + k) * keys / (keys + s_half)

    def matmul_ceiling(self, architecture: str) -> float:
        """Large-GEMM efficiency of an architecture (the Ampere figure when unmeasured)."""
        eff = self.matmul_efficiency
        if isinstance(eff, (int, float)):
            return float(eff)
        return eff.get(architecture, eff.get("ampere", 0.82))

    def half_size(self, architecture: str) -> float:
        """:attr:`matmul_half_size` of an architecture (Ampere's when it has none; a scalar
        override applies to all)."""
        half = self.matmul_half_size
        if isinstance(half, (int, float)):
            return float(half)
        return half.get(architecture, half.get("ampere", 128.0))

    def gemm_efficiency(self, m: float, k: float, n: float, architecture: str = "ampere") -> float:
        """Fraction of peak a GEMM of (m x k) @ (k x n) reaches (dimensionless, in (0, 1))."""
        h = self.half_size(architecture)
        f = 1.0
        for x in (m, k, n):
            f *= x / (x + h) if x > 0 else 0.0
        # normalise so that a 16k^3 GEMM (the measured ceiling) gets matmul_efficiency
        ref = (16384 / (16384 + h)) ** 3
        return self.matmul_ceiling(architecture) * f / ref

    def usable_memory(self, memory_bytes: float) -> float:
        """Bytes the model may allocate on a GPU of ``memory_bytes``: what is left after
        :attr:`reserved_bytes`, less the allocator's :attr:`fragmentation` of it
        ((m - reserved) / (1 + fragmentation))."""
        return max(0.0, (memory_bytes - self.reserved_bytes) / (1.0 + self.fragmentation))



#: Weights bytes per parameter and optimizer-state bytes K per parameter (Rajbhandari et al.
#: 2020, ZeRO, section 3.1: mixed-precision Adam keeps fp32 master weights, momentum, variance:
#: K = 12). SGD with momentum keeps an fp32 master copy and momentum: K = 8.
OPTIMIZER_STATE_BYTES = {"adam": 12, "adamw": 12, "sgd": 8}
