"""``python -m tasim calibrate SCENARIO --against MEASUREMENTS --fit KEY=LOW:HIGH,... --points ID,...``

1. Search the knobs on the fitted points (`fit.search`).
2. Leave one out: for each fitted point, search again without it and predict it.
3. Evaluate every point of the set-up (fitted and held out) before calibration and, with the
   fitted values, over ``--seeds`` seeds (mean and a 95 % interval).
4. Write ``calibration.json`` and the calibrated scenario, which cites what it was fitted to.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tasim.config.scenario import load_scenario
from tasim.results.render import print_unsquashed
from tasim.tools.search import Dimension
from tasim.validation.calibration import CalibrationError
from tasim.validation.calibration.fit import Problem, Search, evaluate_values, runs_per_evaluation, search
from tasim.validation.calibration.outcome import PointReport, Report, knob_table, point_table, summary_lines, write_outputs
from tasim.validation.published.measurement_file import Measurements, chooses_policy


@dataclass(frozen=True)
class Request:
    scenario: Path
    against: Path
    knobs: tuple[Dimension, ...]
    fitted: tuple[str, ...]
    overrides: tuple[str, ...]
    trials: int
    loo_trials: int
    seeds: int
    fit_seed: int
    jobs: int | None
    out: Path
    write: Path | None
    command: str


def setup_points(measurements: Measurements, fitted: Sequence[str]) -> tuple[Measurements, tuple[str, ...]]:
    """The file's points of the fitted points' set-up (one preset), and those held out of it."""
    ids = [p.id for p in measurements.points]
    unknown = [i for i in fitted if i not in ids]
    if unknown:
        raise CalibrationError(f"--points {unknown[0]}: no such point in {measurements.path} (points: {', '.join(ids)})")
    if len(set(fitted)) != len(fitted):
        raise CalibrationError("--points: a point is named twice")
    presets = {measurements.scenario_of(p) for p in measurements.points if p.id in fitted}
    if len(presets) > 1:
        raise CalibrationError(
            f"--points: the fitted points ran on {len(presets)} set-ups ({', '.join(sorted(p.name for p in presets))}); fit one at a time"
        )
    preset = presets.pop()
    same = tuple(p for p in measurements.points if measurements.scenario_of(p) == preset)
    held_out = tuple(p.id for p in same if p.id not in fitted)
    if not held_out:
        raise CalibrationError("--points: every point of the set-up is fitted, so none is left to test the fit on")
    return replace(measurements, points=same), held_out


def check_knobs(knobs: Sequence[Dimension], measurements: Measurements) -> None:
    """A knob must not be what a point sets itself, nor what its systems choose."""
    for knob in knobs:
        if chooses_policy(knob.key):
            raise CalibrationError(
                f"--fit {knob.key}: each system of a measurement file chooses its policy (fit policy.defaults.<policy>.<param> instead)"
            )
        for point in measurements.points:
            for side in (point.of, point.over):
                for key in side.set if side else ():
                    if key == knob.key or key.startswith(knob.key + ".") or knob.key.startswith(key + "."):
                        raise CalibrationError(f"--fit {knob.key}: point {point.id} sets {key} itself")


def calibrate(request: Request) -> Report:
    from tasim.validation.published.measurement_file import load_measurements

    measurements, held_out = setup_points(load_measurements(request.against), request.fitted)
    check_knobs(request.knobs, measurements)
    scenario = load_scenario(request.scenario)
    problem = Problem(scenario, measurements, request.overrides)
    every = [*request.fitted, *held_out]
    jobs = request.jobs or (os.cpu_count() or 1)
    fit_runs = runs_per_evaluation(problem, request.fitted)
    total = request.trials * fit_runs + runs_per_evaluation(problem, every) * (1 + request.seeds)
    if request.loo_trials and len(request.fitted) > 1:
        total += sum(
            request.loo_trials * runs_per_evaluation(problem, [i for i in request.fitted if i != left]) + runs_per_evaluation(problem, [left])
            for left in request.fitted
        )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("simulations"), TimeElapsedColumn())
    console = Console(stderr=True)
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("calibrating", total=total)
        done = [0]

        def advance(count: int) -> None:
            bar.advance(task, count)
            done[0] += count
            # into a file or pipe the bar is not drawn: a line at every tenth of the way instead
            if not console.is_terminal and done[0] * 10 // total != (done[0] - count) * 10 // total:
                console.print(f"calibrate: {done[0]}/{total} simulations ({bar.tasks[0].description})", markup=False, highlight=False)

        bar.update(task, description="fitting")
        fit = search(problem, request.knobs, request.fitted, request.trials, request.fit_seed, jobs, advance)
        loo: dict[str, tuple[Search, float | None]] = {}
        if request.loo_trials and len(request.fitted) > 1:
            for left in request.fitted:
                bar.update(task, description=f"leaving out {left}")
                others = [i for i in request.fitted if i != left]
                refit = search(problem, request.knobs, others, request.loo_trials, request.fit_seed, jobs, advance)
                predicted = evaluate_values(problem, [refit.values], request.knobs, [left], jobs, progress=advance)
                loo[left] = (refit, predicted[0][0][0].tasim)
        bar.update(task, description="evaluating")
        before = evaluate_values(problem, [{}], (), every, jobs, progress=advance)[0][0]
        seeds = [scenario.seed + i for i in range(request.seeds)]
        after = evaluate_values(problem, [fit.values], request.knobs, every, jobs, seeds, advance)[0]
    points = [
        PointReport.of(result, request.fitted, before[i], [per_seed[i] for per_seed in after], loo.get(result.point.id))
        for i, result in enumerate(after[0])
    ]
    return Report(
        request.scenario,
        scenario.name,
        measurements,
        request.knobs,
        fit,
        points,
        seeds,
        request.trials,
        request.fit_seed,
        request.overrides,
        request.command,
    )


def run_calibration(request: Request) -> None:
    report = calibrate(request)
    print_unsquashed(knob_table(report))
    print_unsquashed(point_table(report))
    for line in summary_lines(report):
        Console().print(line, markup=False, highlight=False, soft_wrap=True)
    written = write_outputs(report, request.out, request.write)
    Console().print("wrote " + ", ".join(map(str, written)), markup=False, highlight=False, soft_wrap=True)
