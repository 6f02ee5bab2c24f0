"""Program-blind baselines: uniform random and fewest-active-requests routing, per request
(Dynamo's ``--router-mode random`` and ``least-loaded``), optionally behind session affinity."""

from __future__ import annotations

from typing import ClassVar

from tasim.core.model import RequestSpec
from tasim.policies.interface import pick_uniform
from tasim.policies.session_affinity import LoadCountingRouter, ProgramBlindRouter


class RandomRouting(ProgramBlindRouter):
    name: ClassVar[str] = "random"
    summary: ClassVar[str] = "each request to a uniformly random worker (seeded)"

    def choose(self, request: RequestSpec, now: float) -> str:
        workers = self.serving
        return workers[int(self.rng.integers(len(workers)))]


class LeastLoaded(LoadCountingRouter):
    name: ClassVar[str] = "least_loaded"
    summary: ClassVar[str] = "each request to the worker with the fewest active requests (ties at random)"

    def choose(self, request: RequestSpec, now: float) -> str:
        active = self.active
        fewest = min(active[w] for w in self.serving)
        return pick_uniform(self.rng, [w for w in self.serving if active[w] == fewest])
