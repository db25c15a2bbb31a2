"""autopar: find how to train a transformer on a GPU cluster.

>>> import autopar
>>> plan = autopar.optimize("llama2-70b", "4x8xA100-80GB",
...                         autopar.TrainingConfig(global_batch_size=1024, seq_len=4096))
>>> print(plan.summary())
"""

from .api import estimate, optimize
from .config import ParallelConfig, TrainingConfig
from .cost.params import CostParams
from .cost.types import Estimate
from .errors import (
    AutoparError,
    InfeasibleError,
    InvalidCalibration,
    InvalidClusterSpec,
    InvalidModelConfig,
    InvalidParallelConfig,
    InvalidPlanFile,
    InvalidSearchOption,
    InvalidTrainingConfig,
    MissingDependency,
    OutputError,
    UntraceableModelError,
)
from .hardware import Cluster
from .plan import Plan

__version__ = "0.1.0"

__all__ = [
    "optimize", "estimate", "Plan", "Estimate", "ParallelConfig", "TrainingConfig", "Cluster",
    "CostParams", "AutoparError", "InfeasibleError", "InvalidCalibration", "InvalidClusterSpec", "InvalidModelConfig",
    "InvalidParallelConfig", "InvalidPlanFile", "InvalidSearchOption", "InvalidTrainingConfig",
    "MissingDependency", "OutputError", "UntraceableModelError",
]
