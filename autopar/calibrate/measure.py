"""``autopar measure``: run a plan's training steps with ``plan.apply`` on synthetic data and
write the run as a record of the published-run schema (benchmarks/data/README.md), with the
plan's prediction error, so that one's own runs become validation data
(``benchmarks/records.py`` reads them like the published ones).

Step time: each step is timed on every rank between device synchronisations; a step's time is
its slowest rank's; the figure is the median after the warm-up steps. Peak memory per rank:
``torch.cuda.max_memory_allocated`` on a GPU (what the allocator handed out: the plan's memory
model counts tensors, not the caching allocator's reserve); on a CPU the process's peak resident
set (``resource.getrusage``), which counts the Python process and libraries too and is not
compared with the plan.
"""

from __future__ import annotations

import datetime
import os
import resource
import time

import torch
import torch.distributed as dist

from ..errors import AutoparError, InvalidParallelConfig, InvalidPlanFile
from ..hardware import Cluster
from ..models import build, get_config
from ..plan import Plan
from .bench import available_bytes
from .fit import measured_cluster
from .run import device_info, match_catalog
from .schema import load_calibration

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _data(plan: Plan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids [global batch, seq_len] and their next-token labels (seed 0: the same
    on every rank)."""
    vocab = int(plan.model_config["vocab_size"])
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (plan.train.global_batch_size, plan.train.seq_len + 1),
                        generator=g)
    return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)


def _peak_memory(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux: KiB


def _gather(value: float, device: torch.device) -> list[float]:
    world = dist.get_world_size()
    t = torch.zeros(world, dtype=torch.float64, device=device)
    t[dist.get_rank()] = value
    dist.all_reduce(t)
    return t.tolist()


def launch_hint(plan: Plan) -> str:
    """The torchrun line that starts ``plan.world_size`` ranks as the plan's cluster lays them
    out (nodes x GPUs per node; all on one node when the cluster spec is a custom name)."""
    try:
        c = Cluster.from_spec(plan.cluster)
        nodes, per_node = c.num_nodes, c.gpus_per_node
    except AutoparError:
        nodes, per_node = 1, plan.world_size
    if nodes * per_node != plan.world_size:
        nodes, per_node = 1, plan.world_size
    cmd = (f"`torchrun --nnodes={nodes} --nproc-per-node={per_node} -m autopar.cli measure "
           "--plan FILE --out FILE`")
    return cmd + (f" on each of the {nodes} nodes (with --rdzv-backend=c10d --rdzv-endpoint="
                  "HOST:PORT)" if nodes > 1 else "")


def preflight(plan: Plan, world: int, device: torch.device, ranks_here: int = 1) -> None:
    """Refuse, before any model is built, a run that cannot work: ``world`` ranks (the process
    group's size; 1 for a plain process) for a plan of ``plan.world_size``, or a model whose
    fp32 parameters (4 bytes each: :func:`run_steps` builds the whole model on every rank
    before ``plan.apply`` shards it) do not fit the memory ``ranks_here`` ranks share (the
    host's on a CPU, each GPU's own on a GPU).

    Raises:
        InvalidPlanFile: the plan has no model_config.
        InvalidParallelConfig: the world size or the memory does not match, with the fix.
    """
    if plan.model_config is None:
        raise InvalidPlanFile(
            f"plan of {plan.model!r} has no model_config, so its model cannot be rebuilt here. "
            "Fix: plan a preset or a model dict (autopar plan --model NAME --out plan.json).")
    if world != plan.world_size:
        how = ("this is one plain process (WORLD_SIZE unset: not started by torchrun)"
               if world == 1 else f"the process group has {world}")
        raise InvalidParallelConfig(
            f"the plan of {plan.model} on {plan.cluster} needs {plan.world_size} ranks (its "
            f"world size: tp {plan.config.tp} x pp {plan.config.pp} x dp {plan.config.dp} x cp "
            f"{plan.config.cp}); {how}, and nothing was built. Fix: run it on the plan's "
            f"cluster with {launch_hint(plan)}, or measure a plan made for {world} rank{'s' if world != 1 else ''} "
            f"(e.g. autopar plan --cluster 1x{world}x<GPU> ... --out FILE).")
    need = 4.0 * get_config(plan.model_config).num_parameters * (
        ranks_here if device.type != "cuda" else 1)
    have = available_bytes(device)
    if need > have:
        where = (f"the host's available memory ({have / 1e9:.3g} GB, shared by "
                 f"{ranks_here} rank{'s' if ranks_here != 1 else ''})" if device.type != "cuda"
                 else f"this GPU's free memory ({have / 1e9:.3g} GB)")
        raise InvalidParallelConfig(
            f"autopar measure builds the whole {plan.model} model in fp32 on every rank before "
            f"plan.apply shards it: {need / 1e9:.3g} GB, more than {where}; nothing was "
            "built. Fix: measure a smaller model with the same parallel layout (a model dict "
            "with fewer layers or a smaller hidden size: autopar plan --model FILE.json ... "
            "--out FILE), or run on devices with more memory.")


def run_steps(plan: Plan, steps: int, warmup: int, device: torch.device) -> dict:
    """Apply ``plan`` on this rank and time ``warmup + steps`` optimizer steps (an initialised
    process group of the plan's world size is needed).

    Returns:
        {"step_times_s": slowest rank's time of each measured step, "memory_per_rank_bytes":
        peak per rank, "losses": loss of every step, "notes": the runtime's notes}.

    Raises:
        InvalidPlanFile: the plan has no model_config (a module's plan cannot be rebuilt).
        InvalidParallelConfig: the world size does not match, or the model cannot be built in
            the memory there is (:func:`preflight`, checked before anything is built).
        UnsupportedPlanError: the runtime cannot apply the plan.
    """
    preflight(plan, dist.get_world_size(), device,
              int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())))
    precision = plan.train.precision
    model = build(plan.model_config, device=device, dtype=torch.float32, seed=0)
    run = plan.apply(model)
    del model  # the parts other ranks own are freed once apply's chunks hold this rank's
    x, y = _data(plan, device)
    low = _AUTOCAST.get(precision) if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=low, enabled=low is not None):
            losses.append(run.step(x, y))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    world_times = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(world_times, op=dist.ReduceOp.MAX)
    notes = list(run.notes)
    if low is not None:
        notes.append(f"{precision}: torch.autocast over fp32 parameters (fp32 master weights).")
    elif precision != "fp32":
        notes.append(f"the plan trains in {precision}; on {device.type} this run computed in "
                     "fp32.")
    return {"step_times_s": world_times.tolist(),
            "memory_per_rank_bytes": _gather(_peak_memory(device), device),
            "losses": losses, "notes": notes}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def record(plan: Plan, result: dict, steps: int, warmup: int, device: torch.device,
           calibration=None) -> dict:
    """The published-run record of a measured plan (schema: benchmarks/data/README.md),
    with ``prediction`` (the plan's estimate and its signed relative error,
    (predicted - measured) / measured) and ``autopar_plan`` (the plan file). ``calibration``:
    the one the plan was priced with; a plan on its :func:`~.fit.measured_cluster` (a CPU, say)
    run on the device it measured is comparable."""
    cal = load_calibration(calibration) if calibration is not None else None
    cluster = Cluster.from_spec(plan.cluster) if _spec_ok(plan.cluster) else None
    own = None  # the calibrated machine, when the plan was priced on it
    if cluster is None and cal is not None and cal.gemm and cal.memory:
        own = measured_cluster(cal)
        cluster = own if own.name == plan.cluster else None
    gpu = cluster.device.name if cluster else None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        ran_on = props.name
        ran_catalog = match_catalog(props.name, float(props.total_memory))
    else:
        ran_on, ran_catalog = "cpu", None
    comparable = ran_catalog is not None and ran_catalog == gpu
    if own is not None and cluster is own:
        # priced on the calibrated machine itself: comparable when this is that device
        comparable = device_info(device, None).name == cal.device.name
    step = _median(result["step_times_s"])
    mem = result["memory_per_rank_bytes"]
    c, tr = plan.config, plan.train
    model = dict(plan.model_config)
    model["seq_len"] = tr.seq_len
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    pred_mem = plan.estimate.memory_per_gpu_bytes
    notes = list(result["notes"])
    if not comparable:
        notes.append(f"ran on {ran_on}, not on the plan's {gpu}: the prediction error compares "
                     "different hardware and does not test the cost model.")
    if device.type != "cuda":
        notes.append("memory is the process's peak resident set (ru_maxrss): Python and "
                     "libraries included; not the plan's per-GPU memory, not compared.")
    inter = cluster.inter_link if cluster else None
    return {
        "id": f"measured-{plan.model}-{plan.cluster}-{now}",
        "source": f"autopar measure, torch {torch.__version__} "
                  f"({dist.get_backend()}), {now}",
        "model": model,
        "cluster": {
            "gpu": gpu, "num_gpus": plan.world_size,
            "gpus_per_node": cluster.gpus_per_node if cluster else plan.world_size,
            "intra_node": cluster.intra_link.name if cluster else None,
            "inter_node": (f"{cluster.nics_per_node}x {inter.name}" if inter and cluster
                           and cluster.num_nodes > 1 else "none (one node)"),
            "ran_on": {"device": ran_on, "catalog": ran_catalog, "backend": dist.get_backend(),
                       "world_size": dist.get_world_size()},
        },
        "training": {"global_batch_size": tr.global_batch_size,
                     "micro_batch_size": c.micro_batch_size, "precision": tr.precision,
                     "optimizer": tr.optimizer, "flash_attention": tr.flash_attention,
                     "framework": "torch"},
        "plan": {"tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp,
                 "virtual_stages": c.virtual_stages, "sequence_parallel": c.sequence_parallel,
                 "recompute": c.recompute if isinstance(c.recompute, str) else list(c.recompute),
                 "zero_stage": c.zero_stage, "schedule": c.schedule},
        "measured": {
            "step_time_s": step,
            "step_time_note": f"median of {steps} steps after {warmup} warm-up steps; each "
                              "step's time is its slowest rank's (device synchronised)",
            "step_times_s": result["step_times_s"],
            "memory_gib": max(mem) / 2 ** 30 if device.type == "cuda" else None,
            "memory_per_rank_bytes": mem,
            "memory_note": ("torch.cuda.max_memory_allocated per rank" if device.type == "cuda"
                            else "not measured on CPU (ru_maxrss per rank given instead)"),
            "losses": result["losses"],
        },
        "prediction": {
            "step_time_s": plan.estimate.step_time_s,
            "step_time_relative_error": (plan.estimate.step_time_s - step) / step,
            "memory_per_gpu_bytes": pred_mem,
            "memory_relative_error": ((pred_mem - max(mem)) / max(mem)
                                      if device.type == "cuda" else None),
            "comparable": comparable,
        },
        "autopar_plan": plan.to_dict(),
        "notes": " ".join(notes),
    }


def _spec_ok(spec: str) -> bool:
    try:
        Cluster.from_spec(spec)
        return True
    except AutoparError:
        return False
