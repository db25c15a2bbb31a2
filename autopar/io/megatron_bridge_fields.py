"""Megatron-Bridge ``ConfigContainer`` field names for the Megatron-LM arguments autopar writes:
the table the exporter (:mod:`autopar.runtime.export.megatron_bridge`) renames by and the
importer (:mod:`autopar.io.megatron_bridge_importer`) reads back by, kept here, below both
(data only)."""

from __future__ import annotations

#: The Megatron-Bridge source the names were read from.
BRIDGE_VERSION = ("Megatron-Bridge 067f987df03b (2026-08-22; Megatron-LM 2a75ac12c54b as "
                  "3rdparty/Megatron-LM)")

#: Megatron-LM argument -> (ConfigContainer section, field). Every flag the Megatron-LM exporter
#: writes for the plan's choices; the model-shape flags (--num-layers, --hidden-size...) are the
#: recipe's and are not written.
FIELDS = {
    "--tensor-model-parallel-size": ("model", "tensor_model_parallel_size"),
    "--pipeline-model-parallel-size": ("model", "pipeline_model_parallel_size"),
    "--context-parallel-size": ("model", "context_parallel_size"),
    "--sequence-parallel": ("model", "sequence_parallel"),
    "--expert-model-parallel-size": ("model", "expert_model_parallel_size"),
    "--expert-tensor-parallel-size": ("model", "expert_tensor_parallel_size"),
    "--cp-comm-type": ("model", "cp_comm_type"),
    "--pipeline-model-parallel-layout": ("model", "pipeline_model_parallel_layout"),
    "--microbatch-group-size-per-virtual-pipeline-stage": (
        "model", "microbatch_group_size_per_vp_stage"),
    "--recompute-granularity": ("model", "recompute_granularity"),
    "--recompute-method": ("model", "recompute_method"),
    "--recompute-num-layers": ("model", "recompute_num_layers"),
    "--recompute-modules": ("model", "recompute_modules"),
    "--tp-comm-overlap": ("model", "tp_comm_overlap"),
    "--moe-token-dispatcher-type": ("model", "moe_token_dispatcher_type"),
    "--moe-flex-dispatcher-backend": ("model", "moe_flex_dispatcher_backend"),
    "--moe-grouped-gemm": ("model", "moe_grouped_gemm"),
    "--moe-expert-capacity-factor": ("model", "moe_expert_capacity_factor"),
    "--moe-pad-expert-input-to-capacity": ("model", "moe_pad_expert_input_to_capacity"),
    "--seq-length": ("model", "seq_length"),
    "--micro-batch-size": ("train", "micro_batch_size"),
    "--global-batch-size": ("train", "global_batch_size"),
    "--use-distributed-optimizer": ("ddp", "use_distributed_optimizer"),
    "--overlap-grad-reduce": ("ddp", "overlap_grad_reduce"),
    "--overlap-param-gather": ("ddp", "overlap_param_gather"),
    "--use-torch-fsdp2": ("dist", "use_torch_fsdp2"),
    "--use-tp-pp-dp-mapping": ("dist", "use_tp_pp_dp_mapping"),
    "--optimizer": ("optimizer", "optimizer"),
    "--use-precision-aware-optimizer": ("optimizer", "use_precision_aware_optimizer"),
    "--optimizer-cpu-offload": ("optimizer", "optimizer_cpu_offload"),
    "--exp-avg-dtype": ("optimizer", "exp_avg_dtype"),
    "--exp-avg-sq-dtype": ("optimizer", "exp_avg_sq_dtype"),
}
