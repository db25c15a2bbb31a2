"""Regenerate ``tests/data/megatron_arguments.json``: every flag Megatron-LM's own argument parser
defines, whether it takes a value, and its choices, read by building that parser.

    python -m benchmarks.megatron_arguments /path/to/Megatron-LM COMMIT

Needs a Megatron-LM checkout (not a dependency of autopar; CI never runs this). The parser is
``megatron.training.arguments.add_megatron_arguments`` on a fresh ``argparse.ArgumentParser``, so
flags generated from Megatron's config dataclasses (``ArgumentGroupFactory``) are included.
Python 3.11 lacks ``typing.override``, which Megatron imports; it is stubbed as the identity.
The test ``tests/test_export.py::test_megatron_args_parse_under_megatrons_own_flag_table`` reads
the file, so the exporter's flags and values are checked against Megatron's parser, not a list
from memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "megatron_arguments.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", help="Megatron-LM source tree (the folder holding megatron/)")
    ap.add_argument("commit", help="the commit the checkout is at (recorded in the file)")
    args = ap.parse_args(argv)
    if not hasattr(typing, "override"):
        typing.override = lambda f: f
    sys.path.insert(0, args.checkout)
    from megatron.training.arguments import add_megatron_arguments
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser = add_megatron_arguments(parser) or parser
    flags = {}
    for act in parser._actions:
        for option in act.option_strings:
            flags[option] = {"value": act.nargs != 0, "nargs": act.nargs,
                             "choices": sorted(str(c) for c in act.choices) if act.choices
                             else None}
    OUT.write_text(json.dumps({
        "source": "NVIDIA/Megatron-LM megatron/training/arguments.py add_megatron_arguments",
        "commit": args.commit, "flags": flags}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({len(flags)} flags)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
