"""The committed CPU host measurement of a Megatron-Core layer
(benchmarks/data/host/cpu_host_megatron.json, ``python -m benchmarks.cpu_host_megatron``): its
figures are consistent with each other and with what docs/cost-model.md says of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "host" / "cpu_host_megatron.json"


def test_the_measurement_is_consistent():
    d = json.loads(DATA.read_text())
    m, t = d["megatron_core_local_layer"], d["plain_torch_layer"]
    assert d["ratio_cpu_s"] == pytest.approx(m["cpu_s"] / t["cpu_s"])
    assert d["cpu_s_per_aten_op"]["megatron_core"] == pytest.approx(m["cpu_s"] / m["aten_ops"])
    # the docs' reading: Megatron-Core's layer issues more ops and costs 1.8-2.1x plain torch's
    assert m["aten_ops"] > t["aten_ops"] and 1.5 < d["ratio_cpu_s"] < 2.5
    assert d["machine"]["megatron_core"] == "0.16.1"
