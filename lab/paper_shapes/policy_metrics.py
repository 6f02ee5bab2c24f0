"""Section 3.3: prefix hit rate and per-step latency per system, against paper §6.4 (Figs. 5 and 10)."""

from __future__ import annotations

from collections.abc import Sequence

from lab.paper_shapes.directions import ratio_note, trend_note
from lab.paper_shapes.execution import Results
from lab.paper_shapes.measured import Measured
from lab.paper_shapes.ordering import check_order
from lab.paper_shapes.paper import PAPER_NAMES, SERVING_POLICIES, ServingCase
from lab.paper_shapes.reasons import cliff_reason, latency_ratio_reason, resident_reason
from lab.paper_shapes.tables import Report, Table, num, pct, times
from tasim.validation.published.measurement_file import Published


def policy_metrics_section(results: Results, points: Sequence[int], case: ServingCase, report: Report) -> None:
    """§6.4 for one preset: prefix hit rate per system (Fig. 5) and per-step latency at the
    largest concurrency (Fig. 10), with the paper's trends and orderings checked."""
    m = Measured(results, case.preset)
    table = Table(("workflows", "system", "metric"))
    hits = {k: v for k, v in case.hit_rates.items() if k[1] in points}
    for (policy, c), paper in sorted(hits.items(), key=lambda kv: (kv[0][1], SERVING_POLICIES.index(kv[0][0]))):
        table.add([str(c), PAPER_NAMES[policy], m.hit_label], paper, m.hit(policy, c), pct, " %")
    top = points[-1]
    for policy, paper in case.latency.items():
        labels = [str(top), PAPER_NAMES[policy]]
        table.add([*labels, "per-step latency (LLM call + tool)"], paper, m.turn_latency(policy, top), num, " s")
        table.add([*labels, "LLM-call latency (`e2e_s` mean)"], paper, m.call_latency(policy, top), num, " s")
    # the latency-ratio miss goes below the hit-rate checks, which follow the table
    latency_miss: tuple[str, str] | None = None
    if case.latency_ratio is not None:
        latency_ratio = m.turn_latency("thunderagent", top) / m.turn_latency("round_robin", top)
        note, ok = ratio_note(case.latency_ratio.value, latency_ratio)
        table.add([str(top), "ThunderAgent / vLLM", "per-step latency"], case.latency_ratio, latency_ratio, times, note=note)
        if not ok:
            latency_miss = (
                f"{case.preset}: ThunderAgent's per-step latency is {latency_ratio:.2f}× vLLM's at {top} "
                f"workflows (paper {case.latency_ratio.value:.2f}×)",
                latency_ratio_reason(m, top),
            )
    report.add(f"#### {case.title} (`{case.preset}.yaml`)", "", *table.markdown())
    hit_rate_checks(m, points, hits, report)
    if latency_miss is not None:
        report.miss(*latency_miss)
    report.add("")


def hit_rate_checks(m: Measured, points: Sequence[int], hits: dict[tuple[str, int], Published], report: Report) -> None:
    """The paper's hit-rate ordering at the largest point and each system's trend across the sweep."""
    low, top = points[0], points[-1]
    at_top = {p: hits[(p, top)].value for p in SERVING_POLICIES if (p, top) in hits}
    if len(at_top) == len(SERVING_POLICIES):
        check_order(m, top, at_top, {p: m.hit(p, top) for p in at_top}, hits=True, report=report)
    for policy in SERVING_POLICIES:
        if (policy, low) not in hits or (policy, top) not in hits:
            continue
        paper = (hits[(policy, low)].value, hits[(policy, top)].value)
        note, ok = trend_note(paper, (m.hit(policy, low), m.hit(policy, top)), points=True)
        if ok:
            report.add(f"- {PAPER_NAMES[policy]} hit rate {low}→{top} workflows: {note}.")
        else:
            above = policy == "thunderagent" and m.hit(policy, top) > paper[1]
            reason = resident_reason(m, top) + "." if above else cliff_reason(m, policy, low, top)
            report.miss(f"{m.preset}, {PAPER_NAMES[policy]} hit rate {low}→{top} workflows: {note}", reason)
