"""``flash-attention-training``: the training code of the flash-attention repository (2022,
``training/``: PyTorch Lightning DDP with FlashAttention v1). Costed as the torch profile with
FlashAttention-1; capabilities as the torch profile."""

from __future__ import annotations

from dataclasses import replace

from ..choices import EAGER_MODEL_LOSS, AttentionKernels, Choices, compose
from ..memory import TORCH_MEMORY
from . import pytorch

FLASH_V1 = AttentionKernels(
    name="flash-attn-v1", summary="FlashAttention v1 (flash_attn 0.x CUDA kernels)",
    attention_kernels={"*": "fa1"}, sources={
        "attention_kernels": "flash-attention v1 training code (training/, 2022): the "
                             "FlashAttention-1 kernels of the repository"})

#: its loss is apex's fused cross entropy (train.loss_fn CrossEntropyLossApex): not torch's eager one
CHOICES: Choices = replace(pytorch.CHOICES, attention=FLASH_V1, fusion=EAGER_MODEL_LOSS)

_APEX_CE = ("training/configs/experiment/pile/base.yaml train.loss_fn: src.losses."
            "cross_entropy_apex.CrossEntropyLossApex, inplace_backward: True ('to save "
            "memory'); training/src/losses/cross_entropy_apex.py SoftmaxCrossEntropyLossFn: ")

#: torch's conventions with the repository's loss, apex's fused cross entropy with an in-place
#: backward, on the logits Lightning's bf16 autocast leaves in bf16.
MEMORY = replace(TORCH_MEMORY, loss_saved_bytes=2, loss_work_bytes=0, sources={
    **TORCH_MEMORY.sources,
    "loss_saved_bytes": _APEX_CE + "ctx.save_for_backward(logits, max_log_sum_exp, labels): "
                        "the bf16 logits and one fp32 value per row: 2",
    "loss_work_bytes": _APEX_CE + "xentropy_cuda_lib.backward(..., ctx.inplace_backward) "
                       "writes the gradient into the saved logits: 0"})

PROFILE = compose(CHOICES, **{**pytorch.borrowed_capabilities(), "memory": MEMORY},
                  name="flash-attention-training",
                  version="flash-attention training code (Lightning DDP, FlashAttention v1), "
                          "2022")
