"""A GPU cluster: identical nodes of GPUs joined by an intra-node link, nodes joined by NICs.

Build one from a spec string (:meth:`Cluster.from_spec`, grammar in ``spec.py``) or explicitly
(:meth:`Cluster.custom`). Ask it what a collective over a group of global ranks costs
(:meth:`Cluster.collective_time`, model in ``collectives.py``, constants in ``comm_params.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Sequence

import networkx as nx

from autopar.errors import InvalidClusterSpec, InvalidParallelConfig
from autopar.hardware import collectives, nccl
from autopar.hardware.catalog import Catalog
from autopar.hardware.comm_params import DEFAULT_COMM_PARAMS, CommParams
from autopar.hardware.devices import CATALOG, Device, picklable
from autopar.hardware.links import INTRA_KINDS, NETWORK_KINDS, LinkType, get_link
from autopar.hardware.spec import MAX_WORLD_SIZE, parse_spec
from autopar.hardware.topology import build_graph

#: intra-node link kind -> its fabric's name in :meth:`Cluster.domain_text`.
_LINK_NAME = {"nvswitch": "NVLink", "nvlink": "NVLink", "xgmi": "Infinity Fabric", "pcie": "PCIe"}
#: link kind -> the class name ``Cluster.link_class`` reports.
_LINK_CLASS = {"nvlink": "nvlink", "nvswitch": "nvlink", "pcie": "pcie",
               "infiniband": "infiniband", "roce": "roce", "efa": "efa", "ethernet": "ethernet",
               "xgmi": "xgmi"}


@dataclass(frozen=True)
class Cluster:
    """``num_nodes`` identical nodes of ``gpus_per_node`` GPUs; global rank r lives on node
    r // gpus_per_node.

    A *node* is one scale-up domain: the GPUs ``intra_link`` joins, everything beyond it crosses
    the NICs. For an HGX board that is one server of 8 GPUs; for a GB200/GB300 NVL72 rack it is
    the whole rack's 72-GPU NVLink Switch domain, though its GPUs sit in 18 trays of 4
    (``gpus_per_host``), so TP, CP and EP groups within 72 consecutive ranks stay on NVLink
    (docs/hardware.md).

    Attributes:
        num_nodes, gpus_per_node: positive ints.
        device: the GPU (:class:`Device`).
        intra_link: the link joining GPUs in a node (kind nvswitch, nvlink or pcie).
        inter_link: the NIC link joining nodes (kind infiniband, roce, efa or ethernet); None only for a
            node without compute NICs, which then must be the only node.
        nics_per_node: compute NICs per node (each at ``inter_link.bandwidth_Bps``).
        name: label; generated as ``NODESxGPUSxDEVICE+NICSxLINK`` when left empty.
        comm_params: calibration constants of the collective model.
        gpus_per_host: GPUs per server tray when one node's fabric spans several trays (4 in an
            NVL72 rack); 0 when a node is one host. Descriptive only (tables, the topology
            graph): the collective model prices the node's fabric, not its trays.

    Derived data (graph, effective bandwidths) is cached in a private per-object dict.

    Raises:
        InvalidClusterSpec: on construction, for non-positive counts, a link of the wrong kind, or
            several nodes without NICs.
    """

    num_nodes: int
    gpus_per_node: int
    device: Device
    intra_link: LinkType
    inter_link: LinkType | None
    nics_per_node: int
    name: str = ""
    comm_params: CommParams = DEFAULT_COMM_PARAMS
    gpus_per_host: int = 0
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        for attr in ("num_nodes", "gpus_per_node"):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidClusterSpec(f"Cluster.{attr} must be an int >= 1, got {v!r}; "
                                         f"fix: pass a positive whole number")
        if self.num_nodes * self.gpus_per_node > MAX_WORLD_SIZE:
            raise InvalidClusterSpec(
                f"cluster of {self.num_nodes} x {self.gpus_per_node} = "
                f"{self.num_nodes * self.gpus_per_node} GPUs exceeds the {MAX_WORLD_SIZE} GPUs "
                f"autopar plans for; fix: check the node and GPU counts (e.g. '128x8xA100-80GB')")
        if isinstance(self.nics_per_node, bool) or not isinstance(self.nics_per_node, int) \
                or self.nics_per_node < 0:
            raise InvalidClusterSpec(f"Cluster.nics_per_node must be an int >= 0, got "
                                     f"{self.nics_per_node!r}; fix: pass e.g. 8 (one NIC per GPU)")
        if isinstance(self.gpus_per_host, bool) or not isinstance(self.gpus_per_host, int) \
                or self.gpus_per_host < 0:
            raise InvalidClusterSpec(f"Cluster.gpus_per_host must be an int >= 0 (0: a node is "
                                     f"one host), got {self.gpus_per_host!r}; fix: e.g. 4 for "
                                     "an NVL72 rack's compute trays")
        if self.intra_link.kind not in INTRA_KINDS:
            raise InvalidClusterSpec(
                f"intra-node link {self.intra_link.name!r} is a {self.intra_link.kind} link, but "
                f"GPUs inside a node are joined by one of kind {list(INTRA_KINDS)}; fix: pass "
                f"intra= such a link (e.g. 'nvlink4' or 'pcie-gen4')"
            )
        mesh, world = self.intra_link.mesh_links, self.num_nodes * self.gpus_per_node
        if mesh and self.gpus_per_node > mesh + 1:
            # a switchless mesh joins each GPU to every other by a link of its own
            raise InvalidClusterSpec(
                f"{self.gpus_per_node} GPUs per node over {self.intra_link.name!r}: a fully "
                f"connected mesh of {mesh} peer links per GPU joins at most {mesh + 1} GPUs; fix: "
                f"use nodes of {mesh + 1} (e.g. '{-(-world // (mesh + 1))}x{mesh + 1}x"
                f"{self.device.name}' for {world} GPUs)")
        if self.inter_link is not None and self.inter_link.kind not in NETWORK_KINDS:
            raise InvalidClusterSpec(
                f"inter-node link {self.inter_link.name!r} is a {self.inter_link.kind} link, but "
                f"nodes are joined by NICs of kind {list(NETWORK_KINDS)}; fix: pass inter= such a "
                f"link (e.g. 'ib-ndr' or 'roce-400g')"
            )
        if self.num_nodes > 1 and (self.inter_link is None or self.nics_per_node == 0):
            raise InvalidClusterSpec(
                f"{self.num_nodes} nodes need an inter-node link and at least one NIC per node; "
                f"got inter_link={self.inter_link and self.inter_link.name!r}, nics_per_node="
                f"{self.nics_per_node}; fix: pass inter= (e.g. 'ib-hdr') and nics_per_node >= 1"
            )
        if not self.name:
            nic = f"+{self.nics_per_node}x{self.inter_link.name}" if self.inter_link and self.nics_per_node else ""
            object.__setattr__(self, "name", f"{self.num_nodes}x{self.gpus_per_node}x{self.device.name}{nic}")

    def __reduce__(self):
        """Pickle as a constructor call (mapping proxies and caches do not pickle)."""
        return (type(self), tuple(picklable(getattr(self, f.name)) for f in fields(self) if f.init))

    def __repr__(self) -> str:
        return f"Cluster({self.name!r})"

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_spec(cls, spec: str, catalog: Catalog = CATALOG) -> "Cluster":
        """A cluster from a spec string such as ``"4x8xA100-80GB"``, ``"2048xH100"`` or
        ``"2x8xA800-80GB+1xeth-25g"`` (case-insensitive; grammar in ``autopar.hardware.spec``).

        GPU names and the links not in the spec come from ``catalog`` (default: the rows of
        ``devices.py``), the links from the GPU's default box: SXM GPUs get NVSwitch and one NIC
        per GPU (DGX A100: 8 x ib-hdr; DGX H100/H200 and HGX H800: 8 x ib-ndr; HGX A800: 8 x
        ib-hdr), so a node of fewer GPUs gets as many NICs as GPUs (:meth:`catalog.Box.nics`);
        PCIe GPUs get PCIe between GPUs and 1 NIC.

        Raises:
            InvalidClusterSpec: naming the unreadable part and listing the valid names.
        """
        p = parse_spec(spec, catalog)
        return cls.custom(p.num_nodes, p.gpus_per_node, p.device, inter=p.nic_link,
                          nics_per_node=p.nics_per_node, catalog=catalog)

    @classmethod
    def custom(
        cls,
        num_nodes: int,
        gpus_per_node: int,
        gpu: str | Device,
        *,
        intra: str | LinkType | None = None,
        inter: str | LinkType | None = None,
        nics_per_node: int | None = None,
        name: str = "",
        comm_params: CommParams = DEFAULT_COMM_PARAMS,
        catalog: Catalog = CATALOG,
    ) -> "Cluster":
        """A cluster built from parts; any of ``intra``, ``inter``, ``nics_per_node`` left as None
        comes from the GPU's default box in ``catalog``. Links are link catalog names or
        :class:`LinkType` objects.

        Raises:
            InvalidClusterSpec: for an unknown GPU or link name, a hand-built GPU without explicit
                links, or any constructor check.
        """
        device = catalog.device(gpu)
        tmpl = catalog.box(device)
        if tmpl is None and (intra is None or (inter is None and num_nodes > 1) or nics_per_node is None):
            raise InvalidClusterSpec(
                f"GPU {device.name!r} is not in the catalog, so it has no default node; pass intra=, "
                f"inter= and nics_per_node= explicitly"
            )
        if tmpl is not None and tmpl.rack_scale and intra is None \
                and gpus_per_node > tmpl.gpus_per_node:
            raise InvalidClusterSpec(
                f"{gpus_per_node} GPUs per node: a {device.name} node is one NVLink domain of at "
                f"most {tmpl.gpus_per_node} GPUs ({tmpl.name}); fix: write racks as nodes, e.g. "
                f"'{max(1, -(-num_nodes * gpus_per_node // tmpl.gpus_per_node))}x"
                f"{tmpl.gpus_per_node}x{device.name}'")
        if tmpl is not None and not tmpl.rack_scale and intra is None \
                and gpus_per_node > tmpl.gpus_per_node \
                and get_link(tmpl.intra_link).kind in ("nvswitch", "nvlink"):
            # an HGX/DGX board's NVSwitch (or NVLink) fabric ends at its GPUs: a bigger node
            # would be priced as one NVLink domain that the default box does not have
            raise InvalidClusterSpec(
                f"{gpus_per_node} GPUs per node: a {device.name} node ({tmpl.name}) joins at most "
                f"{tmpl.gpus_per_node} GPUs over {tmpl.intra_link}; fix: write "
                f"'{-(-num_nodes * gpus_per_node // tmpl.gpus_per_node)}x{tmpl.gpus_per_node}x"
                f"{device.name}', or for a larger scale-up domain (e.g. an NVLink Switch System) "
                "build the cluster with Cluster.custom(..., intra=<link>) naming its link")
        intra_link = get_link(intra if intra is not None else tmpl.intra_link)
        inter_link = get_link(inter) if inter is not None else (get_link(tmpl.nic_link) if tmpl else None)
        nics = nics_per_node if nics_per_node is not None else (
            tmpl.nics(gpus_per_node) if tmpl else 0)
        host = tmpl.gpus_per_host if tmpl is not None and intra is None else 0
        return cls(num_nodes, gpus_per_node, device, intra_link, inter_link, nics, name, comm_params,
                   host if 0 < host < gpus_per_node else 0)

    # ----------------------------------------------------------------- structure
    @property
    def world_size(self) -> int:
        """Total GPUs: num_nodes x gpus_per_node."""
        return self.num_nodes * self.gpus_per_node

    def domain_text(self) -> str:
        """The node's scale-up fabric in words when it spans several hosts, e.g. "NVLink domain
        of 72 GPUs (18 trays x 4)"; "" for a node that is one host."""
        if not 0 < self.gpus_per_host < self.gpus_per_node:
            return ""
        trays = -(-self.gpus_per_node // self.gpus_per_host)
        return (f"{_LINK_NAME.get(self.intra_link.kind, self.intra_link.kind)} domain of "
                f"{self.gpus_per_node} GPUs ({trays} trays x {self.gpus_per_host})")

    def node_of(self, rank: int) -> int:
        """The node index of global ``rank``."""
        return rank // self.gpus_per_node

    def graph(self) -> nx.Graph:
        """The topology graph (frozen, cached; node and edge schema in ``topology.py``)."""
        if "graph" not in self._cache:
            self._cache["graph"] = nx.freeze(build_graph(
                self.name, self.num_nodes, self.gpus_per_node, self.device.pcie_bandwidth_Bps,
                self.intra_link, self.inter_link, self.nics_per_node, self.gpus_per_host))
        return self._cache["graph"]

    def fabric(self) -> collectives.Fabric:
        """Effective per-GPU bandwidths and alphas the collective model uses (cached).

        intra = intra_link bandwidth x efficiency of its kind (on a mesh link, all its peer links:
        a group's own share is :meth:`group_fabric`'s). Inter-node, per group member:
        nics_per_node x NIC bandwidth x efficiency / gpus_per_node (every GPU of the node runs a
        collective at once and shares the NICs), capped at the GPU's own PCIe rate (GPUDirect RDMA
        goes through it).
        """
        if "fabric" not in self._cache:
            eff = self.comm_params.efficiency
            intra = self.intra_link.bandwidth_Bps * eff[self.intra_link.kind]
            if self.inter_link is not None and self.nics_per_node:
                share = self.nics_per_node * self.inter_link.bandwidth_Bps * eff[self.inter_link.kind]
                inter = min(share / self.gpus_per_node, self.device.pcie_bandwidth_Bps)
                inter_lat = self.inter_link.latency_s
            else:
                inter, inter_lat = 0.0, 0.0
            self._cache["fabric"] = collectives.Fabric(
                intra, inter, self.intra_link.latency_s, inter_lat, self.comm_params.launch_latency_s,
                "pci" if self.intra_link.kind == "pcie" else "nvlink", self._p2p_channels(),
                self._p2p_channels_per_net_peer(),
            )
        return self._cache["fabric"]

    def _p2p_channels(self) -> int:
        """NCCL's ``p2pnChannels`` for a communicator over whole nodes of this cluster: its
        channels (:func:`autopar.hardware.nccl.collective_ctas`: 2 per NIC across nodes, the
        intra-node count inside one) rounded up to a power of 2, at most 32 (NVIDIA/nccl
        src/graph/paths.cc ``ncclTopoComputeP2pChannels``: ``min(nChannels,
        NCCL_MAX_P2P_NCHANNELS)`` then ``pow2Up``). A group using fewer of the node's NICs runs
        fewer channels; taking the node's is optimistic for it (it only matters past 8 x that
        many ranks, :func:`autopar.hardware.collectives.all_to_all_waves`)."""
        intra_cls, inter_cls = self.link_classes
        if inter_cls is not None and self.nics_per_node:
            ch = nccl.collective_ctas(inter_cls, self.nics_per_node)
        else:
            ch = nccl.collective_ctas(intra_cls, 0) if intra_cls != "local" else 1
        return min(collectives.MAX_P2P_CHANNELS, 1 << max(0, int(ch) - 1).bit_length())

    def _p2p_channels_per_net_peer(self) -> int:
        """NCCL's channels per peer on another node (NVIDIA/nccl src/graph/paths.cc
        ``ncclTopoGetNchannels``): ``max(netCount, ceil(netBw / 14 GB/s))`` over the NICs local
        to the GPU (``topo.cc`` ``ncclTopoGetLocalNetCountByBw``: its NICs, at line rate, until
        they reach the GPU's PCIe bandwidth; NIC ``j`` of ``k`` is local to GPUs ``j g / k`` ..,
        :func:`autopar.hardware.nccl.local_nics`), rounded up to a power of 2 (``pow2Up``); 1
        without NICs. NVLink peers allow more (2 per NVLink), so the network's is the minimum."""
        if self.inter_link is None or not self.nics_per_node:
            return 1
        per_gpu = max(1, self.nics_per_node // self.gpus_per_node)
        count, bw = 0, 0.0
        for _ in range(per_gpu):
            count += 1
            bw += self.inter_link.bandwidth_Bps
            if bw >= self.device.pcie_bandwidth_Bps:
                break
        if self.nics_per_node < self.gpus_per_node:   # GPUs share a NIC: NCCL counts it whole
            count, bw = 1, self.inter_link.bandwidth_Bps
        ch = max(count, -(-int(bw / 1e9) // 14))
        return 1 << max(0, ch - 1).bit_length()

    def group_fabric(self, layout: collectives.GroupLayout) -> collectives.Fabric:
        """:meth:`fabric` as a group laid out as ``layout`` sees it: on a mesh intra link
        (:attr:`LinkType.mesh_links`, AMD xGMI) a GPU reaches only the links to the group's other
        members on its node (its most-populated node: m - 1 of the 7 links), so the intra-node
        bandwidth is that share (:meth:`LinkType.group_bandwidth_Bps`); on switched fabrics
        it is :meth:`fabric` unchanged."""
        base = self.fabric()
        if not self.intra_link.mesh_links:
            return base
        meshes = self._cache.setdefault("mesh_fabrics", {})
        m = layout.max_per_node
        if m not in meshes:
            eff = self.comm_params.efficiency[self.intra_link.kind]
            meshes[m] = replace(base, intra_Bps=self.intra_link.group_bandwidth_Bps(m) * eff)
        return meshes[m]

    def _layout(self, ranks: Sequence[int]) -> collectives.GroupLayout:
        """The group's :class:`collectives.GroupLayout` (cached per rank tuple: the search
        times many collectives over the same groups)."""
        layouts = self._cache.setdefault("layouts", {})
        key = ranks if type(ranks) is tuple else None
        hit = layouts.get(key) if key is not None else None
        if hit is None:
            hit = self._new_layout(ranks)
            if key is not None:
                layouts[key] = hit
        return hit

    def _new_layout(self, ranks: Sequence[int]) -> collectives.GroupLayout:
        group = tuple(int(r) for r in ranks)
        if not group:
            raise InvalidParallelConfig("a process group needs at least one rank; got an empty sequence")
        bad = [r for r in group if not 0 <= r < self.world_size]
        if bad:
            raise InvalidParallelConfig(
                f"ranks {bad[:8]} are outside cluster {self.name!r} (world size {self.world_size})"
            )
        if len(set(group)) != len(group):
            raise InvalidParallelConfig(f"a process group lists a rank twice: {list(group)[:16]}")
        return collectives.layout_of(group, self.gpus_per_node)

    # ----------------------------------------------------------------- communication
    def collective_time(self, op: str, nbytes: float, ranks: Sequence[int], *, algorithm: str = "auto") -> float:
        """Seconds one ``op`` on ``nbytes`` takes over the group ``ranks`` (global ranks).

        ``op``: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv; ``nbytes``
        follows nccl-tests (module docstring of ``collectives.py``). ``algorithm="auto"`` returns the
        fastest of ring / tree / hierarchical (what NCCL's tuner would pick; hierarchical, NCCL's
        2-node tree, only on 2 nodes); naming one forces it, as
        ``NCCL_ALGO`` does. A single rank or zero bytes costs 0 s.

        Raises:
            InvalidParallelConfig: for an unknown op or algorithm, negative bytes, an empty group,
                duplicate ranks or ranks outside the cluster.
        """
        g = self._layout(ranks)
        return collectives.collective_seconds(op, float(nbytes), g, self.group_fabric(g), algorithm)

    def collective_load(self, op: str, nbytes: float, ranks: Sequence[int]) -> collectives.LinkLoad:
        """Bytes one GPU of the group sends over each link class, and seconds each link carries
        them, for ``op`` on ``nbytes`` under the algorithm :meth:`collective_time` picks
        (:func:`autopar.hardware.collectives.link_load`; the links are :attr:`link_classes`).

        Raises:
            InvalidParallelConfig: as :meth:`collective_time`.
        """
        g = self._layout(ranks)
        return collectives.link_load(op, float(nbytes), g, self.group_fabric(g))

    @property
    def link_classes(self) -> tuple[str, str | None]:
        """(the intra-node link class, the NIC link class or None): the names
        :meth:`link_class` reports and :class:`collectives.LinkLoad`'s intra / inter parts."""
        return (_LINK_CLASS[self.intra_link.kind],
                _LINK_CLASS[self.inter_link.kind] if self.inter_link is not None else None)

    def bus_bandwidth(self, op: str, nbytes: float, ranks: Sequence[int], *, algorithm: str = "auto") -> float:
        """nccl-tests bus bandwidth in bytes/s: (nbytes / time) x factor, the factor being 2(n-1)/n
        for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for broadcast and
        send_recv. 0.0 when nothing moves (one rank or zero bytes).

        Raises:
            InvalidParallelConfig: as :meth:`collective_time`.
        """
        seconds = self.collective_time(op, nbytes, ranks, algorithm=algorithm)
        if seconds == 0.0:
            return 0.0
        return float(nbytes) / seconds * collectives.bus_factor(op, len(ranks))

    def algorithm(self, op: str, nbytes: float, ranks: Sequence[int]) -> str:
        """Name of the algorithm ``collective_time(..., algorithm="auto")`` picks.

        Raises:
            InvalidParallelConfig: as :meth:`collective_time`.
        """
        g = self._layout(ranks)
        times = collectives.algorithm_times(op, float(nbytes), g, self.group_fabric(g))
        return min(times, key=lambda kv: kv[1])[0]

    def link_class(self, ranks: Sequence[int]) -> str:
        """The slowest link class the group crosses: ``"local"`` for one rank, else ``"nvlink"`` or
        ``"pcie"`` inside one node, or the NIC kind (``"infiniband"``, ``"roce"``, ``"efa"``, ``"ethernet"``)
        across nodes.

        Raises:
            InvalidParallelConfig: for an empty group, duplicates or ranks outside the cluster.
        """
        g = self._layout(ranks)
        if g.size == 1:
            return "local"
        if g.nodes == 1:
            return _LINK_CLASS[self.intra_link.kind]
        return _LINK_CLASS[self.inter_link.kind]
