"""Plain round-robin: each request goes to the next worker in turn, blind to programs and KV.

This is what Dynamo's frontend does with ``--router-mode round-robin`` and what the
ThunderAgent paper calls the stateless vLLM baseline when there is more than one replica.
With session affinity a program's later requests skip the rotation and go to its worker.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from tasim.core.cluster_view import ClusterView
from tasim.core.model import RequestSpec
from tasim.policies.session_affinity import AffinityParams, ProgramBlindRouter


class RoundRobin(ProgramBlindRouter):
    name: ClassVar[str] = "round_robin"
    summary: ClassVar[str] = "each request to the next worker in turn"

    def __init__(self, view: ClusterView, params: AffinityParams, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        self._next = 0

    def choose(self, request: RequestSpec, now: float) -> str:
        workers = self.serving
        worker = workers[self._next % len(workers)]
        self._next += 1
        return worker
