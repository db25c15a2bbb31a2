"""Map a :class:`Calibration` onto the cost model's constants (fits of the user's own
measurements; docs/calibrate.md).

* GEMMs -> ``CostParams.matmul_efficiency[architecture]`` and ``matmul_half_size``: the
  efficiency curve ``ceiling * f(m) f(k) f(n) / f(16384)^3``, ``f(x) = x / (x + half)``
  (:meth:`CostParams.gemm_efficiency`), fitted to achieved / peak FLOP/s by least squares on
  relative error: ``half`` on a geometric grid, ``ceiling`` in closed form for each.
* Attention -> ``attention_efficiency``: the cost model prices forward + backward at
  (1 + 2.5) x counted FLOPs x causal work / (peak x efficiency); solved for the measured
  forward+backward time (median over samples).
* Copy -> ``hbm_efficiency`` = measured bytes/s / datasheet HBM bytes/s; the tiny-kernel time
  -> ``kernel_launch_s``.
* Collectives -> alpha-beta: ``seconds = launch + steps x alpha + volume / bandwidth`` with the
  steps and volume of the algorithm ``hardware.collectives`` uses for that op and group (ring
  for all_reduce / all_gather / reduce_scatter; all_to_all one step per round of peers NCCL
  runs at once; direct send/recv), fitted by non-negative least squares on relative error;
  intra-node groups give the intra link's bandwidth and alpha and the launch latency, rail
  groups across nodes the per-GPU NIC share and the network alpha. The fitted figures replace
  the links (efficiency 1: the fit is already what the GPUs achieve).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from ..cost.params import CostParams
from ..errors import InvalidCalibration
from ..graph.kernels import ATTENTION_BACKWARD_RATIO
from ..hardware import Cluster
from ..hardware.collectives import Fabric, GroupLayout, all_to_all_waves
from ..hardware.comm_params import CommParams
from ..hardware.devices import Device
from ..hardware.links import LinkType
from .schema import Calibration, CollectiveSample, load_calibration

#: Grid of ``matmul_half_size`` values the GEMM fit tries (elements; 4 to 16384, 2^(1/4) steps).
HALF_SIZE_GRID = tuple(4.0 * 2 ** (i / 4) for i in range(49))

#: Only the p2p channel count of this fabric is read (:func:`algorithm_terms`): NCCL's default
#: 32 (src/graph/paths.cc ``NCCL_MAX_P2P_NCHANNELS``); the rates are placeholders.
_DEFAULT_P2P = Fabric(1.0, 1.0, 0.0, 0.0, 0.0)

#: Largest root-mean-square relative error of a fit (GEMM curve, alpha-beta) on its own
#: measurements that passes without a warning. 0.25 is about 3x the cost model's own error on
#: published runs (a 68% band of about +-9%, ``autopar.cost.published.BANDS``): a fit that
#: misses the very timings it was made from by more does not describe them (noisy timings on a
#: loaded machine, or hardware whose times do not follow the model's curve, as a CPU's GEMMs),
#: and its constants would add more error to a prediction than the datasheet's remove.
FIT_WARN_RMS_REL_ERROR = 0.25


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted collective model: ``launch_s + steps * alpha_s + volume / bandwidth_Bps``.

    ``points`` samples were fitted; ``rms_rel_error`` is the root-mean-square relative error of
    the fit on them (dimensionless)."""

    launch_s: float
    alpha_s: float
    bandwidth_Bps: float
    points: int
    rms_rel_error: float


@dataclass(frozen=True)
class Calibrated:
    """The cost model's inputs after a calibration: the cluster (links and comm constants
    replaced where measured, same name), the :class:`CostParams`, the fitted figures by field
    name (what replaced what), notes on what was not measured or does not transfer, and
    warnings on fits that miss their own measurements (:data:`FIT_WARN_RMS_REL_ERROR`)."""

    cluster: Cluster
    params: CostParams
    fitted: dict
    notes: tuple[str, ...]
    #: fits that reproduce their own measurements poorly (:func:`fit_warning`): the constants
    #: they set are suspect
    warnings: tuple[str, ...] = ()


def algorithm_terms(op: str, n: int, nbytes: float, nodes: int = 1) -> tuple[float, float]:
    """(alpha steps, bytes over the bottleneck link) of ``op`` on ``n`` ranks over ``nodes``
    nodes (one rank per node, or all on one node), as ``hardware.collectives`` costs it: ring
    all_reduce 2(n-1) steps and 2(n-1)/n bytes; ring all_gather / reduce_scatter n-1 and
    (n-1)/n; all_to_all (n-1)/n bytes and one step per round of peers NCCL runs at once
    (:func:`autopar.hardware.collectives.all_to_all_waves` at NCCL's default 32 p2p channels);
    send_recv 1 and the message. The all-to-all's proxy posts across nodes
    (``all_to_all_net_posts_s``, NCCL's own per-post constant) are not separated: a fit of
    inter-node all-to-alls carries them in its alpha."""
    if op == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n * nbytes
    if op == "all_to_all":
        layout = GroupLayout(n, nodes, -(-n // nodes), n // nodes, nodes > 1)
        return float(all_to_all_waves(layout, _DEFAULT_P2P)), (n - 1) / n * nbytes
    if op in ("all_gather", "reduce_scatter"):
        return float(n - 1), (n - 1) / n * nbytes
    return 1.0, float(nbytes)


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few unknowns: the best feasible solution over every
    subset of free variables (exact for <= 4 unknowns; deterministic)."""
    k = a.shape[1]
    best, best_err = np.zeros(k), float(np.sum(b ** 2))
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            x_sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x_sub < 0):
                continue
            x = np.zeros(k)
            x[list(cols)] = x_sub
            err = float(np.sum((a @ x - b) ** 2))
            if err < best_err - 1e-15:
                best, best_err = x, err
    return best


def fit_alpha_beta(samples: list[CollectiveSample], launch_s: float | None = None) -> AlphaBeta:
    """Fit ``seconds = launch + steps * alpha + volume * (1 / bandwidth)`` to ``samples``
    (:func:`algorithm_terms` gives steps and volume), minimising relative error, all terms
    >= 0. ``launch_s`` given: held fixed (the inter-node fit reuses the intra-node launch).

    Raises:
        InvalidCalibration: no sample moves bytes, or the fit finds no bandwidth term (times do
            not grow with size: sizes too small to measure bandwidth).
    """
    rows, rhs = [], []
    for s in samples:
        steps, vol = algorithm_terms(s.op, s.group_size, s.nbytes, s.nodes)
        t = s.seconds - (launch_s or 0.0)
        rows.append(([steps, vol] if launch_s is not None else [1.0, steps, vol]))
        rhs.append(t)
    a = np.array(rows, dtype=float)
    b = np.array(rhs, dtype=float)
    w = 1.0 / np.array([s.seconds for s in samples])
    x = _nnls(a * w[:, None], b * w)
    launch, alpha, inv_bw = (launch_s, *x) if launch_s is not None else tuple(x)
    if not inv_bw > 0:
        raise InvalidCalibration(
            "the collective times do not grow with message size, so no bandwidth can be fitted. "
            "Fix: rerun `autopar calibrate` with a larger --max-bytes.")
    pred = a @ x + (launch_s or 0.0)
    meas = np.array([s.seconds for s in samples])
    rms = float(np.sqrt(np.mean(((pred - meas) / meas) ** 2)))
    return AlphaBeta(float(launch), float(alpha), float(1.0 / inv_bw), len(samples), rms)


def fit_gemm(cal: Calibration, peak_flops: float) -> tuple[float, float, float]:
    """(ceiling, half_size, rms relative error) of the GEMM efficiency curve fitted to the
    measured GEMMs' achieved / ``peak_flops`` (FLOP/s). See the module docstring."""
    ys = np.array([g.flops_per_s / peak_flops for g in cal.gemm])
    best = None
    for h in HALF_SIZE_GRID:
        ref = (16384 / (16384 + h)) ** 3
        gs = np.array([(g.m / (g.m + h)) * (g.k / (g.k + h)) * (g.n / (g.n + h)) / ref
                       for g in cal.gemm])
        u = gs / ys  # minimise sum((c*g - y)/y)^2: c = sum(u) / sum(u^2)
        c = float(np.sum(u) / np.sum(u * u))
        err = float(np.sqrt(np.mean((c * u - 1) ** 2)))
        if best is None or err < best[2] - 1e-12:
            best = (c, h, err)
    return best


def fit_warning(what: str, rms_rel_error: float, points: int, sets: str,
                unlike: str) -> str | None:
    """A warning when a fit's rms relative error on its ``points`` measurements exceeds
    :data:`FIT_WARN_RMS_REL_ERROR` (``what`` names the fit, ``sets`` the constants it gives,
    ``unlike`` hardware known not to follow its model); None for a good fit."""
    if not rms_rel_error > FIT_WARN_RMS_REL_ERROR:
        return None
    return (f"the {what} fit misses its own {points} measurements by {rms_rel_error:.0%} rms "
            f"(warned above {FIT_WARN_RMS_REL_ERROR:.0%}): {sets} do not describe this hardware, "
            "and predictions priced with them can be off by as much. The timings are noisy (a "
            f"busy machine) or do not follow the fitted model ({unlike}). Fix: rerun `autopar "
            "calibrate` on an idle machine, or plan without the calibration.")


def measured_device(cal: Calibration) -> Device:
    """A :class:`Device` made of the calibration's own figures, for a device the catalogue has
    no row for (a CPU, an unlisted GPU): its "peak" is the fastest measured GEMM (there is no
    datasheet figure to hold it against), its memory bandwidth the measured copy, its memory
    the measured device's.

    Raises:
        InvalidCalibration: the file has no GEMM or copy measurement.
    """
    if not cal.gemm or cal.memory is None:
        raise InvalidCalibration("a device built from a calibration needs its GEMM and copy "
                                 "measurements. Fix: rerun `autopar calibrate` without skipping "
                                 "compute benchmarks.")
    peak = max(g.flops_per_s for g in cal.gemm)
    bw = cal.memory.bandwidth_Bps
    return Device(
        name=f"measured-{cal.device.kind}", peak_flops={cal.precision: peak},
        memory_bytes=cal.device.memory_bytes, hbm_bandwidth_Bps=bw, nvlink_bandwidth_Bps=0.0,
        pcie_bandwidth_Bps=bw, form_factor="pcie",
        source=(f"autopar calibrate {cal.created} on {cal.device.name}: peak = fastest measured "
                f"{cal.precision} GEMM (no datasheet peak), memory bandwidth = measured copy"))


def measured_cluster(cal: Calibration | str | Path | dict) -> Cluster:
    """The cluster the calibration ran on, with :func:`measured_device` as its device (a
    catalogue GPU's calibration uses the catalogue row: plan with its spec instead) and
    measured links: ``calibrated(measured_cluster(cal), ..., cal)`` then prices plans for the
    machine itself. Nodes = the calibration's nodes, GPUs per node = its local ranks. ``cal`` may
    be a file path (loaded strictly).

    Raises:
        InvalidCalibration: a path whose file is not a valid calibration.
    """
    cal = load_calibration(cal)
    device = measured_device(cal)
    w = cal.world
    intra = LinkType("intra", "pcie", device.pcie_bandwidth_Bps, 0.0,
                     "placeholder until calibrated() replaces it with the fit")
    inter = (LinkType("inter", "ethernet", device.pcie_bandwidth_Bps, 0.0,
                      "placeholder until calibrated() replaces it with the fit")
             if w.num_nodes > 1 else None)
    return Cluster.custom(w.num_nodes, w.local_world_size, device, intra=intra, inter=inter,
                          nics_per_node=w.local_world_size if w.num_nodes > 1 else 0,
                          name=f"{w.num_nodes}x{w.local_world_size}x{device.name}")


def check_applies(cal: Calibration, cluster: Cluster, precision: str) -> None:
    """Refuse a calibration that does not describe ``cluster``'s GPU at ``precision``.

    Raises:
        InvalidCalibration: measured on a CPU or another GPU than the cluster's, or at
            another precision (GEMM and attention efficiencies are per precision).
    """
    name = cluster.device.name
    own = name == f"measured-{cal.device.kind}"
    if not own and cal.device.catalog != name:
        what = ("a CPU, which cannot stand for a GPU" if cal.device.kind == "cpu" else
                f"{cal.device.name} (catalogue {cal.device.catalog or 'none'})")
        raise InvalidCalibration(
            f"this calibration was measured on {what}; the cluster's GPU is {name}. Fix: run "
            f"`autopar calibrate` on the cluster's {name} GPUs and pass that file, or drop "
            "--calibration / calibration= to use the datasheet constants.")
    if precision != cal.precision and (cal.gemm or cal.attention):
        raise InvalidCalibration(
            f"this calibration measured {cal.precision} GEMMs and attention; the plan trains in "
            f"{precision}. Fix: rerun `autopar calibrate --precision {precision}`, or plan in "
            f"{cal.precision}.")


def calibrated(cluster: Cluster, params: CostParams | None, cal: Calibration,
               precision: str) -> Calibrated:
    """``cluster`` and ``params`` with the constants the calibration measured replaced by the
    fits of the module docstring; the rest kept (and named in ``notes``).

    Raises:
        InvalidCalibration: see :func:`check_applies`; or collectives too small to fit.
    """
    check_applies(cal, cluster, precision)
    params = params or CostParams()
    dev = cluster.device
    fitted, notes, changes, warns = {}, [], {}, []
    if cal.gemm:
        ceiling, half, err = fit_gemm(cal, dev.peak(precision))
        eff = dict(params.matmul_efficiency) if not isinstance(
            params.matmul_efficiency, (int, float)) else {}
        eff[dev.architecture] = ceiling
        changes.update(matmul_efficiency=MappingProxyType(eff), matmul_half_size=half)
        fitted["CostParams.matmul_efficiency"] = {dev.architecture: ceiling}
        fitted["CostParams.matmul_half_size"] = half
        fitted["gemm_fit_rms_rel_error"] = err
        warns.append(fit_warning("GEMM efficiency curve", err, len(cal.gemm),
                                 "matmul_efficiency and matmul_half_size", "a CPU's GEMMs "
                                 "need not"))
        if dev.name == f"measured-{cal.device.kind}":
            notes.append(f"{cal.device.name} has no datasheet peak: efficiencies are relative "
                         "to its fastest measured GEMM.")
        elif ceiling > 1:
            notes.append(f"measured GEMMs reach {ceiling:.2f} x the datasheet peak of {dev.name} "
                         f"at 16k^3 (clocks above the datasheet's, or another GPU model).")
    if cal.attention:
        peak = dev.peak(precision)
        effs = sorted(a.counted_flops * (params.causal_attention_work if a.causal else 1.0)
                      * (1 + ATTENTION_BACKWARD_RATIO) / (a.fwd_bwd_s * peak)
                      for a in cal.attention)
        changes["attention_efficiency"] = effs[len(effs) // 2]
        fitted["CostParams.attention_efficiency"] = changes["attention_efficiency"]
    if cal.memory is not None:
        changes["hbm_efficiency"] = cal.memory.bandwidth_Bps / dev.hbm_bandwidth_Bps
        changes["kernel_launch_s"] = cal.memory.launch_s
        fitted["CostParams.hbm_efficiency"] = changes["hbm_efficiency"]
        fitted["CostParams.kernel_launch_s"] = cal.memory.launch_s
    new_params = dataclasses.replace(params, **changes)
    new_cluster = _calibrated_links(cluster, cal, fitted, notes, warns)
    return Calibrated(new_cluster, new_params, fitted, tuple(notes),
                      tuple(w for w in warns if w))


def _calibrated_links(cluster: Cluster, cal: Calibration, fitted: dict, notes: list,
                      warns: list) -> Cluster:
    intra_s = [c for c in cal.collectives if c.scope == "intra"]
    inter_s = [c for c in cal.collectives if c.scope == "inter"]
    if not cal.collectives:
        notes.append("no collectives measured (one process): links keep their catalogue "
                     "figures. Fix: run calibrate under torchrun with several processes.")
        return cluster
    eff = dict(cluster.comm_params.efficiency)
    launch = cluster.comm_params.launch_latency_s
    intra_link, inter_link = cluster.intra_link, cluster.inter_link
    src = f"autopar calibrate {cal.created} on {cal.device.name}"
    if intra_s:
        ab = fit_alpha_beta(intra_s)
        launch = ab.launch_s
        intra_link = LinkType(f"{intra_link.name}-measured", intra_link.kind, ab.bandwidth_Bps,
                              ab.alpha_s, f"{src}: alpha-beta fit of {ab.points} intra-node "
                              f"collectives (rms relative error {ab.rms_rel_error:.2f})")
        eff[intra_link.kind] = 1.0
        fitted["Cluster.intra_link.bandwidth_Bps"] = ab.bandwidth_Bps
        fitted["Cluster.intra_link.latency_s"] = ab.alpha_s
        fitted["CommParams.launch_latency_s"] = ab.launch_s
        fitted["intra_fit_rms_rel_error"] = ab.rms_rel_error
        warns.append(fit_warning("intra-node alpha-beta", ab.rms_rel_error, ab.points,
                                 "the intra-node link's bandwidth and latency",
                                 "gloo on a shared CPU need not"))
        if cluster.gpus_per_node > cal.world.local_world_size:
            notes.append(f"intra-node groups measured up to {cal.world.local_world_size} GPUs; "
                         f"the cluster has {cluster.gpus_per_node} per node (extrapolated).")
    if inter_s and cluster.inter_link is not None and cluster.num_nodes > 1:
        ab = fit_alpha_beta(inter_s, launch_s=launch if intra_s else None)
        if not intra_s:
            launch = ab.launch_s
            fitted["CommParams.launch_latency_s"] = ab.launch_s
        # the fit is bytes/s per GPU with all local ranks using the NICs at once; Cluster.fabric
        # divides the node's NIC bandwidth by gpus_per_node
        per_gpu = ab.bandwidth_Bps
        bw = per_gpu * cluster.gpus_per_node / max(cluster.nics_per_node, 1)
        inter_link = LinkType(f"{inter_link.name}-measured", inter_link.kind, bw, ab.alpha_s,
                              f"{src}: alpha-beta fit of {ab.points} inter-node collectives "
                              f"({per_gpu / 1e9:.2f} GB/s per GPU; rms relative error "
                              f"{ab.rms_rel_error:.2f})")
        eff[inter_link.kind] = 1.0
        fitted["Cluster.inter_link.bandwidth_Bps"] = bw
        fitted["Cluster.inter_link.latency_s"] = ab.alpha_s
        fitted["inter_fit_rms_rel_error"] = ab.rms_rel_error
        warns.append(fit_warning("inter-node alpha-beta", ab.rms_rel_error, ab.points,
                                 "the inter-node link's bandwidth and latency",
                                 "gloo on a shared CPU need not"))
        if cluster.gpus_per_node != cal.world.local_world_size:
            notes.append(f"the NIC share was measured with {cal.world.local_world_size} ranks "
                         f"per node; the cluster has {cluster.gpus_per_node}.")
    elif cluster.num_nodes > 1:
        notes.append("inter-node links were not measured (the calibration ran on one node): "
                     "they keep their catalogue figures. Fix: calibrate across two nodes.")
    comm = CommParams(efficiency=eff, launch_latency_s=launch)
    return dataclasses.replace(cluster, intra_link=intra_link, inter_link=inter_link,
                               comm_params=comm)


def predicted_seconds(cluster: Cluster, sample: CollectiveSample) -> float:
    """What ``cluster``'s collective model says ``sample`` takes (groups laid out as measured:
    ``intra`` on one node's first ranks, ``inter`` one rank per node)."""
    if sample.scope == "intra":
        ranks = list(range(sample.group_size))
    else:
        ranks = [i * cluster.gpus_per_node for i in range(sample.group_size)]
    if max(ranks) >= cluster.world_size:
        return math.nan
    return cluster.collective_time(sample.op, sample.nbytes, ranks)
