"""Search speed on the two reference problems of issue 6 (print, not assert).

    python -m benchmarks.search_speed

GPT-3 175B on 1024 A100-80GB, global batch 1536 x 2048; Llama-3 405B on 16384 H100, 16M tokens
per batch (2048 x 8192). Targets on 2 cores: <= 10 s and <= 60 s for the full space.
"""

from __future__ import annotations

import time

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.search.optimize import search

CASES = [
    ("gpt3-175b", "128x8xA100-80GB", 1536, 2048, 10.0),
    ("llama3-405b", "2048x8xH100", 2048, 8192, 60.0),
]


def main() -> int:
    for model, spec, gbs, seq, target in CASES:
        t0 = time.monotonic()
        train = autopar.TrainingConfig(global_batch_size=gbs, seq_len=seq)
        graph, _ = model_graph(model, train)
        cm = CostModel(graph, autopar.Cluster.from_spec(spec), train)
        result = search(cm)
        wall = time.monotonic() - t0
        c = result.best.config
        print(f"{model} on {spec}: {wall:.1f} s (target {target:.0f} s), "
              f"{result.evaluated} configurations, {result.meshes} groups, best "
              f"{result.best.step_time_s:.2f} s/step MFU {result.best.mfu * 100:.1f}% "
              f"(tp{c.tp} pp{c.pp} dp{c.dp} cp{c.cp} v{c.virtual_stages} z{c.zero_stage})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
