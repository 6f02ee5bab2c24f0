"""Section 3.2: serving throughput against concurrency per preset, against paper Fig. 4."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lab.paper_shapes.directions import ratio_note, trend_note
from lab.paper_shapes.execution import Results
from lab.paper_shapes.measured import Measured
from lab.paper_shapes.ordering import check_order
from lab.paper_shapes.paper import PAPER_NAMES, SERVING_POLICIES, ServingCase
from lab.paper_shapes.reasons import trend_reason
from lab.paper_shapes.tables import Report, Table, num, times
from tasim.validation.published.measurement_file import Published


@dataclass(frozen=True)
class Trend:
    """One system's throughput from the run point ``prev`` to ``c``, both with a paper value."""

    policy: str
    prev: int
    c: int
    paper: tuple[float, float]
    note: str
    ok: bool


def _previous(points: Sequence[int], c: int, paper: dict[int, Published]) -> int | None:
    """The run point before ``c`` that also has a paper value (a trend needs both ends)."""
    earlier = [p for p in points if p < c and p in paper]
    return earlier[-1] if earlier else None


def trends(m: Measured, case: ServingCase, points: Sequence[int]) -> list[Trend]:
    """Every system's trends between consecutive paper points, system by system."""
    found: list[Trend] = []
    for policy in SERVING_POLICIES:
        paper = case.throughput[policy]
        for c in points:
            prev = _previous(points, c, paper)
            if c not in paper or prev is None:
                continue
            ends = (paper[prev].value, paper[c].value)
            note, ok = trend_note(ends, (m.steps(policy, prev), m.steps(policy, c)))
            found.append(Trend(policy, prev, c, ends, note, ok))
    return found


def throughput_section(results: Results, case: ServingCase, points: Sequence[int], plots: str, report: Report) -> None:
    """Paper Fig. 4 for one preset: steps/min per system where the paper gives a value, the
    trend between the paper's points, the labelled ratios vs vLLM and the ordering of systems."""
    m = Measured(results, case.preset)
    case_trends = trends(m, case, points)
    trend_at = {(t.policy, t.c): t for t in case_trends}
    table = Table(("workflows", "system"))
    for c in points:
        for policy in SERVING_POLICIES:
            paper = case.throughput[policy]
            if c not in paper:
                continue
            trend = trend_at.get((policy, c))
            note = "" if trend is None else f"{trend.prev}→{c}: {trend.note}"
            table.add([str(c), PAPER_NAMES[policy]], paper[c], m.steps(policy, c), num, note=note)
    top = points[-1]
    for policy, labelled in case.ratios.items():
        # a ratio on the wrong side of 1 is an ordering miss, reported with the ordering below
        ratio = m.steps(policy, top) / m.steps("round_robin", top)
        table.add([str(top), f"{PAPER_NAMES[policy]} / vLLM"], labelled, ratio, times, note=ratio_note(labelled.value, ratio)[0])
    curves = "; ".join(f"{PAPER_NAMES[p]} " + " / ".join(f"{m.steps(p, c):.1f}" for c in points) for p in SERVING_POLICIES)
    report.add(
        f"#### {case.title} (`{case.preset}.yaml`)",
        "",
        *table.markdown(),
        f"tasim at every point ({'/'.join(map(str, points))} workflows, calls/min): {curves}.",
        "",
        f"![throughput against concurrency, {case.preset}]({plots}/throughput-{case.preset}.png)",
        "",
    )
    throughput_checks(m, case, points, case_trends, report)
    report.add("")


def throughput_checks(m: Measured, case: ServingCase, points: Sequence[int], case_trends: Sequence[Trend], report: Report) -> None:
    """The ordering of systems at every point with three paper values, and each system's trend
    between the paper's points: each miss with its likely reason."""
    for c in points:
        if not all(c in case.throughput[p] for p in SERVING_POLICIES):
            continue
        paper = {p: case.throughput[p][c].value for p in SERVING_POLICIES}
        check_order(m, c, paper, {p: m.steps(p, c) for p in SERVING_POLICIES}, hits=False, report=report)
    for t in case_trends:
        if not t.ok:
            report.miss(
                f"{case.preset}, {PAPER_NAMES[t.policy]} throughput {t.prev}→{t.c} workflows: {t.note}",
                trend_reason(m, t.policy, t.paper, t.prev, t.c),
            )
