"""Search with part of each GPU's memory kept free for the memory model's error.

A plan predicted at 99.7% of the GPU fits only if the prediction is never low; measured peaks
were above their predictions by as much as the measured band of the model's kind says
(:func:`autopar.cost.regime.memory_band`: the growth over prediction that 68% of its runs stayed
within, and its largest under-prediction, generated from the corpus). Only a peak above its
prediction runs out of memory, so the margin comes from that one-sided shortfall, not from the
band's half-width (a kind whose peaks are mostly over-predicted needs little margin). With a
``memory_margin`` m the search runs on the same cluster with each GPU's capacity taken as
(1 - m) of what the framework sees, so every plan it returns leaves m of the memory free by
prediction; the plans are then re-estimated on the real capacity (times are unchanged: time
does not depend on capacity), so the reported limit, ``fits`` and warnings are the GPU's own.
"""

from __future__ import annotations

from dataclasses import replace

from ..cost.regime import MAX_MEMORY_MARGIN, default_margin, memory_band
from ..cost.model import CostModel
from ..errors import InfeasibleError, InvalidSearchOption
from .optimize import SearchResult, search

__all__ = ["MAX_MEMORY_MARGIN", "check_margin", "default_margin", "derated"]


def check_margin(memory_margin, moe: bool = False) -> float:
    """``memory_margin`` as a float in [0, :data:`MAX_MEMORY_MARGIN`]; None is
    :func:`default_margin` for the model's kind (``moe``).

    Raises:
        InvalidSearchOption: not a number in that range.
    """
    if memory_margin is None:
        return default_margin(moe)
    if isinstance(memory_margin, bool) or not isinstance(memory_margin, (int, float)) \
            or not 0 <= memory_margin <= MAX_MEMORY_MARGIN:
        raise InvalidSearchOption(
            f"memory_margin must be a fraction of GPU memory to keep free in [0, "
            f"{MAX_MEMORY_MARGIN}]; got {memory_margin!r}. Fix: e.g. memory_margin=0.1 "
            "(plans use at most 90% of each GPU by prediction), or 0 for none.")
    return float(memory_margin)


def derated(cm: CostModel, memory_margin: float) -> CostModel:
    """``cm`` on the same cluster with each GPU's visible capacity times (1 - memory_margin)."""
    from ..hardware import Cluster
    c, dev = cm.cluster, cm.device
    device = replace(dev, capacity_bytes=dev.visible_memory_bytes * (1 - memory_margin))
    cluster = Cluster(c.num_nodes, c.gpus_per_node, device, c.intra_link, c.inter_link,
                      c.nics_per_node, c.name, c.comm_params, c.gpus_per_host)
    return cm.rebuilt(cluster)


def search_with_margin(cm: CostModel, fixed: dict | None = None, *,
                       memory_margin: float | None = None, **options) -> SearchResult:
    """:func:`autopar.search.optimize.search` with ``memory_margin`` of each GPU's memory kept
    free (module docstring; None: :func:`default_margin`); ``options`` go to the search
    unchanged.

    Raises:
        InfeasibleError: nothing fits within the margin (the message says the margin and that a
            smaller one may fit), or nothing fits at all.
        InvalidSearchOption: a bad ``memory_margin``.
    """
    moe = cm.graph.num_experts > 0
    memory_margin = check_margin(memory_margin, moe)
    if memory_margin == 0:
        return search(cm, fixed, **options)
    try:
        r = search(derated(cm, memory_margin), fixed, **options)
    except InfeasibleError as exc:
        free = cm.device.visible_memory_bytes * memory_margin / 1e9
        # without the margin: when nothing fits either, that search's error is the reason
        # (a layout rule, or memory at the GPU's own capacity), and the margin is beside it
        tight = search(cm, fixed, top_k=1, time_limit_s=options.get("time_limit_s")).best
        use = tight.memory_per_gpu_bytes / tight.memory_limit_bytes
        raise InfeasibleError(
            f"infeasible within memory_margin={memory_margin:g} ({free:.1f} GB per GPU kept "
            f"free for the memory model's error): the best plan without the margin "
            f"({tight.step_time_s:.4g} s per step) fills {use:.1%} of the GPU's memory by "
            "prediction, and measured peaks have been up to "
            f"{_worst(moe):.0%} above prediction. Fix: memory_margin=0 (--memory-margin 0) to "
            "accept it, or the changes that make room: "
            f"{str(exc).split('Smallest changes: ', 1)[-1]}") from None
    again = {}

    def real(e):
        if e.config not in again:
            again[e.config] = cm.estimate(e.config)
        return again[e.config]

    return replace(r, best=real(r.best), top=tuple(real(e) for e in r.top),
                   pareto=tuple(real(e) for e in r.pareto))


def _worst(moe: bool) -> float:
    band = memory_band(moe)
    return band[3] if band else 0.0
