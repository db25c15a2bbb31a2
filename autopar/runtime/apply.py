"""``apply(plan, model)``: run a plan on stock ``torch.distributed``.

Order of the steps (torchtitan's): build the DeviceMesh; cut the model into this rank's
pipeline chunks; tensor/sequence parallelism; activation checkpointing; data parallelism (FSDP2
or gradient all-reduce, by ZeRO stage: see :mod:`autopar.runtime.dp`); pipeline schedule;
optimizer. The returned :class:`ParallelRun` has a ``step(batch, labels)`` that runs one
optimizer step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel

from autopar.errors import InvalidParallelConfig

from . import dp as dp_mod
from .adapters import Chunk, adapter_for, chunk_bounds, max_positions, tied_embeddings
from .errors import UnsupportedPlanError
from .pipeline import build_schedule, local_chunk_ids
from .recompute import apply_recompute, clean_name
from .tp import apply_tp, check_tp, find_block_tp

#: Mesh dimensions, outermost to innermost: TP innermost so its ranks are neighbours (one node),
#: PP outermost (Megatron-LM's and torchtitan's order).
MESH_DIMS = ("pp", "dp", "cp", "tp")

_OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy of ``logits`` [b, s, V] against ``labels`` [b, s], in fp32.

    ``logits`` may be a vocabulary-sharded DTensor; call it inside ``loss_parallel()`` then.
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


@dataclass
class ParallelRun:
    """What a training loop needs after :func:`apply`.

    Attributes:
        plan: the applied plan.
        mesh: the DeviceMesh (dims :data:`MESH_DIMS`).
        modules: this rank's model chunks (one when ``pp == 1``), parallelised in place.
        schedule: the ``torch.distributed.pipelining`` schedule, or None without pipelining.
        optimizer: the optimizer over this rank's parameters.
        micro_batch_size: sequences per micro-batch.
        notes: where the runtime departs from the plan (e.g. ZeRO-1 states not sharded).
    """

    plan: object
    mesh: DeviceMesh
    modules: list[nn.Module]
    schedule: object | None
    optimizer: torch.optim.Optimizer
    micro_batch_size: int
    notes: tuple[str, ...] = field(default=())

    @property
    def module(self) -> nn.Module:
        """The local module when there is no pipelining (raises otherwise)."""
        if self.schedule is not None:
            raise UnsupportedPlanError("a pipelined run has several modules: use .modules or "
                                       ".step().")
        return self.modules[0]

    def _coords(self) -> dict[str, int]:
        return {d: self.mesh[d].get_local_rank() for d in MESH_DIMS}

    def _local(self, t: torch.Tensor) -> torch.Tensor:
        """This DP rank's part of a global batch (a local batch is returned as it is)."""
        c = self.plan.config
        gbs = self.plan.train.global_batch_size
        local = gbs // c.dp
        if t.size(0) == gbs and c.dp > 1:
            r = self._coords()["dp"]
            t = t[r * local:(r + 1) * local]
        elif t.size(0) != local:
            raise InvalidParallelConfig(
                f"a batch of {t.size(0)} sequences: the plan trains {gbs} per step ({local} per "
                "DP rank). Fix: pass the global batch (same on every rank) or this rank's part.")
        return t.to(self._device())

    def _device(self) -> torch.device:
        return next(self.modules[0].parameters()).device

    def step(self, batch: torch.Tensor, labels: torch.Tensor) -> float:
        """Run one optimizer step and return its loss.

        Args:
            batch: token ids [global_batch_size, seq_len], the same on every rank (each DP rank
                takes its slice), or this DP rank's [global_batch_size / dp, seq_len].
            labels: target ids of the same shape (already shifted: ``labels[:, t]`` is the
                token after ``batch[:, t]``).

        Returns:
            The mean cross entropy over the whole global batch (the same on every rank): each
            micro-batch's mean, averaged over micro-batches and DP ranks.
        """
        x, y = self._local(batch), self._local(labels)
        c = self.plan.config
        # loss_parallel reduces the vocabulary-sharded logits of the TP head.
        ctx = loss_parallel if c.tp > 1 else contextlib.nullcontext
        for m in self.modules:
            m.train()
        loss = (self._pipelined(x, y, ctx) if self.schedule is not None
                else self._accumulated(x, y, ctx))
        fsdp = dp_mod.uses_fsdp(c.zero_stage, c.dp)
        if c.dp > 1 and not fsdp:
            dp_mod.allreduce_gradients(self.modules, self.mesh["dp"].get_group(), c.dp)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if c.dp > 1:
            dist.all_reduce(loss, group=self.mesh["dp"].get_group())
            loss /= c.dp
        return float(loss)

    def _accumulated(self, x, y, ctx) -> torch.Tensor:
        module = self.modules[0]
        xs, ys = x.split(self.micro_batch_size), y.split(self.micro_batch_size)
        total = torch.zeros((), device=x.device)
        for i, (xi, yi) in enumerate(zip(xs, ys)):
            # FSDP reduces gradients only after the last micro-batch of the step.
            dp_mod.set_gradient_sync([module], i == len(xs) - 1)
            with ctx():
                loss = lm_loss(module(xi), yi) / len(xs)
                loss.backward()
            loss = loss.detach()
            total += loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        return total

    def _pipelined(self, x, y, ctx) -> torch.Tensor:
        c = self.plan.config
        rank = self._coords()["pp"]
        losses: list[torch.Tensor] = []
        with ctx():
            if rank == 0:
                self.schedule.step(x)
            elif rank == c.pp - 1:
                self.schedule.step(target=y, losses=losses)
            else:
                self.schedule.step()
        total = torch.zeros((), device=x.device)
        if losses:
            vals = [v.full_tensor() if hasattr(v, "full_tensor") else v for v in losses]
            total = torch.stack([v.detach().float() for v in vals]).mean()
        # Only the last stage knows the loss: a sum over the pipeline group shares it.
        dist.all_reduce(total, group=self.mesh["pp"].get_group())
        return total

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's parameters as full (unsharded) tensors, named as in the original model.

        A collective over the TP and DP groups: every rank of the same pipeline stage must call
        it. Pipeline ranks return only their own chunks' parameters.
        """
        out = {}
        for m in self.modules:
            for name, p in m.named_parameters():
                t = p.full_tensor() if hasattr(p, "full_tensor") else p
                out[clean_name(name)] = t.detach()
        return out


def build_mesh(config, device_mesh: DeviceMesh | None, device_type: str) -> DeviceMesh:
    """The plan's mesh: ``device_mesh`` checked, or a new one over the world in
    :data:`MESH_DIMS` order.

    Raises:
        InvalidParallelConfig: the world or the given mesh does not match the plan's degrees.
    """
    sizes = {"pp": config.pp, "dp": config.dp, "cp": config.cp, "tp": config.tp}
    world = dist.get_world_size()
    need = config.pp * config.dp * config.cp * config.tp
    if world != need:
        raise InvalidParallelConfig(
            f"the plan needs {need} ranks (pp {config.pp} x dp {config.dp} x cp {config.cp} x tp "
            f"{config.tp}); the process group has {world}. Fix: launch {need} processes.")
    if device_mesh is None:
        return init_device_mesh(device_type, tuple(sizes.values()), mesh_dim_names=MESH_DIMS)
    names = device_mesh.mesh_dim_names or ()
    if tuple(names) != MESH_DIMS or tuple(device_mesh.mesh.shape) != tuple(sizes.values()):
        raise InvalidParallelConfig(
            f"device_mesh has dims {names} of sizes {tuple(device_mesh.mesh.shape)}; the plan "
            f"needs {MESH_DIMS} of sizes {tuple(sizes.values())}. Fix: pass device_mesh=None.")
    return device_mesh


def apply(plan, model: nn.Module, *, device_mesh: DeviceMesh | None = None,
          optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
          lr: float = 1e-3) -> ParallelRun:
    """Parallelise ``model`` by ``plan`` on this rank, inside an initialised process group.

    Args:
        plan: an :class:`autopar.Plan`.
        model: the full model (autopar ``Transformer`` or a Hugging Face Llama-family causal
            LM), the same weights on every rank, on this rank's device. It is changed in place
            and parts of it are taken into the returned modules.
        device_mesh: a mesh with dims :data:`MESH_DIMS` and the plan's sizes; None builds one.
        optimizer: ``optimizer(params)`` -> torch optimizer; default: the plan's optimizer
            (``plan.train.optimizer``) with learning rate ``lr``.

    Returns:
        :class:`ParallelRun`.

    Raises:
        InvalidParallelConfig: the world size, mesh, blocks or batch do not match the plan.
        UnsupportedPlanError: context or expert parallelism, tied embeddings split by TP or PP, a model
            layout the runtime does not know, a model built for sequences shorter than the plan's
            ``train.seq_len`` (checked before any collective, so every rank raises it).
    """
    c, train = plan.config, plan.train
    if c.cp > 1:
        raise UnsupportedPlanError(
            f"cp={c.cp}: context parallelism is not applied by autopar.runtime yet. Fix: plan "
            "with fixed={'cp': 1}.")
    if c.ep > 1:
        raise UnsupportedPlanError(
            f"ep={c.ep}: expert parallelism is not applied by autopar.runtime yet. Fix: plan "
            "with fixed={'ep': 1}, or export the plan to Megatron-LM.")
    adapter = adapter_for(model)
    notes = []
    limit, hard = max_positions(model, adapter)
    if limit is not None and train.seq_len > limit:
        if hard:
            raise UnsupportedPlanError(
                f"the plan trains sequences of {train.seq_len} tokens; the model was built for "
                f"at most {limit} (its position table has {limit} rows), so the first step would "
                "fail inside torch. Fix: build the model with max sequence length >= "
                f"{train.seq_len}, e.g. autopar.models.build(name, seq_len={train.seq_len}), or "
                f"plan with seq_len <= {limit}.")
        notes.append(f"the plan trains sequences of {train.seq_len} tokens, beyond the model's "
                     f"max_position_embeddings {limit}: positions past {limit} run, but the model "
                     "was not built for them.")
    device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
              else torch.device("cpu"))
    mesh = build_mesh(c, device_mesh, device.type)
    n_blocks = len(adapter.get(model, adapter.blocks))
    modes = c.block_recompute(n_blocks)
    v = c.virtual_stages or 1
    chunks = c.pp * v
    stage_blocks = c.stage_blocks or _balanced(n_blocks, chunks)
    if len(stage_blocks) != chunks or sum(stage_blocks) != n_blocks:
        raise InvalidParallelConfig(
            f"stage_blocks {stage_blocks} must give {chunks} chunks (pp x virtual_stages) "
            f"summing to the model's {n_blocks} blocks.")
    if (c.tp > 1 or c.pp > 1) and tied_embeddings(model, adapter):
        raise UnsupportedPlanError(
            "tied input/output embeddings cannot yet be split by tensor or pipeline "
            "parallelism here. Fix: untie them, or plan with tp=1 and pp=1.")
    roles = None
    if c.tp > 1:
        roles = find_block_tp(model, adapter)
        check_tp(model, adapter, roles, c.tp)
    model.to(device)
    pp_rank = mesh["pp"].get_local_rank()
    ids = local_chunk_ids(c.pp, pp_rank, chunks)
    bounds = chunk_bounds(stage_blocks)
    fsdp = dp_mod.uses_fsdp(c.zero_stage, c.dp)
    modules = []
    for cid in ids:
        chunk = Chunk(model, adapter, *bounds[cid], has_embed=cid == 0, has_head=cid == chunks - 1)
        if roles is not None:
            apply_tp(chunk, roles, mesh["tp"], c.sequence_parallel)
        blocks = adapter.get(chunk, adapter.blocks)
        apply_recompute(blocks, dict(enumerate(modes)))
        if fsdp:
            dp_mod.apply_fsdp(chunk, blocks, mesh["dp"], c.zero_stage, train.precision)
        modules.append(chunk)
    local_batch = train.global_batch_size // c.dp
    mbs = c.micro_batch_size or train.micro_batch_size or local_batch
    if local_batch % mbs:
        raise InvalidParallelConfig(
            f"micro_batch_size {mbs} does not divide the {local_batch} sequences per DP rank.")
    schedule = None
    if c.pp > 1:
        schedule = build_schedule(modules, ids, chunks, c.schedule or "1f1b", local_batch // mbs,
                                  lm_loss, mesh["pp"].get_group(), device)
    params = list(dict.fromkeys(p for m in modules for p in m.parameters()))
    opt = optimizer(params) if optimizer else _OPTIMIZERS[train.optimizer](params, lr=lr)
    if c.zero_stage == 1 and c.dp > 1:
        notes.append("zero_stage 1: optimizer states are not sharded (gradients are all-reduced "
                     "and every DP rank keeps full optimizer states).")
    if c.zero_stage >= 2 and c.dp == 1:
        notes.append(f"zero_stage {c.zero_stage} with dp=1: nothing to shard; FSDP not applied.")
    return ParallelRun(plan, mesh, modules, schedule, opt, mbs, tuple(notes))


def _balanced(n_blocks: int, chunks: int) -> tuple[int, ...]:
    base, extra = divmod(n_blocks, chunks)
    return tuple(base + (1 if i < extra else 0) for i in range(chunks))
