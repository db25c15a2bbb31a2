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
Megatron-LM's warm-up count); GPipe: all m.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.types import Layer


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU (one pipeline rank) at its peak.

    Attributes:
        weights, gradients, optimizer_states: model states.
        activations: saved activations of all micro-batches in flight.
        transient: working memory of the layer being computed (its full activations when it is
            recomputed, gathered ZeRO-3 parameters).
        reserved: context, workspaces and fragmentation the allocator cannot use (from
            :class:`~autopar.cost.params.CostParams`).
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

    def as_dict(self) -> dict[str, float]:
        """Components by name, in bytes."""
        return {"weights": self.weights, "gradients": self.gradients,
                "optimizer_states": self.optimizer_states, "activations": self.activations,
                "transient": self.transient, "reserved": self.reserved}


def layer_params_per_rank(layer: Layer, tp: int, count_shared: bool = True,
                          ep: int = 1) -> float:
    """Parameter elements of ``layer`` on one rank: TP-sharded linears / tp (MoE experts
    / (tp * ep): expert tensor parallelism equals tp), norms and routers replicated."""
    total = layer.num_parameters - (0 if count_shared else layer.shared_parameters)
    sharded = layer.tp_sharded_parameters - (0 if count_shared else layer.shared_parameters)
    experts = layer.expert_parameters
    return (sharded - experts) / tp + experts / (tp * ep) + (total - sharded)


def expert_params_per_rank(layer: Layer, tp: int, ep: int) -> float:
    """MoE expert parameter elements of ``layer`` on one rank."""
    return layer.expert_parameters / (tp * ep)


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
    sbh(34 + 5as/h)/t with SP; selective drops the 5as/h terms; full keeps 2sbh (/t with SP).
    """
    a = layer.activations
    seq_div = tp if sequence_parallel else 1
    scale = micro_batch / cp
    if mode == "full":
        return a.layer_input * scale / seq_div
    kept = a.seq / seq_div + a.tp / tp
    if mode == "none":
        kept += a.core / tp
    return kept * scale


def in_flight(schedule: str, stage: int, pp: int, num_micro_batches: int, virtual: int) -> float:
    """Micro-batches (times chunks) whose activations pipeline rank ``stage`` holds at its peak,
    in units of "one micro-batch through one chunk"."""
    m = num_micro_batches
    if pp == 1:
        return 1.0 * virtual if schedule != "gpipe" else float(m * virtual)
    if schedule == "gpipe":
        return float(m * virtual)
    if schedule == "interleaved-1f1b" and virtual > 1:
        return float(min(m * virtual, (pp - stage - 1) * 2 + (virtual - 1) * pp + 1))
    return float(min(m, pp - stage))
