"""argparse value types of the ``autopar`` command's flags (:mod:`autopar.cli.parser`): each
returns the parsed value or raises ``argparse.ArgumentTypeError`` naming what is wrong."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def positive_float(text: str) -> float:
    """argparse type: a positive finite number."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number")
    return v


def expert_load(text: str) -> tuple[float, ...]:
    """argparse type: per-expert loads, comma- or space-separated numbers, or a file holding
    them (a JSON list or the same text); checked in full by ``TrainingConfig``."""
    body, where = text, ""
    if os.path.isfile(text):
        try:
            body, where = Path(text).read_text(), f" in {text!r}"
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot read {text!r}: {exc}")
    elif text.endswith((".json", ".txt", ".csv")) or os.sep in text:
        raise argparse.ArgumentTypeError(f"no file {text!r} (give one load per routed expert, "
                                         "comma-separated, or a file of them)")
    if body.lstrip().startswith(("[", "{")):
        try:
            words = json.loads(body)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not valid JSON{where}: {exc}")
        if not isinstance(words, list):
            raise argparse.ArgumentTypeError(
                f"expected a JSON list of per-expert loads{where}, got a "
                f"{type(words).__name__}")
    else:
        words = body.replace(",", " ").split()
    out = []
    for w in words:
        try:
            out.append(float(w))
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(
                f"{str(w)[:40]!r}{where} is not a number (one load per routed expert, e.g. "
                "1,1,2,0.5)")
    return tuple(out)


def lower_case(text: str) -> str:
    """argparse type of an option choosing among lower-case names (a precision, a framework, a
    dispatcher): the value in lower case, so that ``BF16`` or ``Megatron`` read as written in
    the choices (:class:`autopar.cli.parser._Parser` gives it to every such option)."""
    return text.lower()


def int_at_least(low: int):
    """argparse type: an int >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {low}")
        return value
    return parse
