"""The search engine `tasim tune` and `tasim calibrate` share: scenario fields with a range or a
set of choices (``--space`` / ``--fit``), Optuna's TPE sampler over them, and the loop that asks
the sampler for a batch of trials, has the caller score them together (a batch's runs go to the
backend at once; TPE's constant liar keeps its members apart) and tells it the scores. A trial
whose values no scenario can hold is told as failed, so the sampler learns to avoid the region
instead of the search stopping.
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tasim.config.distributions import Fixed
from tasim.config.policy_spec import split_outside_brackets
from tasim.config.scenario import Scenario, parse_value, shown
from tasim.core.errors import UsageError
from tasim.policies import policy_class

if TYPE_CHECKING:
    import optuna

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class Dimension:
    """One scenario field: numbers in ``[low, high]`` (``log``: on a log scale; ``integer``: in
    integers), or one of ``choices`` (the texts as given, parsed as YAML when applied)."""

    key: str
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    integer: bool = False
    choices: tuple[str, ...] = ()

    def suggest(self, trial: optuna.trial.Trial) -> Any:
        if self.choices:
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.integer:
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, log=self.log)

    def override(self, value: Any) -> str:
        return f"{self.key}={value if self.choices else int(value) if self.integer else repr(float(value))}"

    def holds(self, value: Any) -> bool:
        return value in self.choices if self.choices else self.low <= value <= self.high

    @property
    def text(self) -> str:
        if self.choices:
            return f"{self.key}={'|'.join(self.choices)}"
        bounds = f"{int(self.low)}:{int(self.high)}" if self.integer else f"{self.low:g}:{self.high:g}"
        return f"{self.key}={bounds}{':log' if self.log else ''}"


def parse_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not finite")
    return value


def parse_dimension(text: str, flag: str) -> Dimension:
    """``key=LOW:HIGH[:log]`` or ``key=A|B|C``. Integer bounds make an integer range until
    `bound` types it by the field it sets."""
    key, sep, rest = text.partition("=")
    key = key.strip()
    if not sep or not _KEY.match(key) or not rest.strip():
        raise UsageError(f"{flag} {shown(text)}: expected key=LOW:HIGH[:log] or key=A|B|C")
    if "|" in rest:
        choices = tuple(part.strip() for part in rest.split("|"))
        if "" in choices or len(set(choices)) != len(choices) or len(choices) < 2:
            raise UsageError(f"{flag} {shown(text)}: needs two or more distinct, non-empty choices")
        return Dimension(key, choices=choices)
    parts = rest.strip().split(":")
    log = len(parts) == 3 and parts[2] == "log"
    if len(parts) not in (2, 3) or (len(parts) == 3 and not log):
        raise UsageError(f"{flag} {shown(text)}: expected LOW:HIGH or LOW:HIGH:log after {key}=")
    try:
        low, high = parse_number(parts[0]), parse_number(parts[1])
    except ValueError as error:
        raise UsageError(f"{flag} {shown(text)}: {error}") from None
    if not low < high:
        raise UsageError(f"{flag} {shown(text)}: an empty range (LOW must be below HIGH)")
    if log and low <= 0:
        raise UsageError(f"{flag} {shown(text)}: a log scale needs LOW > 0")
    integer = all(re.fullmatch(r"[+-]?\d+", p.strip()) for p in parts[:2])
    return Dimension(key, low, high, log, integer)


def parse_space(texts: Sequence[str], flag: str) -> tuple[Dimension, ...]:
    """The flag's values (repeatable, each comma-separated), each key once and none inside
    another."""
    dimensions = [parse_dimension(part, flag) for text in texts for part in split_outside_brackets(text) if part.strip()]
    if not dimensions:
        raise UsageError(f"{flag}: name at least one key=LOW:HIGH or key=A|B")
    keys = [d.key for d in dimensions]
    for key in keys:
        if keys.count(key) > 1:
            raise UsageError(f"{flag} {key}: given twice")
        inside = [other for other in keys if other.startswith(key + ".")]
        if inside:
            raise UsageError(f"{flag} {key}: {inside[0]} lies inside it (search one of them)")
    return tuple(dimensions)


def field_value(scenario: Scenario, key: str) -> Any:
    """The value at a dotted key of the scenario, or None; a fixed distribution is its value
    (a file writes it as a plain number, and a number is what a dimension sets); a policy's
    param is its effective value (its default when the scenario does not set it)."""
    if key.startswith("policy.params."):
        name = key.split(".", 2)[2]
        if name in scenario.policy.effective_params:
            return scenario.policy.effective_params[name]
        param = _param(scenario, name)  # one the scenario leaves out has its model's default
        return None if param is None or param.is_required() else param.get_default(call_default_factory=True)
    node: Any = scenario.model_dump(mode="json")
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and node.get("kind") == "fixed":
        return node["value"]
    return node


def bound(dimension: Dimension, scenario: Scenario, flag: str) -> Dimension:
    """A numeric range typed by the field it sets, as the field is declared (not as its bounds
    are written, nor by the value it holds now): in integers exactly when the field is an
    integer, over the reals when it is a float, bounds ``1:20`` included. A field that holds no
    number is refused; a key the scenario has no field for keeps the bounds' own kind (`tasim
    tune` reports it by loading)."""
    if dimension.choices:
        return dimension
    kind = declared_number(scenario, dimension.key)
    if kind is None:
        return dimension
    if isinstance(kind, str):
        raise UsageError(f"{flag} {dimension.text}: {dimension.key} holds {kind}, not a number (a range needs an int or float; give choices A|B)")
    if kind is int and not (dimension.low.is_integer() and dimension.high.is_integer()):
        raise UsageError(f"{flag} {dimension.text}: {dimension.key} is an integer; give integer bounds")
    return replace(dimension, integer=kind is int)


def declared_number(scenario: Scenario, key: str) -> type[int] | type[float] | str | None:
    """The number type the dotted ``key`` of ``scenario`` is declared to hold: a policy param's
    by the params model of the scenario's policy (whether or not the scenario sets it), any
    other field's by the schema of the model each part of the scenario is (so a workload's own
    kind decides). Where it holds no number, its type in words; None where the scenario has no
    such field or declares no type for it."""
    parts = key.split(".")
    if len(parts) == 3 and parts[:2] == ["policy", "params"]:
        param = _param(scenario, parts[2])
        return None if param is None else _number_type(param.annotation)
    node: Any = scenario
    annotation: Any = None
    for part in parts:
        if isinstance(node, BaseModel) and part in type(node).model_fields:
            annotation, node = type(node).model_fields[part].annotation, getattr(node, part)
        elif isinstance(node, dict) and part in node:  # a mapping of names (tools): its values' type
            mapping = _members(annotation)[0]
            annotation, node = get_args(mapping)[1] if get_origin(mapping) is dict else Any, node[part]
        else:
            return None
    return _number_type(annotation)


def _param(scenario: Scenario, name: str) -> FieldInfo | None:
    """The declaration of a param of the scenario's policy (its params model's field)."""
    return policy_class(scenario.policy.name).params_model.model_fields.get(name)


def _members(annotation: Any) -> list[Any]:
    """A union's members (one otherwise), without None and without Annotated's metadata."""
    members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return [get_args(m)[0] if get_origin(m) is Annotated else m for m in members if m is not type(None)]


def _number_type(annotation: Any) -> type[int] | type[float] | str | None:
    if annotation is Any:
        return None
    members = _members(annotation)
    if float in members or Fixed in members:  # a number set on a distribution makes a fixed one, of a float
        return float
    if int in members:  # bool is not int here: true/false are no range
        return int
    return " or ".join(f"one of {', '.join(map(str, get_args(m)))}" if get_origin(m) is Literal else getattr(m, "__name__", str(m)) for m in members)


def own_values(scenario: Scenario, space: Sequence[Dimension]) -> dict[str, Any] | None:
    """The scenario's value of every dimension (a choice as its text), or None if one lies
    outside its range."""
    values: dict[str, Any] = {}
    for dimension in space:
        value = field_value(scenario, dimension.key)
        if dimension.choices:
            texts = [text for text in dimension.choices if parse_value(text) == value]
            if not texts:
                return None
            values[dimension.key] = texts[0]
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not dimension.holds(value):
            return None
        else:
            values[dimension.key] = int(value) if dimension.integer else float(value)
    return values


def tpe_sampler(
    seed: int, startup_trials: int, constraints: Callable[[optuna.trial.FrozenTrial], Sequence[float]] | None = None
) -> optuna.samplers.TPESampler:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True, multivariate=True, n_startup_trials=startup_trials, constraints_func=constraints)


@dataclass(frozen=True)
class TrialResult:
    """A trial's score, and what to keep with it in the study."""

    value: float
    attrs: Mapping[str, Any] = field(default_factory=dict)


# A batch's trials as parameter values -> per trial its score, or why no scenario holds them.
ScoreBatch = Callable[[list[dict[str, Any]]], list["TrialResult | str"]]


def run_batches(study: optuna.Study, trials: int, batch: int, space: Sequence[Dimension], score: ScoreBatch) -> int:
    """Ask, score and tell batches of trials until the study holds ``trials``; returns how many
    of those asked here were refused (told as failed, the reason kept as ``refused``)."""
    import optuna

    refused = 0
    while len(study.trials) < trials:
        asked = [study.ask() for _ in range(min(batch, trials - len(study.trials)))]
        values = [{d.key: d.suggest(trial) for d in space} for trial in asked]
        for trial, result in zip(asked, score(values)):
            if isinstance(result, str):
                trial.set_user_attr("refused", result)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                refused += 1
                continue
            for name, attr in dict(result.attrs).items():
                trial.set_user_attr(name, attr)
            study.tell(trial, result.value)
    return refused
