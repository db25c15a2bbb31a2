"""The plans the export tests write (tests/test_export.py, test_export_torchtitan.py,
test_export_plugins.py): tiny-llama on A100-80GB nodes of 8 under fixed layouts."""

from __future__ import annotations

import autopar

TRAIN = autopar.TrainingConfig(global_batch_size=16, seq_len=32, precision="bf16",
                               optimizer="adamw")

#: (GPUs, fixed plan fields) shared by the Megatron/DeepSpeed and torchtitan export tests
SHAPES = {
    "fsdp": (8, dict(dp=8, tp=1, pp=1, zero_stage=3)),
    "tp-zero2": (8, dict(dp=4, tp=2, pp=1, zero_stage=2)),
    "3d-mixed": (8, dict(pp=2, dp=2, tp=2, recompute=("full", "none", "selective", "none"),
                         micro_batch_size=1, zero_stage=1, stage_blocks=(1, 1, 1, 1),
                         virtual_stages=2)),
    "pp-uneven": (8, dict(pp=2, dp=4, tp=1, zero_stage=0, stage_blocks=(1, 3),
                          recompute="full", schedule="gpipe")),
}


def cluster(gpus: int) -> autopar.Cluster:
    """Nodes of 8 A100-80GB (one node below 8 GPUs)."""
    nodes = max(1, gpus // 8)
    return autopar.Cluster.custom(nodes, gpus // nodes, "A100-80GB")


def shape_plan(gpus: int, fixed: dict) -> autopar.Plan:
    """tiny-llama's plan on ``cluster(gpus)`` with ``fixed`` pinned."""
    return autopar.optimize("tiny-llama", cluster(gpus), TRAIN, fixed=fixed)
