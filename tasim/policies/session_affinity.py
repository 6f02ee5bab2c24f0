"""Session affinity as Dynamo 1.6.1's frontend offers it in every router mode
(``--router-session-affinity-ttl-secs``, keyed by ``X-Dynamo-Session-ID``; tasim keys it by
program).

A session's first dispatch binds it to the worker its router chose; its later requests go
straight there, without consulting the router (a round-robin rotation does not advance). The
binding lapses when the session has been idle, with no request ending, for the TTL, or when its
worker is lost; the next request then binds afresh. The verl Dynamo recipe turns this on for
RL rollouts so that a trajectory's turns stay with their prefix cache. With a TTL longer than
any trajectory, ``least_loaded`` plus affinity is verl 0.9.1's own ``GlobalRequestLoadBalancer``
(sticky per trajectory, otherwise the fewest requests in flight, ties at random).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeVar

from tasim.core.cluster_view import ClusterView
from tasim.core.model import RequestSpec
from tasim.policies.interface import Policy, ProgramDecision, Route, TurnEnd


@dataclass(slots=True)
class Binding:
    worker: str
    last_used: float


class SessionBindings:
    """Program → worker bindings with an idle TTL; ``ttl_s`` None keeps none (affinity off)."""

    def __init__(self, ttl_s: float | None) -> None:
        self.ttl_s = ttl_s
        self._bindings: dict[str, Binding] = {}

    def get(self, program: str) -> Binding | None:
        return self._bindings.get(program)

    def worker(self, program: str, now: float) -> str | None:
        """The live binding's worker, dropping a binding idle for longer than the TTL."""
        binding = self._bindings.get(program)
        if binding is None or self.ttl_s is None:
            return None
        if now - binding.last_used > self.ttl_s:
            del self._bindings[program]
            return None
        return binding.worker

    def bind(self, program: str, worker: str, now: float) -> None:
        if self.ttl_s is not None and program not in self._bindings:
            self._bindings[program] = Binding(worker, now)

    def request_ended(self, program: str, now: float) -> None:
        binding = self._bindings.get(program)
        if binding is not None:
            binding.last_used = now  # the idle TTL restarts when a request ends

    def program_ended(self, program: str) -> None:
        self._bindings.pop(program, None)

    def clear(self) -> None:
        self._bindings.clear()

    def worker_lost(self, worker: str) -> None:
        """Its sessions bind afresh, as Dynamo rebinds a session whose worker left."""
        self._bindings = {p: b for p, b in self._bindings.items() if b.worker != worker}


class AffinityParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    session_affinity_ttl_s: float | None = Field(
        None, gt=0, description="bind a program to its first worker for this idle TTL (Dynamo's session affinity)"
    )


AffinityParamsT = TypeVar("AffinityParamsT", bound=AffinityParams, covariant=True, default=AffinityParams)


class SessionAffinityPolicy(Policy[AffinityParamsT]):
    """A policy whose params carry ``session_affinity_ttl_s``: keeps `sessions` up to date as
    requests end, programs end and workers are lost. Overrides call these first or last."""

    def __init__(self, view: ClusterView, params: AffinityParamsT, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        self.sessions = SessionBindings(params.session_affinity_ttl_s)

    def on_turn_end(self, turn: TurnEnd, now: float) -> Sequence[ProgramDecision]:
        self.sessions.request_ended(turn.program, now)
        return ()

    def on_program_end(self, program: str, now: float) -> Sequence[ProgramDecision]:
        self.sessions.program_ended(program)
        return ()

    def on_worker_lost(self, worker: str, now: float) -> Sequence[ProgramDecision]:
        super().on_worker_lost(worker, now)
        self.sessions.worker_lost(worker)
        return ()

    def on_weight_sync_begin(self, now: float) -> None:
        """A sync empties every worker's cache, so a binding keeps nothing: sessions bind
        afresh, the aborted calls' retries by the router's choice. (verl's own balancer keeps
        its sticky map; a retry then finds its worker's cache empty just the same.)"""
        self.sessions.clear()


class ProgramBlindRouter(SessionAffinityPolicy[AffinityParamsT]):
    """A per-request router (`choose`) behind Dynamo's session affinity."""

    params_model = AffinityParams

    def choose(self, request: RequestSpec, now: float) -> str:
        raise NotImplementedError

    def dispatched(self, request: RequestSpec, worker: str) -> None:
        """Every request sent to ``worker``, chosen or bound (for load counts)."""

    def on_request(self, request: RequestSpec, now: float) -> Route:
        worker = self.sessions.worker(request.program, now)
        if worker is None:
            worker = self.choose(request, now)
            self.sessions.bind(request.program, worker, now)
        self.dispatched(request, worker)
        return Route(worker)


class LoadCountingRouter(ProgramBlindRouter[AffinityParamsT]):
    """A per-request router that counts each worker's requests routed and not ended (``active``):
    booked when a request is routed, chosen or bound, freed when its turn ends or fails."""

    def __init__(self, view: ClusterView, params: AffinityParamsT, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        self.active = dict.fromkeys(view.worker_ids, 0)
        self._where: dict[str, str] = {}

    def dispatched(self, request: RequestSpec, worker: str) -> None:
        self.active[worker] += 1
        self._where[request.id] = worker

    def on_turn_end(self, turn: TurnEnd, now: float) -> Sequence[ProgramDecision]:
        worker = self._where.pop(turn.request, None)
        if worker is not None:
            self.active[worker] -= 1
        return super().on_turn_end(turn, now)
