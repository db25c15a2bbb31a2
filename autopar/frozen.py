"""Building frozen dataclass instances on hot paths."""

from __future__ import annotations


def built(cls, **fields):
    """An instance of the frozen dataclass ``cls`` with ``fields`` (every field, by name)
    written into its instance dict at once, instead of by the frozen ``__init__``'s one
    ``object.__setattr__`` per field: equal, hashed and printed alike. Only for classes without
    ``__post_init__`` or defaults to fill (nothing runs but the write); a search builds tens of
    thousands of link loads, stage layouts and memory breakdowns."""
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj
