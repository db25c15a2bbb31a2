"""``fsdp1``: PyTorch FSDP1 (``torch.distributed.fsdp.FullyShardedDataParallel``, flat
parameters) training loops, as fms-fsdp (4ffb9bd, main_training.py) runs them: the torch profile's
capabilities and kernels, FSDP1's gradient copies instead of FSDP2's. Its hybrid sharding (HSDP:
ZeRO within a node, replicas across nodes) is :func:`autopar.frameworks.stacks.shard_within`;
torch.compile is :func:`autopar.frameworks.choices.with_choice` with ``TORCH_COMPILE``."""

from __future__ import annotations

from dataclasses import replace

from ..choices import EAGER_MODEL_LOSS, Choices, compose
from ..vocabulary import FSDP1_GRAD_COPY_PASSES
from . import pytorch

#: FSDP1's flat parameter: gradient concat on the compute stream, gathers in place.
FLAT_PARAM = replace(
    pytorch.SHARDED_DP, name="fsdp1-flat-param", zero_grad_copy_passes=FSDP1_GRAD_COPY_PASSES,
    fsdp2_copies=False,
    summary="torch FSDP1 FullyShardedDataParallel (flat parameters), FULL_SHARD by default",
    group_option="ShardingStrategy.HYBRID_SHARD (fms-fsdp 4ffb9bd fms_fsdp/utils/"
                 "train_utils.py get_policies: 'hsdp' -> HYBRID_SHARD), which shards "
                 "parameters, gradients and optimizer states within a node and replicates "
                 "them across nodes",
    sources={**pytorch.SHARDED_DP.sources,
             "zero_grad_copy_passes": "FSDP1 flat parameters (FSDP1_GRAD_COPY_PASSES): "
             "fms-fsdp 4ffb9bd main_training.py wraps the model in torch.distributed.fsdp."
             "FullyShardedDataParallel; the llm-foundry benchmark tables' Sharding Strategy "
             "FULL_SHARD is FSDP1's ShardingStrategy (Composer's FSDP)",
             "fsdp2_copies": "FSDP1 all-gathers into its flat parameter in place "
             "(torch/distributed/fsdp/_flat_param.py _all_gather_flat_param) and casts and "
             "reduces its flat gradient on the post-backward stream (_runtime_utils.py "
             "_reduce_grad)",
             "zero3_regather_per_micro_batch": "as the torch profile (torch.distributed."
             "pipelining keeps FSDP stage modules gathered across micro-batches); FSDP1 "
             "loops without pipelining do not read it"})

#: fms-fsdp (the corpus's FSDP1 stack) takes torch.nn.CrossEntropyLoss on the model's bf16
#: logits (fms_fsdp/utils/train_utils.py train: ``ce_loss(output.view(-1, output.size(-1)),
#: label.view(-1).long())``), no fp32 upcast: the loss as the graph counts it.
CHOICES: Choices = replace(pytorch.CHOICES, sharded_dp=FLAT_PARAM, fusion=EAGER_MODEL_LOSS)

#: FSDP1 shards by ShardingStrategy: NO_SHARD (ZeRO-0), SHARD_GRAD_OP (ZeRO-2), FULL_SHARD
#: (ZeRO-3) and their hybrid forms; none shards the optimizer states alone (ZeRO-1)
FSDP1_ZERO = (0, 2, 3)
_TORCH = pytorch.borrowed_capabilities()
PROFILE = compose(
    CHOICES, **{**_TORCH, **{k: tuple(z for z in _TORCH[k] if z in FSDP1_ZERO)
                             for k in ("zero_stages", "zero_stages_with_tp",
                                       "zero_stages_with_pp", "zero_stages_with_ep")},
                "sources": {**_TORCH["sources"],
                            "zero_stages": "torch.distributed.fsdp.ShardingStrategy: NO_SHARD "
                                           "(ZeRO-0), SHARD_GRAD_OP (ZeRO-2), FULL_SHARD "
                                           "(ZeRO-3), HYBRID_SHARD / _HYBRID_SHARD_ZERO2; no "
                                           "optimizer-state-only sharding (ZeRO-1)"}},
    name="fsdp1", version="torch.distributed.fsdp FullyShardedDataParallel (FSDP1), as "
                          "fms-fsdp 4ffb9bd (other capabilities as the torch profile)")
