"""The reference pages under docs/reference are what lab.reference_docs makes of the code now: a
new flag, scenario field, policy parameter or summary key without its page regenerated fails here
(`make reference-docs` regenerates them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO

from lab import reference_docs
from tasim.results.metrics import SUMMARY_KEYS

REFERENCE = REPO / "docs" / "reference"


def test_the_committed_reference_is_current() -> None:
    assert reference_docs.stale_pages(REFERENCE) == [], "docs/reference is stale: run make reference-docs"


def test_check_names_a_stale_page_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(REFERENCE, tmp_path, dirs_exist_ok=True)
    (tmp_path / "summary.md").write_text("an old summary page\n")
    assert reference_docs.main(["--check", "--out", str(tmp_path)]) == 1
    assert "summary.md not current" in capsys.readouterr().err
    assert (tmp_path / "summary.md").read_text() == "an old summary page\n"
    assert reference_docs.main(["--out", str(tmp_path)]) == 0
    assert reference_docs.main(["--check", "--out", str(tmp_path)]) == 0


def test_every_summary_key_is_described_once() -> None:
    assert list(reference_docs.summary_descriptions()) == list(SUMMARY_KEYS)


def test_the_cli_page_lists_every_command_and_flag() -> None:
    page = (REFERENCE / "cli.md").read_text()
    for command in ("simulate", "report", "compare", "validate dynamo", "validate vllm", "validate published", "live", "calibrate", "tune"):
        assert f"## `tasim {command}`" in page
    for flag in ("`--compare-sim`", "`--objective`", "`--sweep`", "`--from-record`", "`--routing`"):
        assert flag in page


def test_a_field_without_a_description_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import BaseModel, Field

    class Bare(BaseModel):
        described: int = Field(1, description="has one")
        bare: int = 2

    with pytest.raises(reference_docs.MissingDescription, match="bare has no description"):
        reference_docs._table([("x.described", Bare, "described"), ("x.bare", Bare, "bare")])
