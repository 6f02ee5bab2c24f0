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
verl runs a batch's trajectories all at once, so ``max_concurrency`` is not applied. verl's workers set themselves up on
their first batch, which takes seconds; a warm-up batch of call-less trajectories does that
before the run's clock starts.
"""

from __future__ import annotations

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
from tasim.workloads import ProgramPlan, rollout_step_plans


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


def rollout_workload(scenario: Scenario) -> RolloutWorkload:
    if not isinstance(scenario.workload, RolloutWorkload):
        raise VerlDriverError(f"the verl driver runs rl_rollout workloads, not {scenario.workload.kind!r}")
    if scenario.workload.mode != "sync":
        raise VerlDriverError(f"the verl driver runs workload.mode sync; {scenario.workload.mode} is simulated only (tasim simulate, tasim compare)")
    return scenario.workload


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
    from tasim.live.verl.client import DynamoProgramClient

    workload = rollout_workload(scenario)
    assert stack.model_path is not None
    all_plans = [step_plans(scenario, step) for step in range(workload.steps)]
    prompt_length, response_length = _lengths([p for plans in all_plans for p in plans])
    agent_loops = workdir / "agent_loops.yaml"
    agent_loops.write_text(f"- name: {AGENT_NAME}\n  _target_: tasim.live.verl.agent_loop.TasimAgentLoop\n")
    config = verl_config(stack.model_path, prompt_length, response_length, agent_workers, agent_loops)
    tokens = PlanTokens(scenario.seed, vocab_size(stack.model_path))
    training = training_rng(scenario.seed)
    result = VerlResult()
    # Ray on loopback only, like the rest of the stack.
    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False, configure_logging=False, _node_ip_address=HOST)
    try:
        client = DynamoProgramClient(config, stack.base_url, stack.model_name, decisions_url=stack.status_url if stack.pinned else None)
        manager = AgentLoopManager.create(config, llm_client=client)
        # verl's workers set themselves up on their first batch (seconds each): do that on
        # trajectories without calls, which never reach the router, before the run's clock starts.
        idle = {"program": "warm-up", "prompt_ids": [FIRST_TOKEN_ID], "turns": [], "time_scale": time_scale, "release_after_s": 0.0}
        manager.generate_sequences(_batch([idle] * agent_workers))
        stack.begin_run()
        for step, plans in enumerate(all_plans):
            batch = _batch([_row(plan, tokens, time_scale) for plan in plans])
            started = time.perf_counter()
            stack.mark("rollout_started", step=step, trajectories=len(plans))
            output = manager.generate_sequences(batch)
            stack.mark("rollout_finished", step=step)
            result.step_wall_s.append(time.perf_counter() - started)
            turns = [int(calls) for calls in output.non_tensor_batch["tasim_calls"]]  # the loop's extra_fields
            result.turns_per_trajectory += turns
            result.calls += sum(turns)
            result.trajectories += len(plans)
            time.sleep(workload.training_s.sample(training) / time_scale)
            if workload.reset_prefix_cache:
                result.cache_resets.append(stack.clear_caches())
            stack.mark("training_finished", step=step)
            result.steps += 1
    finally:
        ray.shutdown()
    return result
