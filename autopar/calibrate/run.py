"""``autopar calibrate``: measure this machine (or every node of a torchrun job) and write a
calibration file; and the measured-against-catalogue comparison it prints.

Under ``torchrun`` the process group comes from its environment (NCCL on GPUs, gloo on CPUs);
as a plain process it is a world of one (compute benchmarks only). A test may initialise the
process group itself (e.g. gloo over a FileStore) before calling :func:`run_calibration`.
"""

from __future__ import annotations

import datetime
import os
import re
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..problem import model_graph
from ..config import TrainingConfig
from ..cost.params import CostParams
from ..errors import InvalidCalibration
from ..hardware import Cluster
from ..hardware.devices import DEVICES, Device
from ..models import get_config
from .bench import Clock, attention_shape, bench_attention, bench_gemms, bench_memory, gemm_shapes
from .comm_bench import bench_collectives, sizes
from .fit import calibrated, fit_alpha_beta, fit_gemm, measured_cluster, predicted_seconds
from .schema import PRECISIONS, Calibration, DeviceInfo, World, measured_fields

#: Default time budget of the whole run (seconds): the issue's 5 minutes.
DEFAULT_BUDGET_S = 300.0
_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
           "fp16": torch.float16}


@dataclass(frozen=True)
class Options:
    """What to measure. ``model``: preset name or model dict whose GEMM and attention shapes are
    measured (None: none); ``seq_len``; ``precision`` of GEMMs and attention (default bf16 on a
    GPU, fp32 on a CPU); ``budget_s``: total seconds (benchmarks stop, on every rank together,
    past it); ``min_bytes`` / ``max_bytes``: the collective size sweep; ``copy_bytes``: the memory
    copy; ``catalog``: the catalogue GPU name, when the automatic match is wrong."""

    model: object = "llama3-8b"
    seq_len: int | None = None
    precision: str | None = None
    budget_s: float = DEFAULT_BUDGET_S
    min_bytes: int | None = None
    max_bytes: int | None = None
    copy_bytes: int | None = None
    catalog: str | None = None


def match_catalog(name: str, memory_bytes: float) -> str | None:
    """The catalogue GPU a torch device name is (``"NVIDIA H100 80GB HBM3"`` ->
    ``"H100-SXM5-80GB"``, ``"AMD Instinct MI300X"`` -> ``"MI300X-192GB"``): same model number
    (A100, A800, H100, H800, H200, H20, B200, B300, GB200, GB300, MI300X, MI325X, MI355X), PCIe
    or SXM as the name says, and the memory size closest to ``memory_bytes``; None when nothing
    matches."""
    m = re.search(r"\b(GB\d{3}|[ABH]\d{2,3}|MI\d{3}X?)\b", name.upper().replace("-", " "))
    if not m:
        return None
    pcie = "PCIE" in name.upper()
    rows = [d for d in DEVICES.values() if d.name.upper().split("-")[0] == m.group(1)
            and (d.form_factor == "pcie") == pcie]
    if not rows:
        return None
    return min(rows, key=lambda d: (abs(d.memory_bytes - memory_bytes), d.name)).name


def device_info(device: torch.device, catalog: str | None) -> DeviceInfo:
    """What a calibration file records of ``device``: kind, torch's name (a CPU's names its
    architecture and thread count), catalogue GPU (``catalog``, else :func:`match_catalog`),
    memory in bytes.

    Raises:
        InvalidCalibration: ``catalog`` is not a catalogue GPU.
    """
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = props.name
        mem = float(props.total_memory)
        found = catalog or match_catalog(name, mem)
        if found is not None and found not in DEVICES:
            raise InvalidCalibration(f"--device {found!r} is not a catalogue GPU. Fix: use one "
                                     f"of {list(DEVICES)}.")
        return DeviceInfo("cuda", name, found, mem)
    mem = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return DeviceInfo("cpu", f"cpu ({os.uname().machine}, {os.cpu_count()} threads)", None, mem)


def init_distributed(single_group: bool = False) -> tuple[torch.device, bool]:
    """Initialise the default process group from torchrun's environment if there is one and
    none exists yet; a plain process stays a world of one: no group, or with ``single_group``
    a group of one rank over an in-memory store. Returns (this rank's device, whether this call
    created the group and should destroy it)."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if dist.is_initialized() or ("RANK" not in os.environ and not single_group):
        return device, False
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if cuda else "gloo")
    else:
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
    return device, True


def world_layout() -> World:
    """World size, ranks per node (torchrun's LOCAL_WORLD_SIZE; all ranks when unset) and
    nodes."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world % local:
        raise InvalidCalibration(f"LOCAL_WORLD_SIZE={local} does not divide the world size "
                                 f"{world}. Fix: start the same number of processes per node.")
    return World(world, local, world // local)


def run_calibration(opts: Options, device: torch.device, progress=None,
                    now=None) -> Calibration:
    """Run every benchmark within ``opts.budget_s`` and return the calibration (the same on
    every rank). The process group, if any, must be initialised.

    The memory copy runs first (cheap, and :func:`~.fit.measured_cluster` needs it), then the
    GEMMs, attention and the collectives. A benchmark whose predicted time exceeds the budget
    left is skipped and the run stops at the deadline, keeping what it measured; the file's
    ``notes`` say what was skipped. ``progress``: a callable given one line per step (None:
    silent); ``now``: the clock in seconds (None: ``time.monotonic``; a test's fake clock).

    Raises:
        InvalidCalibration / InvalidModelConfig: a bad option or model.
    """
    now = now or time.monotonic
    start = now()
    precision = opts.precision or ("bf16" if device.type == "cuda" else "fp32")
    if precision not in PRECISIONS:
        raise InvalidCalibration(f"precision {precision!r} cannot be measured; use one of "
                                 f"{list(PRECISIONS)}.")
    if precision == "tf32" and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    info = device_info(device, opts.catalog)
    world = world_layout()
    clock = Clock(start + opts.budget_s, device, now=now, progress=progress)
    gemm, attention, seq_len, model_name = [], [], opts.seq_len or 0, None
    dtype = _DTYPES[precision]
    gpu = device.type == "cuda"
    copy = opts.copy_bytes or (2 ** 30 if gpu else 2 ** 26)
    memory = bench_memory(copy, device, clock)
    if opts.model is not None:
        cfg = get_config(opts.model)
        seq_len = opts.seq_len or cfg.seq_len
        graph, _ = model_graph(cfg, TrainingConfig(global_batch_size=1, seq_len=seq_len,
                                                       precision="bf16"))
        model_name = cfg.name
        gemm = bench_gemms(gemm_shapes(graph), dtype, device, clock)
        rate = max((2.0 * g.m * g.k * g.n / g.seconds for g in gemm), default=0.0)
        attention = bench_attention(attention_shape(graph), dtype, device, clock, rate)
    coll = []
    if world.world_size > 1:
        lo = opts.min_bytes or (2 ** 12 if gpu else 2 ** 10)
        hi = opts.max_bytes or (2 ** 28 if gpu else 2 ** 20)
        coll = bench_collectives(world.world_size, world.local_world_size, sizes(lo, hi),
                                 device, clock)
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Calibration(
        created=created, torch=torch.__version__,
        backend=dist.get_backend() if dist.is_initialized() else "none", device=info,
        world=world, model=model_name, seq_len=max(seq_len, 1), precision=precision,
        measured_fields=measured_fields(gemm, attention, memory, coll), gemm=tuple(gemm),
        attention=tuple(attention), memory=memory, collectives=tuple(coll),
        notes=tuple(clock.notes))


def flops_text(flops_per_s: float) -> str:
    """FLOP/s in the largest of T, G, M, k that keeps the figure >= 1 (a CPU's GEMMs read
    "67.39 GFLOP/s", not "0.07 TFLOP/s", or "0.00" on a slower one)."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.2f} {prefix}FLOP/s"
    return f"{flops_per_s:.2f} FLOP/s"


def ceiling_text(fraction: float, ref_flops_per_s: float, of: str) -> str:
    """A GEMM efficiency ceiling with its unit: "0.410 of peak = 127.92 TFLOP/s", or on a CPU
    (``of`` "the fastest GEMM", a ratio that may exceed 1) "3.2x the fastest GEMM = 210.40
    GFLOP/s"; FLOP/s as :func:`flops_text` writes them."""
    rate = flops_text(fraction * ref_flops_per_s)
    if fraction <= 1:
        return f"{fraction:.3f} of {of} = {rate}"
    return f"{fraction:,.{1 if fraction < 1000 else 0}f}x {of} = {rate}"


def _base(cal: Calibration) -> tuple[Device | None, Cluster | None]:
    """(catalogue device or None, the cluster the calibration ran on or None): the catalogue
    GPU's default node, else :func:`measured_cluster` when the file can build one."""
    cat = DEVICES.get(cal.device.catalog) if cal.device.catalog else None
    if cat is not None:
        w = cal.world
        return cat, Cluster.custom(w.num_nodes, w.local_world_size, cat)
    return None, (measured_cluster(cal) if cal.gemm and cal.memory else None)


def fit_warnings(cal: Calibration) -> list[str]:
    """The warnings of :func:`calibrated` on the cluster the calibration ran on: each fit that
    misses its own measurements by more than :data:`~.fit.FIT_WARN_RMS_REL_ERROR` rms."""
    _, base = _base(cal)
    return [] if base is None else list(calibrated(base, None, cal, cal.precision).warnings)


def comparison(cal: Calibration) -> list[tuple[str, str, str]]:
    """Rows (quantity, measured, catalogue) of what was measured against the catalogue figures
    (the catalogue GPU's datasheet and its default node's links; "-" for a CPU: no datasheet),
    and how well the fitted collective model reproduces the measured collectives."""
    rows, dflt = [], CostParams()
    cat, base = _base(cal)
    peak = cat.peak(cal.precision) if cat is not None else None
    if cal.gemm:
        best = max(cal.gemm, key=lambda g: g.flops_per_s)
        rows.append((f"GEMM {cal.precision} best ({best.m}x{best.k}x{best.n})",
                     flops_text(best.flops_per_s),
                     f"{peak / 1e12:.0f} TFLOP/s peak" if peak else "- (no datasheet)"))
        # no datasheet: the curve is fitted against the fastest GEMM, as measured_device does
        ref = peak or best.flops_per_s
        c, h, err = fit_gemm(cal, ref)
        rows.append(("GEMM efficiency ceiling (16k^3)" if peak else
                     "GEMM efficiency ceiling (16k^3, of the fastest GEMM)",
                     f"{ceiling_text(c, ref, 'peak' if peak else 'the fastest GEMM')} "
                     f"(half-size {h:.0f}, fit rms {err:.2f}, {len(cal.gemm)} GEMMs)",
                     f"{ceiling_text(dflt.matmul_ceiling(cat.architecture), peak, 'peak')} "
                     f"(half-size {dflt.half_size(cat.architecture):.0f})" if peak
                     else "- (no datasheet)"))
    if cal.attention:
        a = cal.attention[0]
        fl = a.counted_flops * (0.5 if a.causal else 1.0) * 3.5 / a.fwd_bwd_s
        # the datasheet model's figure for this shape: torch SDPA's default kernel (FA2)
        eff = (dflt.attention_ceiling("fa2", cat.architecture)
               * dflt.attention_shape_factor("fa2", a.head_dim, a.seq_len)) if cat else 0.0
        rows.append((f"attention fwd+bwd (s={a.seq_len}, {a.heads} heads)",
                     flops_text(fl), f"{peak * eff / 1e12:.0f}"
                     f" TFLOP/s at efficiency {eff:.3f} (FA2)" if peak and cat
                     else "- (no datasheet)"))
    if cal.memory:
        rows.append(("memory copy", f"{cal.memory.bandwidth_Bps / 1e9:.1f} GB/s",
                     f"{cat.hbm_bandwidth_Bps / 1e9:.0f} GB/s HBM (x{dflt.hbm_efficiency} = "
                     f"{cat.hbm_bandwidth_Bps * dflt.hbm_efficiency / 1e9:.0f})" if cat
                     else "- (no datasheet)"))
        rows.append(("kernel launch floor", f"{cal.memory.launch_s * 1e6:.1f} us",
                     f"{dflt.kernel_launch_s * 1e6:.1f} us (assumed)"))
    for scope in ("intra", "inter"):
        samples = [c for c in cal.collectives if c.scope == scope]
        if not samples:
            continue
        ab = fit_alpha_beta(samples)
        link = base.intra_link if (base and scope == "intra") else (base and base.inter_link)
        cat_bw = "-"
        if cat is not None and link is not None:
            eff = base.comm_params.efficiency[link.kind]
            f = base.fabric()
            per_gpu = f.intra_Bps if scope == "intra" else f.inter_per_gpu_Bps
            cat_bw = (f"{per_gpu / 1e9:.1f} GB/s ({link.name} x {eff:.2f}), alpha "
                      f"{link.latency_s * 1e6:.1f} us")
        rows.append((f"{scope}-node bandwidth per GPU (fit of {ab.points} collectives)",
                     f"{ab.bandwidth_Bps / 1e9:.2f} GB/s, alpha {ab.alpha_s * 1e6:.1f} us, "
                     f"launch {ab.launch_s * 1e6:.1f} us", cat_bw))
    if cal.collectives and base is not None:
        cluster = calibrated(base, None, cal, cal.precision).cluster
        errs = sorted(abs(predicted_seconds(cluster, c) / c.seconds - 1)
                      for c in cal.collectives if predicted_seconds(cluster, c) > 0)
        if errs:
            rows.append(("calibrated model vs measured collectives",
                         f"median |error| {errs[len(errs) // 2] * 100:.0f}%, worst "
                         f"{errs[-1] * 100:.0f}% ({len(errs)} points)", "-"))
    return rows

