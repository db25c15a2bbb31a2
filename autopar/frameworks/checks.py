"""Checks of the fields of the framework dataclasses
(:class:`~autopar.frameworks.profiles.FrameworkProfile`,
:class:`~autopar.frameworks.memory.MemoryConventions`).

A :class:`FieldCheck` collects every problem of one object (the field, its value, the rule it
breaks and a fix) and raises them together as one :class:`~autopar.errors.InvalidTrainingConfig`,
so a user fixes all of them in one pass. Each check returns the value normalised the way a user
would expect: a list given for a tuple field becomes a tuple, a mapping becomes a read-only
mapping, a whole number for a count (``5e8``, a NumPy integer) a Python ``int``.
"""

from __future__ import annotations

import difflib
import math
import numbers
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from ..errors import InvalidTrainingConfig


def same_kind(a: Any, b: Any) -> bool:
    """Whether ``a`` equals ``b`` without a bool standing for an int (``True == 1`` in Python)."""
    try:
        equal = bool(a == b)
    except Exception:   # an object whose == raises or is not a truth value
        return False
    return equal and isinstance(a, bool) == isinstance(b, bool)


def is_member(value: Any, choices: Iterable[Any]) -> bool:
    """Whether ``value`` is one of ``choices`` (:func:`same_kind`: no bool for an int)."""
    return any(same_kind(value, c) for c in choices)


def close_names(name: Any, names: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the name of ``names`` closest to ``name`` ignoring case,
    or ``""`` (difflib's ratio >= 0.6, its default)."""
    if not isinstance(name, str):
        return ""
    lower = {n.lower(): n for n in names if isinstance(n, str)}
    near = difflib.get_close_matches(name.lower(), list(lower), n=1)
    return f" (did you mean {lower[near[0]]!r}?)" if near else ""


class FieldCheck:
    """The problems found in one object's fields, raised together by :meth:`raise_if_any`.

    Args:
        owner: the object as messages name it, e.g. ``"framework profile 'megatron'"``.
    """

    def __init__(self, owner: str):
        self.owner = owner
        self.problems: list[str] = []

    def add(self, text: str) -> None:
        """Record a problem already worded with its fix."""
        self.problems.append(text)

    def bad(self, name: str, value: Any, rule: str, example: Any) -> None:
        """Record ``name=value`` breaking ``rule``; the fix shows ``name=example``."""
        self.problems.append(f"{name}={value!r}: {rule}; fix: e.g. {name}={example!r}")

    def raise_if_any(self) -> None:
        """Raise the recorded problems as one error, one line each.

        Raises:
            InvalidTrainingConfig: when any problem was recorded.
        """
        if self.problems:
            n = len(self.problems)
            head = (f"{self.owner}: {n} problems, each with its fix:" if n > 1 else
                    f"{self.owner}: 1 problem, with its fix:")
            raise InvalidTrainingConfig("\n  - ".join([head, *self.problems]))

    def text(self, name: str, value: Any, example: str) -> Any:
        """``value`` must be a non-empty ``str``."""
        if not isinstance(value, str) or not value.strip():
            self.bad(name, value, "must be a non-empty text", example)
        return value

    def instance(self, name: str, value: Any, cls: type, example: str) -> Any:
        """``value`` must be a ``cls``; ``example`` is the fix as code."""
        if not isinstance(value, cls):
            self.add(f"{name}={value!r}: must be a {cls.__name__}; fix: e.g. {name}={example}")
        return value

    def boolean(self, name: str, value: Any) -> Any:
        """``value`` must be ``True`` or ``False`` (a ``bool``: not 0/1, not a string)."""
        if not isinstance(value, bool):
            self.add(f"{name}={value!r}: must be True or False (a bool); fix: {name}=True "
                     f"or {name}=False")
        return value

    def choice(self, name: str, value: Any, choices: tuple, example: Any, what: str = "") -> Any:
        """``value`` must be one of ``choices`` (``what``: what they mean, for the message)."""
        if not is_member(value, choices):
            rule = f"must be one of {list(choices)}{f' ({what})' if what else ''}"
            self.bad(name, value, rule + close_names(value, [c for c in choices
                                                             if isinstance(c, str)]), example)
            return value
        return int(value) if isinstance(value, numbers.Integral) and \
            not isinstance(value, bool) else value

    def number(self, name: str, value: Any, minimum: float, unit: str, example: Any, *,
               integer: bool = False, none_means: str = "") -> Any:
        """``value`` must be a finite real number >= ``minimum`` (a whole one when ``integer``,
        such as ``4`` or ``5e8``; ``None`` too when ``none_means`` says what None stands for);
        bools are refused. Returns a Python ``int`` (``integer``) or ``float``."""
        if value is None and none_means:
            return None
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        finite = real and (isinstance(value, numbers.Integral) or math.isfinite(value))
        whole = finite and (not integer or value == math.floor(value))
        if whole and value >= minimum:
            return int(value) if integer else float(value)
        kind = "a whole number" if integer else "a finite number"
        rule = f"must be {kind} >= {minimum:g} ({unit})"
        if none_means:
            rule = f"must be None ({none_means}) or {rule[len('must be '):]}"
        self.bad(name, value, rule, example)
        return value

    def names(self, name: str, value: Any, choices: tuple, example: tuple, *,
              nonempty: bool = False, what: str = "") -> Any:
        """``value`` must be a tuple (a list is converted) of members of ``choices``, not empty
        when ``nonempty``."""
        if isinstance(value, list):
            value = tuple(value)
        what = f" ({what})" if what else ""
        if not isinstance(value, tuple):
            self.bad(name, value, f"must be a tuple of names from {list(choices)}{what}",
                     example)
            return value
        unknown = [v for v in value if not is_member(v, choices)]
        if unknown:
            hint = close_names(unknown[0], [c for c in choices if isinstance(c, str)])
            self.bad(name, value, f"{unknown} not in {list(choices)}{what}{hint}", example)
        elif nonempty and not value:
            self.bad(name, value, f"must name at least one of {list(choices)}{what}", example)
        return value

    def mapping(self, name: str, value: Any, values: tuple, example: Mapping[str, str], *,
                keys: tuple | None = None, required: tuple = (), what: str = "") -> Any:
        """``value`` must be a mapping from text keys (members of ``keys`` when given, and
        every key of ``required``) to members of ``values``. Returns a read-only copy."""
        if not isinstance(value, Mapping):
            self.bad(name, value, f"must be a mapping {what}", dict(example))
            return value
        bad_keys = [k for k in value if not isinstance(k, str) or (
            keys is not None and k not in keys)]
        bad_values = {k: v for k, v in value.items() if not is_member(v, values)}
        missing = [k for k in required if k not in value]
        rules = []
        for k in bad_keys:
            rules.append(f"key {k!r} is not "
                         + (f"one of {list(keys)}{close_names(k, keys)}" if keys is not None
                            else "a text"))
        for k, v in bad_values.items():
            rules.append(f"{k!r}: {v!r} is not one of {list(values)}{close_names(v, values)}")
        if missing:
            rules.append(f"needs {' and '.join(repr(k) for k in missing)} entr"
                         f"{'ies' if len(missing) > 1 else 'y'}")
        if rules:
            good = {k: v for k, v in value.items() if k not in bad_keys and k not in bad_values}
            self.bad(name, dict(value), "; ".join(rules) + (f" ({what})" if what else ""),
                     {**example, **good})
            return value
        return MappingProxyType(dict(value))

    def sources(self, name: str, value: Any, required: tuple[str, ...], fix: str) -> Any:
        """``value`` must map each of ``required`` to a non-empty text (its source), and have
        no other keys. ``fix`` is the fix for a missing source, formatted with ``{field}``.
        Returns a read-only copy."""
        if not isinstance(value, Mapping):
            self.add(f"{name}={value!r}: must be a mapping field -> its source (text); fix: "
                     + fix.format(field=required[0] if required else "field"))
            return value
        missing = [f for f in required if value.get(f) is None
                   or isinstance(value.get(f), str) and not value.get(f).strip()]
        if len(missing) > 2:   # one line, not one per field
            self.add(f"{', '.join(missing)} need sources: {fix.format(field=missing[0])}, "
                     "one entry per field")
        else:
            for f in missing:
                self.add(f"{f} needs a source: {fix.format(field=f)}")
        for f in required:
            src = value.get(f)
            if f not in missing and (not isinstance(src, str) or not src.strip()):
                self.add(f"{name}[{f!r}]={src!r}: a source must be a non-empty text; fix: "
                         + fix.format(field=f))
        for k in value:
            if k not in required:
                self.add(f"{name} has {k!r}, which is not a field it sources"
                         f"{close_names(k, required)}; fix: key each source by one of "
                         f"{list(required)}")
        return MappingProxyType(dict(value))
