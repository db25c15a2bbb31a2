"""The preset registry: one :class:`GpuRow` per GPU, one :class:`Box` per server build, looked up
by :class:`Catalog`.

The rows themselves are in :mod:`autopar.hardware.devices` (``CATALOG``); this module says what a
row is and how names resolve. ``Cluster.from_spec``, ``get_device`` and every other reader take a
GPU's facts from the catalog's rows; a :class:`Catalog` with extra rows (:meth:`Catalog.extended`)
serves the same readers without touching the default one.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from autopar.errors import InvalidClusterSpec
from autopar.hardware.gpu import Device
from autopar.hardware.links import INTRA_KINDS, NETWORK_KINDS, get_link

#: Facts of a row that need a source when known (:class:`Device` fields; ``tdp_w``, ``sm_count``
#: and ``capacity_bytes`` only when the row gives them).
FACTS: tuple[str, ...] = ("peak_flops", "memory_bytes", "hbm_bandwidth_Bps", "nvlink_bandwidth_Bps",
                          "pcie_bandwidth_Bps", "form_factor", "tdp_w", "sm_count", "capacity_bytes")
_OPTIONAL = {"tdp_w": 0, "sm_count": 0, "capacity_bytes": None}


@dataclass(frozen=True)
class Box:
    """The default build of a server around a GPU: what joins its GPUs and which NICs it has.

    Attributes:
        name: box name, e.g. ``"dgx-a100"``.
        intra_link: link catalog name joining the GPUs of one node (kind nvswitch, nvlink or pcie).
        nics_per_node: compute NICs per full node of ``gpus_per_node`` GPUs (one per GPU "rail"
            in DGX/HGX designs).
        nic_link: link catalog name of each NIC (kind infiniband, roce, efa or ethernet).
        source: which system this describes, or why it was assumed.
        gpus_per_node: GPUs of one full node, i.e. of one ``intra_link`` domain (8 for an HGX
            board; 72 for a GB200/GB300 NVL72 rack, whose 72 GPUs share one NVLink Switch
            domain). ``Cluster.from_spec("NxGPU")`` fills nodes of this size.
        gpus_per_host: GPUs per server tray (one OS, one set of CPUs) when a node's fabric
            spans several trays (4 in an NVL72 compute tray); 0 when the node is one host.
            A node of such a box may not exceed ``gpus_per_node`` (the fabric ends there).

    Raises:
        InvalidClusterSpec: on construction, for an unknown link, a link of the wrong kind, a
            negative NIC count, or node/tray sizes that are not positive or do not divide.
    """

    name: str
    intra_link: str
    nics_per_node: int
    nic_link: str
    source: str
    gpus_per_node: int = 8
    gpus_per_host: int = 0

    def __post_init__(self) -> None:
        if get_link(self.intra_link).kind not in INTRA_KINDS:
            raise InvalidClusterSpec(f"box {self.name!r}: intra_link {self.intra_link!r} is not a link of "
                                     f"kind {list(INTRA_KINDS)}; fix: e.g. 'nvlink4' or 'pcie-gen5'")
        if get_link(self.nic_link).kind not in NETWORK_KINDS:
            raise InvalidClusterSpec(f"box {self.name!r}: nic_link {self.nic_link!r} is not a link of "
                                     f"kind {list(NETWORK_KINDS)}; fix: e.g. 'ib-ndr'")
        if isinstance(self.nics_per_node, bool) or not isinstance(self.nics_per_node, int) \
                or self.nics_per_node < 0:
            raise InvalidClusterSpec(f"box {self.name!r}: nics_per_node must be an int >= 0, got "
                                     f"{self.nics_per_node!r}; fix: e.g. 8 (one NIC per GPU)")
        if self.gpus_per_node < 1 or self.gpus_per_host < 0 or (
                self.gpus_per_host and self.gpus_per_node % self.gpus_per_host):
            raise InvalidClusterSpec(
                f"box {self.name!r}: gpus_per_node={self.gpus_per_node} must be >= 1 and a "
                f"multiple of gpus_per_host={self.gpus_per_host} (0: one host per node); fix: "
                "e.g. gpus_per_node=72, gpus_per_host=4 for an NVL72 rack")

    @property
    def rack_scale(self) -> bool:
        """Whether one node's GPU fabric spans several hosts (an NVL72 rack)."""
        return 0 < self.gpus_per_host < self.gpus_per_node

    def nics(self, gpus_per_node: int) -> int:
        """Compute NICs of a node of ``gpus_per_node`` GPUs built like this box: its NICs, but no
        more than one per GPU (DGX/HGX boxes give each GPU its own NIC, a "rail", so a 2-GPU node
        of them has 2 NICs, not 8; a PCIe box's single NIC stays 1)."""
        return min(self.nics_per_node, gpus_per_node)


@dataclass(frozen=True)
class GpuRow:
    """One GPU of the catalog: its figures, the names it answers to, its default box, and a
    source for every fact.

    Attributes:
        device: the GPU's figures (SI units; :class:`Device`).
        aliases: extra names, lower case (canonical names match case-insensitively anyway).
        box: name of the :class:`Box` it ships in by default.
        sources: fact name (:data:`FACTS`) -> where the figure comes from; every fact the row
            gives needs one. The architecture's source is :data:`autopar.hardware.gpu.ARCH_PREFIXES`' (see
            :meth:`source_of`), the box's is the box's own.

    Raises:
        InvalidClusterSpec: on construction, for a fact without a source, a source for an unknown
            fact, or an alias that is not lower case.
    """

    device: Device
    aliases: tuple[str, ...]
    box: str
    sources: Mapping[str, str] = field(hash=False)

    def __post_init__(self) -> None:
        name = self.device.name
        given = [f for f in FACTS if f not in _OPTIONAL or getattr(self.device, f) != _OPTIONAL[f]]
        missing = [f for f in given if not self.sources.get(f)]
        extra = sorted(set(self.sources) - set(FACTS))
        if missing or extra:
            raise InvalidClusterSpec(
                f"GPU row {name!r}: facts without a source {missing}, sources of unknown facts "
                f"{extra}; fix: give sources[fact] = '<datasheet, paper or measurement>' for each "
                f"fact in {list(FACTS)} the row gives")
        bad = [a for a in self.aliases if not a or a != a.strip().lower()]
        if bad:
            raise InvalidClusterSpec(f"GPU row {name!r}: aliases {bad} must be lower case without "
                                     f"spaces; fix: e.g. 'h100'")
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    @property
    def name(self) -> str:
        """The canonical name (the device's)."""
        return self.device.name

    @property
    def architecture(self) -> str:
        """The GPU architecture (:func:`autopar.hardware.gpu.architecture`, the one place)."""
        return self.device.architecture

    def source_of(self, fact: str) -> str:
        """Where ``fact`` (one of :data:`FACTS`, or ``"architecture"``) comes from.

        Raises:
            KeyError: a fact the row does not give.
        """
        if fact == "architecture":
            return ("stated on the row" if self.device.arch else
                    "read from the model number (autopar.hardware.gpu.ARCH_PREFIXES: NVIDIA "
                    "architecture whitepapers)")
        return self.sources[fact]


def _alias_order(rows: tuple[GpuRow, ...]) -> list[tuple[str, str]]:
    """(alias, canonical name) pairs in listing order: by model family (the alias up to its first
    '-'), the family's default part (the row holding the bare family name, e.g. 'a100') first,
    then its other parts in catalog order."""
    default = {}
    for i, row in enumerate(rows):
        for a in row.aliases:
            if "-" not in a:
                default.setdefault(a, i)
    keyed = []
    for i, row in enumerate(rows):
        for j, a in enumerate(row.aliases):
            d = default.get(a.split("-")[0], i)
            keyed.append(((d, i != d, i, j), a, row.name))
    return [(a, n) for _, a, n in sorted(keyed)]


@dataclass(frozen=True)
class Catalog:
    """The GPU and box presets, with name lookup.

    Attributes:
        gpus: the GPU rows, in catalog order.
        boxes: the box rows every GPU row's ``box`` names.

    Raises:
        InvalidClusterSpec: on construction, for a name or alias given twice, or a row naming a
            box the catalog lacks.
    """

    gpus: tuple[GpuRow, ...]
    boxes: tuple[Box, ...]
    _index: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        boxes = {b.name: b for b in self.boxes}
        devices, seen = {}, {}
        for row in self.gpus:
            if row.box not in boxes:
                raise InvalidClusterSpec(f"GPU row {row.name!r}: box {row.box!r} is not in the catalog "
                                         f"({', '.join(boxes)}); fix: add a Box row or name one of those")
            for key in (row.name.lower(), *row.aliases):
                if key in seen:
                    raise InvalidClusterSpec(f"GPU name {key!r} is given by both {seen[key]!r} and "
                                             f"{row.name!r}; fix: keep it on one row")
                seen[key] = row.name
            devices[row.name] = row.device
        aliases = dict(_alias_order(self.gpus))
        self._index.update(
            devices=MappingProxyType(devices), aliases=MappingProxyType(aliases),
            lookup=MappingProxyType({**{n.lower(): n for n in devices}, **aliases}),
            rows={r.name: r for r in self.gpus}, boxes=MappingProxyType(boxes))

    @property
    def devices(self) -> Mapping[str, Device]:
        """Canonical name -> :class:`Device`, in catalog order."""
        return self._index["devices"]

    @property
    def aliases(self) -> Mapping[str, str]:
        """Lower-case alias -> canonical name, in listing order (:func:`_alias_order`)."""
        return self._index["aliases"]

    def names(self) -> tuple[str, ...]:
        """Canonical names of every GPU, in catalog order."""
        return tuple(self.devices)

    def valid_names(self) -> tuple[str, ...]:
        """Every accepted GPU name: canonical names, then aliases (lower case)."""
        return self.names() + tuple(self.aliases)

    def extending(self, name: str) -> tuple[str, ...]:
        """Canonical names that continue ``name`` after a '-' (case-insensitive), in catalog
        order: the GPUs a name written without its memory size (or form factor) may mean,
        ``"h100-sxm5"``: H100-SXM5-80GB, ``"a100-sxm4"``: A100-SXM4-40GB and A100-SXM4-80GB;
        () when none does."""
        key = str(name).strip().lower() + "-"
        return tuple(n for n in self.devices if n.lower().startswith(key))

    def row(self, name: str) -> GpuRow:
        """The row of ``name``: a canonical name or alias, case-insensitive, or the beginning of
        exactly one canonical name up to a '-' (:meth:`extending`; ``"H100-SXM5"`` for
        H100-SXM5-80GB).

        Raises:
            InvalidClusterSpec: if the name is unknown (the message lists the valid names and
                the closest match), or begins several canonical names (the message names them
                and their memory sizes).
        """
        lookup = self._index["lookup"]
        key = str(name).strip().lower()
        if key in lookup:
            return self._index["rows"][lookup[key]]
        longer = self.extending(key)
        if len(longer) == 1:
            return self._index["rows"][longer[0]]
        if longer:
            # several parts (often one per memory size): picking one would price the wrong GPU
            parts = ", ".join(f"{n} ({self.devices[n].memory_bytes / 1e9:.0f} GB)"
                              for n in longer)
            raise InvalidClusterSpec(
                f"GPU {name!r} begins the names of {len(longer)} GPUs of the catalog: {parts}. "
                f"Fix: write the full name of yours: {', '.join(map(repr, longer[:-1]))} or "
                f"{longer[-1]!r}")
        close = difflib.get_close_matches(key, list(lookup), n=1, cutoff=0.5)
        hint = f" Did you mean {lookup[close[0]]!r} ({close[0]!r})?" if close else ""
        raise InvalidClusterSpec(
            f"unknown GPU {name!r}.{hint} Valid names (case-insensitive): "
            f"{', '.join(self.names())}, or a short alias of one ('h100', 'a100-80gb': "
            "autopar.hardware.devices.valid_device_names() lists them)")

    def device(self, name: str | Device) -> Device:
        """The :class:`Device` of ``name`` (as :meth:`row`); a Device passed in is returned as is.

        Raises:
            InvalidClusterSpec: as :meth:`row`.
        """
        return name if isinstance(name, Device) else self.row(name).device

    def box(self, device: Device) -> Box | None:
        """The default :class:`Box` of a catalog GPU (by its canonical name), or None for a GPU
        not in the catalog (a hand-built :class:`Device`), whose links must then be given."""
        row = self._index["rows"].get(device.name)
        return self._index["boxes"][row.box] if row is not None else None

    def memory_ambiguity(self, name: str) -> str | None:
        """A note when the GPU name ``name`` (as a user wrote it) leaves the memory size open and
        the catalog has the part in several sizes (``"A100"``: 40 GB and 80 GB), naming the one it
        is read as and how to ask for the other; None when the name fixes the size or is unknown.

        Sizes are the datasheets' decimal GB (:attr:`Device.memory_bytes`)."""
        lookup, devices = self._index["lookup"], self.devices
        key = str(name).strip().lower()
        if key not in lookup:
            return None
        chosen = devices[lookup[key]]
        tokens = key.split("-")
        siblings = [d for n, d in devices.items() if all(t in n.lower() for t in tokens)]
        sizes = sorted({d.memory_bytes for d in siblings})
        if len(sizes) < 2:
            return None
        others = ", ".join(n for n, d in devices.items() if d in siblings
                           and d.memory_bytes != chosen.memory_bytes)
        return (f"GPU {name!r} is read as {chosen.name} ({chosen.memory_bytes / 1e9:.0f} GB); the "
                f"catalog also has {others}: write that name if yours is one")

    def extended(self, gpus: tuple[GpuRow, ...] = (), boxes: tuple[Box, ...] = ()) -> "Catalog":
        """A new catalog with ``gpus`` and ``boxes`` added after these (this one is unchanged).

        Raises:
            InvalidClusterSpec: as the constructor.
        """
        return Catalog(self.gpus + tuple(gpus), self.boxes + tuple(boxes))

