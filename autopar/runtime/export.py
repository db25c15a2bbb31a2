"""placeholder"""
class Export: pass
def to_megatron_args(p): pass
def to_torchtitan_toml(p): pass
def to_deepspeed_config(p): pass
def to_torchrun_command(p, **k): pass
def to_slurm_script(p, **k): pass
