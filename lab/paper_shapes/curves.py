"""The PNGs the document links: tasim's curves with the paper's values drawn over them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lab.paper_shapes.execution import Results
from lab.paper_shapes.measured import Measured, rl_steps
from lab.paper_shapes.paper import (
    PAPER_NAMES,
    RL,
    RL_BASELINE,
    SERVING,
    SERVING_POLICIES,
    THRASHING_E2E,
    THRASHING_HIT,
    THRASHING_PRESET,
    ServingCase,
    serving_case,
)
from lab.paper_shapes.plan import Job, Mode
from tasim.validation.published.measurement_file import Published

DPI = 120
WORKFLOWS_LABEL = "concurrent workflows (programs in flight)"
COLORS = {"round_robin": "tab:red", "continuum": "tab:orange", "thunderagent": "tab:blue", "kv_router": "tab:red"}


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)  # the Agg canvas, attached explicitly: never needs a display
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def _paper_points(ax: Axes, paper: dict[int, Published], color: str, label: str) -> None:
    """The paper's values as hollow squares, dashed between them when there are several."""
    xs = sorted(paper)
    ax.plot(
        xs,
        [paper[x].value for x in xs],
        linestyle="--" if len(xs) > 1 else "none",
        marker="s",
        markersize=8,
        fillstyle="none",
        color=color,
        label=label,
        zorder=3,
    )


def _workflows_axis(ax: Axes, points: Sequence[int]) -> None:
    """Concurrency on x, ticked at exactly the run points."""
    ax.set_xticks(list(points))
    ax.set_xlabel(WORKFLOWS_LABEL)
    ax.grid(True, alpha=0.3)


def throughput_plot(results: Results, case: ServingCase, points: Sequence[int], path: Path) -> Path:
    m = Measured(results, case.preset)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    for policy in SERVING_POLICIES:
        name = PAPER_NAMES[policy]
        # vLLM drawn widest and underneath: where a policy serves exactly as vLLM, both stay visible
        wide = policy == "round_robin"
        ax.plot(
            points,
            [m.steps(policy, c) for c in points],
            marker="o",
            color=COLORS[policy],
            linewidth=4 if wide else 1.8,
            markersize=9 if wide else 6,
            zorder=1 if wide else 2,
            label=f"tasim · {name} ({policy})",
        )
        _paper_points(ax, case.throughput[policy], COLORS[policy], f"paper · {name}")
    _workflows_axis(ax, points)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("throughput (steps/min; a step is one LLM call)")
    ax.set_title(f"Throughput against concurrency · {case.preset}\n{case.title}", fontsize="medium")
    ax.legend(fontsize="small", ncol=2)
    return _save(fig, path)


def thrashing_plot(results: Results, points: Sequence[int], path: Path) -> Path:
    m = Measured(results, THRASHING_PRESET)
    fig = Figure(figsize=(11, 4.6))
    hit_ax, lat_ax = fig.subplots(1, 2)
    hit_ax.plot(points, [m.hit("round_robin", c) for c in points], marker="o", color=COLORS["round_robin"], label="tasim · vLLM (round_robin)")
    _paper_points(hit_ax, THRASHING_HIT, "black", "paper · vLLM (Fig. 1b)")
    hit_ax.set_ylim(0, 105)
    hit_ax.set_ylabel(f"{m.hit_label} (% of prompt tokens)")
    hit_ax.set_title(m.hit_label.capitalize())
    lat_ax.plot(
        points,
        [m.turn_latency("round_robin", c) for c in points],
        marker="o",
        color=COLORS["round_robin"],
        label="tasim · per step (LLM call + tool)",
    )
    lat_ax.plot(
        points,
        [m.call_latency("round_robin", c) for c in points],
        marker="^",
        linestyle=":",
        color="tab:purple",
        label="tasim · per LLM call (e2e_s)",
    )
    _paper_points(lat_ax, THRASHING_E2E, "black", "paper · per-step E2E (Fig. 1b)")
    lat_ax.set_ylim(bottom=0)
    lat_ax.set_ylabel("mean latency (s)")
    lat_ax.set_title("Per-step latency")
    for ax in (hit_ax, lat_ax):
        _workflows_axis(ax, points)
        ax.legend(fontsize="small")
    fig.suptitle(f"KV thrashing of plain vLLM · {THRASHING_PRESET}, GLM-4.6 FP8, one 8×H100 TP8 backend")
    return _save(fig, path)


def rl_plot(results: Results, jobs: Sequence[Job], path: Path) -> Path:
    steps = rl_steps(results, jobs)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    width = 0.38
    for offset, policy in ((-width / 2, RL_BASELINE), (width / 2, "thunderagent")):
        xs = [i + offset for i in range(len(RL))]
        ax.bar(
            xs,
            [steps[(case.preset, policy)] for case in RL],
            width,
            color=COLORS[policy],
            alpha=0.8,
            label=f"tasim · {PAPER_NAMES[policy]} ({policy})",
        )
        paper = [(case.baseline if policy == RL_BASELINE else case.thunderagent).value for case in RL]
        ax.plot(
            xs,
            paper,
            linestyle="none",
            marker="s",
            markersize=9,
            fillstyle="none",
            color="black",
            label="paper (Table 2)" if policy == RL_BASELINE else None,
        )
    ax.set_xticks(range(len(RL)), [case.title for case in RL])
    ax.set_xlabel("agent workload (GLM-4.6 FP8, 2 × 8×H100 TP8, N = 144)")
    ax.set_ylabel("rollout throughput (steps/min)")
    ax.set_title("RL rollout throughput · paper Table 2")
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def write_plots(results: Results, jobs: Sequence[Job], mode: Mode, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = [thrashing_plot(results, mode.points(serving_case(THRASHING_PRESET)), directory / "thrashing.png")]
    for case in SERVING:
        written.append(throughput_plot(results, case, mode.points(case), directory / f"throughput-{case.preset}.png"))
    written.append(rl_plot(results, jobs, directory / "rl-rollout.png"))
    return written
