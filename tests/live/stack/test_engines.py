"""`tasim.live.stack.engines`: the workers' command lines (vLLM started to schedule by priority when the scenario asks)."""

from __future__ import annotations

from pathlib import Path

import pytest

# the live extra
pytest.importorskip("msgpack")
pytest.importorskip("zmq")
pytest.importorskip("xxhash")

from conftest import SCENARIOS  # noqa: E402


def test_priority_scheduling_goes_live_on_vllm_workers_started_to_schedule_by_priority() -> None:
    from tasim.config.scenario import load_scenario
    from tasim.live.run import prepare_scenario
    from tasim.live.stack.engines import worker_commands

    overrides = ["policy.name=autellix", "policy.params={}", "cluster.engine.scheduling_policy=priority"]
    scenario = prepare_scenario(load_scenario(SCENARIOS / "swe-agent.yaml", overrides), "http", 4, "vllm")
    ((_, args, _),) = worker_commands("vllm", scenario, Path("/model"), "m", [5557], 1.0)
    assert args[-2:] == ["--scheduling-policy", "priority"]
    fcfs = prepare_scenario(load_scenario(SCENARIOS / "swe-agent.yaml"), "http", 4, "vllm")
    ((_, args, _),) = worker_commands("vllm", fcfs, Path("/model"), "m", [5557], 1.0)
    assert "--scheduling-policy" not in args  # vLLM's default, fcfs
