"""How a point and its values are written, alike in the terminal table, the document and the
plots: what it measures in words, published and tasim values in the metric's units (ratios as
×), and the x position of a point on a sweep."""

from __future__ import annotations

from pathlib import Path

from tasim.validation.published.measurement_file import Measurements, Point, Side
from tasim.validation.published.quantities import METRICS

BAND = 0.2  # the ±20 % around a published value that tables count and plots shade, and calibration aims for


def is_ratio(point: Point) -> bool:
    return point.over is not None


def value_text(point: Point, value: float) -> str:
    if is_ratio(point):
        return f"{value:.2f}×"
    return METRICS[point.metric].text(value)


def published_text(point: Point) -> str:
    published = point.published
    if is_ratio(point):
        return published.text(lambda v: f"{v:.2f}", "×")
    metric = METRICS[point.metric]
    return published.text(lambda v: format(v, metric.spec), metric.unit)


def ratio_text(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}"


def _setting(side: Side) -> str:
    """``max_concurrency=384``: each key by its last part, which says what it is."""
    return ", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in sorted(side.set.items()))


def _with_setting(side: Side) -> str:
    return f"{side.system} ({_setting(side)})" if side.set else side.system


def describe(m: Measurements, point: Point) -> str:
    """E.g. ``ThunderAgent / Global LB, rollout tokens/s, max_concurrency=384``, prefixed with
    the preset where the file's points run on several."""
    label = METRICS[point.metric].label
    of, over = point.of, point.over
    if over is None:
        text = ", ".join(filter(None, (of.system, label, _setting(of))))
    elif over.set == of.set:
        text = ", ".join(filter(None, (f"{of.system} / {over.system}", label, _setting(of))))
    elif over.system == of.system:
        common = {k: v for k, v in of.set.items() if k in over.set and over.set[k] == v}
        # a side with nothing of its own is the preset as it stands
        differ = [_setting(Side(system=s.system, set={k: v for k, v in s.set.items() if k not in common})) or "the preset" for s in (of, over)]
        text = ", ".join(filter(None, (of.system, label, _setting(Side(system=of.system, set=common)), " / ".join(differ))))
    else:
        text = f"{_with_setting(of)} / {_with_setting(over)}, {label}"
    if len({p.scenario for p in m.points}) > 1:
        text = f"{Path(m.scenario_of(point)).stem}: {text}"
    return text


def sweep_x(point: Point) -> tuple[str, float] | None:
    """The point's place on a sweep: its one numeric scenario override (a ratio's `of` side),
    or None when it has none or several. A seed is no sweep: its values are repeats."""
    numbers = [
        (key, value) for key, value in point.of.set.items() if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "seed"
    ]
    return (numbers[0][0], float(numbers[0][1])) if len(numbers) == 1 and len(point.of.set) == 1 else None
