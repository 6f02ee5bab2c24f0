"""Every relative link and image of README.md and docs/*.md points at something that exists, and
every image under docs/ is shown by one of them: a stopgap until the docs get a strict MkDocs build.
Generators rewrite docs/ (``validate published`` its PNGs and their links), so a renamed plot
leaves a dead link or a stale file behind unless something checks."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from conftest import REPO

PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
IMAGE_SUFFIXES = {".png", ".svg", ".jpg", ".jpeg", ".gif"}

_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title"), ![alt](target)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:


def _prose(page: Path) -> Iterator[str]:
    """The page's lines outside fenced code blocks, where a link is a link."""
    fence = None
    for line in page.read_text().splitlines():
        marker = line.lstrip()[:3]
        if marker in ("```", "~~~") and fence in (None, marker):
            fence = marker if fence is None else None
        elif fence is None:
            yield line


def _targets(page: Path) -> list[str]:
    return [target for line in _prose(page) for target in _LINK.findall(_CODE_SPAN.sub("", line))]


def _anchors(page: Path) -> set[str]:
    """The heading anchors GitHub gives the page: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered -1, -2, ..."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(page):
        heading = _HEADING.match(line)
        if heading:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "")  # a link shows its text
            slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
            repeats = seen[slug] = seen.get(slug, -1) + 1
            anchors.add(f"{slug}-{repeats}" if repeats else slug)
    return anchors


def _broken(page: Path, target: str) -> str | None:
    """Why a relative ``target`` of ``page`` leads nowhere, or None."""
    path, _, fragment = target.partition("#")
    destination = (page.parent / path).resolve() if path else page
    if not destination.exists():
        return "no such file"
    if fragment and destination.suffix == ".md" and fragment not in _anchors(destination):
        return f"no heading #{fragment} in {destination.relative_to(REPO)}"
    return None


def test_every_relative_link_and_image_resolves() -> None:
    broken = [
        f"{page.relative_to(REPO)}: {target} ({why})"
        for page in PAGES
        for target in _targets(page)
        if not _SCHEME.match(target) and (why := _broken(page, target))
    ]
    assert broken == []


def test_every_image_under_docs_is_shown() -> None:
    shown = {(page.parent / target.partition("#")[0]).resolve() for page in PAGES for target in _targets(page) if not _SCHEME.match(target)}
    images = sorted(path for path in (REPO / "docs").rglob("*") if path.suffix.lower() in IMAGE_SUFFIXES)
    assert [str(image.relative_to(REPO)) for image in images if image.resolve() not in shown] == []
