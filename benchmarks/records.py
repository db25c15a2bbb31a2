"""Read records in the format of benchmarks/data/published_plans.json into autopar inputs.

A record's ``cluster.inter_node`` is prose ("8x InfiniBand HDR 200 Gb/s per node (one per GPU)",
"RoCE 400 Gb/s per GPU, 3-tier Clos"); the link and NIC count are read from it here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import autopar
from autopar.models import ModelConfig

#: The published runs the benchmarks and tests use, carried in the repository (each record keeps
#: its ``source``; the format is described in benchmarks/data/README.md).
DEFAULT_PLANS = Path(__file__).resolve().parent / "data" / "published_plans.json"

_PLAN_KEYS = ("tp", "pp", "dp", "cp", "virtual_stages", "sequence_parallel", "recompute",
              "zero_stage", "schedule")


@dataclass(frozen=True)
class Record:
    """One published run as autopar inputs."""

    id: str
    model: ModelConfig
    cluster: autopar.Cluster
    train: autopar.TrainingConfig
    fixed: dict          # the plan's published (non-null) choices
    open_fields: tuple   # fields the source does not give (the evaluator chooses them)
    measured_step_s: float | None
    measured_note: str
    raw: dict


def _inter_link(text: str, gpus_per_node: int) -> tuple[str, int]:
    t = text.lower()
    count = re.match(r"\s*(\d+)\s*x", t)
    nics = int(count.group(1)) if count else gpus_per_node
    if "ndr" in t:
        return "ib-ndr", nics
    if "hdr" in t:
        return "ib-hdr", nics
    for speed in ("400", "200", "100"):
        if "roce" in t and speed in t:
            return f"roce-{speed}g", nics
    if "ethernet" in t or "eth" in t:
        return ("eth-100g" if "100" in t else "eth-25g"), nics
    return "ib-hdr", nics


def _source_year(source: str) -> int:
    """Year a source was published: a 4-digit year, an arXiv id (YYMM.NNNNN) or a release
    tag (vYY.MM); 0 when none is found."""
    years = [int(y) for y in re.findall(r"\b(20\d\d)\b", source)]
    years += [2000 + int(y) for y in re.findall(r"\b(\d\d)\d\d\.\d{4,5}\b", source)]
    years += [2000 + int(y) for y in re.findall(r"\bv(\d\d)\.\d\d", source)]
    return max(years, default=0)


def load(path: str | Path | None = None) -> list[dict]:
    """The raw records of a published_plans.json-format file."""
    return json.loads(Path(path or DEFAULT_PLANS).read_text())


def parse(rec: dict) -> Record:
    """Turn one raw record into autopar inputs (model config, cluster, training, fixed plan)."""
    model = ModelConfig.from_dict(rec["model"])
    c = rec["cluster"]
    gpn = c["gpus_per_node"]
    link, nics = _inter_link(c.get("inter_node", ""), gpn)
    cluster = autopar.Cluster.custom(c["num_gpus"] // gpn, gpn, c["gpu"], inter=link,
                                     nics_per_node=nics)
    t = rec["training"]
    flash = t.get("flash_attention")
    if flash is None:
        # FlashAttention (Dao et al., May 2022) reached Megatron-LM and NeMo in 2023: runs
        # published before 2023 used the unfused attention path
        flash = _source_year(rec.get("source", "")) >= 2023
    train = autopar.TrainingConfig(global_batch_size=t["global_batch_size"],
                                   seq_len=rec["model"]["seq_len"],
                                   micro_batch_size=t.get("micro_batch_size"),
                                   precision=t.get("precision", "bf16"),
                                   optimizer=t.get("optimizer", "adam"),
                                   flash_attention=flash)
    plan = rec["plan"]
    fixed = {k: plan[k] for k in _PLAN_KEYS if plan.get(k) is not None}
    if fixed.get("pp", 1) == 1:
        fixed.pop("schedule", None)
        fixed.pop("virtual_stages", None)
    open_fields = tuple(k for k in _PLAN_KEYS if plan.get(k) is None)
    if t.get("micro_batch_size") is None:
        open_fields += ("micro_batch_size",)
    meas = rec["measured"]
    step = meas.get("step_time_s")
    note = meas.get("step_time_note", "published")
    if step is None and meas.get("tflops_per_gpu"):
        # derived here: 6 N tokens + causal attention 6 L h s tokens (an assumption: the source
        # does not state its FLOPs convention beyond "BF16 MFU")
        n = model.num_parameters if hasattr(model, "num_parameters") else None
        step = _derived_step(model, train, meas["tflops_per_gpu"] * 1e12, c["num_gpus"])
        note = "derived: (6N + 6Lhs) tokens / (tflops_per_gpu * GPUs)"
        del n
    return Record(rec["id"], model, cluster, train, fixed, open_fields, step, note, rec)


def _derived_step(model: ModelConfig, train, flops_per_gpu: float, gpus: int) -> float:
    h, L, f, V = model.hidden_size, model.num_layers, model.ffn_hidden_size, model.vocab_size
    kv = model.num_kv_heads / model.num_heads
    params = L * (2 * h * h + 2 * h * h * kv + 3 * h * f) + 2 * V * h
    tokens = train.global_batch_size * train.seq_len
    flops = (6 * params + 6 * L * h * train.seq_len) * tokens
    return flops / (flops_per_gpu * gpus)
