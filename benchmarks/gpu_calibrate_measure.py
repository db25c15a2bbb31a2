"""On one GPU: calibrate, plan a ~1B Llama, measure the plan, and compare the measured step time
with the datasheet prediction and the calibrated one (issue 15, "done when" 2).

    python benchmarks/gpu_calibrate_measure.py OUT_DIR [--cluster 1x1xH200]

Writes OUT_DIR/cal.json, plan.json, record.json and summary.json (printed too). Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import autopar
from autopar.cli import main

#: A ~0.9B-parameter Llama: fits with fp32 Adam states on one 80 GB GPU.
MODEL = {"name": "llama-0.9b", "family": "llama", "num_layers": 16, "hidden_size": 2048,
         "num_heads": 16, "num_kv_heads": 8, "vocab_size": 32000, "seq_len": 2048}


def run(out: Path, cluster: str, budget: float) -> dict:
    """Calibrate, plan, measure; the summary of predicted against measured."""
    assert torch.cuda.is_available(), "needs a GPU"
    out.mkdir(parents=True, exist_ok=True)
    model_file = out / "model.json"
    model_file.write_text(json.dumps(MODEL))
    t0 = time.monotonic()
    assert main(["calibrate", "--model", str(model_file), "--out", str(out / "cal.json"),
                 "--budget", str(budget)]) == 0
    calib_s = time.monotonic() - t0
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=2048, precision="bf16")
    plan = autopar.optimize(MODEL, cluster, train, fixed={"tp": 1, "pp": 1, "cp": 1})
    plan.to_json(out / "plan.json")
    assert main(["measure", "--plan", str(out / "plan.json"), "--steps", "10", "--warmup", "3",
                 "--out", str(out / "record.json")]) == 0
    rec = json.loads((out / "record.json").read_text())
    cal_est = autopar.estimate(MODEL, cluster, train, plan.config, calibration=out / "cal.json")
    measured = rec["measured"]["step_time_s"]
    summary = {
        "device": torch.cuda.get_device_name(), "calibrate_wall_s": round(calib_s, 1),
        "config": plan.config.to_dict(), "measured_step_s": measured,
        "predicted_datasheet_s": plan.estimate.step_time_s,
        "error_datasheet": (plan.estimate.step_time_s - measured) / measured,
        "predicted_calibrated_s": cal_est.step_time_s,
        "error_calibrated": (cal_est.step_time_s - measured) / measured,
        "measured_memory_gib": rec["measured"]["memory_gib"],
        "predicted_memory_gib": plan.estimate.memory_per_gpu_bytes / 2 ** 30,
        "comparable": rec["prediction"]["comparable"], "notes": rec["notes"],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--cluster", default="1x1xH200")
    ap.add_argument("--budget", type=float, default=120.0)
    a = ap.parse_args()
    print(json.dumps(run(a.out, a.cluster, a.budget), indent=1, default=str))
