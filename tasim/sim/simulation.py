"""Simulate a scenario into a run folder (`tasim.results.run_folder`): its event log, summary and
run metadata, as ``tasim simulate`` writes them."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tasim import __version__
from tasim.config.scenario import Scenario
from tasim.core.events import Event
from tasim.results.eventlog import EVENTS_GZIP, EVENTS_PLAIN, EventWriter
from tasim.results.metrics import MetricsFold
from tasim.results.run_folder import RUN_FILE, SUMMARY_FILE, write_json

if TYPE_CHECKING:
    from tasim.sim.engine.scheduler import EngineFactory


def run_simulation(
    scenario: Scenario,
    out: Path,
    gzip: bool = False,
    progress: bool = False,
    check: bool = False,
    engine_factory: EngineFactory | None = None,
    observe: Callable[[Event], None] | None = None,
) -> dict[str, Any]:
    """Simulate ``scenario``, write the event log, summary and run metadata under ``out``.
    ``check``: check the simulator's invariants as it runs (`tasim.sim.checks`); a broken one
    raises `InvariantViolation` and leaves the log written so far as ``<log>.partial``.
    ``engine_factory``: another engine than tasim's (decode steps are then simulated one by one);
    ``observe`` sees every event as it is written."""
    from tasim.sim.runner import Simulation  # keeps `tasim schema` and `report` light

    out.mkdir(parents=True, exist_ok=True)
    events_name = EVENTS_GZIP if gzip else EVENTS_PLAIN
    final = out / events_name
    partial = out / (events_name + ".partial")
    writer = EventWriter(partial, compress=gzip)
    fold = MetricsFold()

    def emit(event: Event) -> None:
        writer.write(event)
        fold.apply(event)
        if observe is not None:
            observe(event)

    started = time.perf_counter()
    try:
        if engine_factory is None:
            simulation = Simulation(scenario, emit, check=check)
        else:
            simulation = Simulation(scenario, emit, check=check, fast_forward=False, engine_factory=engine_factory)
        if progress:
            _run_with_progress(simulation, scenario.duration_s)
        else:
            simulation.run()
    finally:
        writer.close()
    wall = time.perf_counter() - started
    partial.replace(final)
    for stale in {EVENTS_PLAIN, EVENTS_GZIP} - {events_name}:
        (out / stale).unlink(missing_ok=True)
    summary = fold.summary(wall_time_s=wall)
    write_json(out / SUMMARY_FILE, summary)
    write_json(
        out / RUN_FILE,
        {"tasim_version": __version__, "events": events_name, "wall_time_s": wall, "scenario": scenario.model_dump(mode="json")},
    )
    return summary


def _run_with_progress(simulation: Any, duration_s: float) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("simulating"), BarColumn(), TextColumn("{task.completed:,.0f}/{task.total:,.0f} sim s"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("sim", total=duration_s)
        simulation.run(progress=lambda now: bar.update(task, completed=now))
