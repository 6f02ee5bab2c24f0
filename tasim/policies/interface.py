"""The policy interface: notifications in, decisions out.

A policy is pure decision logic. It never sleeps, never does I/O and never reads a clock: time
arrives as ``now`` in every call. The simulator's policy host and the live router call the same
methods, so a policy judged in simulation is the object that routes real traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Generic

import numpy as np
from pydantic import BaseModel, ConfigDict
from typing_extensions import TypeVar

from tasim.core.cluster_view import ClusterView
from tasim.core.kv_tier import KvTier
from tasim.core.model import BlockHash, RequestSpec
from tasim.core.records import record

# --- decisions ---------------------------------------------------------------------------------


@record
class Route:
    """Send the request to ``worker`` now. ``priority``: its place in the engine's queue under
    vLLM's priority scheduling (``cluster.engine.scheduling_policy: priority``), lower first,
    ties by arrival; a policy that sets it declares ``sets_priorities``. A held call resumed
    later goes in with priority 0."""

    worker: str
    priority: int = 0


@record
class Hold:
    """Keep the request at the router until a `Resume` for its program names a worker.
    ``pause``: this hold also pauses the program (e.g. a new program queued for room)."""

    pause: bool = False


@record
class Pause:
    """The program's next request will be held; its KV may be evicted meanwhile."""

    program: str


@record
class Resume:
    """The program may run again on ``worker``; a held request goes there now. ``forced``: a
    timeout resumed it without a capacity check."""

    program: str
    worker: str
    forced: bool = False


@record
class Pin:
    """Keep the KV blocks of the program's last request on ``worker`` referenced (not
    evictable) for up to ``ttl_s``, or until its next request is admitted there."""

    program: str
    worker: str
    ttl_s: float


@record
class Release:
    """A call the policy held without pausing its program (through a weight sync) goes to
    ``worker`` now."""

    program: str
    worker: str


RequestDecision = Route | Hold
ProgramDecision = Pause | Resume | Pin | Release


# --- notifications -----------------------------------------------------------------------------


@record
class TurnEnd:
    """A request finished (``ok``) or failed; usage is what the engine reported, ``tool`` the
    named tool its output calls (None when unknown)."""

    program: str
    request: str
    worker: str
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    ok: bool = True
    tool: str | None = None


def pick_uniform(rng: np.random.Generator, candidates: Sequence[str]) -> str:
    """One of ``candidates`` uniformly at random; no draw when there is only one, so a tie that
    does not happen leaves the random stream untouched."""
    return candidates[int(rng.integers(len(candidates)))] if len(candidates) > 1 else candidates[0]


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


# A policy's validated parameters (its ``params_model``); a host that does not care which policy
# it holds sees them as a plain BaseModel.
ParamsT = TypeVar("ParamsT", bound=BaseModel, covariant=True, default=BaseModel)


class Policy(Generic[ParamsT]):
    """Base class with no-op hooks; subclasses override what they need.

    ``params_model`` validates ``policy.params`` from the scenario file; ``tick_interval_s``
    (None = no tick) asks the host to call `on_tick` periodically; ``wants_kv_events`` asks
    for the workers' KV stored/removed events. ``serving`` lists the workers that may be
    routed to, in cluster order: all of them, unless live mode lost one (`on_worker_lost`).
    """

    name: ClassVar[str] = "base"
    summary: ClassVar[str] = ""
    params_model: ClassVar[type[BaseModel]] = NoParams
    # whether it may keep a program's request at the router (`Hold`), outside the engine and
    # outside the request's latency as an engine measures it
    holds_requests: ClassVar[bool] = False
    tick_interval_s: float | None = None
    wants_kv_events: bool = False
    # whether its routes carry priorities, which only engines with priority scheduling honour
    sets_priorities: ClassVar[bool] = False

    def __init__(self, view: ClusterView, params: ParamsT, rng: np.random.Generator) -> None:
        self.view = view
        self.params: ParamsT = params
        self.rng = rng
        self.serving: list[str] = list(view.worker_ids)

    def on_program_start(self, program: str, now: float) -> None:
        """A program (agent trajectory, session) begins."""

    def on_request(self, request: RequestSpec, now: float) -> RequestDecision:
        raise NotImplementedError

    def on_first_token(self, request: str, worker: str, now: float) -> None:
        """Prefill of ``request`` completed on ``worker``."""

    def on_turn_end(self, turn: TurnEnd, now: float) -> Sequence[ProgramDecision]:
        return ()

    def on_program_end(self, program: str, now: float) -> Sequence[ProgramDecision]:
        """The program's client released it (its session-final). A client that never releases
        (``workload.release: never``) never causes this: whatever expiry the policy has of its
        own is then all that ends the program here."""
        return ()

    def on_kv_stored(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        """Blocks newly cached on ``worker`` in ``tier`` (only when ``wants_kv_events``). Every
        tier is reported: a block stored to the host tier while it stays on the GPU is in both,
        and a device removal leaves its host copy. A policy that models the GPU pool alone
        ignores the other tiers."""

    def on_kv_removed(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        """Blocks evicted from ``worker``'s ``tier`` (only when ``wants_kv_events``)."""

    def on_tick(self, now: float) -> Sequence[ProgramDecision]:
        return ()

    def on_weight_sync_begin(self, now: float) -> None:
        """The trainer begins pushing new weights to every worker. Each call in flight is
        aborted: it ends with ``TurnEnd(ok=False)`` after this and comes back, after the client's
        retry delay, as a new call of its turn whose prompt holds the output generated so far.
        Every worker's prefix cache is emptied (its removals reported as KV events); calls routed
        before the sync ends wait at their worker."""

    def on_weight_sync_end(self, now: float) -> Sequence[ProgramDecision]:
        """The workers serve the new weights: what the policy held through the sync may go."""
        return ()

    def on_worker_lost(self, worker: str, now: float) -> Sequence[ProgramDecision]:
        """``worker`` died, with its KV cache (live mode): route and resume nothing there
        until it joins again, and place its programs elsewhere. Its calls in flight end with
        ``TurnEnd(ok=False)`` after this, each followed by the retried call's `on_request`.
        Overrides call this first. While no worker serves, the host refuses calls rather than
        ask for a decision, but ticks go on."""
        self.serving.remove(worker)
        return ()

    def on_worker_joined(self, worker: str, now: float) -> Sequence[ProgramDecision]:
        """A lost ``worker`` serves again, with an empty KV cache. Overrides call this first."""
        self.serving = [w for w in self.view.worker_ids if w in self.serving or w == worker]
        return ()
