"""The cost model against what was measured on one H200 (``benchmarks/data/gpu/h200_sweep.json``,
taken by ``benchmarks/gpu_sweep.py``): none of these measurements is used to fit anything here.

    python -m benchmarks.gpu_check

Prints, for each section:
- GEMMs: the measured fraction of the dense peak against the cost model's
  ``CostParams.gemm_efficiency(M, K, N)`` (signed error of the predicted time per shape class).
- Attention: measured forward+backward TFLOP/s per backend and sequence length against
  ``CostParams.attention_ceiling`` x ``attention_shape_factor`` for the kernel that backend runs
  (the shape factor's two constants per kernel were fitted to this same data: this section
  checks the fit, it is not out of sample).
- Plans: the ten single-GPU plans re-estimated by today's cost model (framework "torch") against
  their measured step time and peak allocated memory, the signed errors, and whether each pair of
  plans of one model comes out in the measured order.
"""

from __future__ import annotations

import json
from pathlib import Path

import autopar
from autopar.config import ParallelConfig
from autopar.cost.params import CostParams
from autopar.hardware import Cluster

DATA = Path(__file__).parent / "data" / "gpu" / "h200_sweep.json"
#: SDPA backend -> the kernel name of :data:`autopar.cost.params.ATTENTION_KERNELS`.
BACKEND_KERNEL = {"flash": "fa2", "cudnn": "cudnn"}


def _signed(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def gemms(data: dict, params: CostParams, peak_bf16: float, peak_fp8: float) -> list[str]:
    out = ["GEMMs (bf16 unless said): measured vs CostParams.gemm_efficiency, time error "
           "(predicted - measured) / measured"]
    errs = []
    for r in data["gemm"]:
        if "tflops" not in r or r["m"] * r["k"] * r["n"] < 512 ** 3:
            continue  # launch-bound sizes: not what the GEMM term models
        peak = peak_fp8 if r["dtype"] == "fp8" else peak_bf16
        meas = r["tflops"] * 1e12 / peak
        pred = params.gemm_efficiency(r["m"], r["k"], r["n"], "hopper")
        errs.append((r["dtype"], meas / pred - 1.0))
    for dt in ("bf16", "fp8"):
        e = [x for d, x in errs if d == dt]
        if e:
            e.sort()
            out.append(f"  {dt}: {len(e)} shapes, time error median {100 * e[len(e) // 2]:+.1f}% "
                       f"(min {100 * e[0]:+.1f}%, max {100 * e[-1]:+.1f}%)")
    return out


def attention(data: dict, params: CostParams, peak_bf16: float) -> list[str]:
    out = ["Attention fwd+bwd (causal, bf16): measured fraction of peak vs the cost model's"]
    for r in data["attention"]:
        if "error" in r or r["backend"] not in BACKEND_KERNEL or r["heads"] != 32:
            continue
        kernel = BACKEND_KERNEL[r["backend"]]
        meas = r["fwd_bwd_tflops"] * 1e12 / peak_bf16
        pred = (params.attention_ceiling(kernel, "hopper")
                * params.attention_shape_factor(kernel, r["head_dim"], r["seq"]))
        out.append(f"  {r['backend']:6s} d{r['head_dim']:<3d} s={r['seq']:6d}: measured "
                   f"{meas:.3f}, model {pred:.3f}, time error {100 * (meas / pred - 1):+.0f}%")
    return out


def plans(data: dict) -> tuple[list[str], list[dict]]:
    out = ["Plans on 1x H200 through plan.apply (framework torch): predicted vs measured"]
    rows = []
    for r in data["plans"]:
        if "measured_step_s" not in r:
            continue
        model = dict(_MODELS[r["model"]])
        train = autopar.TrainingConfig(global_batch_size=r["global_batch"], seq_len=r["seq_len"],
                                       micro_batch_size=r["micro_batch"], precision="bf16")
        cfg = ParallelConfig(tp=1, pp=1, dp=1, cp=1, micro_batch_size=r["micro_batch"],
                             recompute=r["recompute"], zero_stage=0)
        est = autopar.estimate(model, "1x1xH200", train, cfg)
        row = {"name": f"{r['model']} s{r['seq_len']} mb{r['micro_batch']} {r['recompute']}",
               "model": r["model"], "t_pred": est.step_time_s, "t_meas": r["measured_step_s"],
               "m_pred": est.memory_per_gpu_bytes, "m_meas": r["measured_max_allocated_bytes"]}
        rows.append(row)
        out.append(f"  {row['name']:28s} step {row['t_pred']:.3f} s vs {row['t_meas']:.3f} s "
                   f"({100 * _signed(row['t_pred'], row['t_meas']):+.1f}%), memory "
                   f"{row['m_pred'] / 1e9:6.1f} GB vs {row['m_meas'] / 1e9:6.1f} GB "
                   f"({100 * _signed(row['m_pred'], row['m_meas']):+.1f}%)")
    te = [abs(_signed(r["t_pred"], r["t_meas"])) for r in rows]
    me = [abs(_signed(r["m_pred"], r["m_meas"])) for r in rows]
    tb = sum(_signed(r["t_pred"], r["t_meas"]) for r in rows) / max(len(rows), 1)
    mb = sum(_signed(r["m_pred"], r["m_meas"]) for r in rows) / max(len(rows), 1)
    right = total = 0
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if a["model"] != b["model"] or abs(_signed(a["t_meas"], b["t_meas"])) < 0.02:
                continue  # a measured difference under 2% is inside run-to-run noise
            total += 1
            right += (a["t_pred"] < b["t_pred"]) == (a["t_meas"] < b["t_meas"])
    out.append(f"  step time MAPE {100 * sum(te) / len(te):.1f}% (signed mean {100 * tb:+.1f}%), "
               f"memory MAPE {100 * sum(me) / len(me):.1f}% (signed mean {100 * mb:+.1f}%), "
               f"pairs in measured order {right}/{total}")
    return out, rows


def _models() -> dict:
    from benchmarks.gpu_sweep import MODELS
    return MODELS


_MODELS = _models()


def main() -> None:
    data = json.loads(DATA.read_text())
    params = CostParams()
    dev = Cluster.from_spec("1x1xH200").device
    env = data["env"]
    print(f"Measured on {env['device']} ({env['torch']}, CUDA {env['cuda']}, {env['date_utc']}); "
          f"peaks from the datasheet: bf16 {dev.peak('bf16') / 1e12:.0f}, fp8 "
          f"{dev.peak('fp8') / 1e12:.0f} TFLOP/s")
    for line in gemms(data, params, dev.peak("bf16"), dev.peak("fp8")):
        print(line)
    for line in attention(data, params, dev.peak("bf16")):
        print(line)
    lines, _ = plans(data)
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
