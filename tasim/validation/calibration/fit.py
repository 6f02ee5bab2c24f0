"""The search: `tasim.tools.search`'s engine (Optuna's TPE sampler, batches of trials) over the knobs, a
trial's loss being how far tasim's values of the fitted points are from the published ones.

A trial simulates what its points need (`tasim.validation.published.evaluate.plan`, the scenario with the
trial's values as overrides). Trials are asked in batches of `BATCH` and a batch's runs go to the
process pool together, so the cores stay busy; the batch does not depend on the number of
processes, so neither does the fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from tasim.config.policy_spec import PolicySpec
from tasim.config.scenario import Scenario
from tasim.tools.parallel import map_in_processes
from tasim.tools.search import Dimension, TrialResult, own_values, run_batches, tpe_sampler
from tasim.validation.calibration import CalibrationError
from tasim.validation.published.evaluate import Plan, PointResult, evaluate, plan
from tasim.validation.published.measurement_file import MeasurementError, Measurements
from tasim.validation.published.quantities import Outcome
from tasim.validation.published.runs import measure

BATCH = 4
# The loss of a point tasim has no value for (e.g. the run ended before its rollout did): as far
# off as a factor of 10.
MISSING_PENALTY = math.log(10.0) ** 2
Values = dict[str, float]
Progress = Callable[[int], None]  # hears how many more simulations have completed


@dataclass(frozen=True)
class Problem:
    """A scenario held to the points of one measurement file that ran on its set-up."""

    scenario: Scenario
    measurements: Measurements
    overrides: tuple[str, ...] = ()  # the user's --set, in every run
    systems: Mapping[str, PolicySpec] | None = None

    def subset(self, ids: Sequence[str]) -> Measurements:
        wanted = set(ids)
        return replace(self.measurements, points=tuple(p for p in self.measurements.points if p.id in wanted))


@dataclass(frozen=True)
class Search:
    values: Values  # the best trial's
    loss: float
    trials: int
    invalid: int = 0  # trials whose values no scenario can hold (e.g. weights leave no KV memory)


def loss(results: Sequence[PointResult]) -> float:
    """Mean squared log ratio of tasim to published: symmetric in over- and under-estimates."""
    terms = [math.log(r.ratio) ** 2 if r.ratio is not None and r.ratio > 0 else MISSING_PENALTY for r in results]
    return sum(terms) / len(terms)


def evaluate_values(
    problem: Problem,
    candidates: Sequence[Values],
    knobs: Sequence[Dimension],
    ids: Sequence[str],
    jobs: int,
    seeds: Sequence[int] | None = None,
    progress: Progress | None = None,
) -> list[list[list[PointResult]]]:
    """The points ``ids`` under each candidate, per seed (default: the scenario's): results
    [candidate][seed][point]. Every run of every candidate goes to one pool."""
    seeds = [problem.scenario.seed] if seeds is None else list(seeds)
    try:
        plans = [plan_values(problem, values, knobs, ids, seed) for values in candidates for seed in seeds]
    except MeasurementError as exc:
        raise CalibrationError(str(exc)) from None
    results = run_plans(plans, jobs, progress)
    return [results[i * len(seeds) : (i + 1) * len(seeds)] for i in range(len(candidates))]


def plan_values(problem: Problem, values: Values, knobs: Sequence[Dimension], ids: Sequence[str], seed: int) -> Plan:
    """The runs the points ``ids`` need under ``values`` and ``seed``. Raises `MeasurementError`
    when the values make a scenario invalid."""
    overrides = [*problem.overrides, *(knob.override(values[knob.key]) for knob in knobs), f"seed={seed}"]
    return plan([problem.subset(ids)], overrides, problem.systems, base=problem.scenario)


def run_plans(plans: Sequence[Plan], jobs: int, progress: Progress | None = None) -> list[list[PointResult]]:
    """Every plan's point results, in plan order; all their runs go to one pool."""
    runs = [run for planned in plans for run in planned.runs]
    outcomes = map_in_processes(
        _measure, [run.scenario for run in runs], max(1, min(jobs, len(runs))), (lambda _, __: progress(1)) if progress else None
    )
    results: list[list[PointResult]] = []
    start = 0
    for planned in plans:
        results.append(evaluate(planned, outcomes[start : start + len(planned.runs)]))
        start += len(planned.runs)
    return results


def _measure(scenario: Scenario) -> Outcome:
    return measure(scenario)


def runs_per_evaluation(problem: Problem, ids: Sequence[str]) -> int:
    """Simulations one candidate needs for the points ``ids``."""
    return len(plan([problem.subset(ids)], problem.overrides, problem.systems, base=problem.scenario).runs)


def search(
    problem: Problem, knobs: Sequence[Dimension], ids: Sequence[str], trials: int, fit_seed: int, jobs: int, progress: Progress | None = None
) -> Search:
    """The knob values that minimise `loss` over the points ``ids`` in ``trials`` trials. The
    scenario's own values are the first trial where they lie inside the ranges. A trial whose
    values make the scenario invalid is told to the sampler as failed (it learns to avoid the
    region) rather than ending the search; only a search with no valid trial at all fails."""
    import optuna

    study = optuna.create_study(direction="minimize", sampler=tpe_sampler(fit_seed, max(BATCH, trials // 4)))
    current = own_values(problem.scenario, knobs)
    if current is not None:
        study.enqueue_trial(current)
    runs = runs_per_evaluation(problem, ids)
    reasons: list[str] = []

    def score(batch: list[Values]) -> list[TrialResult | str]:
        scored: list[TrialResult | str] = []
        valid: list[tuple[int, Plan]] = []
        for values in batch:
            try:
                valid.append((len(scored), plan_values(problem, values, knobs, ids, problem.scenario.seed)))
                scored.append("")  # filled in below
            except MeasurementError as exc:
                reasons.append(str(exc))
                scored.append(str(exc))
                if progress:
                    progress(runs)  # the runs it would have made, so the bar still ends full
        for (index, _), results in zip(valid, run_plans([planned for _, planned in valid], jobs, progress)):
            scored[index] = TrialResult(loss(results))
        return scored

    refused = run_batches(study, trials, BATCH, knobs, score)
    if refused == trials:
        raise CalibrationError(f"--fit: none of the {trials} trials gave a valid scenario (first: {reasons[0]}); narrow the ranges")
    best = study.best_trial
    assert best.value is not None  # the best trial is a completed one, which has its loss
    return Search({knob.key: best.params[knob.key] for knob in knobs}, float(best.value), trials, refused)
