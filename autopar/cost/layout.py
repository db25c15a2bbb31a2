"""Per-rank layout: what each pipeline rank of a config holds, independent of recompute
choices (its layers, in-flight multiplier, pipeline sends and model states:
:class:`StageLayout`, built and cached by :class:`Layouts`)."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from ..config import PARAMETER_COPIES, ParallelConfig
from ..errors import InvalidParallelConfig
from ..frozen import built
from ..hardware.collectives import NO_LOAD, LinkLoad
from . import memory as mem
from .context import CostInputs
from .groups import Groups
from .pipeline.held import chunk_counts_at_peak
from .pipeline.orders import stage_rank
from .ranks import RankLayers
from .states import ModelStates


@dataclass(frozen=True)
class StageLayout:
    """What one pipeline rank holds, independent of recompute choices.

    Attributes:
        layers: graph layer indices on the rank (all its chunks), in model order.
        flight: micro-batch-chunk units of activations held at the peak divided by the rank's
            chunk count, i.e. the multiplier of one micro-batch's activations of its layers.
        p2p_s: pipeline send/recv seconds per micro-batch (forward + backward).
        p2p_load: what the rank sends per micro-batch, activations to the next chunk and input
            gradients to the previous one (send/recv: bytes on the wire = the message), and the
            seconds those sends take before overlap, on the link they cross (what the per-link
            ledger shows).
        params: parameter elements on the rank (after TP sharding).
        states: (weights, gradients, optimizer states) bytes after ZeRO sharding.
        gather_bytes: ZeRO-3 working memory: the gathered parameters of the largest layer and
            the next one being prefetched (2 x its unsharded bytes).
        edge_flight: (layer index, micro-batches) of the rank's non-block layers (embedding,
            head) whose chunk holds a count other than ``flight`` at the rank's peak (a rank
            with several chunks: :func:`autopar.cost.pipeline.held.chunk_counts_at_peak`);
            the others take ``flight``.
    """

    layers: tuple[int, ...]
    flight: float
    p2p_s: float
    p2p_load: LinkLoad
    params: float
    states: tuple[float, float, float]
    gather_bytes: float = 0.0
    edge_flight: tuple[tuple[int, float], ...] = ()

    def flight_of(self, layer: int) -> float:
        """Micro-batches of graph layer ``layer``'s activations the rank holds at its peak
        (``edge_flight`` where it names the layer, else ``flight``)."""
        for li, f in self.edge_flight:
            if li == layer:
                return f
        return self.flight


def _stage_layout(layers: tuple[int, ...], flight: float, p2p_s: float, p2p_load: LinkLoad,
                  params: float, states: tuple[float, float, float], gather_bytes: float = 0.0,
                  edge_flight: tuple[tuple[int, float], ...] = ()) -> StageLayout:
    """``StageLayout(...)``, built at once (:func:`autopar.frozen.built`): a hot path."""
    return built(StageLayout, layers=layers, flight=flight, p2p_s=p2p_s, p2p_load=p2p_load,
                 params=params, states=states, gather_bytes=gather_bytes, edge_flight=edge_flight)


#: The fields of a resolved configuration a rank's layout reads, less the ZeRO stage (which only
#: its model states read): the key of the layouts shared by a mesh's ZeRO stages.
_mesh_fields = attrgetter("tp", "pp", "cp", "dp", "micro_batch_size", "sequence_parallel",
                          "schedule", "virtual_stages", "stage_blocks", "placement", "ep",
                          "expert_tp", "vp_group")


class Layouts:
    """The :class:`StageLayout` of each pipeline rank of a config, cached per mesh.

    Args:
        inputs: the cost model's :class:`~autopar.cost.context.CostInputs`.
        groups, ranks, states: its process groups, rank layers and model states.
    """

    def __init__(self, inputs: CostInputs, groups: Groups, ranks: RankLayers,
                 states: ModelStates):
        self.inputs, self.groups, self.ranks, self.states = inputs, groups, ranks, states
        self._layouts: dict[tuple, tuple[StageLayout, ...]] = {}
        self._layouts_by_mesh: dict[tuple, tuple[StageLayout, ...]] = {}   # less the ZeRO stage
        self._time_layouts: dict[tuple, tuple[StageLayout, ...]] = {}
        # per rank, the time parts (_time_part) of meshes that have a time layout only
        self._time_parts: dict[tuple, tuple[tuple, ...]] = {}
        self._parts: dict[tuple, tuple] = {}   # _rank_parts
        self._p2p: dict[tuple, tuple] = {}     # a rank's pipeline sends (_time_part)

    def stage_layout(self, c: ParallelConfig) -> tuple[StageLayout, ...]:
        """Per pipeline rank of the resolved config ``c``: its layers, in-flight multiplier,
        pipeline communication and model states (cached)."""
        mesh = _mesh_fields(c)
        key = (mesh, c.zero_stage)
        hit = self._layouts.get(key)
        if hit is not None:
            return hit
        pp = c.pp
        # the layout under another ZeRO stage differs only in its model states (layers,
        # in-flight count, pipeline traffic and parameters do not read the stage)
        other = self._layouts_by_mesh.get(mesh)
        if other is not None:
            out = []
            for rank, st in enumerate(other):
                experts = (self.ranks.rank_params(c.tp, c.ep, st.layers, c.etp)[1]
                           * PARAMETER_COPIES.get(c.schedule, 1))
                rs = self.states.rank_states(c, st.params, experts, st.layers, pp, rank)
                out.append(_stage_layout(st.layers, st.flight, st.p2p_s, st.p2p_load,
                                         st.params, rs.states, rs.working_bytes,
                                         st.edge_flight))
            self._layouts[key] = tuple(out)
            return self._layouts[key]
        # the parts a time-only layout priced already (time_layout), else priced now
        timed = self._time_parts.pop(mesh, None)
        out = []
        for rank, (layers, parts) in enumerate(self._rank_parts(c)):
            part = timed[rank] if timed is not None else self._time_part(c, layers, parts)
            out.append(self._with_memory(c, rank, layers, parts, part))
        self._layouts[key] = self._layouts_by_mesh[mesh] = tuple(out)
        return self._layouts[key]

    def _rank_parts(self, c: ParallelConfig) -> tuple[tuple[tuple[int, ...], tuple], ...]:
        """Per pipeline rank of the resolved ``c``: (its layers, its parts as
        :meth:`rank_layout` takes them); cached by what they read (pp, cuts, schedule)."""
        pp = c.pp
        key = (pp, c.stage_blocks, c.schedule)
        hit = self._parts.get(key)
        if hit is not None:
            return hit
        out = []
        for layers, mine, _groups, chunks in self.ranks.rank_layers(pp, c.stage_blocks,
                                                                    c.schedule):

            def remote(ci: int) -> bool:
                """Whether chunks ci and ci + 1 sit on different ranks (a V's turn does not)."""
                return stage_rank(ci, pp, c.schedule) != stage_rank(ci + 1, pp, c.schedule)

            parts = tuple(
                (tuple(chunks[ci]), ci < len(chunks) - 1 and bool(chunks[ci]) and remote(ci),
                 chunks[ci - 1][-1] if ci > 0 and chunks[ci - 1] and remote(ci - 1) else None)
                for ci in mine)
            out.append((layers, parts))
        hit = self._parts[key] = tuple(out)
        return hit

    def time_layout(self, c: ParallelConfig) -> tuple[StageLayout, ...]:
        """What the step time reads of :meth:`stage_layout` (layers, pipeline communication,
        parameters; the search's time-only bound): none of it depends on the ZeRO stage or the
        kept-gathered flags, so the layout of any ZeRO stage of ``c`` serves (cached per
        configuration less those fields; its model states, in-flight counts and ZeRO-3
        working bytes are not to be read: where no ZeRO stage of ``c`` has a layout yet they
        are left at 0 and not priced, and :meth:`stage_layout` reuses the parts priced here)."""
        key = c.fields_except("zero_stage", "reshard_after_forward")
        hit = self._time_layouts.get(key)
        if hit is None:
            mesh = _mesh_fields(c)
            hit = self._layouts_by_mesh.get(mesh)
            if hit is None:
                parts = self._time_parts.get(mesh)
                if parts is None:
                    parts = self._time_parts[mesh] = tuple(
                        self._time_part(c, layers, ps) for layers, ps in self._rank_parts(c))
                hit = tuple(_stage_layout(layers, 0.0, p2p_s, p2p_load, params, (0.0, 0.0, 0.0))
                            for layers, p2p_s, p2p_load, params, _experts in parts)
            self._time_layouts[key] = hit
        return hit

    def interval_layout(self, c: ParallelConfig, rank: int, start: int, end: int) -> StageLayout:
        """What pipeline rank ``rank`` of the resolved, non-interleaved config ``c`` holds when
        its stage is decoder blocks ``start`` to ``end - 1`` (positions among the blocks), the
        embedding on rank 0 and the head on the last rank; the other ranks' cuts do not matter
        (what the stage-cut dynamic programme of :mod:`autopar.search.cuts` prices).

        Raises:
            InvalidParallelConfig: an interleaved ``c``, or an empty or out-of-range stage.
        """
        n, pp = len(self.inputs.blocks), c.pp
        if (c.virtual_stages or 1) != 1 or not 0 <= start < end <= n or not 0 <= rank < pp \
                or (rank == 0) != (start == 0) or (rank == pp - 1) != (end == n):
            raise InvalidParallelConfig(
                f"interval_layout needs one chunk per rank and a non-empty stage of blocks that "
                f"starts at block 0 exactly on rank 0 and ends at the last block exactly on the "
                f"last rank; got rank {rank} of {pp}, blocks [{start}, {end}) of {n}, "
                f"virtual_stages={c.virtual_stages}. Fix: pass a cut of a 1F1B/GPipe pipeline.")
        nl = len(self.inputs.graph.layers)
        first, last = (self.inputs.blocks[0], self.inputs.blocks[-1]) if self.inputs.blocks else (nl, nl - 1)
        layers = tuple(self.inputs.blocks[start:end])
        if rank == 0:
            layers = tuple(range(0, first)) + layers
        if rank == pp - 1:
            layers = layers + tuple(range(last + 1, nl))
        prev = self.inputs.blocks[start - 1] if rank > 0 else None
        return self.rank_layout(c, rank, layers, ((layers, rank != pp - 1, prev),))

    def rank_layout(self, c: ParallelConfig, rank: int, layers: tuple[int, ...],
                    parts: tuple) -> StageLayout:
        """One rank's :class:`StageLayout`; ``parts`` holds, per chunk of the rank, (its layer
        indices, whether it sends its output to another rank (not the model's last chunk, nor
        a V's turn), the last layer of the chunk before it when that chunk sits on another rank,
        else None)."""
        return self._with_memory(c, rank, layers, parts, self._time_part(c, layers, parts))

    def _time_part(self, c: ParallelConfig, layers: tuple[int, ...], parts: tuple) -> tuple:
        """What the step time reads of one rank's :class:`StageLayout` (:meth:`rank_layout`'s
        arguments less the rank): (layers, p2p_s, p2p_load, parameter elements, expert
        parameter elements)."""
        g, tp, pp, cp = self.inputs.graph, c.tp, c.pp, c.cp
        bscale = c.micro_batch_size / g.micro_batch_size
        p2p_s, p2p_load = 0.0, NO_LOAD

        def boundary_bytes(layer: int) -> float:
            """Bytes of the activation a chunk ending in ``layer`` sends to the next one (its
            gradient crosses back the same size)."""
            return (g.layers[layer].output_bytes * bscale / cp
                    / (tp if c.sequence_parallel else 1))

        if pp > 1:
            # per chunk, the bytes it sends forward and those of the gradient it sends back:
            # with the pipeline group (Groups.group's key) all the sends read, so ranks whose
            # chunks send the same sizes share the sums
            sizes = tuple((boundary_bytes(chunk[-1]) if sends and chunk else None,
                           None if prev is None else boundary_bytes(prev))
                          for chunk, sends, prev in parts)
            key = (c.tp, c.cp, c.dp, pp, c.ep, c.placement, c.expert_tp, sizes)
            hit = self._p2p.get(key)
            if hit is None:
                pp_g = self.groups.group("pp", c)
                for nbytes, back in sizes:
                    if nbytes is not None:
                        p2p_s += 2 * pp_g.time("send_recv", nbytes)
                        # this rank sends the activation forward
                        p2p_load += pp_g.load("send_recv", nbytes)
                    if back is not None:
                        # and the input's gradient backward
                        p2p_load += pp_g.load("send_recv", back)
                hit = self._p2p[key] = (p2p_s, p2p_load)
            p2p_s, p2p_load = hit
        params, experts = self.ranks.rank_params(tp, c.ep, layers, c.etp)
        # DualPipe keeps each stage on two ranks: a rank holds twice the parameters of its
        # layers (PARAMETER_COPIES), with their gradients and optimizer states
        copies = PARAMETER_COPIES.get(c.schedule, 1)
        return layers, p2p_s, p2p_load, params * copies, experts * copies

    def _with_memory(self, c: ParallelConfig, rank: int, layers: tuple[int, ...], parts: tuple,
                     timed: tuple) -> StageLayout:
        """:meth:`rank_layout` from its :meth:`_time_part` ``timed``: the model states,
        in-flight count and edge layers' counts added."""
        _layers, p2p_s, p2p_load, params, experts = timed
        pp = c.pp
        m = self.inputs.train.global_batch_size // (c.dp * c.micro_batch_size)
        rs = self.states.rank_states(c, params, experts, layers, pp, rank)
        flight = mem.in_flight(c.schedule, rank, pp, m, c.virtual_stages,
                               c.vp_group) / max(1, len(parts))
        edge = self.edge_flight(c, rank, layers, flight) if len(parts) > 1 and pp > 1 else ()
        return _stage_layout(layers, flight, p2p_s, p2p_load, params, rs.states,
                             rs.working_bytes, edge)

    def edge_flight(self, c: ParallelConfig, rank: int, layers: tuple[int, ...],
                     flight: float) -> tuple[tuple[int, float], ...]:
        """:attr:`StageLayout.edge_flight` of pipeline rank ``rank`` holding several chunks:
        each non-block layer at the micro-batches its own chunk holds at the rank's peak
        (:func:`autopar.cost.pipeline.held.chunk_counts_at_peak`, the most at any instant of
        that peak), where that differs from the rank's mean ``flight``. Orders torch cannot
        build keep the mean. A rank holding decoder blocks only (the middle ranks) has none,
        so its order is not walked."""
        kinds = self.inputs.graph.layers
        if all(kinds[li].kind == "block" for li in layers):
            return ()
        m = self.inputs.train.global_batch_size // (c.dp * c.micro_batch_size)
        try:
            counts = chunk_counts_at_peak(c.schedule, c.pp, m, c.virtual_stages, rank,
                                          c.vp_group)
        except ValueError:
            return ()
        _l, mine, _g, chunks = self.ranks.rank_layers(c.pp, c.stage_blocks, c.schedule)[rank]
        out = []
        for ci in mine:
            for li in chunks[ci]:
                if li in layers and kinds[li].kind != "block" \
                        and float(counts.get(ci, 0)) != flight:
                    out.append((li, float(counts.get(ci, 0))))
        return tuple(out)
