"""Section 3.1: KV thrashing of plain vLLM against paper Fig. 1b."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from lab.paper_shapes.directions import trend_note
from lab.paper_shapes.execution import Results
from lab.paper_shapes.measured import Measured
from lab.paper_shapes.paper import (
    THRASHING_E2E,
    THRASHING_HIT,
    THRASHING_INFLATION,
    THRASHING_PRESET,
    serving_case,
)
from lab.paper_shapes.reasons import cliff_reason, little_reason
from lab.paper_shapes.tables import Report, Table, num, pct, times


def thrashing_section(results: Results, points: Sequence[int], plots: str, report: Report) -> None:
    """Paper Fig. 1b: plain vLLM's hit rate and per-step latency as concurrency outgrows the pool."""
    m = Measured(results, THRASHING_PRESET)
    vllm = serving_case(THRASHING_PRESET).throughput["round_robin"]
    hit = partial(m.hit, "round_robin")
    per_step = partial(m.turn_latency, "round_robin")
    per_call = partial(m.call_latency, "round_robin")
    metrics = (
        (m.hit_label, THRASHING_HIT, hit, pct, " %"),
        ("per-step latency (LLM call + tool)", THRASHING_E2E, per_step, num, " s"),
        ("LLM-call latency (`e2e_s` mean)", THRASHING_E2E, per_call, num, " s"),
    )
    table = Table(("workflows", "metric"))
    found: list[tuple[str, str]] = []
    for i, c in enumerate(points):
        for label, paper, measure, fmt, unit in metrics:
            note = ""
            if i:
                prev = points[i - 1]
                hit_rate = paper is THRASHING_HIT
                note, ok = trend_note((paper[prev].value, paper[c].value), (measure(prev), measure(c)), points=hit_rate)
                note = f"{prev}→{c}: {note}"
                if not ok:
                    reason = cliff_reason(m, "round_robin", prev, c) if hit_rate else little_reason(m, prev, c, vllm, THRASHING_E2E)
                    found.append((f"thrashing, {label}, {note}", reason))
            table.add([str(c), label], paper[c], measure(c), fmt, unit, note)
    for label, measure in (("per step", per_step), ("LLM call", per_call)):
        table.add(
            [f"{points[-1]} vs {points[0]}", f"latency inflation, {label}"],
            THRASHING_INFLATION,
            max(measure(c) for c in points) / measure(points[0]),
            times,
            note='paper: "up to 7.14×" (highest over lowest concurrency)',
        )
    report.add(
        "### 3.1 KV thrashing of plain vLLM (paper Fig. 1b)",
        "",
        f"`round_robin` on `{THRASHING_PRESET}.yaml`, one backend (every per-request router routes alike there). The paper's "
        "per-step E2E latency covers one step, a reasoning plus acting period. No summary key holds that: `e2e_s` "
        "runs from an LLM call's arrival to its finish and leaves the tool out. So the suite folds the per-step "
        "latency from the event log: from an LLM call's arrival to the arrival of the program's next call (tool "
        "and any hold included; a program's last call ends at its finish), over steps ending in the window. "
        "`e2e_s` is listed against the same paper value for reference. Hit-rate trends are compared in "
        f"percentage points. KV pool {m.pool()} tokens; offered working set "
        + ", ".join(f"{m.working_set('round_robin', c):.2f}× the pool at {c}" for c in points)
        + ".",
        "",
        *table.markdown(),
        f"![prefix hit rate and per-step latency against concurrency]({plots}/thrashing.png)",
        "",
    )
    for what, reason in found:
        report.miss(what, reason)
    report.add("")
