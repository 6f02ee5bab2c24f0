"""``python -m tasim tune``: search a policy's knobs (and deployment or engine fields) for the best
value of one summary metric, over paired seeds, in a study that can be resumed.

Each trial sets every ``--space`` field, runs the scenario under ``--policy`` at the same
``--seeds`` seeds (paired: a seed fixes the programs), and scores the mean of ``--objective``
over them; a ``--constraint`` on another summary metric must hold for that mean. Trials are
proposed by Optuna's TPE sampler (seeded, with a constant liar so a batch of ``--jobs`` trials
runs at once) and stored in an Optuna database: a SQLite file under ``--out`` by default, or any
URL Optuna takes (``--storage``), so a rerun with the same arguments resumes the study until it
holds ``--trials`` trials, and the study can be opened with Optuna's own tools. The scenario's
own values, run at the same seeds, are the reference the report compares with: the best
configuration with its 95 % interval, the default's, the paired ratio between them (`tasim.results.stats`)
and the parameters' importances (PED-ANOVA, which needs no scikit-learn). The tuned scenario is written as a file.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tasim.config.scenario import Scenario, ScenarioError, derived_scenario_yaml, load_scenario, shown
from tasim.core.errors import UsageError
from tasim.results.metrics import SUMMARY_KEYS, MetricsFold, summary_value
from tasim.results.stats import METHOD, Interval, mean_interval, paired_ratio
from tasim.tools import search
from tasim.tools.parallel import Backend
from tasim.tools.search import Dimension, TrialResult, bound, parse_number, run_batches, tpe_sampler
from tasim.tools.search import own_values as scenario_values

if TYPE_CHECKING:
    import optuna

TUNE_FILE = "tune.json"
_NOT_METRICS = {"scenario", "policy", "seed", "workers", "wall_time_s"}


# --- what to search, and for what ---------------------------------------------------------------


def parse_space(texts: Sequence[str]) -> tuple[Dimension, ...]:
    """``--space`` values: any scenario field but the policy's name and the seed."""
    space = search.parse_space(texts, "--space")
    for dimension in space:
        key = dimension.key
        if key in ("policy", "policy.name", "seed") or key.startswith("policy.defaults"):
            raise UsageError(f"--space {key}: the policy comes from --policy and seeds from --seeds; search the policy's params (policy.params.X)")
    return space


@dataclass(frozen=True)
class Objective:
    path: tuple[str, ...]
    maximize: bool

    @property
    def name(self) -> str:
        return ".".join(self.path)


def parse_metric(text: str, flag: str) -> tuple[str, ...]:
    path = tuple(text.strip().split("."))
    if not text.strip() or path[0] not in SUMMARY_KEYS or path[0] in _NOT_METRICS:
        metrics = ", ".join(k for k in SUMMARY_KEYS if k not in _NOT_METRICS)
        raise UsageError(f"{flag} {shown(text)}: not a summary metric (allowed: {metrics}; nested ones as e.g. ttft_s.mean)")
    return path


def parse_objective(text: str) -> Objective:
    metric, _, direction = text.partition(":")
    if direction not in ("", "max", "min"):
        raise UsageError(f"--objective {shown(text)}: the direction is max or min (got {shown(direction)})")
    return Objective(parse_metric(metric, "--objective"), direction != "min")


@dataclass(frozen=True)
class Constraint:
    path: tuple[str, ...]
    at_most: bool  # METRIC<=X; else METRIC>=X
    bound: float

    @property
    def text(self) -> str:
        return f"{'.'.join(self.path)}{'<=' if self.at_most else '>='}{self.bound:g}"

    def violation(self, value: float) -> float:
        """<= 0 where the constraint holds (Optuna's convention)."""
        return value - self.bound if self.at_most else self.bound - value


def parse_constraint(text: str) -> Constraint:
    match = re.fullmatch(r"\s*([^<>=\s]+)\s*(<=|>=)\s*(\S+)\s*", text)
    if not match:
        raise UsageError(f"--constraint {shown(text)}: expected METRIC<=X or METRIC>=X")
    try:
        limit = parse_number(match[3])
    except ValueError as error:
        raise UsageError(f"--constraint {shown(text)}: {error}") from None
    return Constraint(parse_metric(match[1], "--constraint"), match[2] == "<=", limit)


# --- the study ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    scenario: str  # file
    policy: str
    space: tuple[Dimension, ...]
    objective: Objective
    constraints: tuple[Constraint, ...]
    trials: int
    seeds: tuple[int, ...]
    overrides: tuple[str, ...]
    sampler_seed: int
    storage: str
    out: Path

    @property
    def study_name(self) -> str:
        """The same question gets the same study (so a rerun resumes it), another a new one."""
        identity = json.dumps(
            [
                Path(self.scenario).name,
                self.policy,
                [d.text for d in self.space],
                self.objective.name,
                self.objective.maximize,
                [c.text for c in self.constraints],
                list(self.seeds),
                list(self.overrides),
            ]
        )
        return f"tune-{Path(self.scenario).stem}-{self.policy}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


def _base(request: Request) -> list[str]:
    return [*request.overrides, f"policy.name={request.policy}"]


def _corner(dimension: Dimension, where: str) -> Any:
    if dimension.choices:
        return dimension.choices[0 if where == "low" else -1]
    value = {"low": dimension.low, "high": dimension.high, "middle": (dimension.low + dimension.high) / 2}[where]
    return round(value) if dimension.integer else value


def check(request: Request) -> Request:
    """Before anything runs: the scenario loads, every field of the space is one it has, and some
    corner of the space is valid. Fields that constrain each other (a pause threshold and a
    target below it) may refuse other combinations; those trials are refused one by one.
    Returns the request with each range typed by its field: in integers exactly when the field
    is declared an integer."""
    try:
        scenario = load_scenario(request.scenario, _base(request))
    except ScenarioError as error:
        raise UsageError(str(error)) from None
    request = replace(request, space=tuple(bound(d, scenario, "--space") for d in request.space))
    for dimension in request.space:  # a field the scenario does not have fails alone, whatever the others
        try:
            load_scenario(request.scenario, [*_base(request), dimension.override(_corner(dimension, "low"))])
        except ScenarioError as error:
            if "unknown" in str(error):
                raise UsageError(f"--space {dimension.text}: {error}") from None
    valid: list[str] | None = None
    first_error = ""
    for where in ("low", "middle", "high"):
        corner = [d.override(_corner(d, where)) for d in request.space]
        try:
            load_scenario(request.scenario, [*_base(request), *corner])
        except ScenarioError as error:
            first_error = first_error or str(error)
            continue
        valid = corner
        break
    if valid is None:
        raise UsageError(f"--space: no corner of the space (all lowest, middle or highest values) is a valid scenario: {first_error}")
    return request


def own_values(request: Request) -> dict[str, Any] | None:
    """The scenario's values of the space's fields, if every one lies inside its range."""
    return scenario_values(load_scenario(request.scenario, _base(request)), request.space)


def simulate_summary(scenario: Scenario) -> dict[str, Any]:
    """One run's summary, simulated in this process (no files)."""
    from tasim.sim.runner import Simulation

    fold = MetricsFold()
    Simulation(scenario, fold.apply).run()
    return fold.summary()


def _metric(summary: dict[str, Any], path: tuple[str, ...], flag: str) -> float:
    try:
        value = summary_value(summary, path)
    except (KeyError, TypeError):
        value = "missing"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{flag} {'.'.join(path)}: not a number in the summary (it holds {shown(str(value))[:80]})")
    return float(value)


@dataclass(frozen=True)
class Scored:
    """A configuration's per-seed objective values and constraint metrics."""

    objective: list[float]
    constrained: list[list[float]]  # per constraint, per seed

    def interval(self) -> Interval:
        return mean_interval(self.objective)

    def violations(self, constraints: Sequence[Constraint]) -> list[float]:
        return [c.violation(sum(v) / len(v)) for c, v in zip(constraints, self.constrained)]


def evaluate(request: Request, configs: Sequence[list[str]], backend: Backend, progress: Callable[[], None]) -> list[Scored | str]:
    """Each configuration (its overrides) at every seed, in one batch; a configuration the
    scenario refuses is its error message."""
    scenarios: list[Scenario] = []
    owners: list[int] = []
    results: list[Scored | str] = []
    for index, overrides in enumerate(configs):
        try:
            loaded = load_scenario(request.scenario, [*_base(request), *overrides])
        except ScenarioError as error:
            results.append(str(error))
            continue
        results.append("")
        for seed in request.seeds:
            scenarios.append(loaded.model_copy(update={"seed": seed}))
            owners.append(index)
    summaries = backend.map(simulate_summary, scenarios, lambda _, __: progress())
    per_config: dict[int, list[dict[str, Any]]] = {}
    for owner, summary in zip(owners, summaries):
        per_config.setdefault(owner, []).append(summary)
    for index, found in per_config.items():
        objective = [_metric(s, request.objective.path, "--objective") for s in found]
        constrained = [[_metric(s, c.path, "--constraint") for s in found] for c in request.constraints]
        results[index] = Scored(objective, constrained)
    return results


def run_study(request: Request, backend: Backend, batch: int, progress: Callable[[], None]) -> optuna.Study:
    """Create or resume the study and run it until it holds ``request.trials`` trials."""
    import optuna

    request.out.mkdir(parents=True, exist_ok=True)

    def constraints(trial: optuna.trial.FrozenTrial) -> Sequence[float]:
        return list(trial.user_attrs.get("violations", [0.0] * len(request.constraints)))

    sampler = tpe_sampler(request.sampler_seed, max(batch, min(10, request.trials // 4)), constraints if request.constraints else None)
    direction: Literal["maximize", "minimize"] = "maximize" if request.objective.maximize else "minimize"
    study = optuna.create_study(storage=request.storage, study_name=request.study_name, direction=direction, sampler=sampler, load_if_exists=True)
    if "default" not in study.user_attrs:
        own = own_values(request)
        if own is not None:  # the scenario's own values are the first trial where the space holds them
            study.enqueue_trial(own)
        (default,) = evaluate(request, [[]], backend, progress)
        if isinstance(default, str):
            raise UsageError(f"{request.scenario}: {default}")
        study.set_user_attr("default", {"objective": default.objective, "constrained": default.constrained})
        study.set_user_attr("request", {"scenario": request.scenario, "policy": request.policy, "space": [d.text for d in request.space]})

    def score(batch_values: list[dict[str, Any]]) -> list[TrialResult | str]:
        configs = [[d.override(values[d.key]) for d in request.space] for values in batch_values]
        return [
            scored
            if isinstance(scored, str)
            else TrialResult(scored.interval().mean, {"objective": scored.objective, "violations": scored.violations(request.constraints)})
            for scored in evaluate(request, configs, backend, progress)
        ]

    run_batches(study, request.trials, batch, request.space, score)
    return study


# --- the report ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    request: Request
    study_name: str
    trials: int
    failed: int
    best_params: dict[str, Any] | None
    best: Interval | None
    default: Interval
    ratio: Interval | None
    importances: dict[str, float] | str  # or why there are none

    @property
    def best_beats_default(self) -> bool:
        if self.best is None:
            return False
        return self.best.mean > self.default.mean if self.request.objective.maximize else self.best.mean < self.default.mean

    def lines(self) -> list[str]:
        r = self.request
        goal = f"{'max' if r.objective.maximize else 'min'}imise {r.objective.name}"
        extra = f" subject to {', '.join(c.text for c in r.constraints)}" if r.constraints else ""
        lines = [
            f"tune {Path(r.scenario).name} · {r.policy} · {goal}{extra} · {self.trials} trials ({self.failed} refused) · seeds {list(r.seeds)}",
            f"default:  {_shown_interval(self.default)}",
        ]
        if self.best is None or self.best_params is None:
            return [*lines, "best:     no trial met the constraints"]
        chosen = f"{_shown_interval(self.best)} with " + ", ".join(f"{k}={_value(v)}" for k, v in self.best_params.items())
        if self.best_beats_default:
            name = "best"
            lines.append(f"best:     {chosen}")
        else:  # the top trial is no win: shown as the nearest miss, not as the answer
            name = "closest"
            lines += ["best:     no trial beats the scenario's own values: the tuned file keeps them", f"closest:  {chosen}"]
        if self.ratio is not None:
            lines.append(f"{name} / default (paired by seed): {_shown_ratio(self.ratio)}")
        if isinstance(self.importances, str):
            lines.append(f"importances: none ({self.importances})")
        else:
            lines.append("importances (PED-ANOVA): " + ", ".join(f"{k} {v:.2f}" for k, v in self.importances.items()))
        if len(r.seeds) > 1:
            lines.append(f"intervals: {METHOD} over the seeds")
        else:
            lines.append(f"intervals: none with 1 seed (--seeds N, N > 1, gives {METHOD} intervals)")
        return lines


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _shown_interval(interval: Interval) -> str:
    if interval.no_interval:
        return f"{interval.mean:,.4g} ({interval.no_interval})"
    return f"{interval.mean:,.4g} [{interval.low:,.4g}, {interval.high:,.4g}]"


def _shown_ratio(ratio: Interval) -> str:
    if ratio.no_interval:
        return f"{ratio.mean:.3f}× ({ratio.no_interval})"
    return f"{ratio.mean:.3f}× [{ratio.low:.3f}, {ratio.high:.3f}], {'significant' if ratio.significant() else 'not significant'}"


def report(request: Request, study: optuna.Study) -> Report:
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    feasible = [t for t in complete if all(v <= 0 for v in t.user_attrs.get("violations", []))]
    default_values: list[float] = study.user_attrs["default"]["objective"]
    best = None
    if feasible:
        # ties go to the earliest trial: the scenario's own values, where the space holds them
        best = max(feasible, key=lambda t: (t.value, -t.number)) if request.objective.maximize else min(feasible, key=lambda t: (t.value, t.number))
    importances: dict[str, float] | str
    try:
        importances = dict(optuna.importance.get_param_importances(study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()))
    except (ValueError, RuntimeError) as error:
        importances = str(error).splitlines()[0]
    best_values: list[float] | None = best.user_attrs["objective"] if best else None
    return Report(
        request,
        study.study_name,
        len(study.trials),
        sum(1 for t in study.trials if t.state == optuna.trial.TrialState.FAIL),
        dict(best.params) if best else None,
        mean_interval(best_values) if best_values else None,
        mean_interval(default_values),
        paired_ratio(best_values, default_values) if best_values else None,
        importances,
    )


def tuned_yaml(rep: Report, scenario_name: str, target: Path) -> str:
    """The scenario with the best configuration, headed by how it was found."""
    r = rep.request
    chosen = [d.override(rep.best_params[d.key]) for d in r.space] if rep.best_params and rep.best_beats_default else []
    name = f"{scenario_name}-tuned"
    header = [f"Tuned from {Path(r.scenario).name} by `tasim tune` (study {rep.study_name} in {r.storage}).", *rep.lines()]
    return derived_scenario_yaml(Path(r.scenario), [*r.overrides, f"policy.name={r.policy}", *chosen], name, target, header)


def record(rep: Report) -> dict[str, Any]:
    r = rep.request
    return {
        "scenario": r.scenario,
        "policy": r.policy,
        "study": rep.study_name,
        "storage": r.storage,
        "objective": {"metric": r.objective.name, "direction": "max" if r.objective.maximize else "min"},
        "constraints": [c.text for c in r.constraints],
        "space": [d.text for d in r.space],
        "seeds": list(r.seeds),
        "interval": METHOD,
        "trials": rep.trials,
        "refused": rep.failed,
        "default": rep.default.record(),
        "best": None if rep.best_params is None or rep.best is None else {"params": rep.best_params, **rep.best.record()},
        "best_over_default": None if rep.ratio is None else {**rep.ratio.record(), "significant": rep.ratio.significant()},
        "tuned_file_keeps_default": not rep.best_beats_default,
        "importances": rep.importances,
    }
