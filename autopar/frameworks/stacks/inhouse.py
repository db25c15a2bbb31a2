"""``inhouse-2024``: an unnamed in-house pretraining stack of 2024 (large runs whose papers do not
publish the software: Meta's Llama 3, DeepSeek's HAI-LLM, Skywork). Costed as Megatron-LM
(capabilities, Transformer Engine kernels, fused optimizer) with the data-parallel reduction
overlapping backward and without FSDP2's copies (memory conventions as Megatron-LM's of 2024:
:data:`autopar.frameworks.stacks.megatron.MEMORY_BEFORE_CORE_0_13`, but for FP8 activations,
which follow the one FP8 run of these stacks, DeepSeek-V3's: :data:`MEMORY`); every
value beyond Megatron-LM's is an assumption named in its source, not read from the stack, but for
what DeepSeek-V3's report says of HAI-LLM under FP8 (:data:`MEMORY`, :data:`FP8_DISPATCH`)."""

from __future__ import annotations

from dataclasses import replace

from ...errors import InvalidParallelConfig
from ..choices import Choices, ExpertDispatch, capabilities_of, compose, with_choice
from ..layersplit import MegatronLayerSplit
from . import megatron

SHARDED_DP = replace(
    megatron.DISTRIBUTED_OPTIMIZER, name="inhouse-2024-dp", overlap_dp_grad_reduce=True,
    fsdp2_copies=False, grad_reduce_bytes=None,
    summary="an unpublished sharded data parallelism assumed to overlap its reduction",
    sources={**megatron.DISTRIBUTED_OPTIMIZER.sources,
             "overlap_dp_grad_reduce": "large 2024 in-house pretraining stacks overlap the "
             "data-parallel reduction with backward (Megatron-Core DDP overlap_grad_reduce, as "
             "NeMo's recipes); the stack itself is not published",
             "grad_reduce_bytes": "CostParams.grad_bytes (bf16 reduction): the in-house "
             "stacks' reduction dtype is not published (an assumption)",
             "fsdp2_copies": "the in-house stack's sharding code is not published, and torch's "
             "FSDP2 (fully_shard, torch 2.4, July 2024) postdates these runs: its copies are "
             "not charged"})

_LLAMA3 = "Llama 3 (Dubey et al. 2024, arXiv 2407.21783) section 3.3.2, "

#: Meta's Llama 3 stack (its 405B pretraining, 2024) as the paper states its FSDP: optimizer
#: states and gradients sharded, the parameters gathered for forward and not resharded for
#: backward (ZeRO-2 in autopar's plan terms), gradients accumulated in fp32 over the step's
#: micro-batches and reduce-scattered in fp32. The paper does not say in so many words that
#: the reduce-scatter runs once per step; its fp32 accumulation "over multiple micro-batches"
#: before an fp32 reduce-scatter reads as the local (unsharded) accumulation that PyTorch's own
#: composition of FSDP with pipeline parallelism runs (torch/distributed/pipelining/stage.py
#: backward_maybe_with_nosync: set_requires_gradient_sync(False) and
#: set_reshard_after_backward(False) until the last backward), so that is what is priced.
LLAMA3_FSDP = replace(
    SHARDED_DP, name="llama3-fsdp", zero2_reduce_per_step=True, grad_reduce_bytes=4,
    summary="Llama 3's FSDP: no reshard after forward, fp32 gradients accumulated over the "
            "micro-batches, one fp32 reduce-scatter per step",
    sources={**SHARDED_DP.sources,
             "zero2_reduce_per_step": _LLAMA3 + "Numerical stability: 'we use FP32 gradient "
             "accumulation during backward computation over multiple micro-batches and also "
             "reduce-scatter gradients in FP32 across data parallel workers in FSDP'; "
             "Parallelism for Model Scaling: 'Our use of FSDP for Llama 3 shards optimizer "
             "states and gradients, but for model shards we do not reshard after forward "
             "computation to avoid an extra all-gather communication during backward passes' "
             "(one reduce-scatter per step read from the accumulation over micro-batches, as "
             "torch.distributed.pipelining stage.py composes FSDP with PP: an assumption)",
             "grad_reduce_bytes": _LLAMA3 + "Numerical stability: 'reduce-scatter gradients "
             "in FP32 across data parallel workers in FSDP': 4",
             "overlap_dp_grad_reduce": _LLAMA3 + "Network-aware parallelism configuration: DP "
             "(FSDP) is the outermost dimension 'because it can tolerate longer network "
             "latency by asynchronously prefetching sharded model weights and reducing "
             "gradients': the gather and the reduction run beside compute"})


def with_llama3_fsdp(profile):
    """``profile`` (``inhouse-2024``) with the data parallelism the Llama 3 paper states for
    Meta's stack (:data:`LLAMA3_FSDP`): one fp32 reduce-scatter per step of gradients
    accumulated unsharded in fp32, one gather. A record option, not the profile's default (the
    other in-house stacks publish nothing of theirs)."""
    return with_choice(profile, LLAMA3_FSDP)


#: Llama 3's pipeline balance (section 3.3.2, Pipeline parallelism improvements): "To balance
#: the pipeline, we reduce one Transformer layer each from the first and the last stages,
#: respectively. This means that the first model chunk on the first stage has only the
#: embedding, and the last model chunk on the last stage has only output projection and loss
#: calculation." The same cut as Megatron-LM's --account-for-embedding-in-pipeline-split
#: --account-for-loss-in-pipeline-split: the embedding and the loss each take one layer's slot.
LLAMA3_LAYER_SPLIT = MegatronLayerSplit(embedding=True, loss=True)


def llama3_pipeline_chunks(num_layers: int, pp: int) -> tuple[int, tuple[int, ...]]:
    """The interleaved pipeline the Llama 3 paper describes for ``num_layers`` decoder layers
    over ``pp`` ranks: ``(virtual_stages, stage_blocks)``, decoder layers per chunk in model
    order (``pp * virtual_stages`` entries, :data:`LLAMA3_LAYER_SPLIT`).

    The paper does not give V; it says that taking one layer from the first stage leaves its
    first chunk with the embedding alone, which holds only if every chunk has one layer, so
    V = (num_layers + 2) / pp (an inference from section 3.3.2: 126 layers over pp 16 -> 8).

    Raises:
        InvalidParallelConfig: ``num_layers + 2`` is not a multiple of ``pp`` (no one-layer
            chunks), or ``pp`` < 2 (no pipeline to balance).
    """
    if pp < 2 or (num_layers + 2) % pp:
        raise InvalidParallelConfig(
            f"Llama 3's one-layer chunks need num_layers + 2 = {num_layers + 2} to be a "
            f"multiple of pp={pp} with pp >= 2 (section 3.3.2: the first chunk holds only the "
            "embedding once one layer is taken from the first stage). Fix: a pp that divides "
            f"{num_layers + 2}, or give stage_blocks yourself.")
    v = (num_layers + 2) // pp
    return v, LLAMA3_LAYER_SPLIT.chunks(num_layers, pp, v)


_DSV3_FP8 = "DeepSeek-V3 (arXiv 2412.19437) section 3.3.3, Low-Precision Storage: "

#: DeepSeek-V3's low-precision communication (the one FP8 run of these stacks): under FP8 the
#: tokens are dispatched in FP8 with the activations' 1x128-tile scales, and combined in BF16.
FP8_DISPATCH = ExpertDispatch(
    name="fp8-1x128-dispatch",
    summary="under FP8 training, MoE tokens dispatched in FP8 (1x128 tiles, fp32 scales) and "
            "combined in BF16 (DeepSeek-V3's HAI-LLM)",
    moe_dispatch_dtype="fp8_1x128",
    sources={"moe_dispatch_dtype": (
        "DeepSeek-V3 (arXiv 2412.19437v2) section 3.3.3, Low-Precision Communication: 'we "
        "quantize the activation before MoE up-projections into FP8 and then apply dispatch "
        "components, which is compatible with FP8 Fprop in MoE up-projections' ... 'A similar "
        "strategy is applied to the activation gradient before MoE down-projections. For both "
        "the forward and backward combine components, we retain them in BF16'; section 3.3.2, "
        "Fine-Grained Quantization: activations scaled per '1x128 tile' (its fp32 scale: "
        "autopar.cost.dispatch.FP8_1X128_BYTES); the report trains only in FP8, so under other "
        "precisions the activation dtype"),
        "moe_tp_token_alltoall": "DeepSeek-V3 trains its MoE layers without tensor "
        "parallelism (section 3.2: 'we do not use costly Tensor Parallelism'): no TP all-to-all "
        "is priced",
        "moe_dispatch_sync_ops": "HAI-LLM's dispatcher is not published: no host read priced",
        "moe_probs_alltoall": "HAI-LLM's dispatcher is not published: no probabilities' "
        "all-to-all priced",
        "moe_sac_redispatch": "HAI-LLM recomputes named parts of a layer (section 3.2.3), "
        "not by an op-level policy: no dispatch priced again",
        "moe_counts_gather": "HAI-LLM's dispatcher is not published: no counts' gather "
        "priced",
        "moe_capacity_rule": "DeepSeek-V3 (arXiv 2412.19437) section 2.1.2, No Token-Dropping: "
        "'DeepSeek-V3 does not drop any tokens during training': dropless, each expert its "
        "routed rows"})

CHOICES: Choices = replace(megatron.CHOICES, sharded_dp=SHARDED_DP, expert_dispatch=FP8_DISPATCH,
                           host=None)

#: Megatron-LM's 2024 conventions with DeepSeek-V3's FP8 activation caching (the only FP8 run
#: of these stacks): Linear inputs in FP8 for the FP8 weight-gradient GEMM; the input of the
#: Linear after attention, which the attention backward reads too, kept once; the routed
#: experts' SwiGLU inputs in FP8. What the report recomputes (RMSNorm, MLA up-projections, the
#: SwiGLU output) is a recompute choice, not a storage format, and is not part of this.
MEMORY = replace(megatron.MEMORY_BEFORE_CORE_0_13, fp8_input_saved_bytes=1,
                 fp8_shared_input_saved_bytes=2, fp8_expert_glu_input_saved_bytes=1, sources={
    **megatron.MEMORY_BEFORE_CORE_0_13.sources,
    "fp8_input_saved_bytes": _DSV3_FP8 + "the weight-gradient GEMM runs in FP8, so the "
                             "activations the Linear operators keep for backward are cached in "
                             "FP8 (E4M3, 1x128 tiles, one fp32 scale per tile, not counted); "
                             "the activation before the MoE up-projections is quantised to FP8 "
                             "before the dispatch: 1",
    "fp8_shared_input_saved_bytes": _DSV3_FP8 + "the input of the Linear after attention, "
                                    "which the attention backward reads as well, is cached in "
                                    "a custom E5M6 format (12 bits per element; how it is "
                                    "packed is not stated): one copy, counted at 2 bytes, the "
                                    "graph's count",
    "fp8_expert_glu_input_saved_bytes": _DSV3_FP8 + "the inputs of the MoE SwiGLU are cached "
                                        "in FP8 with the fine-grained quantisation (its output "
                                        "is recomputed in backward: a recompute choice): 1",
})

_CAPABILITIES = capabilities_of(megatron.PROFILE)
_DUALPIPE = ("DeepSeek-V3 (arXiv 2412.19437) section 3.2.1: HAI-LLM trains with DualPipe, whose "
             "forward and backward chunks overlap the expert-parallel all-to-all with computation")
PROFILE = compose(CHOICES, **{**_CAPABILITIES, "memory": MEMORY,
                              "schedules": (*_CAPABILITIES["schedules"], "dualpipe"),
                              "overlaps_ep_comm": ("dualpipe",),
                              "sources": {**_CAPABILITIES["sources"],
                                          "schedules": _CAPABILITIES["sources"]["schedules"]
                                          + "; plus " + _DUALPIPE,
                                          "overlaps_ep_comm": _DUALPIPE}},
                  name="inhouse-2024",
                  version="unnamed in-house stack, 2024 (Megatron-LM-like; DeepSeek's HAI-LLM "
                          "runs DualPipe)")
