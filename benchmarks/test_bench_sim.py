"""Simulator speed on the default scenario: simulated seconds and engine iterations per wall second."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import RESULTS

from tasim.config.scenario import load_scenario
from tasim.sim.simulation import run_simulation

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "swe-agent.yaml"


def test_default_scenario_speed(benchmark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    scenario = load_scenario(SCENARIO)
    summaries = []

    def run() -> None:
        started = time.perf_counter()
        summaries.append((run_simulation(scenario, tmp_path / "run"), time.perf_counter() - started))

    benchmark.pedantic(run, rounds=3, iterations=1)
    wall = min(w for _, w in summaries)
    summary = summaries[0][0]
    info = {
        "sim_seconds_per_wall_second": summary["sim_time_s"] / wall,
        "engine_iterations_per_wall_second": summary["engine_iterations"] / wall,
        "engine_iterations": summary["engine_iterations"],
        "requests_completed": summary["requests_completed"],
    }
    benchmark.extra_info.update(info)
    RESULTS.append((f"swe-agent (default, {scenario.duration_s:g} sim s)", info))
