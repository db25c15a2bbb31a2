"""The GPU catalog: one :class:`Device` row per GPU model, each with its source.

Figures are dense (no 2:4 sparsity) datasheet peaks in SI units: FLOP/s, bytes, bytes/s. Datasheets
are decimal (1 GB = 1e9 bytes, 1 TB/s = 1e12 bytes/s); nothing here is in GiB. BF16/FP8/HBM/NVLink
figures are the rows of ``docs/reference/hardware_and_formulas.md`` ("Hardware (per GPU)");
FP32, TF32 and the PCIe generation come from the same NVIDIA datasheets (A100, H100, H800, H200), where
TF32 is quoted with sparsity and halved here.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Mapping

from autopar.config import ARCHITECTURES
from autopar.errors import InvalidClusterSpec, InvalidTrainingConfig

#: Precisions a device may list in ``peak_flops``.
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")

FORM_FACTORS: tuple[str, ...] = ("sxm", "pcie")

_TERA = 1e12
_GIGA = 1e9


def picklable(value):
    """A picklable copy of a dataclass field value (mapping proxies become dicts)."""
    return dict(value) if isinstance(value, MappingProxyType) else value




@dataclass(frozen=True)
class Device:
    """One GPU model.

    Attributes:
        name: catalog name, e.g. ``"A100-SXM4-80GB"``.
        peak_flops: dense peak FLOP/s per precision (keys from :data:`PRECISIONS`; ``"fp8"`` only on
            GPUs with FP8 tensor cores). Read it through :meth:`peak`.
        memory_bytes: HBM capacity in bytes, decimal as on the datasheet (80 GB = 80e9).
        hbm_bandwidth_Bps: HBM bandwidth in bytes/s.
        nvlink_bandwidth_Bps: NVLink bandwidth per GPU per direction in bytes/s (datasheet
            bidirectional figure / 2); 0 for none. On PCIe cards this is the optional 2-GPU bridge,
            which the cluster model does not assume.
        pcie_bandwidth_Bps: host PCIe x16 bandwidth per direction in bytes/s (Gen4 32e9, Gen5 64e9).
        form_factor: ``"sxm"`` or ``"pcie"``.
        source: where the figures come from.
        tdp_w: rated board power in watts (datasheet "Max TDP"); 0 = not known.
        power_limit_w: the power cap the GPU runs under (watts); 0 = its rated TDP.
        sm_count: streaming multiprocessors on the GPU (NVIDIA architecture whitepapers; sources
            in :data:`SM_COUNT_SOURCES`); 0 = not known. What share of the GPU a communication
            kernel's thread blocks hold (:mod:`autopar.hardware.nccl`) is read against it.
        capacity_bytes: memory as the framework sees it (``torch.cuda.get_device_properties().
            total_memory``, the "total capacity" of torch's out-of-memory message): the HBM less
            what the driver keeps; None = ``memory_bytes``. Read it through
            :attr:`visible_memory_bytes`. Sources in :data:`VISIBLE_CAPACITY_SOURCES`.

    Raises:
        InvalidClusterSpec: on construction, if a figure is non-positive, a precision key is unknown
            or the form factor is not one of :data:`FORM_FACTORS`.
    """

    name: str
    peak_flops: Mapping[str, float] = field(hash=False)
    memory_bytes: float
    hbm_bandwidth_Bps: float
    nvlink_bandwidth_Bps: float
    pcie_bandwidth_Bps: float
    form_factor: str
    source: str
    tdp_w: float = 0.0
    power_limit_w: float = 0.0

    @property
    def clock_scale(self) -> float:
        """Sustained tensor-core clock under ``power_limit_w`` relative to the rated one:
        ``min(1, (power_limit_w / tdp_w) ** (1 / 3))``; 1 when either is unknown.

        Source: CMOS dynamic power P = a C V^2 f with the supply voltage scaled in proportion to
        the clock over the DVFS range, so P ~ f^3 (Weste & Harris, CMOS VLSI Design, 4th ed.,
        section 5.2). Assumes a GPU at its rated TDP runs at the clock its datasheet peak is
        quoted at, and ignores static power (both make the scale an upper bound). HBM bandwidth
        is on its own clock and is not scaled.
        """
        if self.tdp_w <= 0 or self.power_limit_w <= 0:
            return 1.0
        return min(1.0, (self.power_limit_w / self.tdp_w) ** (1.0 / 3.0))

    capacity_bytes: float | None = None
    #: GPU architecture ("ampere", "hopper"); "" reads it from the name (:attr:`architecture`).
    #: Set it for a device whose name does not say (a custom entry, "MyCloud-GPU").
    arch: str = ""
    sm_count: int = 0

    @property
    def visible_memory_bytes(self) -> float:
        """Bytes of GPU memory the framework sees (:attr:`capacity_bytes`, else the datasheet's
        :attr:`memory_bytes`)."""
        return self.capacity_bytes if self.capacity_bytes else self.memory_bytes

    def __post_init__(self) -> None:
        unknown = sorted(set(self.peak_flops) - set(PRECISIONS))
        if unknown:
            raise InvalidClusterSpec(
                f"device {self.name!r}: unknown precision(s) {unknown} in peak_flops; "
                f"use only {list(PRECISIONS)}"
            )
        if any(v <= 0 for v in self.peak_flops.values()) or not self.peak_flops:
            raise InvalidClusterSpec(f"device {self.name!r}: peak_flops must be non-empty and positive")
        for attr in ("memory_bytes", "hbm_bandwidth_Bps", "pcie_bandwidth_Bps"):
            if getattr(self, attr) <= 0:
                raise InvalidClusterSpec(f"device {self.name!r}: {attr} must be > 0")
        if self.nvlink_bandwidth_Bps < 0:
            raise InvalidClusterSpec(f"device {self.name!r}: nvlink_bandwidth_Bps must be >= 0")
        if self.form_factor not in FORM_FACTORS:
            raise InvalidClusterSpec(
                f"device {self.name!r}: form_factor {self.form_factor!r} is not one of {list(FORM_FACTORS)}"
            )
        if isinstance(self.sm_count, bool) or not isinstance(self.sm_count, int) \
                or self.sm_count < 0:
            raise InvalidClusterSpec(
                f"device {self.name!r}: sm_count must be an int >= 0 (0 = not known), got "
                f"{self.sm_count!r}; fix: e.g. sm_count=132 for an H100 SXM5")
        if self.arch not in ARCHITECTURES:
            raise InvalidClusterSpec(
                f"device {self.name!r}: arch {self.arch!r} is not one of {list(ARCHITECTURES)}; "
                "fix: e.g. arch='hopper', or '' to read it from the name")
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))

    def __reduce__(self):
        """Pickle as a constructor call (mapping proxies and caches do not pickle)."""
        return (type(self), tuple(picklable(getattr(self, f.name)) for f in fields(self) if f.init))

    @property
    def architecture(self) -> str:
        """GPU architecture: :attr:`arch` when given, else read from the name: "hopper" (H100,
        H800, H200), "ampere" (A100, A800), else "unknown". The cost model's efficiency
        constants are per architecture (an "unknown" one takes the Ampere figures)."""
        if self.arch:
            return self.arch
        n = self.name.upper()
        if n.startswith(("H100", "H800", "H200", "H20")):
            return "hopper"
        if n.startswith(("A100", "A800", "A30", "A40")):
            return "ampere"
        return "unknown"

    def peak(self, dtype: str) -> float:
        """Dense peak throughput in FLOP/s for ``dtype`` (``"fp32"``, ``"tf32"``, ``"fp16"``, ``"bf16"``, ``"fp8"``).

        Raises:
            InvalidTrainingConfig: if ``dtype`` is not a known precision, or this GPU has no tensor-core
                support for it (e.g. ``"fp8"`` on an A100); the message lists what the GPU supports.
        """
        key = dtype.lower()
        if key not in PRECISIONS:
            raise InvalidTrainingConfig(
                f"unknown precision {dtype!r}; use one of {list(PRECISIONS)}"
            )
        if key not in self.peak_flops:
            raise InvalidTrainingConfig(
                f"{self.name} does not support {key} (it supports {list(self.peak_flops)}); "
                f"pick one of those precisions or a GPU that has {key}"
            )
        return self.peak_flops[key]


_A100_FLOPS = {"fp32": 19.5 * _TERA, "tf32": 156 * _TERA, "fp16": 312 * _TERA, "bf16": 312 * _TERA}
_H100_SXM_FLOPS = {
    "fp32": 67 * _TERA, "tf32": 494.5 * _TERA, "fp16": 989 * _TERA, "bf16": 989 * _TERA, "fp8": 1979 * _TERA,
}
_H100_PCIE_FLOPS = {
    "fp32": 51 * _TERA, "tf32": 378 * _TERA, "fp16": 756 * _TERA, "bf16": 756 * _TERA, "fp8": 1513 * _TERA,
}
_REF = "docs/reference/hardware_and_formulas.md, Hardware table"


_GIB = 2 ** 30

#: Memory the framework sees per GPU model (bytes), each from a measurement or a quoted
#: out-of-memory message (torch prints ``total_memory`` as "GPU 0 has a total capacity of X GiB").
VISIBLE_CAPACITY = {
    "A100-SXM4-80GB": 79.25 * _GIB, "A100-PCIe-80GB": 79.25 * _GIB,
    "A800-SXM4-80GB": 79.25 * _GIB,
    "A100-SXM4-40GB": 39.50 * _GIB, "A100-PCIe-40GB": 39.50 * _GIB,
    "H100-SXM5-80GB": 79.11 * _GIB, "H100-PCIe-80GB": 79.11 * _GIB,
    "H800-SXM5-80GB": 79.11 * _GIB,
    "H200-SXM-141GB": 150_109_880_320.0,
}
#: Where each :data:`VISIBLE_CAPACITY` figure comes from.
VISIBLE_CAPACITY_SOURCES = {
    "A100 80GB": "torch OOM messages on A100 80GB: 'GPU 0 has a total capacity of 79.25 GiB' "
                 "(github.com/HiDream-ai/VAREdit/issues/6, levihsu/OOTDiffusion/issues/235); "
                 "A800 is the same board with slower NVLink",
    "A100 40GB": "torch OOM message on an A100 40GB: 'total capacity of 39.50 GiB' "
                 "(github.com/TianheWu/CoSeR/issues/10)",
    "H100 80GB": "torch OOM message on 'H100(80GB) x 8' (a vLLM DeepSeek-V3 serving issue): "
                 "'GPU 0 has a total capacity of 79.11 GiB'; H800 is the same board",
    "H200": "measured for autopar (2026-11-30, torch 2.11, CUDA 13.0): "
            "torch.cuda.get_device_properties(0).total_memory = 150109880320 on an NVIDIA H200 "
            "(nvidia-smi memory.total 143771 MiB, of which 616 MiB reserved by the driver)",
}


def _row(name, flops, mem_gb, hbm_gbps, nvlink_bidir_gbps, pcie_gbps, form, source) -> Device:
    """A Device from datasheet units: GB, GB/s (HBM), GB/s bidirectional (NVLink), GB/s (PCIe);
    its framework-visible capacity from :data:`VISIBLE_CAPACITY`."""
    return Device(
        name=name,
        peak_flops=flops,
        memory_bytes=mem_gb * _GIGA,
        hbm_bandwidth_Bps=hbm_gbps * _GIGA,
        nvlink_bandwidth_Bps=nvlink_bidir_gbps * _GIGA / 2,
        pcie_bandwidth_Bps=pcie_gbps * _GIGA,
        form_factor=form,
        source=source,
        capacity_bytes=VISIBLE_CAPACITY.get(name),
    )


#: Canonical name -> Device. NVLink is given bidirectional in the rows below and halved by ``_row``.
DEVICES: Mapping[str, Device] = MappingProxyType({d.name: d for d in (
    _row("A100-SXM4-40GB", _A100_FLOPS, 40, 1555, 600, 32, "sxm",
         f"{_REF} (A100 SXM 40GB); NVIDIA A100 datasheet (FP32/TF32, PCIe Gen4)"),
    _row("A100-SXM4-80GB", _A100_FLOPS, 80, 2039, 600, 32, "sxm",
         f"{_REF} (A100 SXM 80GB); NVIDIA A100 datasheet (FP32/TF32, PCIe Gen4)"),
    _row("A100-PCIe-40GB", _A100_FLOPS, 40, 1555, 600, 32, "pcie",
         f"{_REF} (A100 PCIe 40GB, NVLink = 2-GPU bridge); NVIDIA A100 datasheet"),
    _row("A100-PCIe-80GB", _A100_FLOPS, 80, 1935, 600, 32, "pcie",
         f"{_REF} (A100 PCIe 80GB, NVLink = 2-GPU bridge); NVIDIA A100 datasheet"),
    _row("A800-SXM4-80GB", _A100_FLOPS, 80, 2039, 400, 32, "sxm",
         f"{_REF} (A800 SXM 80GB: NVLink 400 GB/s bidirectional); compute as A100"),
    _row("H100-SXM5-80GB", _H100_SXM_FLOPS, 80, 3350, 900, 64, "sxm",
         f"{_REF} (H100 SXM5); NVIDIA H100 datasheet (FP32 67 TF, TF32 989/2, PCIe Gen5)"),
    _row("H100-PCIe-80GB", _H100_PCIE_FLOPS, 80, 2000, 600, 64, "pcie",
         f"{_REF} (H100 PCIe, NVLink = bridge); NVIDIA H100 datasheet (FP32 51 TF, TF32 756/2)"),
    _row("H800-SXM5-80GB", _H100_SXM_FLOPS, 80, 3350, 400, 64, "sxm",
         f"{_REF} (H800 SXM5: NVLink 400 GB/s bidirectional); compute as H100 SXM5"),
    _row("H200-SXM-141GB", _H100_SXM_FLOPS, 141, 4800, 900, 64, "sxm",
         f"{_REF} (H200 SXM: 141 GB HBM3e, 4.8 TB/s); compute as H100 SXM5 (NVIDIA H200 datasheet)"),
)})

#: Rated board power (watts) per catalog GPU, from the NVIDIA datasheets: A100 SXM 400 W, A100
#: PCIe 40GB 250 W and 80GB 300 W, A800 SXM 400 W (A100 board); H100 SXM up to 700 W, H100 PCIe
#: 350 W, H800 SXM 700 W (H100 board), H200 SXM up to 700 W.
_TDP_W = {"A100-SXM4-40GB": 400, "A100-SXM4-80GB": 400, "A100-PCIe-40GB": 250,
          "A100-PCIe-80GB": 300, "A800-SXM4-80GB": 400, "H100-SXM5-80GB": 700,
          "H100-PCIe-80GB": 350, "H800-SXM5-80GB": 700, "H200-SXM-141GB": 700}
#: Streaming multiprocessors per catalog GPU (the enabled SMs of the shipped part).
SM_COUNT = {"A100-SXM4-40GB": 108, "A100-SXM4-80GB": 108, "A100-PCIe-40GB": 108,
            "A100-PCIe-80GB": 108, "A800-SXM4-80GB": 108, "H100-SXM5-80GB": 132,
            "H100-PCIe-80GB": 114, "H800-SXM5-80GB": 132, "H200-SXM-141GB": 132}
#: Where each :data:`SM_COUNT` figure comes from.
SM_COUNT_SOURCES = {
    "A100": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): the A100 product has "
            "108 SMs enabled (of 128 on the full GA100); A800 is the same board",
    "H100": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): H100 SXM5 132 SMs, "
            "H100 PCIe 114 SMs",
    "H800": "DeepSeek-V3 technical report (arXiv 2412.19437, section 3.2.2): 'out of the 132 "
            "SMs available in the H800 GPU'",
    "H200": "NVIDIA H200 datasheet: the GH100 GPU of H100 SXM5 with HBM3e (132 SMs)",
}
DEVICES = MappingProxyType({n: replace(d, tdp_w=_TDP_W.get(n, 0.0), sm_count=SM_COUNT.get(n, 0))
                           for n, d in DEVICES.items()})

#: Lower-case alias -> canonical name. Canonical names match case-insensitively as well.
ALIASES: Mapping[str, str] = MappingProxyType({
    "a100": "A100-SXM4-80GB",
    "a100-80gb": "A100-SXM4-80GB",
    "a100-sxm": "A100-SXM4-80GB",
    "a100-40gb": "A100-SXM4-40GB",
    "a100-pcie": "A100-PCIe-80GB",
    "a800": "A800-SXM4-80GB",
    "a800-80gb": "A800-SXM4-80GB",
    "h100": "H100-SXM5-80GB",
    "h100-80gb": "H100-SXM5-80GB",
    "h100-sxm": "H100-SXM5-80GB",
    "h100-pcie": "H100-PCIe-80GB",
    "h800": "H800-SXM5-80GB",
    "h800-80gb": "H800-SXM5-80GB",
    "h200": "H200-SXM-141GB",
    "h200-141gb": "H200-SXM-141GB",
})

_LOOKUP: Mapping[str, str] = MappingProxyType(
    {**{n.lower(): n for n in DEVICES}, **ALIASES}
)


def list_devices() -> tuple[str, ...]:
    """Canonical names of every GPU in the catalog, in catalog order."""
    return tuple(DEVICES)


def valid_device_names() -> tuple[str, ...]:
    """Every accepted GPU name: canonical names, then aliases (lower case)."""
    return tuple(DEVICES) + tuple(ALIASES)


def get_device(name: str | Device) -> Device:
    """The catalog :class:`Device` for ``name`` (canonical name or alias, case-insensitive).

    A :class:`Device` passed in is returned unchanged.

    Raises:
        InvalidClusterSpec: if the name is unknown; the message lists the valid names and the
            closest match.
    """
    if isinstance(name, Device):
        return name
    key = str(name).strip().lower()
    if key in _LOOKUP:
        return DEVICES[_LOOKUP[key]]
    close = difflib.get_close_matches(key, list(_LOOKUP), n=1, cutoff=0.5)
    hint = f" Did you mean {_LOOKUP[close[0]]!r} ({close[0]!r})?" if close else ""
    raise InvalidClusterSpec(
        f"unknown GPU {name!r}.{hint} Valid names (case-insensitive): {', '.join(valid_device_names())}"
    )


def memory_ambiguity(name: str) -> str | None:
    """A note when the GPU name ``name`` (as a user wrote it) leaves the memory size open and
    the catalog has the part in several sizes (``"A100"``: 40 GB and 80 GB), naming the one it
    is read as and how to ask for the other; None when the name fixes the size or is unknown.

    Sizes are the datasheets' decimal GB (:attr:`Device.memory_bytes`)."""
    key = str(name).strip().lower()
    if key not in _LOOKUP:
        return None
    chosen = DEVICES[_LOOKUP[key]]
    tokens = key.split("-")
    siblings = [d for n, d in DEVICES.items() if all(t in n.lower() for t in tokens)]
    sizes = sorted({d.memory_bytes for d in siblings})
    if len(sizes) < 2:
        return None
    others = ", ".join(n for n, d in DEVICES.items() if d in siblings
                       and d.memory_bytes != chosen.memory_bytes)
    return (f"GPU {name!r} is read as {chosen.name} ({chosen.memory_bytes / 1e9:.0f} GB); the "
            f"catalog also has {others}: write that name if yours is one")
