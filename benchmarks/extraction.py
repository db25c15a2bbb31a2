"""Wall time and peak memory of extracting Llama-3-405B on meta: ``python -m benchmarks.extraction``.

Targets (issue 3): <= 15 s and <= 3 GB peak RSS on 2 CPU cores, for the built-in preset (torch.fx
path) and the Hugging Face config (torch.export path; skipped without transformers). Peak RSS is
``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of this process (KiB on Linux), so it includes the
imports and is cumulative over the runs.
"""

from __future__ import annotations

import resource
import time

import autopar.models as M
from autopar.graph import extract

SEQ_LEN = 8192
TARGET_S, TARGET_GB = 15.0, 3.0


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _run(label: str, build) -> None:
    start = time.perf_counter()
    model = build()
    built = time.perf_counter()
    graph = extract(model, SEQ_LEN, 1)
    done = time.perf_counter()
    wall = done - start
    ok = wall <= TARGET_S and _peak_rss_gb() <= TARGET_GB
    print(f"{label:32s} method={graph.method:6s} build {built - start:5.2f} s  extract "
          f"{done - built:5.2f} s  total {wall:5.2f} s  peak RSS {_peak_rss_gb():.2f} GB  "
          f"params {graph.num_parameters / 1e9:.1f}B  fwd {graph.forward_flops / 1e12:.0f} TFLOP  "
          f"{'ok' if ok else 'OVER TARGET'}")


def main() -> None:
    """Print one line per extraction (built-in, then HF when transformers is installed)."""
    _run("llama3-405b (built-in, fx)", lambda: M.build("llama3-405b"))
    try:
        from autopar.graph import hf

        hf._transformers()
    except ImportError:
        print("hf-llama3-405b: skipped (pip install 'autopar[hf]')")
        return
    _run("hf-llama3-405b (transformers)", lambda: hf.build("hf-llama3-405b"))


if __name__ == "__main__":
    main()
