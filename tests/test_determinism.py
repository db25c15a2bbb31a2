"""Identical inputs give byte-identical plan JSON: across runs in one process, across torch
thread counts, across processes (different hash seeds), and across CP-SAT worker counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autopar
from autopar.api import model_graph
from autopar.cost.model import CostModel
from autopar.search.recompute import solve_recompute

ROOT = Path(__file__).resolve().parents[1]
#: A problem with pipeline stages, several meshes and memory pressure (recompute matters).
MODEL = dict(name="det", family="llama", num_layers=8, hidden_size=512, num_heads=8,
             num_kv_heads=4, vocab_size=32000, seq_len=2048)
CLUSTER = "2x8xA100-40GB"
TRAIN = dict(global_batch_size=64, seq_len=2048)
_SCRIPT = (
    "import json, sys, autopar; "
    "m, c, t = json.loads(sys.argv[1]); "
    "sys.stdout.write(autopar.optimize(m, c, autopar.TrainingConfig(**t)).to_json())"
)


def _plan_bytes() -> str:
    return autopar.optimize(MODEL, CLUSTER, autopar.TrainingConfig(**TRAIN)).to_json()


def test_three_runs_and_thread_counts_give_the_same_bytes():
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2, max(1, os.cpu_count() or 1)):
            torch.set_num_threads(threads)
            runs.append(_plan_bytes())
    finally:
        torch.set_num_threads(before)
    assert runs[0] == runs[1] == runs[2]
    assert json.loads(runs[0])["search"]["complete"] is True


@pytest.fixture(scope="module")
def plan_bytes_here() -> str:
    """The plan JSON this process gives, computed once for the fresh-process comparisons."""
    return _plan_bytes()


@pytest.mark.parametrize("hash_seed", ["1", "2"])
def test_fresh_processes_give_the_same_bytes(hash_seed, plan_bytes_here):
    # set and dict iteration orders differ with the hash seed; the plan must not
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": hash_seed}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps([MODEL, CLUSTER, TRAIN])],
                         capture_output=True, text=True, env=env, timeout=300, check=True)
    assert out.stdout == plan_bytes_here


def test_cp_sat_worker_counts_give_the_same_estimate():
    train = autopar.TrainingConfig(**TRAIN)
    graph, _ = model_graph(MODEL, train)
    cm = CostModel(graph, autopar.Cluster.from_spec(CLUSTER), train)
    c = cm.resolve(autopar.ParallelConfig(tp=2, pp=4, micro_batch_size=4))
    results = []
    for workers in (1, 1, 1, 4, 8):
        modes = solve_recompute(cm, c, workers=workers)
        assert modes is not None
        results.append(json.dumps(cm.estimate(c.replace(recompute=modes)).to_dict(),
                                  sort_keys=True))
    assert len(set(results)) == 1
