"""tasim's engine against vLLM v1's own scheduler (``tasim validate vllm``): the same scenario on
both, compared request by request. vLLM is in the project's test install (the `oracle` extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SCENARIOS, assert_usage_error, tasim
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasim.config.scenario import Scenario, load_scenario, parse_scenario
from tasim.validation.against_vllm import DECISIONS, TIER_DECISIONS, DecisionLog, compare, oracle_scenario, validate

pytestmark = pytest.mark.processes  # starts real processes (make test-fast leaves it out)

pytest.importorskip("vllm", reason="the oracle extra (make install) brings vLLM")

STEP_MS = 10.0
TOOL_LOOP = {
    "name": "tool-loop",
    "duration_s": 100_000,
    "cluster": {"engine": {"block_size": 16, "kv_blocks": 2001, "max_num_seqs": 256, "max_num_batched_tokens": 2048}},
    "workload": {
        "kind": "agent",
        "arrival": "closed",
        "concurrency": 60,
        "programs": 60,
        "system_prompt_tokens": 512,
        "task_prompt_tokens": 200,
        "turns": 4,
        "output_tokens": 50,
        "observation_tokens": 300,
        "tool_latency_s": 0.3,
    },
}


def _validate(scenario: Scenario, tmp_path: Path) -> None:
    result = validate(scenario, tmp_path, STEP_MS)
    assert result.requests > 0
    assert result.mismatches == [], result.mismatches[:3]
    assert result.all_identical


@st.composite
def workloads(draw: st.DrawFn) -> Scenario:
    """Small random engines and agent programs with tool gaps: thrashing or not, chunked prefill
    on or off, prefix caching on or off, fcfs or priority scheduling, one or two workers under
    four policies, or Autellix's priorities."""
    block = draw(st.sampled_from([4, 8, 16]))
    chunked = draw(st.booleans())
    budget = draw(st.sampled_from([64, 128, 256, 1024]))
    blocks = draw(st.integers(20, 300))
    longest = blocks * block if chunked else min(blocks * block, budget)
    # Every program's first turn (prompt and output) fits the context, so every example plans
    # requests; later turns may outgrow the model length and are refused or cut on both sides alike.
    longest_output = min(40, longest // 4)
    system = min(draw(st.sampled_from([0, 3 * block, 37, 100])), longest // 4)
    raw = {
        "name": "random",
        "seed": draw(st.integers(0, 1000)),
        "duration_s": 1e6,
        "cluster": {
            "backends": draw(st.sampled_from([1, 1, 2])),
            "engine": {
                "block_size": block,
                "kv_blocks": blocks + 1,
                "max_num_seqs": draw(st.sampled_from([2, 4, 8, 64])),
                "max_num_batched_tokens": budget,
                "enable_chunked_prefill": chunked,
                "enable_prefix_caching": draw(st.booleans()) or draw(st.booleans()),
            },
        },
        "workload": {
            "kind": "agent",
            "arrival": "closed",
            "concurrency": draw(st.integers(1, 12)),
            "programs": draw(st.integers(1, 20)),
            "system_prompt_tokens": system,
            "task_prompt_tokens": {"kind": "uniform", "low": 1, "high": min(120, longest - system - longest_output)},
            "turns": {"kind": "uniform", "low": 1, "high": 5},
            "output_tokens": {"kind": "uniform", "low": 1, "high": longest_output},
            "observation_tokens": {"kind": "uniform", "low": 0, "high": 60},
            "tool_latency_s": {"kind": "uniform", "low": 0.0, "high": 0.2},
            "max_context_tokens": longest,
        },
        "policy": {"name": draw(st.sampled_from(["round_robin", "least_loaded", "kv_router", "thunderagent", "autellix"]))},
    }
    scheduling = "priority" if raw["policy"]["name"] == "autellix" else draw(st.sampled_from(["fcfs", "priority"]))
    raw["cluster"]["engine"]["scheduling_policy"] = scheduling  # type: ignore[index]
    if raw["policy"]["name"] == "autellix":  # service of a few steps: calls spread over the queues
        raw["policy"]["params"] = {"queue_boundaries_s": [0.05, 0.1, 0.2, 0.4], "long_call_tokens": draw(st.sampled_from([0, 64, 2048]))}  # type: ignore[index]
    return parse_scenario(raw, "random")


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(workloads())
def test_vllm_decides_every_request_as_tasim_does(tmp_path: Path, scenario: Scenario) -> None:
    _validate(scenario, tmp_path)


@st.composite
def tiered_workloads(draw: st.DrawFn) -> Scenario:
    """Small engines with a host tier behind them: GPU pools that thrash, host pools from a few
    blocks (stores that do not fit, evictions) to more than the GPU's, copies from instant to a
    few steps per block, store_threshold 0 or 2, agents sharing a system prompt, one or two
    workers, fcfs or priority scheduling."""
    block = draw(st.sampled_from([4, 8, 16]))
    chunked = draw(st.booleans())
    budget = draw(st.sampled_from([64, 128, 256]))
    blocks = draw(st.integers(24, 80))
    longest = blocks * block if chunked else min(blocks * block, budget)
    longest_output = min(30, longest // 4)
    system = min(draw(st.sampled_from([0, 3 * block, 37, 100])), longest // 4)
    policy = draw(st.sampled_from(["round_robin", "kv_router", "thunderagent", "autellix"]))
    # a block (100 kB) is copied in no time, 0.1 ms, 2 ms or 20 ms (two steps)
    gbps = draw(st.sampled_from([0.0, 0.005, 0.05, 1.0]))
    raw = {
        "name": "random-tiered",
        "seed": draw(st.integers(0, 1000)),
        "duration_s": 1e6,
        "cluster": {
            "backends": draw(st.sampled_from([1, 1, 2])),
            "engine": {
                "block_size": block,
                "kv_blocks": blocks + 1,
                "max_num_seqs": draw(st.sampled_from([2, 4, 8, 64])),
                "max_num_batched_tokens": budget,
                "enable_chunked_prefill": chunked,
                "scheduling_policy": "priority" if policy == "autellix" else draw(st.sampled_from(["fcfs", "priority"])),
                "host_tier": {
                    "blocks": draw(st.sampled_from([4, blocks // 2, blocks, 2 * blocks])),
                    "kv_bytes_per_token": 100_000 // block,
                    "d2h_gbps": gbps,
                    "h2d_gbps": draw(st.sampled_from([gbps, 0.0, 0.005])),
                    "store_threshold": draw(st.sampled_from([0, 0, 2])),
                },
            },
        },
        "workload": {
            "kind": "agent",
            "arrival": "closed",
            "concurrency": draw(st.integers(3, 10)),
            "programs": draw(st.integers(4, 14)),
            "system_prompt_tokens": system,
            "task_prompt_tokens": {"kind": "uniform", "low": 1, "high": min(120, longest - system - longest_output)},
            "turns": {"kind": "uniform", "low": 2, "high": 5},
            "output_tokens": {"kind": "uniform", "low": 1, "high": longest_output},
            "observation_tokens": {"kind": "uniform", "low": 0, "high": 60},
            "tool_latency_s": {"kind": "uniform", "low": 0.02, "high": 0.3},
            "max_context_tokens": longest,
        },
        "policy": {"name": policy},
    }
    if policy == "autellix":
        raw["policy"]["params"] = {"queue_boundaries_s": [0.05, 0.1, 0.2, 0.4]}  # type: ignore[index]
    return parse_scenario(raw, "random-tiered")


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(tiered_workloads())
def test_vllm_with_a_host_tier_decides_every_request_as_tasim_does(tmp_path: Path, scenario: Scenario) -> None:
    """Admissions, GPU and host hits, every load and store (blocks, step, done), preemptions,
    first tokens and finishes per request, and the host's KV events per worker and step."""
    result = validate(scenario, tmp_path, STEP_MS)
    assert result.tiered
    assert result.mismatches == [], result.mismatches[:3]
    assert result.all_identical


# A host tier of 128 KiB per token (Llama 3.1 8B in bf16: a 16-token block is 2 MiB) behind a
# GPU pool that holds a fraction of the 40 programs, so their prompts come back from the host.
_TIERED_LOOP = ["workload.programs=40", "workload.concurrency=40", "cluster.engine.host_tier.kv_bytes_per_token=131072"]


@pytest.mark.parametrize(
    "overrides",
    [
        # the host holds every program: its hits are loaded at 32 GB/s, within a step
        ["cluster.engine.kv_blocks=500", "cluster.engine.host_tier.blocks=4000"],
        # a host smaller than the programs (evictions; stores that do not fit wait), each block
        # stored only at its second offer, copies at 2 GB/s that take a few steps
        [
            "cluster.engine.kv_blocks=500",
            "cluster.engine.host_tier.blocks=600",
            "cluster.engine.host_tier.store_threshold=2",
            "cluster.engine.host_tier.d2h_gbps=2",
            "cluster.engine.host_tier.h2d_gbps=2",
        ],
        # two workers under Autellix's priorities, stores instant, loads at 8 GB/s
        [
            "cluster.backends=2",
            "cluster.engine.kv_blocks=300",
            "cluster.engine.scheduling_policy=priority",
            "policy.name=autellix",
            "cluster.engine.host_tier.blocks=1000",
            "cluster.engine.host_tier.d2h_gbps=0",
            "cluster.engine.host_tier.h2d_gbps=8",
        ],
    ],
    ids=["host holds everything", "small slow host, store_threshold 2", "2 workers, autellix"],
)
def test_tiered_tool_loops_agree(tmp_path: Path, overrides: list[str]) -> None:
    scenario_file = tmp_path / "tool-loop.yaml"
    scenario_file.write_text(json.dumps(TOOL_LOOP))
    result = validate(load_scenario(scenario_file, _TIERED_LOOP + overrides), tmp_path / "out", STEP_MS)
    assert result.mismatches == [], result.mismatches[:3]
    assert result.all_identical and result.tiered and result.requests == 160
    summary = result.summaries["vllm"]
    assert summary["host_tier"]["host_hit_tokens"] > 0 and summary["preemptions"] > 0
    assert result.host_event_steps > 0


@pytest.mark.parametrize(
    "overrides",
    [
        ["workload.max_requests=120", "cluster.backends=2", "cluster.engine.kv_blocks=600"],
        [
            "workload.max_requests=120",
            "cluster.engine.kv_blocks=400",
            "cluster.engine.enable_chunked_prefill=false",
            "cluster.engine.max_num_batched_tokens=40000",
        ],
    ],
    ids=["round robin, 2 workers", "no chunked prefill"],
)
@pytest.mark.parametrize("trace", ["mooncake-conversation.yaml", "mooncake-synthetic.yaml"])
def test_mooncake_traces_agree(tmp_path: Path, trace: str, overrides: list[str]) -> None:
    _validate(load_scenario(SCENARIOS / trace, overrides + ["policy.name=round_robin"]), tmp_path)


def test_a_pool_one_block_larger_is_caught(tmp_path: Path) -> None:
    """The comparison finds a real difference: given vLLM's null block as one more block for KV,
    tasim does not preempt p51's second turn at step 129, where vLLM (one block short) does and
    re-admits it a step later with 1,088 of its tokens still cached."""
    from tasim.sim.simulation import run_simulation
    from tasim.validation.vllm_engine import VllmEngine

    scenario = oracle_scenario(parse_scenario(TOOL_LOOP, "tool-loop"), STEP_MS)
    logs = {side: DecisionLog(STEP_MS / 1000) for side in ("tasim", "vllm")}
    larger = scenario.model_copy(
        update={
            "cluster": scenario.cluster.model_copy(
                update={"engine": scenario.cluster.engine.model_copy(update={"flavour": "mocker", "eviction": "lru", "reuse_output_blocks": True})}
            )
        }
    )
    summaries = {
        "tasim": run_simulation(larger, tmp_path / "tasim", observe=logs["tasim"]),
        "vllm": run_simulation(scenario, tmp_path / "vllm", engine_factory=VllmEngine, observe=logs["vllm"]),
    }
    result = compare(logs["tasim"].requests, logs["vllm"].requests, summaries, {"tasim": 0.0, "vllm": 0.0})
    assert [(m.request, m.decision, m.tasim, m.vllm) for m in result.mismatches[:4]] == [
        ("p51.1", "admission step", [87.0], [87.0, 130.0]),
        ("p51.1", "prefix-hit tokens", [752], [752, 1088]),
        ("p51.1", "preemptions", [], [129.0]),
        ("p51.1", "finish step", 137.0, 138.0),
    ]
    assert not result.all_identical


def test_cli_compares_and_writes_the_record(tmp_path: Path) -> None:
    scenario = tmp_path / "tool-loop.yaml"
    scenario.write_text(json.dumps(TOOL_LOOP))
    out = tmp_path / "out"
    result = tasim("validate", "vllm", str(scenario), "--set", "workload.concurrency=30", "--set", "workload.programs=30", "--out", str(out))
    assert result.returncode == 0, result.stderr
    for decision in DECISIONS:
        assert f"{decision} " in result.stdout
    assert "✗" not in result.stdout
    assert "│ calls/min          │ 2,099.1 │ 2,099.1 │       +0 ✓ │" in result.stdout.splitlines()  # LLM calls, not engine steps
    record = json.loads((out / "validation.json").read_text())
    assert record["all_identical"] is True
    assert record["requests"] == 120
    assert record["identical"] == dict.fromkeys(DECISIONS, 120)
    assert record["engine"]["num_blocks"] == 2000  # 2001 configured, one is vLLM's null block
    assert (out / "tasim" / "events.jsonl").is_file() and (out / "vllm" / "events.jsonl").is_file()


def test_cli_compares_a_host_tier(tmp_path: Path) -> None:
    scenario = tmp_path / "tool-loop.yaml"
    scenario.write_text(json.dumps(TOOL_LOOP))
    out = tmp_path / "out"
    tier = ["--set", "cluster.engine.kv_blocks=400", "--set", "cluster.engine.host_tier.blocks=2000"]
    result = tasim("validate", "vllm", str(scenario), "--set", "workload.concurrency=30", "--set", "workload.programs=30", *tier, "--out", str(out))
    assert result.returncode == 0, result.stderr
    for row in (*DECISIONS, *TIER_DECISIONS, "host KV events, per worker step", "host-hit tokens", "host stored tokens", "H2D busy (s)"):
        assert f"{row} " in result.stdout
    assert "✗" not in result.stdout
    record = json.loads((out / "validation.json").read_text())
    assert record["all_identical"] is True
    assert record["identical"] == dict.fromkeys(DECISIONS + TIER_DECISIONS, 120)
    assert record["host_tier"]["blocks"] == 2000
    assert record["summary"]["vllm"]["host_tier"]["host_hit_tokens"] > 0


def test_validate_vllm_leaves_no_temporary_folder(tmp_path: Path) -> None:
    # vLLM reads its stand-in model (a config.json in a tasim-vllm-model-* folder) while the
    # scheduler is built; the folder goes with it. The run gets a temp dir of its own, so other
    # runs on the machine neither hide a folder left behind nor add one.
    temp = tmp_path / "temp"
    temp.mkdir()
    scenario = tmp_path / "tool-loop.yaml"
    scenario.write_text(json.dumps(TOOL_LOOP))
    command = ["validate", "vllm", str(scenario), "--set", "workload.programs=2", "--set", "workload.concurrency=2", "--out", str(tmp_path / "out")]
    result = subprocess.run(
        [sys.executable, "-m", "tasim", *command], capture_output=True, text=True, cwd=REPO, env={**os.environ, "TMPDIR": str(temp)}
    )
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in temp.iterdir() if path.name.startswith("tasim-")) == []


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--policy", "continuum"], ("continuum pins KV blocks",)),
        (
            ["--set", "cluster.engine.eviction=lineage"],
            ("--set cluster.engine.eviction=lineage", "validate vllm sets cluster.engine.eviction to lru"),
        ),
        (["--set", "cluster.perf.mfu=0.3"], ("validate vllm sets cluster.perf itself",)),
        (["--set", "cluster.engine.preemption=oldest_first"], ("cluster.engine.preemption", "newest_first")),
        (["--set", "cluster.engine.enable_chunked_prefill=false"], ("max_num_batched_tokens (2048)", "without chunked prefill")),
        (["--step-ms", "0"], ("--step-ms",)),
    ],
)
def test_cli_refuses_what_vllm_cannot_run(tmp_path: Path, args: list[str], fragments: tuple[str, ...]) -> None:
    scenario = tmp_path / "tool-loop.yaml"
    scenario.write_text(json.dumps(TOOL_LOOP))
    assert_usage_error(tasim("validate", "vllm", str(scenario), "--out", str(tmp_path / "out"), *args), *fragments)
