"""The ``autopar plan`` command an ``estimate`` offers when its configuration does not fit."""

from __future__ import annotations

from ..models.presets import PRESETS
from ..problem import Problem


def plan_command(args, problem: Problem) -> str:
    """The ``autopar plan`` command that searches the problem ``estimate`` was given (the
    model and cluster a ``--plan`` file names where no flag gave them)."""
    train = problem.cost_model.train
    model = args.model or (problem.model if isinstance(problem.model, str) else None)
    if model is None:
        # a --plan file's model is rebuilt from its model_config, which names its preset (a
        # Hugging Face preset's plan sets --model itself: autopar.cli.plan_input)
        name = (problem.model_config or {}).get("name")
        model = name if name in PRESETS else None
    cluster = args.cluster or problem.cost_model.cluster.name
    words = ["autopar plan", f"--model {model}" if model else "", f"--cluster {cluster}",
             f"--global-batch {train.global_batch_size}", f"--seq-len {train.seq_len}",
             f"--precision {train.precision}" if train.precision != "bf16" else "",
             f"--framework {train.framework}" if train.framework != "torch" else "",
             "--no-flash-attention" if not train.flash_attention else "",
             "--optimizer-offload" if train.optimizer_offload else "",
             "--param-offload" if train.param_offload else "",
             "--activation-offload" if train.activation_offload else "",
             f"--moe-capacity-factor {train.moe_capacity_factor}"
             if train.moe_capacity_factor is not None else "",
             "--moe-pad-to-capacity" if train.moe_pad_to_capacity else "",
             "--moe-expert-load " + ",".join(f"{x:g}" for x in train.moe_expert_load)
             if train.moe_expert_load is not None else ""]
    return " ".join(w for w in words if w)
