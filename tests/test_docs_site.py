"""The documentation site builds in MkDocs' strict mode (mkdocs.yml: a broken link or anchor, or a
page left out of the navigation, fails it), and what the build cannot see holds too: the README's
own links (the README is not a page of the site: docs/index.md includes its sections) and an image
under docs/ that no page shows any more. Generators rewrite docs/ (``validate published`` its
plots and their links), so a renamed plot would leave a dead link or a stale file behind."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

MKDOCS = Path(sys.executable).parent / "mkdocs"
IMAGE_SUFFIXES = {".png", ".svg", ".jpg", ".jpeg", ".gif"}
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target), ![alt](target)

pytestmark = pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs is not installed (the docs extra: make install)")


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(site)], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
    home = (tmp_path / "site" / "index.html").read_text()
    assert "4.338×" in home and "compare-swe-agent-2x-throughput.png" in home  # the README's quickstart, included


def test_a_broken_link_an_anchor_or_an_orphan_page_fails_the_build(tmp_path: Path) -> None:
    root = tmp_path / "copy"
    root.mkdir()
    for entry in ("mkdocs.yml", "README.md"):
        shutil.copy(REPO / entry, root / entry)
    shutil.copytree(REPO / "docs", root / "docs")
    with (root / "docs" / "install.md").open("a") as page:
        page.write("\n[a page](nope.md) and [a heading](concepts.md#no-such-heading)\n")
    (root / "docs" / "orphan.md").write_text("# Not in the navigation\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0
    for complaint in ("'nope.md'", "#no-such-heading", "orphan.md"):
        assert complaint in done.stderr


def _targets(page: Path) -> list[str]:
    text = re.sub(r"^ *```.*?^ *```", "", page.read_text(), flags=re.M | re.S)  # links in code blocks are not links
    return [target for target in _LINK.findall(re.sub(r"`[^`\n]*`", "", text)) if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)]


def test_every_relative_link_of_the_readme_resolves() -> None:
    readme = REPO / "README.md"
    assert [target for target in _targets(readme) if not (REPO / target.partition("#")[0]).exists()] == []


def test_every_image_under_docs_is_shown() -> None:
    pages = [REPO / "README.md", *(REPO / "docs").rglob("*.md")]
    shown = {(page.parent / target.partition("#")[0]).resolve() for page in pages for target in _targets(page)}
    images = sorted(path for path in (REPO / "docs").rglob("*") if path.suffix.lower() in IMAGE_SUFFIXES)
    assert [str(image.relative_to(REPO)) for image in images if image.resolve() not in shown] == []
