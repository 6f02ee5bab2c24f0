"""Synthetic agent programs drawn from a `ProgramShape`.

A program's plan comes from its own RNG stream keyed by (seed, program index), so program ``i``
is the same under every policy and cluster: comparisons see identical work. Its context grows
turn by turn: turn ``k``'s prompt is the system prompt + task prompt + every earlier turn's
output and tool observation, so consecutive turns share a prefix of block hashes. Programs of
one prompt group (GRPO samples of one prompt) also share the task prompt's blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from tasim.config.scenario import ProgramShape, RolloutWorkload
from tasim.core.determinism import PROGRAMS, PROMPT_GROUPS, SHARED_PROMPT, program_rng, prompt_group_rng
from tasim.core.model import RequestSpec, Segment, chained_block_hashes
from tasim.core.rollout_ids import trajectory_id


@dataclass(frozen=True, slots=True)
class TurnPlan:
    output_tokens: int
    tool_latency_s: float
    observation_tokens: int
    tool: str | None = None  # the named tool the turn's output calls (None: the shape names none)


@dataclass(frozen=True, slots=True)
class ProgramPlan:
    index: int
    id: str
    system_tokens: int
    task_tokens: int
    setup_s: float
    turns: tuple[TurnPlan, ...]
    group: int | None = None  # programs of one group share the task prompt
    release_after_s: float | None = 0.0  # from the last call's end to the client's release; None: never


@dataclass(frozen=True, slots=True)
class Script:
    """A program to run: ``calls`` yields (seconds to wait before the call, the call);
    ``release_after_s`` is when, after its last call, its client releases it (None: never)."""

    id: str
    turns: int
    calls: Iterable[tuple[float, RequestSpec]]
    release_after_s: float | None = 0.0


def plan_program(
    shape: ProgramShape,
    seed: int,
    index: int,
    max_context_tokens: int,
    *,
    program_id: str | None = None,
    group: int | None = None,
) -> ProgramPlan:
    """Draw program ``index``; turns stop before one whose prompt + output would exceed
    ``max_context_tokens`` (an agent hitting its model's context limit). With ``group``, the
    task prompt length is drawn once per group, so every sample of a prompt has the same one."""
    rng = program_rng(seed, index)
    task_rng = prompt_group_rng(seed, group) if group is not None else rng
    task = shape.task_prompt_tokens.sample_int(task_rng, minimum=1)
    planned = shape.turns.sample_int(rng, minimum=1)
    setup = shape.setup_s.sample(rng)
    context = shape.system_prompt_tokens + task
    tools = shape.tool_choices
    cumulative_shares = np.cumsum([tool.share for _, tool in tools]) if tools else None
    turns: list[TurnPlan] = []
    for _ in range(planned):
        output = shape.output_tokens.sample_int(rng, minimum=1)
        name: str | None = None
        if cumulative_shares is None:
            latency = shape.unnamed_tool_latency_s.sample(rng)
        else:
            pick = int(np.searchsorted(cumulative_shares, rng.random() * cumulative_shares[-1], side="right"))
            name, tool = tools[min(pick, len(tools) - 1)]
            latency = tool.latency_s.sample(rng)
        observation = shape.observation_tokens.sample_int(rng)
        if context + output > max_context_tokens:
            break
        turns.append(TurnPlan(output, latency, observation, name))
        context += output + observation
    return ProgramPlan(
        index,
        program_id or f"p{index}",
        shape.system_prompt_tokens,
        task,
        setup,
        tuple(turns),
        group,
        shape.release.after_last_call_s,
    )


def agent_script(plan: ProgramPlan, block_size: int) -> Script:
    return Script(plan.id, len(plan.turns), _calls(plan, block_size), plan.release_after_s)


def _calls(plan: ProgramPlan, block_size: int) -> Iterator[tuple[float, RequestSpec]]:
    owner = PROGRAMS.key(plan.index)
    task_owner = owner if plan.group is None else PROMPT_GROUPS.key(plan.group)
    system = Segment(plan.system_tokens, SHARED_PROMPT.key(0))
    task = Segment(plan.system_tokens + plan.task_tokens, task_owner)
    context = plan.system_tokens + plan.task_tokens
    history = 0
    hashes: list[int] = []
    for turn, step in enumerate(plan.turns):
        total = context + step.output_tokens
        wanted = total // block_size
        if wanted > len(hashes):
            segments = (system, task, Segment(total, owner))
            hashes.extend(chained_block_hashes(segments, block_size, start_block=len(hashes)))
        wait = plan.setup_s if turn == 0 else plan.turns[turn - 1].tool_latency_s
        yield (
            wait,
            RequestSpec(
                id=f"{plan.id}.{turn}",
                program=plan.id,
                turn=turn,
                prompt_tokens=context,
                output_tokens=step.output_tokens,
                history_tokens=history,
                block_hashes=tuple(hashes[:wanted]),
                tool_call=step.tool,
            ),
        )
        history = total
        context = total + step.observation_tokens


def rollout_step_plans(workload: RolloutWorkload, seed: int, step: int, max_context_tokens: int) -> list[ProgramPlan]:
    """One GRPO step's trajectories: the samples of a prompt form a group and share its task
    prompt; indexes run on across steps."""
    plans = []
    for prompt in range(workload.prompts_per_step):
        plans += group_plans(workload, seed, step * workload.prompts_per_step + prompt, step, prompt, max_context_tokens)
    return plans


def group_plans(workload: RolloutWorkload, seed: int, group: int, step: int, prompt: int, max_context_tokens: int) -> list[ProgramPlan]:
    """The ``samples_per_prompt`` trajectories of prompt group number ``group``, submitted at
    ``step`` as its ``prompt``-th prompt and named by `trajectory_id`: they share its task prompt;
    program indexes follow from the group's."""
    first = group * workload.samples_per_prompt
    return [
        plan_program(workload, seed, first + sample, max_context_tokens, program_id=trajectory_id(step, prompt, sample), group=group)
        for sample in range(workload.samples_per_prompt)
    ]
