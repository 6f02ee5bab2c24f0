"""Continuum (arXiv 2511.02230; the ThunderAgent paper's second baseline): keep a program's KV
pinned through a short tool call.

When a turn ends, the program's blocks are pinned on its worker for ``ttl_s`` if the tool call
is predicted to be short: Continuum's vLLM fork pins only when the predicted duration (a moving
average of observed durations) is at most 2 s. The pin ends at the TTL or when the program's next
request is admitted; that request goes to the front of the worker's queue. Programs are sticky:
a new program goes to the worker with the fewest live programs (how the ThunderAgent paper ran
Continuum behind its ``default`` router). Simulated tools have no names, so one moving average
over all observed tool gaps stands in for the per-tool averages.
"""

from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tasim.model import RequestSpec
from tasim.policies.base import Pin, Policy, ProgramDecision, Route, TurnEnd
from tasim.view import ClusterView


class ContinuumParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf passes gt/ge and breaks a run

    ttl_s: float = Field(2.0, gt=0, description="longest a pin is held")
    pin_threshold_s: float = Field(2.0, gt=0, description="pin only if the predicted tool time is at most this")
    ema_alpha: float = Field(0.2, gt=0, le=1, description="weight of the newest observed tool time in the average")


class Continuum(Policy):
    name: ClassVar[str] = "continuum"
    summary: ClassVar[str] = "Continuum: sticky programs, KV pinned through short tool calls for a TTL"
    params_model: ClassVar[type[BaseModel]] = ContinuumParams

    def __init__(self, view: ClusterView, params: BaseModel, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        self.p: ContinuumParams = params  # type: ignore[assignment]
        self.placement: dict[str, str] = {}
        self.programs_on = {w: 0 for w in view.worker_ids}
        self.predicted_tool_s: float | None = None
        self._turn_ended: dict[str, float] = {}

    def on_request(self, request: RequestSpec, now: float) -> Route:
        ended = self._turn_ended.pop(request.program, None)
        if ended is not None:
            gap = now - ended
            previous = self.predicted_tool_s
            self.predicted_tool_s = gap if previous is None else previous + self.p.ema_alpha * (gap - previous)
        worker = self.placement.get(request.program)
        if worker is None:
            worker = min(self.serving, key=self.programs_on.__getitem__)  # first worker on ties
            self.placement[request.program] = worker
            self.programs_on[worker] += 1
        return Route(worker)

    def on_turn_end(self, turn: TurnEnd, now: float) -> Sequence[ProgramDecision]:
        self._turn_ended[turn.program] = now
        predicted = self.predicted_tool_s
        if turn.ok and (predicted is None or predicted <= self.p.pin_threshold_s):
            return [Pin(turn.program, turn.worker, self.p.ttl_s)]
        return ()

    def on_program_end(self, program: str, now: float) -> Sequence[ProgramDecision]:
        worker = self.placement.pop(program, None)
        if worker is not None:
            self.programs_on[worker] -= 1
        self._turn_ended.pop(program, None)
        return ()

    def on_worker_lost(self, worker: str, now: float) -> Sequence[ProgramDecision]:
        """Its programs are placed afresh at their next request (their KV is gone anyway)."""
        super().on_worker_lost(worker, now)
        self.placement = {p: w for p, w in self.placement.items() if w != worker}
        self.programs_on[worker] = 0
        return ()
