"""Fill the generated parts of the docs: text between ``<!-- begin generated: NAME ... -->`` and
``<!-- end generated: NAME -->`` markers is a command's output, never written by hand, and
tests/test_docs.py fails when it drifts from a new run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fill(text: str, name: str, block: str, where: str = "the file") -> str:
    """``text`` with the part marked ``name`` replaced by ``block`` (a block with a newline is put
    on lines of its own; a one-line block stays inline).

    Raises:
        ValueError: ``text`` lacks the ``begin generated: NAME``/``end generated: NAME`` pair
            (``where`` names the file in the message).
    """
    pattern = re.compile(rf"(<!-- begin generated: {re.escape(name)} [^>]*-->)(.*?)"
                         rf"(<!-- end generated: {re.escape(name)} -->)", re.S)
    if not pattern.search(text):
        raise ValueError(f"{where} has no '<!-- begin generated: {name} ... -->' / "
                         f"'<!-- end generated: {name} -->' pair to fill")
    sep = "\n" if "\n" in block else ""
    return pattern.sub(lambda m: m.group(1) + sep + block + sep + m.group(3), text, count=1)


def render(parts: list[tuple[str, str, str]]) -> dict[Path, str]:
    """Each file named in ``parts`` (``(file under the repository, marker name, block)``) with its
    marked parts replaced; files are read once, so several parts of one file combine."""
    texts: dict[Path, str] = {}
    for rel, name, block in parts:
        path = ROOT / rel
        text = texts.get(path, path.read_text() if path.exists() else "")
        texts[path] = fill(text, name, block, rel)
    return texts


def write_or_check(texts: dict[Path, str], command: str, check: bool) -> int:
    """Write the files whose text changed (``check=False``) or name them (``check=True``).

    Returns:
        1 when ``check`` and a file differs, else 0.
    """
    stale = {path: text for path, text in texts.items() if path.read_text() != text}
    for path, text in stale.items():
        if check:
            print(f"{path.relative_to(ROOT)} differs from what it is generated from: run {command}")
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if stale and check else 0
