"""Generated sections of a hand-written document (docs/results/validation.md): text between two marker
lines, replaced without touching the rest."""

from __future__ import annotations

from pathlib import Path


def replace_section(document: Path, begin: str, end: str, text: str) -> None:
    """Replace what lies between the ``begin`` and ``end`` marker lines. The file is read right
    before the write and replaced atomically, because other generators and people edit its
    other sections. Missing markers end the program with a one-line error."""
    content = document.read_text()
    head, found_begin, rest = content.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found_begin or not found_end:
        raise SystemExit(f"error: {document}: markers {begin} ... {end} not found")
    partial = document.with_name(document.name + ".partial")
    partial.write_text(f"{head}{begin}\n{text.rstrip()}\n{end}{tail}")
    partial.replace(document)
