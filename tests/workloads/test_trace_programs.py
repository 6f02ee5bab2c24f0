"""Replaying the Mooncake traces through the simulator: the ideal prefix reuse with an unbounded
pool, and complete replays behind the KV router on four workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCENARIOS, TEST_DATA

from tasim.config.scenario import load_scenario
from tasim.sim.simulation import run_simulation

UNBOUNDED = [
    "cluster.engine.flavour=mocker",  # serves any request: the ideal is the whole trace's
    "cluster.backends=1",
    "cluster.engine.block_size=512",
    "cluster.engine.kv_blocks=10000000",
    "cluster.engine.max_num_seqs=100000",
    # near-instant engines: every request's blocks are cached before the next arrival
    "cluster.perf.model=dynamo_polynomial",
    "cluster.perf.speedup_ratio=1000",
]


@pytest.mark.parametrize(("trace", "ideal", "requests"), [("conversation", 0.374, 12031), ("synthetic", 0.651, 3993)])
def test_unbounded_pool_reaches_the_trace_ideal(tmp_path: Path, trace: str, ideal: float, requests: int) -> None:
    summary = run_simulation(load_scenario(SCENARIOS / f"mooncake-{trace}.yaml", UNBOUNDED), tmp_path)
    assert summary["requests_completed"] == requests
    assert summary["prefix_hit_rate"] == pytest.approx(ideal, abs=0.005)


# The synthetic trace has 10 prompts longer than Qwen3-32B's 131,072-token context, which vLLM
# refuses (the presets run the vllm engine flavour).
@pytest.mark.parametrize(("trace", "requests", "too_long"), [("conversation", 12031, 0), ("synthetic", 3993, 10)])
def test_full_replay_with_kv_router_on_four_workers(tmp_path: Path, trace: str, requests: int, too_long: int) -> None:
    scenario = load_scenario(SCENARIOS / f"mooncake-{trace}.yaml", ["cluster.backends=4"])
    assert scenario.policy.name == "kv_router"
    summary = run_simulation(scenario, tmp_path)
    assert summary["requests_completed"] == requests - too_long
    assert summary["requests_dropped"] == too_long
    assert summary["requests_unfinished"] == 0
    assert summary["prefix_hit_rate"] > 0


def test_dynamo_agent_trace_replays_sessions_with_their_gaps(tmp_path: Path) -> None:
    """Sessions start at their recorded offsets; each turn waits its recorded gap after the
    previous turn finished (the hand-written trace: main 3 turns, sub 2 turns from 0.3 s)."""
    from tasim.config.scenario import parse_scenario
    from tasim.core import events as ev
    from tasim.sim.runner import Simulation

    trace = TEST_DATA / "dynamo_agent_trace.jsonl"
    scenario = parse_scenario(
        {"duration_s": 60, "cluster": {"engine": {"block_size": 4, "kv_blocks": 1000}}, "workload": {"kind": "dynamo_trace", "path": str(trace)}},
        "inline",
    )
    log: list[ev.Event] = []
    Simulation(scenario, log.append).run()
    arrived = {e.request: e.t for e in log if isinstance(e, ev.RequestArrived)}
    finished = {e.request: e.t for e in log if isinstance(e, ev.RequestFinished)}
    assert sorted(finished) == ["main.0", "main.1", "main.2", "sub.0", "sub.1"]
    assert arrived["main.0"] == 0.0 and arrived["sub.0"] == 0.3
    assert arrived["main.1"] == finished["main.0"] + 0.6
    assert arrived["main.2"] == finished["main.1"] + 0.5
    assert arrived["sub.1"] == finished["sub.0"] + 0.05
    assert isinstance(log[-1], ev.RunEnded) and log[-1].unfinished_requests == 0
    assert log[-1].t < 60  # the run ends when the trace is done
