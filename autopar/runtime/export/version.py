"""Which torchtitan format to write: v0.2.x reads TOML job files, 0.3 and later Python config
files (pytorch/torchtitan #2386). :func:`to_torchtitan` follows the installed torchtitan, and
the newest format when none is installed."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .common import Export
from .torchtitan import to_torchtitan_toml
from .torchtitan_config import to_torchtitan_config

#: torchtitan series -> its exporter, oldest first (the last is the newest format).
TORCHTITAN_EXPORTERS = {"0.2": to_torchtitan_toml, "0.3": to_torchtitan_config}


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


def to_torchtitan(plan, series: str | None = None) -> Export:
    """``plan`` for torchtitan ``series`` ("0.2": TOML, "0.3": Python config); None = the
    installed torchtitan's series, or the newest when none is installed.

    Raises:
        ValueError: an unknown series.
        UnsupportedPlanError: as the chosen exporter.
    """
    series = series or installed_torchtitan() or list(TORCHTITAN_EXPORTERS)[-1]
    if series not in TORCHTITAN_EXPORTERS:
        raise ValueError(f"torchtitan series {series!r}: autopar writes "
                         f"{', '.join(TORCHTITAN_EXPORTERS)}. Fix: pass one of those.")
    return TORCHTITAN_EXPORTERS[series](plan)
