"""Workload drivers: turn the scenario's workload into program processes over time.

`start_workload` starts the processes for the workload kind and returns an event that fires
when a finite workload (a trace, a number of RL steps) is complete, or None for open-ended ones
(which run until ``duration_s``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import simpy

from tasim.model import RequestSpec, with_private_tail
from tasim.scenario import AgentWorkload, DynamoTraceWorkload, MooncakeTraceWorkload, RolloutWorkload
from tasim.traces import TraceRequest, read_dynamo_agent_trace, read_mooncake
from tasim.workloads import Script, agent_script, plan_program

if TYPE_CHECKING:
    from tasim.sim.runner import Simulation

# Owner keys for the generated-token blocks of replayed requests (see tasim.model).
_TRACE_OWNER_BASE = 1 << 26


def start_workload(sim: Simulation) -> simpy.Event | None:
    workload = sim.scenario.workload
    env = sim.env
    if isinstance(workload, AgentWorkload):
        counter = iter(range(workload.programs or 1 << 62))
        if workload.arrival == "closed":
            slots = [env.process(_closed_loop_slot(sim, workload, counter)) for _ in range(workload.concurrency)]
            return env.all_of(slots) if workload.programs else None
        arrivals = env.process(_poisson_arrivals(sim, workload, counter))
        return arrivals if workload.programs else None
    if isinstance(workload, RolloutWorkload):
        from tasim.sim.rollout import rollout_steps

        return env.process(rollout_steps(sim, workload))
    if isinstance(workload, MooncakeTraceWorkload):
        return env.process(_replay_mooncake(sim, workload))
    if isinstance(workload, DynamoTraceWorkload):
        return env.process(_replay_dynamo(sim, workload))
    raise TypeError(f"unsupported workload {workload!r}")


def _agent(sim: Simulation, workload: AgentWorkload, index: int) -> Script:
    plan = plan_program(workload, sim.scenario.seed, index, sim.scenario.max_context_tokens)
    return agent_script(plan, sim.block_size)


# A closed-loop slot whose programs keep finishing without simulated time passing (no turn fits
# max_context_tokens, or every first request is dropped) would spin forever at one instant.
_MAX_INSTANT_PROGRAMS = 1000


class WorkloadError(ValueError):
    """The workload cannot make progress; the message says which setting to change."""


def _closed_loop_slot(sim: Simulation, workload: AgentWorkload, counter: Iterator[int]) -> Generator[simpy.Event, object, None]:
    instant = 0
    for index in counter:  # shared by every slot; a finite workload ends when it runs out
        if sim.env.now >= sim.scenario.duration_s:
            return
        started = sim.env.now
        yield sim.env.process(sim.run_program(_agent(sim, workload, index)))
        instant = instant + 1 if sim.env.now == started else 0
        if instant >= _MAX_INSTANT_PROGRAMS:
            raise WorkloadError(
                f"programs finish without taking simulated time (at t={started:g} s): no turn fits "
                "workload.max_context_tokens, or every first request is dropped (see cluster.engine.kv_blocks)"
            )


def _poisson_arrivals(sim: Simulation, workload: AgentWorkload, counter: Iterator[int]) -> Generator[simpy.Event, object, None]:
    assert workload.rate_per_s is not None
    programs = []  # kept only for a finite workload, whose end waits for them
    for index in counter:
        yield sim.env.timeout(float(sim.arrival_rng.exponential(1.0 / workload.rate_per_s)))
        program = sim.env.process(sim.run_program(_agent(sim, workload, index)))
        if workload.programs:
            programs.append(program)
    yield sim.env.all_of(programs)


def _replay_mooncake(sim: Simulation, workload: MooncakeTraceWorkload) -> Generator[simpy.Event, object, None]:
    requests = read_mooncake(Path(workload.path), sim.block_size, workload.trace_block_size)[: workload.max_requests]
    programs = []
    for turns in _by_session(requests):
        arrival = turns[0].arrival_s / workload.arrival_speedup
        if arrival > sim.env.now:
            yield sim.env.timeout(arrival - sim.env.now)
        first = turns[0]
        program = f"r{first.index}" if first.session is None else f"s:{first.session}"
        script = Script(program, len(turns), _trace_calls(sim, program, turns))
        programs.append(sim.env.process(sim.run_program(script)))
    yield sim.env.all_of(programs)


def _by_session(requests: list[TraceRequest]) -> Iterator[list[TraceRequest]]:
    """Each session's turns: the reader keeps them together, first turn first."""
    turns: list[TraceRequest] = []
    for request in requests:
        if request.turn == 0 and turns:
            yield turns
            turns = []
        turns.append(request)
    if turns:
        yield turns


def _trace_calls(sim: Simulation, program: str, turns: list[TraceRequest]) -> Iterator[tuple[float, RequestSpec]]:
    history = 0
    for request in turns:
        prompt, output = _at_least_one(request.prompt_tokens, request.output_tokens)
        hashes = with_private_tail(request.block_hashes, prompt + output, _TRACE_OWNER_BASE + request.index, sim.block_size)
        yield request.delay_s, RequestSpec(f"{program}.{request.turn}", program, request.turn, prompt, output, history, hashes)
        history = prompt + output


def _replay_dynamo(sim: Simulation, workload: DynamoTraceWorkload) -> Generator[simpy.Event, object, None]:
    sessions = read_dynamo_agent_trace(Path(workload.path), sim.block_size)[: workload.max_sessions]
    programs = []
    owners = iter(range(_TRACE_OWNER_BASE, 1 << 34))  # one per replayed request
    for session in sessions:
        if session.start_s > sim.env.now:
            yield sim.env.timeout(session.start_s - sim.env.now)
        script = Script(session.id, len(session.turns), _session_calls(sim, session, owners, workload.gap_scale))
        programs.append(sim.env.process(sim.run_program(script)))
    yield sim.env.all_of(programs)


def _session_calls(sim: Simulation, session, owners, gap_scale: float):  # type: ignore[no-untyped-def]
    bs = sim.block_size
    history = 0
    for turn, step in enumerate(session.turns):
        prompt, output = _at_least_one(step.prompt_tokens, step.output_tokens)
        hashes = with_private_tail(step.block_hashes, prompt + output, next(owners), bs)
        yield step.gap_before_s * gap_scale, RequestSpec(f"{session.id}.{turn}", session.id, turn, prompt, output, history, hashes)
        history = prompt + output


def _at_least_one(prompt_tokens: int, output_tokens: int) -> tuple[int, int]:
    """Traces may record empty prompts or outputs; an engine always computes at least one prompt
    token and emits at least the first output token, so both count as one."""
    return max(1, prompt_tokens), max(1, output_tokens)
