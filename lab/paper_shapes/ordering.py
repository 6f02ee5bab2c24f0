"""How the systems rank against each other, and the check that reports where tasim ranks them
differently from the paper."""

from __future__ import annotations

from lab.paper_shapes.directions import FLAT
from lab.paper_shapes.measured import Measured
from lab.paper_shapes.paper import PAPER_NAMES
from lab.paper_shapes.reasons import order_reason
from lab.paper_shapes.tables import Report


def order(values: dict[str, float]) -> str:
    """Systems from highest to lowest, ``≈`` between neighbours within FLAT of each other."""
    ranked = sorted(values, key=lambda k: values[k], reverse=True)
    text = PAPER_NAMES[ranked[0]]
    for prev, name in zip(ranked, ranked[1:]):
        text += f" {'≈' if values[prev] - values[name] <= FLAT * values[prev] else '>'} {PAPER_NAMES[name]}"
    return text


def order_conflicts(paper: dict[str, float], tasim: dict[str, float]) -> list[tuple[str, str]]:
    """Pairs (a, b) the paper puts a above b (beyond FLAT) that tasim does not."""
    return [(a, b) for a in paper for b in paper if paper[a] > paper[b] * (1 + FLAT) and not tasim[a] > tasim[b] * (1 + FLAT)]


def check_order(m: Measured, c: int, paper: dict[str, float], tasim: dict[str, float], hits: bool, report: Report) -> None:
    """Both orderings of the systems at ``c`` workflows (by hit rate with ``hits``, else by
    throughput), a miss with its likely reason where tasim's differs."""
    quantity = "hit-rate" if hits else "throughput"
    ordering = f"paper {order(paper)}; tasim {order(tasim)}"
    if conflicts := order_conflicts(paper, tasim):
        report.miss(f"{m.preset} {quantity} order at {c} workflows: {ordering}", order_reason(m, conflicts, c, hits))
    else:
        report.add(f"- {quantity.capitalize()} order at {c} workflows: {ordering}: same order.")
