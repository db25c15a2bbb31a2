"""Every calibration constant of the collective cost model, in one table.

The model (``collectives.py``) is alpha-beta: ``time = launch + hops * alpha + bytes / (efficiency * bw)``.
Its size curve comes from that form alone: below a few hundred kB the alpha terms dominate (latency
bound), above tens of MB the bandwidth term does. The constants below are the only knobs; override them
by passing a different :class:`CommParams` to ``Cluster`` (``dataclasses.replace``) when calibrating.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Mapping

from autopar.errors import InvalidClusterSpec
from autopar.hardware.devices import picklable
from autopar.hardware.links import LINK_KINDS


@dataclass(frozen=True)
class EfficiencyRow:
    """Large-message bus-bandwidth efficiency of one link kind (achieved busbw / link bandwidth).

    Attributes:
        kind: a link kind from ``links.LINK_KINDS``.
        efficiency: dimensionless, in (0, 1].
        source: the measurement it is fitted to, or why it is assumed.
    """

    kind: str
    efficiency: float
    source: str


_REF = "docs/reference/hardware_and_formulas.md, NCCL AllReduce bus bandwidth table"

#: The efficiency table, one row per link kind.
EFFICIENCY_ROWS: tuple[EfficiencyRow, ...] = (
    EfficiencyRow("nvswitch", 0.80,
                  f"{_REF}: mean of 8xA100 231.6/300 = 0.772 and 8xH100 (no NVLS) 370/450 = 0.822"),
    EfficiencyRow("nvlink", 0.80, "assumed equal to nvswitch (same NVLink ports, point to point)"),
    EfficiencyRow("pcie", 0.60,
                  "assumption: PCIe-only boxes route peer traffic through PCIe switches and the host root "
                  "complex / inter-socket link; ~60% of x16 rate, to recalibrate when measured"),
    EfficiencyRow("infiniband", 0.86,
                  f"{_REF}: 2 nodes x 8 A100, 4xHDR: 86 GB/s ring busbw against 100 GB/s of NICs"),
    EfficiencyRow("roce", 0.80, "assumption: a little under IB (congestion control, PFC pauses)"),
    EfficiencyRow("efa", 0.87,
                  "measured, mean of five large-message busbw ratios on p5.48xlarge (32 x 100 Gb/s "
                  "EFAv2, 400 Gb/s = 50 GB/s of NICs per GPU; aws-ofi-nccl): all_to_all at 2 GB "
                  "over 2 / 4 / 8 nodes 79.25 / 54.07 / 49.63 GB/s against the NIC-bound 93.75 / "
                  "64.58 / 56.25 (0.845 / 0.837 / 0.882); all_reduce at 8 GB over 4 / 8 nodes "
                  "356.99 / 355.36 GB/s against 400 (0.892 / 0.888); crazyguitar/"
                  "aws-gpu-communication-benchmark data/nccl_alltoall.csv and nccl_all_reduce.csv "
                  "(fd167f97, 2025-10; NCCL 2.28.7, aws-ofi-nccl 1.16.3, SageMaker HyperPod)"),
    EfficiencyRow("ethernet", 0.60, "assumption: NCCL TCP socket transport on plain Ethernet"),
    EfficiencyRow("xgmi", 0.80,
                  "assumption, UNVALIDATED: RCCL over AMD Infinity Fabric taken at the NVSwitch "
                  "row's share of link bandwidth; no RCCL bus bandwidth on MI300X/MI325X/MI355X "
                  "was measured for autopar or transcribed with a source"),
)


@dataclass(frozen=True)
class CommParams:
    """Calibration constants of the collective model.

    Attributes:
        efficiency: link kind -> large-message efficiency (built from :data:`EFFICIENCY_ROWS`).
        launch_latency_s: fixed cost of one collective call in seconds (kernel launch, NCCL setup).
            Source: NCCL tuning.cc ``baseLat`` (ring LL 3.6 us, LL128 10 us, Simple 8.4 us); 5 us assumed.
            With 1 us NVLink hops it puts an 8-GPU all_reduce at ~19 us, inside the reference's
            13-20 us latency floor (dgxc-benchmarking, 8xH100).

    Raises:
        InvalidClusterSpec: on construction, if a kind is missing or unknown, an efficiency is outside
            (0, 1], or the launch latency is negative.
    """

    efficiency: Mapping[str, float] = field(
        default_factory=lambda: {r.kind: r.efficiency for r in EFFICIENCY_ROWS}, hash=False
    )
    launch_latency_s: float = 5e-6

    def __post_init__(self) -> None:
        eff = dict(self.efficiency)
        if set(eff) != set(LINK_KINDS):
            raise InvalidClusterSpec(
                f"CommParams.efficiency must have exactly the kinds {list(LINK_KINDS)}, got {sorted(eff)}"
            )
        bad = {k: v for k, v in eff.items() if not 0 < v <= 1}
        if bad:
            raise InvalidClusterSpec(f"CommParams.efficiency values must be in (0, 1]; bad: {bad}")
        if self.launch_latency_s < 0:
            raise InvalidClusterSpec("CommParams.launch_latency_s must be >= 0")
        object.__setattr__(self, "efficiency", MappingProxyType(eff))

    def __reduce__(self):
        """Pickle as a constructor call (mapping proxies and caches do not pickle)."""
        return (type(self), tuple(picklable(getattr(self, f.name)) for f in fields(self) if f.init))

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.efficiency.items())), self.launch_latency_s))


DEFAULT_COMM_PARAMS = CommParams()
