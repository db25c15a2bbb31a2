"""Hardware: the GPU and link catalogs, cluster topology, and the collective cost model.

``Cluster.from_spec("4x8xA100-80GB")`` builds a cluster; ``cluster.collective_time(op, nbytes, ranks)``
costs a collective; ``rank_groups(cluster, {"tp": 8, "dp": 4})`` places a parallel mesh on ranks.
"""

from autopar.hardware.cluster import Cluster
from autopar.hardware.devices import Device, get_device, list_devices
from autopar.hardware.links import LinkType, get_link, list_links
from autopar.hardware.placement import rank_groups

__all__ = ["Device", "LinkType", "Cluster", "get_device", "list_devices", "get_link", "list_links", "rank_groups"]
