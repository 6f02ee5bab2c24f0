"""``tasim compare``: one scenario under several policies, optionally over one swept field.

Every (sweep value × policy) combination is validated before anything runs, so a typo in the
last value does not cost the earlier runs. Runs are independent and deterministic, so they go
to a process pool and the results do not depend on how many run at once. Plots live in
`tasim.plots`, imported only when wanted, so this module stays free of matplotlib.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from tasim.cli import UsageError
from tasim.metrics import summary_value
from tasim.parallel import map_in_processes
from tasim.rundir import run_simulation
from tasim.policies import POLICIES
from tasim.scenario import Scenario, ScenarioError, apply_override, load_scenario

RUNS_DIR = "runs"
COMPARE_FILE = "compare.json"

# (header, path into the summary, format): short two-line headers and fixed precision keep the
# table inside an 80-column terminal; compare.json has exact values
Column = tuple[str, tuple[str, ...], str]
CACHE_COLUMNS: tuple[Column, ...] = (
    ("prefix\nhit", ("prefix_hit_rate",), ".3f"),
    ("pre-\nempts", ("preemptions",), ","),
    ("pauses", ("pauses",), ","),
    ("working\nset", ("working_set_ratio",), ".3f"),
)
SERVING_COLUMNS: tuple[Column, ...] = (
    ("steps/\nmin", ("steps_per_min",), ",.1f"),
    ("output\ntok/s", ("output_tokens_per_s",), ",.1f"),
    CACHE_COLUMNS[0],
    ("TTFT\nmean s", ("ttft_s", "mean"), ",.3f"),
    ("e2e\nmean s", ("e2e_s", "mean"), ",.2f"),
    *CACHE_COLUMNS[1:],
)
# an RL engineer judges a rollout by the training step it costs, not by per-call latency
ROLLOUT_COLUMNS: tuple[Column, ...] = (
    ("rollout\ntok/s", ("rollout", "rollout_tokens_per_s"), ",.1f"),
    ("step\nmean s", ("rollout", "step_time_s", "mean"), ",.0f"),
    ("strag-\ngler", ("rollout", "straggler_share"), ".3f"),
    *CACHE_COLUMNS,
)


@dataclass(frozen=True)
class Sweep:
    """One swept scenario field: ``texts`` as the user wrote them, ``values`` parsed as YAML."""

    key: str
    texts: tuple[str, ...]
    values: tuple[Any, ...]

    @property
    def numeric(self) -> bool:
        # bool is an int subclass, but true/false are categories, not points on an axis
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values)


@dataclass(frozen=True)
class Run:
    """One combination: ``point`` is {sweep key: value}, empty without a sweep."""

    policy: str
    point: dict[str, Any]
    label: str
    scenario: Scenario


@dataclass(frozen=True)
class Plan:
    policies: tuple[str, ...]
    sweep: Sweep | None
    runs: tuple[Run, ...]

    @property
    def scenario(self) -> Scenario:
        return self.runs[0].scenario

    @property
    def rollouts(self) -> bool:
        """RL rollout steps: judged by rollout throughput and step time, in table and plots."""
        return self.scenario.workload.kind == "rl_rollout"

    def last_point(self) -> list[Run]:
        """The runs at the last sweep point (the largest, for numbers), one per policy."""
        return list(self.runs[-len(self.policies):])


# --- parsing and validation ------------------------------------------------------------------


def parse_policies(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    allowed = ", ".join(sorted(POLICIES))
    for name in names:
        if name not in POLICIES:
            raise UsageError(f"--policies: unknown policy {name!r} (allowed: {allowed})")
    if len(set(names)) != len(names):
        raise UsageError(f"--policies {text}: a policy is named twice")
    return names


def _split_values(text: str) -> list[str]:
    """Split on commas outside brackets, so a value may be a YAML flow list or mapping."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part.strip() for part in parts]


def _parse_value(text: str) -> Any:
    """The value exactly as `load_scenario` will see it (same YAML parsing as --set)."""
    probe: dict[str, Any] = {}
    apply_override(probe, f"value={text}")
    return probe["value"]


def parse_sweep(text: str) -> Sweep:
    key, sep, values_text = text.partition("=")
    key = key.strip()
    if not sep or not key or not values_text.strip():
        raise UsageError(f"--sweep {text!r}: expected dotted.key=v1,v2,...")
    if key in ("policy", "policy.name"):
        raise UsageError(f"--sweep {key}: policies come from --policies (policy.params.<name> may be swept)")
    texts = _split_values(values_text)
    if "" in texts:
        raise UsageError(f"--sweep {text!r}: empty value (expected dotted.key=v1,v2,...)")
    values = [_parse_value(t) for t in texts]
    if any(values.count(v) > 1 for v in values):
        raise UsageError(f"--sweep {text!r}: a value is given twice")
    sweep = Sweep(key, tuple(texts), tuple(values))
    if sweep.numeric:  # numbers are points on an axis: run, tabulate and plot them in order
        order = sorted(range(len(values)), key=lambda i: values[i])
        sweep = Sweep(key, tuple(texts[i] for i in order), tuple(values[i] for i in order))
    return sweep


def check_overrides(overrides: Sequence[str]) -> None:
    """compare replaces the policy and its params per run, so a --set on them would be lost."""
    for assignment in overrides:
        if assignment.partition("=")[0].strip().split(".")[0] == "policy":
            raise UsageError(f"--set {assignment}: policies come from --policies (sweep policy.params.<name> instead)")


def _label(policy: str, key: str, text: str) -> str:
    # directory-safe: the value text may hold YAML punctuation or slashes
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", f"{policy}-{key}={text}")


def _policy_overrides(overrides: Sequence[str], policy: str) -> list[str]:
    return [*overrides, f"policy.name={policy}", "policy.params={}"]


def _sweep_run(path: str, overrides: Sequence[str], policy: str, sweep: Sweep, text: str, value: Any) -> Run:
    try:
        scenario = load_scenario(path, [*_policy_overrides(overrides, policy), f"{sweep.key}={text}"])
    except ScenarioError as exc:
        raise UsageError(f"--sweep {sweep.key}={text}: {exc}") from None
    return Run(policy, {sweep.key: value}, _label(policy, sweep.key, text), scenario)


def plan_runs(path: str, policies: Sequence[str], sweep: Sweep | None, overrides: Sequence[str]) -> Plan:
    """Load and validate every combination; raises ScenarioError/UsageError before any run."""
    # loaded without the sweep first, so an error here is the file's, --set's or the policy's
    base = [Run(policy, {}, policy, load_scenario(path, _policy_overrides(overrides, policy))) for policy in policies]
    if sweep is None:
        return Plan(tuple(policies), None, tuple(base))
    runs = tuple(
        _sweep_run(path, overrides, policy, sweep, text, value)
        for text, value in zip(sweep.texts, sweep.values)
        for policy in policies
    )
    if len({run.label for run in runs}) != len(runs):
        raise UsageError(f"--sweep {sweep.key}: two values give the same run directory name")
    return Plan(tuple(policies), sweep, runs)


def default_jobs(plan: Plan) -> int:
    return min(os.cpu_count() or 1, len(plan.runs))


# --- running ---------------------------------------------------------------------------------


def execute(plan: Plan, out: Path, jobs: int, on_done: Callable[[Run, dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Run every combination into ``out/runs/<label>``; summaries come back in plan order."""
    return map_in_processes(partial(_simulate, out / RUNS_DIR), plan.runs, jobs, on_done)


def _simulate(runs_dir: Path, run: Run) -> dict[str, Any]:
    return run_simulation(run.scenario, runs_dir / run.label)


def records(plan: Plan, summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """What compare.json holds, in plan order (sweep value, then policy as given)."""
    return [
        {"policy": run.policy, "overrides": run.point, "summary": summary} for run, summary in zip(plan.runs, summaries)
    ]


# --- output ----------------------------------------------------------------------------------


def _cell(summary: dict[str, Any], path: tuple[str, ...], spec: str) -> str:
    value = summary_value(summary, path)
    return "-" if value is None else format(value, spec)  # None: no request completed in the window


def _title(plan: Plan) -> str:
    scenario, swept = plan.scenario, plan.sweep.key if plan.sweep else None
    parts = [scenario.name]
    # seed and duration are the same in every run unless they are what is swept
    if swept != "seed":
        parts.append(f"seed {scenario.seed}")
    if swept != "duration_s":
        parts.append(f"{scenario.duration_s:g} simulated s")
    return " · ".join(parts + ([f"sweep {swept}"] if swept else []))


def comparison_table(plan: Plan, summaries: Sequence[dict[str, Any]]) -> Table:
    """Rows grouped by sweep point (one section each), then policy as given."""
    table = Table(title=_title(plan), box=box.SIMPLE_HEAD, collapse_padding=True, show_edge=False)
    if plan.sweep:
        # the full key is in the title; its last part, split into words, wraps in a narrow column
        table.add_column(plan.sweep.key.rsplit(".", 1)[-1].replace("_", " "), justify="right", overflow="ellipsis")
    table.add_column("policy", style="bold", no_wrap=True)
    columns = ROLLOUT_COLUMNS if plan.rollouts else SERVING_COLUMNS
    for header, *_ in columns:
        table.add_column(header, justify="right", overflow="fold")
    for i, (run, summary) in enumerate(zip(plan.runs, summaries)):
        point_index, policy_index = divmod(i, len(plan.policies))
        point = [Text(plan.sweep.texts[point_index])] if plan.sweep else []  # as the user wrote it
        cells = [_cell(summary, path, spec) for _, path, spec in columns]
        last_of_point = len(plan.policies) > 1 and policy_index == len(plan.policies) - 1
        table.add_row(*point, Text(run.policy), *cells, end_section=last_of_point)
    return table
