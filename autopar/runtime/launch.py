"""Launchers: the torchrun command and a Slurm batch script that start a plan's processes."""

from __future__ import annotations

import shlex

from autopar.hardware import Cluster

from .export import Export

#: Default rendezvous port (torchrun's conventional 29500).
RDZV_PORT = 29500


def _layout(plan) -> tuple[int, int, list[str]]:
    """(nodes, processes per node, warnings) for the plan's world on its cluster."""
    cluster = Cluster.from_spec(plan.cluster)
    world, per_node = plan.world_size, cluster.gpus_per_node
    warn = []
    if world < per_node:
        per_node = world
    if world % per_node:
        warn.append(f"{world} ranks do not fill whole {per_node}-GPU nodes; used "
                    f"{-(-world // per_node)} nodes with {per_node} ranks each (adjust by hand)")
    return -(-world // per_node), per_node, warn


def to_torchrun_command(plan, script: str = "train.py", script_args: tuple[str, ...] = (),
                        *, rdzv_host: str = "$MASTER_ADDR", rdzv_port: int = RDZV_PORT) -> Export:
    """The ``torchrun`` command (one per node) that starts the plan's ranks running ``script``.

    ``rdzv_host`` is left to the shell (``$MASTER_ADDR``) by default; on one node the standalone
    rendezvous is used.
    """
    nodes, per_node, warn = _layout(plan)
    cmd = ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={per_node}"]
    if nodes == 1:
        cmd.append("--standalone")
    else:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_host}:{rdzv_port}",
                "--rdzv-id=autopar"]
    cmd += [shlex.quote(script), *(shlex.quote(a) for a in script_args)]
    return Export(" ".join(cmd), tuple(warn))


def to_slurm_script(plan, script: str = "train.py", script_args: tuple[str, ...] = (), *,
                    job_name: str = "autopar", time: str = "24:00:00",
                    partition: str | None = None) -> Export:
    """An ``sbatch`` script: one task per node, each running torchrun with the plan's layout;
    the first node of the allocation hosts the rendezvous."""
    nodes, per_node, warn = _layout(plan)
    run = to_torchrun_command(plan, script, script_args, rdzv_host="$MASTER_ADDR")
    torchrun = run.value.replace("--standalone", f"--rdzv-backend=c10d "
                                 f"--rdzv-endpoint=$MASTER_ADDR:{RDZV_PORT} --rdzv-id=autopar")
    c = plan.config
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={per_node}",
             f"#SBATCH --time={time}"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += [f"# autopar plan: {plan.model} on {plan.cluster}: tp={c.tp} pp={c.pp} dp={c.dp} "
              f"cp={c.cp} zero={c.zero_stage}",
              "set -euo pipefail",
              'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              "export MASTER_ADDR",
              f"srun {torchrun}", ""]
    return Export("\n".join(lines), tuple(warn + list(run.warnings)))
