"""RL rollout steps (GRPO): P prompts x n samples per step under a global concurrency cap.

A step's rollout starts every trajectory of the batch, at most ``max_concurrency`` at a time (a
trajectory takes a slot when it starts and frees it when it ends); it ends when the last one
finishes. Training follows: engines get no work for ``training_s`` and, as after a weight update,
their prefix caches are emptied. Trajectory ids are ``s<step>.<prompt>.<sample>``; the samples of
a prompt share its task prompt blocks.
"""

from __future__ import annotations

from collections.abc import Generator

from tasim.config.scenario import RolloutWorkload
from tasim.core import events as ev
from tasim.core.determinism import training_rng
from tasim.sim.clock import Event, Slots
from tasim.sim.program_runner import ProgramRunner
from tasim.workloads import ProgramPlan, agent_script, rollout_step_plans


def rollout_steps(sim: ProgramRunner, workload: RolloutWorkload) -> Generator[Event, object, None]:
    env = sim.env
    slots = Slots(env, workload.max_concurrency)
    training = training_rng(sim.scenario.seed)
    batch = workload.prompts_per_step * workload.samples_per_prompt
    for step in range(workload.steps):
        sim.emit(ev.RolloutStarted(env.now, step, batch))
        plans = rollout_step_plans(workload, sim.scenario.seed, step, sim.scenario.max_context_tokens)
        yield env.all_of([env.process(_trajectory(sim, slots, plan)) for plan in plans])
        sim.emit(ev.RolloutFinished(env.now, step))
        yield env.timeout(workload.training_s.sample(training))
        if workload.reset_prefix_cache:
            sim.clear_prefix_caches()
        sim.emit(ev.TrainingFinished(env.now, step))


def _trajectory(sim: ProgramRunner, slots: Slots, plan: ProgramPlan) -> Generator[Event, object, None]:
    with slots.request() as slot:
        yield slot
        yield sim.env.process(sim.run_program(agent_script(plan, sim.block_size)))
