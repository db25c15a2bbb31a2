"""``autopar calibrate --check``: is this cluster's network what the catalogue says it is?

Measured bus bandwidth of each collective over each link class (a node's ranks as one group;
rail groups across nodes) is set against (a) what the catalogue's collective model predicts for
the same op, size and group on the reference cluster, and (b) a published nccl-tests figure of
the same fabric and scale where :mod:`autopar.hardware.nccl_tests` has one. A link is short when
its ratio to (a) at the largest size measured falls below the lowest ratio any healthy published
run reaches against the model at that size (:func:`~autopar.hardware.nccl_tests.healthy_floor`,
or a ratio the user sets), or its figure at a published size falls below a vendor health
check's share of that figure (:data:`~autopar.hardware.nccl_tests.PUBLISHED_TOLERANCE`). What a
shortfall costs: a plan re-estimated with the measured links (:func:`~.fit.calibrated`) against
the catalogue's. Derivation and limits: docs/calibrate.md.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import InvalidCalibration
from ..hardware import Cluster
from ..hardware.collectives import bus_factor
from ..hardware.devices import DEVICES
from ..hardware.nccl_tests import (PUBLISHED_TOLERANCE, PublishedBusBw, healthy_floor,
                                   published_for)
from .fit import predicted_seconds
from .schema import Calibration, load_calibration

#: The collectives checked (send/recv is measured by ``calibrate`` but has no nccl-tests row).
CHECK_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
#: Default message sweep of the check (bytes): up to 1 GiB on a GPU, where published runs sit
#: within 0.74 of the model (the floor falls to 0.55 at 256 MiB); 1 MiB on a CPU (gloo).
GPU_SIZES = (2 ** 20, 2 ** 30)
CPU_SIZES = (2 ** 14, 2 ** 20)


@dataclass(frozen=True)
class LinkVerdict:
    """One measured collective against the catalogue. ``scope`` "intra" (one node's ranks) or
    "inter" (rails, one rank per node); ``group_size`` ranks over ``nodes`` nodes; ``nbytes``
    (nccl-tests conventions). Bus bandwidths in bytes/s: ``measured_Bps`` and the catalogue
    model's ``expected_Bps``; ``ratio`` = measured / expected; ``threshold`` the ratio below
    which it is short and ``threshold_source`` why. ``published``: a published run of the same
    fabric and scale, ``published_ratio`` the measured busbw at its size over its busbw (None
    when that size was not measured). ``short``: the reason it is flagged, "" when it is not."""

    scope: str
    op: str
    group_size: int
    nodes: int
    nbytes: int
    measured_Bps: float
    expected_Bps: float
    ratio: float
    threshold: float
    threshold_source: str
    published: PublishedBusBw | None = None
    published_ratio: float | None = None
    short: str = ""


@dataclass(frozen=True)
class PlanCost:
    """A plan's step time (seconds) priced with the catalogue's links and with the measured
    ones (everything else the same), and the calibration's notes."""

    plan: str
    catalog_step_s: float
    measured_step_s: float
    notes: tuple[str, ...] = ()

    @property
    def slowdown(self) -> float:
        """measured / catalogue step time (dimensionless)."""
        return self.measured_step_s / self.catalog_step_s


@dataclass(frozen=True)
class CheckReport:
    """What ``calibrate --check`` found on ``cluster`` (the reference's name): ``verdicts``, one
    per measured group and op at its largest size; ``points``, every size; ``cost`` (None when
    no plan was given or it could not be re-estimated; ``notes`` say why)."""

    cluster: str
    verdicts: tuple[LinkVerdict, ...]
    points: tuple[LinkVerdict, ...]
    cost: PlanCost | None = None
    notes: tuple[str, ...] = ()

    @property
    def short(self) -> tuple[LinkVerdict, ...]:
        """The flagged verdicts."""
        return tuple(v for v in self.verdicts if v.short)

    def to_dict(self) -> dict:
        """A JSON-ready dict (bytes/s, seconds)."""
        return asdict(self)


def reference_cluster(cal: Calibration, cluster: Cluster | str | None = None) -> Cluster | None:
    """The cluster the measurements are held against: ``cluster`` (a spec or Cluster), else the
    measured GPU's catalogue node at the measured layout; None for a device with no catalogue
    row (a CPU) when none is given."""
    if cluster is not None:
        return cluster if isinstance(cluster, Cluster) else Cluster.from_spec(cluster)
    if cal.device.catalog in DEVICES:
        w = cal.world
        return Cluster.custom(w.num_nodes, w.local_world_size, DEVICES[cal.device.catalog])
    return None


def _threshold(threshold: float | None, nbytes: int) -> tuple[float, str]:
    if threshold is not None:
        return threshold, "set by the user"
    floor, row = healthy_floor(nbytes)
    return floor, (f"lowest ratio to the catalogue of a healthy published run near this size: "
                   f"{row.op} of {row.nbytes / 2 ** 20:.0f} MiB on {row.spec} "
                   f"({row.busbw_Bps / 1e9:.1f} GB/s; {row.source.split(' (')[0]})")


def check_links(calibration: Calibration | str | Path | dict, cluster: Cluster | str | None = None,
                threshold: float | None = None) -> CheckReport:
    """Set the calibration's collectives against the catalogue's model of ``cluster``
    (:func:`reference_cluster`) and published nccl-tests runs; flag short links (module
    docstring). ``threshold``: the ratio to the catalogue below which a link is short, in
    (0, 1]; None takes the published runs' floor at each size.

    Raises:
        InvalidCalibration: an invalid file, no collectives, no reference cluster for the
            measured device, or a threshold outside (0, 1].
    """
    cal = load_calibration(calibration)
    if threshold is not None and not 0 < threshold <= 1:
        raise InvalidCalibration(f"--threshold must be in (0, 1]; got {threshold}. Fix: e.g. "
                                 "0.8 flags links below 80% of the catalogue's bus bandwidth.")
    ref = reference_cluster(cal, cluster)
    if ref is None:
        raise InvalidCalibration(
            f"{cal.device.name} has no catalogue row to check the links against. Fix: pass "
            "--cluster SPEC (or cluster=) naming the fabric these links should match.")
    samples = [s for s in cal.collectives if s.op in CHECK_OPS]
    if not samples:
        raise InvalidCalibration("no collectives to check (one process measures none). Fix: "
                                 "run `autopar calibrate --check` under torchrun with several "
                                 "processes.")
    points, notes = [], []
    for s in samples:
        fits = s.group_size <= (ref.gpus_per_node if s.scope == "intra" else ref.num_nodes)
        pred = predicted_seconds(ref, s) if fits else float("nan")
        if not pred > 0:
            notes.append(f"{s.scope} {s.op} over {s.group_size} ranks does not fit {ref.name}: "
                         "not compared.")
            continue
        f = bus_factor(s.op, s.group_size)
        thr, src = _threshold(threshold, s.nbytes)
        points.append(LinkVerdict(s.scope, s.op, s.group_size, s.nodes, s.nbytes,
                                  s.nbytes / s.seconds * f, s.nbytes / pred * f,
                                  pred / s.seconds, thr, src))
    verdicts = []
    for key in dict.fromkeys((p.scope, p.group_size, p.op) for p in points):
        mine = [p for p in points if (p.scope, p.group_size, p.op) == key]
        top = max(mine, key=lambda p: p.nbytes)
        verdicts.append(_verdict(top, mine, ref))
    if cal.world.local_world_size != ref.gpus_per_node and any(
            v.scope == "inter" for v in verdicts):
        notes.append(f"rails were measured with {cal.world.local_world_size} ranks per node "
                     f"sharing the NICs; {ref.name} has {ref.gpus_per_node} GPUs per node.")
    return CheckReport(ref.name, tuple(verdicts), tuple(points), None, tuple(dict.fromkeys(notes)))


def _verdict(top: LinkVerdict, mine: list[LinkVerdict], ref: Cluster) -> LinkVerdict:
    """``top`` (the largest size) with its published comparison and its flag."""
    pub, pub_ratio = None, None
    if top.scope == "intra" and top.group_size == ref.gpus_per_node:
        rows = published_for(ref, top.op)
        sizes = {p.nbytes: p for p in mine}
        same = [r for r in rows if r.nbytes in sizes]
        pub = same[0] if same else (rows[0] if rows else None)
        if same:
            pub_ratio = sizes[pub.nbytes].measured_Bps / pub.busbw_Bps
    short = ""
    if top.ratio < top.threshold:
        short = (f"{top.ratio:.2f} of the catalogue's bus bandwidth, below {top.threshold:.2f}")
    if pub_ratio is not None and pub_ratio < PUBLISHED_TOLERANCE:
        short += ("; " if short else "") + (
            f"{pub_ratio:.2f} of the published {pub.busbw_Bps / 1e9:.1f} GB/s at "
            f"{pub.nbytes / 2 ** 30:.0f} GiB, below {PUBLISHED_TOLERANCE:.3f}")
    return LinkVerdict(**{**asdict(top), "published": pub, "published_ratio": pub_ratio,
                          "short": short})


def plan_cost(plan, calibration: Calibration | str | Path | dict,
              cluster: Cluster | None = None) -> PlanCost:
    """``plan`` (a :class:`~autopar.Plan` or a plan file) re-estimated with the catalogue's
    links and with the calibration's measured ones (``cluster``: for a plan of a custom-named
    cluster). The calibration's notes and fit warnings are returned, not issued.

    Raises:
        InvalidPlanFile / InvalidCalibration: a bad plan, or a calibration of other hardware
            or whose collectives cannot be fitted.
    """
    from ..plan import Plan, read_plan_json
    cal = load_calibration(calibration)
    # a Plan's dict as its file holds it (lists, not tuples): check_plan reads files
    d = json.loads(json.dumps(plan.to_dict())) if isinstance(plan, Plan) else read_plan_json(plan)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        base = Plan.from_dict(d, cluster=cluster)
        measured = Plan.from_dict(d, cluster=cluster, calibration=cal)
    c = base.config
    label = (f"{base.model} on {base.cluster}: tp {c.tp}, pp {c.pp}, dp {c.dp}, cp {c.cp}, "
             f"zero {c.zero_stage}")
    return PlanCost(label, base.estimate.step_time_s, measured.estimate.step_time_s,
                    tuple(dict.fromkeys(str(w.message) for w in caught)))


def with_cost(report: CheckReport, cost: PlanCost | None, note: str | None = None
              ) -> CheckReport:
    """``report`` with ``cost`` and an extra note."""
    notes = report.notes + ((note,) if note else ())
    return CheckReport(report.cluster, report.verdicts, report.points, cost, notes)


def measure_links(device, min_bytes: int | None = None, max_bytes: int | None = None,
                  budget_s: float = 300.0, catalog: str | None = None) -> Calibration:
    """Measure the check's collectives (:data:`CHECK_OPS` over a node's ranks and the rails,
    sizes x4 from ``min_bytes`` to ``max_bytes``, default :data:`GPU_SIZES` /
    :data:`CPU_SIZES`) on every rank of the initialised process group, within ``budget_s``;
    returns a calibration holding only them (the same on every rank), which ``--calibration``
    and :func:`check_links` read.

    Raises:
        InvalidCalibration: a world of one process, or ``catalog`` not a catalogue GPU.
    """
    import datetime
    import time

    import torch
    import torch.distributed as dist

    from .bench import Clock
    from .comm_bench import bench_collectives, check_group_sets, sizes
    from .run import device_info, world_layout
    from .schema import measured_fields
    world = world_layout()
    if world.world_size < 2:
        raise InvalidCalibration("one process measures no collectives. Fix: run `autopar "
                                 "calibrate --check` under torchrun with several processes.")
    lo, hi = GPU_SIZES if device.type == "cuda" else CPU_SIZES
    clock = Clock(time.monotonic() + budget_s, device)
    coll = bench_collectives(world.world_size, world.local_world_size,
                             sizes(min_bytes or lo, max_bytes or hi), device, clock,
                             check_group_sets(world.world_size, world.local_world_size),
                             CHECK_OPS)
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Calibration(created=created, torch=torch.__version__, backend=dist.get_backend(),
                       device=device_info(device, catalog), world=world, model=None, seq_len=1,
                       precision="bf16" if device.type == "cuda" else "fp32",
                       measured_fields=measured_fields((), (), None, coll), gemm=(),
                       attention=(), memory=None, collectives=tuple(coll),
                       notes=tuple(clock.notes))
