"""The CLI as the tests call it: ``run(capsys, *argv)`` -> (exit code, stdout, stderr)."""

from __future__ import annotations

from autopar.cli import main


def run(capsys, *argv):
    """Run ``autopar *argv`` in-process; (exit code, captured stdout, captured stderr)."""
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err
