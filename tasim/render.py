"""Human-readable rendering of a run summary (rich table)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.3f}"
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def summary_table(summary: dict[str, Any], title: str | None = None) -> Table:
    table = Table(title=title or f"{summary['scenario']} · policy {summary['policy']} · seed {summary['seed']}")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_column("p50", justify="right")
    table.add_column("p90", justify="right")
    table.add_column("p99", justify="right")
    for key, value in summary.items():
        if key not in ("scenario", "policy", "seed"):
            _add_rows(table, key, value)
    return table


def _add_rows(table: Table, label: str, value: Any) -> None:
    if not isinstance(value, dict):
        table.add_row(label, _fmt(value), "", "", "")
    elif "p50" in value:
        suffix = f" (n={value['count']})" if "count" in value else " (mean)"
        table.add_row(f"{label}{suffix}", _fmt(value["mean"]), _fmt(value["p50"]), _fmt(value["p90"]), _fmt(value["p99"]))
    else:
        for sub, inner in value.items():
            _add_rows(table, f"{label} {sub}", inner)


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(summary_table(summary))
