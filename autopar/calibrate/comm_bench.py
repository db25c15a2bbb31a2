"""Collective microbenchmarks of ``autopar calibrate``, over the groups plans use.

Groups: inside a node, every power-of-two size up to the ranks per node (all of a node's ranks
busy in groups of that size at once, as the DP/TP groups of a plan are); across nodes, rail
groups of one rank per node (every local rank in its own rail at once, so the node's NICs are
shared as ``Cluster.fabric`` assumes). Ops: all_reduce, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single over each group, and send/recv between pairs of a
group's ranks (one direction; the receiver's time). Sizes: a geometric sweep (x4) between the
given bounds, in nccl-tests conventions (``hardware.collectives``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .bench import Clock, slowest, sync, timed
from .schema import COLLECTIVE_OPS, CollectiveSample

#: Bytes a timed repetition aims to move (sets iteration counts from sizes alone, the same on
#: every rank): 64 MiB, so small messages repeat up to the cap and large ones run a few times.
TARGET_BYTES = 64 * 2 ** 20
MAX_ITERS = 20
#: torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to *_single (the old names
#: warn); the same collectives, so the new name where it exists.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class GroupSet:
    """Groups of one shape covering the ranks: ``scope``, ``size``, ``nodes`` each spans, and
    ``groups`` (lists of global ranks)."""

    scope: str
    size: int
    nodes: int
    groups: tuple[tuple[int, ...], ...]


def group_sets(world: int, local: int) -> list[GroupSet]:
    """The measured group shapes of a world of ``world`` ranks, ``local`` per node."""
    nodes = world // local
    out = []
    g = 2
    while g <= local:
        if local % g == 0:
            out.append(GroupSet("intra", g, 1, tuple(
                tuple(node * local + j * g + i for i in range(g))
                for node in range(nodes) for j in range(local // g))))
        g *= 2
    if nodes > 1:
        out.append(GroupSet("inter", nodes, nodes, tuple(
            tuple(node * local + r for node in range(nodes)) for r in range(local))))
    return out


def check_group_sets(world: int, local: int) -> list[GroupSet]:
    """The shapes ``autopar calibrate --check`` measures: a node's ranks as one group (the
    one-node run nccl-tests makes) and the rail groups across nodes."""
    return [gs for gs in group_sets(world, local) if gs.scope == "inter" or gs.size == local]


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """min_bytes, 4 x min_bytes, ... up to max_bytes (bytes)."""
    out, n = [], min_bytes
    while n <= max_bytes:
        out.append(n)
        n *= 4
    return out


def _op_call(op: str, nbytes: int, n: int, group, rank_in: int, pair_peer: int | None,
             device: torch.device):
    """A zero-argument closure running ``op`` once on ``nbytes`` (nccl-tests conventions), or
    None when this rank has no part in it (send/recv outside a pair)."""
    elems = max(nbytes // 4 // n * n, n)  # float32, a multiple of the group size
    if op == "all_reduce":
        t = torch.ones(elems, device=device)
        return lambda: dist.all_reduce(t, group=group)
    if op == "all_gather":
        out = torch.empty(elems, device=device)
        inp = torch.ones(elems // n, device=device)
        return lambda: _ALL_GATHER(out, inp, group=group)
    if op == "reduce_scatter":
        inp = torch.ones(elems, device=device)
        out = torch.empty(elems // n, device=device)
        return lambda: _REDUCE_SCATTER(out, inp, group=group)
    if op == "all_to_all":
        inp = torch.ones(elems, device=device)
        out = torch.empty(elems, device=device)
        return lambda: dist.all_to_all_single(out, inp, group=group)
    if pair_peer is None:
        return None
    t = torch.ones(elems, device=device)
    if rank_in % 2 == 0:
        return lambda: dist.send(t, dst=pair_peer)
    return lambda: dist.recv(t, src=pair_peer)


def bench_collectives(world: int, local: int, byte_sizes: list[int], device: torch.device,
                      clock: Clock, shapes: list[GroupSet] | None = None,
                      ops: tuple[str, ...] = COLLECTIVE_OPS) -> list[CollectiveSample]:
    """Time every op of ``ops`` at every size over every group shape of ``shapes`` (default
    :func:`group_sets`), stopping, on every rank together, past the clock's deadline.

    Returns the samples with the slowest rank's median seconds (the same list on every rank).
    """
    rank = dist.get_rank()
    out: list[CollectiveSample] = []
    for gs in (group_sets(world, local) if shapes is None else shapes):
        mine, _ = dist.new_subgroups_by_enumeration([list(g) for g in gs.groups])
        members = next(g for g in gs.groups if rank in g)
        idx = members.index(rank)
        peer_idx = idx + 1 if idx % 2 == 0 else idx - 1
        peer = members[peer_idx] if peer_idx < len(members) else None
        for op in ops:
            if op == "send_recv" and gs.scope == "intra" and gs.size > 2:
                continue  # the same pairs as in groups of 2
            size_n = 2 if op == "send_recv" else gs.size
            nodes = min(gs.nodes, 2) if op == "send_recv" else gs.nodes
            for nbytes in byte_sizes:
                if clock.expired():
                    clock.notes.append(f"the budget ran out after {len(out)} collective "
                                       "measurements; the rest were not measured.")
                    return out
                if not out:
                    clock.say(f"collectives ({len(byte_sizes)} sizes per op and group shape)")
                fn = _op_call(op, nbytes, gs.size, mine, idx, peer, device)
                iters = max(1, min(MAX_ITERS, TARGET_BYTES // nbytes))
                dist.barrier()
                t = timed(fn, device, iters) if fn is not None else 0.0
                sync(device)
                elems = max(nbytes // 4 // gs.size * gs.size, gs.size)
                (t,) = slowest([t], device)
                out.append(CollectiveSample(op, gs.scope, size_n, nodes, elems * 4, t))
    return out
