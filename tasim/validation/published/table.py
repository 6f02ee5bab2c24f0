"""The terminal table of one measurement file: each point's published and tasim values."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from tasim.validation.published.evaluate import PointResult
from tasim.validation.published.littles_law import between_steps_conflicts, closed_loop_conflicts
from tasim.validation.published.present import describe, published_text, ratio_text, value_text


def file_table(results: Sequence[PointResult]) -> Group:
    """The file's name and title, then its points in order; ≈ marks values read off a plot, a
    range is held at its midpoint."""
    m = results[0].measurements
    # a heading of its own: a table's title is cut to the table's width
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("point", style="bold", no_wrap=True)
    table.add_column("what")
    table.add_column("published", justify="right", no_wrap=True)
    table.add_column("tasim", justify="right", no_wrap=True)
    table.add_column("tasim/\npublished", justify="right", no_wrap=True)
    for result in results:
        point = result.point
        tasim = Text(value_text(point, result.tasim)) if result.tasim is not None else Text(f"— ({result.reason})")
        table.add_row(Text(point.id), Text(describe(m, point)), Text(published_text(point)), tasim, Text(ratio_text(result.ratio)))
    notes = [
        Text(
            f"closed-loop conflict: {c.latency.id} × {c.throughput.id} puts {c.occupancy:.2f} of the "
            f"{c.concurrency:g} programs inside a step (at most 1: a step of at most {c.latency_bound_s:.1f} s "
            "fits that steps/min)",
            style="yellow",
        )
        for c in closed_loop_conflicts(m)
    ]
    notes += [
        Text(
            f"between-steps conflict: {c.unheld.latency.id} with {c.unheld.throughput.id} leaves "
            f"{c.unheld.between_steps_s:.1f} s between steps, more than the {c.held.between_steps_s:.1f} s of "
            f"{c.held.latency.id} with {c.held.throughput.id}, whose router holds requests back",
            style="yellow",
        )
        for c in between_steps_conflicts(m)
    ]
    return Group(Text(f"{m.name} · {m.title}", style="bold"), table, *notes)
