"""The cluster as a networkx graph: GPUs, their node fabric, NICs on rails, and the network switch.

Node keys (tuples) and their ``type`` attribute:

* ``("gpu", rank)`` - type ``"gpu"``, attributes ``node``, ``local_rank`` and ``tray`` (the server
  tray within a rack-scale node, ``local_rank // gpus_per_host``; 0 when the node is one host).
* ``("nvswitch", node)`` - one per node when the intra link is an NVSwitch fabric (for an NVL72
  rack, the NVLink Switch trays joining all 72 GPUs, as one logical switch).
* A mesh intra link (kind ``xgmi``, AMD Infinity Fabric) adds no switch: an edge joins every pair
  of GPUs of a node, each at one peer link's bandwidth (the row's aggregate / ``mesh_links``).
* ``("pcie_switch", node, i)`` - one per two GPUs (DGX/HGX boards pair two GPUs and their NICs on one
  PCIe switch; assumed for PCIe boxes as well). GPUs always hang off one, NICs too.
* ``("host", node)`` - the CPU root complex; in PCIe boxes peer traffic crosses it.
* ``("nic", node, j)`` - type ``"nic"``, attribute ``rail`` = j; NIC j serves local GPUs
  ``local * nics // gpus_per_node == j`` (rail-optimised wiring).
* ``("net_switch",)`` - one logical network switch all NICs plug into (multi-tier fabrics flattened).

Every edge has ``link`` (catalog name), ``kind``, ``bandwidth_Bps`` (per direction) and ``latency_s``.
"""

from __future__ import annotations

import networkx as nx

from autopar.hardware.links import LINKS, LinkType

#: GPUs sharing one PCIe switch (DGX A100 / DGX H100 board layout; assumption for other boxes).
GPUS_PER_PCIE_SWITCH = 2


def _edge(link) -> dict:
    return {"link": link.name, "kind": link.kind, "bandwidth_Bps": link.bandwidth_Bps, "latency_s": link.latency_s}


def pcie_switch_of(local_rank: int) -> int:
    """Index of the PCIe switch a GPU with this local rank hangs off."""
    return local_rank // GPUS_PER_PCIE_SWITCH


def build_graph(name: str, num_nodes: int, gpus_per_node: int, pcie_bandwidth_Bps: float,
                intra_link: LinkType, inter_link: LinkType | None, nics_per_node: int,
                gpus_per_host: int = 0) -> nx.Graph:
    """A new (mutable) topology graph; ``Cluster.graph()`` caches a frozen copy.

    Args:
        name: the graph's name (the cluster's).
        num_nodes, gpus_per_node: the boxes and the GPUs in each.
        pcie_bandwidth_Bps: the GPU's PCIe rate per direction (bytes/s); PCIe edges use a
            ``pcie-genN`` row chosen by bandwidth when one matches, else a synthetic ``pcie`` link.
        intra_link, inter_link: the node fabric and the network link (None: a single node).
        nics_per_node: NICs per node (rail-optimised wiring).
        gpus_per_host: GPUs per server tray of a rack-scale node (the GPUs' ``tray``); 0: one host.
    """
    g = nx.Graph(name=name)
    gpn = gpus_per_node
    pcie = next((lt for lt in LINKS.values() if lt.kind == "pcie" and lt.bandwidth_Bps == pcie_bandwidth_Bps),
                None) or LinkType("pcie", "pcie", pcie_bandwidth_Bps, 1e-6, "device PCIe rate")
    n_switches = max(1, -(-gpn // GPUS_PER_PCIE_SWITCH))
    if inter_link is not None and nics_per_node:
        g.add_node(("net_switch",), type="net_switch")
    for node in range(num_nodes):
        g.add_node(("host", node), type="host", node=node)
        for s in range(n_switches):
            g.add_node(("pcie_switch", node, s), type="pcie_switch", node=node)
            g.add_edge(("pcie_switch", node, s), ("host", node), **_edge(pcie))
        fabric = intra_link.kind in ("nvswitch", "nvlink")
        if fabric:
            g.add_node(("nvswitch", node), type="nvswitch", node=node)
        for local in range(gpn):
            gpu = ("gpu", node * gpn + local)
            g.add_node(gpu, type="gpu", node=node, local_rank=local,
                       tray=local // gpus_per_host if gpus_per_host else 0)
            g.add_edge(gpu, ("pcie_switch", node, pcie_switch_of(local)), **_edge(pcie))
            if fabric:
                g.add_edge(gpu, ("nvswitch", node), **_edge(intra_link))
        if intra_link.mesh_links:
            peer = {**_edge(intra_link), "bandwidth_Bps": intra_link.bandwidth_Bps / intra_link.mesh_links}
            for a in range(gpn):
                for b in range(a + 1, gpn):
                    g.add_edge(("gpu", node * gpn + a), ("gpu", node * gpn + b), **peer)
        if inter_link is None:
            continue
        for j in range(nics_per_node):
            nic = ("nic", node, j)
            rail_gpus = [i for i in range(gpn) if i * nics_per_node // gpn == j]
            g.add_node(nic, type="nic", node=node, rail=j, gpus=tuple(node * gpn + i for i in rail_gpus))
            first = rail_gpus[0] if rail_gpus else j % gpn
            g.add_edge(nic, ("pcie_switch", node, pcie_switch_of(first)), **_edge(pcie))
            g.add_edge(nic, ("net_switch",), **_edge(inter_link))
    return g
