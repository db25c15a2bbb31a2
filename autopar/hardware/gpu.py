"""One GPU as the cost model sees it (:class:`Device`), and its architecture (:func:`architecture`).

Figures are dense (no 2:4 sparsity) peaks in SI units: FLOP/s, bytes, bytes/s; datasheets are
decimal (1 GB = 1e9 bytes, 1 TB/s = 1e12 bytes/s), nothing here is in GiB. The catalog's rows,
each fact with its source, are in :mod:`autopar.hardware.devices`; a hand-built Device works too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Mapping

from autopar.config import ARCHITECTURES
from autopar.config import PRECISIONS as TRAINING_PRECISIONS
from autopar.errors import InvalidClusterSpec, InvalidTrainingConfig

#: Precisions a device may list in ``peak_flops``.
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")

FORM_FACTORS: tuple[str, ...] = ("sxm", "pcie")

#: GPU model-number prefix -> architecture, longest prefix first; a name is read by its first
#: letters followed by a digit ("H100-SXM5-80GB": "H" + "1"). Sources: NVIDIA's architecture
#: whitepapers: V100 Volta (GV100); A100, A800, A30, A40, A10 Ampere (GA100/GA102); H100, H800, H200,
#: H20 Hopper (GH100); B200, B300, GB200, GB300 Blackwell (GB100/GB110 and Grace-Blackwell); L4,
#: L40S Ada Lovelace (AD104/AD102, NVIDIA Ada GPU Architecture whitepaper); GeForce RTX 30xx
#: (GA102 whitepaper: RTX 3090) and RTX Axxxx workstation boards (RTX A6000) Ampere, GeForce RTX
#: 40xx (Ada whitepaper: RTX 4090) Ada.
#: AMD (CDNA whitepapers; ROCm "AMD GPU specifications" table): MI300X, MI325X CDNA 3 (gfx942);
#: MI350X, MI355X CDNA 4 (gfx950).
ARCH_PREFIXES: tuple[tuple[str, str], ...] = (
    ("RTX-30", "ampere"), ("RTX-40", "ada"), ("RTX-A", "ampere"),
    ("MI35", "cdna4"), ("MI3", "cdna3"), ("GB", "blackwell"), ("B", "blackwell"),
    ("A", "ampere"), ("H", "hopper"), ("V", "volta"), ("L", "ada"))


def architecture(name: str, arch: str = "") -> str:
    """The GPU architecture of a GPU named ``name``: ``arch`` when given (a device whose name does
    not say), else read from the name's model number by :data:`ARCH_PREFIXES`
    ("A100-SXM4-80GB" -> "ampere", "B200" -> "blackwell"), else "unknown". The one place
    a GPU's architecture is derived: :attr:`Device.architecture` and the error-band regimes
    (:func:`autopar.cost.regime.gpu_generation`) both read it."""
    if arch:
        return arch
    return _architecture_of(str(name))


@functools.lru_cache(maxsize=256)
def _architecture_of(name: str) -> str:
    """:func:`architecture` of a name with no ``arch`` (cached: the cost model asks once per
    rank it prices, about a million times in a search of 144 GPUs)."""
    upper = name.upper()
    for prefix, arch_name in ARCH_PREFIXES:
        if upper.startswith(prefix) and upper[len(prefix):len(prefix) + 1].isdigit():
            return arch_name
    return "unknown"


#: Parts banded apart from their architecture (model number -> band generation,
#: :func:`band_generation`). The H20 is a Hopper part with 148 of the H100 SXM's 989 dense BF16
#: TFLOP/s over 4.0 TB/s of HBM, 37 FLOP per byte against 295 (autopar/hardware/devices.py):
#: the shares of compute, memory-bound and communication time in its steps differ from the
#: Hopper runs', so their residuals do not validate it; it gets a band only from its own runs.
#: The GA102 parts (GeForce RTX 3090, RTX A6000, A10: GDDR6/6X, PCIe only) are Ampere with
#: 71-155 dense FP16 TFLOP/s over 0.6-0.94 TB/s (GA102 whitepaper, autopar/hardware/devices.py)
#: against the A100's 312 over 2.0 TB/s, and no NVSwitch: the A100 runs do not validate them.
#: The Ada parts (RTX 4090, L40S, L4) have no runs in the corpus either.
BAND_GENERATIONS: tuple[tuple[str, str], ...] = (
    ("H20", "hopper-h20"), ("A10", "ampere-ga102"), ("RTX-3090", "ampere-ga102"),
    ("RTX-A6000", "ampere-ga102"), ("RTX-4090", "ada"))


def band_generation(name: str, arch: str = "") -> str:
    """The generation whose published runs band an estimate on the GPU ``name``: the part's
    own where :data:`BAND_GENERATIONS` lists its model number (the whole name, or the name up
    to a '-' after it: "H20-96GB" is the H20's, "H200-SXM-141GB" is not; "RTX-3090-24GB" the
    RTX-3090's), else :func:`architecture` ("unknown" for a name it cannot read)."""
    upper = str(name).upper()
    own = next((gen for part, gen in BAND_GENERATIONS
                if upper == part or upper.startswith(part + "-")), None)
    return own or architecture(name, arch)


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
        source: where the figures come from (a catalog row gives each fact its own source).
        tdp_w: rated board power in watts (datasheet "Max TDP"); 0 = not known.
        power_limit_w: the power cap the GPU runs under (watts); 0 = its rated TDP.
        sm_count: streaming multiprocessors on the GPU (NVIDIA architecture whitepapers; a catalog
            row's ``sources["sm_count"]``); 0 = not known. What share of the GPU a communication
            kernel's thread blocks hold (:mod:`autopar.hardware.nccl`) is read against it.
        capacity_bytes: memory as the framework sees it (``torch.cuda.get_device_properties().
            total_memory``, the "total capacity" of torch's out-of-memory message): the HBM less
            what the driver keeps; None = ``memory_bytes``. Read it through
            :attr:`visible_memory_bytes`. Sources: a catalog row's ``sources["capacity_bytes"]``.

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
    #: GPU architecture (:data:`autopar.config.ARCHITECTURES`); "" reads it from the name
    #: (:func:`architecture`).
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
        """GPU architecture (:func:`architecture` of the name and :attr:`arch`): "hopper",
        "ampere", "ada", "blackwell", "volta", "cdna3", "cdna4", else "unknown". The cost
        model's efficiency constants are per architecture (one without its own figures takes the Ampere ones)."""
        return architecture(self.name, self.arch)

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
            # a GPU without BF16 (Volta: V100) trains in FP16 with loss scaling
            hint = (" (no BF16 tensor cores: train in mixed precision fp16)"
                    if key == "bf16" and "fp16" in self.peak_flops else "")
            # the training precisions it has (a datasheet's tf32 is a matmul mode, not one)
            usable = [k for k in TRAINING_PRECISIONS if k in self.peak_flops]
            pick = "bf16" if "bf16" in usable else usable[0] if usable else None
            default = " (bf16: autopar's default precision)" if key == "bf16" else ""
            fix = (f"--precision {pick} (precision='{pick}' in Python), or a GPU that has {key}"
                   if pick else f"a GPU that has {key}")
            raise InvalidTrainingConfig(
                f"{self.name} does not support {key}{default}{hint}; it trains in {usable}. "
                f"Fix: {fix}"
            )
        return self.peak_flops[key]


