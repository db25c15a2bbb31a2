"""How a framework lays out memory: bytes per parameter of each model state, optimizer-step
temporaries, what pipeline parallelism keeps unsharded, unfused attention's score tensors and
FP8 weight copies. One frozen :class:`MemoryConventions` per framework profile
(:attr:`autopar.frameworks.FrameworkProfile.memory`); every field has its source (a framework
file and flag at the commit named in :mod:`autopar.frameworks.profiles`, or a measurement).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Mapping

from .checks import FieldCheck


@dataclass(frozen=True)
class MemoryConventions:
    """Bytes a framework keeps per parameter and per attention score.

    Attributes:
        weight_bytes: bytes per parameter of the weights ZeRO shards (None: the training dtype,
            2 for bf16). FSDP2 under mixed precision keeps fp32 sharded parameters (4), which
            are also the optimizer's master weights.
        grad_bytes: bytes per parameter of the gradients ZeRO shards (None: the cost model's
            :attr:`autopar.cost.CostParams.grad_bytes`).
        master_weight_bytes: bytes per parameter of a separate fp32 master copy inside the
            optimizer states (0 where the sharded weights are the master copy).
        moment_bytes: bytes per element of each optimizer moment (None: the training config's
            ``optimizer_state_dtype``, 4 for fp32). A torch optimizer over bf16 parameters
            keeps bf16 moments (2).
        optimizer_step_temp_bytes: bytes per optimizer-held parameter the step allocates
            beside the states (a multi-tensor Adam's sqrt(v) buffer; 0 for fused kernels).
        pp_unsharded_bytes: bytes per parameter of a pipeline rank kept unsharded across its
            micro-batches under ZeRO-3 with pipeline parallelism (the gathered weights and the
            accumulated unsharded gradients); 0 where every micro-batch re-gathers. A chunk
            holds them from its first backward (from its first forward for the
            ``pp_unsharded_forward_bytes`` part) until its last backward's gradient reduction,
            counted at the instants its rank's activations peak
            (:func:`autopar.cost.pipeline.held.held_chunks_at_peak`).
        pp_unsharded_forward_bytes: of ``pp_unsharded_bytes``, the bytes per parameter already
            held from the chunk's first forward (parameters not resharded after forward);
            the rest (gradients, and parameters first kept after a backward) from its first
            backward.
        unfused_score_saved_bytes: bytes per attention-score element the unfused attention path
            saves for backward (the softmax output; the graph counts 2).
        unfused_score_work_bytes: bytes per score element the unfused path allocates beside
            the saved ones while a layer runs (scores and their gradients).
        fp8_weight_cache_bytes: bytes per Linear parameter of FP8 weight copies kept across
            micro-batches in FP8 training (0: cast again each forward).
        fp8_input_saved_bytes: in FP8 training, bytes per element a Linear op's input costs
            where only Linear ops keep it for backward (a norm's output, a gated unit's output;
            :attr:`autopar.graph.types.ActivationBytes.linear_seq`): 1 where the Linear keeps
            the FP8 copy its weight-gradient GEMM reads in place of the input; None: the
            training dtype's bytes, the input itself (what the graph counts).
        fp8_shared_input_saved_bytes: in FP8 training, bytes per element a Linear op's input
            costs where another op keeps it too (the attention output, which the attention
            kernel keeps for its own backward; ``linear_shared_seq``): 3 where the other op
            keeps the bf16 tensor and the Linear an FP8 copy beside it; None: the training
            dtype's bytes, the one tensor both keep (what the graph counts).
        fp8_expert_glu_input_saved_bytes: in FP8 training, bytes per element of a routed
            expert's gated-unit input (the up projection's output, which the gated activation
            keeps for backward): 1 where it is cached in FP8; None: the training dtype's bytes
            (what the graph counts).
        loss_work_bytes: bytes per logit element the loss's backward allocates beside the
            saved fp32 log-probabilities (the graph counts those): torch's F.cross_entropy on
            fp32 logits makes a dense nll_loss gradient and a log_softmax gradient (4 + 4); fused
            losses write the gradient in place.
        loss_saved_bytes: bytes per logit element the loss keeps for backward (the graph
            measures torch's F.cross_entropy on fp32 logits: the fp32 log-probabilities, 4; a
            fused loss that keeps the bf16 logits and one log-sum-exp per row: 2).
        step_cached_bytes: bytes per optimizer-held parameter that torch's caching allocator
            still holds reserved (freed, not returned to the device) at the optimizer step's
            peak because none of the step's later, larger requests fits in them: tensors the
            step frees before it allocates bigger flat buffers. Counted in the reported
            (reserved) peak, capped at the device's capacity, and never in whether a plan fits:
            the allocator frees cached blocks and retries before it reports out of memory
            (c10/cuda/CUDACachingAllocator.cpp: a block serves only requests no larger than
            itself, requests above 10 MB get a segment of their own, and a failed cudaMalloc
            first releases the cached blocks). 0 where the step's requests are per tensor and
            reuse what backward freed.
        grad_bucket_elements: elements (in the training dtype) of gradient bucket buffers a
            ZeRO (stage >= 1) optimizer allocates beside the gradients and holds through
            backward, so that they count at the activation peak (a fixed size, not per
            parameter): DeepSpeed's contiguous reduction bucket of ``reduce_bucket_size``
            elements. 0 where the buckets are views of the gradient buffer.
        zero3_step_temp_bytes: under ZeRO-3, bytes per element of the sub-group the optimizer
            step is working on that it allocates beside the states, in place of
            ``optimizer_step_temp_bytes`` (None: that field, as under the other stages).
            DeepSpeed's stage-3 step casts each sub-group's flat gradient partition to an fp32
            copy (4) while the bit16 gradient partition stays allocated, then runs the
            optimizer on the sub-group (its own temporaries on top).
        zero3_sub_group_elements: under ZeRO-3, elements of the rank's partition the optimizer
            steps at a time (DeepSpeed ``sub_group_size``): the step's temporaries
            (``zero3_step_temp_bytes``) cover at most this many; 0: the whole partition at once.
        zero3_prefetch_elements: under ZeRO-3 gathered per parameter tensor, parameter elements
            fetched ahead of the module being run (DeepSpeed ``stage3_prefetch_bucket_size``),
            so that the gathered working set is the largest module's parameters and their full
            gradient, the prefetch and the persistent small parameters; 0: the per-layer rule
            (the largest layer gathered and one layer prefetched, FSDP).
        zero3_reduce_copies: under ZeRO-3, copies of a reduce bucket (the profile's
            ``zero3_reduce_bucket_elements``, in the training dtype) its reduction allocates
            beside the bucket buffer while it flushes during backward: DeepSpeed's
            reduce_scatter_coalesced interleaves the bucket's gradients into one new flat
            tensor (1); 0: none.
        zero3_max_live_elements: cap on the gathered parameter elements the prefetch may bring
            the working set to (DeepSpeed ``stage3_max_live_parameters``); 0: no cap.
        kv_repeat_saved: 1 where the framework's attention repeats grouped-query K and V to
            every query head before a fused SDPA (``repeat_kv``: expand + reshape, a copy),
            which then keeps the repeated copies for backward: K and V saved at the query heads'
            width, (heads / kv heads - 1) times more than the graph's native-GQA kernel keeps
            (counted for blocks without recompute, and as the recomputed block's transient);
            0 where the kernel reads the kv heads themselves (SDPA ``enable_gqa``, FlashAttention,
            Transformer Engine).
        moe_combine_saved: 1 where an MoE block weights the experts' outputs by the router's
            probabilities in the combine, a multiply after the down projection that keeps the
            [routed tokens, hidden] expert output for backward (what the graph counts: the
            transformers MoE blocks it traces); 0 where the probabilities are folded into the
            experts' activation, which keeps only the [routed tokens, 1] probabilities beside
            the up projection's output it keeps anyway.
        moe_router_input_saved: 1 where an MoE router's gate GEMM keeps for backward its input
            as its caller passed it (the pre-MLP norm's output, in the training dtype) and the
            gate weight itself, so that a router the graph traced with cast copies (a cast to
            fp32 of the input and the weight before the gate GEMM, as transformers'
            DeepSeek-V3 ``MoEGate`` does) keeps those copies no longer; the norm output then
            counts as kept by the router, an op that is not a Linear (under FP8 it stays in
            the training dtype beside a shared expert's FP8 copy):
            :func:`autopar.cost.memory.router_saved_delta`. 0: the graph's count.
        expert_input_gathered: 1 where the routed tokens are all-gathered over the expert-TP
            group after the dispatch and the grouped expert GEMM keeps them whole for backward:
            etp / tp of the routed tokens per rank, where the graph's sequence-parallel count
            keeps 1 / tp; 0 where the experts keep what the graph counts.
        loss_chunks: sequence chunks the loss runs the LM head and the cross-entropy over one
            at a time, each chunk's forward and backward inside the loss call (torchtitan's
            ``ChunkedCELoss``): the logit-sized tensors (the head's saved ones, the loss's
            work) exist for one chunk at a time while the loss runs, and the head keeps its
            input's accumulated gradient for the decoder's backward
            (:func:`autopar.cost.memory.chunked_loss_bytes`); 0 or 1: the whole sequence at
            once.
        sources: where each figure comes from, by field name.

    Raises:
        InvalidTrainingConfig: one error naming every problem with its fix
            (:class:`~autopar.frameworks.checks.FieldCheck`): a figure that is not a whole
            number >= 0 (>= 1 for ``weight_bytes`` / ``grad_bytes``, which may also be None;
            NaN, infinity, bools and text are refused), ``pp_unsharded_forward_bytes`` above
            ``pp_unsharded_bytes``, a field without a source, a source for no field.
    """

    weight_bytes: int | None = None
    grad_bytes: int | None = None
    master_weight_bytes: int = 4
    moment_bytes: int | None = None
    optimizer_step_temp_bytes: int = 0
    pp_unsharded_bytes: int = 0
    pp_unsharded_forward_bytes: int = 0
    unfused_score_saved_bytes: int = 2
    unfused_score_work_bytes: int = 4
    fp8_weight_cache_bytes: int = 0
    fp8_input_saved_bytes: int | None = None
    fp8_shared_input_saved_bytes: int | None = None
    fp8_expert_glu_input_saved_bytes: int | None = None
    loss_work_bytes: int = 8
    loss_saved_bytes: int = 4
    step_cached_bytes: int = 0
    grad_bucket_elements: int = 0
    zero3_step_temp_bytes: int | None = None
    zero3_sub_group_elements: int = 0
    zero3_prefetch_elements: int = 0
    zero3_max_live_elements: int = 0
    zero3_reduce_copies: int = 0
    kv_repeat_saved: int = 0
    moe_combine_saved: int = 1
    moe_router_input_saved: int = 0
    expert_input_gathered: int = 0
    loss_chunks: int = 0
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check = FieldCheck("memory conventions")
        for name in self.field_names():
            unit, example = _UNITS[name]
            value = check.number(name, getattr(self, name), 1 if name in _NONE_MEANS else 0,
                                 unit, example, integer=True,
                                 none_means=_NONE_MEANS.get(name, ""))
            object.__setattr__(self, name, value)
        fwd, held = self.pp_unsharded_forward_bytes, self.pp_unsharded_bytes
        if not check.problems and fwd > held:
            check.bad("pp_unsharded_forward_bytes", fwd,
                      f"must be <= pp_unsharded_bytes={held} (it is a part of them)", held)
        object.__setattr__(self, "sources", check.sources(
            "sources", self.sources, self.field_names(),
            "sources={{..., '{field}': 'the framework file and flag, or the measurement'}}"))
        check.raise_if_any()

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of the byte-count fields (all but ``sources``)."""
        return tuple(f.name for f in fields(cls) if f.name != "sources")


#: Per field: the unit its rule names, and the example value a fix shows.
_UNITS = {
    "weight_bytes": ("bytes per parameter", 2),
    "grad_bytes": ("bytes per parameter", 4),
    "master_weight_bytes": ("bytes per parameter", 4),
    "moment_bytes": ("bytes per moment element", 4),
    "optimizer_step_temp_bytes": ("bytes per optimizer-held parameter", 0),
    "pp_unsharded_bytes": ("bytes per parameter", 0),
    "pp_unsharded_forward_bytes": ("bytes per parameter", 0),
    "unfused_score_saved_bytes": ("bytes per attention-score element", 2),
    "unfused_score_work_bytes": ("bytes per attention-score element", 4),
    "fp8_weight_cache_bytes": ("bytes per Linear parameter", 0),
    "fp8_input_saved_bytes": ("bytes per element of a Linear's input only Linears keep", 1),
    "fp8_shared_input_saved_bytes": ("bytes per element of a Linear's input another op keeps "
                                     "too", 3),
    "fp8_expert_glu_input_saved_bytes": ("bytes per element of a routed expert's gated-unit "
                                         "input", 1),
    "loss_work_bytes": ("bytes per logit element", 8),
    "loss_saved_bytes": ("bytes per logit element", 4),
    "step_cached_bytes": ("bytes per optimizer-held parameter", 0),
    "grad_bucket_elements": ("elements in the training dtype", 0),
    "zero3_step_temp_bytes": ("bytes per element of the ZeRO-3 step's sub-group", 4),
    "zero3_sub_group_elements": ("elements (0: the whole partition)", 1_000_000_000),
    "zero3_prefetch_elements": ("parameter elements (0: per-layer gathers)", 50_000_000),
    "zero3_max_live_elements": ("parameter elements (0: no cap)", 1_000_000_000),
    "zero3_reduce_copies": ("copies of a reduce bucket", 1),
    "kv_repeat_saved": ("0 or 1 (whether SDPA keeps K and V repeated to every head)", 0),
    "moe_combine_saved": ("0 or 1 (whether the MoE combine keeps the expert output)", 1),
    "moe_router_input_saved": ("0 or 1 (whether the MoE router keeps its uncast input)", 0),
    "expert_input_gathered": ("0 or 1 (whether the experts keep the expert-TP-gathered "
                              "tokens)", 0),
    "loss_chunks": ("sequence chunks of the loss (0 or 1: unchunked)", 8),
}
#: Fields that may be None, and what None stands for.
_NONE_MEANS = {"weight_bytes": "the training dtype's bytes",
               "grad_bytes": "the cost model's CostParams.grad_bytes",
               "moment_bytes": "the training config's optimizer_state_dtype",
               "fp8_input_saved_bytes": "the training dtype's bytes (the input itself)",
               "fp8_shared_input_saved_bytes": "the training dtype's bytes (one tensor kept)",
               "fp8_expert_glu_input_saved_bytes": "the training dtype's bytes",
               "zero3_step_temp_bytes": "optimizer_step_temp_bytes, as under the other stages"}

_MATH_SDPA = ("torch 2.13 aten _scaled_dot_product_attention_math on bf16 inputs upcasts to fp32 "
              "(measured: saved_tensors_hooks show the fp32 [b, h, s, s] softmax output saved)")
_MATH_SDPA_WORK = ("torch 2.13 math SDPA: fp32 scores beside the fp32 softmax output in forward; "
                   "fp32 gradients of the probabilities and of the scores in backward (2 x 4)")
_FSDP2_PP = ("torch 2.13 distributed/pipelining/stage.py: set_reshard_after_backward(False) and "
             "set_requires_gradient_sync(False) for all but the last micro-batch; "
             "fsdp/_fully_shard/_fsdp_param.py to_accumulated_grad_if_needed: unsharded grads "
             "upcast to reduce_dtype fp32 (2 bytes bf16 weights + 4 bytes fp32 gradients)")

_TORCH_CE = ("F.cross_entropy(logits.float()) = log_softmax + nll_loss; backward "
             "(torch tools/autograd/derivatives.yaml): nll_loss_backward's dense fp32 [N, V] "
             "gradient, then _log_softmax_backward_data's, beside the saved fp32 log-probs: 4 + 4")

_FSDP2_BUCKETS = ("FSDP2 (fully_shard) reduce-scatters each block's gradients from a per-block "
                  "buffer freed after the collective (torch distributed/fsdp/_fully_shard/"
                  "_fsdp_collectives.py foreach_reduce): no buffer held through backward; DDP's "
                  "buckets (ZeRO-0/1) are not modelled: 0")

_DS_BUCKET = ("deepspeed/runtime/zero/config.py: contiguous_gradients = True, reduce_bucket_size "
              "= 5e8 elements, overlap_comm None -> True only for stage 3 (validator "
              "overlap_comm_valid); stage_1_and_2.py backward(): 'if self.contiguous_gradients: "
              "... buf_0 = torch.empty(int(self.reduce_bucket_size), dtype=self.dtype ...)' (a "
              "second buffer only 'if self.overlap_comm'), allocated before the backward pass; "
              "stage3.py __init__: '__ipg_bucket_flat_buffer = torch.empty(self."
              "reduce_bucket_size, dtype=self.dtype ...)' when contiguous_gradients: one buffer "
              "of 5e8 elements in the model dtype under every ZeRO stage")

_TORCH_CE_SAVED = ("F.cross_entropy(logits.float()): log_softmax saves its fp32 output for "
                   "backward (torch tools/autograd/derivatives.yaml _log_softmax_backward_data "
                   "takes the result), as the graph measures: 4")

_FP32_MOMENTS = ("None: TrainingConfig.optimizer_state_dtype (fp32 moments beside the fp32 "
                 "master copy unless the user chooses bf16)")

_PER_TENSOR_STEP = ("the step's temporaries are per parameter tensor (torch/optim/adam.py "
                    "foreach), each no larger than blocks backward freed: not modelled as "
                    "cached")

_NATIVE_GQA = ("autopar's own model passes the kv heads to the kernel (autopar/models/transformer.py "
               "F.scaled_dot_product_attention(..., enable_gqa=True)): 0; a stack that inherits "
               "these conventions is not established to repeat K and V (set 1 where its model "
               "does, as torchtitan's)")

_TE_FP8_INPUT = (
    "Transformer Engine keeps the FP8 cast of a Linear's input for the weight-gradient GEMM, "
    "not the bf16 input: v1.5-v1.12 (2024) module/linear.py forward 'saved_inputmat_t = "
    "inputmat_t' (the FP8 transpose, or the FP8 'inputmat' when no transpose was made) in "
    "ctx.save_for_backward, the bf16 input only without fp8; layernorm_linear.py: the norm "
    "kernel writes ln_out as uint8 under fp8 and 'ln_out' is saved; v2.4 (2025-06) linear.py "
    "'inputmat.update_usage(rowwise_usage=False, columnwise_usage=True)' then "
    "prepare_for_saving(saved_inputmat, ...) (rowwise only when a sequence-parallel column "
    "Linear gathers it again in backward; one FP8 copy either way, MXFP8 included), "
    "layernorm_linear.py 'ln_out.update_usage(rowwise_usage=False)' likewise; grouped_linear.py "
    "(the experts of Megatron-Core's TEGroupedMLP) the same per expert: v1.12 "
    "'saved_inputmats_t = inputmats_t', v2.4 'inputmat.update_usage(rowwise_usage=False, "
    "columnwise_usage=True)' before prepare_for_saving(*inputmats, ...); Megatron-Core "
    "runs one Linear per fused input (linear_qkv, linear_fc1: TELayerNormColumnParallelLinear), "
    "so one copy per saved input: 1 (+ one fp32 scale per tensor, not counted)")
_TE_FP8_SHARED = (
    "the other op keeps the bf16 tensor (flash / cuDNN attention keeps its output 'out' for "
    "backward) and Transformer Engine's Linear (linear_proj, TERowParallelLinear: "
    "module/linear.py as fp8_input_saved_bytes) an FP8 copy beside it: 2 + 1")
_TORCHAO_FP8_INPUT = (
    "torchao float8 since v0.9.0 (2025-02-20) float8/float8_linear.py "
    "matmul_with_hp_or_float8_args.forward: 'ctx.save_for_backward(input_hp, weight_hp_t)', "
    "the high-precision input, cast again in backward: None. Earlier releases (v0.5.0-v0.8.0, "
    "tensorwise scaling) saved 'input_fp8' per Float8Linear in eager mode; under torch.compile "
    "the partitioner chooses what to save: not modelled")
_NO_FP8_LINEARS = ("no FP8 Linear: precision 'fp8' runs its Linears in bf16 here "
                   "(autopar/runtime/dp.py _DTYPES maps fp8 to bfloat16): None")

_MCORE_ROUTER_SAVED = (
    "megatron/core/transformer/moe/router.py TopKRouter.gating: since 0f058666a8 (2025-06-14, "
    "first in core_v0.13.0rc0) 'logits = router_gating_linear(input, self.weight, ..., "
    "router_dtype)', whose moe_utils.py RouterGatingLinearFunction.forward runs "
    "'ctx.save_for_backward(inp, weight, bias)' on the input as passed (the pre-MLP norm's "
    "bf16 output) and the parameter, the GEMM writing fp32 logits without casting its inputs "
    "(te_general_gemm(weight, inp, router_dtype, ...)); before dab7723821 (2025-03-06, "
    "core_v0.12.0) 'logits = torch.nn.functional.linear(input, self.weight)' (core_v0.8.0, "
    "core_v0.10.0), which saves the same input: 1. Between them (core_v0.12.x) "
    "'F.linear(input.to(router_dtype), self.weight.to(router_dtype))' kept fp32 copies only "
    "under --moe-router-dtype fp32 (default None: no cast); no record states that flag")

#: The DeepSpeed ZeRO-3 fields of a stack that gathers per layer (FSDP) or has no ZeRO-3 of
#: its own: none of DeepSpeed's stage-3 buffers.
NO_DEEPSPEED_ZERO3_SOURCES = {
    "zero3_step_temp_bytes": "None: the step allocates optimizer_step_temp_bytes under every "
                             "stage (no per-sub-group fp32 gradient copy)",
    "zero3_sub_group_elements": "0: the optimizer steps the whole partition at once",
    "zero3_prefetch_elements": "0: ZeRO-3 gathers per layer (the largest layer gathered and "
                               "one prefetched)",
    "zero3_max_live_elements": "0: no cap on gathered parameters beyond the per-layer rule",
    "zero3_reduce_copies": "0: FSDP2 reduce-scatters each block's gradients from a per-block "
                           "buffer (counted with the block), no bucket copy",
}

#: The loss of a stack that computes the LM head and its loss on the whole sequence.
WHOLE_LOSS_SOURCES = {
    "loss_chunks": "the LM head and the loss run on the whole sequence at once (no chunked "
                   "loss): 0",
}

#: The MoE fields of a stack that runs the model's own MoE block as the graph traces it.
GRAPH_MOE_SOURCES = {
    "moe_combine_saved": "the graph's count: transformers' MoE blocks (Qwen3MoeSparseMoeBlock, "
                         "MixtralSparseMoeBlock, DeepseekV3MoE) multiply the down projection's "
                         "output by the routing weights, a mul that saves it: 1",
    "expert_input_gathered": "the graph's count: the experts keep the rank's own routed "
                             "tokens (no expert-TP all-gather established for this stack): 0",
    "moe_router_input_saved": "the graph's count: the model's own router as traced (its "
                              "casts, if any, and what its gate GEMM saves): 0",
}

TORCH_MEMORY = MemoryConventions(
    optimizer_step_temp_bytes=4, pp_unsharded_bytes=4,
    unfused_score_saved_bytes=4, unfused_score_work_bytes=8,
    sources={
        **NO_DEEPSPEED_ZERO3_SOURCES,
        **WHOLE_LOSS_SOURCES,
        "weight_bytes": "the model's parameters in the training dtype (autopar/runtime/dp.py)",
        "grad_bytes": "gradients in the parameters' dtype (autopar/runtime/dp.py _mp_policy)",
        "moment_bytes": _FP32_MOMENTS,
        "master_weight_bytes": "mixed-precision Adam keeps an fp32 master copy (Rajbhandari et "
                               "al. 2020, section 3.1)",
        "optimizer_step_temp_bytes": "torch/optim/adam.py _multi_tensor_adam (foreach, the CUDA "
                                     "default): exp_avg_sq_sqrt = torch._foreach_sqrt(...)",
        "pp_unsharded_bytes": "torch 2.13 distributed/pipelining/stage.py: "
                              "set_reshard_after_backward(False) for all but the last "
                              "micro-batch; parameters and gradients in the training dtype "
                              "(autopar/runtime/dp.py: no upcast for bf16 parameters): 2 + 2",
        "pp_unsharded_forward_bytes": "autopar/runtime/dp.py apply_fsdp: ZeRO-3 blocks "
                                      "reshard after forward, so a chunk's parameters stay "
                                      "gathered only from its first backward "
                                      "(set_reshard_after_backward(False)): 0",
        "unfused_score_saved_bytes": _MATH_SDPA,
        "unfused_score_work_bytes": _MATH_SDPA_WORK,
        "fp8_weight_cache_bytes": "torchao Float8Linear casts the weight every forward",
        "fp8_input_saved_bytes": _NO_FP8_LINEARS,
        "fp8_shared_input_saved_bytes": _NO_FP8_LINEARS,
        "fp8_expert_glu_input_saved_bytes": _NO_FP8_LINEARS,
        "loss_work_bytes": "autopar/runtime/apply.py lm_loss: " + _TORCH_CE,
        "loss_saved_bytes": _TORCH_CE_SAVED,
        "step_cached_bytes": _PER_TENSOR_STEP,
        "grad_bucket_elements": _FSDP2_BUCKETS,
        "kv_repeat_saved": _NATIVE_GQA,
        **GRAPH_MOE_SOURCES,
    })

TORCHTITAN_MEMORY = MemoryConventions(
    weight_bytes=4, grad_bytes=4, master_weight_bytes=0, optimizer_step_temp_bytes=0,
    pp_unsharded_bytes=6, pp_unsharded_forward_bytes=2, unfused_score_saved_bytes=4,
    unfused_score_work_bytes=8, kv_repeat_saved=1,
    sources={
        **NO_DEEPSPEED_ZERO3_SOURCES,
        **WHOLE_LOSS_SOURCES,
        "weight_bytes": "torchtitan v0.2.2 models/llama3/infra/parallelize.py apply_fsdp: "
                        "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) over a model "
                        "built in fp32: sharded parameters stay fp32",
        "grad_bytes": "job_config.py Training.mixed_precision_reduce = 'float32': sharded "
                      "gradients in fp32",
        "moment_bytes": _FP32_MOMENTS,
        "master_weight_bytes": "the fp32 sharded parameters are the optimizer's weights",
        "optimizer_step_temp_bytes": "job_config.py Optimizer.implementation = 'fused'",
        "pp_unsharded_bytes": "parallelize.py apply_fsdp: reshard_after_forward = not "
                              "pp_enabled ('default' policy); " + _FSDP2_PP,
        "pp_unsharded_forward_bytes": "parallelize.py apply_fsdp: under PP no block reshards "
                                      "after forward (also at 3f20451bc, 2024-12-27: 'For PP, "
                                      "do not reshard after forward to avoid per-microbatch "
                                      "all-gathers'): the bf16 parameters (2) from the chunk's "
                                      "first forward; the fp32 gradients (4) from its first "
                                      "backward",
        "unfused_score_saved_bytes": _MATH_SDPA,
        "unfused_score_work_bytes": _MATH_SDPA_WORK,
        "fp8_weight_cache_bytes": "torchao Float8Linear (torchtitan's Float8 converter) casts "
                                  "the weight every forward",
        "fp8_input_saved_bytes": _TORCHAO_FP8_INPUT,
        "fp8_shared_input_saved_bytes": _TORCHAO_FP8_INPUT,
        "fp8_expert_glu_input_saved_bytes": "torchao float8 converts Linears only; the MoE's "
                                            "activation runs on the bf16 GEMM output: None",
        "loss_work_bytes": "components/loss.py cross_entropy_loss: " + _TORCH_CE,
        "loss_saved_bytes": _TORCH_CE_SAVED,
        "step_cached_bytes": "fused AdamW allocates no per-step buffers; " + _PER_TENSOR_STEP,
        "grad_bucket_elements": _FSDP2_BUCKETS,
        "kv_repeat_saved": "torchtitan models/llama/model.py (82f7387f8, 2025-01) Attention."
                           "forward: 'keys = repeat_kv(xk, self.n_rep)', 'values = repeat_kv(xv, "
                           "self.n_rep)' (unsqueeze, expand, reshape: a copy) before "
                           "'F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)', which "
                           "saves its inputs for backward: 1",
        **GRAPH_MOE_SOURCES,
        "moe_router_input_saved": "the graph's count: torchtitan models/common/moe.py "
                                  "TokenChoiceTopKRouter.forward runs 'scores_TE = "
                                  "self.gate(x_TD)' under torch.autocast(dtype=torch.float32) "
                                  "(since ab5ed59f8, 2026-03-04, 'Execute moe.gate in "
                                  "float32'), whose linear keeps fp32 copies of its input and "
                                  "weight, as transformers' DeepSeek-V3 gate the graph traces: "
                                  "0 (runs before it kept the bf16 input: not modelled)",
    })

MEGATRON_MEMORY = MemoryConventions(
    grad_bytes=4, unfused_score_saved_bytes=2, unfused_score_work_bytes=4,
    fp8_weight_cache_bytes=2, fp8_input_saved_bytes=1, fp8_shared_input_saved_bytes=3,
    loss_work_bytes=2, moe_combine_saved=0, moe_router_input_saved=1, expert_input_gathered=1,
    sources={
        **NO_DEEPSPEED_ZERO3_SOURCES,
        **WHOLE_LOSS_SOURCES,
        "weight_bytes": "arguments.py --bf16: params_dtype bfloat16",
        "grad_bytes": "arguments.py (line 1207): 'bfloat16 requires gradient accumulation and "
                      "all-reduce to be performed in fp32' -> accumulate_allreduce_grads_in_fp32 "
                      "(fp32 main_grad buffer)",
        "moment_bytes": _FP32_MOMENTS,
        "master_weight_bytes": "megatron/core/optimizer: fp32 main params (--main-params-dtype "
                               "fp32)",
        "optimizer_step_temp_bytes": "Transformer Engine / Apex FusedAdam (multi-tensor "
                                     "in-place kernel)",
        "pp_unsharded_bytes": "--use-torch-fsdp2 is not supported with pipeline parallelism",
        "pp_unsharded_forward_bytes": "as pp_unsharded_bytes: none",
        "unfused_score_saved_bytes": "megatron/core/fusions/fused_softmax.py FusedScaleMaskSoftmax"
                                     ": bf16 softmax output (Korthikanti et al. 2022, 2as^2b)",
        "unfused_score_work_bytes": "bf16 gradients of the probabilities and of the scores",
        "fp8_weight_cache_bytes": "Transformer Engine Linear caches the FP8 weight and its FP8 "
                                  "transpose across micro-batches (is_first_microbatch)",
        "fp8_input_saved_bytes": _TE_FP8_INPUT,
        "fp8_shared_input_saved_bytes": _TE_FP8_SHARED,
        "fp8_expert_glu_input_saved_bytes": "megatron/core/transformer/moe/experts.py "
                                            "TEGroupedMLP: the grouped fc1 GEMM returns bf16 "
                                            "and the fused (weighted) SwiGLU saves it as it is: "
                                            "None",
        "loss_work_bytes": "megatron/core/tensor_parallel/cross_entropy.py "
                           "_VocabParallelCrossEntropy: backward writes the gradient into the "
                           "saved fp32 softmax in place; its bf16 cast: 2",
        "loss_saved_bytes": "megatron/core/tensor_parallel/cross_entropy.py "
                            "_VocabParallelCrossEntropy: ctx.save_for_backward(exp_logits, ...), "
                            "the fp32 softmax of the vocabulary shard: 4",
        "step_cached_bytes": "the distributed optimizer steps in place on its persistent fp32 "
                             "buffers (multi-tensor FusedAdam): no large step-time requests",
        "grad_bucket_elements": "megatron/core/distributed/param_and_grad_buffer.py: the "
                             "buckets are views of the contiguous main_grad buffer (counted "
                             "as gradients): 0",
        "kv_repeat_saved": "Transformer Engine / flash-attn attention takes grouped K and V "
                           "(num_query_groups): 0",
        "moe_combine_saved": "megatron/core/transformer/moe/experts.py TEGroupedMLP.forward: "
                             "bias_act_func applies permuted_probs in the activation "
                             "(fusions/fused_bias_swiglu.py weighted_bias_swiglu_impl: "
                             "WeightedSwiGLUFunction saves its input and the probabilities); "
                             "token_dispatcher.py combine_postprocess calls unpermute without "
                             "probs (since 2659630721, 2025-04-09, 'Memory efficient token "
                             "permutation', first released in core_v0.13.0rc0; at core_v0.13.0 "
                             "GroupedMLP and SequentialMLP apply permuted_probs in the "
                             "activation too, and --moe-apply-probs-on-input, top-1 only, "
                             "multiplies the experts' input instead): 0",
        "moe_router_input_saved": _MCORE_ROUTER_SAVED,
        "expert_input_gathered": "megatron/core/transformer/moe/token_dispatcher.py "
                                 "MoEAlltoAllTokenDispatcher.dispatch_postprocess: after the "
                                 "all-to-all, gather_from_sequence_parallel_region over the "
                                 "expert-TP group (pg_collection.expt_tp; etp = tp by "
                                 "default); in 2024 (9208adbdc7) all_to_all_sp2hp before and "
                                 "all_gather_last_dim_from_tensor_parallel_region after, the "
                                 "same [routed tokens of the TP group, hidden] per rank; the "
                                 "grouped GEMM (TE GroupedLinear / grouped_gemm) saves it: 1",
    })

#: Where DeepSpeed's ZeRO-3 buffers come from (DeepSpeed 0.19.8; the same code paths at 0.15):
#: the defaults in deepspeed/runtime/zero/config.py.
_DS_Z3_STEP = ("deepspeed/runtime/zero/stage3.py step(): for each sub-group, "
               "_prepare_fp32_grad_for_sub_group 'single_grad_partition = self.flatten(self."
               "averaged_gradients[sub_group_id]).to(self.fp32_partitioned_groups_flat[...]."
               "dtype)' (an fp32 copy of the sub-group's gradients, 4 bytes each) while "
               "grad_partitions_flat_buffer (the bit16 gradient partition, allocated once in "
               "_setup_for_real_optimizer) stays; _release_sub_group drops it after the "
               "optimizer's step; DeepSpeed's FusedAdam steps in place: 4")
_DS_Z3_SUB_GROUP = ("deepspeed/runtime/zero/config.py sub_group_size = 1e9 (Field(pp_int(1e9))); "
                    "stage3.py _create_fp16_sub_groups closes a sub-group once it holds "
                    "sub_group_size partition elements (it may exceed it by one parameter's "
                    "partition, not counted)")
_DS_Z3_PREFETCH = ("deepspeed/runtime/zero/config.py stage3_prefetch_bucket_size = 5e7; "
                   "partitioned_param_coordinator.py fetch_sub_module: all-gathers the current "
                   "module's parameters, then prefetches the next ones in the trace while "
                   "'numel_prefetching < max_params_to_prefetch' (whole parameters, so up to "
                   "one parameter more), max_params_to_prefetch = min(max_live - available, "
                   "prefetch_bucket_sz); release_sub_module frees a module's parameters after "
                   "it ran; stage3.py's gradient hook takes each full gradient into the reduce "
                   "bucket: at most the largest module's parameters and full gradient, plus "
                   "the prefetch")
_DS_Z3_LIVE = ("deepspeed/runtime/zero/config.py stage3_max_live_parameters = 1e9; "
               "partitioned_param_coordinator.py: it bounds only the prefetch "
               "(max_params_to_prefetch = min(self.__max_n_available_params - "
               "self.__n_available_params, self.__prefetch_bucket_sz)), never the module "
               "being fetched")

_DS_Z3_REDUCE_COPY = ("deepspeed/runtime/zero/stage3.py __reduce_and_partition_ipg_grads -> "
                      "__avg_scatter_grads (reduce_scatter True, the default) -> runtime/comm/"
                      "coalesced_collectives.py reduce_scatter_coalesced: 'tensor_partition_"
                      "flat_buffer = torch.cat(tensor_partitions_lst_with_padding)', a new flat "
                      "copy of the bucket's gradients (no copy only for a single tensor that "
                      "needs no padding), reduce-scattered in place, its partitions then added "
                      "into grad_partitions_flat_buffer: 1 bucket beside the IPG buffer")

DEEPSPEED_MEMORY = MemoryConventions(
    unfused_score_saved_bytes=4, unfused_score_work_bytes=8, grad_bucket_elements=500_000_000,
    zero3_step_temp_bytes=4, zero3_sub_group_elements=1_000_000_000,
    zero3_prefetch_elements=50_000_000, zero3_max_live_elements=1_000_000_000,
    zero3_reduce_copies=1,
    sources={
        **WHOLE_LOSS_SOURCES,
        "zero3_reduce_copies": _DS_Z3_REDUCE_COPY,
        "zero3_step_temp_bytes": _DS_Z3_STEP,
        "zero3_sub_group_elements": _DS_Z3_SUB_GROUP,
        "zero3_prefetch_elements": _DS_Z3_PREFETCH,
        "zero3_max_live_elements": _DS_Z3_LIVE,
        "weight_bytes": "bf16.enabled: bf16 module parameters",
        "grad_bytes": "the cost model's default (bf16 gradient partitions)",
        "moment_bytes": _FP32_MOMENTS,
        "master_weight_bytes": "ZeRO keeps fp32 master partitions "
                               "(deepspeed/runtime/zero/stage_1_and_2.py)",
        "optimizer_step_temp_bytes": "DeepSpeed FusedAdam (deepspeed/ops/adam)",
        "pp_unsharded_bytes": "ZeRO-3 is incompatible with DeepSpeed pipeline parallelism",
        "pp_unsharded_forward_bytes": "as pp_unsharded_bytes: none",
        "unfused_score_saved_bytes": "DeepSpeed runs the model's own attention: "
                                     "torch SDPA's math path when not fused. " + _MATH_SDPA,
        "unfused_score_work_bytes": _MATH_SDPA_WORK,
        "fp8_weight_cache_bytes": "no FP8 weight cache in the DeepSpeed engine",
        "fp8_input_saved_bytes": "the DeepSpeed engine has no FP8 Linear of its own: None",
        "fp8_shared_input_saved_bytes": "the DeepSpeed engine has no FP8 Linear of its own: None",
        "fp8_expert_glu_input_saved_bytes": "the DeepSpeed engine has no FP8 Linear of its own: "
                                            "None",
        "loss_work_bytes": "the model's own loss (Hugging Face: F.cross_entropy on fp32 "
                           "logits): " + _TORCH_CE,
        "loss_saved_bytes": _TORCH_CE_SAVED,
        "step_cached_bytes": "ZeRO's fp32 partitions and FusedAdam step in place: no large "
                             "step-time requests",
        "grad_bucket_elements": _DS_BUCKET,
        "kv_repeat_saved": "not established for the models DeepSpeed runs (Hugging Face's "
                           "repeat_kv depends on the transformers version and attention path): "
                           "0",
        **GRAPH_MOE_SOURCES,
    })


#: Why each field of :func:`pure_bf16` is what it is.
_PURE_BF16 = {
    "weight_bytes": "the model is built in bf16 and trained in bf16: torchtune "
                    "recipes/full_finetune_single_device.py _setup_model 'with "
                    "training.set_default_dtype(self._dtype), self._device: model = "
                    "config.instantiate(cfg_model)' with the recipes' 'dtype: bf16': 2",
    "grad_bytes": "autograd writes gradients in the parameters' dtype (bf16): 2",
    "master_weight_bytes": "the optimizer steps the bf16 parameters themselves: no fp32 copy, 0",
    "moment_bytes": "torch/optim/adamw.py _init_group: state['exp_avg'] = "
                    "torch.zeros_like(p, memory_format=torch.preserve_format) (and exp_avg_sq): "
                    "moments in the parameters' dtype, bf16: 2",
    "optimizer_step_temp_bytes": "torch/optim/adamw.py _multi_tensor_adamw (foreach, the CUDA "
                                 "default when fused is not set): exp_avg_sq_sqrt = "
                                 "torch._foreach_sqrt(device_exp_avg_sqs), one bf16 tensor per "
                                 "parameter; every other update is in place: 2",
    "step_cached_bytes": _PER_TENSOR_STEP,
}


def pure_bf16(conv: MemoryConventions) -> MemoryConventions:
    """``conv`` for pure bf16 training: the model's parameters, gradients and a torch
    optimizer's moments all in bf16, no fp32 master copy, the step's temporaries those of
    torch's foreach AdamW on bf16 tensors (every field's source in :data:`_PURE_BF16`; the
    fields that do not depend on the state dtype, such as the loss's and attention's working
    bytes, stay ``conv``'s).

    Pure bf16 is what torchtune runs (``dtype: bf16``: 2 + 2 + 2 x 2 = 8 bytes per parameter
    against mixed precision's 2 + 4 + 12 = 18 of Megatron-LM's distributed optimizer)."""
    return replace(conv, weight_bytes=2, grad_bytes=2, master_weight_bytes=0, moment_bytes=2,
                   optimizer_step_temp_bytes=2, step_cached_bytes=0,
                   sources={**conv.sources, **_PURE_BF16})
