"""verl 0.9.1's own agent-loop machinery against the live Dynamo stack, end to end.

``python -m tasim live scenarios/rl-live-mocker.yaml --driver verl --engine mocker`` runs two
GRPO rollout steps (4 prompts x 4 samples) through `AgentLoopManager` → its Ray workers → the
``tasim_agent`` loop → `DynamoProgramClient` → the Dynamo frontend → the tasim router
(ThunderAgent) → two mocker workers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from tasim.config.scenario import load_scenario
from tasim.core import events as ev
from tasim.live.verl.rollout_driver import step_plans
from tasim.results.eventlog import read_events

pytest.importorskip("verl")
pytest.importorskip("dynamo.llm")
pytestmark = [pytest.mark.processes, pytest.mark.slow]

SCENARIO = REPO / "scenarios" / "rl-live-mocker.yaml"


@pytest.mark.parametrize("routing", ["proxy", "pin"])
def test_verl_rollout_steps_run_through_the_tasim_router(routing: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "tasim",
        "live",
        str(SCENARIO),
        "--driver",
        "verl",
        "--engine",
        "mocker",
        "--time-scale",
        "2",
        "--set",
        "workload.reset_prefix_cache=true",
        "--routing",
        routing,
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]

    scenario = load_scenario(SCENARIO)
    plans = [plan for step in range(2) for plan in step_plans(scenario, step)]
    summary = json.loads((out / "summary.json").read_text())
    driver = json.loads((out / "run.json").read_text())["driver"]
    assert driver["kind"] == "verl" and driver["steps"] == 2 and driver["trajectories"] == 32
    # verl's output rows report each trajectory's calls: exactly its plan's turns, all >= 2
    assert sorted(driver["turns_per_trajectory"]) == sorted(len(plan.turns) for plan in plans)
    assert min(driver["turns_per_trajectory"]) >= 2
    assert summary["requests_completed"] == driver["calls"] == sum(len(plan.turns) for plan in plans)
    assert summary["programs_completed"] == 32 and summary["programs_leaked"] == 0
    assert summary["requests_dropped"] == 0 and summary["requests_unfinished"] == 0
    assert summary["rollout"]["steps"] == 2
    assert summary["pauses"] > 0  # the pool is sized so ThunderAgent pauses
    # After each step's training pause the router asked every worker to empty its cache; the
    # mocker has no such call (Dynamo's vLLM and SGLang workers do), and says so.
    assert [sorted(reset["workers"]) for reset in driver["cache_resets"]] == [["w0", "w1"]] * 2
    assert {w["status"] for reset in driver["cache_resets"] for w in reset["workers"].values()} == {"unsupported"}

    events = list(read_events(out / "events.jsonl"))
    finished = {e.program for e in events if isinstance(e, ev.ProgramFinished)}
    assert finished == {plan.id for plan in plans}  # one program per trajectory, each released
    marks = [(type(e).__name__, e.step) for e in events if isinstance(e, (ev.RolloutStarted, ev.RolloutFinished, ev.TrainingFinished))]
    assert marks == [
        ("RolloutStarted", 0),
        ("RolloutFinished", 0),
        ("TrainingFinished", 0),
        ("RolloutStarted", 1),
        ("RolloutFinished", 1),
        ("TrainingFinished", 1),
    ]
