"""Any tasim policy as verl 0.9.1's request load balancer, inside plain verl (no Dynamo).

verl routes every ``generate`` call of its agent loops through one load-balancer Ray actor
(`verl.workers.rollout.router`). Its plug point is ``actor_rollout_ref.rollout.router_config_path``:
a YAML file whose ``router_class`` names the class; verl wraps the class with ``ray.remote`` and
constructs it as ``cls(servers, yaml_dict)``, where ``servers`` maps each server address to its
actor handle and ``yaml_dict`` is the whole file (``router_class`` included). So::

    router_class: tasim.live.verl.balancer.TasimLoadBalancer
    policy: thunderagent          # any name in tasim.policies.POLICIES (default kv_router)
    policy_params: {scheduler_interval_s: 1.0}
    kv_blocks: 4096               # per server; required: capacity-aware policies need it
    block_size: 16                # max_num_seqs, max_num_batched_tokens, seed,
                                  # program_idle_ttl_s are optional too

What the policy sees, and why:

* **Programs are trajectories.** verl's agent loops pass one ``request_id`` per trajectory and
  reuse it for every turn (`LLMServerClient.generate`), so the ``request_id`` is the program id
  and multi-turn prefixes hash onto one program, as ``x-dynamo-session-id`` does live. (Not
  with ``rollout.full_determinism``: verl's tool agent loop then names every trajectory
  ``det-{priority}``, which would merge them all into one program.)
* **Workers.** The servers, sorted by address, are the policy's ``w0 … wN-1``; every server gets
  the same `WorkerInfo` from the YAML limits because verl does not report them.
* **Turn ends without usage.** verl's release carries only the ``request_id``, so each turn is
  reported with ``prompt_tokens = len(prompt)``, ``output_tokens = 0``, ``cached_tokens = 0``.
  Token-counting policies (ThunderAgent) therefore lag by one turn's output, which the next
  turn's prompt carries anyway.
* **No KV events.** Engines behind plain verl publish none, so a policy configured to want them
  (kv_router's ``use_kv_events``, ThunderAgent's ``resume_on_origin``) is refused; for kv_router
  ``use_kv_events`` defaults to false here (Dynamo's approximate ``--no-router-kv-events`` mode:
  the prefix index learns from the routing decisions themselves).
* **Held calls.** A policy may hold a call (ThunderAgent pauses programs). verl awaits the
  ``acquire_server`` RPC, and Ray runs ``async def`` actor methods concurrently on the actor's
  event loop, so a held acquire awaits `PolicyHost.wait` while other calls proceed. Every method
  that touches state is ``async`` for the same reason: all of them then run on that one loop and
  never interleave except at an ``await``. The policy's periodic tick runs as a task on that loop,
  started by the first acquire, which is sure to run on it (the constructor may not).
* **Program ends.** Plain verl has no session-final request, so a program ends when it has been
  idle (nothing in flight or held) for ``program_idle_ttl_s``.
* **Affinity clears.** ``clear_sticky_cache`` ends no program. verl's own balancer only empties
  its sticky map there (``GlobalRequestLoadBalancer.clear_sticky_cache``), and verl calls it at
  separate_async's switch to rollout (just before a weight update) and at the fully async
  rollouter's rebalance; the trajectories go on afterwards, and each later turn must find its
  one program. Here the policy hears it as a weight sync begun and ended at once, numbered by
  the balancer's count of clears (verl names no version): session-affinity routers forget their
  bindings, and ThunderAgent, which holds only the calls that arrive between a begin and an
  end, releases nothing. The balancer forgets each trajectory's last server too (where a call
  the policy sends to a removed server goes instead), and ``cleared_entries`` counts the
  trajectories that had one, as verl's counts its sticky map's entries. verl does not tell the
  balancer when it updates the weights itself, so nothing here holds calls through an update.

Elastic pool (verl's fully-async and separate-async trainers add and remove hybrid replicas):
``remove_servers`` takes a server out of service at once. The policy's `ClusterView` is fixed,
so it may still choose a removed worker; such a call is redirected to an active server (the
program's previous one if active, else the one with the fewest in-flight calls) and counted in
``get_status()["redirected"]``, while the policy books the call on the worker it chose.
``add_servers`` with servers seen before puts them back in service. Servers never seen before
change the worker set, so the policy is rebuilt over the servers in service (removed ones are
forgotten), which forgets every live program; this is only done when no call is in flight or held (e.g. verl's ``create_empty``
start, then ``add_servers``) and raises `NotImplementedError` otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tasim.core import events as ev
from tasim.core.cluster_view import ClusterView, WorkerInfo
from tasim.core.determinism import policy_rng
from tasim.live.router.live_host import Call, Held, PolicyHost
from tasim.policies import POLICIES, make_policy, policy_class

logger = logging.getLogger(__name__)

# verl's `FullyAsyncLLMServerClient` retries an acquire that fails with exactly this message
# while hybrid replicas are away, so an empty pool must say it verbatim.
NO_SERVERS = "No available servers in load balancer"


class BalancerConfig(BaseModel):
    """The router YAML. ``router_class`` is verl's own key, accepted and not used here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    router_class: str = ""
    policy: str = Field("kv_router", description="a tasim policy name")
    policy_params: dict[str, Any] = Field(default_factory=dict, description="the policy's parameters")
    block_size: int = Field(16, gt=0, description="tokens per KV block, as the engines use")
    kv_blocks: int = Field(gt=0, description="KV blocks per server")
    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int = Field(8192, gt=0)
    seed: int = Field(0, ge=0, description="seed of the policy's random tie breaks")
    program_idle_ttl_s: float = Field(600.0, gt=0, description="end a program idle this long")


def parse_config(raw: Mapping[str, Any]) -> tuple[BalancerConfig, dict[str, Any]]:
    """The validated YAML and the policy's parameters (checked); `ValueError` with one line
    naming the key, because verl shows the actor's constructor error to the user as is."""
    try:
        config = BalancerConfig.model_validate(dict(raw))
    except ValidationError as error:
        raise ValueError(_one_line(error, "", BalancerConfig)) from None
    if config.policy not in POLICIES:
        raise ValueError(f"tasim router config: unknown policy {config.policy!r} (allowed: {', '.join(sorted(POLICIES))})")
    params = dict(config.policy_params)
    if config.policy == "kv_router":
        params.setdefault("use_kv_events", False)
    params_model = policy_class(config.policy).params_model
    try:
        params_model.model_validate(params)
    except ValidationError as error:
        raise ValueError(_one_line(error, "policy_params", params_model)) from None
    probe = make_policy(config.policy, params, _view(config, 1), np.random.default_rng(0))
    if probe.wants_kv_events:
        raise ValueError(
            f"tasim router config: policy_params make {config.policy} depend on KV events, which engines behind "
            "plain verl do not publish (kv_router: use_kv_events: false; thunderagent: resume_on_origin: false)"
        )
    return config, params


def _one_line(error: ValidationError, prefix: str, model: type[BaseModel]) -> str:
    parts = []
    for item in error.errors():
        key = ".".join(part for part in (prefix, *map(str, item["loc"])) if part)
        if item["type"] == "extra_forbidden":
            parts.append(f"unknown key {key!r} (allowed: {', '.join(model.model_fields)})")
        elif item["type"] == "missing":
            parts.append(f"{key!r} is required")
        else:
            message = str(item["ctx"]["error"]) if item["type"] == "value_error" else item["msg"]
            parts.append(f"{key!r}: {message}" + ("" if item["type"] == "value_error" else f" (got {item['input']!r})"))
    return "tasim router config: " + "; ".join(parts)


def _view(config: BalancerConfig, workers: int) -> ClusterView:
    return ClusterView(
        tuple(WorkerInfo(f"w{i}", config.block_size, config.kv_blocks, config.max_num_seqs, config.max_num_batched_tokens) for i in range(workers))
    )


@dataclass(slots=True)
class _Trajectory:
    """The balancer's side of one program: what must be matched at release and idle expiry."""

    last_active: float
    server: str | None = None  # where its latest call went
    waiting: int = 0  # acquires the policy holds
    calls: list[tuple[str, Call]] = field(default_factory=list)  # (server, call) routed, not released


class TasimLoadBalancer:
    """verl's `RequestLoadBalancer` protocol around a `PolicyHost` (see the module docstring)."""

    def __init__(self, servers: dict[str, Any], config: dict[str, Any]) -> None:
        self.config, self._params = parse_config(config)
        self._t0 = time.monotonic()
        self._rng = policy_rng(self.config.seed)  # the tie-breaks tasim simulates and routes with for this seed
        self._handles: dict[str, Any] = {}
        self._active: set[str] = set()
        self._inflight: dict[str, int] = {}
        self._routed: Counter[str] = Counter()
        self._redirected = 0
        self._affinity_clears = 0
        self._events: Counter[str] = Counter()
        self._trajectories: dict[str, _Trajectory] = {}  # least recently active first
        self._host: PolicyHost | None = None
        self._worker_of: dict[str, str] = {}
        self._server_of: dict[str, str] = {}
        self._tick_task: asyncio.Task[None] | None = None
        self._register(servers)

    # --- verl's protocol -------------------------------------------------------------------

    def require_acquire_fields(self) -> list[str]:
        """The prompt for block hashes and sizes; sampling params for ``max_tokens``."""
        return ["prompt_ids", "sampling_params"]

    def require_release_fields(self) -> list[str]:
        """The ``request_id`` finds the call (and its prompt length) booked at acquire."""
        return ["request_id"]

    async def acquire_server(self, request_id: str, prompt_ids: Any = None, sampling_params: dict[str, Any] | None = None) -> tuple[str, Any]:
        """Let the policy route one turn of trajectory ``request_id``; waits while it is held."""
        if self._host is None or not self._active:
            raise RuntimeError(NO_SERVERS)
        host = self._host
        self._start_ticks()
        now = host.clock()
        self._expire_idle(now)
        tokens = _token_list(prompt_ids)
        sampling = sampling_params or {}
        max_tokens = int(sampling.get("max_tokens") or sampling.get("max_new_tokens") or 0)
        trajectory = self._touch(request_id, now)
        admission = host.decide(request_id, tokens, max_tokens)
        if isinstance(admission, Held):
            trajectory.waiting += 1
            try:
                call = await host.wait(admission)
            finally:
                trajectory.waiting -= 1
        else:
            call = admission
        server = self._destination(call.worker, trajectory.server)
        if server is None:  # every server was removed while the call was held
            host.fail(call, "no server in service")
            raise RuntimeError(NO_SERVERS)
        trajectory = self._touch(request_id, host.clock())
        trajectory.calls.append((server, call))
        trajectory.server = server
        self._inflight[server] += 1
        self._routed[server] += 1
        return server, self._handles[server]

    async def release_server(self, server_id: str, request_id: str | None = None) -> None:
        """The turn ended; verl reports no usage, so the policy hears prompt-only tokens."""
        trajectory = self._trajectories.get(request_id) if request_id is not None else None
        calls = trajectory.calls if trajectory is not None else []
        match = next((i for i, (server, _) in enumerate(calls) if server == server_id), None)
        if request_id is None or match is None or self._host is None:
            logger.warning("release of %s on %s matches no call routed by this balancer; ignored", request_id, server_id)
            return
        _, call = calls.pop(match)  # the oldest call on that server, should two be in flight
        self._inflight[server_id] -= 1
        self._touch(request_id, self._host.clock())
        self._host.finish(call, prompt_tokens=call.spec.prompt_tokens, output_tokens=0, cached_tokens=0)

    async def add_servers(self, servers: dict[str, Any]) -> None:
        """Known servers return to service; new ones rebuild the policy (only when idle)."""
        self._register(servers)

    async def remove_servers(self, server_ids: list[str]) -> None:
        """Take servers out of service; calls the policy still sends there are redirected."""
        self._active.difference_update(server_ids)

    async def get_all_servers(self) -> list[str]:
        return sorted(self._active)

    async def get_total_inflight(self) -> int:
        """Calls routed to servers in service and not yet released (held calls excluded)."""
        return sum(self._inflight[server] for server in self._active)

    async def clear_sticky_cache(self) -> dict[str, Any]:
        """Forget where trajectories went, and tell the policy (a weight sync begun and ended
        at once); programs go on."""
        cleared = 0
        for trajectory in self._trajectories.values():
            cleared += trajectory.server is not None
            trajectory.server = None
        if self._host is not None:
            self._affinity_clears += 1
            self._host.begin_weight_sync(self._affinity_clears)
            self._host.end_weight_sync(self._affinity_clears)
        return {"cleared_entries": cleared, "server_loads": {s: self._inflight[s] for s in sorted(self._active)}}

    async def get_status(self) -> dict[str, Any]:
        host = self._host
        return {
            "servers": {s: self._inflight[s] for s in sorted(self._active)},
            "total_inflight": await self.get_total_inflight(),
            "active_servers": len(self._active),
            "registered_handles": sorted(self._active),
            "policy": self.config.policy,
            "workers": dict(self._worker_of),
            "routed": {s: self._routed[s] for s in sorted(self._handles)},
            "redirected": self._redirected,
            "programs": len(self._trajectories),
            "held": sum(t.waiting for t in self._trajectories.values()),
            "finished": host.finished if host else 0,
            "pauses": host.pauses if host else 0,
            "resumes": host.resumes if host else 0,
            "events": dict(self._events),
        }

    # --- helpers ---------------------------------------------------------------------------

    def _register(self, servers: Mapping[str, Any]) -> None:
        new = set(servers) - set(self._worker_of)
        if new and self._host is not None:
            busy = self._host.in_flight + sum(t.waiting for t in self._trajectories.values())
            if busy:
                raise NotImplementedError(
                    f"tasim balancer: cannot add new servers {sorted(new)} while {busy} calls are in flight or held; "
                    "the policy's worker set is fixed while it routes (list every server at construction, "
                    "or add servers when the pool is idle)"
                )
        self._handles.update(servers)
        self._active.update(servers)
        for server in servers:
            self._inflight.setdefault(server, 0)
        if new:
            self._rebuild()

    def _rebuild(self) -> None:
        """A fresh policy over the servers in service: the worker set changed."""
        order = sorted(self._active)
        view = _view(self.config, len(order))
        policy = make_policy(self.config.policy, self._params, view, self._rng)
        self._worker_of = dict(zip(order, view.worker_ids))
        self._server_of = dict(zip(view.worker_ids, order))
        self._host = PolicyHost(policy, self._clock, self._emit, self.config.block_size)
        self._trajectories.clear()
        for server in set(self._handles) - self._active:  # forgotten: a later add is a new server
            del self._handles[server], self._inflight[server]

    def _destination(self, worker: str, previous: str | None) -> str | None:
        chosen = self._server_of[worker]
        if chosen in self._active:
            return chosen
        if not self._active:
            return None
        self._redirected += 1
        if previous in self._active:
            return previous
        return min(sorted(self._active), key=self._inflight.__getitem__)

    def _touch(self, request_id: str, now: float) -> _Trajectory:
        """The trajectory's record, marked active now and moved to the end of the table."""
        trajectory = self._trajectories.pop(request_id, None) or _Trajectory(now)
        trajectory.last_active = now
        self._trajectories[request_id] = trajectory
        return trajectory

    def _end(self, request_id: str) -> None:
        del self._trajectories[request_id]
        if self._host is not None:
            self._host.end_program(request_id)

    def _expire_idle(self, now: float) -> None:
        """End programs idle past the TTL; the table is in activity order, so stop early."""
        ttl = self.config.program_idle_ttl_s
        expired = []
        for rid, trajectory in self._trajectories.items():
            if now - trajectory.last_active <= ttl:
                break
            if not trajectory.calls and not trajectory.waiting:
                expired.append(rid)
        for rid in expired:
            self._end(rid)

    def _start_ticks(self) -> None:
        if self._tick_task is None and self._host is not None and self._host.policy.tick_interval_s:
            self._tick_task = asyncio.get_running_loop().create_task(self._ticks())

    async def _ticks(self) -> None:
        while True:
            assert self._host is not None and self._host.policy.tick_interval_s
            await asyncio.sleep(self._host.policy.tick_interval_s)
            try:
                self._host.tick()
                self._expire_idle(self._host.clock())
            except Exception:  # a failing tick must not stop later resumes
                logger.exception("tasim balancer: policy tick failed")

    def _clock(self) -> float:
        return time.monotonic() - self._t0

    def _emit(self, event: ev.Event) -> None:
        self._events[type(event).__name__] += 1


def _token_list(prompt_ids: Any) -> list[int]:
    """verl passes lists; tensors and arrays are converted so hashing sees plain ints."""
    if prompt_ids is None:
        return []
    if isinstance(prompt_ids, list):
        return prompt_ids
    return prompt_ids.tolist() if hasattr(prompt_ids, "tolist") else list(prompt_ids)
