"""``tasim validate dynamo``: one workload through Dynamo's replay and through tasim, per router,
and the table of their metrics side by side."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from tasim.config.scenario import Scenario, with_engine_flavour
from tasim.validation.dynamo_replay import Router, engine_args, run_dynamo
from tasim.validation.measures import METRICS, Difference, Metric, all_within, differences, summarize
from tasim.validation.tasim_replay import run_tasim
from tasim.validation.workload_trace import ReplayTrace, replay_trace

VALIDATION_FILE = "validation.json"


# Dynamo's KV router breaks cost ties at random with an unseeded generator, so its results vary
# from run to run (prefix reuse by up to 5 pp on 8 workers); round-robin is deterministic.
RANDOMIZED_ROUTERS = frozenset({"kv_router"})


@dataclass(frozen=True, slots=True)
class RouterResult:
    """Per-run summaries of each side; compared by their means."""

    router: Router
    dynamo_runs: list[dict[str, float]]
    tasim_runs: list[dict[str, float]]
    dynamo_incomplete: int
    tasim_incomplete: int

    @property
    def dynamo(self) -> dict[str, float]:
        return _mean(self.dynamo_runs)

    @property
    def tasim(self) -> dict[str, float]:
        return _mean(self.tasim_runs)

    @property
    def differences(self) -> list[Difference]:
        return differences(self.dynamo, self.tasim, self.dynamo_runs, self.tasim_runs)


def _mean(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    return {key: sum(run[key] for run in runs) / len(runs) for key in runs[0]}


def validate(scenario: Scenario, out: Path, routers: Sequence[Router], repeats: int = 3) -> tuple[ReplayTrace, list[RouterResult]]:
    """Replay on both sides; randomized routers ``repeats`` times each (tasim with seeds
    ``seed``, ``seed + 1``, ...), deterministic ones once. tasim's engine runs as the mocker's
    flavour, and its host tier, if any, with the mocker's semantics: what Dynamo's replay simulates."""
    scenario = with_mocker_host_tier(with_engine_flavour(scenario, "mocker"))
    trace = replay_trace(scenario, out.resolve())
    results = []
    for router in routers:
        dynamo_runs, tasim_runs = [], []
        for i in range(repeats if router in RANDOMIZED_ROUTERS else 1):
            records, dynamo_incomplete, wall = run_dynamo(trace, scenario.cluster, router)
            dynamo_runs.append(summarize(records, wall))
            seeded = scenario.model_copy(update={"seed": scenario.seed + i})
            records, tasim_incomplete, wall = run_tasim(seeded, trace, router)
            tasim_runs.append(summarize(records, wall))
        results.append(RouterResult(router, dynamo_runs, tasim_runs, dynamo_incomplete, tasim_incomplete))
    return trace, results


def with_mocker_host_tier(scenario: Scenario) -> Scenario:
    """The scenario with its host tier, if it has one, as Dynamo's mocker models it: the
    ``dynamo_mocker`` semantics, every offered block stored."""
    engine = scenario.cluster.engine
    if engine.host_tier is None:
        return scenario
    tier = engine.host_tier.model_copy(update={"semantics": "dynamo_mocker", "store_threshold": 0})
    cluster = scenario.cluster.model_copy(update={"engine": engine.model_copy(update={"host_tier": tier})})
    return scenario.model_copy(update={"cluster": cluster})


def validation_record(scenario: Scenario, trace: ReplayTrace, results: Sequence[RouterResult]) -> dict[str, Any]:
    return {
        "scenario": scenario.name,
        "trace": {
            "path": str(trace.path),
            "trace_block_size": trace.trace_block_size,
            "requests": trace.requests,
            "excluded_too_large": trace.excluded,
        },
        "workers": scenario.cluster.backends,
        "engine": engine_args(scenario.cluster)["engine"],
        "tolerances": {m.key: m.tolerance for m in METRICS if m.tolerance is not None},
        "routers": [_router_record(r) for r in results],
    }


def _router_record(result: RouterResult) -> dict[str, Any]:
    diffs = result.differences
    return {
        "router": result.router,
        "runs": len(result.dynamo_runs),
        "dynamo": result.dynamo,
        "tasim": result.tasim,
        "dynamo_runs": result.dynamo_runs,
        "tasim_runs": result.tasim_runs,
        "incomplete": {"dynamo": result.dynamo_incomplete, "tasim": result.tasim_incomplete},
        "difference": {d.metric.key: d.value for d in diffs},
        "within_tolerance": all_within(diffs),
    }


def validation_table(results: Sequence[RouterResult]) -> Table:
    table = Table(title="tasim against Dynamo's replay (difference: tasim − Dynamo)", title_justify="left")
    table.add_column("metric")
    for r in results:
        runs = f" ({len(r.dynamo_runs)}-run mean)" if len(r.dynamo_runs) > 1 else ""
        table.add_column(f"{r.router}{runs}\nDynamo", justify="right")
        table.add_column(f"{r.router}\ntasim", justify="right")
        table.add_column(f"{r.router}\ndifference", justify="right")
    per_router = [r.differences for r in results]
    for i, metric in enumerate(METRICS):
        cells = [f"{metric.label} ({metric.unit})"]
        for diffs in per_router:
            diff = diffs[i]
            mark = {True: " ✓", False: " ✗", None: ""}[diff.within]
            cells += [_number(diff.dynamo, metric), _number(diff.tasim, metric), diff.shown() + mark]
        table.add_row(*cells)
    table.add_row(
        "requests completed",
        *[
            cell
            for r in results
            for cell in (
                f"{r.dynamo['requests']:.0f} (+{r.dynamo_incomplete} not)" if r.dynamo_incomplete else f"{r.dynamo['requests']:.0f}",
                f"{r.tasim['requests']:.0f} (+{r.tasim_incomplete} not)" if r.tasim_incomplete else f"{r.tasim['requests']:.0f}",
                "",
            )
        ],
    )
    return table


def _number(value: float, metric: Metric) -> str:
    if metric.unit == "ratio":
        return f"{value:.4f}"
    if metric.unit == "s":
        return f"{value:.2f}"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3f}"
