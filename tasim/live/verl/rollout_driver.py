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
With ``workload.mode: colocate_async`` verl's own V1 trainer, `PPOTrainerColocateAsync`, runs
the schedule instead (`tasim.live.verl.v1_trainer`, which says what runs as verl ships it and
what stands in for the GPU work): its replay buffer, on TransferQueue, takes each step's groups,
and every update is a weight sync that aborts at the router (``POST /v1/weight_sync/begin
{"abort": true}``); the agent loops get verl's partial-rollout client
(`PartialRolloutDynamoClient`), which sends a cut call again (after verl's fixed 1 s, not
``abort_retry_delay_s``) with its output so far. More steps than ``max_off_policy_span`` are
refused: verl would drop stale groups and refill from its dataset, whose rows (the simulator's
groups, numbered by the step that submits them) are drawn before the run. The other
asynchronous modes are simulated only.

verl runs a batch's trajectories all at once, so ``max_concurrency`` is not applied. verl's
workers set themselves up on their first batch, which takes seconds; a warm-up batch of
call-less trajectories does that before the run's clock starts.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasim.config.scenario import RolloutWorkload, Scenario
from tasim.core.determinism import training_rng
from tasim.core.errors import LiveError
from tasim.core.local_ray import init_local_ray
from tasim.core.rollout_ids import group_id
from tasim.live.clients.tokens import FIRST_TOKEN_ID, PlanTokens
from tasim.live.stack.launcher import LiveStack
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
    staleness: list[dict[str, Any]] = field(default_factory=list)  # colocate_async: each sampled group's weight versions
    step_timings_s: list[dict[str, float]] = field(default_factory=list)  # colocate_async: verl's timings per step (gen, update_actor, ...)
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
        raise VerlDriverError(
            f"the verl driver runs colocate_async with steps <= max_off_policy_span ({span}); dropping and refilling stale groups is simulated only"
        )
    return scenario.workload


LIVE_MODES = ("sync", "colocate_async")
SETTLE_TIMEOUT_S = 600.0  # colocate_async: how long the groups still running after the last step may take


@dataclass
class Group:
    """One prompt's ``samples_per_prompt`` trajectories, submitted together (one verl batch),
    named as the simulator names the group (`tasim.core.rollout_ids.group_id`)."""

    name: str
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
            groups.append(Group(group_id(step, prompt), plans))
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


def _idle_row(time_scale: float) -> dict[str, Any]:
    """A trajectory without calls: it warms a verl worker up and never reaches the router."""
    return {"program": "warm-up", "prompt_ids": [FIRST_TOKEN_ID], "turns": [], "time_scale": time_scale, "release_after_s": 0.0}


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
            "extra_info": np.array([{"tasim": {"samples": [row]}} for row in rows], dtype=object),
            "index": np.arange(len(rows)),
        }
    )


def verl_config(model_path: Path, prompt_length: int, response_length: int, workers: int, agent_loops: Path, extra: list[str] | None = None) -> Any:
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
                *(extra or []),
            ],
        )


def run_verl_rollout(scenario: Scenario, stack: LiveStack, time_scale: float, workdir: Path, agent_workers: int = 2) -> VerlResult:
    import ray

    from tasim.live.stack.tiny_model import vocab_size

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
    tokens = PlanTokens(scenario.seed, vocab_size(stack.model_path))
    result = VerlResult()
    # Ray on loopback only, like the rest of the stack.
    init_local_ray(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        if workload.reset_prefix_cache:
            # The router learns which workers serve clear_kv_blocks (a 2 s wait on the mocker,
            # which serves none) now, not at the first update inside the run's clock; the caches
            # are empty anyway.
            stack.clear_caches()
        if workload.mode == "sync":
            config = verl_config(stack.model_path, prompt_length, response_length, agent_workers, agent_loops)
            _sync_steps(config, stack, all_plans, tokens, scenario, time_scale, agent_workers, result)
        else:
            from tasim.live.verl.v1_trainer import v1_overrides

            config = verl_config(stack.model_path, prompt_length, response_length, agent_workers, agent_loops, v1_overrides(workload))
            _colocate_async(config, stack, submissions, tokens, scenario, time_scale, agent_workers, result)
        status = stack.status()
        result.router_after = {"programs": status["programs"], "requests": status["requests"]}
        if workload.mode != "sync":
            # verl's trainer keeps no per-trajectory output here: the calls are the router's
            # finished ones (a call a sync cut ends retried, and its retry finishes)
            result.calls = status["requests"]["finished"]
    finally:
        ray.shutdown()
    return result


def _sync_steps(
    config: Any,
    stack: LiveStack,
    all_plans: list[list[ProgramPlan]],
    tokens: PlanTokens,
    scenario: Scenario,
    time_scale: float,
    agent_workers: int,
    result: VerlResult,
) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    from tasim.live.verl.client import DynamoProgramClient

    workload = rollout_workload(scenario)
    client = DynamoProgramClient(config, stack.base_url, stack.model_name, decisions_url=stack.status_url if stack.pinned else None)
    manager = AgentLoopManager.create(config, llm_client=client)
    # verl's workers set themselves up on their first batch (seconds each): do that on
    # trajectories without calls, which never reach the router, before the run's clock starts.
    manager.generate_sequences(_batch([_idle_row(time_scale)] * agent_workers))
    stack.begin_run()
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


def _colocate_async(
    config: Any,
    stack: LiveStack,
    submissions: list[list[Group]],
    tokens: PlanTokens,
    scenario: Scenario,
    time_scale: float,
    agent_workers: int,
    result: VerlResult,
) -> None:
    """verl's `PPOTrainerColocateAsync` plays the schedule (`tasim.live.verl.v1_trainer`): one
    dataset row per group, in the simulator's submission order."""
    from tasim.live.verl.v1_trainer import run_colocate_async

    workload = rollout_workload(scenario)
    groups = [group for step_groups in submissions for group in step_groups]

    def row(name: str, samples: list[dict[str, Any]], index: int) -> dict[str, Any]:
        return {
            "raw_prompt": [{"role": "user", "content": name}],
            "agent_name": AGENT_NAME,
            "data_source": "tasim",
            "extra_info": {"tasim": {"group": name, "samples": samples}},
            "index": index,
        }

    rows = [row(group.name, [_row(plan, tokens, time_scale) for plan in group.plans], index) for index, group in enumerate(groups)]
    # one call-less group per agent-loop worker, one sample each (verl's __rollout_n__)
    warm_up = [{**row("warm-up", [_idle_row(time_scale)], index), "__rollout_n__": 1} for index in range(agent_workers)]
    run = run_colocate_async(config, rows, warm_up, stack, workload, scenario.seed, time_scale, SETTLE_TIMEOUT_S)
    trainer, weights = run.trainer, run.weights
    result.steps = trainer.global_steps - 1  # verl counts from 1 and moves past its last step
    result.trajectories = sum(len(group.plans) for group in groups)
    result.weight_syncs = weights.began
    result.cache_resets = weights.cache_resets
    result.step_wall_s = [timings["step"] for timings in trainer.step_timings_s]
    result.sampled_groups = [[g.group for g in trainer.sampled if g.step == step] for step in range(result.steps)]
    result.staleness = [asdict(g) for g in trainer.sampled]
    result.step_timings_s = trainer.step_timings_s
