"""What a calibration may change: scenario fields with a range each (``--fit``)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tasim.calibration import CalibrationError
from tasim.policy_spec import split_outside_brackets
from tasim.scenario import Scenario

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True, slots=True)
class Knob:
    """One scenario field searched over ``[low, high]``, on a log scale with ``:log`` (for
    factors spanning orders of magnitude); in integers when the field holds an integer."""

    key: str
    low: float
    high: float
    integer: bool = False
    log: bool = False

    @classmethod
    def parse(cls, text: str) -> Knob:
        key, sep, bounds = text.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise CalibrationError(f"--fit {text!r}: expected dotted.key=LOW:HIGH or dotted.key=LOW:HIGH:log")
        parts = bounds.strip().split(":")
        log = len(parts) == 3 and parts[2] == "log"
        if len(parts) not in (2, 3) or (len(parts) == 3 and not log):
            raise CalibrationError(f"--fit {text!r}: expected LOW:HIGH or LOW:HIGH:log after {key}=")
        try:
            low, high = (float(part) for part in parts[:2])
        except ValueError:
            raise CalibrationError(f"--fit {text!r}: LOW and HIGH must be numbers") from None
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise CalibrationError(f"--fit {text!r}: needs finite LOW < HIGH (got {parts[0]}:{parts[1]})")
        if log and low <= 0:
            raise CalibrationError(f"--fit {text!r}: a log scale needs LOW > 0")
        return cls(key, low, high, False, log)

    @property
    def text(self) -> str:
        bounds = f"{int(self.low)}:{int(self.high)}" if self.integer else f"{self.low:g}:{self.high:g}"
        return f"{self.key}={bounds}{':log' if self.log else ''}"

    def override(self, value: float) -> str:
        return f"{self.key}={int(value) if self.integer else repr(float(value))}"


def parse_space(texts: Sequence[str], scenario: Scenario) -> tuple[Knob, ...]:
    """``--fit`` values (repeatable, each comma-separated) as knobs of ``scenario``'s numeric
    fields, each key once."""
    knobs = [Knob.parse(part) for text in texts for part in split_outside_brackets(text) if part.strip()]
    if not knobs:
        raise CalibrationError("--fit: name at least one dotted.key=LOW:HIGH")
    keys = [knob.key for knob in knobs]
    for key in keys:
        if keys.count(key) > 1:
            raise CalibrationError(f"--fit {key}: given twice")
    for knob in knobs:
        inside = [other.key for other in knobs if other.key.startswith(knob.key + ".")]
        if inside:
            raise CalibrationError(f"--fit {knob.key}: {inside[0]} lies inside it (fit one of them)")
    return tuple(_bound(knob, scenario) for knob in knobs)


def field_value(scenario: Scenario, key: str) -> Any:
    """The value at a dotted key of the scenario, or None; a fixed distribution is its value
    (a file writes it as a plain number, and a number is what a knob sets)."""
    node: Any = scenario.model_dump(mode="json")
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and node.get("kind") == "fixed":
        return node["value"]
    return node


def _bound(knob: Knob, scenario: Scenario) -> Knob:
    value = field_value(scenario, knob.key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        shown = "nothing" if value is None else f"{type(value).__name__} {str(value)[:60]}"
        raise CalibrationError(
            f"--fit {knob.key}: not a number in {scenario.name} (it holds {shown}); fit a numeric field, "
            "e.g. workload.turns.median for a distribution"
        )
    if isinstance(value, int) and not (knob.low.is_integer() and knob.high.is_integer()):
        raise CalibrationError(f"--fit {knob.text}: {knob.key} is an integer; give integer bounds")
    return replace(knob, integer=isinstance(value, int))
