"""Cross-validation against Dynamo's own replay (run_trace_replay, its mocker engines and real
KV router): the same workload through both simulators, with the fidelity tolerances. Round-robin
runs are deterministic on both sides and tasim reproduces them request by request, so they must
agree to rounding; the KV router breaks ties at random in Dynamo, so its means are compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SCENARIOS, TINY, assert_usage_error, tasim

from tasim.config.scenario import Override, load_scenario
from tasim.validation import ValidationUnavailable
from tasim.validation.against_dynamo import validate
from tasim.validation.measures import METRICS, differences
from tasim.validation.tasim_replay import lost_in_replay

pytestmark = pytest.mark.processes  # starts real processes (make test-fast leaves it out)

SMALL_AGENTS = ["workload.concurrency=24", "workload.turns={kind: uniform, low: 3, high: 8}"]
MOONCAKE_SLICE = ["workload.max_requests=300", "cluster.backends=2", "cluster.engine.kv_blocks=2048", "cluster.perf.model=dynamo_polynomial"]
CASES = {
    "agents, block 16, pool 2048 (preemption)": (
        "multiturn-validation.yaml",
        SMALL_AGENTS + ["cluster.engine.block_size=16", "cluster.engine.kv_blocks=2048"],
    ),
    "agents, 8 workers, block 64": ("multiturn-validation.yaml", SMALL_AGENTS + ["cluster.backends=8"]),
    "Mooncake synthetic, 300 requests": ("mooncake-synthetic.yaml", MOONCAKE_SLICE),
    "agents, Poisson arrivals": ("multiturn-validation.yaml", ["workload.arrival=poisson", "workload.rate_per_s=0.5", "duration_s=60"]),
}


TIERED_CASES = {
    "agents, block 16, pool 2048, host 4096 (both tiers evict)": (
        "multiturn-validation.yaml",
        SMALL_AGENTS + ["cluster.engine.block_size=16", "cluster.engine.kv_blocks=2048", "cluster.engine.host_tier={blocks: 4096}"],
    ),
    "agents, 8 workers, pool 512, host 1024, 1 GB/s copies": (
        "multiturn-validation.yaml",
        SMALL_AGENTS + ["cluster.backends=8", "cluster.engine.kv_blocks=512", "cluster.engine.host_tier={blocks: 1024, d2h_gbps: 1, h2d_gbps: 1}"],
    ),
}


@pytest.mark.parametrize("case", TIERED_CASES)
def test_tasim_agrees_with_dynamo_replay_with_a_host_tier(tmp_path: Path, case: str) -> None:
    """Dynamo's mocker with its native G2 tier against tasim's dynamo_mocker host tier: round
    robin request by request, the KV router (crediting host blocks) within the tolerances."""
    preset, overrides = TIERED_CASES[case]
    trace, results = validate(load_scenario(SCENARIOS / preset, overrides), tmp_path, ["round_robin", "kv_router"], repeats=1)
    assert trace.requests >= 100
    for result in results:
        assert result.dynamo_incomplete == result.tasim_incomplete == 0
        for diff in result.differences:
            assert diff.within is not False, f"{result.router}: {diff.metric.label} {diff.shown()}"
            if result.router == "round_robin" and diff.metric.key != "wall_s":
                assert diff.tasim == pytest.approx(diff.dynamo, rel=1e-6, abs=1e-9), diff.metric.label


@pytest.mark.parametrize("case", CASES)
def test_tasim_agrees_with_dynamo_replay(tmp_path: Path, case: str) -> None:
    preset, overrides = CASES[case]
    trace, results = validate(load_scenario(SCENARIOS / preset, overrides), tmp_path, ["round_robin", "kv_router"])
    assert trace.requests >= 100
    for result in results:
        assert result.dynamo_incomplete == result.tasim_incomplete
        for diff in result.differences:
            assert diff.within is not False, f"{result.router}: {diff.metric.label} {diff.shown()}"
            if result.router == "round_robin" and diff.metric.key != "wall_s":
                assert diff.tasim == pytest.approx(diff.dynamo, rel=1e-6, abs=1e-9), diff.metric.label


def test_validate_cli_writes_the_comparison(tmp_path: Path) -> None:
    result = tasim(
        "validate",
        "dynamo",
        str(SCENARIOS / "multiturn-validation.yaml"),
        "--routers",
        "round_robin",
        "--out",
        str(tmp_path),
        *[f"--set={o}" for o in SMALL_AGENTS],
    )
    assert result.returncode == 0, result.stderr
    assert "tasim against Dynamo's replay" in result.stdout
    record = json.loads((tmp_path / "validation.json").read_text())
    assert record["workers"] == 2 and record["engine"]["block_size"] == 64 and record["engine"]["num_gpu_blocks"] == 4096
    (router,) = record["routers"]
    assert router["router"] == "round_robin" and router["runs"] == 1 and router["within_tolerance"]
    assert set(router["dynamo"]) == set(router["tasim"]) == {m.key for m in METRICS} | {"requests"}
    assert (tmp_path / "workload.jsonl").is_file()


def test_validate_cli_gives_both_sides_the_host_tier(tmp_path: Path) -> None:
    result = tasim(
        "validate",
        "dynamo",
        str(SCENARIOS / "multiturn-validation.yaml"),
        "--out",
        str(tmp_path),
        *[f"--set={o}" for o in SMALL_AGENTS + ["cluster.engine.kv_blocks=1024", "cluster.engine.host_tier.blocks=2048"]],
    )
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "validation.json").read_text())
    engine = record["engine"]
    assert engine["native_host_offload"] == {"num_host_blocks": 2048, "d2h_bandwidth_gbps": 32.0, "h2d_bandwidth_gbps": 32.0}
    assert engine["kv_cache_bytes_per_token"] == 131072
    by_router = {r["router"]: r for r in record["routers"]}
    assert by_router["round_robin"]["within_tolerance"] and by_router["kv_router"]["within_tolerance"]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--routers", "random"], ["--routers 'random'", "allowed: round_robin, kv_router"]),
        (["--repeats", "0"], ["--repeats", "must be at least 1"]),
    ],
)
def test_validate_rejects_bad_flags(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    assert_usage_error(tasim("validate", "dynamo", TINY, "--out", str(tmp_path), *args), *fragments)


@pytest.mark.parametrize(
    ("assignment", "problem"),
    [
        ("cluster.engine.block_size=64", None),
        ("cluster.perf.model=dynamo_polynomial", None),  # what the replay sets anyway
        ("metrics.warmup_s=0", None),
        ("cluster.perf.model=roofline", "validate dynamo sets cluster.perf.model to dynamo_polynomial itself (the mocker's step times)"),
        (
            "cluster.engine={eviction: lru, block_size: 64}",
            "validate dynamo sets cluster.engine.eviction to lineage itself (the mocker evicts leaves first)",
        ),
        ("metrics.warmup_s=5", "validate dynamo sets metrics.warmup_s to 0.0 itself (every request of the trace is measured)"),
        ("cluster.engine.host_tier={blocks: 4096}", None),
        ("cluster.engine.host_tier.semantics=dynamo_mocker", None),
        (
            "cluster.engine.host_tier.semantics=vllm",
            "validate dynamo sets cluster.engine.host_tier.semantics to dynamo_mocker itself (Dynamo's replay runs the mocker's host tier)",
        ),
        (
            "cluster.engine.host_tier.store_threshold=2",
            "validate dynamo sets cluster.engine.host_tier.store_threshold to 0 itself (the mocker stores every block it is offered)",
        ),
        (
            "policy.defaults.kv_router.router_temperature=0.5",
            "validate dynamo sets policy itself (each router in --routers runs with Dynamo's defaults)",
        ),
    ],
)
def test_overrides_the_replay_would_lose(assignment: str, problem: str | None) -> None:
    assert lost_in_replay(Override.parse(assignment)) == problem


def test_validate_names_the_workloads_it_supports(tmp_path: Path) -> None:
    result = tasim("validate", "dynamo", str(SCENARIOS / "rl-rollout.yaml"), "--out", str(tmp_path))
    assert_usage_error(result, "workload.kind", "'mooncake_trace' and 'agent'", "'rl_rollout'")
    assert not (tmp_path / "validation.json").exists()


def test_requests_no_worker_can_hold_are_left_out(tmp_path: Path) -> None:
    """A prompt that fits the pool but whose output does not makes Dynamo's replay abort on its
    own invariant check (tasim drops it once it outgrows the pool), so validate leaves such
    requests out of both replays and says how many; if none is left, it says so in one line."""
    lines = [
        '{"timestamp": 0, "input_length": 60, "output_length": 20, "hash_ids": [1]}',
        '{"timestamp": 5, "input_length": 30, "output_length": 2, "hash_ids": [2]}',
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("cluster: {engine: {block_size: 16, kv_blocks: 4}}\nworkload: {kind: mooncake_trace, path: t.jsonl}\n")
    result = tasim("validate", "dynamo", str(scenario), "--routers", "round_robin", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "left out 1 requests" in result.stdout
    record = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert record["trace"]["requests"] == 1 and record["trace"]["excluded_too_large"] == 1
    (tmp_path / "t.jsonl").write_text(lines[0] + "\n")
    result = tasim("validate", "dynamo", str(scenario), "--out", str(tmp_path / "out2"))
    assert_usage_error(result, "no request fits a worker's 4 KV blocks of 16 tokens")


def test_a_failing_dynamo_replay_is_reported_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dynamo.replay.api

    def abort(*args: object, **kwargs: object) -> None:
        raise Exception("replay invariant violated: something")

    monkeypatch.setattr(dynamo.replay.api, "run_trace_replay", abort)
    scenario = load_scenario(SCENARIOS / "multiturn-validation.yaml", SMALL_AGENTS)
    with pytest.raises(ValidationUnavailable, match=r"^Dynamo's replay failed \(kv_router\): replay invariant violated"):
        validate(scenario, tmp_path, ["kv_router"])


def test_randomized_runs_are_compared_with_their_noise() -> None:
    keys = [m.key for m in METRICS]

    def runs(reuse: list[float]) -> list[dict[str, float]]:
        return [{**{k: 100.0 for k in keys}, "prefix_reuse": r} for r in reuse]

    def mean(rs: list[dict[str, float]]) -> dict[str, float]:
        return {k: sum(r[k] for r in rs) / len(rs) for k in keys}

    dynamo, tasim_ = runs([0.60, 0.62, 0.64]), runs([0.57, 0.58, 0.59])
    by_key = {d.metric.key: d for d in differences(mean(dynamo), mean(tasim_), dynamo, tasim_)}
    reuse = by_key["prefix_reuse"]
    # 2 * sqrt(0.02**2 / 3 + 0.01**2 / 3): two standard errors of the difference of the means
    assert reuse.noise == pytest.approx(2 * (0.0005 / 3) ** 0.5)
    assert reuse.value == pytest.approx(-0.04)
    assert reuse.within  # 4 pp apart, but the tolerance (2 pp) plus 2.58 pp of noise covers it
    assert reuse.shown() == "-4.00 ± 2.58 pp"
    assert by_key["output_tok_s"].noise == 0.0  # identical runs: nothing to allow for
    # Single runs (deterministic routers) get no allowance.
    single = {d.metric.key: d for d in differences(mean(dynamo), mean(tasim_))}["prefix_reuse"]
    assert single.noise == 0.0 and single.within is False
