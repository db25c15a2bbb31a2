"""A framework profile's edits as plain data: the cost fields a user changed from the stock
profile (:meth:`FrameworkProfile.with_costs`), each with its value and source, so a plan found
with an edited profile can be written to JSON, read back, re-estimated and exported with the
same costs.

Edits are ``{field: {"value": <JSON value>, "source": <text>}}``; tuples are written as lists
and read back as tuples, mappings as objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

from ..errors import InvalidTrainingConfig
from .profiles import COST_FIELDS, FrameworkProfile
from .stacks import get_profile


def _jsonable(value):
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return value


def profile_edits(profile: FrameworkProfile) -> dict[str, dict]:
    """``{field: {"value", "source"}}`` for every cost field of ``profile`` that differs from the
    stock profile of its framework (``get_profile(profile.name)``); {} for a stock profile.

    Raises:
        InvalidTrainingConfig: ``profile`` names no known framework, or differs from its stock
            profile outside the cost fields (capabilities, memory conventions, sequence rule:
            those cannot be recorded in a plan; edit cost fields with ``with_costs``).
    """
    stock = get_profile(profile.name)
    other = [f.name for f in fields(FrameworkProfile)
             if f.name not in COST_FIELDS and f.name != "cost_sources"
             and getattr(profile, f.name) != getattr(stock, f.name)]
    if other:
        raise InvalidTrainingConfig(
            f"the {profile.name!r} profile differs from autopar's in {other}, which a plan "
            "cannot record (only cost fields travel with it). Fix: change cost fields with "
            "FrameworkProfile.with_costs, or estimate with CostModel(..., framework=profile) "
            "directly.")
    return {f: {"value": _jsonable(getattr(profile, f)),
                "source": profile.cost_sources.get(f, "")}
            for f in COST_FIELDS if getattr(profile, f) != getattr(stock, f)}


def with_edits(framework: str, edits: Mapping[str, Mapping] | None) -> FrameworkProfile:
    """The stock profile of ``framework`` with ``edits`` (:func:`profile_edits`' form) applied;
    the stock profile itself when ``edits`` is empty.

    Raises:
        InvalidTrainingConfig: an unknown framework, an edit that is not a cost field, lacks a
            value or a source, or a value the profile refuses.
    """
    stock = get_profile(framework)
    if not edits:
        return stock
    values, sources = {}, {}
    for name, edit in edits.items():
        if not isinstance(edit, Mapping) or "value" not in edit or not edit.get("source"):
            raise InvalidTrainingConfig(
                f"profile edit {name!r} must be {{'value': ..., 'source': 'why'}}; got "
                f"{edit!r:.80}. Fix: write edits as profile_edits() returns them.")
        value = edit["value"]
        if isinstance(getattr(stock, name, None), tuple) and isinstance(value, list):
            value = tuple(value)
        values[name], sources[name] = value, str(edit["source"])
    return stock.with_costs(sources, **values)


def edits_text(edits: Mapping[str, Mapping]) -> str:
    """One line naming each edit and its value, e.g. ``overlap_tp_comm=True``."""
    return ", ".join(f"{k}={v['value']!r}" for k, v in sorted(edits.items()))
