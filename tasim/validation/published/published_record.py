"""``published.json``: what one ``validate published`` found, per file and point, and every
run's metrics; and reading such a record back as an earlier tasim's values (``--before``).

The record holds no wall times, so the same code, measurement files and flags write the same
bytes: a committed record (``measurements/baseline-*.json``) can be regenerated and diffed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasim import __version__
from tasim.config.policy_spec import PolicySpec
from tasim.validation.published.evaluate import Plan, PointResult, run_metrics
from tasim.validation.published.measurement_file import MeasurementError
from tasim.validation.published.present import describe
from tasim.validation.published.quantities import Outcome

PUBLISHED_FILE = "published.json"


def _relative(path: Path) -> str:
    """Relative to the working directory where it lies below it, so records do not name machines."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return os.fspath(resolved)


def record_json(
    label: str,
    planned: Plan,
    outcomes: Sequence[Outcome],
    results: Sequence[PointResult],
    overrides: Sequence[str],
    systems: Mapping[str, PolicySpec],
) -> dict[str, Any]:
    files: dict[str, dict[str, Any]] = {}
    for pp, result in zip(planned.points, results):
        m, point = pp.measurements, pp.point
        entry = files.setdefault(m.name, {"name": m.name, "path": _relative(m.path), "points": []})
        published = {"range": list(point.range)} if point.range is not None else {"value": point.published.value}
        entry["points"].append(
            {
                "id": point.id,
                "what": describe(m, point),
                "metric": point.metric,
                **published,
                "derived": point.derived,
                "read_off_plot": point.read_off_plot,
                "tasim": result.tasim,
                "tasim_over_published": result.ratio,
                "reason": result.reason,
                "runs": [planned.runs[i].label for i in (pp.of, pp.over) if i is not None],
            }
        )
    return {
        "label": label,
        "tasim_version": __version__,
        "overrides": list(overrides),
        "systems": {name: spec.label for name, spec in systems.items()},
        "files": list(files.values()),
        "runs": [{"label": r.label, "scenario": r.scenario.name, "metrics": run_metrics(o)} for r, o in zip(planned.runs, outcomes)],
    }


@dataclass(frozen=True)
class Record:
    """A record read back: its label, what it was run with, and tasim's value (or why it has
    none) per (file name, point id)."""

    label: str
    overrides: tuple[str, ...]
    systems: dict[str, str]
    values: dict[tuple[str, str], float | None]
    reasons: dict[tuple[str, str], str | None]
    runs: int

    @property
    def heading(self) -> str:
        """A column heading: the label, then what it changed, if anything."""
        changes = [*(f"{name} = {spec}" for name, spec in self.systems.items()), *self.overrides]
        return self.label + (f" ({', '.join(changes)})" if changes else "")

    def has(self, file: str) -> bool:
        return any(name == file for name, _ in self.values)


def read_record(path: Path, flag: str) -> Record:
    """A published.json given as ``flag`` (named in errors)."""
    try:
        data = json.loads(path.read_text())
        points = {(f["name"], p["id"]): p for f in data["files"] for p in f["points"]}
        return Record(
            str(data["label"]),
            tuple(data["overrides"]),
            dict(data["systems"]),
            {key: p["tasim"] for key, p in points.items()},
            {key: p["reason"] for key, p in points.items()},
            len(data["runs"]),
        )
    except OSError as exc:
        raise MeasurementError(f"{flag} {path}: cannot read ({exc.strerror})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise MeasurementError(f"{flag} {path}: not a {PUBLISHED_FILE} record ({exc.__class__.__name__}: {exc})") from None
