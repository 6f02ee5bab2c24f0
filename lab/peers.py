"""tasim's ThunderAgent against Dynamo's own, live and simulated: the three-way table.

For every seed the same programs (scenario and seed) run four ways on the same two mocker
workers: Dynamo 1.6.1's Rust ThunderAgent deciding in its frontend (``live.routing:
dynamo-thunderagent``, with tasim's values for every knob both have), tasim's ThunderAgent
through the tasim router (``proxy``) and deciding for pinned calls (``pin``), and tasim's
ThunderAgent simulated on the mocker's twin. Each metric is a mean over seeds with its 95 %
interval (`tasim.results.stats`). The live-vs-sim noise is what tasim's own live runs differ from their
simulation: a difference between Dynamo's ThunderAgent and tasim's that is no larger than that
says nothing about the implementations.

Pauses: tasim logs every pause (``ProgramPaused``), the Rust ThunderAgent only logs its
scheduler's state when it changes, so the comparable figure is the most programs paused at once.

    python -m lab.peers scenarios/live-mocker.yaml --seeds 3 --time-scale 2 \\
        --doc docs/results/peers.md --section live-mocker
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tasim.config.scenario import Scenario, load_scenario
from tasim.core import events as ev
from tasim.live.run import SIM_DIR, finite_scenario, run_live, simulated_twin
from tasim.results.doc_section import replace_section
from tasim.results.eventlog import EVENTS_PLAIN, read_events
from tasim.results.run_folder import SUMMARY_FILE
from tasim.results.stats import METHOD, mean_interval, paired_ratio
from tasim.sim.simulation import run_simulation

# (column, how the run is made): live routing, or None for the simulation
SIDES: tuple[tuple[str, str | None], ...] = (
    ("Dynamo Rust TA, live", "dynamo-thunderagent"),
    ("tasim TA, live proxy", "proxy"),
    ("tasim TA, live pin", "pin"),
    ("tasim TA, simulated", None),
)
METRICS: tuple[tuple[str, str, str], ...] = (
    # (row, summary key or "peak_paused", format)
    ("prefix hit rate", "prefix_hit_rate", "{:.3f}"),
    ("output tokens/s", "output_tokens_per_s", "{:.1f}"),
    ("TTFT mean (s)", "ttft_mean", "{:.2f}"),
    ("TTFT p90 (s)", "ttft_p90", "{:.2f}"),
    ("peak programs paused at once", "peak_paused", "{:.1f}"),
    ("pauses logged", "pauses", "{:.1f}"),
)


def peak_paused(events: Iterable[ev.Event]) -> int:
    """The most programs paused at once in a tasim log."""
    paused: set[str] = set()
    peak = 0
    for event in events:
        if isinstance(event, ev.ProgramPaused):
            paused.add(event.program)
            peak = max(peak, len(paused))
        elif isinstance(event, (ev.ProgramResumed, ev.ProgramFinished)):
            paused.discard(event.program)
    return peak


def _figures(summary: dict[str, Any], peak: int, pauses: int | None) -> dict[str, Any]:
    ttft = summary["ttft_s"]
    return summary | {"ttft_mean": ttft["mean"], "ttft_p90": ttft["p90"], "peak_paused": peak, "pauses": pauses}


def run_side(scenario: Scenario, routing: str | None, out: Path, time_scale: float, reuse: bool = False) -> dict[str, Any]:
    """One run's figures (the summary, with TTFT's mean and p90 and ``peak_paused``);
    ``reuse``: read them from a finished run already in ``out``."""
    if routing is None:
        if reuse and (out / SIM_DIR / SUMMARY_FILE).exists():
            summary = json.loads((out / SIM_DIR / SUMMARY_FILE).read_text())
        else:
            summary = run_simulation(simulated_twin(scenario, "mocker"), out / SIM_DIR, check=True)
        return _figures(summary, peak_paused(read_events(out / SIM_DIR / EVENTS_PLAIN)), summary["pauses"])
    if reuse and (out / SUMMARY_FILE).exists():
        summary = json.loads((out / SUMMARY_FILE).read_text())
    else:
        data = scenario.model_dump(mode="json")
        data["live"]["routing"] = routing
        summary = run_live(Scenario.model_validate(data), out, time_scale=time_scale)
    driver = json.loads((out / "run.json").read_text())["driver"]
    if driver["failed_requests"] or summary["programs_leaked"]:
        raise RuntimeError(f"{out}: {driver['failed_requests']} failed calls, {summary['programs_leaked']} leaked programs")
    plugin = driver.get("dynamo_plugin")
    if plugin is not None:  # the Rust ThunderAgent logs its state, not its pauses
        return _figures(summary, plugin["peak_paused_programs"], None)
    return _figures(summary, peak_paused(read_events(out / EVENTS_PLAIN)), summary["pauses"])


def table(figures: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: a row per metric, a column per side, mean [95 % interval] over seeds."""
    lines = ["| metric | " + " | ".join(name for name, _ in SIDES) + " |", "|---|" + "---:|" * len(SIDES)]
    for row, key, shape in METRICS:
        cells = []
        for name, _ in SIDES:
            values = [run[key] for run in figures[name] if run.get(key) is not None]
            if not values:
                cells.append("not logged")
                continue
            interval = mean_interval(values)
            cells.append(shape.format(interval.mean) + (f" [{shape.format(interval.low)}, {shape.format(interval.high)}]" if interval.n > 1 else ""))
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def against_simulation(figures: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: each live side's figures over the simulated ones, paired per seed (the same
    programs), mean ratio [95 % interval]; an interval that holds 1 is no significant gap."""
    simulated = figures["tasim TA, simulated"]
    live_sides = [name for name, routing in SIDES if routing is not None]
    lines = ["| live / simulated | " + " | ".join(live_sides) + " |", "|---|" + "---:|" * len(live_sides)]
    for row, key, _ in METRICS[:4]:
        cells = []
        for name in live_sides:
            ratio = paired_ratio([run[key] for run in figures[name]], [run[key] for run in simulated])
            if ratio is None:
                cells.append("n/a")
                continue
            significant = "" if ratio.n < 2 or ratio.contains(1.0) else " *"
            cells.append(f"{ratio.mean:.3f}" + (f" [{ratio.low:.3f}, {ratio.high:.3f}]{significant}" if ratio.n > 1 else ""))
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def noise(figures: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Per metric, the largest relative gap between tasim's live proxy runs and their simulation
    over the seeds: how far live and simulated differ with the same policy."""
    live, simulated = figures["tasim TA, live proxy"], figures["tasim TA, simulated"]
    gaps: dict[str, float] = {}
    for _, key, _ in METRICS[:4]:
        gaps[key] = max(abs(a[key] / b[key] - 1) for a, b in zip(live, simulated, strict=True) if b[key])
    return gaps


def compare(scenario: Scenario, seeds: Sequence[int], out: Path, time_scale: float, reuse: bool = False) -> dict[str, list[dict[str, Any]]]:
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in SIDES}
    for seed in seeds:
        seeded = finite_scenario(scenario.model_copy(update={"seed": seed}), None)
        for name, routing in SIDES:
            side = out / f"s{seed}" / (routing or "simulated")
            figures[name].append(run_side(seeded, routing, side, time_scale, reuse))
            print(f"seed {seed}, {name}: " + ", ".join(f"{key}={figures[name][-1].get(key)}" for _, key, _ in METRICS), flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.peers", description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 added to the scenario's (default 3)")
    parser.add_argument("--time-scale", type=float, default=2.0)
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--reuse", action="store_true", help="take the runs already finished in --out instead of running them again")
    parser.add_argument("--doc", type=Path, help="document to write the table into, between the section's markers")
    parser.add_argument("--section", default="live-mocker", help="marker name: <!-- peers:NAME begin --> ... <!-- peers:NAME end -->")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario, args.overrides)
    seeds = [scenario.seed + i for i in range(args.seeds)]
    with tempfile.TemporaryDirectory(prefix="tasim-peers-") as tmp:
        figures = compare(scenario, seeds, args.out or Path(tmp), args.time_scale, args.reuse)
    gaps = noise(figures)
    text = (
        table(figures)
        + "\n\n"
        + against_simulation(figures)
        + "\n\n* the interval over the seeds' paired ratios excludes 1."
        + f"\n\n{len(seeds)} seeds ({', '.join(map(str, seeds))}), mean [{METHOD} interval]; time scale {args.time_scale:g}. "
        + "Live-vs-sim noise (largest gap of tasim's proxy runs to their simulation over the seeds): "
        + ", ".join(f"{key} {gap:.1%}" for key, gap in gaps.items())
        + "."
    )
    print(text)
    if args.doc is not None:
        replace_section(args.doc, f"<!-- peers:{args.section} begin -->", f"<!-- peers:{args.section} end -->", "\n" + text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
