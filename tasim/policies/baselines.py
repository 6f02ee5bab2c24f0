"""Program-blind baselines: uniform random and fewest-active-requests routing, per request
(Dynamo's ``--router-mode random`` and ``least-loaded``), optionally behind session affinity."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from tasim.model import RequestSpec
from tasim.policies.base import ProgramDecision, TurnEnd, pick_uniform
from tasim.policies.session_affinity import AffinityParams, ProgramBlindRouter
from tasim.view import ClusterView


class RandomRouting(ProgramBlindRouter):
    name: ClassVar[str] = "random"
    summary: ClassVar[str] = "each request to a uniformly random worker (seeded)"

    def choose(self, request: RequestSpec, now: float) -> str:
        workers = self.serving
        return workers[int(self.rng.integers(len(workers)))]


class LeastLoaded(ProgramBlindRouter):
    name: ClassVar[str] = "least_loaded"
    summary: ClassVar[str] = "each request to the worker with the fewest active requests (ties at random)"

    def __init__(self, view: ClusterView, params: AffinityParams, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        self.active = {w: 0 for w in view.worker_ids}
        self._where: dict[str, str] = {}

    def choose(self, request: RequestSpec, now: float) -> str:
        active = self.active
        fewest = min(active[w] for w in self.serving)
        return pick_uniform(self.rng, [w for w in self.serving if active[w] == fewest])

    def dispatched(self, request: RequestSpec, worker: str) -> None:
        self.active[worker] += 1
        self._where[request.id] = worker

    def on_turn_end(self, turn: TurnEnd, now: float) -> Sequence[ProgramDecision]:
        worker = self._where.pop(turn.request, None)
        if worker is not None:
            self.active[worker] -= 1
        return super().on_turn_end(turn, now)
