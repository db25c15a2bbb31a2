"""Which torchtitan format to write: v0.2.x reads TOML job files, 0.3 and later Python config
files (pytorch/torchtitan #2386). :func:`to_torchtitan` follows the installed torchtitan, and
when none is installed the series the plan was made for (its framework profile), else the newest
format."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ..errors import UnsupportedPlanError
from .common import Export
from .torchtitan import to_torchtitan_toml
from .torchtitan_config import to_torchtitan_config

#: torchtitan series -> its exporter, oldest first (the last is the newest format).
TORCHTITAN_EXPORTERS = {"0.2": to_torchtitan_toml, "0.3": to_torchtitan_config}
#: torchtitan series -> the framework profile (:data:`autopar.frameworks.PROFILES`) a plan for
#: it is made under, the ``--framework`` value.
SERIES_PROFILES = {"0.2": "torchtitan", "0.3": "torchtitan-0.3"}


def installed_torchtitan() -> str | None:
    """The installed torchtitan's series ("0.2", "0.3"; a later release counts as "0.3", whose
    format it keeps until autopar learns another), or None when it is not installed."""
    try:
        v = version("torchtitan")
    except PackageNotFoundError:
        return None
    parts = []
    for piece in v.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return "0.2" if tuple(parts) < (0, 3) else "0.3"


def planned_torchtitan(plan) -> str | None:
    """The torchtitan series ``plan`` was made for ("0.2" under the ``torchtitan`` profile,
    "0.3" under ``torchtitan-0.3``), or None for a plan made for another framework."""
    framework = getattr(getattr(plan, "train", None), "framework", None)
    return next((s for s, name in SERIES_PROFILES.items() if name == framework), None)


def torchtitan_series(plan, series: str | None = None) -> str:
    """The series :func:`to_torchtitan` writes: ``series`` when given, else the installed
    torchtitan's, else the one ``plan`` was made for (:func:`planned_torchtitan`), else the
    newest."""
    return (series or installed_torchtitan() or planned_torchtitan(plan)
            or list(TORCHTITAN_EXPORTERS)[-1])


def to_torchtitan(plan, series: str | None = None) -> Export:
    """``plan`` for torchtitan ``series`` ("0.2": TOML, "0.3": Python config); None = the
    installed torchtitan's series, or when none is installed the series the plan was made for
    (``torchtitan``: 0.2, ``torchtitan-0.3``: 0.3), else the newest (:func:`torchtitan_series`).
    When ``series`` is None and the installed torchtitan is not the series the plan was made
    for, the first warning says so and names the ``--framework`` to re-plan with: the file
    follows the installed torchtitan, and its re-estimate prices what that series runs
    (e.g. v0.2.2 hides EP all-to-alls under DualPipeV, 0.3.0 does not).

    Raises:
        UnsupportedPlanError: an unknown series (as ``to_accelerate_config``'s unknown plugin),
            or as the chosen exporter.
    """
    chosen = torchtitan_series(plan, series)
    if chosen not in TORCHTITAN_EXPORTERS:
        raise UnsupportedPlanError(
            f"torchtitan series {chosen!r}: autopar writes {', '.join(TORCHTITAN_EXPORTERS)}. "
            "Fix: pass one of those, or series=None for the installed torchtitan's.")
    ex = TORCHTITAN_EXPORTERS[chosen](plan)
    planned = planned_torchtitan(plan)
    if series is None and planned is not None and chosen != planned:
        ex = ex.with_warnings((
            f"torchtitan {chosen} is installed, so this file is in its format, but the plan "
            f"was made for torchtitan {planned} (--framework {SERIES_PROFILES[planned]}); "
            f"what {chosen} runs can differ from the plan (see the re-estimate). Fix: re-plan "
            f"for the installed torchtitan with --framework {SERIES_PROFILES[chosen]}, or write "
            f"the format the plan was made for with --export torchtitan-{planned}",
            *ex.warnings))
    return ex
