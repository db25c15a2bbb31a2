"""``apply(plan, model)``: run a plan on stock ``torch.distributed``.

Order of the steps (torchtitan's): check the plan (:func:`autopar.runtime.validate.check_plan`);
build the DeviceMesh in the plan's placement order (:mod:`autopar.runtime.mesh`); split the MoE
experts over the EP group (:mod:`autopar.runtime.ep`); cut the model into this rank's pipeline
chunks; context parallelism (:mod:`autopar.runtime.cp`); tensor/sequence parallelism;
activation checkpointing; data parallelism over dp x cp (FSDP2, or gradient all-reduce with
ZeRO-1 sharded optimizer states, by ZeRO stage: :mod:`autopar.runtime.dp`); pipeline schedule;
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
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import loss_parallel

from autopar.errors import InvalidModelConfig, InvalidParallelConfig
from autopar.frameworks import get_profile, rules

from . import cp as cp_mod
from . import dp as dp_mod
from .adapters import Chunk, adapter_for, chunk_bounds, max_positions, tied_embeddings
from .ep import apply_ep, find_experts, is_expert_param
from .errors import UnsupportedPlanError
from .mesh import PlanMesh, build_mesh
from .pipeline import SPLIT_BACKWARD, build_schedule, local_chunk_ids
from .recompute import apply_recompute, clean_name
from .tp import apply_tp, check_tp, find_block_tp
from .validate import check_plan, schedule_name
from .zero1 import ShardedStates

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
        mesh: the :class:`~autopar.runtime.mesh.PlanMesh` (``mesh.root`` is the DeviceMesh,
            ``mesh["tp"]``, ``mesh["dp_cp"]``... its 1-D sub-meshes).
        modules: this rank's model chunks (one when ``pp == 1``), parallelised in place.
        schedule: the ``torch.distributed.pipelining`` schedule, or None without pipelining.
        optimizer: the optimizer over this rank's parameters (under ZeRO-1 over the parameters
            this rank owns: it holds 1/(dp x cp) of the optimizer states).
        micro_batch_size: sequences per micro-batch.
        notes: where the runtime departs from the plan's letter (e.g. ring CP run as all-gather).
    """

    plan: object
    mesh: PlanMesh
    modules: list[nn.Module]
    schedule: object | None
    optimizer: torch.optim.Optimizer
    micro_batch_size: int
    notes: tuple[str, ...] = field(default=())
    #: ZeRO-1's sharded optimizer states (its ``optimizer`` is :attr:`optimizer`), or None.
    sharded_states: ShardedStates | None = None
    #: this rank's CP layout, or None when cp = 1.
    cp: cp_mod.CPLayout | None = None

    @property
    def module(self) -> nn.Module:
        """The local module when there is no pipelining (raises otherwise)."""
        if self.schedule is not None:
            raise UnsupportedPlanError("a pipelined run has several modules: use .modules or "
                                       ".step().")
        return self.modules[0]

    def _local(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's part of a global batch: its DP slice of the sequences, then its CP share
        of the tokens (a DP-local batch is taken as it is)."""
        c = self.plan.config
        gbs = self.plan.train.global_batch_size
        local = gbs // c.dp
        if t.size(0) == gbs and c.dp > 1:
            r = self.mesh.rank("dp")
            t = t[r * local:(r + 1) * local]
        elif t.size(0) != local:
            raise InvalidParallelConfig(
                f"a batch of {t.size(0)} sequences: the plan trains {gbs} per step ({local} per "
                "DP rank). Fix: pass the global batch (same on every rank) or this rank's part.")
        t = t.to(self._device())
        return self.cp.split(t) if self.cp is not None else t

    def _device(self) -> torch.device:
        return next(self.modules[0].parameters()).device

    def _params(self) -> list[nn.Parameter]:
        return list(dict.fromkeys(p for m in self.modules for p in m.parameters()))

    def step(self, batch: torch.Tensor, labels: torch.Tensor) -> float:
        """Run one optimizer step and return its loss.

        Args:
            batch: token ids [global_batch_size, seq_len], the same on every rank (each DP rank
                takes its slice, each CP rank its tokens), or this DP rank's
                [global_batch_size / dp, seq_len].
            labels: target ids of the same shape (already shifted: ``labels[:, t]`` is the
                token after ``batch[:, t]``).

        Returns:
            The mean cross entropy over the whole global batch (the same on every rank): each
            micro-batch's mean, averaged over micro-batches and dp x cp ranks.

        Raises:
            InvalidParallelConfig: ``batch`` is not 2-D, ``labels`` has another shape, or the
                number of sequences is neither the global batch nor this DP rank's part.
        """
        if batch.dim() != 2 or labels.shape != batch.shape:
            raise InvalidParallelConfig(
                f"batch {tuple(batch.shape)} and labels {tuple(labels.shape)}: step takes token "
                "ids [sequences, seq_len] and labels of the same shape. Fix: pass "
                "tokens[:, :-1] and tokens[:, 1:] of one [sequences, seq_len + 1] tensor.")
        x, y = self._local(batch), self._local(labels)
        c = self.plan.config
        # loss_parallel reduces the vocabulary-sharded logits of the TP head.
        ctx = loss_parallel if c.tp > 1 else contextlib.nullcontext
        for m in self.modules:
            m.train()
        loss = (self._pipelined(x, y, ctx) if self.schedule is not None
                else self._accumulated(x, y, ctx))
        replicas = c.dp * c.cp
        if not dp_mod.uses_fsdp(c.zero_stage, replicas) and (replicas > 1 or c.ep > 1):
            self._reduce_gradients(replicas)
        if self.sharded_states is not None:
            self.sharded_states.step()
        else:
            self.optimizer.step()
        for m in self.modules:
            m.zero_grad(set_to_none=True)
        if replicas > 1:
            dist.all_reduce(loss, group=self.mesh.group("dp_cp"))
            loss /= replicas
        return float(loss)

    def _reduce_gradients(self, replicas: int) -> None:
        # dense weights are the same on all dp x cp ranks; each expert on the edp x cp ranks
        # holding it, its gradient already summed over the ep ranks that sent it tokens
        dense, experts = [], []
        for m in self.modules:
            for name, p in m.named_parameters():
                if p.grad is None and p.requires_grad:
                    # e.g. an expert no token reached: every rank must send the same buffers
                    p.grad = torch.zeros_like(p)
                (experts if is_expert_param(m, name) else dense).append(p)
        dp_mod.allreduce_gradients(dense, self.mesh.group("dp_cp"), replicas)
        if experts:
            dp_mod.allreduce_gradients(experts, self.mesh.group("edp_cp"), replicas)

    def _accumulated(self, x, y, ctx) -> torch.Tensor:
        module = self.modules[0]
        c = self.plan.config
        xs, ys = x.split(self.micro_batch_size), y.split(self.micro_batch_size)
        total = torch.zeros((), device=x.device)
        for i, (xi, yi) in enumerate(zip(xs, ys)):
            dp_mod.accumulate_sharded([module], c.zero_stage, i == len(xs) - 1)
            with ctx():
                loss = lm_loss(module(xi), yi) / len(xs)
                loss.backward()
            loss = loss.detach()
            total += loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        return total

    def _pipelined(self, x, y, ctx) -> torch.Tensor:
        c = self.plan.config
        losses: list[torch.Tensor] = []
        # the rank holding the last chunk (pp-1, or 0 for V-shaped schedules) computes the
        # loss; the one holding the first chunk takes the input
        first = any(m.has_embed for m in self.modules)
        last = any(m.has_head for m in self.modules)
        with ctx():
            kwargs = {}
            if last:
                kwargs = dict(target=y, losses=losses)
            if first:
                self.schedule.step(x, **kwargs)
            else:
                self.schedule.step(**kwargs)
        total = torch.zeros((), device=x.device)
        if losses:
            vals = [v.full_tensor() if hasattr(v, "full_tensor") else v for v in losses]
            total = torch.stack([v.detach().float() for v in vals]).mean()
        # Only the last stage knows the loss: a sum over the pipeline group shares it.
        if c.pp > 1:
            dist.all_reduce(total, group=self.mesh.group("pp"))
        return total

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's parameters as full (unsharded) tensors, named as in the original model.

        A collective over the TP, DP and EP groups: every rank of the same pipeline stage must
        call it. Pipeline ranks return only their own chunks' parameters; expert-parallel
        experts are gathered over the EP group into the full [E, ...] stacks.
        """
        out = {}
        for m in self.modules:
            for name, p in m.named_parameters():
                t = p.full_tensor() if hasattr(p, "full_tensor") else p
                if is_expert_param(m, name):
                    parts = [torch.empty_like(t) for _ in range(self.mesh["ep"].size())]
                    dist.all_gather(parts, t.detach().contiguous(),
                                    group=self.mesh.group("ep"))
                    t = torch.cat(parts)
                out[clean_name(name)] = t.detach()
        return out


def apply(plan, model: nn.Module, *, device_mesh: DeviceMesh | None = None,
          optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
          lr: float = 1e-3) -> ParallelRun:
    """Parallelise ``model`` by ``plan`` on this rank, inside an initialised process group.

    Args:
        plan: an :class:`autopar.Plan`.
        model: the full model (autopar ``Transformer`` or a Hugging Face Llama-family causal
            LM, Mixtral-style MoE included), the same weights on every rank, on this rank's
            device. It is changed in place and parts of it are taken into the returned modules.
        device_mesh: a mesh with the dims of :func:`autopar.runtime.mesh.mesh_dims` and the
            plan's sizes; None builds one.
        optimizer: ``optimizer(params)`` -> torch optimizer; default: the plan's optimizer
            (``plan.train.optimizer``) with learning rate ``lr``.

    Returns:
        :class:`ParallelRun`.

    Raises:
        UnsupportedPlanError: a rule of :func:`~autopar.runtime.validate.check_plan`; tied
            embeddings split by TP or PP; expert parallelism on a model without stacked experts;
            MoE layers under sequence parallelism; a model layout the runtime does not know; a
            model built for sequences shorter than the plan's ``train.seq_len`` (checked before
            any collective, so every rank raises it); a model with tensors on the meta device
            (no data to train); no initialised process group.
        InvalidParallelConfig: the world size, mesh, blocks or batch do not match the plan.
        InvalidModelConfig: ``model`` is not an ``nn.Module``.
    """
    check_plan(plan)
    _check_real(model)
    c, train = plan.config, plan.train
    adapter = adapter_for(model)
    seq_notes = []
    limit, hard = max_positions(model, adapter)
    if limit is not None and train.seq_len > limit:
        if hard:
            raise UnsupportedPlanError(
                f"the plan trains sequences of {train.seq_len} tokens; the model was built for "
                f"at most {limit} (its position table has {limit} rows), so the first step would "
                "fail inside torch. Fix: build the model with max sequence length >= "
                f"{train.seq_len}, e.g. autopar.models.build(name, seq_len={train.seq_len}), or "
                f"plan with seq_len <= {limit}.")
        seq_notes.append(f"the plan trains sequences of {train.seq_len} tokens, beyond the "
                         f"model's max_position_embeddings {limit}: positions past {limit} run, "
                         "but the model was not built for them.")
    _check_launched()
    device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
              else torch.device("cpu"))
    mesh = build_mesh(c, device.type, device_mesh)
    n_blocks = len(adapter.get(model, adapter.blocks))
    modes = c.block_recompute(n_blocks)
    v = c.virtual_stages or 1
    chunks = c.pp * v
    stage_blocks = c.stage_blocks or _balanced(n_blocks, chunks)
    cuts = rules.stage_cuts(stage_blocks, c.pp, v, n_blocks)
    if cuts is not None:
        raise rules.refuse(cuts, InvalidParallelConfig)
    if (c.tp > 1 or c.pp > 1) and tied_embeddings(model, adapter):
        raise UnsupportedPlanError(
            "tied input/output embeddings cannot yet be split by tensor or pipeline "
            "parallelism here. Fix: untie them, or plan with tp=1 and pp=1.")
    experts = find_experts(model)
    check_moe(c, experts)
    roles = None
    if c.tp > 1:
        roles = find_block_tp(model, adapter)
        check_tp(model, adapter, roles, c.tp)
    model.to(device)
    if c.ep > 1:
        apply_ep(experts, mesh.group("ep"))
    cp = cp_mod.layout(mesh.group("cp"), train.seq_len, c.cp_mode) if c.cp > 1 else None
    schedule = schedule_name(c) if c.pp > 1 else None
    ids = local_chunk_ids(c.pp, mesh.rank("pp"), chunks, schedule or "1f1b")
    replicas = c.dp * c.cp
    fsdp = dp_mod.uses_fsdp(c.zero_stage, replicas)
    modules, resharded = [], []
    for cid in ids:
        chunk = Chunk(model, adapter, *bounds_of(stage_blocks, cid), has_embed=cid == 0,
                      has_head=cid == chunks - 1)
        blocks = adapter.get(chunk, adapter.blocks)
        if cp is not None:
            chunk.cp = cp
            cp_mod.apply_cp(blocks, adapter.family, cp)
        if roles is not None:
            apply_tp(chunk, roles, mesh["tp"], c.sequence_parallel)
        apply_recompute(blocks, dict(enumerate(modes)))
        units = []
        if fsdp:
            units = dp_mod.apply_fsdp(
                chunk, blocks, mesh["dp_cp"], c.zero_stage, train.precision,
                experts=find_experts(chunk) if c.ep > 1 else [], expert_mesh=mesh["edp_cp"],
                expert_divide_factor=replicas,
                block_reshard=dict(enumerate(c.block_reshard(n_blocks))))
        modules.append(chunk)
        resharded.append(units)
    local_batch = train.global_batch_size // c.dp
    mbs = c.micro_batch_size or train.micro_batch_size or local_batch
    if schedule is not None:
        schedule = build_schedule(modules, ids, chunks, schedule, local_batch // mbs, lm_loss,
                                  mesh.group("pp"), device, c.zero_stage if fsdp else 0,
                                  resharded)
    params = list(dict.fromkeys(p for m in modules for p in m.parameters()))
    make = optimizer or (lambda ps: _OPTIMIZERS[train.optimizer](ps, lr=lr))
    states = None
    if c.zero_stage == 1 and replicas > 1:
        expert = list(dict.fromkeys(p for m in modules for n, p in m.named_parameters()
                                    if is_expert_param(m, n)))
        dense = [p for p in params if all(p is not e for e in expert)]
        states = ShardedStates([(dense, mesh.group("dp_cp")), (expert, mesh.group("edp_cp"))],
                               make)
        opt = states.optimizer
    else:
        opt = make(params)
    notes = seq_notes + _notes(c, cp)
    if fsdp and c.pp > 1 and schedule_name(c) in SPLIT_BACKWARD:
        notes.append(f"schedule {schedule_name(c)!r} splits backward into input and weight "
                     "passes: FSDP gradients are reduce-scattered once, after the last "
                     "micro-batch (torch's behaviour), so they are held unsharded until then, "
                     "and each pass gathers the whole chunk's parameters at once (ZeRO-3: "
                     "resharded after the weight pass).")
    return ParallelRun(plan, mesh, modules, schedule, opt, mbs, tuple(notes), states, cp)


def _check_real(model: nn.Module) -> None:
    """Raise :class:`InvalidModelConfig` for a ``model`` that is no ``nn.Module`` (a preset
    name, None), and :class:`UnsupportedPlanError` for one with a tensor on the meta device:
    it has no weights to move or train (torch's ``.to()`` would fail "Cannot copy out of meta
    tensor"). Pure, so every rank raises it."""
    if not isinstance(model, nn.Module):
        raise InvalidModelConfig(
            f"plan.apply needs the model itself, an nn.Module; got {type(model).__name__}. Fix: "
            "build it in real memory with the same weights on every rank, e.g. "
            "autopar.models.build(plan.model_config, device='cpu', dtype=torch.bfloat16, "
            "seed=0) (docs/apply.md).")
    meta = next((n for n, t in (*model.named_parameters(), *model.named_buffers())
                 if t.is_meta), None)
    if meta is not None:
        raise UnsupportedPlanError(
            f"the model is on the meta device ({meta!r} has no data), so there are no weights "
            "to shard and train. Fix: build the full model in real memory with the same "
            "weights on every rank, e.g. autopar.models.build(plan.model_config, "
            "device='cpu', dtype=torch.bfloat16, seed=0); a meta-device model is for "
            "planning (autopar.optimize) only.")


def _check_launched() -> None:
    """Raise :class:`UnsupportedPlanError` when no default process group is initialised
    (torch would fail inside ``get_world_size``)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise UnsupportedPlanError(
            "plan.apply runs on every rank of a process group, and none is initialised. Fix: "
            "launch the script with torchrun (plan.to_torchrun_command('train.py')) and call "
            "torch.distributed.init_process_group() before plan.apply, as docs/apply.md's "
            "train.py does.")


def check_moe(c, experts: list) -> None:
    """Raise if :func:`apply` cannot run the MoE layers ``experts`` (:func:`find_experts` of the
    model; [] for a dense model) under the resolved configuration ``c``. Pure: no process
    group; the model may be on the meta device.

    Raises:
        UnsupportedPlanError: ep > 1 on a model without stacked experts; a dispatcher other
            than all-to-all with ep > 1 (:func:`autopar.runtime.ep.dispatch_forward` runs
            all-to-all only); MoE layers under
            sequence parallelism (the ``torch`` profile's rule,
            :func:`autopar.frameworks.rules.moe_sp`, which the search reads too).
    """
    if c.ep > 1 and not experts:
        raise UnsupportedPlanError(
            f"ep={c.ep}: the model has no stacked-experts MoE layers (gate_up_proj/down_proj "
            "[experts, ...]) for expert parallelism to split. Fix: plan with ep=1.")
    if c.ep > 1 and experts and c.dispatcher != "alltoall":
        # autopar/runtime/ep.py dispatch_forward: all_to_all_single of the routed rows only
        raise UnsupportedPlanError(
            f"dispatcher {c.dispatcher!r}: plan.apply dispatches MoE tokens with all-to-all "
            "only (autopar/runtime/ep.py). Fix: plan with dispatcher='alltoall' (the torch "
            "profile's only dispatcher), or run the plan in Megatron-LM "
            "(plan.to_megatron_args()).")
    why = rules.moe_sp(get_profile("torch"), c.tp, c.sequence_parallel) if experts else None
    if why:
        raise rules.refuse(why, UnsupportedPlanError, "MoE layers under sequence parallelism: ")


def _notes(c, cp) -> list[str]:
    notes = []
    if cp is not None and not cp.balanced:
        notes.append(f"the sequence does not split into 2 x cp = {2 * c.cp} equal chunks: each "
                     "CP rank holds one contiguous chunk (causal work unbalanced).")
    if c.zero_stage >= 2 and c.dp * c.cp == 1:
        notes.append(f"zero_stage {c.zero_stage} with dp x cp = 1: nothing to shard; FSDP not "
                     "applied.")
    return notes


def bounds_of(stage_blocks: tuple[int, ...], chunk: int) -> tuple[int, int]:
    """(first, stop) block indices of chunk ``chunk``."""
    return chunk_bounds(stage_blocks)[chunk]


def _balanced(n_blocks: int, chunks: int) -> tuple[int, ...]:
    base, extra = divmod(n_blocks, chunks)
    return tuple(base + (1 if i < extra else 0) for i in range(chunks))
