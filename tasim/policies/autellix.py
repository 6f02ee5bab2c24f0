"""Autellix (Luo et al., arXiv 2502.13965): program-level least attained service (PLAS) with
its data-locality-aware load balancer.

**Load balancer** (the paper's Alg. 2): a call whose prompt has at most ``long_call_tokens``
tokens (2,048: "short requests below 2048 tokens achieve high cache hit rates across any
engine") goes to the least used engine, the one with the fewest calls in flight (the paper's
"Least Used": "lowest number of LLM calls in the system"; the first in cluster order on ties).
A longer call goes to the engine its program's first long call went to, which keeps the
program's KV; short calls never change that table.

**PLAS** (§4.2): a call is ordered by its program's attained service, the engine time of the
program's completed calls, updated when a call completes, discretized into queues: queue ``i``
holds the programs whose service lies in [``queue_boundaries_s[i-1]``,
``queue_boundaries_s[i]``); queue 0 runs first and calls within a queue run in arrival order.
Here the engine is vLLM with ``--scheduling-policy priority`` (the scenario's
``cluster.engine.scheduling_policy: priority``), and a call's priority is its queue.

What a router cannot reproduce, and this baseline leaves out: the paper counts the model
executor's time; a router sees a call's first token and its end, so a call's service is the
time between them (its decode; its prefill cannot be told apart from queueing). Autellix's
engine moves a running call down a queue when it uses up that queue's quantum, preempts by swap
to CPU, and promotes a call that has waited β times its service; vLLM fixes a call's priority
when it arrives and preempts by recompute. The paper states neither the queue boundaries, the
quanta nor β; the boundaries here double from 2 s (a third-party reimplementation,
kungfu-team/autellix, uses 2..64 in its own units). ATLAS, its variant for multi-threaded
programs, is not modelled: tasim's programs are single-threaded.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasim.core.cluster_view import ClusterView
from tasim.core.model import RequestSpec
from tasim.policies.interface import Policy, ProgramDecision, Route, TurnEnd


class AutellixParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    long_call_tokens: int = Field(2048, ge=0, description="a call with a longer prompt stays on its program's engine (Alg. 2)")
    queue_boundaries_s: tuple[float, ...] = Field(
        (2.0, 4.0, 8.0, 16.0, 32.0, 64.0), max_length=64, description="attained service (s) where each PLAS queue ends; one more queue past the last"
    )

    @field_validator("queue_boundaries_s")
    @classmethod
    def _increasing(cls, bounds: tuple[float, ...]) -> tuple[float, ...]:
        if any(b <= 0 for b in bounds) or any(later <= earlier for earlier, later in zip(bounds, bounds[1:], strict=False)):
            raise ValueError("queue boundaries must be positive and strictly increasing")
        return bounds


class Autellix(Policy[AutellixParams]):
    name: ClassVar[str] = "autellix"
    summary: ClassVar[str] = "Autellix: program-level least attained service (engine priority) and its locality-aware load balancer"
    params_model: ClassVar[type[BaseModel]] = AutellixParams
    sets_priorities: ClassVar[bool] = True

    def __init__(self, view: ClusterView, params: AutellixParams, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        self.calls_on = dict.fromkeys(view.worker_ids, 0)  # calls in flight per engine
        self.engine_of: dict[str, str] = {}  # program -> the engine of its long calls
        self.service_s: dict[str, float] = {}  # program -> attained service
        self._first_token_at: dict[str, float] = {}  # call in flight -> when its first token came

    def on_request(self, request: RequestSpec, now: float) -> Route:
        program = request.program
        if request.prompt_tokens <= self.params.long_call_tokens:
            worker = self._least_used()
        else:
            worker = self.engine_of.get(program) or self._least_used()
            self.engine_of[program] = worker
        self.calls_on[worker] += 1
        return Route(worker, self.queue(program))

    def queue(self, program: str) -> int:
        """The PLAS queue of the program's next call (its priority: 0 runs first)."""
        return bisect.bisect_right(self.params.queue_boundaries_s, self.service_s.get(program, 0.0))

    def _least_used(self) -> str:
        return min(self.serving, key=self.calls_on.__getitem__)

    def on_first_token(self, request: str, worker: str, now: float) -> None:
        self._first_token_at[request] = now

    def on_turn_end(self, turn: TurnEnd, now: float) -> Sequence[ProgramDecision]:
        if turn.worker:  # "" for a call dropped before it was routed
            self.calls_on[turn.worker] -= 1
        first = self._first_token_at.pop(turn.request, None)
        if turn.ok and first is not None:
            self.service_s[turn.program] = self.service_s.get(turn.program, 0.0) + (now - first)
        return ()

    def on_program_end(self, program: str, now: float) -> Sequence[ProgramDecision]:
        self.engine_of.pop(program, None)
        self.service_s.pop(program, None)
        return ()

    def on_worker_lost(self, worker: str, now: float) -> Sequence[ProgramDecision]:
        """Its programs' long calls go to the least used engine next (their KV is gone)."""
        super().on_worker_lost(worker, now)
        self.engine_of = {program: w for program, w in self.engine_of.items() if w != worker}
        return ()
