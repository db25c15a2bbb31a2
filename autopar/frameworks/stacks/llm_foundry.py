"""``llm-foundry``: MosaicML llm-foundry on Composer (2023 yamls): Composer's FSDP is FSDP1
(:mod:`.fsdp1`) with fp32 gradient reduction, and attention is its Triton FlashAttention
(``attn_impl: triton``), an FA1-era kernel. Capabilities as the torch profile."""

from __future__ import annotations

from dataclasses import replace

from ..choices import AttentionKernels, Choices, compose
from ..memory import TORCH_MEMORY
from . import fsdp1, pytorch

COMPOSER_FSDP = replace(
    fsdp1.FLAT_PARAM, name="composer-fsdp1", grad_reduce_bytes=4,
    summary="Composer FSDP (FSDP1 FULL_SHARD) with mixed_precision DEFAULT",
    sources={**fsdp1.FLAT_PARAM.sources,
             "grad_reduce_bytes": "Composer FSDP mixed_precision DEFAULT: reduce_dtype float32 "
                                  "(the records' notes)"})

TRITON_FLASH_V1 = AttentionKernels(
    name="triton-flash-v1", summary="llm-foundry attn_impl: triton (FlashAttention-1 era)",
    attention_kernels={"*": "fa1"}, sources={
        "attention_kernels": "llm-foundry 2023 yamls attn_impl: triton (FlashAttention-1 "
                             "era Triton kernel) / flash-attention v1 training code"})

CHOICES: Choices = replace(fsdp1.CHOICES, sharded_dp=COMPOSER_FSDP, attention=TRITON_FLASH_V1)

_FUSED_CE = ("llmfoundry/models/mpt/modeling_mpt.py ComposerMPTCausalLM: loss_fn_config = "
             "om_model_config.get('loss_fn', 'fused_crossentropy') -> flash_attn.losses."
             "cross_entropy.CrossEntropyLoss(ignore_index=-100) (inplace_backward False); "
             "flash_attn/ops/triton/cross_entropy.py CrossEntropyLoss: ")

#: torch's conventions with llm-foundry's default loss, flash-attn's fused cross entropy, on the
#: logits the amp_bf16 autocast leaves in bf16 (the unembedding is an F.linear).
MEMORY = replace(TORCH_MEMORY, loss_saved_bytes=2, loss_work_bytes=2, sources={
    **TORCH_MEMORY.sources,
    "loss_saved_bytes": _FUSED_CE + "ctx.save_for_backward(logits, lse, labels): the bf16 "
                        "logits and one fp32 log-sum-exp per row: 2",
    "loss_work_bytes": _FUSED_CE + "backward 'dlogits = logits if ctx.inplace_backward else "
                       "torch.empty_like(logits)': a bf16 gradient: 2"})

PROFILE = compose(CHOICES, **{**pytorch.borrowed_capabilities(), "memory": MEMORY},
                  name="llm-foundry",
                  version="llm-foundry on Composer FSDP1, 2023 (scripts/train/yamls/pretrain)")
