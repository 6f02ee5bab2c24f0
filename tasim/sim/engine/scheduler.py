"""One engine replica with vLLM-v1 scheduling semantics (as Dynamo's mocker models them).

The engine is a plain state machine, independent of the clock: `begin_step` schedules one
iteration at time ``now`` and returns it with its duration from the perf model; `end_step`
applies its outcome at the step's end. Per step:

1. A token budget of ``max_num_batched_tokens``. Running requests, in admission order, each get
   ``min(known tokens - computed, budget)``: 1 for a decode, the next chunk for a prefill. If the
   KV cache manager has no slots for those tokens, the newest (or oldest) running request is
   preempted (recompute: its blocks are freed, it goes back to the front of the waiting queue)
   until it has; the request may preempt itself. Under priority scheduling the victim is the
   running request with the highest (priority, arrival), as vLLM's ``--scheduling-policy
   priority`` picks it, and the queue is kept in (priority, arrival) order, so a preempted
   request goes back to its place there rather than to the front.
2. If nothing was preempted, waiting requests are admitted in queue order while fewer than
   ``max_num_seqs`` run and budget remains: the longest computed prefix of full blocks is reused
   (at least one token is always computed); the whole sequence must fit in the blocks that are
   free or evictable, else admission stops (head-of-line); slots are taken only for the
   scheduled chunk. Without chunked prefill the rest of the prompt must fit the budget.
3. Blocks that this step completes are cached under their hash at scheduling time (KV stored
   events); evictions happen while allocating (KV removed events).
4. At the end of the step every request whose known tokens are all computed emits one token:
   the first one when its prefill completes, then one per decode step. A request that has
   emitted its last token finishes and frees its blocks (they stay cached until evicted).

The engine reaches KV blocks only through its KV cache manager (`tasim.sim.engine.kv_manager`:
computed prefixes, slots, freeing, KV events, pins). It is a `FoldableEngine`: it plans the
runs of identical steps that `tasim.sim.engine.fast_forward` folds.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from typing import Literal, Protocol

from tasim.core.model import BlockHash, RequestSpec, blocks_for
from tasim.sim.engine.block_pool import Eviction
from tasim.sim.engine.host_tier import host_hit
from tasim.sim.engine.kv_manager import BlockBoundary, ComputedBlocks, HostTierSetup, KVCacheManager, RequestBlocks
from tasim.sim.engine.mocker_host_tier import mocker_host_hit
from tasim.sim.perf.perf_model import PerfModel, StepShape, decode_shape, summed


@dataclass(frozen=True, slots=True)
class EngineSetup:
    """What one engine replica is built with: the scenario's `cluster.engine`, resolved for a worker
    (`tasim.sim.runner.engine_setup`)."""

    block_size: int
    num_blocks: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    preemption: Literal["newest_first", "oldest_first"] = "newest_first"
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    eviction: Eviction = "lru"
    max_model_len: int = 1 << 40  # the longest request (prompt + output) the engine serves
    cache_duplicates: bool = False  # vLLM: a recomputed cached block is a second cached copy (see kv_cache)
    host_tier: HostTierSetup | None = None  # a host KV tier behind the GPU pool (see `Engine`)


class EngineListener(Protocol):
    """What the engine reports; the simulation runner turns these into events."""

    def on_admitted(
        self, worker: str, request: RequestSpec, cached_tokens: int, recompute_tokens: int, first: bool, now: float, host_tokens: int = 0
    ) -> None:
        """``recompute_tokens``: for a re-admission, KV lost to preemption not found in cache;
        ``host_tokens``: of ``cached_tokens``, those loaded from the host tier."""

    def on_preempted(self, worker: str, request: RequestSpec, lost_tokens: int, now: float) -> None: ...

    def on_kv(self, worker: str, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None: ...

    def on_host_kv(self, worker: str, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        """Host tier blocks stored (their store completed) and removed (evicted)."""

    def on_first_token(self, worker: str, request: RequestSpec, now: float) -> None: ...

    def on_finished(self, worker: str, request: RequestSpec, cached_tokens: int, now: float) -> None: ...

    def on_dropped(self, worker: str, request: RequestSpec, reason: str, now: float) -> None: ...


class BlockCounts(Protocol):
    """What a worker sample reads of an engine's KV cache."""

    @property
    def active(self) -> int: ...

    @property
    def cached_blocks(self) -> int: ...


class StepEngine(Protocol):
    """One engine replica as the simulation drives it, a step at a time: tasim's `Engine`, or
    vLLM's own scheduler behind the same calls (`tasim.validation.vllm_oracle`)."""

    worker: str
    iterations: int

    # read-only here, so an engine may hold its own kinds of KV cache and queues
    @property
    def kv_cache(self) -> BlockCounts: ...

    @property
    def running(self) -> Sized: ...

    @property
    def waiting(self) -> Sized: ...

    @property
    def has_work(self) -> bool: ...

    @property
    def foldable(self) -> FoldableEngine | None:
        """The engine as `tasim.sim.engine.fast_forward` folds its runs of steps; None if it cannot."""

    @property
    def next_transfer_done(self) -> float:
        """When its earliest KV copy in flight is done (inf when none): an idle engine steps then."""

    def host_totals(self) -> tuple[int, float, float]:
        """Over its host tier: tokens stored, and seconds each copy lane (D2H, H2D) was busy."""

    def submit(self, spec: RequestSpec, priority: int = 0) -> None: ...

    def begin_step(self, now: float) -> Step: ...

    def complete_step(self, step: Step, now: float) -> None: ...

    def publish_kv(self, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None: ...

    def clear_prefix_cache(self, now: float) -> None: ...

    def abort_all(self) -> list[tuple[RequestSpec, int]]: ...

    def pin(self, program: str, hashes: tuple[BlockHash, ...]) -> int: ...

    def unpin(self, program: str) -> bool: ...

    def has_pin(self, program: str) -> bool: ...

    def audit(self, every_block: bool = False) -> str | None: ...


EngineFactory = Callable[[str, EngineSetup, PerfModel, EngineListener], StepEngine]


class EngineRequest(RequestBlocks):
    """Engine-side state of one request (its blocks: see `RequestBlocks`)."""

    __slots__ = (
        "spec",
        "prompt",
        "target",
        "generated",
        "cached_tokens",
        "admissions",
        "lost",
        "priority",
        "arrival",
        "host_tokens",
    )

    def __init__(self, spec: RequestSpec, priority: int = 0, arrival: int = 0) -> None:
        super().__init__(spec.id, spec.block_hashes)
        self.spec = spec
        self.priority = priority  # priority scheduling: lower goes first
        self.arrival = arrival  # the engine's submission count: vLLM's arrival order
        self.prompt = spec.prompt_tokens
        self.target = spec.output_tokens
        self.generated = 0
        self.cached_tokens = 0  # prefix-cache hit at first admission
        self.admissions = 0
        self.lost = 0  # tokens of computed KV freed by the last preemption
        self.host_tokens = 0  # of the tokens computed at its admission, those loaded from the host tier

    @property
    def length(self) -> int:
        """Known tokens: prompt plus generated (the newest generated token is not yet computed)."""
        return self.prompt + self.generated


def _priority_order(req: EngineRequest) -> tuple[int, int]:
    return req.priority, req.arrival


class Step:
    """One scheduled engine iteration (a plain class: see `StepShape` for why)."""

    __slots__ = ("start", "duration", "scheduled", "shape", "preempted", "stored", "removed", "host_removed")

    def __init__(self, start: float, duration: float) -> None:
        self.start = start
        self.duration = duration
        self.scheduled: list[tuple[EngineRequest, int]] = []
        self.shape = StepShape()
        self.preempted = False  # a preemption blocked admission; the next step can admit
        # KV blocks stored and evicted by this step's scheduling, published when the step completes
        self.stored: list[BlockHash] = []
        self.removed: list[BlockHash] = []
        # host blocks evicted by the step's store preparations, published at its end too (only
        # under the ``dynamo_mocker`` host tier: `Engine._offer_stores`)
        self.host_removed: list[BlockHash] = []

    @property
    def end(self) -> float:
        return self.start + self.duration


class RunPlan:
    """The run of steps that a step starts, as a `FoldableEngine` plans it: ``steps`` in all,
    the first one ``first`` (scheduled as usual), each later one repeating its shape; when each
    step ends; the later steps that touch the KV cache (`BlockBoundary`), in order; the run's
    prefilling request with its chunk per step, if it folds one besides the decodes; and the
    later steps at whose start host stores in flight complete (`FoldableEngine.complete_copies`),
    in order."""

    __slots__ = ("first", "steps", "ends", "boundaries", "prefill", "copy_steps")

    def __init__(
        self,
        first: Step,
        steps: int,
        ends: list[float],
        boundaries: list[BlockBoundary],
        prefill: tuple[EngineRequest, int] | None,
        copy_steps: list[int] | None = None,
    ) -> None:
        self.first = first
        self.steps = steps
        self.ends = ends  # step k + 1 (1-based) starts at ends[k]
        self.boundaries = boundaries
        self.prefill = prefill
        self.copy_steps: list[int] = [] if copy_steps is None else copy_steps


class FoldableEngine(ABC):
    """An engine whose runs of identical steps `tasim.sim.engine.fast_forward` folds: it plans a
    run, reserves the slots of each of its boundaries as the simulation catches up with them, and
    completes the run's steps at once."""

    @abstractmethod
    def plan_run(self, first: Step, max_steps: int) -> RunPlan | None:
        """The run of up to ``max_steps`` steps that the scheduled step ``first`` starts, or None
        when no later step can be folded into it."""

    @abstractmethod
    def apply_boundary(self, boundary: BlockBoundary) -> tuple[list[BlockHash], list[BlockHash]]:
        """Reserve the slots of a boundary of the run being folded, when its step starts; returns
        the KV events (stored, removed) to publish when the step ends."""

    @abstractmethod
    def complete_run(self, plan: RunPlan, steps: int, now: float) -> None:
        """The run's first ``steps`` steps (fewer than planned if it was cut) have run, their
        boundaries applied: advance the requests through them and apply the last one's outcome."""

    def complete_copies(self, now: float) -> tuple[list[BlockHash], list[BlockHash]]:
        """A folded step that starts at ``now`` is one of the run's ``copy_steps``: complete the
        host stores copied by then, as its `Engine.begin_step` would; returns the host tier's KV
        events to publish (`publish_host_kv`) at ``now``, after the step ends at that instant."""
        raise NotImplementedError("this engine plans no host copies into its runs")

    def publish_host_kv(self, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        """Report blocks stored to and evicted from the host tier."""
        raise NotImplementedError("this engine has no host tier")


class Engine(FoldableEngine):
    def __init__(self, worker: str, config: EngineSetup, perf: PerfModel, listener: EngineListener) -> None:
        self.worker = worker
        self.config = config
        self.perf = perf
        self.listener = listener
        self.kv_cache = KVCacheManager(config.num_blocks, config.block_size, config.enable_prefix_caching, config.eviction, config.cache_duplicates)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.iterations = 0
        self._lifo = config.preemption == "newest_first"
        self._by_priority = config.scheduling_policy == "priority"
        self._arrivals = 0
        # Host tier only (see `_host_step`): requests whose host hit is being loaded (they hold
        # their blocks), those loaded and due back at the front of the waiting scan, and those
        # finished since the last step, whose blocks are offered for storing once more.
        self._tiered = config.host_tier is not None
        self.parked: list[EngineRequest] = []
        self.loaded: deque[EngineRequest] = deque()
        self._finished_since: list[EngineRequest] = []
        # SGLang HiCache's tier instead (see `_admit_waiting`, `_sglang_insert`): nothing parked or
        # offered; a step that loads host blocks lasts at least until they are copied.
        self._sglang = config.host_tier is not None and config.host_tier.semantics == "sglang"
        self._load_done = 0.0
        self._flush_until = 0.0  # when the stores the next step that runs waits for are copied
        # the cached blocks requests admitted in this step took: a prefix of each one's chain
        self._hit_prefixes: list[tuple[Sequence[BlockHash], int]] = []
        # Dynamo mocker's host tier (`tasim.sim.engine.mocker_host_tier`): loads start at admission,
        # the step waits only for the stores of blocks it computes into (those a load reuses delay
        # that load) and of a request it preempts; the blocks evicted for loads this step.
        self._mocker_tier = config.host_tier is not None and config.host_tier.semantics == "dynamo_mocker"
        self._load_evicted: list[BlockHash] = []
        self._preempt_fence = 0.0
        if config.host_tier is not None:
            self.kv_cache.add_host_tier(config.host_tier)

    # --- public API ------------------------------------------------------------------------

    def submit(self, spec: RequestSpec, priority: int = 0) -> None:
        """Queue a request: in (priority, arrival) order under priority scheduling; else at
        the back, or at the front when its program holds a pin here (Continuum's priority for
        returning turns)."""
        if spec.output_tokens < 1:
            raise ValueError(f"request {spec.id}: output_tokens must be >= 1")
        self._arrivals += 1
        req = EngineRequest(spec, priority, self._arrivals)
        if self._by_priority:
            self._queue_in_order(req)
        elif self.kv_cache.has_pin(spec.program):
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def _queue_in_order(self, req: EngineRequest) -> None:
        """Insert by (priority, arrival): vLLM's priority queue pops that minimum."""
        waiting = self.waiting
        at = len(waiting)
        key = _priority_order(req)
        while at and _priority_order(waiting[at - 1]) > key:
            at -= 1
        waiting.insert(at, req)

    def pin(self, program: str, hashes: tuple[BlockHash, ...]) -> int:
        """Reference the resident leading blocks of ``hashes`` so they cannot be evicted;
        returns how many. Replaces an earlier pin of the program."""
        return self.kv_cache.pin(program, hashes)

    def unpin(self, program: str) -> bool:
        """Release the program's pin here; returns whether it had one."""
        return self.kv_cache.unpin(program)

    def has_pin(self, program: str) -> bool:
        return self.kv_cache.has_pin(program)

    def audit(self, every_block: bool = False) -> str | None:
        """The first broken invariant of the engine's state, or None (``tasim simulate --check``;
        ``every_block``: see `BlockPool.audit`)."""
        if len(self.running) > self.config.max_num_seqs:
            return f"{len(self.running)} requests running, max_num_seqs is {self.config.max_num_seqs}"
        for req in self.running:
            if req.computed > req.length:
                return f"request {req.spec.id}: {req.computed} of {req.length} tokens computed"
        holding = self.running + self.parked + list(self.loaded) if self._tiered else self.running
        return self.kv_cache.audit(holding, self.waiting, every_block)

    @property
    def has_work(self) -> bool:
        if self._tiered:
            return bool(self.running or self.waiting or self.parked or self.loaded or self._finished_since)
        return bool(self.running or self.waiting)

    @property
    def next_transfer_done(self) -> float:
        return self.kv_cache.next_transfer_done

    def host_totals(self) -> tuple[int, float, float]:
        return self.kv_cache.host_totals()

    @property
    def foldable(self) -> FoldableEngine:
        return self

    def begin_step(self, now: float) -> Step:
        """Schedule one iteration at ``now``; the caller waits ``step.duration`` then calls
        `end_step`. A step with nothing scheduled has duration 0 and changes nothing."""
        step = Step(start=now, duration=0.0)
        if self._tiered:
            if self._sglang or self.kv_cache.next_transfer_done <= now:
                self._complete_transfers(now)
            if self._hit_prefixes:
                self._hit_prefixes = []
        budget = self.config.max_num_batched_tokens
        budget, decodes = self._schedule_running(step, budget, now)
        if not step.preempted:
            if self.loaded:
                budget = self._resume_loaded(step, budget, now)
            if not self.loaded or self._mocker_tier:  # vLLM's scan reaches the queue only past every loaded request
                self._admit_waiting(step, budget, now)
        if self._tiered and not self._sglang:
            self._offer_stores(step, now)
        step.stored, step.removed = self.kv_cache.take_events()
        if self._sglang:
            self.publish_host_kv(*self.kv_cache.take_host_events(), now)
        fence = self._mocker_fence(step.removed) if self._mocker_tier else 0.0
        if self._tiered and not self._mocker_tier:
            # vLLM's worker waits before the forward for the stores of the requests preempted
            # here, for the store of a block evicted here, and for a finished request's store of a
            # block admitted here as a prefix hit (SGLang's write-back for its writes of blocks
            # evicted here); a step that runs nothing leaves the wait to the next one that does
            until = max(self._flush_until, self.kv_cache.flush_hits(self._hit_prefixes))
            if step.removed:
                until = max(until, self.kv_cache.flush_until(step.removed))
            self._flush_until = until
        if step.scheduled:
            self.iterations += 1
            step.shape = self._shape(step, decodes)
            step.duration = self.perf.step_time(step.shape)
            if self._mocker_tier:
                step.duration += max(0.0, fence - now)
            elif self._tiered:
                step.duration += max(0.0, self._flush_until - now)
                self._flush_until = 0.0
            if self._load_done > now:  # SGLang: the forward waits for its layers' loads
                step.duration = max(step.duration, self._load_done - now)
        else:
            self.publish_kv(step.stored, step.removed, now)
            self.publish_host_kv([], step.host_removed, now)
        if self._tiered:
            self.kv_cache.submit_transfers(step.end)
        return step

    def end_step(self, step: Step, now: float) -> None:
        """`publish_kv` (and the step's host evictions) then `complete_step`: the step has run."""
        self.publish_kv(step.stored, step.removed, now)
        self.publish_host_kv([], step.host_removed, now)
        self.complete_step(step, now)

    def complete_step(self, step: Step, now: float) -> None:
        """Apply the step's outcome: tokens emitted, requests finished. Its KV events are
        published separately (`publish_kv`), at the step's end."""
        finished: list[EngineRequest] = []
        if self._sglang:
            self._sglang_insert(step, now)
        for req, n in step.scheduled:  # once per request and step: `length` written out
            computed = req.computed = req.computed + n
            generated = req.generated
            if computed == req.prompt + generated:
                req.generated = generated = generated + 1
                if generated == 1:
                    self.listener.on_first_token(self.worker, req.spec, now)
                if generated >= req.target:
                    finished.append(req)
        for req in finished:
            self.running.remove(req)
            # Report first: a policy reacting to the turn's end (e.g. pinning its blocks) must
            # see them still referenced, before the next step's allocations can evict them.
            self.listener.on_finished(self.worker, req.spec, req.cached_tokens, now)
            self.kv_cache.free(req)
            if self._tiered and not self._sglang and not self._mocker_tier:
                self._finished_since.append(req)

    def clear_prefix_cache(self, now: float) -> None:
        """Evict every unreferenced cached block, reporting the removals, and empty the host
        tier. vLLM's connector first ends the requests finished since the last step, so their
        recency is applied to the slots it then drops; requests in flight store again from
        their first block (connector/scheduler.py ``reset_cache``)."""
        if self._finished_since:
            for req in self._finished_since:
                self.kv_cache.request_finished(req)
            self._finished_since = []
        self.kv_cache.reset_prefix_cache(now)
        if self._tiered:
            for req in (*self.running, *self.waiting, *self.parked, *self.loaded):
                req.next_store = 0
        self.publish_kv(*self.kv_cache.take_events(), now)
        if self._sglang:
            self.publish_host_kv(*self.kv_cache.take_host_events(), now)

    def abort_all(self) -> list[tuple[RequestSpec, int]]:
        """End every request, running ones first, freeing their blocks (vLLM's
        ``pause_generation`` with abort): each with the output tokens it had generated. Their
        blocks stay cached until a prefix-cache reset."""
        if self._tiered:
            raise NotImplementedError("aborting requests with a host KV tier is not modelled")
        aborted = [(req.spec, req.generated) for req in (*self.running, *self.waiting)]
        for req in self.running:
            self.kv_cache.free(req)
        self.running = []
        self.waiting.clear()
        return aborted

    def publish_kv(self, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        """Report blocks stored and evicted. Blocks are allocated (and evicted) when a step is
        scheduled, but the engine reports them once the step has run, as vLLM and Dynamo's
        mocker do: a router deciding during the step still sees the blocks this step is about
        to overwrite. (Found replaying the Mooncake synthetic trace: Dynamo's router credited a
        prefix that the running step had already evicted.)"""
        if stored or removed:
            self.listener.on_kv(self.worker, stored, removed, now)

    # --- scheduling ------------------------------------------------------------------------

    def _schedule_running(self, step: Step, budget: int, now: float) -> tuple[int, _Decodes]:
        """Schedule the running requests; returns the budget left and the decodes among them,
        summed for the step's shape (the others are listed in the returned `_Decodes`)."""
        running = self.running
        scheduled = step.scheduled
        decodes = _Decodes()
        others = decodes.others
        count = context = 0
        kv_cache = self.kv_cache
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.computed
            generated = req.generated
            pending = n = req.prompt + generated - computed
            if n > budget:
                n = budget
            victim_was_self = False
            while not kv_cache.allocate_slots(req, computed + n):
                victim = self._victim()
                budget += self._preempt(victim, step, now)
                step.preempted = True
                if victim is req:
                    victim_was_self = True
                    break
                if running.index(req) < i:  # an earlier request was removed
                    i -= 1
            if victim_was_self:
                if self._by_priority:  # vLLM schedules no later running request (fcfs: it was the last)
                    break
                continue
            scheduled.append((req, n))
            if pending == 1 and generated:  # its one pending token: a decode (see `decode_shape`)
                count += 1
                context += computed
            else:
                others.append((req, n))
            budget -= n
            i += 1
        decodes.count, decodes.context = count, context
        return budget, decodes

    def _admit_waiting(self, step: Step, budget: int, now: float) -> None:
        cfg = self.config
        kv_cache = self.kv_cache
        bs = cfg.block_size
        waiting = self.waiting
        at = 0  # the first request not deferred by the host tier (always 0 without one)
        while at < len(waiting) and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = waiting[at]
            length = req.length
            total_blocks = blocks_for(length, bs)
            if total_blocks > cfg.num_blocks:
                del waiting[at]
                self.listener.on_dropped(self.worker, req.spec, f"needs {total_blocks} KV blocks, pool has {cfg.num_blocks}", now)
                continue
            computed = kv_cache.get_computed_blocks(req, length)
            if self._mocker_tier and not req.host_jobs:
                kv_cache.touch_host_prompt(req, req.prompt // bs)  # the mocker's lookup touches the prompt
            if computed.host_deferred or req.host_jobs:
                at += 1  # its host blocks are in flight: vLLM skips it this step
                continue
            if not kv_cache.fits(length, computed):
                break
            if computed.host_blocks and not self._sglang:
                # vLLM keeps the reservation free of the blocks the hit loads into, not of the
                # whole request (whose fit was checked above without it); Dynamo's mocker of the
                # whole request
                reserved_for = length
                if not self._mocker_tier:
                    gpu_tokens = computed.gpu_blocks * bs
                    hit, _ = host_hit(gpu_tokens, computed.host_blocks, length, bs)
                    reserved_for = gpu_tokens + hit
                if not kv_cache.fits(reserved_for, computed, self._prefill_reserve(step)):
                    break
                del waiting[at]
                self._park(req, computed, length, now)
                continue
            cached = computed.blocks * bs
            chunk = min(length - cached, budget)
            if not cfg.enable_chunked_prefill and chunk < length - cached:
                if length - cached > cfg.max_num_batched_tokens:
                    del waiting[at]  # no step can ever take it (vLLM rejects it too)
                    self.listener.on_dropped(
                        self.worker,
                        req.spec,
                        f"{length - cached} prompt tokens exceed max_num_batched_tokens without chunked prefill",
                        now,
                    )
                    continue
                break
            del waiting[at]
            # the request now holds what its program's pin kept; cannot fail after `fits`
            if not kv_cache.allocate_slots(req, cached + chunk, computed, release_pin=req.spec.program):
                raise AssertionError(f"{self.worker}: admission of {req.spec.id} failed after capacity check")
            if computed.host_blocks:  # SGLang: loaded into the blocks just taken
                self._load_done = max(self._load_done, kv_cache.load_back(req, computed, now))
                req.host_tokens = computed.host_blocks * bs
            req.computed = cached
            if self._tiered:
                self._hit_prefixes.append((req.block_hashes, computed.gpu_blocks))
            self._admitted(req, step, chunk, now)
            budget -= chunk

    def _admitted(self, req: EngineRequest, step: Step, chunk: int, now: float) -> None:
        """The request runs from this step on, its first ``chunk`` tokens scheduled."""
        cached = req.computed
        req.admissions += 1
        first = req.admissions == 1
        if first:
            req.cached_tokens = cached
        self.running.append(req)
        step.scheduled.append((req, chunk))
        recompute = 0 if first else max(0, req.lost - cached)
        if req.host_tokens:
            self.listener.on_admitted(self.worker, req.spec, cached, recompute, first, now, req.host_tokens)
            req.host_tokens = 0
        else:
            self.listener.on_admitted(self.worker, req.spec, cached, recompute, first, now)

    # --- the host tier ---------------------------------------------------------------------

    def _park(self, req: EngineRequest, computed: ComputedBlocks, length: int, now: float) -> None:
        """Admit a request with a host hit as vLLM does: blocks for its GPU prefix and the whole
        hit (cached once loaded), the hit pinned on the host for one load, and the request parked
        (holding its blocks; neither running nor preemptible) until the load is done. Dynamo's
        mocker starts the load now, once the stores of the blocks it reuses are copied, and
        recomputes the last block of a prompt loaded whole."""
        kv_cache = self.kv_cache
        bs = self.config.block_size
        gpu_tokens = computed.gpu_blocks * bs
        mark = kv_cache.removed_mark()
        if self._mocker_tier:
            hit, computed_tokens = mocker_host_hit(gpu_tokens, computed.host_blocks, length, bs)
        else:
            hit, computed_tokens = host_hit(gpu_tokens, computed.host_blocks, length, bs)
        if not kv_cache.allocate_slots(req, gpu_tokens + hit, computed, release_pin=req.spec.program, delay_caching=True):
            raise AssertionError(f"{self.worker}: a host load for {req.spec.id} found no blocks after the capacity check")
        if self._mocker_tier:
            evicted = kv_cache.block_pool.removed[mark:]
            self._load_evicted += evicted
            kv_cache.start_load(req, computed, max(now, kv_cache.flush_until(evicted)))
            req.next_store = computed_tokens // bs  # the mocker stores from what the request reuses
        else:
            kv_cache.start_load(req, computed)
            self._hit_prefixes.append((req.block_hashes, computed.gpu_blocks))
        req.computed = computed_tokens
        req.host_tokens = computed_tokens - gpu_tokens
        self.parked.append(req)

    def _prefill_reserve(self, step: Step) -> int:
        """Blocks that the requests still prefilling after this step (loading, loaded, or
        scheduled short of their last token) need beyond what they hold: vLLM admits a host hit
        only if the blocks it loads into fit without them (``_inflight_prefill_reserved_blocks``),
        so that requests holding blocks without progress cannot starve each other."""
        bs = self.config.block_size
        reserve = 0
        for req in self.parked:
            reserve += blocks_for(req.length, bs) - req.phys
        for req in self.loaded:
            reserve += blocks_for(req.length, bs) - req.phys
        for req, n in step.scheduled:
            if req.computed + n < req.length:
                reserve += blocks_for(req.length, bs) - req.phys
        return reserve

    def _complete_transfers(self, now: float) -> None:
        """At the first step that starts once a copy is done: complete it; a loaded request goes
        back to the front of the scan (vLLM scans its parked requests first)."""
        for req in self.kv_cache.complete_transfers(now):
            assert isinstance(req, EngineRequest)
            self.parked.remove(req)
            if self._by_priority:  # vLLM's queue of requests holding blocks is ordered as its waiting queue
                at = len(self.loaded)
                while at and _priority_order(self.loaded[at - 1]) > _priority_order(req):
                    at -= 1
                self.loaded.insert(at, req)
            else:
                self.loaded.append(req)

    def _resume_loaded(self, step: Step, budget: int, now: float) -> int:
        """Schedule the loaded requests, in the order their loads completed (under priority
        scheduling in priority order), as admissions: their loaded blocks are cached as their first
        tokens' slots are taken. One that cannot run stops the step's admissions, as vLLM's scan of
        its queues breaks there."""
        cfg = self.config
        loaded = self.loaded
        while loaded and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = loaded[0]
            pending = req.length - req.computed
            chunk = min(pending, budget)
            if not cfg.enable_chunked_prefill and chunk < pending:
                break
            if not self._mocker_tier and blocks_for(req.length, cfg.block_size) - req.phys > self.kv_cache.available:
                break  # vLLM's full_sequence_must_fit: the whole request must fit before it runs
            held = req.full_done  # its GPU prefix: the loaded blocks are cached by this allocation
            if not self.kv_cache.allocate_slots(req, req.computed + chunk):
                break
            loaded.popleft()
            self._hit_prefixes.append((req.block_hashes, held))
            self._admitted(req, step, chunk, now)
            budget -= chunk
        return budget

    def _sglang_insert(self, step: Step, now: float) -> None:
        """SGLang inserts a request's KV into its tree when its prefill completes unfinished and
        when it finishes (its committed tokens: all but the last generated); each insert counts
        hits and may write blocks to the host (`tasim.sim.engine.hicache`). Called before the
        step's outcome is applied: a decode (one token after the first) inserts nothing."""
        bs = self.config.block_size
        for req, n in step.scheduled:
            generated = req.generated
            computed = req.computed + n
            if computed != req.prompt + generated:
                continue  # a prefill chunk
            # it finishes (the step's new token has no KV), or its prefill completes
            if generated + 1 >= req.target or n > 1 or not generated:
                self.kv_cache.insert(req, computed // bs, now)

    def publish_host_kv(self, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        if stored or removed:
            self.listener.on_host_kv(self.worker, stored, removed, now)

    def complete_copies(self, now: float) -> tuple[list[BlockHash], list[BlockHash]]:
        self._complete_transfers(now)
        assert not self.loaded, "a folded step completed a host load"  # `_host_cut` ends runs before loads complete
        return self.kv_cache.take_host_events()

    def _offer_stores(self, step: Step, now: float) -> None:
        """vLLM's store jobs of a step: every scheduled request offers its full prompt blocks
        computed by the step's end, every request finished since the last step its whole prompt
        (then the host re-ranks what it observed). Host KV events are published at once.
        Dynamo's mocker touches a request's prompt when it stores, and nothing at its finish; and
        its replay hands the router the host blocks a step's store preparations evict with the
        step's other KV events, at the step's end (AISimulate engine/host_offload/tier.rs
        ``reserve_store`` evicts them as a store cohort is prepared, during the pass;
        engine/scheduler/vllm/host_offload.rs publishes them there as ``HostPinned``
        ``Removed``, into the pass's events), while the stores completed at the boundary the step
        starts from are published then, as now (``complete_engine_boundary``)."""
        kv_cache = self.kv_cache
        bs = self.config.block_size
        mocker = self._mocker_tier
        if mocker:
            self.publish_host_kv(*kv_cache.take_host_events(), now)  # the stores completed as the step starts
        for req, n in step.scheduled:
            if req.next_store >= req.prompt // bs:
                continue  # its whole prompt offered: the usual decode
            done = req.computed + n
            if kv_cache.offer_stores(req, (done if done < req.prompt else req.prompt) // bs) and mocker:
                kv_cache.touch_host_prompt(req, req.prompt // bs)
        if self._finished_since:
            for req in self._finished_since:
                kv_cache.offer_stores(req, req.prompt // bs)
                kv_cache.request_finished(req)
            self._finished_since = []
        stored, removed = kv_cache.take_host_events()
        if mocker:
            step.host_removed = removed
            removed = []
        self.publish_host_kv(stored, removed, now)

    def _mocker_fence(self, removed: list[BlockHash]) -> float:
        """When Dynamo's mocker lets the step compute (AISimulate engine/scheduler/vllm/core.rs,
        ``compute_not_before_ms``): once the stores of the blocks it evicted to compute into,
        and of the requests it preempted, are copied; the blocks evicted for loads delay only
        those loads. Clears the step's record of both."""
        fence = self._preempt_fence
        load_evicted = self._load_evicted
        if load_evicted:
            skip = set(load_evicted)
            removed = [key for key in removed if key not in skip]
            self._load_evicted = []
        if removed:
            fence = max(fence, self.kv_cache.flush_until(removed))
        self._preempt_fence = 0.0
        return fence

    def _victim(self) -> EngineRequest:
        running = self.running
        if self._by_priority:
            return max(running, key=_priority_order)
        return running[-1] if self._lifo else running[0]

    def _preempt(self, victim: EngineRequest, step: Step, now: float) -> int:
        """Recompute preemption; returns the budget refunded if the victim was already scheduled.

        A victim scheduled earlier in this step keeps the cache entries its chunk registered
        although that KV is never computed; Dynamo's mocker registers at scheduling time too and
        behaves the same way."""
        refund = 0
        for k, (req, n) in enumerate(step.scheduled):
            if req is victim:
                refund = n
                del step.scheduled[k]
                break
        lost = victim.lost = victim.computed
        if self._mocker_tier:
            self._preempt_fence = max(self._preempt_fence, self.kv_cache.store_done(victim))
        elif self._tiered:
            self._flush_until = max(self._flush_until, self.kv_cache.flush_request(victim))
        self.running.remove(victim)
        self.kv_cache.free(victim)
        victim.computed = 0
        if self._by_priority:
            self._queue_in_order(victim)
        else:
            self.waiting.appendleft(victim)
        self.listener.on_preempted(self.worker, victim.spec, lost, now)
        return refund

    def _shape(self, step: Step, decodes: _Decodes) -> StepShape:
        """`step_shape` of the step, with the running decodes summed as they were scheduled
        (a third of the batch walks of a step with ~60 decodes; exact: every term of
        ``attn_pairs`` is a multiple of 1/2 far below 2**53, so the sum is the same in any
        order). A preemption may have unscheduled a decode already summed: walk it all then."""
        capacity = self.config.num_blocks * self.config.block_size
        if step.preempted or not decodes.count:
            return step_shape(step.scheduled, capacity)
        admitted = step.scheduled[decodes.count + len(decodes.others) :]
        return summed(decode_shape(decodes.count, decodes.context, capacity), step_shape(decodes.others + admitted, capacity))

    # --- folded runs of steps (`FoldableEngine`) -------------------------------------------

    def plan_run(self, first: Step, max_steps: int) -> RunPlan | None:
        """The steps after ``first`` that repeat its shape (see `tasim.sim.engine.fast_forward`).
        Two shapes repeat:

        * pure decode: every running request computes its one pending token;
        * decode plus one chunked prefill: the newest running request is partway through a
          prompt longer than the budget, and takes all the tokens the decodes before it leave.
          Nothing can be admitted while it does (the budget is spent), and each step its chunk
          is the same; the run stops before the chunk that would complete its prompt.

        The run ends with the step at whose end a request finishes, and earlier where the KV
        cache says so (`KVCacheManager.plan_boundaries`). With a host tier (`_host_cut`) only pure
        decode runs fold, and none past a copy's completion."""
        scheduled = first.scheduled
        count = len(self.running)
        if first.preempted or not scheduled or len(scheduled) != count or self.loaded:
            return None
        decoders = scheduled
        budget = self.config.max_num_batched_tokens
        last = max_steps
        prefill = None
        newest, chunk = scheduled[-1]
        if chunk > 1 and chunk == budget - (count - 1):
            if self._tiered and not self._sglang:
                return None  # each chunk's prompt blocks are stored: every step differs
            # Steps 2..k still take a full chunk while more than one chunk is left before them.
            last = min(last, (newest.length - newest.computed - 1) // chunk)
            prefill = (newest, chunk)
            decoders = scheduled[:-1]
        elif chunk != 1 or newest.length - newest.computed != 1:
            return None  # the newest request is prefilling: checked first, as it is the usual misfit
        context = 0  # tokens the decoders have computed before the first step
        for req, n in decoders:
            generated = req.generated
            computed = req.computed
            if n != 1 or not generated or req.prompt + generated - computed != 1:
                return None
            if self._tiered and not self._sglang and req.next_store < req.prompt // self.config.block_size:
                return None  # its prompt's store did not fit the host: offered again every step
            context += computed
            # At the end of step k (1-based), a request that had generated g tokens has g + k.
            if req.target - generated < last:
                last = req.target - generated
        head_blocks: Sequence[BlockHash] = ()
        if prefill is None:
            blocked, head_blocks = self._waiting_stays_blocked(budget - count)
            if not blocked:
                return None
        if last < 2:
            return None
        planned = self.kv_cache.plan_boundaries(decoders, prefill, last, head_blocks)
        if planned is None:
            return None
        last, boundaries = planned
        capacity = self.config.num_blocks * self.config.block_size
        if prefill is None:
            ends = [first.end, *self.perf.decode_step_ends(first.end, count, context + count, last - 1, capacity)]
        else:
            ends = self._mixed_step_ends(first.end, last, len(decoders), context, prefill, capacity)
        copy_steps: list[int] = []
        if self._tiered:
            last, copy_steps = self._host_cut(last, ends, boundaries)
            if last < 2:
                return None
            del ends[last:]
            boundaries = [b for b in boundaries if b.index <= last]
        return RunPlan(first, last, ends, boundaries, prefill, copy_steps)

    def _host_cut(self, last: int, ends: list[float], boundaries: list[BlockBoundary]) -> tuple[int, list[int]]:
        """The last step of a planned run that the host tier lets fold, and the steps in it that
        complete host stores (`FoldableEngine.complete_copies`). The step that starts first at or
        after a copy's completion completes it. With vLLM's tier and nobody waiting a store may
        complete inside the run: it changes nothing a decode step reads (a waiting request's
        lookup could find the blocks it readies). Otherwise no step may start at or after a
        copy's completion. While stores are in flight no step may take a block (evicting a
        block being stored waits for its store)."""
        copy_steps: list[int] = []
        done = self.kv_cache.next_transfer_done
        if done < float("inf"):
            if self._sglang or self._mocker_tier or self.waiting or self.parked:
                last = min(last, 1 + bisect.bisect_left(ends, done))  # step k starts at ends[k - 2]
            else:
                load_done, store_dones = self.kv_cache.transfers_done()
                if load_done < float("inf"):
                    last = min(last, 1 + bisect.bisect_left(ends, load_done))
                for store_done in store_dones:  # one FIFO lane: in order
                    step = 2 + bisect.bisect_left(ends, store_done)
                    if step > last:
                        break
                    if not copy_steps or copy_steps[-1] != step:
                        copy_steps.append(step)
        if self.kv_cache.stores_in_flight and boundaries:
            last = min(last, boundaries[0].index - 1)
            while copy_steps and copy_steps[-1] > last:
                copy_steps.pop()
        return last, copy_steps

    def apply_boundary(self, boundary: BlockBoundary) -> tuple[list[BlockHash], list[BlockHash]]:
        kv_cache = self.kv_cache
        for req, upto in boundary.reserves:
            if not kv_cache.allocate_slots(req, upto):  # planned within the available blocks
                raise AssertionError(f"{self.worker}: a fast-forwarded step found no blocks for {req.request_id}")
        return kv_cache.take_events()

    def complete_run(self, plan: RunPlan, steps: int, now: float) -> None:
        folded = steps - 1
        self.iterations += folded
        decoders = plan.first.scheduled
        if plan.prefill is not None:
            prefilling, chunk = plan.prefill
            prefilling.computed += folded * chunk
            decoders = decoders[:-1]
        for req, _ in decoders:
            req.computed += folded
            req.generated += folded
        # A folded run's last step scheduled the same one token per request as its first.
        self.complete_step(plan.first, now)

    def _waiting_stays_blocked(self, budget: int) -> tuple[bool, Sequence[BlockHash]]:
        """Whether decode steps that leave ``budget`` tokens and free no block can admit nobody
        from the queue; and the head's leading blocks whose registration would change that (a
        block that turns active costs the head no capacity), a prefix of its chain. False when
        unsure."""
        cfg = self.config
        if not self.waiting or len(self.running) >= cfg.max_num_seqs or budget <= 0:
            return True, ()
        if not cfg.enable_chunked_prefill:
            return False, ()  # the head's fate there also depends on its cached prefix
        head = self.waiting[0]
        length = head.length
        if blocks_for(length, cfg.block_size) > cfg.num_blocks:
            return False, ()  # due to be dropped
        # Decode steps only take blocks, so a head that does not fit now fits no better later.
        kv_cache = self.kv_cache
        computed = kv_cache.get_computed_blocks(head, length)
        if computed.host_deferred or head.host_jobs:
            return False, ()  # skipped for its host copies: a request behind it may be admitted
        if not kv_cache.fits(length, computed):
            return True, head.block_hashes[: kv_cache.cacheable_blocks(length)]
        return False, ()

    def _mixed_step_ends(
        self, first_end: float, last: int, decoders: int, context: int, prefill: tuple[EngineRequest, int], capacity: int
    ) -> list[float]:
        """End times of steps 1..``last`` of a decode-plus-prefill run. Step k's shape is that of
        its decodes (their computed tokens ``context`` plus ``(k - 1) * decoders``) plus that of
        its chunk, ``(k - 1) * chunk`` further into the prompt: `step_shape` sums the same terms,
        and every term of ``attn_pairs`` is a multiple of 1/2 far below 2**53, so the sum is
        exact in either order."""
        req, chunk = prefill
        step_time = self.perf.step_time
        at = _ChunkStart(req)
        ends = [first_end]
        end = first_end
        for k in range(1, last):
            at.computed = req.computed + k * chunk
            shape = summed(decode_shape(decoders, context + k * decoders, capacity), step_shape([(at, chunk)], capacity))
            end = end + step_time(shape)
            ends.append(end)
        return ends


class _Decodes:
    """The decodes among a step's running requests, as `decode_shape` takes them, and the
    scheduled running requests that are not decodes."""

    __slots__ = ("count", "context", "others")

    def __init__(self) -> None:
        self.count = 0
        self.context = 0  # their computed tokens before the step
        self.others: list[tuple[EngineRequest, int]] = []


class _ChunkStart:
    """A prefilling request as `step_shape` reads it, at the start of a later step's chunk."""

    __slots__ = ("computed", "prompt", "generated")

    def __init__(self, req: EngineRequest) -> None:
        self.computed = req.computed
        self.prompt = req.prompt
        self.generated = req.generated


class ScheduledWork(Protocol):
    """What a step's shape reads of a scheduled request, before the step runs."""

    computed: int  # tokens whose KV is computed (or cached)
    prompt: int
    generated: int


def step_shape(scheduled: Sequence[tuple[ScheduledWork, int]], kv_capacity_tokens: int) -> StepShape:
    """The work of one step that computes ``n`` more tokens of each scheduled request."""
    # Sums kept in locals: this runs once per engine iteration over the whole batch.
    scheduled_tokens = kv_read = prefill_seqs = prefill_prompt = prefill_prefix = decode_seqs = decode_kv = 0
    attn_pairs = 0.0
    for req, n in scheduled:
        c = req.computed
        prompt = req.prompt
        generated = req.generated
        end = c + n
        scheduled_tokens += n
        attn_pairs += n * (c + n / 2)
        kv_read += c
        if c < prompt and n > 0:  # a prompt chunk: min(end, prompt) - c tokens of it
            prefill_seqs += 1
            prefill_prompt += (end if end < prompt else prompt) - c
            prefill_prefix += c
        if end == prompt + generated:
            decode_seqs += 1
        if generated:  # decoding, or recomputing after preemption: the mocker counts both
            decode_kv += prompt + generated
    return StepShape(
        scheduled_tokens,
        attn_pairs,
        kv_read,
        prefill_seqs,
        prefill_prompt,
        prefill_prefix,
        decode_seqs,
        decode_kv,
        kv_capacity_tokens,
    )
