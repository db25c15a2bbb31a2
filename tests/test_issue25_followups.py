"""Follow-ups of issue 25's new-user pass."""

from __future__ import annotations

import pytest

import autopar
from autopar.models.presets import get_config


@pytest.mark.parametrize("spec", ["good.txt", "/etc/hostname", "configs/model.yaml"])
def test_a_path_that_is_not_a_json_model_file_is_named_as_such(spec):
    with pytest.raises(autopar.InvalidModelConfig, match="a model file must be a .json file"):
        get_config(spec)


def test_a_misspelt_preset_still_gets_the_closest_name():
    with pytest.raises(autopar.InvalidModelConfig, match="Did you mean 'llama3-8b'"):
        get_config("lama3-8b")


def test_a_record_states_torch_compile_per_run():
    """training.torch_compile puts TORCH_COMPILE on the record's profile; absent, the framework
    text decides as before; false keeps an eager profile even when the text names compile."""
    import copy
    import json
    from pathlib import Path
    from benchmarks import validation
    from benchmarks.records import parse
    data = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "data"
                       / "published_runs_memory.json").read_text())
    raw = next(r for r in data if isinstance(r, dict)
               and r["id"].endswith("seq4096-noac-fp8-compile"))
    compiled = validation.record_profile(parse(raw))
    eager = copy.deepcopy(raw)
    del eager["training"]["torch_compile"]
    plain = validation.record_profile(parse(eager))
    assert compiled.fusion == "compile" and plain.fusion != "compile"
    stated_no = copy.deepcopy(raw)
    stated_no["training"]["torch_compile"] = False
    stated_no["training"]["framework"] += " + torch.compile"
    assert validation.record_profile(parse(stated_no)).fusion == plain.fusion
