"""Run a plan on stock ``torch.distributed`` (:func:`apply`) and export it to other frameworks
(Megatron-LM, Megatron-Bridge, torchtitan, DeepSpeed, Accelerate, Colossal-AI, torchrun, Slurm). See docs/runtime.md."""

from .apply import ParallelRun, apply, lm_loss
from .errors import UnsupportedPlanError
from .export import (
    Export,
    to_accelerate_config,
    to_colossalai_plugin,
    to_deepspeed_config,
    to_megatron_args,
    to_megatron_bridge,
    to_torchtitan,
    to_torchtitan_config,
    to_torchtitan_toml,
)
from .launch import to_slurm_script, to_torchrun_command
from .mesh import PlanMesh, mesh_dims
from .validate import RUNTIME_SCHEDULES, check_plan

__all__ = ["apply", "check_plan", "ParallelRun", "PlanMesh", "mesh_dims", "RUNTIME_SCHEDULES",
           "lm_loss", "UnsupportedPlanError", "Export",
           "to_megatron_args", "to_megatron_bridge", "to_torchtitan", "to_torchtitan_config",
           "to_torchtitan_toml", "to_deepspeed_config", "to_accelerate_config",
           "to_colossalai_plugin", "to_torchrun_command",
           "to_slurm_script"]
