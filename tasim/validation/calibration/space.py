"""What a calibration may change: numeric scenario fields with a range each (``--fit``), in the
search space `tasim tune` takes too (`tasim.tools.search`)."""

from __future__ import annotations

from collections.abc import Sequence

from tasim.config.scenario import Scenario
from tasim.core.errors import UsageError
from tasim.tools import search
from tasim.tools.search import Dimension, field_value
from tasim.validation.calibration import CalibrationError


def parse_space(texts: Sequence[str], scenario: Scenario) -> tuple[Dimension, ...]:
    """``--fit`` values (repeatable, each comma-separated) as ranges of ``scenario``'s numeric
    fields, each key once."""
    try:
        return tuple(_numeric(dimension, scenario) for dimension in search.parse_space(texts, "--fit"))
    except UsageError as error:
        raise CalibrationError(str(error)) from None


def _numeric(dimension: Dimension, scenario: Scenario) -> Dimension:
    if dimension.choices:
        raise CalibrationError(f"--fit {dimension.text}: a calibration fits numbers (key=LOW:HIGH), not choices")
    value = field_value(scenario, dimension.key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        shown = "nothing" if value is None else f"{type(value).__name__} {str(value)[:60]}"
        raise CalibrationError(
            f"--fit {dimension.key}: not a number in {scenario.name} (it holds {shown}); fit a numeric field, "
            "e.g. workload.turns.median for a distribution"
        )
    return search.bound(dimension, scenario, "--fit")
