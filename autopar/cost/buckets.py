"""Exposed time of a data-parallel gradient reduction issued as synchronised buckets
(InternEvo's hybrid ZeRO): :func:`bucketed_exposed_s`, used by :mod:`autopar.cost.dp`."""

from __future__ import annotations

from ..config import ParallelConfig


def bucketed_exposed_s(dp, c: ParallelConfig, layers: tuple[int, ...], op: str,
                       nbytes_per_element: float, overlap: float = 1.0) -> float:
    """Exposed seconds of a data-parallel gradient reduction run as buckets of at most
    ``sync_grad_bucket_elements`` elements with one bucket in flight, over the last
    micro-batch's backward of a pipeline rank holding graph layers ``layers`` (``dp``: the
    :class:`autopar.cost.dp.DataParallel` whose inputs, groups and block costs it reads).

    Source: InternEvo c18bec9 hybrid_zero_optim.py. Each parameter's gradient hook
    (``_store_and_try_reduce_grads_by_bucket``, L329-352) adds it to the bucket, and when
    the next one would overflow the bucket it reduces the stored one: ``_reduce_and_copy``
    (L402-418) first calls ``torch.cuda.synchronize()``, which waits for the compute issued
    so far and for the previous bucket's reduction, then launches this bucket's ``op`` on
    the communication stream. So a bucket's reduction hides only behind the backward
    compute up to the next bucket's launch (``overlap`` of it, 1 in the estimate, which
    charges the compute slowdown beside the buckets,
    :func:`autopar.cost.comm.overlapped_comm`), and ``step()``
    (L508-514) reduces the last bucket after backward and synchronizes: fully exposed. Hooks
    fire in backward order (the layers reversed, each op's parameters one tensor, TP-sharded
    ones / tp); a layer's backward seconds
    (:meth:`autopar.cost.blocks.BlockCosts.block_cost`) are split over its tensors by their
    elements. ``op`` over the data-parallel group, ``nbytes_per_element``: the reduce dtype's
    bytes. Returns seconds.
    """
    cap = dp.inputs.profile.sync_grad_bucket_elements
    dp_g = dp.groups.group("dp", c)
    uniform = c.recompute if isinstance(c.recompute, str) else None
    modes = None if uniform else dict(zip(dp.inputs.blocks, c.block_recompute(len(dp.inputs.blocks))))
    fill = in_flight = since = exposed = 0.0
    for li in reversed(layers):
        layer = dp.inputs.graph.layers[li]
        bwd = dp.blocks.block_cost(li, uniform or modes.get(li, "none"), c).bwd_s
        sizes = [o.num_parameters / (c.tp if o.tp_role in ("column", "row", "vocab") else 1)
                 for o in reversed(layer.ops) if o.num_parameters > 0]
        total = sum(sizes)
        if not total:
            since += bwd
        for size in sizes:
            since += bwd * size / total
            if fill > 0 and fill + size > cap:
                exposed += max(0.0, in_flight - overlap * since)
                in_flight, since, fill = dp_g.time(op, fill * nbytes_per_element), 0.0, 0.0
            fill += size
    return exposed + max(0.0, in_flight - overlap * since) + dp_g.time(
        op, fill * nbytes_per_element)
