"""Fast-forwarding decode steps (tasim.sim.engine.fast_forward) changes nothing but speed: the event log,
KV events included, is identical to simulating every step on its own."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO, small_async_rollout

from tasim.config.scenario import Scenario, load_scenario
from tasim.core import events as ev
from tasim.sim.clock import STEP_END_PRIORITY, STEP_START_PRIORITY, Alarm, Clock
from tasim.sim.perf import make_perf_model
from tasim.sim.perf.perf_model import decode_shape
from tasim.sim.runner import Simulation

PRESETS = REPO / "scenarios"


def _log(scenario: Scenario, fast_forward: bool, mixed: list[int] | None = None, copies: list[int] | None = None) -> tuple[list[ev.Event], int]:
    """The event log, and how many steps the simulation folded into runs (``mixed`` gets the
    number folded into decode-plus-prefill runs appended, ``copies`` those that completed host
    stores)."""
    log: list[ev.Event] = []
    simulation = Simulation(scenario, log.append, fast_forward=fast_forward)
    simulation.run()
    if mixed is not None:
        mixed.append(simulation.folded_prefill_steps)
    if copies is not None:
        copies.append(simulation.folded_copy_steps)
    return log, simulation.folded_steps


def _kv_logged(scenario: Scenario) -> Scenario:
    return scenario.model_copy(update={"metrics": scenario.metrics.model_copy(update={"log_kv_events": True})})


def _agents(policy: str, task_prompt_high: int = 900, **engine: object) -> Scenario:
    """Two small workers under pressure: preemptions, evictions, a queue that waits."""
    return Scenario.model_validate(
        {
            "seed": 3,
            "duration_s": 240,
            "cluster": {
                "backends": 2,
                "engine": {"block_size": 16, "kv_blocks": 600, "max_num_seqs": 12, "max_num_batched_tokens": 1024, **engine},
                "perf": {"model": "dynamo_polynomial"},
            },
            "workload": {
                "concurrency": 24,
                "system_prompt_tokens": 200,
                "task_prompt_tokens": {"kind": "uniform", "low": 100, "high": task_prompt_high},
                "turns": {"kind": "uniform", "low": 2, "high": 6},
                "output_tokens": {"kind": "uniform", "low": 20, "high": 300},
                "observation_tokens": {"kind": "uniform", "low": 30, "high": 400},
                "tool_latency_s": {"kind": "lognormal", "median": 0.5, "sigma": 0.6},
            },
            "policy": {"name": policy},
            "metrics": {"sample_interval_s": 5, "log_kv_events": True},
        }
    )


CASES = {
    "round_robin lru": _agents("round_robin"),
    "kv_router lineage": _agents("kv_router", flavour="mocker"),
    "thunderagent pauses": _agents("thunderagent", flavour="mocker"),
    "continuum pins": _agents("continuum"),
    "least_loaded oldest-first preemption": _agents("least_loaded", preemption="oldest_first"),
    "no prefix caching": _agents("round_robin", enable_prefix_caching=False),
    "no chunked prefill": _agents("kv_router", enable_chunked_prefill=False, max_num_batched_tokens=4096),
    "block size 1": _agents("round_robin", block_size=1, kv_blocks=9000),
    # prompts of up to five chunks: decodes folded with a chunked prefill
    "long prompts": _agents("round_robin", task_prompt_high=5000, kv_blocks=1600),
    "long prompts, oldest-first preemption": _agents("kv_router", task_prompt_high=5000, kv_blocks=1000, preemption="oldest_first"),
    "long prompts, no prefix caching": _agents("round_robin", task_prompt_high=5000, kv_blocks=1600, enable_prefix_caching=False),
    # a host tier of a third of the pool, copies slow enough to cut runs and to park requests for steps
    "host tier": _agents("round_robin", host_tier={"blocks": 200, "kv_bytes_per_token": 131072, "d2h_gbps": 0.5, "h2d_gbps": 0.5}),
    # the KV router credits host blocks, so it hears the stores that folded steps complete
    "host tier, kv_router": _agents("kv_router", host_tier={"ratio": 0.5, "d2h_gbps": 2.0, "h2d_gbps": 2.0}),
    "host tier, mocker": _agents("kv_router", flavour="mocker", host_tier={"ratio": 0.5, "d2h_gbps": 0.5, "h2d_gbps": 0.5}),
    # SGLang's tier: writes that hold their blocks and cut runs, loads that stretch their step,
    # write-backs that hold the evicting step; decodes folded with chunked prefills
    "sglang tier": _agents(
        "round_robin", host_tier={"semantics": "sglang", "blocks": 300, "kv_bytes_per_token": 131072, "d2h_gbps": 0.5, "h2d_gbps": 0.5}
    ),
    "sglang tier, selective, long prompts": _agents(
        "kv_router", task_prompt_high=5000, kv_blocks=1600, host_tier={"semantics": "sglang", "ratio": 0.5, "write_policy": "write_through_selective"}
    ),
    "sglang tier, write-back, mocker": _agents(
        "round_robin", flavour="mocker", host_tier={"semantics": "sglang", "blocks": 300, "write_policy": "write_back", "d2h_gbps": 0.5}
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_forward_leaves_the_event_log_unchanged(case: str) -> None:
    scenario = CASES[case]
    mixed: list[int] = []
    copies: list[int] = []
    fast, folded = _log(scenario, fast_forward=True, mixed=mixed, copies=copies)
    slow, not_folded = _log(scenario, fast_forward=False)
    assert not_folded == 0
    assert folded > 100  # the fast run really skipped steps
    if case.startswith("long prompts"):
        assert mixed[0] > 50  # decode steps folded with a prefill chunk
    if scenario.cluster.engine.enable_prefix_caching:
        assert any(isinstance(e, ev.KvRemoved) for e in slow)  # the pool was under pressure
    if scenario.cluster.engine.host_tier is not None:
        assert any(isinstance(e, ev.PrefillStarted) and e.host_tokens for e in slow)  # host hits were loaded
        assert any(isinstance(e, ev.KvRemoved) and e.tier == "host" for e in slow)  # the host tier was full
        if scenario.cluster.engine.host_tier.semantics == "vllm":
            assert copies[0] > 0, copies  # stores completed inside folded runs
    assert fast == slow


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_fast_forward_across_weight_syncs(mode: str) -> None:
    """A sync that begins at the instant a folded run's step ends: the run is cut to that
    instant and its engine aborts then, in worker order, as a stepped engine whose step ended
    then does (before this, it aborted after the other workers, and the retries went in
    another order)."""
    # separate_async trains in mini-steps that must divide a step's prompts
    scenario = _kv_logged(small_async_rollout(2, mode, **({"mini_steps": 2} if mode == "separate_async" else {})))
    fast, folded = _log(scenario, fast_forward=True)
    slow, _ = _log(scenario, fast_forward=False)
    assert folded > 0 and any(isinstance(e, ev.RequestRetried) for e in slow)
    assert fast == slow


@pytest.mark.parametrize("preset", ["live-mocker.yaml", "rl-live-mocker.yaml"])
def test_fast_forward_on_presets(preset: str) -> None:
    scenario = _kv_logged(load_scenario(PRESETS / preset))
    fast, folded = _log(scenario, fast_forward=True)
    slow, _ = _log(scenario, fast_forward=False)
    assert folded > 0
    assert fast == slow


def test_preset_with_a_host_tier() -> None:
    # a vLLM tier twice the pool on the calibrated preset: stores complete inside most runs
    scenario = _kv_logged(load_scenario(PRESETS / "swe-agent.yaml", ["cluster.engine.host_tier.ratio=2", "duration_s=400", "metrics.warmup_s=0"]))
    copies: list[int] = []
    fast, folded = _log(scenario, fast_forward=True, copies=copies)
    slow, _ = _log(scenario, fast_forward=False)
    assert folded > 0 and copies[0] > 100
    assert any(isinstance(e, ev.KvStored) and e.tier == "host" for e in slow)
    assert fast == slow


def test_roofline_preset_with_preemption() -> None:
    # 288 programs: in its first 300 s the calibrated preset preempts at 288 (7 times), barely at 96-192
    scenario = _kv_logged(load_scenario(PRESETS / "swe-agent.yaml", ["workload.concurrency=288", "duration_s=300", "metrics.warmup_s=0"]))
    fast, folded = _log(scenario, fast_forward=True)
    slow, _ = _log(scenario, fast_forward=False)
    assert folded > 0
    assert any(isinstance(e, ev.RequestPreempted) for e in slow)
    assert fast == slow


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("multiturn-validation.yaml", []),  # Dynamo's polynomial
        ("swe-agent.yaml", []),  # roofline, dense
        ("openhands-qwen3-235b.yaml", []),  # roofline, MoE
        ("rl-rollout.yaml", []),
        ("swe-agent.yaml", ["cluster.perf.model=fixed"]),
    ],
)
def test_decode_step_ends_match_single_steps_bit_for_bit(preset: str, overrides: list[str]) -> None:
    cluster = load_scenario(PRESETS / preset, overrides).cluster
    perf = make_perf_model(cluster)
    capacity = cluster.kv_blocks_per_worker() * cluster.engine.block_size
    rng = np.random.default_rng(0)
    for running in (1, 3, 17, 256):
        for context in (0, int(rng.integers(0, capacity)), capacity * 2):  # past the pool's size: the polynomial's cap
            start = float(rng.random())
            ends = perf.decode_step_ends(start, running, context, 300, capacity)
            singles, end = [], start
            for i in range(300):
                end = end + perf.step_time(decode_shape(running, context + i * running, capacity))
                singles.append(end)
            assert ends == singles


def test_alarms_fire_at_their_exact_time() -> None:
    # 0.357... + (1.467... - 0.357...) misses 1.467... by one unit in the last place, and no
    # delay added to 0.357... lands on it: alarms are scheduled at absolute times.
    fired: list[float] = []
    clock = Clock(lambda t: None)

    def sleeper():  # type: ignore[no-untyped-def]
        yield clock.timeout(0.3572143756209726)
        yield Alarm(clock, 1.4671021216854256, STEP_END_PRIORITY)
        fired.append(clock.now)

    clock.process(sleeper())
    clock.run()
    assert fired == [1.4671021216854256]
    with pytest.raises(ValueError):
        Alarm(clock, 1.0, STEP_END_PRIORITY)


def test_simultaneous_events_in_the_documented_order() -> None:
    seen: list[str] = []
    clock = Clock(lambda t: seen.append(f"catch up {t}"))

    def at_two(name: str, priority: int):  # type: ignore[no-untyped-def]
        yield Alarm(clock, 2.0, priority)
        seen.append(name)

    def timeout_two():  # type: ignore[no-untyped-def]
        yield clock.timeout(2.0)
        seen.append("arrival")

    clock.process(at_two("start w1", STEP_START_PRIORITY + 1))
    clock.process(at_two("start w0", STEP_START_PRIORITY))
    clock.process(timeout_two())
    clock.process(at_two("end w1", STEP_END_PRIORITY + 1))
    clock.process(at_two("end w0", STEP_END_PRIORITY))
    clock.run()
    assert seen == ["catch up 0.0", "catch up 2.0", "end w0", "end w1", "arrival", "start w0", "start w1"]
