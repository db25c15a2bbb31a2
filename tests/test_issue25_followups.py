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
