"""Launchers: the torchrun command and a Slurm batch script that start a plan's processes."""

from __future__ import annotations

from autopar.errors import InvalidClusterSpec

from .export import Export
from .export.common import RDZV_PORT, node_layout, torchrun_command

#: CPU cores the Slurm script asks for per GPU (``--cpus-per-task`` = this x GPUs per node, one
#: task per node): each rank's main process and its data-loader workers. Slurm gives a task one
#: CPU unless told, which pins all of a node's ranks to one core. 8 fits the common 8-GPU nodes
#: (DGX A100: 2 x 64 cores, 16 per GPU; DGX H100: 2 x 56 cores, 14 per GPU; NVIDIA's DGX user
#: guides) with room to spare, so the job still schedules on smaller nodes; raise it to the
#: node's cores / GPUs (``to_slurm_script(cpus_per_gpu=...)``).
CPUS_PER_GPU = 8


def to_torchrun_command(plan, script: str = "train.py", script_args: tuple[str, ...] = (),
                        *, rdzv_host: str = "$MASTER_ADDR", rdzv_port: int = RDZV_PORT,
                        rdzv_id: str = "autopar") -> Export:
    """The ``torchrun`` command (one per node) that starts the plan's ranks running ``script``.

    ``rdzv_host`` is left to the shell (``$MASTER_ADDR``) by default; on one node the standalone
    rendezvous is used. ``rdzv_id`` names the job to the rendezvous: two jobs that share an
    endpoint must have different ids (the Slurm script uses ``$SLURM_JOB_ID``).
    """
    cmd, warn = torchrun_command(plan, script, script_args, rdzv_host=rdzv_host,
                                 rdzv_port=rdzv_port, rdzv_id=rdzv_id)
    return Export(cmd, tuple(warn))


def to_slurm_script(plan, script: str = "train.py", script_args: tuple[str, ...] = (), *,
                    job_name: str = "autopar", time: str = "24:00:00",
                    partition: str | None = None, cpus_per_gpu: int = CPUS_PER_GPU) -> Export:
    """An ``sbatch`` script: one task per node, each running torchrun with the plan's layout;
    the first node of the allocation hosts the rendezvous, whose id is the Slurm job's
    (``$SLURM_JOB_ID``: concurrent jobs never join each other's rendezvous). Each task gets
    ``cpus_per_gpu`` CPUs per GPU of its node (:data:`CPUS_PER_GPU`)."""
    if isinstance(cpus_per_gpu, bool) or not isinstance(cpus_per_gpu, int) or cpus_per_gpu < 1:
        raise InvalidClusterSpec(f"cpus_per_gpu must be a positive int; got {cpus_per_gpu!r}. "
                                 "Fix: the node's CPU cores divided by its GPUs, e.g. 8.")
    nodes, per_node, warn = node_layout(plan)
    run = to_torchrun_command(plan, script, script_args, rdzv_host="$MASTER_ADDR",
                              rdzv_id="$SLURM_JOB_ID")
    torchrun = run.value.replace("--standalone", f"--rdzv-backend=c10d "
                                 f"--rdzv-endpoint=$MASTER_ADDR:{RDZV_PORT} "
                                 "--rdzv-id=$SLURM_JOB_ID")
    c = plan.config
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={per_node}",
             f"#SBATCH --cpus-per-task={cpus_per_gpu * per_node}",
             f"#SBATCH --time={time}"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += [f"# autopar plan: {plan.model} on {plan.cluster}: tp={c.tp} pp={c.pp} dp={c.dp} "
              f"cp={c.cp} zero={c.zero_stage}",
              f"# --cpus-per-task: {cpus_per_gpu} CPUs per GPU for each rank and its data "
              "loaders; set it to the node's cores / GPUs",
              "set -euo pipefail",
              'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              "export MASTER_ADDR",
              # srun does not take --cpus-per-task from sbatch since Slurm 22.05: pass it on
              f"srun --cpus-per-task=$SLURM_CPUS_PER_TASK {torchrun}", ""]
    return Export("\n".join(lines), tuple(warn + list(run.warnings)))
