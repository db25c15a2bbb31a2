"""The ``autopar`` command line: ``plan``, ``estimate``, ``explain``, ``models`` (see docs/cli.md)."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
