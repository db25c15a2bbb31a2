"""The DeviceMesh of a plan, laid out in the plan's rank placement order.

``ParallelConfig.placement`` orders the mesh dimensions innermost first (consecutive ranks
differ along the first one): the mesh's dims are that order reversed, outermost first, as
``init_device_mesh`` lays a row-major mesh over ranks ``0..world-1``. This is the same rank
arithmetic as the cost model's groups (``autopar.cost.model.CostModel.group``): rank ``r`` has
coordinate ``(r // stride) % size`` along a dimension, strides growing outward.

The DP dimension is laid as two mesh dims, ``edp`` (outer) x ``ep`` (inner): experts are split
over the innermost ``ep`` ranks of the DP dimension, as the cost model and Megatron-LM do; for a
dense plan ``ep`` has size 1. Flattened groups the runtime reduces over:

- ``dp``: edp x ep, the data-parallel ranks (batch slices);
- ``dp_cp``: dp x cp, over which dense gradients are averaged and ZeRO shards (CP ranks hold the
  same weights; Megatron-LM's and torchtitan's ``dp_shard_cp``);
- ``edp_cp``: edp x cp, the ranks holding the same experts (expert gradients reduce there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autopar.config import DEFAULT_PLACEMENT
from autopar.errors import InvalidParallelConfig

#: Flattened groups and the mesh dims they join.
FLATTENED = {"dp": ("edp", "ep"), "dp_cp": ("edp", "ep", "cp"), "edp_cp": ("edp", "cp")}


def mesh_dims(config) -> tuple[tuple[str, int], ...]:
    """(name, size) of each mesh dim of ``config``, outermost first.

    Placement ``("tp", "cp", "dp", "pp")`` gives ``pp, edp, ep, cp, tp``.
    """
    order = config.placement or DEFAULT_PLACEMENT
    out: list[tuple[str, int]] = []
    for d in reversed(order):
        if d == "dp":
            out += [("edp", config.dp // config.ep), ("ep", config.ep)]
        else:
            out.append((d, getattr(config, d)))
    return tuple(out)


@dataclass(frozen=True)
class PlanMesh:
    """The root mesh and its 1-D sub-meshes by name.

    Attributes:
        root: the DeviceMesh with dims :func:`mesh_dims`.
        sub: name -> 1-D DeviceMesh for "pp", "tp", "cp", "ep", "edp" and the flattened
            :data:`FLATTENED` groups.
    """

    root: DeviceMesh
    sub: dict

    def __getitem__(self, name: str) -> DeviceMesh:
        return self.sub[name]

    def rank(self, name: str) -> int:
        """This rank's coordinate along ``name``."""
        return self.sub[name].get_local_rank()

    def group(self, name: str):
        """The process group of ``name`` holding this rank."""
        return self.sub[name].get_group()


def build_mesh(config, device_type: str, device_mesh: DeviceMesh | None = None) -> PlanMesh:
    """The plan's mesh over the whole world: ``device_mesh`` checked, or a new one.

    Raises:
        InvalidParallelConfig: the world or the given mesh does not match the plan's degrees.
    """
    dims = mesh_dims(config)
    names = tuple(n for n, _ in dims)
    sizes = tuple(s for _, s in dims)
    need = config.pp * config.dp * config.cp * config.tp
    world = dist.get_world_size()
    if world != need:
        raise InvalidParallelConfig(
            f"the plan needs {need} ranks (pp {config.pp} x dp {config.dp} x cp {config.cp} x tp "
            f"{config.tp}); the process group has {world}. Fix: launch {need} processes.")
    if device_mesh is None:
        root = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    else:
        got = tuple(device_mesh.mesh_dim_names or ())
        if got != names or tuple(device_mesh.mesh.shape) != sizes:
            raise InvalidParallelConfig(
                f"device_mesh has dims {got} of sizes {tuple(device_mesh.mesh.shape)}; the plan "
                f"needs {names} of sizes {sizes} (its placement, outermost first). Fix: pass "
                "device_mesh=None.")
        root = device_mesh
    sub = {n: root[n] for n in names}
    size = dict(dims)
    for flat, parts in FLATTENED.items():
        # slicing needs the dims in mesh order
        ordered = tuple(n for n in names if n in parts)
        wide = [n for n in ordered if size[n] > 1]
        # over at most one dim of size > 1 the group is that dim's: no new process group
        sub[flat] = sub[wide[0] if wide else ordered[0]] if len(wide) <= 1 else \
            root[ordered]._flatten(flat)
    return PlanMesh(root, sub)
