"""Holding tasim against published points: which simulations they need (`plan`), running them
(`run`) and tasim's value of each point beside the published one (`evaluate`).

Written to be called many times with trial overrides (``tasim calibrate`` does): planning only
loads scenarios, running writes no files, evaluating is arithmetic on the outcomes. Every run
is validated by `plan` before any starts, so a bad key costs no simulation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tasim.config.policy_spec import PolicySpec
from tasim.config.scenario import Scenario, ScenarioError, load_scenario, parse_scenario
from tasim.tools.parallel import map_in_processes
from tasim.validation.published.measurement_file import MeasurementError, Measurements, Point, Side, chooses_policy
from tasim.validation.published.quantities import METRICS, MetricUnavailable, Outcome
from tasim.validation.published.runs import measure


@dataclass(frozen=True)
class PlannedRun:
    """One simulation; ``label`` names it in progress lines (scenario/policy/point overrides)."""

    label: str
    scenario: Scenario


@dataclass(frozen=True)
class PlannedPoint:
    measurements: Measurements
    point: Point
    of: int  # index into Plan.runs
    over: int | None


@dataclass(frozen=True)
class Plan:
    runs: tuple[PlannedRun, ...]
    points: tuple[PlannedPoint, ...]


@dataclass(frozen=True)
class PointResult:
    measurements: Measurements
    point: Point
    tasim: float | None  # None: the runs lack the metric (``reason`` says why)
    reason: str | None = None

    @property
    def ratio(self) -> float | None:
        """tasim over the published value (a range's midpoint)."""
        return None if self.tasim is None else self.tasim / self.point.published.value

    @property
    def error(self) -> float | None:
        """Relative error: tasim / published - 1."""
        return None if self.ratio is None else self.ratio - 1


def plan(
    measurements: Sequence[Measurements], overrides: Sequence[str] = (), systems: Mapping[str, PolicySpec] | None = None, base: Scenario | None = None
) -> Plan:
    """The distinct runs the points need: one per distinct resolved scenario (preset or
    ``base``, then ``overrides``, a side's ``set``, its system's policy). ``systems`` replaces
    the policy spec of the named systems in every file that has them; ``base`` replaces every
    point's preset (the points should then be of one set-up). Raises `MeasurementError`."""
    systems = dict(systems or {})
    _check_overrides(measurements, overrides)
    _check_systems(measurements, systems)
    # loaded with only --set first, so an error here is the preset's or --set's, not a point's
    for preset in sorted({m.scenario_of(p) for m in measurements for p in m.points}):
        _load(preset, base, overrides)
    runs: list[PlannedRun] = []
    index: dict[str, int] = {}
    points: list[PlannedPoint] = []
    for m in measurements:
        for point in m.points:
            sides = [
                _run_index(m, point, name, side, overrides, systems, base, runs, index)
                for name, side in (("of", point.of), ("over", point.over))
                if side is not None
            ]
            points.append(PlannedPoint(m, point, sides[0], sides[1] if len(sides) > 1 else None))
    return Plan(tuple(runs), tuple(points))


def run(planned: Plan, jobs: int = 1, on_done: Callable[[PlannedRun, Outcome], None] | None = None) -> list[Outcome]:
    """Simulate every planned run in up to ``jobs`` processes, outcomes in plan order (runs are
    deterministic, so they do not depend on ``jobs``)."""
    return map_in_processes(_measure, planned.runs, max(1, min(jobs, len(planned.runs))), on_done)


def evaluate(planned: Plan, outcomes: Sequence[Outcome]) -> list[PointResult]:
    """tasim's value of every point, in plan order."""
    results = []
    for pp in planned.points:
        metric = METRICS[pp.point.metric]
        try:
            value = metric.of(outcomes[pp.of])
            if pp.over is not None:
                over = metric.of(outcomes[pp.over])
                if over == 0:
                    raise MetricUnavailable(f"the `over` side has {metric.name} 0")
                value /= over
        except MetricUnavailable as exc:
            results.append(PointResult(pp.measurements, pp.point, None, str(exc)))
            continue
        results.append(PointResult(pp.measurements, pp.point, value))
    return results


def run_metrics(outcome: Outcome) -> dict[str, float | None]:
    """Every catalogue metric of one run (None where it does not apply)."""
    values: dict[str, float | None] = {}
    for name, metric in METRICS.items():
        try:
            values[name] = metric.of(outcome)
        except MetricUnavailable:
            values[name] = None
    return values


def _measure(planned: PlannedRun) -> Outcome:
    return measure(planned.scenario)


def _run_index(
    m: Measurements,
    point: Point,
    name: str,
    side: Side,
    overrides: Sequence[str],
    systems: Mapping[str, PolicySpec],
    base: Scenario | None,
    runs: list[PlannedRun],
    index: dict[str, int],
) -> int:
    spec = systems.get(side.system, m.systems[side.system])
    try:
        scenario = _load(m.scenario_of(point), base, [*overrides, *side.overrides(), *spec.overrides()])
    except MeasurementError as exc:
        raise MeasurementError(f"{m.path}: points.{point.id}.{name} ({side.system} = {spec.label}): {exc}") from None
    key = json.dumps(scenario.model_dump(mode="json"), sort_keys=True)
    if key not in index:
        label = _label(scenario.name, spec, side)
        taken = {r.label for r in runs}
        # two presets may share a name: number the later ones
        unique = next(candidate for i in range(len(runs) + 1) if (candidate := f"{label}#{i}" if i else label) not in taken)
        index[key] = len(runs)
        runs.append(PlannedRun(unique, scenario))
    return index[key]


def _load(preset: Path, base: Scenario | None, overrides: Sequence[str]) -> Scenario:
    """``preset`` (or ``base`` in its place) with ``overrides`` applied."""
    try:
        if base is not None:
            return parse_scenario(base.model_dump(mode="json"), base.name, overrides)
        return load_scenario(preset, overrides)
    except ScenarioError as exc:
        raise MeasurementError(str(exc)) from None


def _label(scenario: str, spec: PolicySpec, side: Side) -> str:
    text = "/".join([scenario, spec.label, *side.overrides()])
    return re.sub(r"[^A-Za-z0-9._=+/\[\],-]", "_", text)


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _check_overrides(measurements: Sequence[Measurements], overrides: Sequence[str]) -> None:
    """A --set must not be lost: not on what systems choose, not on what a point sets itself."""
    for assignment in overrides:
        key = assignment.partition("=")[0].strip()
        if chooses_policy(key):
            raise MeasurementError(
                f"--set {assignment}: each system of a measurement file chooses its run's policy "
                "(remap a system with --system NAME=SPEC, or set policy.defaults.<policy>.<param>)"
            )
        for m in measurements:
            for point in m.points:
                for side in (point.of, point.over):
                    clash = next((k for k in (side.set if side else {}) if _overlap(key, k)), None)
                    if clash is not None:
                        raise MeasurementError(f"--set {key}: {m.path} point {point.id} sets {clash} itself, so the --set would be lost there")


def _check_systems(measurements: Sequence[Measurements], systems: Mapping[str, PolicySpec]) -> None:
    for name in systems:
        if not any(name in m.systems for m in measurements):
            known = sorted({s for m in measurements for s in m.systems})
            raise MeasurementError(f"--system {name}: no measurement file has that system (systems: {', '.join(known)})")
