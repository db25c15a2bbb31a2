"""What to change so a configuration fits, and what a whole training run costs.

    problem = Problem.build("llama2-70b", "4x8xA800-80GB+4xroce-200g", TrainingConfig(1024, 4096))
    for change, est in fixes_to_fit(problem, ParallelConfig(tp=4, pp=2, dp=4)):
        print(change, est.memory_per_gpu_bytes / 1e9, est.step_time_s)
    run_cost(est, tokens=2e12, price_per_gpu_hour=2.5, gpus=32)   # days, GPU-hours, cost
"""

from __future__ import annotations

from ..config import RECOMPUTE_MODES, ParallelConfig
from ..cost.types import Estimate
from ..errors import AutoparError
from ..problem import Problem


def fixes_to_fit(problem: Problem, config: ParallelConfig) -> list[tuple[str, Estimate]]:
    """Changes to ``config`` that make it fit, each re-estimated: more recomputation, ZeRO,
    sequence parallelism, a smaller micro-batch, more TP, PP or CP (dp shrinking to match), and
    pairs of them, each one the training framework (``problem``'s ``train.framework``) can run.
    Fitting ones first, fastest first; then the rest by memory, those only that lower the peak
    (where the optimizer step's temporaries set it, recomputation and SP move bytes between
    activations and the step's working memory and change nothing: they are not offered).

    Returns:
        ``[(description, estimate)]`` (at most 8, no two with the same step time and memory;
        empty when no change in reach lowers the peak).
    """
    cm = problem.cost_model
    c = cm.resolve(config)
    peak = cm.estimate(c).memory_per_gpu_bytes
    cands: dict[str, dict] = {}
    single: list[tuple[str, dict]] = []
    for rc in RECOMPUTE_MODES[1:]:   # the framework's own are kept below
        if c.recompute != rc:
            single.append((f"recompute {rc}", {"recompute": rc}))
    if c.dp * c.cp > 1:
        for z in (1, 2, 3):
            if z > c.zero_stage:
                single.append((f"ZeRO-{z}", {"zero_stage": z}))
    if c.tp > 1 and not c.sequence_parallel:
        single.append(("sequence parallel on", {"sequence_parallel": True}))
    if c.micro_batch_size > 1:
        single.append(("micro-batch 1", {"micro_batch_size": 1}))
    for dim in ("tp", "pp", "cp"):
        new = getattr(c, dim) * 2
        if c.dp % 2 == 0:
            single.append((f"{dim} {getattr(c, dim)}->{new} (dp {c.dp}->{c.dp // 2})",
                           {dim: new, "dp": c.dp // 2, "stage_blocks": None,
                            "virtual_stages": 1 if dim == "pp" else c.virtual_stages}))
    for text, ch in single:
        cands[text] = ch
    for i, (t1, c1) in enumerate(single):
        for t2, c2 in single[i + 1:]:
            if set(c1) & set(c2):
                continue
            cands[f"{t1} + {t2}"] = {**c1, **c2}
    profile = cm.profile
    results = []
    for text, ch in cands.items():
        try:
            changed = cm.resolve(c.replace(**ch))
        except AutoparError:
            continue
        # only what the target framework runs
        if profile.unsupported(changed, moe=cm.graph.num_experts > 0) is None:
            results.append((text, cm.estimate(changed)))
    fitting = sorted((r for r in results if r[1].fits), key=lambda r: r[1].step_time_s)
    # a change that leaves the peak where it is (to a part in a thousand) helps nothing
    rest = sorted((r for r in results if not r[1].fits
                   and r[1].memory_per_gpu_bytes < peak * (1 - 1e-3)),
                  key=lambda r: r[1].memory_per_gpu_bytes)
    # changes that come to the same plan (ZeRO at one data-parallel rank, where it shards
    # nothing) are one row: the first, the fewest words (single changes come first)
    seen, rows = set(), []
    for text, e in fitting + rest:
        key = (e.step_time_s, e.memory_per_gpu_bytes, e.fits)
        if key not in seen:
            seen.add(key)
            rows.append((text, e))
    return rows[:8]


def run_cost(est: Estimate, tokens: float, price_per_gpu_hour: float | None,
             gpus: int, currency: str = "USD") -> dict:
    """Wall-clock time and money to train on ``tokens`` tokens at this estimate's throughput.

    Returns:
        ``{"seconds", "days", "gpu_hours", "cost", "price_per_gpu_hour", "currency"}`` (cost None
        without a price), where ``seconds = tokens / tokens_per_s``, ``gpu_hours = gpus *
        seconds / 3600`` and ``cost = gpu_hours * price_per_gpu_hour``, in ``currency`` (the
        price's own: nothing is converted).
    """
    seconds = tokens / est.tokens_per_s
    gpu_hours = gpus * seconds / 3600
    return {"seconds": seconds, "days": seconds / 86400, "gpu_hours": gpu_hours,
            "cost": None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour,
            "price_per_gpu_hour": price_per_gpu_hour, "currency": currency}
