"""One simulation as the metrics read it: summary and per-step latency, folded as it runs, in
memory or (when a directory is given) written as an ordinary run directory too."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tasim.config.scenario import RolloutWorkload, Scenario
from tasim.core import events as ev
from tasim.results.metrics import MetricsFold
from tasim.sim.simulation import run_simulation
from tasim.validation.published.quantities import Outcome
from tasim.validation.published.turn_latency import TurnLatencyFold


def measure(scenario: Scenario, out: Path | None = None) -> Outcome:
    """Simulate ``scenario``; with ``out``, also write its event log, summary and run.json there."""
    latency = TurnLatencyFold(scenario.metrics.warmup_s)
    if out is not None:
        summary = run_simulation(scenario, out, observe=latency.apply)
    else:
        from tasim.sim.runner import Simulation  # keeps loading measurement files light

        fold = MetricsFold()

        def emit(event: ev.Event) -> None:
            fold.apply(event)
            latency.apply(event)

        started = time.perf_counter()
        Simulation(scenario, emit).run()
        summary = fold.summary(wall_time_s=time.perf_counter() - started)
    return outcome_of(scenario, summary, latency.mean_s)


def outcome_of(scenario: Scenario, summary: dict[str, Any], turn_latency_s: float | None) -> Outcome:
    """The outcome of a run of ``scenario`` whose summary and per-step latency are known."""
    workload = scenario.workload
    steps = workload.steps if isinstance(workload, RolloutWorkload) else None
    return Outcome(summary, turn_latency_s, steps)
