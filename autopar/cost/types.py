"""The cost model's answer: :class:`Estimate`, pure data."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..config import ParallelConfig
from .regime import ErrorBand

#: How MFU and HFU count FLOPs. Model FLOPs are those torch's FlopCounterMode counts for one
#: forward pass of the extracted graph plus the measured backward (2x for GEMMs, 2.5x for
#: attention), with causal attention counted at the half a causal kernel executes (Narayanan et
#: al. 2021 eq. 3 and NeMo count it non-causal, which lets utilisation exceed 100% at long
#: sequences); recomputation is excluded from MFU and included in HFU.
FLOPS_CONVENTION = (
    "model FLOPs = measured forward + backward FLOPs of the graph (FlopCounterMode), causal "
    "attention counted at the executed half; MFU excludes recompute, HFU includes it; "
    "peak = the GPU's dense peak for the training precision"
)

@dataclass(frozen=True)
class Estimate:
    """Predicted cost of one training step under one :class:`ParallelConfig`.

    Attributes:
        config: the configuration, every field resolved.
        step_time_s: seconds per optimizer step.
        mfu: model FLOPs utilisation in [0, 1] (see :data:`FLOPS_CONVENTION`).
        hfu: hardware FLOPs utilisation (recompute included).
        tokens_per_s: training throughput of the whole cluster (tokens/s).
        memory_per_gpu_bytes: peak bytes on the most loaded GPU (bytes).
        memory_limit_bytes: the GPU's memory (bytes).
        fits: ``memory_per_gpu_bytes <= memory_limit_bytes``.
        num_micro_batches: micro-batches per step per pipeline (gradient accumulation steps).
        model_flops_per_step: FLOPs of one step (all GPUs), MFU's numerator times step time.
        time_breakdown: seconds by component: compute, tp_comm, cp_comm, pp_comm, bubble,
            dp_comm_exposed, overlap_slowdown, dp_copies, optimizer, fixed_step (the
            framework profile's ``step_fixed_s``) (they add up to
            step_time_s). ``dp_copies`` is the sharded-DP implementation's memory-bound copies
            on the compute stream (FSDP1's flat-gradient concat, FSDP2's all-gather copy-out
            and reduce-scatter copy-in: ``FrameworkProfile.zero_grad_copy_passes``,
            ``fsdp2_copies``).
            ``overlap_slowdown`` is what the data-parallel collectives the framework runs
            beside compute cost by taking SMs from it (NCCL's thread blocks,
            :mod:`autopar.hardware.nccl`; :func:`autopar.cost.comm.overlapped_comm`), beyond
            ``dp_comm_exposed``, the part no compute hides. Plan files of earlier autopar
            versions have no ``overlap_slowdown`` or ``dp_copies``.
        memory_breakdown: bytes by component on the peak GPU (see MemoryBreakdown).
        stage_memory_bytes: peak bytes of each pipeline rank.
        stage_time_s: seconds per micro-batch (forward + backward) of each pipeline rank.
        comm_bytes_by_link: bytes on the wire per step that one GPU of the slowest pipeline rank
            sends (and, in a ring, receives as much) in its collectives and pipeline sends, by
            link class: each message (nccl-tests size) times the ring's factor, 2(n-1)/n for
            all-reduce, (n-1)/n for all-gather / reduce-scatter / all-to-all, 1 for send/recv
            (:mod:`autopar.cost.comm`; plan files of earlier autopar versions hold message sizes).
        comm_seconds_by_link: seconds of those collectives per step by link class (before overlap).
        peak_stage: index of the pipeline rank with the most memory.
        stage_fwd_s / stage_bwd_s: per pipeline rank, seconds of one micro-batch's forward and
            backward (incl. recompute, TP/CP communication and pipeline sends) over all its chunks.
        stage_wgrad_s: per pipeline rank, the weight-gradient part of ``stage_bwd_s`` (what a
            zero-bubble schedule runs as its separate W pass); empty in older plan files.
        stage_memory_breakdown: per pipeline rank, bytes by component (as memory_breakdown).
        group_links: the bottleneck link class each mesh dimension's groups cross
            (e.g. {"tp": "nvlink", "dp": "infiniband"}), from the rank placement.
        comm_dims_by_link: per link class of ``comm_bytes_by_link``, the mesh dimensions whose
            traffic it carries (a DP group spanning nodes also reduces over NVLink inside each
            node); None in plan files of earlier autopar versions.
        error_band: the expected relative error of ``step_time_s`` for this regime (framework
            x precision x GPU generation x sharding kind), from the published runs' residuals
            (:class:`autopar.cost.regime.ErrorBand`); None when no table is available.
        warnings: plausibility warnings, e.g. an MFU above the best published for this GPU
            generation, framework and precision (:func:`autopar.cost.regime.plausibility_warnings`).
    """

    config: ParallelConfig
    step_time_s: float
    mfu: float
    hfu: float
    tokens_per_s: float
    memory_per_gpu_bytes: float
    memory_limit_bytes: float
    fits: bool
    num_micro_batches: int
    model_flops_per_step: float
    time_breakdown: dict
    memory_breakdown: dict
    stage_memory_bytes: tuple[float, ...]
    stage_time_s: tuple[float, ...]
    comm_bytes_by_link: dict
    comm_seconds_by_link: dict
    peak_stage: int = 0
    group_links: dict = None  # type: ignore[assignment]
    comm_dims_by_link: dict | None = None
    stage_fwd_s: tuple[float, ...] = ()
    stage_bwd_s: tuple[float, ...] = ()
    stage_wgrad_s: tuple[float, ...] = ()
    stage_memory_breakdown: tuple[dict, ...] = ()
    flops_convention: str = FLOPS_CONVENTION
    # -- how far to trust the numbers (issue 13; autopar.cost.regime) ------------------------
    error_band: ErrorBand | None = None
    warnings: tuple[str, ...] = ()

    @property
    def seconds_per_billion_tokens(self) -> float:
        """Wall-clock seconds to train on 1e9 tokens at this throughput."""
        return 1e9 / self.tokens_per_s if self.tokens_per_s > 0 else float("inf")

    def to_dict(self) -> dict:
        """Plain-JSON form."""
        d = asdict(self)
        d["config"] = self.config.to_dict()
        d["stage_memory_bytes"] = list(self.stage_memory_bytes)
        d["stage_time_s"] = list(self.stage_time_s)
        d["stage_fwd_s"] = list(self.stage_fwd_s)
        d["stage_bwd_s"] = list(self.stage_bwd_s)
        d["stage_wgrad_s"] = list(self.stage_wgrad_s)
        d["stage_memory_breakdown"] = list(self.stage_memory_breakdown)
        return d
