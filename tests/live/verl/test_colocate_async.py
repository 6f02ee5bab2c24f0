"""verl's colocated asynchronous trainer through the live stack, end to end.

``python -m tasim live scenarios/rl-live-mocker.yaml --driver verl --set workload.mode=colocate_async``
on a small batch: verl 0.9.1's `PPOTrainerColocateAsync` runs its own fit loop (a batch ahead,
its replay buffer on TransferQueue taking each step's oldest finished groups), its
`AgentLoopManagerTQ` runs the prompt groups, whose agent loops call through verl's
partial-rollout client (`PartialRolloutDynamoClient`), and each step's abort and weight push go
to the router while later groups' calls stream. Each sync cuts calls; verl's client sends each
again, and everything finishes: no request id twice, every cut turn completed by its next call,
nothing left at the router, and the weight versions verl's tags hold reach the summary's
staleness.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest
from conftest import REPO

from tasim.config.scenario import load_scenario
from tasim.core import events as ev
from tasim.core.rollout_ids import rollout_group_of
from tasim.live.verl.rollout_driver import colocate_async_submissions
from tasim.results.eventlog import read_events

pytest.importorskip("verl")
pytest.importorskip("dynamo.llm")
pytestmark = [pytest.mark.processes, pytest.mark.slow]

SCENARIO = REPO / "scenarios" / "rl-live-mocker.yaml"
# 2 prompts x 2 samples a step, a batch ahead, 2 steps; calls long enough to be streaming when a
# sync begins.
CHANGES = [
    "workload.mode=colocate_async",
    "workload.reset_prefix_cache=true",
    "workload.prompts_per_step=2",
    "workload.samples_per_prompt=2",
    "workload.steps=2",
    "workload.turns={kind: uniform, low: 2, high: 3}",
    "workload.output_tokens={kind: uniform, low: 300, high: 600}",
    "workload.tool_latency_s={kind: lognormal, median: 0.5, sigma: 0.3}",
    "workload.training_s=4",
]


def test_colocate_async_weight_syncs_cut_calls_that_verls_client_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "tasim", "live", str(SCENARIO), "--driver", "verl", "--engine", "mocker", "--time-scale", "2", "--out", str(out)]
    for change in CHANGES:
        command += ["--set", change]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]

    submissions = colocate_async_submissions(load_scenario(SCENARIO, CHANGES))
    plans = [plan for groups in submissions for group in groups for plan in group.plans]
    driver = json.loads((out / "run.json").read_text())["driver"]
    summary = json.loads((out / "summary.json").read_text())
    groups = {rollout_group_of(plan.id) for plan in plans}
    assert driver["steps"] == 2 and driver["trajectories"] == len(plans) == 12 and len(groups) == 6
    # verl's replay buffer: 2 whole groups a step, never one twice; step 0's from the 4 submitted at
    # once (a batch ahead), which no sync has touched yet
    sampled = driver["sampled_groups"]
    assert [len(step) for step in sampled] == [2, 2] and len(set(sampled[0] + sampled[1])) == 4 and set(sampled[0] + sampled[1]) <= groups
    assert all(name.startswith("s0.") for name in sampled[0])
    assert [(g["min_version"], g["max_version"]) for g in driver["staleness"] if g["step"] == 0] == [(0, 0), (0, 0)]
    assert all(0 <= g["min_version"] <= g["max_version"] <= 1 for g in driver["staleness"])
    # verl's own step: sample ("gen"), train, push
    assert all({"gen", "update_actor", "update_weights", "step"} <= set(timings) for timings in driver["step_timings_s"])
    # Two weight updates, each cutting calls that were streaming.
    assert [sync["version"] for sync in driver["weight_syncs"]] == [1, 2]
    assert all(sync["began"] and sync["aborted"] >= 1 for sync in driver["weight_syncs"])
    # Nothing left at the router, nothing lost.
    assert driver["router_after"]["programs"]["table"] == {} and driver["router_after"]["programs"]["live"] == 0
    assert driver["router_after"]["requests"]["in_flight"] == 0 and driver["router_after"]["requests"]["failed"] == 0
    assert summary["programs_completed"] == len(plans) and summary["programs_leaked"] == 0
    assert summary["requests_dropped"] == 0 and summary["requests_unfinished"] == 0
    events = list(read_events(out / "events.jsonl"))
    # verl's client makes each turn whole: every planned turn finished once (a cut call ends retried).
    finished_turns = Counter(e.program for e in events if isinstance(e, ev.RequestFinished))
    assert finished_turns == {plan.id: len(plan.turns) for plan in plans}
    assert driver["calls"] == sum(len(plan.turns) for plan in plans)
    arrived = [e.request for e in events if isinstance(e, ev.RequestArrived)]
    assert len(arrived) == len(set(arrived))  # no request id twice
    finished = {e.request for e in events if isinstance(e, ev.RequestFinished)}
    retried = [e for e in events if isinstance(e, ev.RequestRetried)]
    assert len(retried) == sum(sync["aborted"] for sync in driver["weight_syncs"]) >= 2
    for cut in retried:  # the turn's next call (`<turn>r<n>`) finished
        turn = cut.request.split("r")[0]
        assert any(request.startswith(turn + "r") for request in finished), cut.request
    assert {e.program for e in events if isinstance(e, ev.ProgramFinished) and e.completed} == {plan.id for plan in plans}
    syncs = [(type(e).__name__, e.version) for e in events if isinstance(e, (ev.WeightSyncStarted, ev.WeightSyncFinished))]
    assert syncs == [("WeightSyncStarted", 1), ("WeightSyncFinished", 1), ("WeightSyncStarted", 2), ("WeightSyncFinished", 2)]
    # The router logged what verl's tags say of each sampled group; the summary's staleness is theirs.
    logged = [asdict(e) for e in events if isinstance(e, ev.GroupSampled)]
    assert [{key: g[key] for key in ("step", "group", "min_version", "max_version")} for g in logged] == driver["staleness"]
    assert summary["rollout"]["staleness"]["max"] == max(g["step"] - g["max_version"] for g in logged)
    assert summary["rollout"]["staleness_worst"]["max"] == max(g["step"] - g["min_version"] for g in logged)
    marks = [(type(e).__name__, e.step) for e in events if isinstance(e, (ev.RolloutStarted, ev.TrainingStarted, ev.TrainingFinished))]
    assert marks == [
        ("RolloutStarted", 0),
        ("TrainingStarted", 0),
        ("TrainingFinished", 0),
        ("RolloutStarted", 1),
        ("TrainingStarted", 1),
        ("TrainingFinished", 1),
    ]
