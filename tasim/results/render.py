"""Human-readable rendering: a run summary (rich table) and policy parameter listings."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo
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


def _type_name(annotation: Any) -> str:
    """Readable type of a parameter: ``float``, ``'a' | 'b'``, ``int | None``, ``list[int]``."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(repr(arg) for arg in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in get_args(annotation))
    if origin is not None:
        return f"{_type_name(origin)}[{', '.join(_type_name(arg) for arg in get_args(annotation))}]"
    if annotation is type(None):
        return "None"
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def _bounds(field: FieldInfo) -> str:
    """Numeric constraints (pydantic keeps them as annotated_types objects in ``metadata``)."""
    symbols = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
    return ", ".join(f"{symbol} {getattr(item, attr)}" for item in field.metadata for attr, symbol in symbols if hasattr(item, attr))


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    return repr(field.get_default(call_default_factory=True, validated_data={}))


def param_rows(params_model: type[Any]) -> list[tuple[str, str, str, str]]:
    """(name, type, default, description) of every field of a policy's params model."""
    rows = []
    for name, field in params_model.model_fields.items():
        bounds = _bounds(field)
        kind = _type_name(field.annotation) + (f" ({bounds})" if bounds else "")
        rows.append((name, kind, _default(field), field.description or ""))
    return rows


# Rows of a side-by-side table: (label, summary key, sub-key for distributions).
_SIDE_BY_SIDE_ROWS = (
    ("requests completed", "requests_completed", None),
    ("programs completed", "programs_completed", None),
    ("output tokens/s", "output_tokens_per_s", None),
    ("calls/min", "calls_per_min", None),
    ("prefix hit rate", "prefix_hit_rate", None),
    ("TTFT mean (s)", "ttft_s", "mean"),
    ("TTFT p90 (s)", "ttft_s", "p90"),
    ("TPOT mean (s)", "tpot_s", "mean"),
    ("e2e mean (s)", "e2e_s", "mean"),
    ("pauses", "pauses", None),
    ("resumes", "resumes", None),
    ("run time (s)", "sim_time_s", None),
)


def side_by_side(summaries: dict[str, dict[str, Any]]) -> Table:
    """Key metrics of several runs of one scenario (e.g. live and simulated), one column each,
    with the first run's relative difference to the second."""
    names = list(summaries)
    first = summaries[names[0]]
    table = Table(title=f"{first['scenario']} · policy {first['policy']} · seed {first['seed']}")
    table.add_column("metric", style="bold")
    for name in names:
        table.add_column(name, justify="right")
    if len(names) == 2:
        table.add_column(f"{names[0]} vs {names[1]}", justify="right")
    for label, key, sub in _SIDE_BY_SIDE_ROWS:
        values = [s.get(key) if sub is None else (s.get(key) or {}).get(sub) for s in summaries.values()]
        row = [label] + [_fmt(v) for v in values]
        if len(names) == 2:
            a, b = values
            if key == "prefix_hit_rate" and a is not None and b is not None:
                row.append(f"{(a - b) * 100:+.1f} pp")
            elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
                row.append(f"{(a - b) / b * 100:+.1f}%")
            else:
                row.append("")
        table.add_row(*row)
    return table


def print_unsquashed(renderable: Any) -> None:
    """On a terminal rich fits the table to it; into a file or pipe nothing limits the width,
    so print at the table's natural width instead of rich's 80-column default."""
    console = Console()
    if not console.is_terminal:
        natural = console.measure(renderable, options=console.options.update_width(10_000)).maximum
        console = Console(width=max(console.width, natural))
    console.print(renderable)
