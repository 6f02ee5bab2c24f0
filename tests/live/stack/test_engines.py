"""`tasim.live.stack.engines`: the workers' command lines (vLLM started to schedule by priority when the scenario asks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# the live extra
pytest.importorskip("msgpack")
pytest.importorskip("zmq")
pytest.importorskip("xxhash")

from conftest import SCENARIOS  # noqa: E402

from tasim.config.scenario import Scenario  # noqa: E402


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


def _tiered(engine: str, *tier: str) -> Scenario:
    """``scenarios/live-mocker.yaml`` as ``engine`` would run it, with these host tier settings."""
    from tasim.config.scenario import load_scenario
    from tasim.live.run import prepare_scenario

    overrides = [f"cluster.engine.host_tier.{setting}" for setting in tier]
    return prepare_scenario(load_scenario(SCENARIOS / "live-mocker.yaml", overrides), "http", 4, engine)


def test_a_host_tier_goes_to_mocker_workers_as_their_g2_tier_with_live_time_in_its_bandwidths() -> None:
    from tasim.live.stack.engines import worker_commands

    scenario = _tiered("mocker", "blocks=500", "kv_bytes_per_token=131072", "d2h_gbps=8", "h2d_gbps=0")
    commands = worker_commands("mocker", scenario, Path("/model"), "m", [5557, 5558], 2.0)
    for _, args, _ in commands:
        tail = args[args.index("--num-host-blocks") :]
        assert tail == [
            "--num-host-blocks", "500",
            "--kv-bytes-per-token", "131072",
            "--host-offload-d2h-bandwidth-gbps", "16.0",
            "--host-offload-h2d-bandwidth-gbps", "0.0",
        ]  # fmt: skip
    (_, untiered, _), _ = worker_commands("mocker", _tiered("mocker"), Path("/model"), "m", [5557, 5558], 2.0)
    assert "--num-host-blocks" not in untiered


def test_a_host_tier_goes_to_vllm_workers_as_native_cpu_offloading_of_the_same_bytes() -> None:
    import json

    from tasim.live.stack.engines import worker_commands

    # 100 blocks of 16 tokens x 131072 bytes: 2 MiB each, already whole pages.
    scenario = _tiered("vllm", "blocks=100", "kv_bytes_per_token=131072", "store_threshold=2")
    ((_, args, _), _) = worker_commands("vllm", scenario, Path("/model"), "m", [5557, 5558], 1.0)
    config = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert config == {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 100 * 16 * 131072, "store_threshold": 2},
    }


@pytest.mark.parametrize(
    ("engine", "tier", "message"),
    [
        ("mocker", ["blocks=10", "store_threshold=2"], "store_threshold 2 with --engine mocker: Dynamo's mocker has no store threshold (allowed: 0)"),
        ("sglang", ["ratio=2"], "with --engine sglang: SGLang's HiCache is not configured from it yet (allowed: --engine mocker or vllm)"),
    ],
)
def test_a_host_tier_a_worker_cannot_run_is_refused_before_anything_starts(engine: str, tier: list[str], message: str) -> None:
    from tasim.live.clients.http_driver import DriverError

    with pytest.raises(DriverError, match=re.escape(message)):
        _tiered(engine, *tier)
