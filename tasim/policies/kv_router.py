"""Dynamo 1.6.1's KV-aware router (``--router-mode kv``), decision for decision.

Per request and worker ``w`` (``bs`` block size, ``ISL`` prompt tokens):

    decay_w  = 1 / (1 + d * ((P_w - min P) / bs) / ceil(ISL / bs))      (1 when d = 0)
    credit_w = c * decay_w * overlap_w + h * host_w + k * disk_w
    cost_w   = L * max(0, (P_w + ISL) / bs - credit_w) + (A_w + X_w) + r * N_w

``overlap_w``: leading prompt blocks the worker's prefix index says it holds on its GPU.
``host_w``: how many of the next prompt blocks, right after those, its host tier holds without a
gap; ``disk_w`` the same for its disk tier after that (both from KV events tagged with their
tier; `prefix_index`). A
block in two tiers counts once, in the higher. ``h`` = ``host_cache_hit_weight`` (0.75), ``k`` =
``disk_cache_hit_weight`` (0.25), as Dynamo 1.6.1's ``worker_logit``
(lib/kv-router/src/scheduling/selector/default.rs) with no shared cache, which tasim does not
model. The clamp at 0 is 1.6.1's: its ``KvRouterConfig`` documents credit above the prompt as
"adjusted prefill cost clamped at zero" (dynamo/_core.pyi). ``P_w``: prompt tokens of requests
routed to ``w`` that have not produced their first token, less what their cache covered: Dynamo's
``cached_tokens`` estimate, ``round((overlap_w + h * host_w + k * disk_w) * bs)``. ``A_w``:
distinct full prompt blocks of requests active on ``w``; ``X_w``: this request's full blocks not
among them. ``N_w``: active requests. The load terms come from the router's own bookings, not
from the engines. Temperature 0 picks the cheapest worker (ties broken uniformly at random with
the seeded RNG); T > 0 samples ``p ∝ exp(-(cost - min) / ((max - min) * T))``. Defaults are
Dynamo's. Without a host tier no lower-tier event arrives, and the router is the device-only one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasim.core.cluster_view import ClusterView
from tasim.core.kv_tier import KvTier
from tasim.core.model import RequestSpec
from tasim.policies.booked_blocks import BookedBlocks
from tasim.policies.interface import ProgramDecision, Route, TurnEnd, pick_uniform
from tasim.policies.prefix_index import ApproxIndex, EventIndex, PredictOnRouteIndex
from tasim.policies.session_affinity import AffinityParams, SessionAffinityPolicy
from tasim.policies.worker_cost import WorkerCost


class KvRouterParams(AffinityParams):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf passes gt/ge and breaks a run

    overlap_score_credit: float = Field(1.0, ge=0, description="c: blocks of prefill credited per cached block")
    host_cache_hit_weight: float = Field(0.75, ge=0, description="h: blocks of prefill credited per host-tier block beyond the GPU prefix")
    disk_cache_hit_weight: float = Field(0.25, ge=0, description="k: blocks of prefill credited per disk-tier block beyond the host run")
    overlap_score_credit_decay: float = Field(0.0, ge=0, description="d: shrink credit on workers with queued prefill")
    prefill_load_scale: float = Field(1.0, ge=0, description="L: weight of the prefill term")
    decode_active_request_weight: float = Field(0.0, ge=0, description="r: cost per active request")
    router_temperature: float = Field(0.0, ge=0, description="0 = argmin; > 0 = softmax over normalised costs")
    use_kv_events: bool = Field(True, description="prefix index from KV events; false = approximate (own decisions, TTL)")
    router_ttl_secs: float = Field(120.0, gt=0, description="approximate mode: block lifetime after last routing")
    router_predicted_ttl_secs: float | None = Field(
        None, gt=0, description="predict-on-route: routed prompts also count as cached for this long (needs use_kv_events)"
    )
    max_tree_size: int = Field(1 << 20, gt=0, description="approximate mode: index size guard in blocks")
    kv_event_lag_s: float = Field(0.0, ge=0, description="delay before KV events reach the index")
    router_track_prefill_tokens: bool = Field(True, description="include the (P + ISL) / bs prefill term")
    router_assume_kv_reuse: bool = Field(True, description="count active blocks once per distinct hash")
    active_decode_blocks_threshold: float | None = Field(
        None, gt=0, description="busy when A_w > threshold x KV blocks; busy workers are not eligible"
    )
    session_affinity_ttl_s: float | None = Field(None, gt=0, description="bind a program to its first worker for this idle TTL")
    session_affinity_mode: Literal["hard", "soft"] = Field(
        "hard", description="hard: always the bound worker; soft: the bound worker while it is eligible"
    )

    @model_validator(mode="after")
    def _predictions_need_events(self) -> KvRouterParams:
        if self.router_predicted_ttl_secs is not None and not self.use_kv_events:
            # Dynamo refuses this pair too: one approximate index would be fed twice
            raise ValueError("router_predicted_ttl_secs needs use_kv_events: true (approximate mode already predicts)")
        return self


@dataclass(slots=True)
class _Booking:
    worker: str
    prefill_tokens: int
    blocks: tuple[int, ...]
    prefill_done: bool = False


def worker_cost(params: KvRouterParams, block_size: int) -> WorkerCost:
    """Dynamo's ``DefaultWorkerScorer`` with ``params``' weights."""
    return WorkerCost(
        block_size,
        params.overlap_score_credit,
        params.overlap_score_credit_decay,
        params.prefill_load_scale,
        params.decode_active_request_weight,
        params.router_track_prefill_tokens,
        params.host_cache_hit_weight,
        params.disk_cache_hit_weight,
    )


class KvRouter(SessionAffinityPolicy[KvRouterParams]):
    name: ClassVar[str] = "kv_router"
    summary: ClassVar[str] = "Dynamo 1.6.1 KV-aware router: prefix overlap vs. booked load, per request"
    params_model: ClassVar[type[BaseModel]] = KvRouterParams

    def __init__(self, view: ClusterView, params: KvRouterParams, rng: np.random.Generator) -> None:
        super().__init__(view, params, rng)
        p = params
        workers = view.worker_ids
        self.block_size = view.workers[0].block_size
        self._cost = worker_cost(p, self.block_size)
        self._kv_blocks = {w.id: w.kv_blocks for w in view.workers}
        # Credit 0 means Dynamo builds no indexer at all: pure load balancing.
        self.index: EventIndex | ApproxIndex | PredictOnRouteIndex | None = None
        if p.overlap_score_credit > 0 and not p.use_kv_events:
            self.index = ApproxIndex(workers, p.router_ttl_secs, p.max_tree_size)
        elif p.overlap_score_credit > 0:
            self.index = EventIndex(workers, p.kv_event_lag_s)
            if p.router_predicted_ttl_secs is not None:
                predicted = ApproxIndex(workers, p.router_predicted_ttl_secs, p.max_tree_size)
                self.index = PredictOnRouteIndex(self.index, predicted)
        self.wants_kv_events = self.index is not None and p.use_kv_events
        self._prefill = {w: 0 for w in workers}
        self._active = {w: BookedBlocks() for w in workers}
        self._active_sum = {w: 0 for w in workers}
        self._requests = {w: 0 for w in workers}
        self._bookings: dict[str, _Booking] = {}

    # --- decisions -------------------------------------------------------------------------

    def costs(self, request: RequestSpec, now: float) -> tuple[dict[str, float], dict[str, int]]:
        """Cost per eligible worker and the device overlap (in blocks) each one was credited."""
        costs, overlaps, _ = self._costs(request, request.prompt_block_hashes(self.block_size), now)
        return costs, overlaps

    def tier_overlaps(self, request: RequestSpec, now: float) -> dict[str, tuple[int, int, int]]:
        """(device, host, disk) blocks of the prompt per worker, as the cost credits them."""
        hashes = request.prompt_block_hashes(self.block_size)
        overlaps = self._device_overlaps(hashes, now)
        lower = self._lower_runs(hashes, overlaps)
        return {w: (n, *lower.get(w, (0, 0))) for w, n in overlaps.items()}

    def cached_tokens(self, request: RequestSpec, now: float) -> dict[str, int]:
        """Dynamo's ``cached_tokens`` estimate per worker, which its booking of the request's
        prefill subtracts: the tier-weighted overlap in tokens, rounded. (The replay's
        per-request ``reported_overlap_tokens`` rounds to whole blocks first: 341.75 weighted
        blocks of 16 tokens report 5,472 where the booking takes 5,468, as the logits Dynamo's
        router logs for later decisions show.)"""
        return {w: self._cached_tokens(*tiers) for w, tiers in self.tier_overlaps(request, now).items()}

    def _device_overlaps(self, hashes: tuple[int, ...], now: float) -> dict[str, int]:
        return self.index.overlaps(hashes, now) if self.index else {w: 0 for w in self._prefill}

    def _lower_runs(self, hashes: tuple[int, ...], overlaps: dict[str, int]) -> dict[str, tuple[int, int]]:
        """Host and disk runs beyond each device match; none until a lower-tier event arrived."""
        index = self.index
        if isinstance(index, (EventIndex, PredictOnRouteIndex)) and index.lower_tiers:
            return index.lower_runs(hashes, overlaps)
        return {}

    def _cached_tokens(self, device: int, host: int, disk: int) -> int:
        p = self.params
        effective = float(device)  # the order Dynamo sums it in: device, then each lower tier's hits x weight
        if host:
            effective += host * p.host_cache_hit_weight
        if disk:
            effective += disk * p.disk_cache_hit_weight
        tokens = effective * self.block_size
        whole = math.floor(tokens)
        return whole + 1 if tokens - whole >= 0.5 else whole  # Rust's f64::round (half away from zero), exactly

    def _costs(
        self, request: RequestSpec, hashes: tuple[int, ...], now: float
    ) -> tuple[dict[str, float], dict[str, int], dict[str, tuple[int, int]]]:
        overlaps = self._device_overlaps(hashes, now)
        lower = self._lower_runs(hashes, overlaps)
        eligible = self._eligible()
        min_prefill = min(self._prefill[w] for w in eligible)
        reuse = self.params.router_assume_kv_reuse
        cost = self._cost
        costs = {}
        for w in eligible:
            if reuse:
                active = self._active[w]
                active_blocks = active.distinct
                new_blocks = len(hashes) - active.prefix(hashes)
            else:
                active_blocks = self._active_sum[w]
                new_blocks = len(hashes)
            host, disk = lower.get(w, (0, 0))
            costs[w] = cost(
                request.prompt_tokens, self._prefill[w], min_prefill, overlaps[w], active_blocks, new_blocks, self._requests[w], host, disk
            )
        return costs, overlaps, lower

    def on_request(self, request: RequestSpec, now: float) -> Route:
        hashes = request.prompt_block_hashes(self.block_size)
        worker = self._bound_worker(request.program, now)
        if worker:
            # The session's worker takes it whatever the costs: only that worker's overlap is
            # needed (for the booking), so the other workers' prefixes are not walked.
            device = self.index.overlap(worker, hashes, now) if self.index else 0
            lower = self._lower_runs(hashes, {worker: device})
        else:
            costs, overlaps, lower = self._costs(request, hashes, now)
            worker = self._pick(costs)
            device = overlaps[worker]
        self._book(request, hashes, worker, self._cached_tokens(device, *lower.get(worker, (0, 0))), now)
        self.sessions.bind(request.program, worker, now)
        return Route(worker)

    def _eligible(self) -> list[str]:
        threshold = self.params.active_decode_blocks_threshold
        workers = self.serving
        if threshold is None:
            return workers
        idle = [w for w in workers if self._active[w].distinct <= threshold * self._kv_blocks[w]]
        # Dynamo answers "all workers overloaded" with an error; tasim does not model rejection
        # yet, so it falls back to every worker.
        return idle or workers

    def _bound_worker(self, program: str, now: float) -> str | None:
        """The session's worker, if it takes the request: in soft mode only while it is eligible."""
        worker = self.sessions.worker(program, now)
        if self.params.session_affinity_mode == "soft" and worker not in self._eligible():
            return None
        return worker

    def _pick(self, costs: dict[str, float]) -> str:
        low = min(costs.values())
        temperature = self.params.router_temperature
        if temperature == 0:
            return pick_uniform(self.rng, [w for w, cost in costs.items() if cost == low])
        high = max(costs.values())
        if high == low:
            return pick_uniform(self.rng, list(costs))
        workers = list(costs)
        values = np.array([costs[w] for w in workers])
        weights = np.exp(-(values - low) / ((high - low) * temperature))
        return workers[int(self.rng.choice(len(workers), p=weights / weights.sum()))]

    # --- bookings --------------------------------------------------------------------------

    def _book(self, request: RequestSpec, hashes: tuple[int, ...], worker: str, cached_tokens: int, now: float) -> None:
        prefill = max(0, request.prompt_tokens - cached_tokens)
        self._bookings[request.id] = _Booking(worker, prefill, hashes)
        self._prefill[worker] += prefill
        self._active[worker].book(hashes)
        self._active_sum[worker] += len(hashes)
        self._requests[worker] += 1
        if self.index is not None:
            self.index.routed(worker, hashes, now)

    def on_first_token(self, request: str, worker: str, now: float) -> None:
        booking = self._bookings.get(request)
        if booking is not None and not booking.prefill_done:
            booking.prefill_done = True
            self._prefill[booking.worker] -= booking.prefill_tokens

    def on_turn_end(self, turn: TurnEnd, now: float) -> Sequence[ProgramDecision]:
        booking = self._bookings.pop(turn.request, None)
        if booking is not None:
            w = booking.worker
            if not booking.prefill_done:
                self._prefill[w] -= booking.prefill_tokens
            self._active[w].unbook(booking.blocks)
            self._active_sum[w] -= len(booking.blocks)
            self._requests[w] -= 1
        return super().on_turn_end(turn, now)

    def on_worker_lost(self, worker: str, now: float) -> Sequence[ProgramDecision]:
        """Forget what it cached and the sessions bound to it (they bind afresh, as Dynamo
        binds a session whose worker left); its bookings go as its calls fail."""
        super().on_worker_lost(worker, now)
        if self.index is not None:
            self.index.forget(worker)
        return ()

    def on_kv_stored(self, worker: str, blocks: Sequence[int], now: float, tier: KvTier = "device") -> None:
        if self.index is not None:
            self.index.stored(worker, blocks, now, tier)

    def on_kv_removed(self, worker: str, blocks: Sequence[int], now: float, tier: KvTier = "device") -> None:
        if self.index is not None:
            self.index.removed(worker, blocks, now, tier)
