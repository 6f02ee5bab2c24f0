"""The PNGs the document links, per measurement file: every point's tasim/published (now and
before) at a glance, and for each metric the file sweeps, published values drawn over tasim's
curves."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict, Unpack

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.typing import LineStyleType

from tasim.validation.published.evaluate import PointResult
from tasim.validation.published.measurement_file import Point
from tasim.validation.published.present import BAND, is_ratio, sweep_x
from tasim.validation.published.published_record import Record
from tasim.validation.published.quantities import METRICS

DPI = 110
BEFORE_MARKERS = ("x", "+", "1", "2")


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)  # the Agg canvas, attached explicitly: never needs a display
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")  # legends may sit outside the axes
    return path


def _before(before: Record, result: PointResult) -> float | None:
    return before.values.get((result.measurements.name, result.point.id))


def overview_plot(results: Sequence[PointResult], befores: Sequence[Record], path: Path) -> Path:
    """tasim/published per point on a log axis, one row per point, with the ±20 % band."""
    fig = Figure(figsize=(8.5, 1.4 + 0.22 * len(results)))
    ax = fig.add_subplot()
    ys = list(range(len(results)))[::-1]  # the file's first point on top
    ax.axvspan(1 - BAND, 1 + BAND, color="tab:green", alpha=0.12, label=f"±{BAND * 100:.0f} %")
    ax.axvline(1, color="black", linewidth=0.8)
    for before, marker in zip(befores, BEFORE_MARKERS):
        pairs = [(v / r.point.published.value, y) for r, y in zip(results, ys) if (v := _before(before, r)) is not None and v > 0]
        if pairs:
            ratios, rows = zip(*pairs)
            ax.scatter(ratios, rows, marker=marker, color="tab:gray", s=36, label=before.heading, zorder=2)
    now = [(r.ratio, y) for r, y in zip(results, ys) if r.ratio is not None and r.ratio > 0]
    if now:
        ratios, rows = zip(*now)
        ax.scatter(ratios, rows, marker="o", color="tab:blue", s=24, label="now", zorder=3)
    # the offsets of a scatter are an (n, 2) array of its points' x and y (the stubs say ArrayLike)
    _ratio_axis(ax, [x for x, _ in now] + [x for collection in ax.collections for x, _ in np.asarray(collection.get_offsets())])
    ax.set_yticks(ys, [r.point.id for r in results], fontsize="x-small")
    ax.set_ylim(-1, len(results))
    ax.set_xlabel("tasim / published (log scale)")
    ax.grid(True, axis="x", alpha=0.3, which="both")
    ax.legend(fontsize="small", loc="upper right")
    ax.set_title(f"{results[0].measurements.name}: tasim against every published point", fontsize="medium")
    return _save(fig, path)


RATIO_TICKS = (1 / 8, 1 / 4, 1 / 2, 0.8, 1, 1.25, 2, 4, 8)


def _ratio_axis(ax: Axes, ratios: Sequence[float]) -> None:
    """A log axis symmetric about 1 that holds every ratio, ticked at plain numbers."""
    reach = max([1.5, *(max(r, 1 / r) for r in ratios if r > 0)]) * 1.15
    ax.set_xscale("log")
    ax.set_xlim(1 / reach, reach)
    ticks = [t for t in RATIO_TICKS if 1 / reach <= t <= reach]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()


def _series_name(point: Point) -> str:
    if point.over is None:
        return point.of.system
    if point.over.set == point.of.set:
        return f"{point.of.system} / {point.over.system}"
    fixed = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in sorted(point.over.set.items()))
    return f"{point.of.system} / {point.over.system} at {fixed}"


Group = dict[str, list[tuple[float, PointResult]]]  # series name -> (x, result)


def sweeps(results: Sequence[PointResult]) -> dict[tuple[str, str, bool, str], Group]:
    """Points on a sweep, by (preset, metric, ratio or not, swept key), then by series; only
    groups where some series has three or more x values."""
    groups: dict[tuple[str, str, bool, str], Group] = defaultdict(lambda: defaultdict(list))
    for result in results:
        x = sweep_x(result.point)
        if x is not None:
            key = (Path(result.measurements.scenario_of(result.point)).stem, result.point.metric, is_ratio(result.point), x[0])
            groups[key][_series_name(result.point)].append((x[1], result))
    return {key: series for key, series in groups.items() if any(len({x for x, _ in points}) >= 3 for points in series.values())}


class _Style(TypedDict, total=False):
    """The line properties `_curve` is given."""

    color: str
    marker: str
    linestyle: LineStyleType
    linewidth: float
    alpha: float
    zorder: int


def _curve(ax: Axes, points: list[tuple[float, float]], **style: Unpack[_Style]) -> None:
    points = sorted(dict(points).items())
    if points:
        ax.plot(*zip(*points), **style)


BEFORE_STYLES: tuple[LineStyleType, ...] = ("--", ":", "-.")


def sweep_plot(key: tuple[str, str, bool, str], group: Group, befores: Sequence[Record], path: Path) -> Path:
    """A series per system (colour); published as hollow squares, tasim now as a solid line,
    each earlier record as a thinner broken one. The legend says colours and styles apart."""
    preset, metric, ratio, swept = key
    fig = Figure(figsize=(10.5, 4.6))
    ax = fig.add_subplot()
    handles = []
    for i, (name, points) in enumerate(sorted(group.items())):
        color = f"C{i}"
        handles.append(Line2D([], [], color=color, linewidth=3, label=name))
        ax.scatter(
            [x for x, _ in points], [r.point.published.value for _, r in points], marker="s", s=64, facecolors="none", edgecolors=color, zorder=3
        )
        ranges = [(x, r.point.published.low, high) for x, r in points if (high := r.point.published.high) is not None]
        if ranges:  # a published range as a bar through its midpoint's square
            ax.vlines([x for x, _, _ in ranges], [low for _, low, _ in ranges], [high for _, _, high in ranges], colors=color, zorder=3)
        _curve(ax, [(x, r.tasim) for x, r in points if r.tasim is not None], color=color, marker="o", zorder=2)
        for before, style in zip(befores, BEFORE_STYLES):
            _curve(
                ax,
                [(x, v) for x, r in points if (v := _before(before, r)) is not None],
                color=color,
                linestyle=style,
                linewidth=1,
                alpha=0.8,
                zorder=1,
            )
    handles += [
        Line2D([], [], marker="s", fillstyle="none", linestyle="none", color="black", label="published"),
        Line2D([], [], marker="o", color="black", label="tasim now"),
        *(Line2D([], [], linestyle=style, linewidth=1, color="black", label=before.heading) for before, style in zip(befores, BEFORE_STYLES)),
    ]
    xs = sorted({x for points in group.values() for x, _ in points})
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.set_xlabel(swept)
    label, unit = METRICS[metric].label, METRICS[metric].unit.strip()
    ax.set_ylabel(f"{label}, ratio" if ratio else f"{label} ({unit})" if unit else label)
    ax.set_ylim(bottom=0)
    if ratio:
        ax.axhline(1, color="black", linewidth=0.8)
    ax.grid(True, alpha=0.3)
    ax.legend(handles=handles, fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title(f"{preset} · {label}{' (ratio)' if ratio else ''}", fontsize="medium")
    return _save(fig, path)


def write_plots(results: Sequence[PointResult], befores: Sequence[Record], directory: Path) -> list[Path]:
    """One file's plots: the overview, then one per sweep, named after the file."""
    directory.mkdir(parents=True, exist_ok=True)
    name = results[0].measurements.name
    befores = [b for b in befores if b.has(name)]
    written = [overview_plot(results, befores, directory / f"{name}.png")]
    for key, group in sweeps(results).items():
        preset, metric, ratio, swept = key
        stem = f"{name}-{preset}-{metric}{'-ratio' if ratio else ''}-{swept.rsplit('.', 1)[-1]}"
        written.append(sweep_plot(key, group, befores, directory / f"{stem}.png"))
    return written
