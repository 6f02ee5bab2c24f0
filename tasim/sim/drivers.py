"""Workload drivers: turn the scenario's workload into program processes over time.

`start_workload` starts the processes for the workload kind and returns an event that fires
when a finite workload (a trace, a number of RL steps) is complete, or None for open-ended ones
(which run until ``duration_s``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

from tasim.config.scenario import AgentWorkload, DynamoTraceWorkload, MooncakeTraceWorkload, RolloutWorkload
from tasim.sim.clock import Event
from tasim.sim.program_runner import ProgramRunner
from tasim.workloads import Script, agent_script, dynamo_trace_scripts, mooncake_scripts, plan_program


def start_workload(sim: ProgramRunner) -> Event | None:
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
        return env.process(_replay(sim, mooncake_scripts(workload, sim.block_size)))
    if isinstance(workload, DynamoTraceWorkload):
        return env.process(_replay(sim, dynamo_trace_scripts(workload, sim.block_size)))
    raise TypeError(f"unsupported workload {workload!r}")


def _agent(sim: ProgramRunner, workload: AgentWorkload, index: int) -> Script:
    plan = plan_program(workload, sim.scenario.seed, index, sim.scenario.max_context_tokens)
    return agent_script(plan, sim.block_size)


# A closed-loop slot whose programs keep finishing without simulated time passing (no turn fits
# max_context_tokens, or every first request is dropped) would spin forever at one instant.
_MAX_INSTANT_PROGRAMS = 1000


class WorkloadError(ValueError):
    """The workload cannot make progress; the message says which setting to change."""


def _closed_loop_slot(sim: ProgramRunner, workload: AgentWorkload, counter: Iterator[int]) -> Generator[Event, object, None]:
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


def _poisson_arrivals(sim: ProgramRunner, workload: AgentWorkload, counter: Iterator[int]) -> Generator[Event, object, None]:
    assert workload.rate_per_s is not None
    programs = []  # kept only for a finite workload, whose end waits for them
    for index in counter:
        yield sim.env.timeout(float(sim.arrival_rng.exponential(1.0 / workload.rate_per_s)))
        program = sim.env.process(sim.run_program(_agent(sim, workload, index)))
        if workload.programs:
            programs.append(program)
    yield sim.env.all_of(programs)


def _replay(sim: ProgramRunner, starts: Iterator[tuple[float, Script]]) -> Generator[Event, object, None]:
    """Start each script at its time; done when every program has finished."""
    programs = []
    for start_s, script in starts:
        if start_s > sim.env.now:
            yield sim.env.timeout(start_s - sim.env.now)
        programs.append(sim.env.process(sim.run_program(script)))
    yield sim.env.all_of(programs)
