"""PNG plots of a `tasim compare` result (matplotlib, Agg canvas: never needs a display).

Figures are built with the object API rather than pyplot, so no global figure state is kept
between plots and nothing tries to open a window. They use constrained layout, which makes room
for multi-line titles, a suptitle and legends outside the axes (tight_layout let a suptitle
touch the first panel's title). Each title names what defines the runs: the scenario, the seeds
and the user's ``--set`` overrides.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

from tasim.core import events as ev
from tasim.results.eventlog import find_events, read_events
from tasim.results.metrics import summary_value
from tasim.results.stats import Interval, complete_interval

if TYPE_CHECKING:
    from tasim.config.policy_spec import PolicySpec
    from tasim.tools.comparison import Plan

DPI = 120
TIME_LABEL = "simulated time (s)"
KV_LABEL = "KV utilisation (fraction of blocks)"
TITLE_CHARS_PER_INCH = 9  # of a title's 12 pt text, with room to spare
LABEL_WIDTH = 24  # characters in a line of an x tick label
OVERRIDE_WIDTH = 48  # characters of one override in a title (a longer one is cut; run.json has it)
OVERRIDE_LINES = 2  # title lines for the overrides; those that do not fit are counted
TICK_GAP_PT = 8  # the least space between neighbouring x tick labels
# between a figure's title and its first panel's: a line of their 12 pt text (a layout's
# default 6 pt reads as touching)
SUPTITLE_GAP_PT = 12
# a spec's params and a YAML value's items: a tick label breaks after these
BREAK_AFTER = re.compile(r"(?<=[\[{,])")


def _figure(width: float, height: float, *, h_pad_pt: float = 3) -> Figure:
    """``h_pad_pt``: constrained layout's space above and below each axes' decorations (its
    default)."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout=ConstrainedLayoutEngine(h_pad=h_pad_pt / 72))
    FigureCanvasAgg(fig)  # attaches the Agg canvas explicitly; layout and savefig render with it
    return fig


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


# --- text ------------------------------------------------------------------------------------


def _pack(pieces: Sequence[str], width: int, sep: str = "") -> list[str]:
    """``pieces`` joined by ``sep`` into lines of at most ``width`` characters, broken only
    between pieces (a longer piece gets a line of its own, without its leading spaces)."""
    lines: list[str] = []
    for piece in pieces:
        if lines and len(lines[-1]) + len(sep) + len(piece) <= width:
            lines[-1] += sep + piece
        else:
            lines.append(piece.lstrip())
    return lines


def _wrapped(text: str, width: int) -> list[str]:
    """A spec or YAML value in lines, broken after a ``[``, ``{`` or comma."""
    return _pack([piece for piece in BREAK_AFTER.split(text) if piece], width)


def _wrapped_label(text: str, width: int = LABEL_WIDTH) -> str:
    return "\n".join(_wrapped(text, width))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _override_lines(plan: Plan, width: int) -> list[str]:
    """The --set overrides every run starts from, in at most OVERRIDE_LINES lines (the seed is
    said apart from them)."""
    shown = [_cut(override.assignment, OVERRIDE_WIDTH) for override in plan.overrides if override.key != ("seed",)]
    for kept in range(len(shown), 0, -1):
        rest = [f"… {len(shown) - kept} more"] if kept < len(shown) else []
        pieces = [f"{text}," for text in shown[: kept - 1]] + [shown[kept - 1] + ("," if rest else ""), *rest]
        lines = _pack(["--set", *pieces], width, " ")
        if len(lines) <= OVERRIDE_LINES:
            return lines
    return []  # none (one cut to OVERRIDE_WIDTH and the count of the rest always fit in two lines)


def _seeds(plan: Plan, shown_seed: bool = False) -> str:
    """Which seeds a figure draws: every seed's mean, or (``shown_seed``) the first seed's runs."""
    if plan.sweep is not None and plan.sweep.key == "seed":
        return ""  # the sweep says it
    if not plan.multi_seed:
        return f"seed {plan.scenario.seed}"
    first, last = plan.seeds[0], plan.seeds[-1]
    return f"seed {first} of {first}-{last}" if shown_seed else f"mean and 95 % interval over seeds {first}-{last}"


def _title(plan: Plan, what: str, fig: Figure, *, extra: str = "", shown_seed: bool = False) -> str:
    """``what`` · scenario · seeds (· ``extra``), then the overrides, in lines the figure holds."""
    width = int(fig.get_figwidth() * TITLE_CHARS_PER_INCH)
    head = [part for part in (what, plan.scenario.name, _seeds(plan, shown_seed), extra) if part]
    # a part longer than a line (a YAML mapping swept) breaks inside too
    lines = [wrapped for line in _pack(head, width, " · ") for wrapped in _wrapped(line, width)]
    return "\n".join(lines + _override_lines(plan, width))


# --- layout ----------------------------------------------------------------------------------


def _spread_ticks(fig: Figure, ax: Axes) -> None:
    """Widen ``fig`` until neighbouring x tick labels are TICK_GAP_PT apart: once is enough,
    as the layout's margins keep their width, so the axes widen by more than the figure."""
    fig.draw_without_rendering()  # lays the figure out
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes = [label.get_window_extent(renderer) for label in ax.get_xticklabels()]
    gap = TICK_GAP_PT * fig.dpi / 72
    crowding = [((a.width + b.width) / 2 + gap) / ((b.x0 + b.x1 - a.x0 - a.x1) / 2) for a, b in zip(boxes, boxes[1:])]
    if crowding and max(crowding) > 1:
        fig.set_figwidth(fig.get_figwidth() * max(crowding))


def _label_ticks(ax: Axes, texts: Sequence[str]) -> list[int]:
    """Tick positions 0..n-1 labelled with ``texts``, each broken into short lines."""
    ax.set_xticks(range(len(texts)), [_wrapped_label(text) for text in texts])
    return list(range(len(texts)))


# --- figures ---------------------------------------------------------------------------------


def _cell_intervals(plan: Plan, summaries: Sequence[dict[str, Any]], metric: tuple[str, ...], spec: PolicySpec) -> list[Interval | None]:
    """Per sweep point, the spec's ``metric`` over its seeds (None where a seed has no value)."""
    return [complete_interval([summary_value(summaries[i], metric) for i in indexes]) for _, cell_spec, indexes in plan.cells() if cell_spec == spec]


def sweep_figure(plan: Plan, summaries: Sequence[dict[str, Any]], metric: tuple[str, ...], ylabel: str, what: str) -> Figure:
    """The summary value at ``metric`` against the swept value, one line per policy spec; over
    several seeds the mean, with its 95 % interval as a band."""
    sweep = plan.sweep
    assert sweep is not None
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    ax.set_xlabel(sweep.key)
    # numbers are points on an axis; other values are categories, side by side
    xs: list[Any] = list(sweep.values) if sweep.numeric else _label_ticks(ax, sweep.texts)
    for spec in plan.specs:
        intervals = _cell_intervals(plan, summaries, metric, spec)
        ys = [math.nan if i is None else i.mean for i in intervals]  # a gap where a point has no value
        (line,) = ax.plot(xs, ys, marker="o", label=spec.label)
        if plan.multi_seed:
            shown = [(x, i) for x, i in zip(xs, intervals) if i is not None]
            ax.fill_between([x for x, _ in shown], [i.low for _, i in shown], [i.high for _, i in shown], color=line.get_color(), alpha=0.2)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(ylabel)
    ax.set_title(_title(plan, what, fig))
    ax.legend(title="policy")
    ax.grid(True, alpha=0.3)
    if not sweep.numeric:
        _spread_ticks(fig, ax)
    return fig


def bars_figure(plan: Plan, summaries: Sequence[dict[str, Any]], metric: tuple[str, ...], ylabel: str, what: str) -> Figure:
    """One bar per policy spec: over several seeds the mean, with its 95 % interval as its
    error bar."""
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    intervals = [_cell_intervals(plan, summaries, metric, spec)[0] for spec in plan.specs]
    means = [0.0 if i is None else i.mean for i in intervals]
    errors = [0.0 if i is None else i.half_width for i in intervals] if plan.multi_seed else None
    ax.bar(_label_ticks(ax, [spec.label for spec in plan.specs]), means, yerr=errors, capsize=6, color="tab:blue", alpha=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(_title(plan, what, fig))
    ax.grid(True, axis="y", alpha=0.3)
    _spread_ticks(fig, ax)
    return fig


def kv_samples(run_dir: Path) -> dict[str, tuple[list[float], list[float]]]:
    """Per worker (in the log's worker order): sample times and used/total block fractions."""
    blocks = 0
    series: dict[str, tuple[list[float], list[float]]] = {}
    for event in read_events(find_events(run_dir)):
        if isinstance(event, ev.RunStarted):  # the header comes first: pool size and worker order
            blocks = event.kv_blocks_per_worker
            series = {worker: ([], []) for worker in event.workers}
        elif isinstance(event, ev.WorkerSample):
            times, utils = series.setdefault(event.worker, ([], []))
            times.append(event.t)
            utils.append(event.used_blocks / blocks)
    return series


def kv_utilization_figure(plan: Plan, runs_dir: Path) -> Figure:
    """One subplot per policy, one line per worker: the runs at the last (for numbers, the
    largest) sweep point, at the first seed."""
    runs = plan.last_point()
    fig = _figure(8, 1.2 + 2.6 * len(runs), h_pad_pt=SUPTITLE_GAP_PT / 2)  # the layout pads the suptitle's bottom twice
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    title_width = int(fig.get_figwidth() * TITLE_CHARS_PER_INCH)
    for ax, run in zip(axes, runs):
        series = kv_samples(runs_dir / run.dirname)
        for worker, (times, utils) in series.items():
            ax.plot(times, utils, linewidth=1, label=worker)
        ax.set_title(_wrapped_label(run.spec.label, title_width))
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(KV_LABEL)
        ax.grid(True, alpha=0.3)
        # outside the axes so lines are never hidden; columns keep many workers readable
        ax.legend(title="worker", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", ncol=max(1, math.ceil(len(series) / 16)))
    axes[-1].set_xlabel(TIME_LABEL)
    point = f"{plan.sweep.key}={plan.sweep.texts[-1]}" if plan.sweep else ""  # as the user wrote it
    fig.suptitle(_title(plan, "KV utilisation per worker", fig, extra=point, shown_seed=True))
    return fig


def figures(plan: Plan, summaries: Sequence[dict[str, Any]], runs_dir: Path) -> dict[str, Figure]:
    """By file name: throughput.png (against the swept value, or one bar per spec without a
    sweep), hit_rate.png (with a sweep) and kv_utilization.png."""
    metric: tuple[str, ...]
    if plan.rollouts:
        metric, ylabel, what = ("rollout", "rollout_tokens_per_s"), "rollout throughput (generated tokens/s)", "Rollout throughput"
    else:
        metric, ylabel, what = ("calls_per_min",), "LLM calls per minute (the paper's steps/min)", "Throughput"
    if plan.sweep is None:
        drawn = {"throughput.png": bars_figure(plan, summaries, metric, ylabel, what)}
    else:
        hit_label = "prefix hit rate (fraction of prompt tokens)"
        drawn = {
            "throughput.png": sweep_figure(plan, summaries, metric, ylabel, what),
            "hit_rate.png": sweep_figure(plan, summaries, ("prefix_hit_rate",), hit_label, "Prefix cache hit rate"),
        }
    drawn["kv_utilization.png"] = kv_utilization_figure(plan, runs_dir)
    return drawn


def write_plots(plan: Plan, summaries: Sequence[dict[str, Any]], out: Path, runs_dir: Path) -> list[Path]:
    """The `figures` as PNGs under ``out``."""
    return [_save(fig, out / name) for name, fig in figures(plan, summaries, runs_dir).items()]
