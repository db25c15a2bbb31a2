"""The ZeRO-3 passes of data parallelism as the framework issues them: the all-gathers of
parameters and reduce-scatters of gradients over one pipeline rank's layers, one collective per
block (FSDP) or per parameter tensor (DeepSpeed, with its persistence threshold and reduce
buckets), their seconds and link loads, and the edge collectives of per-block ZeRO-3 that no
compute hides (:class:`Zero3Passes`, a part of :class:`autopar.cost.dp.DataParallel`; the
derivation of the edges is in docs/cost-model.md, communication).
"""

from __future__ import annotations

from ..config import ParallelConfig
from ..hardware.collectives import NO_LOAD, LinkLoad

#: Fields a ZeRO-3 pass does not read: the search prices one layout under many recompute and
#: kept-gathered choices, so the cache key leaves them out
_NOT_IN_ZERO3 = ("recompute", "reshard_after_forward")


class Zero3Passes:
    """ZeRO-3 pass costs, mixed into :class:`autopar.cost.dp.DataParallel`, whose ``inputs``
    (:class:`~autopar.cost.context.CostInputs`), ``groups``, ``ranks``, ``blocks`` and
    ``_zero3`` cache (a dict) they read."""

    def zero3_collective_s(self, c: ParallelConfig, rank: int, nbytes_per_element: float,
                           op: str) -> float:
        """Seconds of one ZeRO-3 pass of ``op`` ("all_gather" of parameters or
        "reduce_scatter" of gradients) over pipeline rank ``rank``'s layers, as the framework
        issues it (``zero3_gather`` of the profile): one collective per layer (FSDP wraps each
        block: ``per_block``) or one per parameter tensor (DeepSpeed ZeRO-3: ``per_parameter``),
        so the latency terms of every call count, not one ideal collective per pass.
        ``nbytes_per_element``: 2 for bf16 parameters, the reduce dtype's bytes for gradients."""
        key = (c.fields_except(*_NOT_IN_ZERO3), rank, nbytes_per_element, op, "s")
        hit = self._zero3.get(key)
        if hit is not None:
            return hit
        dp_g = self.groups.group("dp", c)
        total = 0.0
        for n, nbytes in self.zero3_messages(c, rank, nbytes_per_element, op):
            total += n * dp_g.time(op, nbytes)
        self._zero3[key] = total
        return total

    def zero3_edges_s(self, c: ParallelConfig, rank: int, wbytes: float,
                      rbytes: float) -> tuple[float, float]:
        """(seconds of the edge collectives, seconds of them no compute hides) of one
        micro-batch of per-block ZeRO-3 (FSDP) on pipeline rank ``rank`` holding the whole
        model (pp = 1): the all-gather and reduce-scatter of the root group (the rank's
        non-block layers: embedding, final norm, head) and of the first block, at the ends of
        the forward and the backward. Exposed: AG(root) + max(0, AG(first block) - embedding
        forward) + max(0, RS(first block) - embedding backward) + RS(root), each timed per
        layer as :meth:`zero3_messages` issues them, so the edges leave the overlapped pool
        without double counting. ``wbytes``: the gathered parameters' bytes per element,
        ``rbytes``: the reduce dtype's. (0, 0) when the rank holds no block or the DP group is one
        rank.

        Source: PyTorch docs/source/notes/fsdp.rst (pytorch/pytorch@16d83c2, "FSDP Prefetch
        Nuances" and "Communication buffer size"); the derivation is in docs/cost-model.md
        (communication, per-block ZeRO-3).
        """
        key = (c.fields_except(*_NOT_IN_ZERO3), rank, wbytes, rbytes, "edges")
        hit = self._zero3.get(key)
        if hit is not None:
            return hit
        g = self.inputs.graph
        layers = self.ranks.rank_layers(c.pp, c.stage_blocks, c.schedule)[rank][0]
        dp_g = self.groups.group("dp", c)
        first = next((li for li in layers if g.layers[li].kind == "block"), None)
        if first is None or dp_g.size <= 1:
            self._zero3[key] = (0.0, 0.0)
            return self._zero3[key]
        uniform = c.recompute if isinstance(c.recompute, str) else "none"

        def params(li: int) -> float:
            return self.ranks.layer_params_per_rank(li, c.tp, True, c.ep, c.etp)

        root = [li for li in layers if g.layers[li].kind != "block"]
        ag_root = sum(dp_g.time("all_gather", params(li) * wbytes) for li in root)
        rs_root = sum(dp_g.time("reduce_scatter", params(li) * rbytes) for li in root)
        ag_first = dp_g.time("all_gather", params(first) * wbytes)
        rs_first = dp_g.time("reduce_scatter", params(first) * rbytes)
        before = [li for li in layers if li < first]   # the embedding, run before block 0
        fwd_before = sum(self.blocks.block_cost(li, uniform, c).fwd_s for li in before)
        bwd_before = sum(self.blocks.block_cost(li, uniform, c).bwd_s for li in before)
        comm = ag_root + rs_root + ag_first + rs_first
        exposed = (ag_root + rs_root + max(0.0, ag_first - fwd_before)
                   + max(0.0, rs_first - bwd_before))
        self._zero3[key] = (comm, exposed)
        return self._zero3[key]

    def zero3_root_gather(self, c: ParallelConfig, rank: int,
                          wbytes: float) -> tuple[float, LinkLoad, float]:
        """(seconds, link load, parameter elements) of one all-gather of pipeline rank
        ``rank``'s layers outside the blocks (embedding, final norm, head), one collective per
        layer (each its own FSDP module), over the ZeRO group: the whole dp x cp group, or the
        shard group a hybrid sharding sets (``zero1_group_size``; FSDP2's HSDP gathers over the
        mesh's shard dimension only). ``wbytes``: bytes per gathered element (2 for bf16).
        (0, no load, 0) when the rank holds no such layer or the group is one rank."""
        key = (c.fields_except(*_NOT_IN_ZERO3), rank, wbytes, "root")
        hit = self._zero3.get(key)
        if hit is not None:
            return hit
        g = self.inputs.graph
        zg = self.groups.zero1_group(c)
        layers = self.ranks.rank_layers(c.pp, c.stage_blocks, c.schedule)[rank][0]
        elems = [self.ranks.layer_params_per_rank(li, c.tp, True, c.ep, c.etp)
                 for li in layers if g.layers[li].kind != "block"]
        elems = [n for n in elems if n > 0]
        if zg is None or not elems:
            self._zero3[key] = (0.0, NO_LOAD, 0.0)
            return self._zero3[key]
        t = sum(zg.time("all_gather", n * wbytes) for n in elems)
        load = NO_LOAD
        for n in elems:
            load += zg.load("all_gather", n * wbytes)
        self._zero3[key] = (t, load, float(sum(elems)))
        return self._zero3[key]

    def zero3_collective_load(self, c: ParallelConfig, rank: int, nbytes_per_element: float,
                              op: str) -> LinkLoad:
        """The per-link :class:`LinkLoad` of the collectives :meth:`zero3_collective_s` times."""
        key = (c.fields_except(*_NOT_IN_ZERO3), rank, nbytes_per_element, op, "load")
        hit = self._zero3.get(key)
        if hit is not None:
            return hit
        dp_g = self.groups.group("dp", c)
        total = NO_LOAD
        for n, nbytes in self.zero3_messages(c, rank, nbytes_per_element, op):
            total += dp_g.load(op, nbytes).scaled(n)
        self._zero3[key] = total
        return total

    def zero3_messages(self, c: ParallelConfig, rank: int, nbytes_per_element: float,
                       op: str = "all_gather"):
        """(count, message bytes) of each ZeRO-3 collective of ``op`` one pass over pipeline
        rank ``rank``'s layers issues (:meth:`zero3_collective_s`)."""
        g = self.inputs.graph
        prof = self.inputs.profile
        per_param = prof.zero3_gather == "per_parameter"
        bucket = prof.zero3_reduce_bucket_elements if op == "reduce_scatter" else 0
        # tensors small enough to persist are never gathered (FrameworkProfile.
        # zero3_persistent_elements; an op's parameters counted together, so a bias beside
        # its weight is not left out on its own); their gradients are still reduced
        persist = prof.zero3_persistent_elements if op == "all_gather" else 0
        total = 0.0   # elements of the pass, for the bucketed reduction
        for li, n in self.ranks.rank_layers(c.pp, c.stage_blocks, c.schedule)[rank][2]:
            layer = g.layers[li]
            if per_param:
                for o in layer.ops:
                    if o.num_parameters > persist:
                        div = c.tp if o.tp_role in ("column", "row", "vocab") else 1
                        if bucket:
                            total += n * o.num_parameters / div
                        else:
                            yield n, o.num_parameters / div * nbytes_per_element
            else:
                yield n, self.ranks.layer_params_per_rank(li, c.tp, True, c.ep,
                                                     c.etp) * nbytes_per_element
        if total > 0:
            # gradients reduced in buckets of ``bucket`` elements, one collective each
            # (FrameworkProfile.zero3_reduce_bucket_elements: DeepSpeed stage3.py)
            full, rest = divmod(total, bucket)
            if full:
                yield int(full), bucket * nbytes_per_element
            if rest:
                yield 1, rest * nbytes_per_element
