"""RL rollout steps (GRPO) as verl 0.9.1's trainers schedule them.

A step's batch is P prompts x n samples; the samples of a prompt form a group, which the trainer
takes whole. Trajectories start at most ``max_concurrency`` at a time (a trajectory takes a
slot when it starts and frees it when it ends). Trajectory ids are
``s<step>.<prompt>.<sample>``, ``step`` being the step that submitted the prompt; the samples of
a prompt share its task prompt blocks. The modes (``workload.mode``):

- ``sync`` (verl's sync trainer, the recipe's #126 runs): a step's rollout ends with its last
  trajectory; training follows, the engines idle, and (as after a weight update) their prefix
  caches are emptied.
- ``one_step_off`` (``experimental/one_step_off_policy``): the trainer waits for batch k, pushes
  the weights of its previous update (nothing is in flight then), starts batch k+1 and trains on
  batch k meanwhile; every batch after the first is one version stale.
- ``colocate_async`` (V1 ``trainer_colocate_async.py``): ``warmup_batches`` extra batches go in at
  the start and each step adds one; the trainer takes the P oldest finished groups, then the
  engines abort what they run, empty their caches and sleep through the training and the
  weight push; aborted calls come back under the new weights.
- ``separate_async`` (V1 ``trainer_separate_async.py``, no hybrid switching): the rollout never
  stops but for the weight push; the trainer takes P/``mini_steps`` groups per update and pushes
  after ``mini_steps`` updates, aborting what runs.
- ``fully_async`` (``experimental/fully_async_policy``): a rollouter starts one group at a time,
  at most ``concurrent_groups_per_worker`` per worker in flight, into a queue the trainer takes
  P/``mini_steps`` groups from per update, first finished first; it pauses (letting what runs
  finish) once it has started P x (1 + ``staleness_threshold``) groups since the last push, or
  when the queue holds that many. After ``mini_steps`` updates the trainer pushes, aborting what
  runs, and the budget restarts from the groups still running or queued (``reset_staleness``),
  so running and queued groups never exceed it and the queue never overflows (verl's drop of a
  full queue's oldest sample cannot fire, nor its 10 s monitor's resume of a rollouter paused by a
  full queue).

In the V1 modes a finished group that spans more than ``max_off_policy_span`` versions (from
the step that submitted it to the one sampling it) is dropped and one new prompt submitted in its
place (``max_off_policy_strategy: drop``). A weight sync aborts every call in flight; its client
retries it ``abort_retry_delay_s`` later with the output so far in its prompt, computed again
from an empty cache (`tasim.sim.runner.Simulation.begin_weight_sync`).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

from tasim.config.scenario import RolloutWorkload
from tasim.core import events as ev
from tasim.core.determinism import PROMPT_GROUPS, training_rng
from tasim.core.rollout_ids import group_id
from tasim.sim.clock import Event, Slots
from tasim.sim.program_runner import ProgramRunner
from tasim.workloads import ProgramPlan, agent_script, group_plans, rollout_step_plans


def rollout_steps(sim: ProgramRunner, workload: RolloutWorkload) -> Generator[Event, object, None]:
    if workload.mode == "sync":
        return _sync_steps(sim, workload)
    rollout = AsyncRollout(sim, workload)
    if workload.mode == "one_step_off":
        return rollout.one_step_off()
    if workload.mode == "colocate_async":
        return rollout.colocate_async()
    if workload.mode == "fully_async":
        return rollout.fully_async()
    return rollout.separate_async()


def _sync_steps(sim: ProgramRunner, workload: RolloutWorkload) -> Generator[Event, object, None]:
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


@dataclass(slots=True)
class _Group:
    """A prompt's samples: submitted at ``step``, done when ``left`` reaches 0; the weight
    versions its calls generated under; ``finished``: its place in the order groups finished."""

    name: str
    step: int
    left: int
    min_version: int = 1 << 62
    max_version: int = -1
    finished: int = -1


class AsyncRollout:
    """The trainers that overlap generation with training: prompt groups submitted, groups
    finished and waiting to be sampled, and the trainer's loop for each mode."""

    def __init__(self, sim: ProgramRunner, workload: RolloutWorkload) -> None:
        self.sim = sim
        self.workload = workload
        self.env = sim.env
        self.slots = Slots(sim.env, workload.max_concurrency)
        self.training = training_rng(sim.scenario.seed)
        self.groups = 0  # prompt groups submitted so far: the next one's index
        self.prompts_of_step: dict[int, int] = {}
        self.finished = 0
        self.ready: list[_Group] = []  # finished, not yet sampled
        self._wake: Event | None = None  # the trainer waiting for groups
        # fully_async's rollouter: groups running, groups started since the last push (verl's
        # staleness_samples), the version the engines serve, and what it waits for when paused
        self.running_groups = 0
        self.started_since_push = 0
        self.version = 0
        self._rollouter_wake: Event | None = None

    # --- the trainers --------------------------------------------------------------------------

    def one_step_off(self) -> Generator[Event, object, None]:
        w = self.workload
        self.submit(0, w.prompts_per_step)
        for step in range(w.steps):
            yield from self.take(step, w.prompts_per_step, bounded=False)
            if step:
                yield from self.push_weights(step)
            if step + 1 < w.steps:
                self.submit(step + 1, w.prompts_per_step)
            yield from self.train(step, 0, w.training_s.sample(self.training))

    def colocate_async(self) -> Generator[Event, object, None]:
        w = self.workload
        self.submit(0, (1 + w.warmup_batches) * w.prompts_per_step)
        for step in range(w.steps):
            if step:
                self.submit(step, w.prompts_per_step)
            yield from self.take(step, w.prompts_per_step)
            # the engines share the trainer's GPUs: they stop (aborting what runs, emptying their
            # caches) as it samples, sleep while it trains, and wake with the new weights
            stopped = self.sim.begin_weight_sync(step + 1, w.abort_retry_delay_s)
            yield from self.train(step, 0, w.training_s.sample(self.training))
            yield stopped
            yield self.env.timeout(w.weight_sync_s.sample(self.training))
            self.sim.end_weight_sync(step + 1)

    def separate_async(self) -> Generator[Event, object, None]:
        w = self.workload
        per_update = w.prompts_per_step // w.mini_steps
        self.submit(0, (1 + w.warmup_batches) * w.prompts_per_step)
        for step in range(w.steps):
            if step:
                self.submit(step, w.prompts_per_step)
            update_s = w.training_s.sample(self.training) / w.mini_steps
            for mini_step in range(w.mini_steps):
                yield from self.take(step, per_update)
                yield from self.train(step, mini_step, update_s)
            yield from self.push_weights(step + 1)

    def fully_async(self) -> Generator[Event, object, None]:
        w = self.workload
        per_update = w.prompts_per_step // w.mini_steps
        self.env.process(self._rollouter())
        for step in range(w.steps):
            update_s = w.training_s.sample(self.training) / w.mini_steps
            for mini_step in range(w.mini_steps):
                yield from self.take(step, per_update, bounded=False, first_finished=True)
                yield from self.train(step, mini_step, update_s)
            yield from self.push_weights(step + 1)
            self.version = step + 1
            self.started_since_push = self.running_groups + len(self.ready)  # reset_staleness
            self._wake_rollouter()

    def _rollouter(self) -> Generator[Event, object, None]:
        w = self.workload
        budget = self._fully_async_budget()
        in_flight = min(self.sim.scenario.cluster.backends * w.concurrent_groups_per_worker, budget)
        while True:
            while self.started_since_push >= budget or self.running_groups >= in_flight:
                self._rollouter_wake = self.env.event()
                yield self._rollouter_wake
            self.started_since_push += 1
            self.submit(self.version, 1)

    def _fully_async_budget(self) -> int:
        """verl's max_required_samples: the groups of one sync cycle times (1 + threshold)."""
        return int(self.workload.prompts_per_step * (1 + self.workload.staleness_threshold))

    def _wake_rollouter(self) -> None:
        if self._rollouter_wake is not None and not self._rollouter_wake.triggered:
            self._rollouter_wake.succeed()

    # --- pieces --------------------------------------------------------------------------------

    def train(self, step: int, mini_step: int, seconds: float) -> Generator[Event, object, None]:
        self.sim.emit(ev.TrainingStarted(self.env.now, step, mini_step))
        yield self.env.timeout(seconds)
        self.sim.emit(ev.TrainingFinished(self.env.now, step, mini_step))

    def push_weights(self, version: int) -> Generator[Event, object, None]:
        """A weight sync to engines that keep serving otherwise: abort, push, resume."""
        yield self.sim.begin_weight_sync(version, self.workload.abort_retry_delay_s)
        yield self.env.timeout(self.workload.weight_sync_s.sample(self.training))
        self.sim.end_weight_sync(version)

    def submit(self, step: int, prompts: int) -> None:
        """Start ``prompts`` new groups, tagged with the step that submits them."""
        w = self.workload
        sim = self.sim
        if self.groups + prompts > PROMPT_GROUPS.size:
            raise ValueError(f"the rollout submitted more than {PROMPT_GROUPS.size} prompt groups (replacing dropped ones)")
        sim.emit(ev.RolloutStarted(self.env.now, step, prompts * w.samples_per_prompt))
        self.running_groups += prompts
        for _ in range(prompts):
            prompt = self.prompts_of_step.get(step, 0)
            self.prompts_of_step[step] = prompt + 1
            plans = group_plans(w, sim.scenario.seed, self.groups, step, prompt, sim.scenario.max_context_tokens)
            group = _Group(group_id(step, prompt), step, w.samples_per_prompt)
            for plan in plans:
                self.env.process(self._trajectory(group, plan))
            self.groups += 1

    def _trajectory(self, group: _Group, plan: ProgramPlan) -> Generator[Event, object, None]:
        yield from _trajectory(self.sim, self.slots, plan)
        low, high = self.sim.pop_versions(plan.id)
        group.min_version = min(group.min_version, low)
        group.max_version = max(group.max_version, high)
        group.left -= 1
        if not group.left:
            group.finished = self.finished
            self.finished += 1
            self.running_groups -= 1
            self.ready.append(group)
            self._wake_rollouter()
            if self._wake is not None:
                self._wake.succeed()
                self._wake = None

    def take(self, step: int, count: int, bounded: bool = True, first_finished: bool = False) -> Generator[Event, object, None]:
        """Wait until ``count`` finished groups can be sampled, then sample the oldest by
        submitting step (then by finish), as V1's replay buffer does, or (``first_finished``)
        the first finished, as fully-async's queue does; with ``bounded``, first drop those past
        ``max_off_policy_span`` and replace each with a new prompt."""
        while True:
            if bounded:
                self._drop_stale(step)
            if len(self.ready) >= count:
                break
            self._wake = self.env.event()
            yield self._wake
        if not first_finished:
            self.ready.sort(key=lambda g: (g.step, g.finished))
        batch, self.ready = self.ready[:count], self.ready[count:]
        for group in batch:
            self.sim.emit(ev.GroupSampled(self.env.now, step, group.name, group.min_version, group.max_version))

    def _drop_stale(self, step: int) -> None:
        bound = self.workload.max_off_policy_span
        if bound is None:
            return
        stale = [g for g in self.ready if step - g.step + 1 > bound]
        if not stale:
            return
        self.ready = [g for g in self.ready if step - g.step + 1 <= bound]
        for group in stale:
            self.sim.emit(ev.GroupEvicted(self.env.now, step, group.name, step - group.step + 1))
        self.submit(step, len(stale))
