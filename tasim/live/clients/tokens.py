"""Token ids for a program plan, shared by every live driver so they send the same prompts.

A plan (`tasim.workloads.ProgramPlan`) says how long each part of a program's context is; this
fills the parts with token ids drawn from the run's seed: a system prompt every program shares,
a task prompt per program (or per prompt group, whose samples share it), and one observation per
tool call. Ids start at 3, above the generated tokenizer's special tokens (the router's probes
use id 1, so they never collide with a workload).
"""

from __future__ import annotations

from tasim.core.determinism import token_rng
from tasim.workloads import ProgramPlan

FIRST_TOKEN_ID = 3


class PlanTokens:
    def __init__(self, seed: int, vocab_size: int) -> None:
        self.seed = seed
        self.vocab_size = vocab_size

    def _draw(self, count: int, *key: int) -> list[int]:
        rng = token_rng(self.seed, *key)
        ids: list[int] = rng.integers(FIRST_TOKEN_ID, self.vocab_size, size=count).tolist()
        return ids

    def prompt(self, plan: ProgramPlan) -> list[int]:
        """The first call's prompt: the shared system prompt, then the task prompt."""
        task_key = (1, plan.group) if plan.group is not None else (2, plan.index)
        return self._draw(plan.system_tokens, 0) + self._draw(plan.task_tokens, *task_key)

    def observation(self, plan: ProgramPlan, turn: int) -> list[int]:
        """What the tool after call ``turn`` appends to the context."""
        return self._draw(plan.turns[turn].observation_tokens, 3, plan.index, turn)
