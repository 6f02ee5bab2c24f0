"""Measurement files: what one published source measured, as data.

One YAML per source (``measurements/*.yaml``): its citations, the scenario preset that models
the set-up it ran, its names for the systems it compared (each mapped to a tasim policy spec)
and its points. A point is one published number: a metric of one system under a few scenario
overrides (``of``), optionally divided by another (``over``: a ratio), with its value or range,
where in the source it stands and whether it was read off a plot. A ratio whose source gives
both sides as points of the file may be ``derived`` from them instead of typed in.

`load_measurements` is the only way in; any problem raises `MeasurementError` with one line
naming the file, the field and what is allowed.
"""

from __future__ import annotations

import json
import re
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasim.config.policy_spec import PolicySpec
from tasim.config.presets import PRESET_DIR
from tasim.config.scenario import ScenarioError, read_yaml
from tasim.validation.published.quantities import METRICS

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# The checkout's measurements/, not shipped in the wheel as the presets are: no installed command
# reads it (`validate published` and `calibrate` take measurement files as paths); only the
# paper-shape suite, which rewrites the checkout's docs/results/validation.md, and the tests do.
MEASUREMENT_DIR = Path(__file__).resolve().parents[3] / "measurements"


def chooses_policy(key: str) -> bool:
    """Whether a dotted scenario key sets what a system's policy spec sets (policy.name,
    policy.params); policy.defaults.* stays open to points and ``--set``."""
    parts = key.strip().split(".")
    return parts[0] == "policy" and (len(parts) == 1 or parts[1] in ("name", "params"))


class MeasurementError(ValueError):
    """A measurement file is invalid, or cannot be run as asked; the message is one line."""


@dataclass(frozen=True)
class Published:
    """A published value or range (``high``); ``approx``: read off a plot (shown with ≈)."""

    low: float
    high: float | None = None
    approx: bool = False

    @property
    def value(self) -> float:
        """The point tasim is held to: the value, or a range's midpoint."""
        return self.low if self.high is None else (self.low + self.high) / 2

    def text(self, fmt: Callable[[float], str], unit: str = "") -> str:
        """As the source gives it: ≈ when read off a plot, a range as low–high."""
        body = fmt(self.low) if self.high is None else f"{fmt(self.low)}–{fmt(self.high)}"
        return f"{'≈' if self.approx else ''}{body}{unit}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Source(_Strict):
    cite: str = Field(min_length=1, description="what the source is, as a reader would look it up")
    url: str | None = None


class Side(_Strict):
    """One system under scenario overrides (dotted keys, as ``--set`` takes them)."""

    system: str
    set: dict[str, Any] = Field(default_factory=dict)

    @field_validator("set")
    @classmethod
    def _no_policy(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not key or any(not part for part in key.split(".")):
                raise ValueError(f"{reprlib.repr(key)} is not a dotted scenario key (e.g. workload.concurrency)")
            if chooses_policy(key):
                raise ValueError(
                    f"{key}: the system chooses the policy and its parameters (map the system to a "
                    "policy spec under systems:, or set policy.defaults.<policy>.<param>)"
                )
        return value

    def overrides(self) -> list[str]:
        return [f"{key}={_yaml_text(value)}" for key, value in sorted(self.set.items())]


class Point(_Strict):
    id: str = Field(pattern=ID_PATTERN, max_length=100)
    metric: str
    of: Side
    over: Side | None = Field(None, description="divides `of`: the point is a ratio")
    value: float | None = None
    range: tuple[float, float] | None = None
    derived: bool = Field(False, description="a ratio computed from the file's own points for `of` and `over`")
    source: str
    where: str = Field(min_length=1, description="figure, table or section of the source")
    read_off_plot: bool = False
    scenario: str | None = Field(None, description="the preset this point ran on (default: the file's)")
    note: str = ""

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        if value not in METRICS:
            raise ValueError(f"unknown metric {reprlib.repr(value)} (allowed: {', '.join(METRICS)})")
        return value

    @model_validator(mode="after")
    def _one_value(self) -> Point:
        given = [name for name in ("value", "range") if getattr(self, name) is not None] + (["derived"] if self.derived else [])
        if len(given) != 1:
            raise ValueError(f"give exactly one of value, range or derived: true (got {', '.join(given) or 'none'})")
        if self.range is not None and not self.range[0] <= self.range[1]:
            raise ValueError(f"range must be [low, high] with low <= high (got {list(self.range)})")
        if self.derived and self.over is None:
            raise ValueError("derived: true needs `over` (it is the ratio of two of the file's points)")
        return self

    @property
    def published(self) -> Published:
        """The value (set for derived points by `load_measurements`)."""
        assert self.value is not None or self.range is not None, f"{self.id}: derived value not resolved"
        if self.range is not None:
            return Published(self.range[0], self.range[1], self.read_off_plot)
        return Published(self.value, None, self.read_off_plot)  # type: ignore[arg-type]


class MeasurementFile(_Strict):
    name: str = Field(pattern=ID_PATTERN, max_length=100)
    title: str = Field(min_length=1)
    sources: dict[str, Source] = Field(min_length=1)
    scenario: str | None = Field(None, description="the preset the points ran on, unless a point names its own")
    systems: dict[str, str] = Field(min_length=1, description="the source's name of a system -> tasim policy spec")
    points: list[Point] = Field(min_length=1)

    @field_validator("systems")
    @classmethod
    def _specs_parse(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            try:
                PolicySpec.parse(text)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _references(self) -> MeasurementFile:
        seen: set[str] = set()
        for point in self.points:
            where = f"points.{point.id}"
            if point.id in seen:
                raise ValueError(f"{where}: id given twice")
            seen.add(point.id)
            if point.source not in self.sources:
                raise ValueError(f"{where}.source: unknown source {reprlib.repr(point.source)} (allowed: {', '.join(self.sources)})")
            for name, side in (("of", point.of), ("over", point.over)):
                if side is not None and side.system not in self.systems:
                    raise ValueError(f"{where}.{name}.system: unknown system {reprlib.repr(side.system)} (allowed: {', '.join(self.systems)})")
            if point.scenario is None and self.scenario is None:
                raise ValueError(f"{where}.scenario: no scenario (give one here or at the top of the file)")
        return self


@dataclass(frozen=True)
class Measurements:
    """A loaded file: every point has its scenario file and its published value."""

    path: Path
    name: str
    title: str
    sources: Mapping[str, Source]
    systems: Mapping[str, PolicySpec]
    points: tuple[Point, ...]

    def scenario_of(self, point: Point) -> Path:
        assert point.scenario is not None, "load_measurements resolves every point's scenario"
        return Path(point.scenario)


def load_measurements(path: str | Path) -> Measurements:
    path = Path(path)
    try:
        raw = read_yaml(path)
    except ScenarioError as exc:
        raise MeasurementError(str(exc)) from None
    if not isinstance(raw, dict):
        raise MeasurementError(f"{path}: top level must be a mapping of keys, got {type(raw).__name__}")
    try:
        spec = MeasurementFile.model_validate(raw)
    except ValidationError as exc:
        raise MeasurementError(f"{path}: {_describe(exc.errors()[0], raw)}") from None
    points = tuple(point.model_copy(update={"scenario": str(_scenario_path(path, point.scenario or spec.scenario, point))}) for point in spec.points)
    points = tuple(_resolve_derived(path, point, points) for point in points)
    systems = {name: PolicySpec.parse(text) for name, text in spec.systems.items()}
    return Measurements(path, spec.name, spec.title, spec.sources, systems, points)


def _scenario_path(path: Path, name: str | None, point: Point) -> Path:
    """A file name is a preset in scenarios/; a path with a folder is relative to this file."""
    assert name is not None
    target = (path.parent / name) if "/" in name else PRESET_DIR / name
    if not target.is_file():
        field = "scenario" if point.scenario is None else f"points.{point.id}.scenario"
        raise MeasurementError(
            f"{path}: {field}: no scenario file {target} (a file name is a preset in scenarios/, a path with a folder is relative to this file)"
        )
    return target.resolve()


def _resolve_derived(path: Path, point: Point, points: Sequence[Point]) -> Point:
    """A derived ratio takes the published values of the file's points for its two sides."""
    if not point.derived:
        return point
    assert point.over is not None
    values = []
    for name, side in (("of", point.of), ("over", point.over)):
        found = [p for p in points if p.over is None and p.metric == point.metric and p.of == side and p.scenario == point.scenario and not p.derived]
        if len(found) != 1 or found[0].range is not None:
            raise MeasurementError(
                f"{path}: points.{point.id}.derived: needs exactly one point with a value (not a "
                f"range) of {point.metric} for its `{name}` side, found {len(found)}"
            )
        values.append(found[0])
    of, over = values
    assert of.value is not None and over.value is not None
    return point.model_copy(update={"value": of.value / over.value, "read_off_plot": point.read_off_plot or of.read_off_plot or over.read_off_plot})


def _yaml_text(value: Any) -> str:
    """A value as ``--set`` reads it back (JSON is YAML)."""
    return json.dumps(value)


# --- error messages --------------------------------------------------------------------------


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model class inside a (possibly Optional, list or dict) annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):  # Optional, list and dict members
        if (found := _model_of(arg)) is not None:
            return found
    return None


def _describe(error: Mapping[str, Any], raw: dict[str, Any]) -> str:
    """One line: the field path (a point by its id where it has one) and what is allowed."""
    path: list[str] = []
    owner: type[BaseModel] | None = MeasurementFile
    node: Any = raw
    loc = list(error["loc"])
    for i, part in enumerate(loc):
        if isinstance(part, int):
            item = node[part] if isinstance(node, list) and part < len(node) else None
            label = item.get("id") if isinstance(item, dict) else None
            named = isinstance(label, str) and re.fullmatch(ID_PATTERN, label)
            path.append(label if named else f"[{part}]")  # type: ignore[arg-type]
            node = item
            continue
        path.append(str(part))
        node = node.get(part) if isinstance(node, dict) else None
        if i < len(loc) - 1 and owner is not None and str(part) in owner.model_fields:
            owner = _model_of(owner.model_fields[str(part)].annotation)
    field = ".".join(path).replace(".[", "[")
    message = str(error["msg"]).removeprefix("Value error, ")
    if not field:  # a rule across the file names its fields itself
        return message
    if error["type"] == "extra_forbidden":
        allowed = ", ".join(owner.model_fields) if owner else "none"
        return f"{field}: unknown key (allowed: {allowed})"
    if error["type"] != "missing" and not isinstance(error.get("input"), (dict, list)):
        return f"{field}: {message} (got {reprlib.repr(error.get('input'))})"
    return f"{field}: {message}"
