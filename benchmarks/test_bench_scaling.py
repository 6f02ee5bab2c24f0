"""How the simulator's cost grows with requests, workers and context length (docs/results/performance.md).

One synthetic multi-turn agent workload on Dynamo-mocker-sized workers, varied one axis at a
time; the figure is wall microseconds per completed request (and per engine iteration)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import RESULTS

from tasim.config.scenario import load_scenario
from tasim.results.metrics import MetricsFold
from tasim.sim.runner import Simulation

PRESET = Path(__file__).resolve().parent.parent / "scenarios" / "multiturn-validation.yaml"
BASE = {"programs": 1000, "workers": 4, "task_prompt": 2500}

AXES = {
    "requests": [{"programs": n} for n in (500, 1000, 2000, 4000)],
    "workers": [{"workers": n} for n in (2, 4, 8, 16)],
    "context": [{"task_prompt": n} for n in (1000, 4000, 16000)],
}


def _run(programs: int, workers: int, task_prompt: int) -> dict[str, float]:
    scenario = load_scenario(
        PRESET,
        [
            f"workload.programs={programs}",
            "workload.turns=8",
            "workload.concurrency=256",
            f"workload.task_prompt_tokens={task_prompt}",
            f"cluster.backends={workers}",
            "cluster.engine.kv_blocks=16384",
            "duration_s=1000000",
        ],
    )
    fold = MetricsFold()
    started = time.perf_counter()
    Simulation(scenario, fold.apply).run()
    wall = time.perf_counter() - started
    summary = fold.summary()
    return {
        "wall_s": wall,
        "requests": summary["requests_completed"],
        "us_per_request": wall / summary["requests_completed"] * 1e6,
        "us_per_iteration": wall / summary["engine_iterations"] * 1e6,
    }


@pytest.mark.parametrize("axis", list(AXES))
def test_cost_growth(benchmark, axis: str) -> None:  # type: ignore[no-untyped-def]
    points: list[tuple[dict, dict]] = []

    def sweep() -> None:
        for change in AXES[axis]:
            points.append((change, _run(**{**BASE, **change})))

    benchmark.pedantic(sweep, rounds=1, iterations=1)
    for change, figures in points:
        ((key, value),) = change.items()
        RESULTS.append((f"scaling {axis}: {key}={value}", figures))
        benchmark.extra_info[f"{key}={value}"] = figures
    if axis == "requests":
        # Per-request cost stays flat as the run grows: nothing accumulates per request.
        first, last = points[0][1]["us_per_request"], points[-1][1]["us_per_request"]
        assert last < 1.5 * first, (first, last)
