"""What every part of the cost model reads: the graph, cluster, training config, constants and
framework profile of one :class:`~autopar.cost.model.CostModel`, with the rates derived from
them once (:class:`CostInputs`); and the check that the graph was measured at the training
sequence length."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import TrainingConfig
from ..errors import InvalidTrainingConfig
from ..frameworks import FrameworkProfile
from ..frameworks.memory import MemoryConventions
from ..graph.types import ModelGraph
from . import offload
from .params import CostParams

#: Fused attention kernels an architecture cannot run: FlashAttention-1 needs Turing or Ampere
#: and FlashAttention-2 Ampere, Ada or Hopper (Dao-AILab/flash-attention README); PyTorch SDPA's
#: flash backend refuses below sm80 ("Flash attention only supports gpu architectures in the
#: range [sm80, sm121]", aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
#: check_flash_attention_hardware_support) and its cuDNN backend has the same floor;
#: FlashAttention-3 is Hopper's (wgmma, TMA). The memory-efficient backend runs from sm50.
KERNELS_NOT_ON: dict[str, tuple[str, ...]] = {"volta": ("fa1", "fa2", "fa3", "cudnn")}


def runnable_kernel(kernel: str, architecture: str) -> str:
    """``kernel``, or ``"efficient"`` (SDPA's memory-efficient backend, what
    ``F.scaled_dot_product_attention`` dispatches to there) where ``architecture`` cannot run
    it (:data:`KERNELS_NOT_ON`)."""
    return "efficient" if kernel in KERNELS_NOT_ON.get(architecture, ()) else kernel


@dataclass(frozen=True, eq=False)
class CostInputs:
    """The inputs of one cost model and what follows from them alone.

    Attributes:
        graph, cluster, train, params, profile, conventions: as given to the cost model (the
            profile and conventions resolved from ``train.framework`` where not given; ``train``
            with ``optimizer_offload`` set where the framework's parameter offload implies it,
            :func:`autopar.cost.offload.effective`).
        attention_kernel: the fused attention kernel priced.
        peak: the GPU's dense FLOP/s at the training precision, times its clock scale (a power
            cap lowers the sustained tensor-core clock: ``Device.clock_scale``).
        compute_peak: FLOP/s of the work that stays in BF16 under FP8 training (Transformer
            Engine and torchao run only the Linear GEMMs in FP8); ``peak`` otherwise.
        hbm_Bps: bytes/s memory-bound kernels move through HBM (``CostParams.hbm_efficiency``
            of the datasheet bandwidth).
        reduce_bytes: bytes per gradient element in the data-parallel reduction (the
            profile's dtype, else ``CostParams.grad_bytes``).
        blocks: graph indices of the decoder blocks, in model order.
    """

    graph: ModelGraph
    cluster: object
    train: TrainingConfig
    params: CostParams
    profile: FrameworkProfile
    conventions: MemoryConventions
    attention_kernel: str
    peak: float
    compute_peak: float
    hbm_Bps: float
    reduce_bytes: float
    blocks: tuple[int, ...]

    @property
    def device(self):
        """The cluster's :class:`~autopar.hardware.Device`."""
        return self.cluster.device

    @property
    def kernel_host_s(self) -> float:
        """Host seconds to issue one counted kernel of a layer (:mod:`autopar.cost.host`): the
        stack's own rate (:attr:`~autopar.frameworks.FrameworkProfile.host_op_s_published`: its
        module code per kernel, from published step times) where it exceeds the measured
        dispatch rate :attr:`~autopar.cost.params.CostParams.host_op_s`, else that rate."""
        return max(self.params.host_op_s, self.profile.host_op_s_published)

    @classmethod
    def build(cls, graph: ModelGraph, cluster, train: TrainingConfig,
              params: CostParams | None, attention_kernel: str | None,
              profile: FrameworkProfile, conventions: MemoryConventions | None) -> "CostInputs":
        """The inputs with defaults filled in (see :class:`~autopar.cost.model.CostModel`)."""
        params = params or CostParams()
        # FSDP's parameter offload moves the optimizer step to the CPU too (autopar.cost.offload)
        train = offload.effective(train)
        device = cluster.device
        arch = getattr(device, "architecture", "ampere")
        peak = device.peak(train.precision) * device.clock_scale
        return cls(
            graph=graph, cluster=cluster, train=train, params=params, profile=profile,
            conventions=conventions or profile.memory,
            attention_kernel=attention_kernel or runnable_kernel(profile.attention_kernel(arch),
                                                                 arch),
            peak=peak,
            compute_peak=(device.peak("bf16") * device.clock_scale
                          if train.precision == "fp8" else peak),
            hbm_Bps=device.hbm_bandwidth_Bps * params.hbm_efficiency,
            reduce_bytes=(train.dtype_bytes if train.precision == "fp16"
                          and profile.grad_reduce_fp16_in_fp16 else
                          profile.grad_reduce_bytes or params.grad_bytes),
            blocks=tuple(layer.index for layer in graph.layers if layer.kind == "block"))

    def micro_batches(self, c) -> int:
        """Micro-batches per step per pipeline of config ``c``."""
        return self.train.global_batch_size // (c.dp * c.micro_batch_size)


def check_seq_len(graph: ModelGraph, train: TrainingConfig) -> None:
    """Refuse a graph measured at another sequence length than the one trained: its FLOPs,
    activation bytes and attention spans are those of ``graph.seq_len`` tokens, so pricing it
    for ``train.seq_len`` would be off by up to the ratio (a 512-token graph priced for 2,048
    tokens gave MFU 0.0016 instead of 0.0136).

    Raises:
        InvalidTrainingConfig: the two lengths differ (the message names both and the fix).
    """
    if graph.seq_len != train.seq_len:
        raise InvalidTrainingConfig(
            f"the model graph {graph.name!r} was extracted at seq_len={graph.seq_len} tokens but "
            f"the training config has seq_len={train.seq_len}; the cost model prices the graph's "
            "measured FLOPs and activations, which depend on the sequence length. Fix: "
            f"re-extract the graph at the training length (autopar.graph.extract(model, "
            f"{train.seq_len})), or set TrainingConfig(seq_len={graph.seq_len}).")
