"""PithTrain's sharded data parallelism (mlc-ai/pith-train at 093a9e4, PR #40, 2026-05): FSDP2
(``fully_shard``) composed with its own DualPipeV loop, as a record option on the profile its
records take (:func:`with_pithtrain_fsdp`), not a profile of its own.

What its code does under ZeRO-3 with a pipeline:

- ``pithtrain/modules/training.py`` ``apply_fsdp``: each decoder layer and its experts are
  ``fully_shard(..., reshard_after_forward=False)``, while ``embed_tokens``, ``norm`` and
  ``lm_head`` are ``fully_shard(..., reshard_after_forward=True)``; mixed precision
  ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``.
- ``pithtrain/dualpipe/dualpipev.py`` ``DualPipeV.step``: before the schedule every FSDP module
  gets ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)``; after
  the schedule's last step (and ``_commit_and_wait_comm``) ``run_post_backward`` turns the
  sync back on and calls ``post_backward()`` on every FSDP state: all reduce-scatters of the
  step are issued there, with no pipeline work left to run beside them.
- ``pithtrain/operators/ep_dispatch.py``: every MoE dispatch copies the split sizes to pinned
  host memory and calls ``torch.cuda.current_stream().synchronize()`` before ``.tolist()``,
  so the host never runs more than one layer ahead of the compute stream.

So the blocks are gathered once per step, while the layers outside them reshard after each
forward and are gathered again by their next forward or backward (FSDP2 ``pre_forward`` /
``pre_backward``: ``unshard`` then ``wait_for_unshard``, torch/distributed/fsdp/_fully_shard/
_fsdp_param_group.py): after every forward one more all-gather, which the compute stream waits
for. Not modelled: the little compute queued since the last dispatch sync that runs beside
such a gather (at most one layer's tail).
"""

from __future__ import annotations

from dataclasses import replace

from ..choices import FSDP2, Fusion, with_choice

_PITH = "mlc-ai/pith-train 093a9e4 "

#: PithTrain's FSDP2 under its DualPipeV loop (module docstring).
PITHTRAIN_FSDP = replace(
    FSDP2, name="pithtrain-fsdp2-dualpipev",
    summary="PithTrain: FSDP2 blocks kept gathered through the DualPipeV loop, embedding / "
            "norm / head resharded after every forward, fp32 reduce-scatters after the loop",
    zero3_regather_per_micro_batch=False, zero3_pp_root_regather=True,
    zero3_pp_reduce_after_flush=True, grad_reduce_bytes=4,
    sources={**FSDP2.sources,
             "zero3_regather_per_micro_batch": _PITH + "pithtrain/modules/training.py "
             "apply_fsdp: decoder layers and experts fully_shard(reshard_after_forward=False); "
             "pithtrain/dualpipe/dualpipev.py DualPipeV.step: set_reshard_after_backward(False)"
             ", set_requires_gradient_sync(False) before the schedule",
             "zero3_pp_root_regather": _PITH + "pithtrain/modules/training.py apply_fsdp: "
             "embed_tokens, norm and lm_head fully_shard(reshard_after_forward=True), gathered "
             "again by FSDP2's pre_forward / pre_backward (unshard, wait_for_unshard) after "
             "every forward; pithtrain/operators/ep_dispatch.py synchronizes the host with "
             "the compute stream at every MoE dispatch (current_stream().synchronize()), so "
             "the gather is not issued ahead of the compute that waits for it",
             "zero3_pp_reduce_after_flush": _PITH + "pithtrain/dualpipe/dualpipev.py "
             "DualPipeV.step: run_post_backward (set_requires_gradient_sync(True), "
             "post_backward() of every FSDP state) after the schedule's last step and "
             "_commit_and_wait_comm",
             "grad_reduce_bytes": _PITH + "pithtrain/modules/training.py apply_fsdp: "
             "MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): 4",
             "zero_grad_copy_passes": _PITH + "FSDP2 fully_shard (one tensor per parameter, "
             "no flat-gradient concat): 0",
             "fsdp2_copies": _PITH + "pithtrain/modules/training.py shards with "
             "torch.distributed.fsdp.fully_shard (FSDP2)"})


#: What PithTrain keeps unsharded through the DualPipeV loop (module docstring): a chunk's bf16
#: parameters from its first forward (blocks and experts never reshard in the loop), and its
#: gradients, accumulated unsharded in the fp32 reduce dtype (FSDP2 FSDPParamGroup.post_backward
#: without gradient sync: to_accumulated_grad_if_needed upcasts to reduce_dtype), until
#: run_post_backward reduce-scatters them after the loop.
PITHTRAIN_PP_UNSHARDED = {
    "pp_unsharded_bytes": (6, _PITH + "pithtrain/dualpipe/dualpipev.py DualPipeV.step: "
                           "set_reshard_after_backward(False), set_requires_gradient_sync(False) "
                           "for the loop, so each chunk keeps its bf16 parameters (2) and its "
                           "gradients accumulated unsharded in fp32 (4: MixedPrecisionPolicy "
                           "reduce_dtype=float32, torch FSDPParam.to_accumulated_grad_if_needed) "
                           "until run_post_backward after the loop"),
    "pp_unsharded_forward_bytes": (2, _PITH + "pithtrain/modules/training.py apply_fsdp: "
                                   "decoder layers and experts fully_shard(reshard_after_"
                                   "forward=False): the bf16 parameters (2) held from the "
                                   "chunk's first forward"),
}


def with_pithtrain_fsdp(profile):
    """``profile`` with PithTrain's sharded data parallelism (:data:`PITHTRAIN_FSDP`): blocks
    gathered once per step, the layers outside them gathered again every micro-batch, the
    fp32 gradient reduce-scatters issued after the pipeline's last operation; in memory, what
    the loop keeps unsharded (:data:`PITHTRAIN_PP_UNSHARDED`: bf16 parameters from a chunk's
    first forward, fp32 gradients from its first backward). A record option
    (:func:`benchmarks.validation.record_profile` for a PithTrain run), an edit of the profile
    that travels with it (:func:`autopar.frameworks.choices.with_choice`).

    Raises:
        InvalidTrainingConfig: an unknown framework name.
    """
    from . import get_profile
    p = with_choice(get_profile(profile), PITHTRAIN_FSDP)
    mem = p.memory
    return replace(p, memory=replace(
        mem, **{k: v for k, (v, _src) in PITHTRAIN_PP_UNSHARDED.items()},
        sources={**mem.sources, **{k: src for k, (_v, src) in PITHTRAIN_PP_UNSHARDED.items()}}))


#: PithTrain's Qwen3-MoE decoder layer (pithtrain/models/qwen3_30b_a3b.py at 093a9e4; its
#: DeepSeek-V2-Lite and gpt-oss layers carry similar decorators, not read here for a record):
#: the attention half, the router and
#: the weighted combine are torch.compile'd regions, and the experts' gated unit is a fused
#: autograd function that keeps its two inputs only.
PITHTRAIN_FUSION = Fusion(
    name="pithtrain-compiled-layer",
    summary="PithTrain: attention half, router and combine under torch.compile(fullgraph=True), "
            "experts' SiLU-mul one fused op",
    fusion="compile", eager_parts=(),
    sources={"fusion": _PITH + "pithtrain/models/qwen3_30b_a3b.py: "
             "Qwen3MoeDecoderLayer._forward_attn_compute (input RMSNorm, q/k/v, q/k RMSNorm, "
             "RoPE, attention, o_proj, residual, post-attention RMSNorm), Qwen3MoeGate.compute "
             "(router, softmax, top-k, normalisation) and forward_aggregate (weighted combine, "
             "residual) are @torch.compile(fullgraph=True); the experts' silu(gate) * up is "
             "pithtrain/operators/silu_mul.py _SiLUMul (ctx.save_for_backward(gate, up)); "
             "not priced apart: the final norm before the head, run eagerly in "
             "pithtrain/dualpipe/execution.py epilog_f",
             "eager_parts": _PITH + "none: the loss is its fused CrossEntropy "
             "(pithtrain/operators/cross_entropy.py), the GLU _SiLUMul"})


def with_pithtrain_kernels(profile):
    """``profile`` running PithTrain's compiled decoder layer (:data:`PITHTRAIN_FUSION`):
    norms and point-wise chains fused (``fusion="compile"``), so neither the time of eager
    point-wise kernels nor the extra tensors eager norms and GLUs keep
    (:func:`autopar.cost.memory.eager_saved_bytes`) are charged. A record option, as
    :func:`with_pithtrain_fsdp`.

    Raises:
        InvalidTrainingConfig: an unknown framework name.
    """
    from . import get_profile
    return with_choice(get_profile(profile), PITHTRAIN_FUSION)
