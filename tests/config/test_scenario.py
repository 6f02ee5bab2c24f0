"""``python -m tasim schema``: a JSON Schema (Draft 2020-12) that takes what the
loader takes, shorthands included, refuses what it refuses where a schema can say so, and lists
the GPUs, models and policies a scenario may name."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SCENARIOS, TINY
from jsonschema import Draft202012Validator

from tasim.cli import main
from tasim.config import hardware
from tasim.config.scenario import ScenarioError, parse_scenario
from tasim.policies import POLICIES


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    """What ``python -m tasim schema`` prints (once per module: capsys is per test)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["schema"]) == 0
    printed: dict[str, Any] = json.loads(out.getvalue())
    Draft202012Validator.check_schema(printed)
    return printed


def _problems(schema: dict[str, Any], raw: Any) -> list[str]:
    return [error.message for error in Draft202012Validator(schema).iter_errors(raw)]


def _reasons(schema: dict[str, Any], raw: Any) -> list[str]:
    """Every message of the schema's errors and of the errors under them (a workload matches
    none of its kinds' schemas because, for the agent kind, ...)."""
    errors = list(Draft202012Validator(schema).iter_errors(raw))
    reasons = []
    while errors:
        error = errors.pop()
        reasons.append(error.message)
        errors.extend(error.context or [])
    return reasons


@pytest.mark.parametrize("preset", sorted(SCENARIOS.glob("*.yaml")), ids=lambda path: path.stem)
def test_every_preset_validates(schema: dict[str, Any], preset: Path) -> None:
    assert _problems(schema, yaml.safe_load(preset.read_text())) == []


def test_the_test_scenario_validates(schema: dict[str, Any]) -> None:
    assert _problems(schema, yaml.safe_load(Path(TINY).read_text())) == []


# Scenarios in the shorthand forms the loader takes: both must accept each.
SHORTHANDS = [
    "workload: {turns: 40}",  # a plain number is a fixed distribution
    "workload: {turns: 12.5, output_tokens: 300, task_prompt_tokens: 2000, observation_tokens: 0, setup_s: 0.5}",
    "workload: {tool_latency_s: 2}",
    "workload: {tools: {shell: {share: 1, latency_s: 0.5}, pytest: {share: 0.2, latency_s: {kind: lognormal, median: 20, sigma: 0.8}}}}",
    "workload: {release: never}",
    "workload: {release: at_end}",
    "workload: {release: {kind: after, delay_s: 30}}",
    "workload: {kind: rl_rollout, training_s: 600, turns: 5, steps: 1}",
    "workload: {turns: {kind: fixed, value: 3}, output_tokens: {kind: lognormal, median: 100, sigma: 1, max: .inf}}",
    "workload: {turns: {kind: empirical, values: [3, 5, 8], weights: [1, 2, 1]}, tool_latency_s: {kind: pareto, scale: 4, alpha: 1.1, max: 240}}",
    "cluster: {gpu: H200, model: Qwen3-32B, tp: 2, engine: {kv_blocks: auto}}",
    "cluster: {engine: {kv_blocks: 4000, flavour: mocker}}",
    "policy: {name: thunderagent, params: {variant: dynamo}}",
    "name: x\nseed: 3\nduration_s: 60",
]


@pytest.mark.parametrize("text", SHORTHANDS)
def test_the_schema_takes_what_the_loader_takes(schema: dict[str, Any], text: str) -> None:
    raw = yaml.safe_load(text)
    parse_scenario(raw, "shorthand.yaml")  # the loader takes it
    assert _problems(schema, raw) == []


# Scenarios the loader refuses, and what the schema says of them.
REFUSED = [
    ("workload: {concurency: 3}", "Additional properties are not allowed ('concurency' was unexpected)"),
    ("bogus: 1", "Additional properties are not allowed ('bogus' was unexpected)"),
    ("cluster: {gpu: TPUv9}", "'TPUv9' is not one of ['H100', "),
    ("cluster: {model: GPT-9}", "'GPT-9' is not one of ['Llama-3.1-8B', "),
    ("policy: {name: nope}", "'nope' is not one of ['round_robin', "),
    ("workload: {turns: -1}", "-1 is less than the minimum of 0"),
    ("workload: {turns: {kind: zipf, a: 2}}", "'lognormal' was expected"),
    ("workload: {release: after}", "'after' is not one of ['at_end', 'never']"),
    ("workload: {turns: true}", "True is not of type 'number'"),
    ("workload: {kind: rl_rollout, steps: 0}", "0 is less than or equal to the minimum of 0"),
]


@pytest.mark.parametrize(("text", "problem"), REFUSED)
def test_the_schema_refuses_what_the_loader_refuses(schema: dict[str, Any], text: str, problem: str) -> None:
    raw = yaml.safe_load(text)
    with pytest.raises(ScenarioError):
        parse_scenario(raw, "refused.yaml")
    assert len(_problems(schema, raw)) == 1
    reasons = _reasons(schema, raw)
    assert any(problem in reason for reason in reasons), reasons


def test_the_schema_lists_the_allowed_gpus_models_and_policies(schema: dict[str, Any]) -> None:
    cluster = schema["$defs"]["ClusterConfig"]["properties"]
    assert cluster["gpu"]["enum"] == list(hardware.gpus()) and "H100" in cluster["gpu"]["enum"]
    assert cluster["model"]["enum"] == list(hardware.models()) and "Llama-3.1-8B" in cluster["model"]["enum"]
    assert schema["$defs"]["PolicyConfig"]["properties"]["name"]["enum"] == list(POLICIES)
