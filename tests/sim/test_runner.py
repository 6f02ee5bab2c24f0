"""The simulation host: routing, holding and resuming, arrivals, determinism."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tasim.config.scenario import Scenario, parse_scenario
from tasim.core import events as ev
from tasim.core.cluster_view import ClusterView
from tasim.core.kv_tier import KvTier
from tasim.core.model import RequestSpec
from tasim.policies import Hold, Policy, Resume, Route
from tasim.policies.interface import NoParams, ProgramDecision
from tasim.sim.runner import Simulation, host_tier_setup


def _scenario(**workload) -> Scenario:
    raw = {
        "duration_s": 60,
        "cluster": {"backends": 2, "engine": {"kv_blocks": 4000}},
        "workload": {
            "concurrency": 3,
            "turns": 4,
            "task_prompt_tokens": 300,
            "output_tokens": 20,
            "observation_tokens": 50,
            "tool_latency_s": 0.5,
            **workload,
        },
        "metrics": {"sample_interval_s": 10},
    }
    return Scenario.model_validate(raw)


def _run(scenario: Scenario, policy: Policy | None = None) -> list[ev.Event]:
    log: list[ev.Event] = []
    Simulation(scenario, log.append, policy).run()
    return log


def test_round_robin_alternates_workers_per_request() -> None:
    log = _run(_scenario())
    workers = [e.worker for e in log if isinstance(e, ev.RequestRouted)]
    assert len(workers) > 20
    assert workers == [("w0", "w1")[i % 2] for i in range(len(workers))]


def test_every_request_finishes_or_is_in_flight_at_the_end() -> None:
    log = _run(_scenario())
    arrived = {e.request for e in log if isinstance(e, ev.RequestArrived)}
    finished = {e.request for e in log if isinstance(e, ev.RequestFinished)}
    end = log[-1]
    assert isinstance(end, ev.RunEnded)
    assert len(arrived - finished) == end.unfinished_requests
    times = [e.t for e in log]
    assert times == sorted(times)


class HoldThenResume(Policy):
    """Holds every first request of a program; resumes all held programs on the next tick."""

    name = "hold_then_resume"
    tick_interval_s = 2.0

    def __init__(self, view, params, rng) -> None:  # type: ignore[no-untyped-def]
        super().__init__(view, params, rng)
        self.held: list[str] = []

    def on_request(self, request: RequestSpec, now: float) -> Route | Hold:
        if request.turn == 0:
            self.held.append(request.program)
            return Hold()
        return Route("w1")

    def on_tick(self, now: float) -> Sequence[ProgramDecision]:
        resumed = [Resume(p, "w0") for p in self.held]
        self.held = []
        return resumed


def test_held_requests_go_where_the_resume_says() -> None:
    scenario = _scenario()
    sim_view = Simulation(scenario, lambda e: None).view
    log = _run(scenario, HoldThenResume(sim_view, NoParams(), np.random.default_rng(0)))
    p0 = [
        (type(e).__name__, e.t)
        for e in log
        if isinstance(e, (ev.RequestHeld, ev.ProgramResumed)) and e.program == "p0" or isinstance(e, ev.RequestRouted) and e.request.startswith("p0.")
    ]
    assert p0[:3] == [("RequestHeld", 0.0), ("ProgramResumed", 2.0), ("RequestRouted", 2.0)]
    routed = {e.request: e.worker for e in log if isinstance(e, ev.RequestRouted)}
    assert routed["p0.0"] == "w0" and routed["p0.1"] == "w1"


def test_poisson_arrivals_follow_the_rate() -> None:
    scenario = _scenario(arrival="poisson", rate_per_s=2.0, turns=1)
    scenario = scenario.model_copy(update={"duration_s": 300.0})
    started = sum(isinstance(e, ev.ProgramStarted) for e in _run(scenario))
    assert 540 <= started <= 660  # 600 expected; Poisson sd ~24.5


def test_same_seed_same_log_different_seed_differs() -> None:
    a, b = _run(_scenario()), _run(_scenario())
    assert a == b
    other = _scenario().model_copy(update={"seed": 5})
    assert _run(other) != a


def test_core_simulator_needs_no_live_dependencies() -> None:
    """The simulator runs with torch, verl, ray and Dynamo unimportable."""
    import subprocess
    import sys

    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'verl', 'ray', 'dynamo', 'transformers'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
from tasim.config.scenario import Scenario
from tasim.sim.runner import Simulation
events = []
Simulation(Scenario.model_validate({'duration_s': 10, 'workload': {'concurrency': 2}}), events.append).run()
assert len(events) > 10
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_output_blocks_are_reused_only_when_the_engine_reuses_them() -> None:
    """One program on one worker: turn 0 prompt 100 tokens + 40 output, turn 1 prompt 160. With
    reuse, turn 1 hits every full block of turn 0's prompt + output except the one holding its
    last (never computed) token: 8 blocks. Dynamo's mocker caches generated blocks under its own
    random token ids, so only the 6 full blocks of turn 0's prompt hit."""

    def cached_on_second_turn(reuse: bool) -> int:
        raw = {
            "duration_s": 60,
            "cluster": {"backends": 1, "engine": {"kv_blocks": 400, "reuse_output_blocks": reuse}},
            "workload": {
                "concurrency": 1,
                "programs": 1,
                "turns": 2,
                "task_prompt_tokens": 100,
                "output_tokens": 40,
                "observation_tokens": 20,
                "tool_latency_s": 0.5,
            },
        }
        finished = [e for e in _run(Scenario.model_validate(raw)) if isinstance(e, ev.RequestFinished)]
        assert [(e.request, e.prompt_tokens) for e in finished] == [("p0.0", 100), ("p0.1", 160)]
        return finished[1].cached_tokens

    assert cached_on_second_turn(True) == 128
    assert cached_on_second_turn(False) == 96


def test_a_finite_agent_workload_ends_when_its_programs_have_run() -> None:
    log = _run(_scenario(programs=5, concurrency=2))
    finished = [e for e in log if isinstance(e, ev.ProgramFinished)]
    assert sorted(e.program for e in finished) == [f"p{i}" for i in range(5)]
    assert isinstance(log[-1], ev.RunEnded) and log[-1].t == finished[-1].t < 60


def test_policy_defaults_reach_whichever_policy_a_run_selects() -> None:
    """A deployment's per-policy parameters (policy.defaults) apply to the selected policy, as
    compare and --policy select it, and policy.params override them."""

    def routes(policy: dict) -> dict[str, set[str]]:
        raw = _scenario().model_dump() | {"policy": policy}
        log = _run(Scenario.model_validate(raw))
        by_program: dict[str, set[str]] = {}
        for e in log:
            if isinstance(e, ev.RequestRouted):
                by_program.setdefault(e.request.split(".")[0], set()).add(e.worker)
        return by_program

    defaults = {"round_robin": {"session_affinity_ttl_s": 100.0}}
    sticky = routes({"name": "round_robin", "params": {}, "defaults": defaults})
    assert all(len(workers) == 1 for workers in sticky.values())
    assert set().union(*sticky.values()) == {"w0", "w1"}
    blind = routes({"name": "round_robin", "params": {"session_affinity_ttl_s": None}, "defaults": defaults})
    assert any(len(workers) == 2 for workers in blind.values())
    other = Scenario.model_validate(_scenario().model_dump() | {"policy": {"name": "random", "defaults": defaults}})
    assert other.policy.effective_params == {}


# --- engine flavours ---------------------------------------------------------------------------


def _one_request(prompt: int, output: int, **engine: object) -> list[ev.Event]:
    """One program of one call on one worker of 10 blocks of 16 tokens."""
    raw = {
        "duration_s": 60,
        "cluster": {"backends": 1, "engine": {"block_size": 16, "kv_blocks": 10, **engine}},
        "workload": {
            "concurrency": 1,
            "programs": 1,
            "turns": 1,
            "task_prompt_tokens": prompt,
            "output_tokens": output,
            "max_context_tokens": 10_000,
        },
    }
    return _run(Scenario.model_validate(raw))


def test_the_vllm_flavour_keeps_a_null_block_and_serves_what_the_rest_holds() -> None:
    """vLLM serves up to (10 - 1) x 16 = 144 tokens: a 140-token prompt gets its output cut
    from 10 to 4 tokens, a 144-token prompt is refused at routing, and the mocker flavour (every
    block holds KV, 160 tokens) runs the first whole."""
    cut = [e for e in _one_request(140, 10) if isinstance(e, (ev.RequestFinished, ev.RequestDropped))]
    assert [(type(e).__name__, getattr(e, "output_tokens", None)) for e in cut] == [("RequestFinished", 4)]
    refused = [e for e in _one_request(144, 10) if isinstance(e, ev.RequestDropped)]
    assert [e.reason for e in refused] == ["prompt of 144 tokens reaches max_model_len 144"]
    whole = [e for e in _one_request(140, 10, flavour="mocker") if isinstance(e, ev.RequestFinished)]
    assert [e.output_tokens for e in whole] == [10]
    header = _one_request(140, 10)[0]
    assert isinstance(header, ev.RunStarted) and header.kv_blocks_per_worker == 9


def test_the_flavours_set_eviction_and_output_reuse_unless_given() -> None:
    def engine(**given: object) -> tuple[str, bool, str]:
        config = Scenario.model_validate({"cluster": {"engine": given}}).cluster.engine
        return config.flavour, config.reuse_output_blocks, config.eviction

    assert engine() == ("vllm", True, "lru")
    assert engine(flavour="mocker") == ("mocker", False, "lineage")
    assert engine(flavour="mocker", eviction="lru", reuse_output_blocks=True) == ("mocker", True, "lru")


def test_the_vllm_flavour_refuses_what_vllm_cannot_do() -> None:
    import pytest

    from tasim.config.scenario import ScenarioError, parse_scenario

    with pytest.raises(
        ScenarioError,
        match=r"^s: cluster.engine: eviction lineage is Dynamo mocker's order; flavour vllm "
        r"evicts lru \(or set flavour: mocker\)",
    ):
        parse_scenario({"cluster": {"engine": {"eviction": "lineage"}}}, "s")
    with pytest.raises(ScenarioError, match=r"kv_blocks must be at least 2 with flavour vllm"):
        parse_scenario({"cluster": {"engine": {"kv_blocks": 1}}}, "s")


class RecordsKvEvents(Policy):
    """Round robin that records every KV event it hears, with its tier."""

    wants_kv_events = True

    def __init__(self, view: ClusterView, params: NoParams, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        self.heard: list[tuple[str, str, str, tuple[int, ...]]] = []
        self._next = 0

    def on_request(self, request: RequestSpec, now: float) -> Route:
        self._next += 1
        return Route(self.serving[self._next % len(self.serving)])

    def on_kv_stored(self, worker: str, blocks: Sequence[int], now: float, tier: KvTier = "device") -> None:
        self.heard.append(("kv_stored", tier, worker, tuple(blocks)))

    def on_kv_removed(self, worker: str, blocks: Sequence[int], now: float, tier: KvTier = "device") -> None:
        self.heard.append(("kv_removed", tier, worker, tuple(blocks)))


def test_a_policy_hears_the_host_tiers_kv_events_with_their_tier() -> None:
    """Host-tier stores and evictions reach a policy that wants KV events, in the order and with
    the tier the log has them, beside the GPU's."""
    raw = _scenario(concurrency=8, task_prompt_tokens=600).model_dump()
    raw["cluster"]["engine"].update(kv_blocks=120, host_tier={"blocks": 60, "kv_bytes_per_token": 131072})
    raw["metrics"]["log_kv_events"] = True
    scenario = Scenario.model_validate(raw)
    policy = RecordsKvEvents(Simulation(scenario, lambda e: None).view, NoParams(), np.random.default_rng(0))
    log = _run(scenario, policy)
    logged = [(e.TYPE, e.tier, e.worker, e.blocks) for e in log if isinstance(e, (ev.KvStored, ev.KvRemoved))]
    assert {tier for _, tier, _, _ in logged} == {"device", "host"}
    assert ("kv_removed", "host") in {(kind, tier) for kind, tier, _, _ in logged}  # the host tier filled up
    assert policy.heard == logged


def test_an_sglang_host_tier_takes_sglangs_defaults() -> None:
    raw = {"workload": {"concurrency": 1}, "cluster": {"engine": {"block_size": 16, "kv_blocks": 1001}}}
    setup = host_tier_setup(parse_scenario(raw, "s.yaml", ["cluster.engine.host_tier.ratio=2", "cluster.engine.host_tier.semantics=sglang"]))
    assert setup is not None
    assert (setup.semantics, setup.write_policy, setup.load_back_threshold, setup.blocks) == ("sglang", "write_through", 10, 2001)
    chosen = parse_scenario(
        raw,
        "s.yaml",
        [
            "cluster.engine.host_tier.ratio=2",
            "cluster.engine.host_tier.semantics=sglang",
            "cluster.engine.host_tier.write_policy=write_back",
            "cluster.engine.host_tier.load_back_threshold=0",
        ],
    )
    setup = host_tier_setup(chosen)
    assert setup is not None and (setup.write_policy, setup.load_back_threshold) == ("write_back", 0)
