"""Exporters: a plan as Megatron-LM arguments, Megatron-Bridge ConfigContainer overrides (YAML), a
torchtitan TOML, a DeepSpeed config, an
Accelerate launch YAML (FSDP or DeepSpeed plugin), Colossal-AI plugin arguments.

Each returns an :class:`Export`: a ``str``, the text to write, carrying the value in the
framework's form and ``warnings``, one line per plan choice the framework cannot express, naming
the nearest equivalent used. Nothing is dropped silently; the text (``Export.text()``) puts the
warnings in the output as comments. Each exporter
also builds the configuration it really writes (``Export.written``, in autopar's terms) and
re-estimates it under that framework (:mod:`autopar.runtime.verdict`): the last warnings say the
step time and memory of what the file runs against the plan's, whether it still fits, and when
not, the nearest plan the framework can run (its :mod:`autopar.frameworks` profile).

Which framework versions the names follow (see docs/runtime.md for how each was checked):
Megatron-LM ``megatron/training/arguments.py`` (core_r0.12 and later), Megatron-Bridge at
067f987df03b (``training/config.py``), torchtitan v0.2.2
(``torchtitan/config/job_config.py``, a TOML job file: :mod:`.torchtitan`) and torchtitan 0.3.0
(``torchtitan/config/configs.py``, a Python config file: :mod:`.torchtitan_config`; which one
:func:`to_torchtitan` writes follows the installed torchtitan, else the plan's framework,
:mod:`.version`), DeepSpeed 0.19
(``deepspeed/runtime/config.py``), Accelerate 1.16 (``commands/config/config_args.py``),
Colossal-AI 0.5 (``colossalai/booster/plugin``). One module per framework;
:mod:`.common` holds what they share.
"""

from .accelerate import to_accelerate_config
from .colossalai import to_colossalai_plugin
from .common import Export
from .deepspeed import to_deepspeed_config
from .megatron import MEGATRON_FLAGS, to_megatron_args
from .megatron_bridge import to_megatron_bridge
from .torchtitan import TITAN_LLAMA3_FLAVORS, titan_batch_check, to_torchtitan_toml
from .torchtitan_config import to_torchtitan_config
from .version import TORCHTITAN_EXPORTERS, installed_torchtitan, to_torchtitan

__all__ = ["Export", "MEGATRON_FLAGS", "TITAN_LLAMA3_FLAVORS", "TORCHTITAN_EXPORTERS",
           "installed_torchtitan", "titan_batch_check", "to_accelerate_config",
           "to_colossalai_plugin", "to_deepspeed_config", "to_megatron_args", "to_megatron_bridge",
           "to_torchtitan", "to_torchtitan_config", "to_torchtitan_toml"]
