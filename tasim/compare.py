"""``tasim compare``: one scenario under several policies, optionally over one swept field.

A policy is a `PolicySpec`, so one policy may run twice with different parameters. Every
(sweep value × policy) combination is validated before anything runs, so a typo in the last
value does not cost the earlier runs. Runs are independent and deterministic, so they go
to a process pool and the results do not depend on how many run at once. Plots live in
`tasim.plots`, imported only when wanted, so this module stays free of matplotlib.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from tasim.errors import UsageError
from tasim.metrics import summary_value
from tasim.parallel import map_in_processes
from tasim.policy_spec import PolicySpec, PolicySpecError, file_safe, split_outside_brackets
from tasim.rundir import run_simulation
from tasim.scenario import Override, Scenario, ScenarioError, load_scenario, parse_value, shown

RUNS_DIR = "runs"
COMPARE_FILE = "compare.json"
MAX_DIRNAME = 255  # bytes: a file system's limit on one name

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
    ("steps/\nmin", ("calls_per_min",), ",.1f"),
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

    def overrides(self) -> list[Override]:
        """What each point sets, applied after every other override of its run."""
        parts = tuple(self.key.split("."))
        return [Override(parts, value) for value in self.values]


@dataclass(frozen=True)
class Run:
    """One combination: ``point`` is {sweep key: value}, empty without a sweep; ``label`` names
    it in messages, ``dirname`` is its directory under ``runs/``."""

    spec: PolicySpec
    point: dict[str, Any]
    label: str
    dirname: str
    scenario: Scenario

    @property
    def policy(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Plan:
    specs: tuple[PolicySpec, ...]
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
        return list(self.runs[-len(self.specs) :])


# --- parsing and validation ------------------------------------------------------------------


def parse_policies(text: str) -> tuple[PolicySpec, ...]:
    """``A,B[key=value,...],...``: commas inside a spec's brackets belong to it."""
    specs = []
    for item in split_outside_brackets(text):
        try:
            specs.append(PolicySpec.parse(item))
        except PolicySpecError as exc:
            raise UsageError(f"--policies {exc}") from None
    for i, spec in enumerate(specs):
        if spec in specs[:i]:
            raise UsageError(f"--policies {shown(text)}: {spec.label} is given twice")
    return tuple(specs)


def parse_sweep(text: str) -> Sweep:
    key, sep, values_text = text.partition("=")
    key = key.strip()
    if not sep or not key or not values_text.strip():
        raise UsageError(f"--sweep {text!r}: expected dotted.key=v1,v2,...")
    if key in ("policy", "policy.name"):
        raise UsageError(f"--sweep {key}: policies come from --policies (policy.params.<name> may be swept)")
    texts = split_outside_brackets(values_text)
    if "" in texts:
        raise UsageError(f"--sweep {text!r}: empty value (expected dotted.key=v1,v2,...)")
    values = [parse_value(t) for t in texts]  # as load_scenario will see them
    if any(values.count(v) > 1 for v in values):
        raise UsageError(f"--sweep {text!r}: a value is given twice")
    sweep = Sweep(key, tuple(texts), tuple(values))
    if sweep.numeric:  # numbers are points on an axis: run, tabulate and plot them in order
        order = sorted(range(len(values)), key=lambda i: values[i])
        sweep = Sweep(key, tuple(texts[i] for i in order), tuple(values[i] for i in order))
    return sweep


def check_overrides(overrides: Sequence[str], sweep: Sweep | None, seed: int | None) -> None:
    """Every run sets its policy, its params and the swept value itself: a --set (or --seed)
    they would replace is refused rather than lost."""
    for assignment in overrides:
        override = Override.parse(assignment)
        if override.key[0] == "policy":
            raise UsageError(
                f"--set {shown(assignment)}: policies and their params come from --policies "
                "(e.g. --policies 'thunderagent[variant=dynamo],least_loaded')"
            )
        if sweep is not None and any(swept.overwrites(override) for swept in sweep.overrides()):
            raise UsageError(f"--set {shown(assignment)}: --sweep {sweep.key} sets it in every run")
    if seed is not None and sweep is not None and any(swept.overwrites(Override(("seed",), seed)) for swept in sweep.overrides()):
        raise UsageError(f"--seed {seed}: --sweep {sweep.key} sets the seed in every run")


def _load(path: str, overrides: Sequence[str], blame: str) -> Scenario:
    try:
        return load_scenario(path, overrides)
    except ScenarioError as exc:
        raise UsageError(f"{blame}: {exc}") from None


def _sweep_run(path: str, overrides: Sequence[str], spec: PolicySpec, sweep: Sweep, text: str, value: Any) -> Run:
    point = f"{sweep.key}={text}"
    # with params of its own, the spec may be what the swept value does not fit
    blame = f"--sweep {point}" + (f" with {spec.label}" if spec.params else "")
    scenario = _load(path, [*overrides, *spec.overrides(), point], blame)
    return Run(spec, {sweep.key: value}, f"{spec.label}-{point}", file_safe(f"{spec.dirname}-{point}"), scenario)


def _check_sweep(specs: Sequence[PolicySpec], sweep: Sweep) -> None:
    """A swept policy param must not be one a spec sets (the sweep would replace it, or, as a
    default, do nothing)."""
    for spec in specs:
        for swept in sweep.overrides():
            problem = spec.conflict(swept)
            if problem:
                raise UsageError(f"--sweep {sweep.key}: {problem}")


def _check_dirnames(runs: Sequence[Run]) -> None:
    seen: dict[str, Run] = {}
    for run in runs:
        if len(run.dirname.encode()) > MAX_DIRNAME:
            raise UsageError(f"{shown(run.label)}: its run directory name would be over {MAX_DIRNAME} bytes (shorten the spec or the sweep value)")
        if run.dirname in seen:
            raise UsageError(f"{shown(seen[run.dirname].label)} and {shown(run.label)} would share the run directory {shown(run.dirname)}")
        seen[run.dirname] = run


def plan_runs(path: str, specs: Sequence[PolicySpec], sweep: Sweep | None, overrides: Sequence[str]) -> Plan:
    """Load and validate every combination; raises ScenarioError/UsageError before any run."""
    load_scenario(path, overrides)  # alone first, so an error here is the file's or --set's
    # each policy without the sweep next, so an error here is the spec's
    base = [
        Run(spec, {}, spec.label, spec.dirname, _load(path, [*overrides, *spec.overrides()], f"--policies {shown(spec.label)}")) for spec in specs
    ]
    if sweep is None:
        runs = tuple(base)
    else:
        _check_sweep(specs, sweep)
        runs = tuple(_sweep_run(path, overrides, spec, sweep, text, value) for text, value in zip(sweep.texts, sweep.values) for spec in specs)
    _check_dirnames(runs)
    return Plan(tuple(specs), sweep, runs)


def default_jobs(plan: Plan) -> int:
    return min(os.cpu_count() or 1, len(plan.runs))


# --- running ---------------------------------------------------------------------------------


def execute(plan: Plan, out: Path, jobs: int, on_done: Callable[[Run, dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Run every combination into ``out/runs/<label>``; summaries come back in plan order."""
    return map_in_processes(partial(_simulate, out / RUNS_DIR), plan.runs, jobs, on_done)


def _simulate(runs_dir: Path, run: Run) -> dict[str, Any]:
    return run_simulation(run.scenario, runs_dir / run.dirname)


def records(plan: Plan, summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """What compare.json holds, in plan order (sweep value, then policy as given): ``params``
    are those the policy ran with (the spec's over the scenario's defaults, and a swept one)."""
    return [
        {"policy": run.policy, "spec": run.spec.label, "params": run.scenario.policy.effective_params, "overrides": run.point, "summary": summary}
        for run, summary in zip(plan.runs, summaries)
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
        point_index, policy_index = divmod(i, len(plan.specs))
        point = [Text(plan.sweep.texts[point_index])] if plan.sweep else []  # as the user wrote it
        cells = [_cell(summary, path, spec) for _, path, spec in columns]
        last_of_point = len(plan.specs) > 1 and policy_index == len(plan.specs) - 1
        table.add_row(*point, Text(run.spec.label), *cells, end_section=last_of_point)
    return table
