"""Agent programs as data: what each program will ask for, independent of timing and policy.

A program's plan is drawn from its own RNG stream (seed, program index), so program ``i`` is the
same under every policy and every cluster: comparisons see identical work. Its context grows
turn by turn: turn ``k``'s prompt is the system prompt + task prompt + every earlier turn's
output and tool observation, so consecutive turns share a prefix of block hashes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasim.model import SHARED_OWNER, RequestSpec, Segment, chained_block_hashes
from tasim.scenario import WorkloadConfig

# Owner keys of programs start here, leaving room below for prompt groups.
_PROGRAM_OWNER_BASE = 1 << 20


@dataclass(frozen=True, slots=True)
class TurnPlan:
    output_tokens: int
    tool_latency_s: float
    observation_tokens: int


@dataclass(frozen=True, slots=True)
class ProgramPlan:
    index: int
    id: str
    system_tokens: int
    task_tokens: int
    turns: tuple[TurnPlan, ...]


def plan_program(config: WorkloadConfig, seed: int, index: int, max_context_tokens: int) -> ProgramPlan:
    """Draw program ``index``; turns stop before one whose prompt + output would exceed
    ``max_context_tokens`` (an agent hitting its model's context limit)."""
    rng = np.random.default_rng([seed, 1, index])
    task = config.task_prompt_tokens.sample_int(rng, minimum=1)
    planned = config.turns.sample_int(rng, minimum=1)
    context = config.system_prompt_tokens + task
    turns: list[TurnPlan] = []
    for _ in range(planned):
        output = config.output_tokens.sample_int(rng, minimum=1)
        tool = config.tool_latency_s.sample(rng)
        observation = config.observation_tokens.sample_int(rng)
        if context + output > max_context_tokens:
            break
        turns.append(TurnPlan(output, tool, observation))
        context += output + observation
    return ProgramPlan(index, f"p{index}", config.system_prompt_tokens, task, tuple(turns))


class ProgramContext:
    """The growing context of one running program and the requests it issues."""

    def __init__(self, plan: ProgramPlan, block_size: int) -> None:
        self.plan = plan
        self.block_size = block_size
        owner = _PROGRAM_OWNER_BASE + plan.index
        self._segments = (Segment(plan.system_tokens, SHARED_OWNER), Segment(1 << 62, owner))
        self._hashes: list[int] = []
        self.context_tokens = plan.system_tokens + plan.task_tokens
        self._history_tokens = 0

    def request(self, turn: int) -> RequestSpec:
        """The LLM call of ``turn`` (turns are issued in order)."""
        output = self.plan.turns[turn].output_tokens
        total = self.context_tokens + output
        known = len(self._hashes)
        wanted = total // self.block_size
        if wanted > known:
            segments = (self._segments[0], Segment(total, self._segments[1].owner))
            self._hashes.extend(chained_block_hashes(segments, self.block_size, start_block=known))
        return RequestSpec(
            id=f"{self.plan.id}.{turn}",
            program=self.plan.id,
            turn=turn,
            prompt_tokens=self.context_tokens,
            output_tokens=output,
            history_tokens=self._history_tokens,
            block_hashes=tuple(self._hashes[:wanted]),
        )

    def complete_turn(self, turn: int) -> None:
        """Output and then the tool's observation join the context."""
        step = self.plan.turns[turn]
        self._history_tokens = self.context_tokens + step.output_tokens
        self.context_tokens += step.output_tokens + step.observation_tokens
