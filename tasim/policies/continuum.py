"""Continuum (arXiv 2511.02230; the ThunderAgent paper's second baseline): keep a program's KV
pinned through a short tool call.

When a turn ends, the program's blocks are pinned on its worker for ``ttl_s`` if the tool call
is predicted to be short: Continuum's vLLM fork pins only when the predicted duration (a moving
average of observed durations) is at most 2 s. The pin ends at the TTL or when the program's next
request is admitted; that request goes to the front of the worker's queue. Programs are sticky:
a new program goes to the worker with the fewest live programs (how the ThunderAgent paper ran
Continuum behind its ``default`` router).

The fork keeps one moving average per tool name, parsed out of the model's output (``ls``,
``pytest``, ...), so it pins before a quick command and not before a test run. A workload with
named tools (``workload.tools``) gives each turn's end its tool's name; where the tools have no
names (``tool_latency_s``, or a live client), one average over every observed gap stands in.

With a host (CPU offloading) tier nothing changes: the fork's TTL is the fixed 2 s
(``FIXED_THRESHOLD_CONTINUUM`` in its ``vllm/v1/core/estimate_with_func.py``, ``set_up_pin``),
whatever an evicted program would cost to reload. The paper's later revisions (v2 on) describe
a TTL chosen to maximise P(tool returns within it) x (the reload cost, recompute or "reloading
if CPU offloading enabled", plus the queueing it saves) - the memory the pin holds; the preview
code does not compute it, so tasim does not either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tasim.core.cluster_view import ClusterView
from tasim.core.model import RequestSpec
from tasim.policies.interface import Pin, Policy, ProgramDecision, Route, TurnEnd


class ContinuumParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf passes gt/ge and breaks a run

    ttl_s: float = Field(2.0, gt=0, description="longest a pin is held")
    pin_threshold_s: float = Field(2.0, gt=0, description="pin only if the predicted tool time is at most this")
    ema_alpha: float = Field(0.2, gt=0, le=1, description="weight of the newest observed tool time in the average")


class Continuum(Policy[ContinuumParams]):
    name: ClassVar[str] = "continuum"
    summary: ClassVar[str] = "Continuum: sticky programs, KV pinned through short tool calls for a TTL"
    params_model: ClassVar[type[BaseModel]] = ContinuumParams

    def __init__(self, view: ClusterView, params: ContinuumParams, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        self.placement: dict[str, str] = {}
        self.programs_on = {w: 0 for w in view.worker_ids}
        self.predicted_tool_s: dict[str | None, float] = {}  # per tool name; None: unnamed
        self._turn_ended: dict[str, tuple[float, str | None]] = {}  # program -> (when, the tool it called)

    def on_request(self, request: RequestSpec, now: float) -> Route:
        ended = self._turn_ended.pop(request.program, None)
        if ended is not None:
            at, tool = ended
            gap = now - at
            previous = self.predicted_tool_s.get(tool)
            self.predicted_tool_s[tool] = gap if previous is None else previous + self.params.ema_alpha * (gap - previous)
        worker = self.placement.get(request.program)
        if worker is None:
            worker = min(self.serving, key=self.programs_on.__getitem__)  # first worker on ties
            self.placement[request.program] = worker
            self.programs_on[worker] += 1
        return Route(worker)

    def on_turn_end(self, turn: TurnEnd, now: float) -> Sequence[ProgramDecision]:
        self._turn_ended[turn.program] = (now, turn.tool)
        predicted = self.predicted_tool_s.get(turn.tool)  # None: not observed yet, so pinned
        if turn.ok and (predicted is None or predicted <= self.params.pin_threshold_s):
            return [Pin(turn.program, turn.worker, self.params.ttl_s)]
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
