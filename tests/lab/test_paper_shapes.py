"""The paper-shape suite (`lab.paper_shapes`) in quick mode: it replaces only the
marked span of a document, every table row pairs a paper value with tasim's and their ratio, and
the linked plots exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab.paper_shapes.command import main
from lab.paper_shapes.splice import BEGIN, END, splice

HEAD = "# Validation\n\nText another generator owns.\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n\n"
TAIL = "\n\n## Later section\n\nMore text, | with a pipe | that is no table.\n"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """Run the quick suite once into a temp document; the tests read what it wrote."""
    root = tmp_path_factory.mktemp("paper-shapes")
    doc, plots = root / "docs" / "validation.md", root / "docs" / "plots"
    doc.parent.mkdir()
    doc.write_text(f"{HEAD}{BEGIN}\nstale text\n{END}{TAIL}")
    main(["--quick", "--jobs", "2", "--out", str(root / "runs"), "--doc", str(doc), "--plots", str(plots)])
    return doc.read_text(), doc, plots


def _span(text: str) -> str:
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def _tables(span: str) -> list[list[list[str]]]:
    """Markdown tables as lists of rows of cells (the header row first, separator dropped)."""
    tables, current = [], []
    for line in span.splitlines() + [""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def test_only_the_marked_span_is_replaced(generated: tuple[str, Path, Path]) -> None:
    text, _, _ = generated
    assert text.startswith(HEAD + BEGIN + "\n")
    assert text.endswith(END + TAIL)
    assert text.count(BEGIN) == text.count(END) == 1
    assert "stale text" not in text
    assert "### 3.1 KV thrashing" in _span(text) and "### 3.4 RL rollout" in _span(text)


def test_every_row_has_paper_tasim_and_ratio(generated: tuple[str, Path, Path]) -> None:
    tables = _tables(_span(generated[0]))
    assert len(tables) >= 7  # thrashing, three throughput, three hit-rate/latency, RL (ToolOrchestra has no latency)
    for table in tables:
        header, rows = table[0], table[1:]
        assert rows
        paper, tasim, ratio = header.index("paper"), header.index("tasim"), header.index("tasim/paper")
        for row in rows:
            assert len(row) == len(header), row
            assert re.search(r"\d", row[paper]) and re.search(r"\d", row[tasim]), row
            assert re.fullmatch(r"\d+\.\d\d( \(vs mid\))?", row[ratio]), row


def test_plots_exist_and_are_linked(generated: tuple[str, Path, Path]) -> None:
    text, doc, plots = generated
    links = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", _span(text))
    names = {"thrashing.png", "throughput-swe-agent.png", "throughput-openhands.png", "throughput-toolorchestra.png", "rl-rollout.png"}
    assert {Path(link).name for link in links} == names
    for link in links:
        png = (doc.parent / link).resolve()
        assert png.parent == plots.resolve()
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_misses_are_listed(generated: tuple[str, Path, Path]) -> None:
    span = _span(generated[0])
    inline = span.count("- **Miss:**")
    glance = span.split("### 3.5 Misses at a glance", 1)[1]
    assert inline == len(re.findall(r"^\d+\. ", glance, flags=re.M))
    assert "*Likely reason:*" in span or inline == 0


def test_missing_markers_are_an_error(tmp_path: Path) -> None:
    doc = tmp_path / "validation.md"
    doc.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        splice(doc, "body\n")
    assert doc.read_text() == "# no markers\n"
