"""The ``autopar`` command line: ``plan``, ``estimate``, ``explain``, ``models`` (see docs/cli.md).

This module is the entry point (``autopar`` and ``python -m autopar.cli``) and imports nothing
heavy: :mod:`autopar.cli.commands` (and with it torch, several seconds on a busy machine) is
imported inside :func:`main`, so a Ctrl-C at any moment, while autopar loads, while it extracts
the model's graph, or before a search has started, ends the command with one line and exit code
130 rather than a traceback. Once a search runs, the first Ctrl-C stops it at the best plan
found so far (see :mod:`autopar.cli.commands`).
"""

from __future__ import annotations

import signal
import sys
import threading

#: Exit code of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


def main(argv=None) -> int:
    """Run the ``autopar`` command with ``argv`` (default ``sys.argv[1:]``).

    Returns:
        The exit code: 0 done, 2 bad input (one line naming the problem and a fix),
        :data:`EXIT_INTERRUPTED` when Ctrl-C stopped the command before it had a result.
    """
    try:
        _parse_first(sys.argv[1:] if argv is None else list(argv))
        run = _import_commands()
        if run is None:
            raise KeyboardInterrupt
        return run(argv)
    except KeyboardInterrupt:
        # the import of torch, graph extraction or an estimate was interrupted: nothing to show
        print("autopar: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def _parse_first(argv) -> None:
    """Parse ``argv`` before the commands load: ``--help`` and usage errors end here (argparse's
    SystemExit, 0 after help, 2 after a usage error) without torch, which the parser does not
    import, so they take a fraction of a second where loading the commands takes seconds."""
    from .parser import build_parser as build
    build().parse_args(argv)


def _load_run():
    from .commands import run
    return run


def _import_commands(load=_load_run):
    """``load()`` (:func:`autopar.cli.commands.run`), or None when Ctrl-C was pressed while it
    loaded.

    Ctrl-C is held while torch loads: ``from torch._C import *`` imports numpy from C and, when a
    KeyboardInterrupt lands inside that import, clears the error and goes on without numpy, so
    the key press was lost (the whole search then ran) or numpy was left half-imported (a
    RecursionError traceback at the next numpy attribute). Measured here: a SIGINT 0.28-0.37 s
    after start was lost in 2 of 12 runs before this."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return load()  # not ours to change (a thread, an ignored or custom handler)
    pressed = []
    signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        run = load()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return None if pressed else run


def build_parser():
    """The ``argparse`` parser of the ``autopar`` command (imports no torch)."""
    from .parser import build_parser as build
    return build()


__all__ = ["EXIT_INTERRUPTED", "build_parser", "main"]
