"""Reading command-line inputs shared by the commands: a model given as a preset name or a JSON
file of a model dict."""

from __future__ import annotations

import json

from ..errors import InvalidModelConfig


def model_arg(text: str | None):
    """A preset name, or the model dict of a JSON file (``*.json``).

    Raises:
        InvalidModelConfig: no model given, or a JSON file that cannot be read.
    """
    if text is None:
        raise InvalidModelConfig("--model is required (a preset name from `autopar models`, or "
                                 "a JSON file with a model dict).")
    if not text.endswith(".json"):
        return text
    try:
        with open(text) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidModelConfig(f"cannot read model file {text}: {exc}. Fix: give a JSON "
                                 "file with a model dict, or a preset name.") from exc
