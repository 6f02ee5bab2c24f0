"""Every preset in scenarios/ validates, is listed by `tasim scenarios`, and runs (shortened)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCENARIOS, tasim

from tasim.config.presets import PRESET_DIR, scenario_path
from tasim.config.scenario import RolloutWorkload, ScenarioError, load_scenario
from tasim.sim.simulation import run_simulation

PRESETS = sorted(SCENARIOS.glob("*.yaml"))

SHORTEN = {
    "agent": ["duration_s=150", "workload.concurrency=4", "metrics.warmup_s=0"],
    "rl_rollout": [
        "workload.prompts_per_step=2",
        "workload.samples_per_prompt=2",
        "workload.steps=2",
        "workload.training_s=5",
        "workload.turns=3",
        "workload.max_concurrency=3",
    ],
    "mooncake_trace": ["workload.max_requests=60"],
    "dynamo_trace": ["workload.max_sessions=5"],
}


def test_there_are_presets_for_every_workload_kind() -> None:
    kinds = {load_scenario(p).workload.kind for p in PRESETS}
    assert {"agent", "rl_rollout", "mooncake_trace"} <= kinds
    assert len(PRESETS) >= 10


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_runs(preset: Path, tmp_path: Path) -> None:
    kind = load_scenario(preset).workload.kind
    scenario = load_scenario(preset, SHORTEN[kind])
    summary = run_simulation(scenario, tmp_path)
    assert summary["requests_completed"] > 0
    assert summary["requests_dropped"] == 0
    workload = scenario.workload
    if isinstance(workload, RolloutWorkload) and workload.mode != "sync":
        rollout = summary["rollout"]
        assert rollout["steps"] == 2
        assert rollout["groups"] == workload.prompts_per_step * workload.steps == 4  # the groups trained on
        assert 0 <= rollout["trainer_idle_share"] < 1
        assert rollout["staleness_worst"]["max"] >= rollout["staleness"]["max"] >= 0
        assert rollout["rollout_tokens_per_s"] > 0 and rollout["step_tokens_per_s"] > 0
    elif kind == "rl_rollout":
        rollout = summary["rollout"]
        assert rollout["steps"] == 2
        assert rollout["step_time_s"]["mean"] > rollout["rollout_time_s"]["mean"] > 0  # training adds 5 s
        assert 0 <= rollout["straggler_share"] < 1
        assert rollout["rollout_tokens_per_s"] > rollout["step_tokens_per_s"] > 0
        # every GRPO group of every step completes, after its first sample's finish
        assert isinstance(workload, RolloutWorkload)
        assert rollout["groups"] == workload.prompts_per_step * workload.steps == 4
        assert rollout["group_wait_s"]["mean"] < rollout["group_completion_s"]["mean"]


def test_scenarios_command_lists_every_preset() -> None:
    result = tasim("scenarios")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert "INVALID" not in result.stdout
    assert sorted(line.split()[0] for line in lines) == [p.name for p in PRESETS]


def test_the_checkout_finds_its_own_presets() -> None:
    """Not installed as a wheel (the editable install, or tests run in the checkout), the presets
    are the checkout's scenarios/; tests/test_wheel.py checks the wheel's own."""
    assert SCENARIOS.resolve() == PRESET_DIR


def test_scenario_path_takes_a_preset_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert scenario_path("swe-agent") == scenario_path("swe-agent.yaml") == PRESET_DIR / "swe-agent.yaml"
    mine = tmp_path / "swe-agent.yaml"  # an existing file wins over the preset of its name
    mine.write_text("name: mine\n")
    assert scenario_path("swe-agent.yaml") == Path("swe-agent.yaml")
    assert scenario_path(str(mine)) == mine
    assert scenario_path("swe-agent") == PRESET_DIR / "swe-agent.yaml"
    for argument in ("nope", "nope.yaml", "scenarios/swe-agent.yaml", "./swe-agent", "traces/README"):
        with pytest.raises(ScenarioError) as error:
            scenario_path(argument)
        assert str(error.value) == f"{argument}: file not found, nor a preset name (`python -m tasim scenarios` lists the presets)"
