"""``tasim validate dynamo``: one workload through Dynamo's replay and through tasim, per router,
and the table of their metrics side by side."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rich.table import Table

from tasim.scenario import Scenario
from tasim.validation.dynamo_replay import Router, engine_args, run_dynamo
from tasim.validation.measures import METRICS, Difference, all_within, differences, summarize
from tasim.validation.tasim_replay import run_tasim
from tasim.validation.workload_trace import ReplayTrace, replay_trace

VALIDATION_FILE = "validation.json"


@dataclass(frozen=True, slots=True)
class RouterResult:
    router: Router
    dynamo: dict[str, float]
    tasim: dict[str, float]
    dynamo_incomplete: int
    tasim_incomplete: int

    @property
    def differences(self) -> list[Difference]:
        return differences(self.dynamo, self.tasim)


def validate(scenario: Scenario, out: Path, routers: Sequence[Router]) -> tuple[ReplayTrace, list[RouterResult]]:
    trace = replay_trace(scenario, out.resolve())
    results = []
    for router in routers:
        dynamo_records, dynamo_incomplete, dynamo_wall = run_dynamo(trace, scenario.cluster, router)
        tasim_records, tasim_incomplete, tasim_wall = run_tasim(scenario, trace, router)
        results.append(
            RouterResult(
                router,
                summarize(dynamo_records, dynamo_wall),
                summarize(tasim_records, tasim_wall),
                dynamo_incomplete,
                tasim_incomplete,
            )
        )
    return trace, results


def validation_record(scenario: Scenario, trace: ReplayTrace, results: Sequence[RouterResult]) -> dict[str, Any]:
    return {
        "scenario": scenario.name,
        "trace": {"path": str(trace.path), "trace_block_size": trace.trace_block_size, "requests": trace.requests},
        "workers": scenario.cluster.backends,
        "engine": engine_args(scenario.cluster)["engine"],
        "tolerances": {m.key: m.tolerance for m in METRICS if m.tolerance is not None},
        "routers": [
            {
                "router": r.router,
                "dynamo": r.dynamo,
                "tasim": r.tasim,
                "incomplete": {"dynamo": r.dynamo_incomplete, "tasim": r.tasim_incomplete},
                "difference": {d.metric.key: d.value for d in r.differences},
                "within_tolerance": all_within(r.differences),
            }
            for r in results
        ],
    }


def validation_table(results: Sequence[RouterResult]) -> Table:
    table = Table(title="tasim against Dynamo's replay (difference: tasim − Dynamo)", title_justify="left")
    table.add_column("metric")
    for r in results:
        table.add_column(f"{r.router}\nDynamo", justify="right")
        table.add_column(f"{r.router}\ntasim", justify="right")
        table.add_column(f"{r.router}\ndifference", justify="right")
    for i, metric in enumerate(METRICS):
        cells = [f"{metric.label} ({metric.unit})"]
        for r in results:
            diff = r.differences[i]
            mark = {True: " ✓", False: " ✗", None: ""}[diff.within]
            cells += [_number(diff.dynamo, metric.key), _number(diff.tasim, metric.key), diff.shown() + mark]
        table.add_row(*cells)
    table.add_row("requests completed", *[
        cell for r in results for cell in (
            f"{r.dynamo['requests']:.0f} (+{r.dynamo_incomplete} not)" if r.dynamo_incomplete else f"{r.dynamo['requests']:.0f}",
            f"{r.tasim['requests']:.0f} (+{r.tasim_incomplete} not)" if r.tasim_incomplete else f"{r.tasim['requests']:.0f}",
            "",
        )
    ])
    return table


def _number(value: float, key: str) -> str:
    if key == "prefix_reuse":
        return f"{value:.4f}"
    if key == "wall_s":
        return f"{value:.2f}"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3f}"
