"""``tasim compare``: one scenario under several policies, optionally over one swept field and
over several paired seeds.

A policy is a `PolicySpec`, so one policy may run twice with different parameters. Every
(sweep value × policy) combination is validated before anything runs, so a typo in the last
value does not cost the earlier runs. Runs are independent and deterministic, so they go
to a process pool and the results do not depend on how many run at once. With ``seeds`` > 1
every (sweep value × policy) cell runs once per seed, the seeds paired across policies (a seed
fixes the programs, so program ``i`` is the same under every policy), and the table shows
each metric's mean with its 95 % interval and each policy's ratio to a baseline
(`tasim.results.stats`). Plots live in
`tasim.tools.plots`, imported only when wanted, so this module stays free of matplotlib.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from tasim.config.policy_spec import PolicySpec, PolicySpecError, file_safe, split_outside_brackets
from tasim.config.scenario import Override, Scenario, ScenarioError, as_overrides, load_scenario, parse_value, shown
from tasim.core.errors import UsageError
from tasim.results.metrics import summary_value
from tasim.results.stats import METHOD, Interval, complete_interval, paired_ratio
from tasim.sim.simulation import run_simulation
from tasim.tools.parallel import Backend

RUNS_DIR = "runs"
COMPARE_FILE = "compare.json"
MAX_DIRNAME = 255  # bytes: a file system's limit on one name
_NO_VALUE = "a seed has no value"  # no call completed in its window
_NO_RATIO = "a seed has no value, or the baseline's is zero"

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
    ("calls/\nmin", ("calls_per_min",), ",.1f"),
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
    ("group\np99 s", ("rollout", "group_completion_s", "p99"), ",.0f"),
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
    seeded: bool = False  # one of several seeds of its cell (its label and dirname say which)

    @property
    def policy(self) -> str:
        return self.spec.name

    def with_seed(self, seed: int) -> Run:
        scenario = self.scenario.model_copy(update={"seed": seed})  # nothing else depends on the seed
        return Run(self.spec, self.point, f"{self.label} seed {seed}", f"{self.dirname}-seed{seed}", scenario, seeded=True)


@dataclass(frozen=True)
class Plan:
    """``runs`` by sweep point, then policy as given, then seed; ``seeds`` has one entry per
    seed each cell runs (one: the scenario's own)."""

    specs: tuple[PolicySpec, ...]
    sweep: Sweep | None
    runs: tuple[Run, ...]
    seeds: tuple[int, ...] = ()
    baseline: PolicySpec | None = None
    overrides: tuple[Override, ...] = ()  # the --set (and --seed) assignments every run starts from

    @property
    def multi_seed(self) -> bool:
        return len(self.seeds) > 1

    def cells(self) -> list[tuple[int, PolicySpec, list[int]]]:
        """(sweep point index, policy, indexes of its runs), in table order."""
        per = max(1, len(self.seeds))
        return [(i // len(self.specs), self.specs[i % len(self.specs)], list(range(i * per, (i + 1) * per))) for i in range(len(self.runs) // per)]

    @property
    def scenario(self) -> Scenario:
        return self.runs[0].scenario

    @property
    def rollouts(self) -> bool:
        """RL rollout steps: judged by rollout throughput and step time, in table and plots."""
        return self.scenario.workload.kind == "rl_rollout"

    def last_point(self) -> list[Run]:
        """The runs at the last sweep point (the largest, for numbers), one per policy (its
        first seed's)."""
        return [self.runs[indexes[0]] for _, _, indexes in self.cells()[-len(self.specs) :]]


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


def _load(path: str, overrides: Sequence[str | Override], blame: str) -> Scenario:
    try:
        return load_scenario(path, overrides)
    except ScenarioError as exc:
        raise UsageError(f"{blame}: {exc}") from None


def _unswept(path: str, overrides: Sequence[str | Override], sweep: Sweep | None) -> Scenario:
    """The scenario with the --set overrides alone; with a sweep, a --set that is complete only
    with the swept field (``cluster.engine.host_tier.semantics`` with a swept ``ratio``) is
    loaded with the sweep's first value (an error then names its culprit among them)."""
    try:
        return load_scenario(path, overrides)
    except ScenarioError:
        if sweep is None:
            raise
    return load_scenario(path, [*overrides, Override.parse(f"{sweep.key}={sweep.texts[0]}", f"--sweep {sweep.key}={sweep.texts[0]}")])


def _sweep_run(path: str, overrides: Sequence[str | Override], spec: PolicySpec, sweep: Sweep, text: str, value: Any) -> Run:
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


MAX_SEEDS = 100


def plan_runs(
    path: str, specs: Sequence[PolicySpec], sweep: Sweep | None, overrides: Sequence[str | Override], seeds: int = 1, baseline: str | None = None
) -> Plan:
    """Load and validate every combination; raises ScenarioError/UsageError before any run.
    ``seeds``: runs per cell, the scenario's seed and the ones after it; ``baseline``: the spec
    label the others are compared with (default: the first)."""
    if not 1 <= seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds {seeds}: expected 1 to {MAX_SEEDS}")
    if seeds > 1 and sweep is not None and sweep.key == "seed":
        raise UsageError("--sweep seed: --seeds already runs every cell at several seeds")
    chosen = _baseline(specs, baseline)
    first = _unswept(path, overrides, sweep)  # alone first, so an error here is the file's or --set's
    if sweep is None:
        # each policy next, so an error here is the spec's
        runs = tuple(
            Run(spec, {}, spec.label, spec.dirname, _load(path, [*overrides, *spec.overrides()], f"--policies {shown(spec.label)}")) for spec in specs
        )
    else:
        _check_sweep(specs, sweep)
        runs = tuple(_sweep_run(path, overrides, spec, sweep, text, value) for text, value in zip(sweep.texts, sweep.values) for spec in specs)
    seed_values: tuple[int, ...] = ()
    if seeds > 1:
        seed_values = tuple(range(first.seed, first.seed + seeds))
        runs = tuple(run.with_seed(seed) for run in runs for seed in seed_values)
    _check_dirnames(runs)
    return Plan(tuple(specs), sweep, runs, seed_values, chosen, tuple(as_overrides(overrides)))


def _baseline(specs: Sequence[PolicySpec], label: str | None) -> PolicySpec:
    if label is None:
        return specs[0]
    for spec in specs:
        if spec.label == label:
            return spec
    raise UsageError(f"--baseline {shown(label)}: not one of --policies (allowed: {', '.join(s.label for s in specs)})")


def default_jobs(plan: Plan) -> int:
    return min(os.cpu_count() or 1, len(plan.runs))


# --- running ---------------------------------------------------------------------------------


def execute(plan: Plan, out: Path, backend: Backend, on_done: Callable[[Run, dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Run every combination into ``out/runs/<label>``; summaries come back in plan order.
    A backend whose tasks may run on other machines sends each run's files back with it."""
    runs_dir = out / RUNS_DIR
    if backend.shares_files:
        return backend.map(partial(_simulate, runs_dir), plan.runs, on_done)

    def landed(run: Run, result: tuple[dict[str, Any], dict[str, bytes]]) -> None:
        summary, files = result
        target = runs_dir / run.dirname
        target.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (target / name).write_bytes(data)
        on_done(run, summary)

    return [summary for summary, _ in backend.map(_simulate_elsewhere, plan.runs, landed)]


def _simulate(runs_dir: Path, run: Run) -> dict[str, Any]:
    return run_simulation(run.scenario, runs_dir / run.dirname)


def _simulate_elsewhere(run: Run) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The run in a scratch directory of whichever node runs it, and its files."""
    with tempfile.TemporaryDirectory(prefix="tasim-run-") as scratch:
        summary = run_simulation(run.scenario, Path(scratch))
        return summary, {path.name: path.read_bytes() for path in sorted(Path(scratch).iterdir()) if path.is_file()}


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
    if swept != "seed" and not plan.multi_seed:
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


# --- several seeds: intervals ------------------------------------------------------------------


def headline(plan: Plan) -> tuple[str, ...]:
    """The metric each policy's ratio to the baseline is taken on: throughput."""
    return ("rollout", "rollout_tokens_per_s") if plan.rollouts else ("calls_per_min",)


@dataclass(frozen=True)
class CellStats:
    """One (sweep point, policy) cell over its seeds: per column, the per-seed values and their
    interval (None where a seed has no value); ``ratio`` is the headline's paired ratio to the
    baseline (None for the baseline itself, or where a baseline value is zero or missing)."""

    point: int
    spec: PolicySpec
    values: dict[tuple[str, ...], list[float | None]]
    intervals: dict[tuple[str, ...], Interval | None]
    ratio: Interval | None
    ratio_values: list[float] | None


def _columns(plan: Plan) -> tuple[Column, ...]:
    return ROLLOUT_COLUMNS if plan.rollouts else SERVING_COLUMNS


def cell_stats(plan: Plan, summaries: Sequence[dict[str, Any]]) -> list[CellStats]:
    paths = [path for _, path, _ in _columns(plan)]
    key = headline(plan)
    if key not in paths:
        paths.insert(0, key)
    cells = plan.cells()
    values = [{path: [summary_value(summaries[i], path) for i in indexes] for path in paths} for _, _, indexes in cells]
    baseline_of = {point: values[n] for n, (point, spec, _) in enumerate(cells) if spec == plan.baseline}
    stats = []
    for n, (point, spec, _) in enumerate(cells):
        ratio: Interval | None = None
        ratio_values: list[float] | None = None
        ours, theirs = values[n][key], baseline_of[point][key]
        if spec != plan.baseline and None not in ours and None not in theirs:
            present, reference = [v for v in ours if v is not None], [v for v in theirs if v is not None]
            ratio = paired_ratio(present, reference)
            ratio_values = None if ratio is None else [a / b for a, b in zip(present, reference)]
        stats.append(CellStats(point, spec, values[n], {p: complete_interval(v) for p, v in values[n].items()}, ratio, ratio_values))
    return stats


def _interval_record(interval: Interval | None, values: Sequence[float | None], missing: str) -> dict[str, Any]:
    if interval is None:
        return {"mean": None, "low": None, "high": None, "no_interval": missing, "values": list(values)}
    return {**interval.record(), "values": list(values)}


def seeded_records(plan: Plan, summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """compare.json of a several-seed comparison: every run (with its seed and summary) and,
    per cell, each column's per-seed values with mean and interval, and the headline ratio."""
    assert plan.baseline is not None
    runs = records(plan, summaries)
    for record, run in zip(runs, plan.runs):
        record["seed"] = run.scenario.seed
    cells = []
    for cell in cell_stats(plan, summaries):
        entry: dict[str, Any] = {
            "spec": cell.spec.label,
            "overrides": {plan.sweep.key: plan.sweep.values[cell.point]} if plan.sweep else {},
            "metrics": {".".join(path): _interval_record(cell.intervals[path], cell.values[path], _NO_VALUE) for path in cell.values},
        }
        if cell.spec != plan.baseline:
            ratio = cell.ratio
            entry["ratio_to_baseline"] = {
                **_interval_record(ratio, cell.ratio_values or [], _NO_RATIO),
                "significant": None if ratio is None else ratio.significant(),
            }
        cells.append(entry)
    return {
        "seeds": list(plan.seeds),
        "interval": METHOD,
        "baseline": plan.baseline.label,
        "headline": ".".join(headline(plan)),
        "cells": cells,
        "runs": runs,
    }


def _plus_minus(interval: Interval | None, spec: str) -> str:
    if interval is None:
        return "-"
    spec = ",.1f" if spec == "," else spec  # a mean of counts is no count
    if interval.no_interval:  # the same at every seed: a "±0" would read as a measured certainty
        return format(interval.mean, spec)
    return f"{format(interval.mean, spec)} ±{format(interval.half_width, spec)}"


def ratio_text(cell: CellStats, baseline: PolicySpec) -> str:
    if cell.spec == baseline:
        return "baseline"
    ratio = cell.ratio
    if ratio is None:
        return "-"
    if ratio.no_interval:
        return f"{ratio.mean:.3f}× (no spread)"
    significant = "" if ratio.significant() else " n.s."
    return f"{ratio.mean:.3f}× [{ratio.low:.3f}, {ratio.high:.3f}]{significant}"


def _caption(cells: Sequence[CellStats]) -> str | None:
    """The table's note on its means without ± and ratios with "no spread", if it has any."""
    judged = [i.no_interval is None for cell in cells for i in (*cell.intervals.values(), cell.ratio) if i is not None]
    if judged and not any(judged):
        return "the seeds did not change the run: every seed gave the same numbers, so there are no intervals and no significance verdicts"
    if all(judged):
        return None
    ratios_without = any(cell.ratio is not None and cell.ratio.no_interval for cell in cells)
    what = 'a mean without ± or a ratio with "no spread"' if ratios_without else "a mean without ±"
    return f"{what} was the same at every seed: no interval, and no significance verdict"


def interval_table(plan: Plan, summaries: Sequence[dict[str, Any]]) -> Table:
    """One row per cell: each column's mean ± the half-width of its interval, and the
    headline's ratio to the baseline with its interval; "n.s.": the interval holds 1. A value
    the seeds did not change has no interval (`Interval.no_interval`); the caption says so."""
    assert plan.baseline is not None
    title = f"{_title(plan)} · {len(plan.seeds)} paired seeds ({plan.seeds[0]}-{plan.seeds[-1]}) · mean ± {METHOD} half-width"
    stats = cell_stats(plan, summaries)
    table = Table(title=title, caption=_caption(stats), box=box.SIMPLE_HEAD, collapse_padding=True, show_edge=False)
    if plan.sweep:
        table.add_column(plan.sweep.key.rsplit(".", 1)[-1].replace("_", " "), justify="right", overflow="ellipsis")
    table.add_column("policy", style="bold", no_wrap=True)
    columns = _columns(plan)
    for header, *_ in columns:
        table.add_column(header, justify="right", overflow="fold")
    name = " ".join(headline(plan)[-1].split("_"))
    # Text, not markup: a spec's brackets ("thunderagent[variant=dynamo]") would be read as a style
    table.add_column(Text(f"{name}\nvs {plan.baseline.label}"), justify="right", overflow="fold")
    for cell in stats:
        point = [Text(plan.sweep.texts[cell.point])] if plan.sweep else []
        cells = [_plus_minus(cell.intervals[path], spec) for _, path, spec in columns]
        last_of_point = len(plan.specs) > 1 and cell.spec == plan.specs[-1]
        table.add_row(*point, Text(cell.spec.label), *cells, Text(ratio_text(cell, plan.baseline)), end_section=last_of_point)
    return table
