"""The errors autopar raises on purpose.

Every error a user can cause is an :class:`AutoparError` subclass whose message names the input,
the rule it breaks and a fix. Anything else escaping autopar is a bug in autopar.
"""

from __future__ import annotations


class AutoparError(Exception):
    """Base class of every error autopar raises deliberately."""


class InvalidModelConfig(AutoparError, ValueError):
    """A model preset name or model dict is unknown or inconsistent (e.g. heads do not divide hidden)."""


class InvalidClusterSpec(AutoparError, ValueError):
    """A cluster spec string or cluster description cannot be read, or names an unknown GPU or link."""


class InvalidTrainingConfig(AutoparError, ValueError):
    """A training config is inconsistent (e.g. a non-positive batch, an unknown precision)."""


class InvalidParallelConfig(AutoparError, ValueError):
    """A parallel configuration breaks a rule of the model or cluster (e.g. degrees that do not
    multiply to the world size, a TP degree that does not divide the attention heads)."""


class InfeasibleError(AutoparError):
    """No plan in the searched space fits; the message says which constraint binds and what to change."""


class UntraceableModelError(AutoparError):
    """The model cannot be turned into an operator graph; the message names the module and op."""


class InvalidPlanFile(AutoparError, ValueError):
    """A plan file is malformed, of an unsupported version, or inconsistent."""


class InvalidSearchOption(AutoparError, ValueError):
    """An option of the search itself is wrong (e.g. a negative ``time_limit_s``, a ``top_k``
    that is not a positive int, a ``progress`` that is not callable)."""


class MissingDependency(AutoparError, ImportError):
    """An optional dependency (e.g. matplotlib for plots) is not installed; the message says
    which extra to install."""


class OutputError(AutoparError, OSError):
    """An output file (plan JSON, plot PNG) cannot be written; the message names the path."""


def output_error(path, exc: OSError) -> OutputError:
    """The :class:`OutputError` for failing to write ``path``."""
    return OutputError(f"cannot write {path}: {exc.strerror or exc}. Fix: choose a path in an "
                       "existing, writable folder.")


class InvalidCalibration(AutoparError, ValueError):
    """A calibration file is malformed or of an unknown version, or it cannot stand for the
    cluster it is used with (measured on another GPU, or on a CPU, or at another precision);
    the message names the field or the mismatch and the fix."""
