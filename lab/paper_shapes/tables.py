"""The markdown the sections write: tables of paper against tasim, and the misses found."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tasim.validation.published.measurement_file import Published


def pct(x: float) -> str:
    return f"{x:.0f}"


def num(x: float) -> str:
    return f"{x:,.1f}"


def times(x: float) -> str:
    return f"{x:.2f}×"


@dataclass
class Table:
    """A markdown table whose every row carries paper, tasim and tasim/paper cells."""

    heads: tuple[str, ...]  # the leading label columns
    rows: list[list[str]] = field(default_factory=list)

    def add(self, labels: Sequence[str], paper: Published, tasim: float, fmt: Callable[[float], str], unit: str = "", note: str = "") -> None:
        ratio = f"{tasim / paper.value:.2f}" + (" (vs mid)" if paper.high is not None else "")
        self.rows.append([*labels, paper.text(fmt, unit), f"{fmt(tasim)}{unit}", ratio, note or "—"])

    def markdown(self) -> list[str]:
        heads = [*self.heads, "paper", "tasim", "tasim/paper", "direction / note"]
        align = ["---"] * len(self.heads) + ["---:", "---:", "---:", "---"]
        return ["| " + " | ".join(heads) + " |", "| " + " | ".join(align) + " |", *("| " + " | ".join(row) + " |" for row in self.rows), ""]


@dataclass
class Report:
    """The markdown lines and every miss found while writing them."""

    lines: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    def add(self, *lines: str) -> None:
        self.lines += lines

    def miss(self, what: str, reason: str) -> None:
        self.misses.append(what)
        self.lines.append(f"- **Miss:** {what}. *Likely reason:* {reason}")
