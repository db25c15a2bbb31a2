"""Errors of the runtime adapter (subclasses of :class:`autopar.errors.AutoparError`)."""

from __future__ import annotations

from autopar.errors import AutoparError


class UnsupportedPlanError(AutoparError, NotImplementedError):
    """The plan, the model or the process group asks for something the runtime adapter cannot
    apply (e.g. context parallelism, tied embeddings split across pipeline stages, an unknown
    model layout); the message says what and the nearest thing that works."""
