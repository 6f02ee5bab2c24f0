"""Autellix (arXiv 2502.13965): its load balancer (Alg. 2) and PLAS priorities, exact values;
and a simulation on vLLM's priority scheduling."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
from conftest import SCENARIOS

from tasim.config.scenario import ScenarioError, load_scenario
from tasim.core import events as ev
from tasim.core.cluster_view import ClusterView, WorkerInfo
from tasim.core.model import RequestSpec
from tasim.policies import Route, TurnEnd, make_policy
from tasim.policies.autellix import Autellix
from tasim.sim.runner import Simulation

VIEW = ClusterView(tuple(WorkerInfo(f"w{i}", 16, 1000, 256, 8192) for i in range(3)))


def _policy(**params: object) -> Autellix:
    policy = make_policy("autellix", params, VIEW, np.random.default_rng(0))
    assert isinstance(policy, Autellix)
    return policy


def _call(rid: str, program: str, prompt: int) -> RequestSpec:
    return RequestSpec(rid, program, 0, prompt, 10, 0, ())


def _end(policy: Autellix, rid: str, program: str, worker: str, first_token_at: float, now: float, ok: bool = True) -> None:
    policy.on_first_token(rid, worker, first_token_at)
    policy.on_turn_end(TurnEnd(program, rid, worker, 100, 10, 0, ok=ok), now)


def test_short_calls_go_to_the_least_used_engine_and_long_calls_stay_with_their_program() -> None:
    policy = _policy()
    assert policy.on_request(_call("a.0", "a", 3000), 0.0) == Route("w0")  # long: least used, recorded
    assert policy.on_request(_call("b.0", "b", 100), 0.0) == Route("w1")  # short: least used
    assert policy.on_request(_call("c.0", "c", 2048), 0.0) == Route("w2")  # 2,048 tokens is still short
    assert policy.on_request(_call("d.0", "d", 100), 0.0) == Route("w0")  # a tie of one call each: first in order
    assert policy.calls_on == {"w0": 2, "w1": 1, "w2": 1}
    _end(policy, "a.0", "a", "w0", 0.5, 1.0)
    _end(policy, "d.0", "d", "w0", 0.5, 1.0)
    assert policy.on_request(_call("a.1", "a", 100), 2.0) == Route("w0")  # short: least used, which is w0 now
    assert policy.on_request(_call("e.0", "e", 5000), 2.0) == Route("w0")  # long, new: least used (tie w0, first)
    _end(policy, "a.1", "a", "w0", 2.5, 3.0)
    assert policy.on_request(_call("a.2", "a", 5000), 3.0) == Route("w0", 0)  # long: its program's engine, though w0 is busiest
    assert policy.engine_of == {"a": "w0", "e": "w0"}  # short calls never changed the table


def test_plas_queues_follow_the_programs_attained_service() -> None:
    """Service is the time from a call's first token to its end, summed over the program's
    completed calls; queues end at 2, 4, 8, 16, 32 and 64 s."""
    policy = _policy()
    assert policy.on_request(_call("a.0", "a", 100), 0.0).priority == 0
    _end(policy, "a.0", "a", "w0", 1.0, 2.5)  # 1.5 s
    assert policy.service_s == {"a": 1.5} and policy.queue("a") == 0
    policy.on_request(_call("a.1", "a", 100), 3.0)
    _end(policy, "a.1", "a", "w0", 3.5, 4.0)  # 0.5 s more: 2.0 s, the start of queue 1
    assert policy.on_request(_call("a.2", "a", 100), 5.0) == Route("w0", 1)
    _end(policy, "a.2", "a", "w0", 5.0, 75.0)  # 70 s more: past the last boundary
    assert policy.queue("a") == 6
    policy.on_request(_call("a.3", "a", 100), 80.0)
    _end(policy, "a.3", "a", "w0", 81.0, 90.0, ok=False)  # a failed call adds nothing
    assert policy.service_s["a"] == 72.0
    policy.on_request(_call("a.4", "a", 100), 91.0)
    policy.on_turn_end(TurnEnd("a", "a.4", "w0", 100, 0, 0), 92.0)  # no first token seen: nothing to add
    assert policy.service_s["a"] == 72.0 and policy.calls_on == {"w0": 0, "w1": 0, "w2": 0}
    policy.on_program_end("a", 93.0)
    assert policy.queue("a") == 0 and policy.service_s == {}


def test_custom_queue_boundaries_and_their_validation() -> None:
    policy = _policy(queue_boundaries_s=[1.0, 10.0])
    policy.on_request(_call("a.0", "a", 100), 0.0)
    _end(policy, "a.0", "a", "w0", 0.0, 5.0)
    assert policy.queue("a") == 1
    with pytest.raises(ValueError, match="strictly increasing"):
        _policy(queue_boundaries_s=[2.0, 2.0])


def test_a_lost_worker_leaves_the_table_and_the_count() -> None:
    policy = _policy()
    assert policy.on_request(_call("a.0", "a", 5000), 0.0) == Route("w0")
    policy.on_worker_lost("w0", 1.0)
    policy.on_turn_end(TurnEnd("a", "a.0", "w0", 5000, 0, 0, ok=False), 1.0)
    assert policy.on_request(_call("a.1", "a", 5000), 1.0) == Route("w1")
    assert policy.engine_of == {"a": "w1"}


def test_the_scenario_refuses_autellix_without_priority_scheduling() -> None:
    with pytest.raises(ScenarioError, match="set cluster.engine.scheduling_policy: priority"):
        load_scenario(SCENARIOS / "swe-agent.yaml", ["policy.name=autellix", "policy.params={}"])
    with pytest.raises(ScenarioError, match="mocker schedules fcfs"):
        load_scenario(SCENARIOS / "live-mocker.yaml", ["cluster.engine.scheduling_policy=priority"])
    with pytest.raises(ScenarioError, match="leave preemption unset"):
        load_scenario(SCENARIOS / "swe-agent.yaml", ["cluster.engine.scheduling_policy=priority", "cluster.engine.preemption=oldest_first"])


def test_in_a_simulation_every_admission_takes_the_waiting_call_first_in_plas_order() -> None:
    """The policy's priorities reach vLLM's priority scheduling through the whole simulation:
    on crowded engines, every admission (first or after a preemption) takes, among the calls
    waiting on that worker, the one first by (PLAS queue, arrival). Queues are rebuilt from the
    log as the policy builds them: first token to end, summed over a program's completed calls."""
    scenario = load_scenario(
        SCENARIOS / "swe-agent.yaml",
        [
            "policy.name=autellix",
            "policy.params={queue_boundaries_s: [5, 10, 20, 40, 80]}",
            "cluster.engine.scheduling_policy=priority",
            "cluster.backends=2",
            "cluster.engine.kv_blocks=3000",
            "workload.concurrency=192",
            "duration_s=500",
            "metrics.warmup_s=0",
        ],
    )
    events: list[ev.Event] = []
    Simulation(scenario, events.append, check=True).run()
    bounds = (5.0, 10.0, 20.0, 40.0, 80.0)
    program_of = {e.request: e.program for e in events if isinstance(e, ev.RequestArrived)}
    service: dict[str, float] = {}
    first_token: dict[str, float] = {}
    key: dict[str, tuple[int, int]] = {}  # call -> (queue, arrival at its engine)
    waiting: dict[str, set[str]] = {}  # worker -> calls queued there
    admissions = jumped = 0
    for e in events:
        if isinstance(e, ev.RequestRouted):
            key[e.request] = (bisect.bisect_right(bounds, service.get(program_of[e.request], 0.0)), len(key))
            waiting.setdefault(e.worker, set()).add(e.request)
        elif isinstance(e, (ev.PrefillStarted, ev.RequestReadmitted)):
            queued = waiting[e.worker]
            assert key[e.request] == min(key[r] for r in queued), f"t={e.t}: {e.request} admitted ahead of a call first in PLAS order"
            jumped += any(key[r][1] < key[e.request][1] for r in queued)  # an earlier arrival passed over
            queued.remove(e.request)
            admissions += 1
        elif isinstance(e, ev.RequestPreempted):
            waiting[e.worker].add(e.request)
        elif isinstance(e, ev.RequestDropped) and e.worker:
            waiting[e.worker].discard(e.request)
        elif isinstance(e, ev.FirstToken):
            first_token[e.request] = e.t
        elif isinstance(e, ev.RequestFinished) and e.request in first_token:
            service[e.program] = service.get(e.program, 0.0) + e.t - first_token.pop(e.request)
    assert admissions > 1000 and jumped > 100  # the order differed from first come, first served
    assert sum(isinstance(e, ev.RequestPreempted) for e in events) > 10
