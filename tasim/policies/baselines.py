"""Program-blind baselines: uniform random and fewest-active-requests routing, per request
(Dynamo's ``--router-mode random`` and ``least-loaded``)."""

from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np
from pydantic import BaseModel

from tasim.model import RequestSpec
from tasim.policies.base import Policy, ProgramDecision, Route, TurnEnd, pick_uniform
from tasim.view import ClusterView


class RandomRouting(Policy):
    name: ClassVar[str] = "random"
    summary: ClassVar[str] = "each request to a uniformly random worker (seeded)"

    def on_request(self, request: RequestSpec, now: float) -> Route:
        workers = self.serving
        return Route(workers[int(self.rng.integers(len(workers)))])


class LeastLoaded(Policy):
    name: ClassVar[str] = "least_loaded"
    summary: ClassVar[str] = "each request to the worker with the fewest active requests (ties at random)"

    def __init__(self, view: ClusterView, params: BaseModel, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        self.active = {w: 0 for w in view.worker_ids}
        self._where: dict[str, str] = {}

    def on_request(self, request: RequestSpec, now: float) -> Route:
        active = self.active
        fewest = min(active[w] for w in self.serving)
        ties = [w for w in self.serving if active[w] == fewest]
        worker = pick_uniform(self.rng, ties)
        self.active[worker] += 1
        self._where[request.id] = worker
        return Route(worker)

    def on_turn_end(self, turn: TurnEnd, now: float) -> Sequence[ProgramDecision]:
        worker = self._where.pop(turn.request, None)
        if worker is not None:
            self.active[worker] -= 1
        return ()
