"""CPU offload: which frameworks run which kind, what leaves the GPU, and what the host copies
cost.

Three kinds, each a :class:`autopar.config.TrainingConfig` flag:

- ``optimizer_offload`` (ZeRO-Offload, Ren et al. 2021, USENIX ATC '21, sections 3.5 and 4.2):
  the fp32 master weights, moments and the optimizer step on the CPU; each rank copies its
  gradient shard to the host and the updated parameters back (priced in
  :mod:`autopar.cost.dp`).
- ``param_offload``: the ZeRO-3 parameter shards live on the host and each unit's shard is
  copied host-to-device before its all-gather. torch FSDP ``CPUOffload(offload_params=True)``
  (torch/distributed/fsdp/api.py): "If ``True``, then this offloads gradients to CPU as well,
  meaning that the optimizer step runs on CPU"; FSDP2's ``CPUOffloadPolicy`` (torch
  ``_fully_shard/_fsdp_api.py``): "Sharded parameters are copied host-to-device before
  all-gather ... Sharded gradients are copied device-to-host in backward, and the optimizer step
  runs on CPU with CPU optimizer states". DeepSpeed ``zero_optimization.offload_param``
  (docs/_pages/config-json.md: "Enable offloading of model parameters to CPU or NVMe ... Valid
  only with stage 3") moves only the compute-dtype partitions; the fp32 partitions and the
  optimizer stay on the GPU unless ``offload_optimizer`` is set too.
- ``activation_offload``: the tensors a decoder block saves for backward go to the host in
  forward and come back for its backward: ``torch.autograd.graph.save_on_cpu``, which FSDP's
  ``checkpoint_wrapper(offload_to_cpu=True)`` wraps (the AWS/Meta 1T FSDP blog, 2022:
  "Activations CPU Offloading is implemented as part of checkpoint_wrapper API using
  saved_on_cpu hooks"). Its ``pack_to_cpu`` copies with ``packed.copy_(tensor)`` and its
  ``unpack_from_cpu`` with ``tensor.to(device, non_blocking=pin_memory)``, both on the current
  (compute) stream: the copies add to the block's forward and backward (and to the compute
  component of the time breakdown), nothing hides them.

What stays on the GPU: the gathered parameters of the running and the prefetched unit (ZeRO-3's
working bytes, unchanged) and the shard each gather copies in before it all-gathers (here
:func:`staging_elements`); pinned host buffers are host memory. Host copies run at the
catalog's host PCIe rate per direction (:attr:`autopar.hardware.Device.pcie_bandwidth_Bps`, the
datasheet's x16 rate). FSDP issues the parameter copy on its pre-unshard stream ahead of the
all-gather and the gradient copy on its post-backward stream after the reduce-scatter
(torch/distributed/fsdp/_runtime_utils.py ``_unshard`` / ``_post_backward_hook``): they ride
with those collectives beside compute (:mod:`autopar.cost.dp`).

Not priced: the CPU optimizer step itself (the cluster model has no host memory bandwidth or
CPU throughput; an offloaded step is a lower bound, said in the estimate's notes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import ParallelConfig, TrainingConfig
from ..errors import InvalidParallelConfig, InvalidTrainingConfig


@dataclass(frozen=True)
class OffloadSupport:
    """The offload kinds one framework runs, each with where it was read (None: autopar has no
    source that it runs it).

    Attributes:
        params: source of ZeRO-3 parameter offload, or None.
        params_move_optimizer: parameter offload also moves the gradients and the optimizer step
            to the CPU (FSDP); False: only the parameters (DeepSpeed ``offload_param``).
        activations: source of activation offload, or None.
    """

    params: str | None = None
    params_move_optimizer: bool = True
    activations: str | None = None


_FSDP1_PARAMS = ("torch.distributed.fsdp CPUOffload(offload_params=True) (api.py: 'If True, then "
                 "this offloads gradients to CPU as well, meaning that the optimizer step runs "
                 "on CPU')")
_SAVE_ON_CPU = ("checkpoint_wrapper(offload_to_cpu=True) = torch.autograd.graph.save_on_cpu "
                "(torch/autograd/graph.py; the AWS/Meta FSDP 1T blog, 2022)")

#: Offload kinds per framework (:data:`autopar.config.FRAMEWORKS`); a framework not listed, or a
#: kind without a source, is refused with a fix (:func:`check_framework`).
SUPPORT: dict[str, OffloadSupport] = {
    "fsdp1": OffloadSupport(params=_FSDP1_PARAMS, activations=_SAVE_ON_CPU),
    "torchtitan": OffloadSupport(
        params="torchtitan v0.2.2 job_config.py training.enable_cpu_offload (FSDP2 "
               "CPUOffloadPolicy: parameters, gradients and optimizer states together)"),
    "torchtitan-0.3": OffloadSupport(
        params="torchtitan 0.3.0 config/configs.py TrainingConfig.enable_cpu_offload (FSDP2 "
               "CPUOffloadPolicy in models/llama3/parallelize.py apply_fsdp_to_decoder)"),
    "deepspeed": OffloadSupport(
        params="DeepSpeed zero_optimization.offload_param {device: cpu} (config-json.md: "
               "'Valid only with stage 3'); the optimizer moves with offload_optimizer only",
        params_move_optimizer=False),
}


def frameworks_running(kind: str) -> list[str]:
    """The frameworks of :data:`SUPPORT` with a source for offload ``kind`` ("params" or
    "activations"), in table order."""
    return [f for f, s in SUPPORT.items() if getattr(s, kind)]


def runs(framework: str, flag: str) -> bool:
    """Whether ``framework`` runs the offload of TrainingConfig field ``flag``
    (``param_offload`` or ``activation_offload`` per :data:`SUPPORT`; any other flag: True)."""
    kind = {"param_offload": "params", "activation_offload": "activations"}.get(flag)
    return kind is None or getattr(SUPPORT.get(framework, OffloadSupport()), kind) is not None


def check_framework(train: TrainingConfig) -> None:
    """Refuse an offload kind ``train.framework`` does not run (as autopar's sources say).

    Raises:
        InvalidTrainingConfig: the kind, the framework, the frameworks that run it and the fix.
    """
    s = SUPPORT.get(train.framework, OffloadSupport())
    for flag, kind in (("param_offload", "params"), ("activation_offload", "activations")):
        if getattr(train, flag) and getattr(s, kind) is None:
            others = frameworks_running(kind)
            cli = "--" + flag.replace("_", "-")
            raise InvalidTrainingConfig(
                f"{flag}=True ({cli}): autopar knows of no way framework {train.framework!r} "
                f"offloads {'parameters' if kind == 'params' else 'activations'} to the CPU "
                f"(frameworks that do, as autopar prices them: {others}). Fix: drop {flag} "
                f"({cli}), or use framework {others[0]!r} (--framework {others[0]}).")


def check_plan(train: TrainingConfig, c: ParallelConfig) -> None:
    """Refuse parameter offload on a plan that does not shard parameters.

    Raises:
        InvalidParallelConfig: ``param_offload`` without ZeRO-3 (FSDP full sharding).
    """
    if train.param_offload and c.zero_stage != 3:
        raise InvalidParallelConfig(
            f"param_offload=True offloads ZeRO-3 / FSDP parameter shards; zero_stage="
            f"{c.zero_stage} keeps whole parameters on every rank (DeepSpeed offload_param: "
            "'Valid only with stage 3'). Fix: zero_stage=3 (--zero 3), or drop param_offload "
            "(--param-offload); optimizer_offload offloads the optimizer under ZeRO 1-2.")


def effective(train: TrainingConfig) -> TrainingConfig:
    """``train`` as the cost model prices it: parameter offload under a framework that moves the
    gradients and the optimizer step with the parameters (FSDP) implies ``optimizer_offload``."""
    s = SUPPORT.get(train.framework)
    if train.param_offload and s is not None and s.params_move_optimizer \
            and not train.optimizer_offload:
        return replace(train, optimizer_offload=True)
    return train


def grads_on_host(train: TrainingConfig) -> bool:
    """Whether each gradient shard goes to the host as it is reduced, rather than after
    backward: parameter offload with the optimizer on the CPU (FSDP's, where
    :func:`effective` turns ``optimizer_offload`` on; DeepSpeed's ``offload_param`` with
    ``offload_optimizer``)."""
    return train.param_offload and train.optimizer_offload


def resident_states(train: TrainingConfig, states: tuple[float, float, float]
                    ) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes left on the GPU of a rank whose sharded
    states are ``states``: parameter offload takes the weight shards off, and under FSDP
    (:func:`grads_on_host` of the :func:`effective` config) the gradient shards too; the
    optimizer states are already 0 under ``optimizer_offload``."""
    w, g, o = states
    if train.param_offload:
        w = 0.0
        if grads_on_host(train):
            g = 0.0
    return (w, g, o)


def staging_elements(train: TrainingConfig, largest_layer: float, shards: int) -> float:
    """Parameter elements of the shard copies on the GPU beside ZeRO-3's gathered ones: the
    running and the prefetched unit's shard (``largest_layer`` elements over ``shards``
    ranks, the ZeRO group the parameters are sharded over: dp x cp, or a hybrid sharding's
    smaller group, :meth:`autopar.cost.states.ModelStates.zero_groups`; routed experts are
    counted at that group too), each copied in before its all-gather."""
    return 2 * largest_layer / shards if train.param_offload and shards > 0 else 0.0


def param_copy_s(train: TrainingConfig, shard_elements: float, weight_bytes: float,
                 grad_bytes: float, pcie_Bps: float) -> tuple[float, float]:
    """(seconds of one gather's host-to-device copy of the parameter shard, seconds of one
    reduction's device-to-host copy of the gradient shard) under parameter offload; the second
    is 0 when the gradients stay on the GPU (DeepSpeed ``offload_param`` alone)."""
    if not train.param_offload:
        return 0.0, 0.0
    h2d = shard_elements * weight_bytes / pcie_Bps
    d2h = shard_elements * grad_bytes / pcie_Bps if grads_on_host(train) else 0.0
    return h2d, d2h


def activation_copy(train: TrainingConfig, kind: str, saved_bytes: float, pcie_Bps: float
                    ) -> tuple[float, float]:
    """(bytes a layer keeps on the GPU between forward and backward, seconds of each of its
    two copies) for a layer of graph kind ``kind`` saving ``saved_bytes``: under
    ``activation_offload`` a decoder block keeps none (they come back for its backward, a
    transient) and copies them out in forward and in in backward on the compute stream."""
    if not train.activation_offload or kind != "block":
        return saved_bytes, 0.0
    return 0.0, saved_bytes / pcie_Bps


def offload_text(train: TrainingConfig) -> str:
    """", parameters and activations offloaded to the CPU" (the kinds ``train`` turns on, for a
    plan's or an estimate's header line), or "" when none is."""
    kinds = [k for k, on in (("optimizer", train.optimizer_offload),
                             ("parameters", train.param_offload),
                             ("activations", train.activation_offload)) if on]
    if not kinds:
        return ""
    return ", " + (" and ".join(kinds) if len(kinds) < 3 else
                   f"{kinds[0]}, {kinds[1]} and {kinds[2]}") + " offloaded to the CPU"
