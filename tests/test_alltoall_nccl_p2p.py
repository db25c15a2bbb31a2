"""NCCL's all-to-all as autopar prices it (issue 26): the peers progress at once, in rounds of
8 per channel over up to 32 channels, and the proxy posts each remote connection's first
network operation (autopar.hardware.collectives: all_to_all_waves, p2p_net_parts,
all_to_all_net_posts_s; NVIDIA/nccl enqueue.cc, paths.cc, init.cc, proxy.cc, tuning.cc)."""

import pytest

from autopar.hardware import Cluster
from autopar.hardware.collectives import (Fabric, GroupLayout, all_to_all_net_posts_s,
                                          all_to_all_waves, p2p_net_parts)

KiB, MiB = 1024, 2 ** 20
_F = Fabric(400e9, 40e9, 1e-6, 28e-6, 5e-6, "nvlink", 32, 4)


def _across(n, per_node=8):
    return GroupLayout(n, n // per_node, per_node, per_node, True)


@pytest.mark.parametrize("layout, channels, waves", [
    (GroupLayout(8, 1, 8, 8, False), 32, 1),     # one NVLink node: 8 peers a round
    (GroupLayout(72, 1, 72, 72, False), 32, 9),  # one NVL72 domain: a peer takes every channel
    (_across(256), 32, 1),                       # across nodes: all peers in one round up to 256
    (_across(512), 32, 2),
    (_across(256), 16, 2)])                      # 8 NICs x 2 channels: 16 p2p channels
def test_rounds_of_peers_follow_nccl_p2p_schedule(layout, channels, waves):
    f = Fabric(400e9, 40e9, 1e-6, 28e-6, 5e-6, "nvlink", channels, 4)
    assert all_to_all_waves(layout, f) == waves


@pytest.mark.parametrize("n, peer_bytes, parts", [
    (16, 2 * MiB, 4),      # 4 channels per peer, 512 KiB parts
    (32, 1 * MiB, 4),      # the minimum drops to 1 (1 x 32 <= 32) but 1 MiB still splits in 4
    (64, 512 * KiB, 4),    # 4 x ceil(64 / 8) = 32: still 4 per peer
    (128, 256 * KiB, 2),   # halved to 2 per peer: 4 x 16 > 32
    (256, 128 * KiB, 1),   # one chunk, one channel
    (16, 8 * KiB, 1)])     # below half a chunk: one part
def test_parts_per_remote_peer_follow_add_p2p_to_plan(n, peer_bytes, parts):
    assert p2p_net_parts(peer_bytes, _across(n), _F) == parts


def test_posts_are_two_per_remote_connection_at_nccls_net_overhead():
    g = _across(16)
    assert all_to_all_net_posts_s(16 * 4 * KiB, g, _F) == pytest.approx(2 * 8 * 1e-6)  # LL
    assert all_to_all_net_posts_s(16 * 2 * MiB, g, _F) == pytest.approx(2 * 8 * 4 * 3e-6)
    assert all_to_all_net_posts_s(8 * MiB, GroupLayout(8, 1, 8, 8, False), _F) == 0.0


@pytest.mark.parametrize("spec, channels, per_peer", [
    ("2x8xH100-SXM5-80GB+32xefa-v2-100g", 32, 4),   # p5: 4 x 12.5 GB/s EFA per GPU
    ("2x8xH100-SXM5-80GB+8xib-ndr", 16, 4)])        # DGX H100: 1 x 50 GB/s -> ceil(50 / 14)
def test_cluster_fabric_carries_nccl_p2p_channels(spec, channels, per_peer):
    f = Cluster.from_spec(spec).fabric()
    assert (f.p2p_channels, f.p2p_channels_per_peer) == (channels, per_peer)


def test_one_node_all_to_all_pays_one_nvlink_step_not_one_per_peer():
    c = Cluster.from_spec("1x8xH100-SXM5-80GB")
    f = c.fabric()
    t = c.collective_time("all_to_all", 64 * MiB, tuple(range(8)))
    assert t == pytest.approx(f.launch_latency_s + f.intra_latency_s + 7 / 8 * 64 * MiB / f.intra_Bps)
