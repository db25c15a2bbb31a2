"""Published nccl-tests bus bandwidths, each with its source, and what they say about the
catalogue: how far healthy clusters sit from what autopar's collective model predicts for them.

Rows are nccl-tests runs over a whole world (every GPU of ``spec`` in one communicator), out of
place, as published. ``catalog_ratio`` sets a row against the model of its own cluster
(:meth:`autopar.hardware.Cluster.bus_bandwidth` at the same op, size and ranks); the spread of
those ratios over healthy runs is what ``autopar calibrate --check`` allows before it calls a
measured link short (:func:`healthy_floor`, docs/calibrate.md).

Caveat, stated where it is used: the EFA efficiency of the catalogue (``comm_params``) was
itself fitted to the 2 GB all_to_all and 8 GB all_reduce rows of the same p5 runs, so at those
sizes the ratios are near 1 by construction; the ratios at 32 MB to 1 GB are independent of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

_MiB = 2 ** 20
_P5 = ("crazyguitar/aws-gpu-communication-benchmark data/nccl_{}.csv (commit {}): p5.48xlarge, "
       "8 x H100 and 32 x 100 Gb/s EFAv2 per node, NCCL 2.28.7, aws-ofi-nccl 1.16.3, 1000 "
       "iterations, out-of-place busbw; sizes in the file's MB read as MiB (nccl-tests sizes)")
_P5_AR = _P5.format("all_reduce", "4fdb5a4f")
_P5_A2A = _P5.format("alltoall", "a77f70db")
_AZ_A100 = ("Azure ND_A100_v4_results.md (docs/reference/hardware_and_formulas.md, NCCL "
            "AllReduce table): 8 x A100 NVSwitch, 231.6 GB/s at 8 GB")
_AZ_H200 = ("Azure ND_H200_v5_results.md (docs/reference/hardware_and_formulas.md): 8 x H200 "
            "with NVLS, 480.0 GB/s at 8 GB (NVLS is not modelled: above the ring bound)")


@dataclass(frozen=True)
class PublishedBusBw:
    """One published nccl-tests figure: ``op`` over every GPU of the cluster ``spec`` (a
    cluster spec string, ``autopar.hardware.spec``), ``nbytes`` in nccl-tests conventions,
    ``busbw_Bps`` its bus bandwidth in bytes/s, ``source`` where it was read."""

    spec: str
    op: str
    nbytes: int
    busbw_Bps: float
    source: str


def _p5(op: str, rows: str, src: str) -> tuple[PublishedBusBw, ...]:
    out = []
    for row in rows.split():
        nodes, mib, gbps = row.split(",")
        out.append(PublishedBusBw(f"{nodes}x8xH100+32xefa-v2-100g", op, int(mib) * _MiB,
                                  float(gbps) * 1e9, src))
    return tuple(out)


#: The published runs (nodes, MiB, busbw GB/s for the p5 rows: a subset of each file's sizes,
#: every node count).
PUBLISHED: tuple[PublishedBusBw, ...] = (
    PublishedBusBw("1x8xA100-40GB", "all_reduce", 8 * 2 ** 30, 231.6e9, _AZ_A100),
    PublishedBusBw("1x8xH200", "all_reduce", 8 * 2 ** 30, 480.0e9, _AZ_H200),
    *_p5("all_reduce", """2,32,147.32 2,256,364.46 2,1024,435.14 2,8192,477.71
         4,32,95.38 4,256,273.34 4,1024,280.30 4,8192,356.99
         8,32,86.74 8,256,232.09 8,1024,274.47 8,8192,355.36
         16,32,74.85 16,256,148.11 16,1024,269.23 16,8192,356.27
         32,32,66.34 32,256,137.99 32,1024,220.08 32,8192,321.10""", _P5_AR),
    *_p5("all_to_all", """2,32,44.79 2,256,74.26 2,2048,79.25
         4,32,34.45 4,256,54.28 4,2048,54.07
         8,32,28.67 8,256,44.40 8,2048,49.63
         16,32,24.63 16,256,34.77 16,2048,44.23
         32,32,19.72 32,256,30.21 32,2048,40.78""", _P5_A2A),
)

#: Share of a healthy node's published figure below which a vendor's own health check fails the
#: node, on the same test and size: Azure AzNHC (Azure/azurehpc-health-checks, overview table of
#: ``check_nccl_allreduce``) expects 228 GB/s on nd96amsr_a100_v4, whose published figure is
#: 231.6 GB/s (0.984), and 460 GB/s on nd96isr_h100_v5, where its passing logs read 480.3 and
#: 482.6 GB/s (0.953). The looser, 460 / 482.559, is taken.
PUBLISHED_TOLERANCE = 460.0 / 482.559


@cache
def catalog_ratio(row: PublishedBusBw) -> float:
    """The published busbw over what the catalogue's model gives for the same run (same
    cluster, op, size, every rank): above 1 the model is pessimistic, below 1 optimistic."""
    from .cluster import Cluster   # cluster imports this package's collectives; import late
    c = Cluster.from_spec(row.spec)
    return row.busbw_Bps / c.bus_bandwidth(row.op, row.nbytes, tuple(range(c.world_size)))


def healthy_floor(nbytes: float) -> tuple[float, PublishedBusBw]:
    """(lowest :func:`catalog_ratio` of a published run, that run) among the runs whose size is
    within a factor 2 of ``nbytes``, else among the runs of the nearest published size (the
    smallest published size is 32 MiB: a smaller message takes its floor). A measured busbw
    below this share of the catalogue's is lower, against the model, than any healthy
    published run at that size."""
    near = [r for r in PUBLISHED if nbytes / 2 <= r.nbytes <= nbytes * 2]
    if not near:
        closest = min(PUBLISHED, key=lambda r: abs(r.nbytes - nbytes) / r.nbytes)
        near = [r for r in PUBLISHED if r.nbytes == closest.nbytes]
    row = min(near, key=catalog_ratio)
    return catalog_ratio(row), row


def published_for(spec_cluster, op: str) -> tuple[PublishedBusBw, ...]:
    """The published runs of ``op`` on the same fabric and scale as a one-node group of all
    ``spec_cluster``'s GPUs per node (same intra link and GPUs per node; one node), largest
    first. Only one-node runs can be set beside an autopar measurement: its inter-node groups
    are rails (one GPU per node), not the whole-world runs published."""
    from .cluster import Cluster
    out = []
    for r in PUBLISHED:
        c = Cluster.from_spec(r.spec)
        if (c.num_nodes == 1 and r.op == op and c.intra_link.name == spec_cluster.intra_link.name
                and c.gpus_per_node == spec_cluster.gpus_per_node):
            out.append(r)
    return tuple(sorted(out, key=lambda r: -r.nbytes))
