"""PNG plots of a `tasim compare` result (matplotlib, Agg canvas: never needs a display).

Figures are built with the object API rather than pyplot, so no global figure state is kept
between plots and nothing tries to open a window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tasim import events as ev
from tasim.eventlog import find_events, read_events
from tasim.metrics import summary_value
from tasim.stats import Interval, complete_interval

if TYPE_CHECKING:
    from tasim.compare import Plan, Run
    from tasim.policy_spec import PolicySpec

DPI = 120
TIME_LABEL = "simulated time (s)"
KV_LABEL = "KV utilisation (fraction of blocks)"


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)  # attaches the Agg canvas explicitly; savefig then renders with it
    fig.tight_layout()
    return fig


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def _sweep_axis(ax: Axes, plan: Plan) -> list[Any]:
    """x positions of the sweep points: the values themselves, or 0..n-1 for categories."""
    sweep = plan.sweep
    assert sweep is not None
    ax.set_xlabel(sweep.key)
    if sweep.numeric:
        return list(sweep.values)
    # long labels (YAML mappings) would overlap side by side
    if max(map(len, sweep.texts)) > 12:
        ax.set_xticks(range(len(sweep.texts)), sweep.texts, rotation=15, ha="right")
    else:
        ax.set_xticks(range(len(sweep.texts)), sweep.texts)
    return list(range(len(sweep.texts)))


def _cell_intervals(plan: Plan, summaries: Sequence[dict[str, Any]], metric: tuple[str, ...], spec: PolicySpec) -> list[Interval | None]:
    """Per sweep point, the spec's ``metric`` over its seeds (None where a seed has no value)."""
    return [complete_interval([summary_value(summaries[i], metric) for i in indexes]) for _, cell_spec, indexes in plan.cells() if cell_spec == spec]


def sweep_figure(plan: Plan, summaries: Sequence[dict[str, Any]], metric: tuple[str, ...], ylabel: str, title: str) -> Figure:
    """The summary value at ``metric`` against the swept value, one line per policy spec; over
    several seeds the mean, with its 95 % interval as a band."""
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    xs = _sweep_axis(ax, plan)
    for spec in plan.specs:
        intervals = _cell_intervals(plan, summaries, metric, spec)
        ys = [math.nan if i is None else i.mean for i in intervals]  # a gap where a point has no value
        (line,) = ax.plot(xs, ys, marker="o", label=spec.label)
        if plan.multi_seed:
            shown = [(x, i) for x, i in zip(xs, intervals) if i is not None]
            ax.fill_between([x for x, _ in shown], [i.low for _, i in shown], [i.high for _, i in shown], color=line.get_color(), alpha=0.2)
    if plan.multi_seed:
        title += f" · mean and 95 % interval over {len(plan.seeds)} seeds"
    ax.set_ylim(bottom=0)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} · {plan.scenario.name}")
    ax.legend(title="policy")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def bars_figure(plan: Plan, summaries: Sequence[dict[str, Any]], metric: tuple[str, ...], ylabel: str) -> Figure:
    """One bar per policy spec: the mean over seeds, the 95 % interval as its error bar."""
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    labels, means, errors = [], [], []
    for spec in plan.specs:
        (interval,) = _cell_intervals(plan, summaries, metric, spec)
        labels.append(spec.label)
        means.append(0.0 if interval is None else interval.mean)
        errors.append(0.0 if interval is None else interval.half_width)
    ax.bar(range(len(labels)), means, yerr=errors, capsize=6, color="tab:blue", alpha=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=15 if max(map(len, labels)) > 12 else 0)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{plan.scenario.name} · mean and 95 % interval over {len(plan.seeds)} seeds")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
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


def kv_utilization_figure(runs: Sequence[Run], run_dirs: Sequence[Path], title: str) -> Figure:
    """One subplot per run (policy), one line per worker."""
    fig = _figure(8, 1.2 + 2.6 * len(runs))
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, run, run_dir in zip(axes, runs, run_dirs):
        series = kv_samples(run_dir)
        for worker, (times, utils) in series.items():
            ax.plot(times, utils, linewidth=1, label=worker)
        ax.set_title(run.spec.label)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(KV_LABEL)
        ax.grid(True, alpha=0.3)
        # outside the axes so lines are never hidden; columns keep many workers readable
        ax.legend(title="worker", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", ncol=max(1, math.ceil(len(series) / 16)))
    axes[-1].set_xlabel(TIME_LABEL)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def figures(plan: Plan, summaries: Sequence[dict[str, Any]], runs_dir: Path) -> dict[str, Figure]:
    """By file name: throughput.png and hit_rate.png (with a sweep) and kv_utilization.png."""
    drawn = {}
    if plan.sweep is not None:
        metric: tuple[str, ...]
        if plan.rollouts:
            metric, ylabel, title = ("rollout", "rollout_tokens_per_s"), "rollout throughput (generated tokens/s)", "Rollout throughput"
        else:
            metric, ylabel, title = ("calls_per_min",), "LLM calls per minute (the paper's steps/min)", "Throughput"
        drawn["throughput.png"] = sweep_figure(plan, summaries, metric, ylabel, title)
        hit_label = "prefix hit rate (fraction of prompt tokens)"
        drawn["hit_rate.png"] = sweep_figure(plan, summaries, ("prefix_hit_rate",), hit_label, "Prefix cache hit rate")
    elif plan.multi_seed:
        metric = ("rollout", "rollout_tokens_per_s") if plan.rollouts else ("calls_per_min",)
        ylabel = "rollout throughput (generated tokens/s)" if plan.rollouts else "LLM calls per minute"
        drawn["throughput.png"] = bars_figure(plan, summaries, metric, ylabel)
    last = plan.last_point()
    point = ", ".join(f"{k}={v}" for k, v in last[0].point.items())
    title = f"KV utilisation per worker · {plan.scenario.name}" + (f" · {point}" if point else "")
    drawn["kv_utilization.png"] = kv_utilization_figure(last, [runs_dir / run.dirname for run in last], title)
    return drawn


def write_plots(plan: Plan, summaries: Sequence[dict[str, Any]], out: Path, runs_dir: Path) -> list[Path]:
    """The `figures` as PNGs under ``out``."""
    return [_save(fig, out / name) for name, fig in figures(plan, summaries, runs_dir).items()]
