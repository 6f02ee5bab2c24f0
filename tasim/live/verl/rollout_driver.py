"""``--driver verl``: GRPO rollout steps by verl's own `AgentLoopManager` through the live stack.

For an ``rl_rollout`` scenario it composes verl's trainer config (rollout only: no actor, critic
or reward workers are built), starts Ray on this machine, and runs ``steps`` rollout steps. A
step is one ``generate_sequences`` call on a batch of ``prompts_per_step × samples_per_prompt``
rows, one per trajectory, each carrying the plan the simulator draws for it (same seed, same
indexes, the samples of a prompt sharing its task prompt); the rows go to the ``tasim_agent``
loop (`tasim.live.verl.agent_loop`), whose calls reach the frontend through
`DynamoProgramClient`. The router brackets each step in its event log (rollout started and
finished, training finished), so the summary's ``rollout`` block reports step and rollout
times and rollout throughput as in simulation. Between steps the driver waits the scenario's
training time (divided by the time scale), as a weight update would.

With ``reset_prefix_cache`` the router empties the workers' prefix caches after each training
pause through their ``clear_kv_blocks`` endpoint; Dynamo's vLLM and SGLang workers serve it, the
mocker does not, so the replies (recorded per step) say ``unsupported`` there and caches stay.
With ``workload.mode: colocate_async`` it plays verl's colocated asynchronous schedule instead
(`_colocate_async_steps`): groups run ahead of training, and every update is a weight sync that
aborts at the router (``POST /v1/weight_sync/begin {"abort": true}``); the agent loops then get
verl's own partial-rollout client (`PartialRolloutDynamoClient`), which sends a cut call again
(after verl's fixed 1 s, not ``abort_retry_delay_s``) with its output so far. The other
asynchronous modes are simulated only.

verl runs a batch's trajectories all at once, so ``max_concurrency`` is not applied. verl's workers set themselves up on
their first batch, which takes seconds; a warm-up batch of call-less trajectories does that
before the run's clock starts.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasim.config.scenario import RolloutWorkload, Scenario
from tasim.core.determinism import training_rng
from tasim.core.errors import LiveError
from tasim.live.clients.tokens import FIRST_TOKEN_ID, PlanTokens
from tasim.live.stack.launcher import HOST, LiveStack
from tasim.live.verl.agent_loop import AGENT_NAME
from tasim.workloads import ProgramPlan, group_plans, rollout_step_plans


class VerlDriverError(LiveError):
    """The scenario cannot be run through verl; the message says why."""


@dataclass
class VerlResult:
    steps: int = 0
    trajectories: int = 0
    calls: int = 0
    turns_per_trajectory: list[int] = field(default_factory=list)
    step_wall_s: list[float] = field(default_factory=list)
    cache_resets: list[dict[str, Any]] = field(default_factory=list)  # the workers' replies, per step
    weight_syncs: list[dict[str, Any]] = field(default_factory=list)  # colocate_async: the router's begin replies
    sampled_groups: list[list[str]] = field(default_factory=list)  # colocate_async: the groups each step trains on
    router_after: dict[str, Any] = field(default_factory=dict)  # the router's program table and call counts at the end


def rollout_workload(scenario: Scenario) -> RolloutWorkload:
    if not isinstance(scenario.workload, RolloutWorkload):
        raise VerlDriverError(f"the verl driver runs rl_rollout workloads, not {scenario.workload.kind!r}")
    if scenario.workload.mode not in LIVE_MODES:
        modes = " or ".join(LIVE_MODES)
        mode = scenario.workload.mode
        raise VerlDriverError(f"the verl driver runs workload.mode {modes}; {mode} is simulated only (tasim simulate, tasim compare)")
    span = scenario.workload.max_off_policy_span
    if scenario.workload.mode == "colocate_async" and span is not None and scenario.workload.steps > span:
        # a group can then go stale, which the simulator drops and replaces
        raise VerlDriverError(f"the verl driver runs colocate_async with steps <= max_off_policy_span ({span}); stale groups are simulated only")
    return scenario.workload


LIVE_MODES = ("sync", "colocate_async")


@dataclass
class Group:
    """One prompt's ``samples_per_prompt`` trajectories, submitted together (one verl batch)."""

    name: str
    step: int
    plans: list[ProgramPlan]


def colocate_async_submissions(scenario: Scenario) -> list[list[Group]]:
    """The groups each step submits, numbered as the simulator's colocate_async numbers them:
    step 0 submits its batch plus ``warmup_batches`` ahead, each later step one batch."""
    workload = rollout_workload(scenario)
    submissions: list[list[Group]] = []
    number = 0
    for step in range(workload.steps):
        count = workload.prompts_per_step * (1 + workload.warmup_batches if step == 0 else 1)
        groups = []
        for prompt in range(count):
            plans = group_plans(workload, scenario.seed, number, step, prompt, scenario.max_context_tokens)
            groups.append(Group(f"{step}.{prompt}", step, plans))
            number += 1
        submissions.append(groups)
    return submissions


def step_plans(scenario: Scenario, step: int) -> list[ProgramPlan]:
    """The trajectories of one step, as the simulator draws them."""
    return rollout_step_plans(rollout_workload(scenario), scenario.seed, step, scenario.max_context_tokens)


def _row(plan: ProgramPlan, tokens: PlanTokens, time_scale: float) -> dict[str, Any]:
    """What the tasim_agent loop needs of a trajectory (see tasim.live.verl.agent_loop)."""
    turns = [(t.output_tokens, t.tool_latency_s, tokens.observation(plan, i)) for i, t in enumerate(plan.turns)]
    return {
        "program": plan.id,
        "prompt_ids": tokens.prompt(plan),
        "turns": turns,
        "time_scale": time_scale,
        "release_after_s": plan.release_after_s,
    }


def _lengths(plans: list[ProgramPlan]) -> tuple[int, int]:
    """verl pads prompts and responses to fixed lengths: the largest of the run's plans."""
    prompt = max(p.system_tokens + p.task_tokens for p in plans)
    response = max(sum(t.output_tokens + t.observation_tokens for t in p.turns) for p in plans)
    return prompt, response


def _batch(rows: list[dict[str, Any]]) -> Any:
    from verl.protocol import DataProto

    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([[{"role": "user", "content": row["program"]}] for row in rows], dtype=object),
            "agent_name": np.array([AGENT_NAME] * len(rows), dtype=object),
            "extra_info": np.array([{"tasim": row} for row in rows], dtype=object),
            "index": np.arange(len(rows)),
        }
    )


def verl_config(model_path: Path, prompt_length: int, response_length: int, workers: int, agent_loops: Path) -> Any:
    """verl's trainer config, composed as its entry point does, for rollout only."""
    import verl.trainer.config as trainer_config
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(trainer_config.__file__).parent), version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_path}",
                "actor_rollout_ref.rollout.name=vllm",  # the config's required server kind; no server is started
                f"actor_rollout_ref.rollout.agent.num_workers={workers}",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loops}",
                "actor_rollout_ref.rollout.calculate_log_probs=false",
                f"data.max_prompt_length={prompt_length}",
                f"data.max_response_length={response_length}",
            ],
        )


def run_verl_rollout(scenario: Scenario, stack: LiveStack, time_scale: float, workdir: Path, agent_workers: int = 2) -> VerlResult:
    import ray
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    from tasim.live.stack.tiny_model import vocab_size
    from tasim.live.verl.client import DynamoProgramClient, PartialRolloutDynamoClient

    workload = rollout_workload(scenario)
    assert stack.model_path is not None
    if workload.mode == "sync":
        all_plans = [step_plans(scenario, step) for step in range(workload.steps)]
    else:
        submissions = colocate_async_submissions(scenario)
        all_plans = [[plan for group in groups for plan in group.plans] for groups in submissions]
    prompt_length, response_length = _lengths([p for plans in all_plans for p in plans])
    agent_loops = workdir / "agent_loops.yaml"
    agent_loops.write_text(f"- name: {AGENT_NAME}\n  _target_: tasim.live.verl.agent_loop.TasimAgentLoop\n")
    config = verl_config(stack.model_path, prompt_length, response_length, agent_workers, agent_loops)
    tokens = PlanTokens(scenario.seed, vocab_size(stack.model_path))
    result = VerlResult()
    # verl's asynchronous trainers hand the agent loops its partial-rollout client, which sends a
    # call a weight sync cut again; the sync trainer, the plain one.
    client_class = DynamoProgramClient if workload.mode == "sync" else PartialRolloutDynamoClient
    # Ray on loopback only, like the rest of the stack.
    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False, configure_logging=False, _node_ip_address=HOST)
    try:
        client = client_class(config, stack.base_url, stack.model_name, decisions_url=stack.status_url if stack.pinned else None)
        manager = AgentLoopManager.create(config, llm_client=client)
        # verl's workers set themselves up on their first batch (seconds each): do that on
        # trajectories without calls, which never reach the router, before the run's clock starts.
        idle = {"program": "warm-up", "prompt_ids": [FIRST_TOKEN_ID], "turns": [], "time_scale": time_scale, "release_after_s": 0.0}
        manager.generate_sequences(_batch([idle] * agent_workers))
        stack.begin_run()
        if workload.mode == "sync":
            _sync_steps(manager, stack, all_plans, tokens, scenario, time_scale, result)
        else:
            asyncio.run(_colocate_async_steps(manager, stack, submissions, tokens, scenario, time_scale, result))
        status = stack.status()
        result.router_after = {"programs": status["programs"], "requests": status["requests"]}
    finally:
        ray.shutdown()
    return result


def _sync_steps(
    manager: Any, stack: LiveStack, all_plans: list[list[ProgramPlan]], tokens: PlanTokens, scenario: Scenario, time_scale: float, result: VerlResult
) -> None:
    workload = rollout_workload(scenario)
    training = training_rng(scenario.seed)
    for step, plans in enumerate(all_plans):
        batch = _batch([_row(plan, tokens, time_scale) for plan in plans])
        started = time.perf_counter()
        stack.mark("rollout_started", step=step, trajectories=len(plans))
        output = manager.generate_sequences(batch)
        stack.mark("rollout_finished", step=step)
        result.step_wall_s.append(time.perf_counter() - started)
        _count(output, result)
        time.sleep(workload.training_s.sample(training) / time_scale)
        if workload.reset_prefix_cache:
            result.cache_resets.append(stack.clear_caches())
        stack.mark("training_finished", step=step)
        result.steps += 1


def _count(output: Any, result: VerlResult) -> None:
    turns = [int(calls) for calls in output.non_tensor_batch["tasim_calls"]]  # the loop's extra_fields
    result.turns_per_trajectory += turns
    result.calls += sum(turns)
    result.trajectories += len(turns)


async def _colocate_async_steps(
    manager: Any, stack: LiveStack, submissions: list[list[Group]], tokens: PlanTokens, scenario: Scenario, time_scale: float, result: VerlResult
) -> None:
    """verl's colocated asynchronous schedule, as `tasim.sim.rollout` simulates it: a batch runs
    ahead; each step samples the oldest finished groups (by submitting step, then by finish),
    and the engines stop for the update: the router cuts the calls streaming (verl's client
    sends each again after the sync), the trainer trains, the weights are pushed, and the next
    batch goes in. Each group is one ``generate_sequences`` call: calls from one event loop
    overlap on one `AgentLoopManager` (its Ray workers are async actors), so a group finishes
    on its own. Groups still running after the last step are awaited: the router must end with
    nothing in flight and no program left."""
    workload = rollout_workload(scenario)
    training = training_rng(scenario.seed)
    running: dict[asyncio.Task[Any], Group] = {}
    ready: list[tuple[int, int, Group]] = []  # (submitting step, finish order, group)
    finish_order = itertools.count()

    async def generate(group: Group) -> Any:
        # awaited here, verl's generate_sequences gives its coroutine (called from plain code,
        # it would block in a thread of its own)
        return await manager.generate_sequences(_batch([_row(plan, tokens, time_scale) for plan in group.plans]))

    def submit(step: int, groups: list[Group]) -> None:
        stack.mark("rollout_started", step=step, trajectories=sum(len(g.plans) for g in groups))
        for group in groups:
            running[asyncio.create_task(generate(group))] = group

    async def collect(until: int) -> None:
        while len(ready) < until:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: running[t].name):
                _count(task.result(), result)
                ready.append((running[task].step, next(finish_order), running.pop(task)))

    for step, groups in enumerate(submissions):
        started = time.perf_counter()
        submit(step, groups)
        await collect(workload.prompts_per_step)
        ready.sort(key=lambda item: item[:2])
        taken, ready[:] = ready[: workload.prompts_per_step], ready[workload.prompts_per_step :]
        result.sampled_groups.append([group.name for _, _, group in taken])
        result.step_wall_s.append(time.perf_counter() - started)
        # The engines share the trainer's GPUs: they stop (the router aborts what streams) while
        # it trains, and serve again with the new weights.
        result.weight_syncs.append(await asyncio.to_thread(stack.begin_weight_sync, step + 1, True))
        result.cache_resets.append(await asyncio.to_thread(stack.clear_caches))  # the new weights void the KV
        stack.mark("training_started", step=step)
        await asyncio.sleep(workload.training_s.sample(training) / time_scale)
        stack.mark("training_finished", step=step)
        await asyncio.sleep(workload.weight_sync_s.sample(training) / time_scale)
        await asyncio.to_thread(stack.end_weight_sync, step + 1)
        result.steps += 1
    await collect(len(ready) + len(running))
