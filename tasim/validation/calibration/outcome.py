"""What a calibration reports: the fitted values, and per point the published value, tasim before
and after (over seeds, with a 95 % interval), and for a fitted point its leave-one-out
prediction; written as ``calibration.json`` and as a calibrated scenario file."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from tasim.config.scenario import derived_scenario_yaml
from tasim.results.run_folder import write_json
from tasim.tools.search import Dimension
from tasim.validation.calibration.fit import Search
from tasim.validation.published.evaluate import PointResult
from tasim.validation.published.measurement_file import Measurements, Point, Published
from tasim.validation.published.present import BAND, published_text, value_text

CALIBRATION_FILE = "calibration.json"
# Student's t, two-sided 95 %, by degrees of freedom (1-10); the normal value beyond.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def interval(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95 % confidence interval (None for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    t = _T95[len(values) - 2] if len(values) - 1 <= len(_T95) else 1.96
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


@dataclass(frozen=True)
class PointReport:
    point: Point
    fitted: bool
    before: float | None
    after: tuple[float | None, ...]  # per seed
    loo: float | None  # fitted points: the prediction of a fit without it
    loo_trials: int | None

    @classmethod
    def of(
        cls, result: PointResult, fitted: Sequence[str], before: PointResult, after: Sequence[PointResult], loo: tuple[Search, float | None] | None
    ) -> PointReport:
        return cls(
            result.point,
            result.point.id in fitted,
            before.tasim,
            tuple(r.tasim for r in after),
            None if loo is None else loo[1],
            None if loo is None else loo[0].trials,
        )

    @property
    def id(self) -> str:
        return self.point.id

    @property
    def metric(self) -> str:
        return self.point.metric

    @property
    def published(self) -> Published:
        return self.point.published

    @property
    def mean(self) -> tuple[float, float | None] | None:
        values = [v for v in self.after if v is not None]
        return interval(values) if len(values) == len(self.after) else None

    def error(self, value: float | None) -> float | None:
        return None if value is None else value / self.published.value - 1

    @property
    def prediction_error(self) -> float | None:
        """How far the fit predicts this point: held out, the calibrated value's error; fitted,
        the leave-one-out prediction's."""
        if self.fitted:
            return self.error(self.loo)
        mean = self.mean
        return None if mean is None else self.error(mean[0])


@dataclass(frozen=True)
class Report:
    scenario_path: Path
    scenario_name: str
    measurements: Measurements
    knobs: tuple[Dimension, ...]
    fit: Search
    points: list[PointReport]
    seeds: list[int]
    trials: int
    fit_seed: int
    overrides: tuple[str, ...]
    command: str

    @property
    def held_out(self) -> list[PointReport]:
        return [p for p in self.points if not p.fitted]


def _value(point: PointReport, value: float | None) -> str:
    return "-" if value is None else value_text(point.point, value)


def _pct(error: float | None) -> str:
    return "-" if error is None else f"{error * 100:+.1f} %"


def _trials(search: Search) -> str:
    return f"{search.trials} trials" + (f", {search.invalid} of them invalid" if search.invalid else "")


def knob_table(report: Report) -> Table:
    table = Table(
        title=f"fitted to {len([p for p in report.points if p.fitted])} points of {report.measurements.name} "
        f"({_trials(report.fit)}, loss {report.fit.loss:.4f})",
        title_justify="left",
    )
    for column in ("field", "range", "fitted"):
        table.add_column(column, justify="left" if column != "fitted" else "right")
    for knob in report.knobs:
        value = report.fit.values[knob.key]
        table.add_row(knob.key, knob.text.partition("=")[2], f"{int(value)}" if knob.integer else f"{value:.4g}")
    return table


def point_table(report: Report) -> Table:
    seeds = f"{len(report.seeds)} seeds, mean ± 95 %" if len(report.seeds) > 1 else "1 seed"
    table = Table(title=f"every point of the set-up (tasim − published: error; calibrated over {seeds})", title_justify="left")
    for column in ("point", "role", "published", "uncalibrated", "error", "calibrated", "error", "leave-one-out", "error"):
        table.add_column(column, justify="left" if column in ("point", "role") else "right")
    for p in report.points:
        mean = p.mean
        calibrated = "-" if mean is None else _value(p, mean[0]) + ("" if mean[1] is None else f" ± {_value(p, mean[1])}")
        table.add_row(
            p.id,
            "fitted" if p.fitted else "held out",
            published_text(p.point),
            _value(p, p.before),
            _pct(p.error(p.before)),
            calibrated,
            _pct(None if mean is None else p.error(mean[0])),
            _value(p, p.loo) if p.fitted else "",
            _pct(p.error(p.loo)) if p.fitted else "",
        )
    return table


def summary_lines(report: Report) -> list[str]:
    errors = [abs(e) for p in report.held_out if (e := p.prediction_error) is not None]
    loo = [abs(e) for p in report.points if p.fitted and (e := p.prediction_error) is not None]
    lines = []
    if errors:
        within = sum(1 for e in errors if e <= BAND)
        lines.append(
            f"held out: {len(errors)} points, median |error| {statistics.median(errors) * 100:.1f} %, "
            f"max {max(errors) * 100:.1f} %, {within} within ±{BAND * 100:.0f} %"
        )
    if loo:
        lines.append(f"leave-one-out: {len(loo)} fitted points, median |error| {statistics.median(loo) * 100:.1f} %, max {max(loo) * 100:.1f} %")
    return lines


def record(report: Report) -> dict[str, Any]:
    return {
        "scenario": str(report.scenario_path),
        "measurements": str(report.measurements.path),
        "command": report.command,
        "trials": report.trials,
        "fit_seed": report.fit_seed,
        "seeds": report.seeds,
        "overrides": list(report.overrides),
        "knobs": [{"key": k.key, "low": k.low, "high": k.high, "integer": k.integer, "log": k.log} for k in report.knobs],
        "fitted_values": report.fit.values,
        "loss": report.fit.loss,
        "invalid_trials": report.fit.invalid,
        "points": [
            {
                "id": p.id,
                "metric": p.metric,
                "fitted": p.fitted,
                "published": p.published.value,
                "before": p.before,
                "after": list(p.after),
                "after_mean": None if p.mean is None else p.mean[0],
                "after_ci95": None if p.mean is None else p.mean[1],
                "leave_one_out": p.loo,
                "prediction_error": p.prediction_error,
            }
            for p in report.points
        ],
    }


def calibrated_yaml(report: Report, target: Path) -> str:
    """The scenario with the fitted values, headed by what it was fitted to and how well the fit
    predicts the rest. The scenario file's own comments do not survive a YAML round trip, so
    the header names the file it came from."""
    overrides = [*report.overrides, *(k.override(report.fit.values[k.key]) for k in report.knobs)]
    fitted = [p for p in report.points if p.fitted]
    header = [
        f"Calibrated from {report.scenario_path.name} by `{report.command}`.",
        f"Fitted to {len(fitted)} points of {report.measurements.path.name} ({report.measurements.title}):",
        *(f"  {p.id}: published {published_text(p.point)}, leave-one-out error {_pct(p.prediction_error)}" for p in fitted),
        f"Held out ({len(report.held_out)} points), error of the calibrated value:",
        *(f"  {p.id}: published {published_text(p.point)}, error {_pct(p.prediction_error)}" for p in report.held_out),
        "Fitted values: " + ", ".join(k.override(report.fit.values[k.key]) for k in report.knobs),
    ]
    return derived_scenario_yaml(report.scenario_path, overrides, f"{report.scenario_name}-calibrated", target, header)


def write_outputs(report: Report, out: Path, scenario_file: Path | None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    target = scenario_file or out / f"{report.scenario_name}-calibrated.yaml"
    partial = target.with_name(target.name + ".partial")
    partial.write_text(calibrated_yaml(report, target))
    partial.replace(target)
    write_json(out / CALIBRATION_FILE, record(report))
    return [out / CALIBRATION_FILE, target]
