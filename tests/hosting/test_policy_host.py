"""The simulator and the live router host a policy alike: one decision stream, one event sequence.

A scripted policy makes every kind of decision (route, hold with and without a pause, pause,
resume, forced resume, pin) and writes a marker into the run's trace at each tick. The simulator
runs it on a small agent workload; then the live host is driven with what the live router would
see for that same run (each call's arrival, first token and usage, each session-final, each
tick, at the simulated times) and must log the same host events in the same order. Either host
reordering its events on its own breaks the comparison.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from conftest import SCENARIOS

from tasim.config.scenario import load_scenario
from tasim.config.workers import cluster_view
from tasim.core import events as ev
from tasim.core.cluster_view import ClusterView
from tasim.core.events import to_record
from tasim.core.model import RequestSpec
from tasim.live.router.live_host import Call, Held, PolicyHost
from tasim.policies import Hold, Pause, Pin, Policy, Resume, Route, TurnEnd
from tasim.policies.interface import ProgramDecision, RequestDecision
from tasim.sim.runner import Simulation


@dataclass(frozen=True)
class Tick:
    t: float


class Scripted(Policy):
    """Programs by order of arrival: A always on w0, pinned there after its first turn; B held
    with a pause until A's first turn ends, then on w1, and paused when A ends; C on w1, paused
    after its first turn. A paused program's next call is held until the next tick resumes it
    (forced) on w0."""

    name = "scripted"
    holds_requests = True
    tick_interval_s = 0.5

    def __init__(self, view: ClusterView, trace: list[Any]) -> None:
        super().__init__(view, Policy.params_model(), np.random.default_rng(0))
        self.trace = trace
        self.order: dict[str, str] = {}
        self.paused: set[str] = set()
        self.ended: set[str] = set()
        self.waiting_for_tick: list[str] = []

    def on_program_start(self, program: str, now: float) -> None:
        self.order[program] = "ABCDEFGH"[len(self.order)]

    def on_request(self, request: RequestSpec, now: float) -> RequestDecision:
        role = self.order[request.program]
        if role == "B" and request.turn == 0:
            return Hold(pause=True)
        if request.program in self.paused:
            self.paused.remove(request.program)
            self.waiting_for_tick.append(request.program)
            return Hold()
        return Route("w0" if role == "A" else "w1")

    def on_turn_end(self, turn: TurnEnd, now: float) -> list[ProgramDecision]:
        role = self.order[turn.program]
        if role == "A" and turn.request.endswith(".0"):
            (b,) = (p for p, r in self.order.items() if r == "B")
            return [Pin(turn.program, "w0", 5.0), Resume(b, "w1")]
        if role == "C" and turn.request.endswith(".0"):
            self.paused.add(turn.program)
            return [Pause(turn.program)]
        return []

    def on_program_end(self, program: str, now: float) -> list[ProgramDecision]:
        self.ended.add(program)
        if self.order[program] != "A":
            return []
        (b,) = (p for p, r in self.order.items() if r == "B")
        if b in self.ended:
            return []
        self.paused.add(b)
        return [Pause(b)]

    def on_tick(self, now: float) -> list[ProgramDecision]:
        self.trace.append(Tick(now))
        resumed, self.waiting_for_tick = self.waiting_for_tick, []
        return [Resume(p, "w0", forced=True) for p in resumed]


HOST_EVENTS = (
    ev.ProgramStarted,
    ev.RequestArrived,
    ev.RequestRouted,
    ev.RequestHeld,
    ev.ProgramPaused,
    ev.ProgramResumed,
    ev.FirstToken,
    ev.RequestFinished,
    ev.RequestDropped,
    ev.ProgramFinished,
)


def host_sequence(trace: list[Any]) -> list[Any]:
    """What the policy host logs, in order, with the ticks between. A program's planned turns
    are the simulator's to know (a live client does not say), so they are left out."""
    sequence: list[Any] = []
    for item in trace:
        if isinstance(item, Tick):
            sequence.append(("tick", item.t))
        elif isinstance(item, HOST_EVENTS):
            record = to_record(item)
            record.pop("planned_turns", None)
            sequence.append(record)
    return sequence


@pytest.fixture(scope="module")
def simulated() -> tuple[list[Any], Simulation]:
    overrides = ["workload.concurrency=3", "workload.programs=3", "workload.turns=3", "workload.setup_s=0"]
    scenario = load_scenario(SCENARIOS / "live-mocker.yaml", overrides)
    trace: list[Any] = []
    simulation = Simulation(scenario, trace.append, policy=Scripted(cluster_view(scenario), trace))
    simulation.run()
    return trace, simulation


def drive_live(sim_trace: list[Any], block_size: int, view: ClusterView) -> tuple[list[Any], PolicyHost]:
    """Feed the live host what the router would see of the simulated run, at its times."""
    trace: list[Any] = []
    clock = [0.0]
    host = PolicyHost(Scripted(view, trace), lambda: clock[0], trace.append, block_size)
    calls: dict[str, Call | Held] = {}

    def call(request: str) -> Call:
        admitted = calls[request]
        return admitted if isinstance(admitted, Call) else admitted.future.result()

    async def replay() -> None:
        for item in sim_trace:
            if isinstance(item, Tick):
                clock[0] = item.t
                host.tick()
                continue
            clock[0] = item.t
            if isinstance(item, ev.RequestArrived):
                calls[item.request] = host.decide(item.program, [7] * item.prompt_tokens, item.output_tokens)
            elif isinstance(item, ev.FirstToken):
                host.call_first_token(call(item.request))
            elif isinstance(item, ev.RequestFinished):
                host.finish(call(item.request), item.prompt_tokens, item.output_tokens, item.cached_tokens)
            elif isinstance(item, ev.ProgramFinished):
                assert item.released
                host.session_final(item.program)

    asyncio.run(replay())
    return trace, host


def test_one_decision_stream_gives_one_event_sequence_in_both_hosts(simulated: tuple[list[Any], Simulation]) -> None:
    sim_trace, simulation = simulated
    live_trace, host = drive_live(sim_trace, simulation.block_size, simulation.view)
    expected = host_sequence(sim_trace)
    assert host_sequence(live_trace) == expected
    # the stream really holds every kind of decision
    kinds = [r["type"] if isinstance(r, dict) else r[0] for r in expected]
    for kind in ("request_held", "program_paused", "program_resumed", "request_routed", "request_finished", "program_finished", "tick"):
        assert kind in kinds, kind
    resumes = [r for r in expected if isinstance(r, dict) and r["type"] == "program_resumed"]
    assert [(r["program"], r["forced"]) for r in resumes] == [("p1", False), ("p2", True), ("p1", True)]


def test_a_pin_is_kept_by_the_simulator_and_counted_as_ignored_live(simulated: tuple[list[Any], Simulation]) -> None:
    sim_trace, simulation = simulated
    _, host = drive_live(sim_trace, simulation.block_size, simulation.view)
    pins = [e for e in sim_trace if isinstance(e, ev.ProgramPinned)]
    assert [(p.worker, p.ttl_s) for p in pins] == [("w0", 5.0)]
    assert (simulation.ignored_pins, host.ignored_pins) == (0, 1)
    # both hosts count the same traffic
    for counter in ("routed", "finished", "failed", "pauses", "resumes"):
        assert getattr(simulation, counter) == getattr(host, counter), counter
    assert simulation.in_flight == host.in_flight == 0
