"""Placing the generated text between the ``paper-shapes`` markers of the document."""

from __future__ import annotations

from pathlib import Path

from tasim.results.doc_section import replace_section

BEGIN, END = "<!-- paper-shapes:begin -->", "<!-- paper-shapes:end -->"


def splice(document: Path, text: str) -> None:
    replace_section(document, BEGIN, END, text)
