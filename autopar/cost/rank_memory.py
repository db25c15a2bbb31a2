"""Memory per pipeline rank at its peak: model states, activations in flight, transient and
reserved bytes (:class:`RankMemory`, from :func:`rank_memory`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ParallelConfig
from ..frozen import built
from .blocks import BlockCosts
from .context import CostInputs
from .dispatch import deepep_buffer_bytes
from .memory import MemoryBreakdown, cublas_workspace_bytes
from .pipeline.timing import PipelineTiming
from .states import ModelStates


@dataclass(frozen=True)
class RankMemory:
    """Bytes per pipeline rank (rank order).

    Attributes:
        breakdowns: each rank's :class:`MemoryBreakdown` (what it reports, reserved included).
        allocated: bytes each rank needs to run (what decides whether the plan fits): the
            breakdown less the blocks the optimizer step freed and cannot reuse, which the
            allocator releases before it fails.
    """

    breakdowns: tuple[MemoryBreakdown, ...]
    allocated: tuple[float, ...]

    @property
    def totals(self) -> tuple[float, ...]:
        """Peak bytes of each rank."""
        return tuple(b.total for b in self.breakdowns)


def _breakdown(weights: float, gradients: float, optimizer_states: float, activations: float,
               transient: float, reserved: float) -> MemoryBreakdown:
    """``MemoryBreakdown(...)``, built at once (:func:`autopar.frozen.built`): a hot path."""
    return built(MemoryBreakdown, weights=weights, gradients=gradients,
                 optimizer_states=optimizer_states, activations=activations, transient=transient,
                 reserved=reserved)


def rank_memory(inputs: CostInputs, c: ParallelConfig, layout: tuple, timing: PipelineTiming,
                keep: tuple[float, ...], blocks: BlockCosts, states: ModelStates) -> RankMemory:
    """The :class:`RankMemory` of the resolved config ``c`` whose ranks hold ``layout``
    (:class:`~autopar.cost.layout.StageLayout`) and run ``timing``; ``keep``: per rank, the
    parameter elements kept gathered forward to backward."""
    p, wbytes, device = inputs.params, inputs.train.dtype_bytes, inputs.device
    workspace = cublas_workspace_bytes(device.architecture)
    # DeepEP's NVLink buffer, workspace and (across nodes) NVSHMEM heap with its RDMA buffer,
    # allocated once per process over the expert-TP x EP group (Megatron-Core fused_a2a.py
    # get_buffer; every rank charged, MoE layers or not)
    moe_buffers = (deepep_buffer_bytes(c.etp * c.ep, inputs.graph.hidden_size)
                   if c.dispatcher == "deepep" and c.ep > 1 and inputs.graph.num_experts else 0)
    stage_mem: list[MemoryBreakdown] = []
    alloc_totals: list[float] = []
    for rank, st in enumerate(layout):
        w, gr, o = st.states
        w += keep[rank] * wbytes   # kept blocks' gathered parameters, forward to backward
        act = timing.stage_act[rank] * st.flight + sum(
            blocks.block_cost(li, "none", c).act_bytes * (f - st.flight)
            for li, f in st.edge_flight)
        # the step runs after backward has freed the activations: its temporaries count
        # only where they exceed them
        step_extra = states.optimizer_step_bytes(c, st.params) - act
        # a ZeRO optimizer's gradient bucket buffers, allocated before backward
        # (MemoryConventions.grad_bucket_elements: DeepSpeed's reduce_bucket_size buffer):
        # ZeRO-1/2 release them at the backward epilogue (stage_1_and_2.py
        # _release_ipg_buffers), ZeRO-3 keeps its one through the step (stage3.py
        # _setup_for_real_optimizer; freed only by offload_states)
        bucket = (inputs.conventions.grad_bucket_elements * wbytes if c.zero_stage >= 1
                  else 0.0)
        held = bucket if c.zero_stage == 3 else 0.0
        if c.zero_stage == 3 and c.dp * c.cp > 1:
            # the flat copy a ZeRO-3 reduce bucket is interleaved into while it flushes in
            # backward (MemoryConventions.zero3_reduce_copies: reduce_scatter_coalesced)
            bucket += inputs.conventions.zero3_reduce_copies * wbytes * min(
                inputs.profile.zero3_reduce_bucket_elements, st.params)
        # torch's cuBLAS workspaces sit in the caching allocator from the first GEMM on,
        # through forward, backward and the step (autopar.cost.memory.cublas_workspace_bytes)
        working = max(timing.stage_transient[rank] + st.gather_bytes + bucket,
                      step_extra + held)
        transient = working + workspace
        # outside the allocator (DeepEP's buffers too), plus what it reserves beyond its
        # allocated peak
        reserved = (p.reserved_bytes + moe_buffers
                    + p.fragmentation * (w + gr + o + act + transient))
        allocated = w + gr + o + act + transient + reserved
        alloc_totals.append(allocated)
        # blocks the step freed and cannot reuse stay reserved (reported, never OOM: the
        # allocator releases them before it fails), up to the capacity
        cached = step_extra + states.step_cached_bytes(c, st.params) - working
        if cached > 0:
            reserved += max(0.0, min(cached, device.visible_memory_bytes - allocated))
        stage_mem.append(_breakdown(w, gr, o, act, transient, reserved))
    return RankMemory(tuple(stage_mem), tuple(alloc_totals))
