"""One engine replica with vLLM-v1 scheduling semantics (as Dynamo's mocker models them).

The engine is a plain state machine, independent of the clock: `begin_step` schedules one
iteration at time ``now`` and returns it with its duration from the perf model; `end_step`
applies its outcome at the step's end. Per step:

1. A token budget of ``max_num_batched_tokens``. Running requests, in admission order, each get
   ``min(known tokens - computed, budget)``: 1 for a decode, the next chunk for a prefill. If the
   KV blocks for those tokens cannot be had, the newest (or oldest) running request is preempted
   (recompute: its blocks are released, it goes back to the front of the waiting queue) until
   they can; the request may preempt itself. Under priority scheduling the victim is the
   running request with the highest (priority, arrival), as vLLM's ``--scheduling-policy
   priority`` picks it, and the queue is kept in (priority, arrival) order, so a preempted
   request goes back to its place there rather than to the front.
2. If nothing was preempted, waiting requests are admitted in queue order while fewer than
   ``max_num_seqs`` run and budget remains: the longest cached prefix of full blocks is reused
   (at least one token is always computed); the whole sequence must fit in the blocks that are
   free or evictable, else admission stops (head-of-line); blocks are taken only for the
   scheduled chunk. Without chunked prefill the rest of the prompt must fit the budget.
3. Blocks that this step completes are cached under their hash at scheduling time (KV stored
   events); evictions happen while allocating (KV removed events).
4. At the end of the step every request whose known tokens are all computed emits one token:
   the first one when its prefill completes, then one per decode step. A request that has
   emitted its last token finishes and releases its blocks (they stay cached until evicted).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from typing import Literal, Protocol

from tasim.core.model import BlockHash, RequestSpec, blocks_for
from tasim.sim.engine.block_pool import BlockPool, Claim, Eviction
from tasim.sim.perf.base import PerfModel, StepShape, decode_shape, summed


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


class EngineListener(Protocol):
    """What the engine reports; the simulation runner turns these into events."""

    def on_admitted(self, worker: str, request: RequestSpec, cached_tokens: int, recompute_tokens: int, first: bool, now: float) -> None:
        """``recompute_tokens``: for a re-admission, KV lost to preemption not found in cache."""

    def on_preempted(self, worker: str, request: RequestSpec, lost_tokens: int, now: float) -> None: ...

    def on_kv(self, worker: str, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None: ...

    def on_first_token(self, worker: str, request: RequestSpec, now: float) -> None: ...

    def on_finished(self, worker: str, request: RequestSpec, cached_tokens: int, now: float) -> None: ...

    def on_dropped(self, worker: str, request: RequestSpec, reason: str, now: float) -> None: ...


class BlockCounts(Protocol):
    """What a worker sample reads of a KV pool."""

    @property
    def active(self) -> int: ...

    @property
    def cached_blocks(self) -> int: ...


class StepEngine(Protocol):
    """One engine replica as the simulation drives it, a step at a time: tasim's `Engine`, or
    vLLM's own scheduler behind the same calls (`tasim.validation.vllm_oracle`)."""

    worker: str
    iterations: int

    # read-only here, so an engine may hold its own kinds of pool and queues
    @property
    def pool(self) -> BlockCounts: ...

    @property
    def running(self) -> Sized: ...

    @property
    def waiting(self) -> Sized: ...

    @property
    def has_work(self) -> bool: ...

    def submit(self, spec: RequestSpec, priority: int = 0) -> None: ...

    def begin_step(self, now: float) -> Step: ...

    def complete_step(self, step: Step, now: float) -> None: ...

    def publish_kv(self, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None: ...

    def clear_prefix_cache(self, now: float) -> None: ...

    def pin(self, program: str, hashes: tuple[BlockHash, ...]) -> int: ...

    def unpin(self, program: str) -> bool: ...

    def has_pin(self, program: str) -> bool: ...

    def audit(self, every_block: bool = False) -> str | None: ...


EngineFactory = Callable[[str, EngineSetup, PerfModel, EngineListener], StepEngine]


class EngineRequest:
    """Engine-side state of one request."""

    __slots__ = (
        "spec",
        "prompt",
        "target",
        "generated",
        "computed",
        "claim",
        "phys",
        "full_done",
        "cached_tokens",
        "admissions",
        "lost",
        "priority",
        "arrival",
    )

    def __init__(self, spec: RequestSpec, priority: int = 0, arrival: int = 0) -> None:
        self.spec = spec
        self.priority = priority  # priority scheduling: lower goes first
        self.arrival = arrival  # the engine's submission count: vLLM's arrival order
        self.prompt = spec.prompt_tokens
        self.target = spec.output_tokens
        self.generated = 0
        self.computed = 0
        self.claim = Claim(spec.block_hashes)  # the cached blocks it references
        self.phys = 0  # physical blocks this request occupies (held + private copies + tail)
        self.full_done = 0  # leading full blocks accounted for (held or private duplicate)
        self.cached_tokens = 0  # prefix-cache hit at first admission
        self.admissions = 0
        self.lost = 0  # tokens of computed KV freed by the last preemption

    @property
    def length(self) -> int:
        """Known tokens: prompt plus generated (the newest generated token is not yet computed)."""
        return self.prompt + self.generated


def _priority_order(req: EngineRequest) -> tuple[int, int]:
    return req.priority, req.arrival


class Step:
    """One scheduled engine iteration (a plain class: see `StepShape` for why)."""

    __slots__ = ("start", "duration", "scheduled", "shape", "preempted", "stored", "removed")

    def __init__(self, start: float, duration: float) -> None:
        self.start = start
        self.duration = duration
        self.scheduled: list[tuple[EngineRequest, int]] = []
        self.shape = StepShape()
        self.preempted = False  # a preemption blocked admission; the next step can admit
        # KV blocks stored and evicted by this step's scheduling, published when the step completes
        self.stored: list[BlockHash] = []
        self.removed: list[BlockHash] = []

    @property
    def end(self) -> float:
        return self.start + self.duration


class Engine:
    def __init__(self, worker: str, config: EngineSetup, perf: PerfModel, listener: EngineListener) -> None:
        self.worker = worker
        self.config = config
        self.perf = perf
        self.listener = listener
        self.pool = BlockPool(config.num_blocks, config.eviction, config.cache_duplicates)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.iterations = 0
        self._lifo = config.preemption == "newest_first"
        self._by_priority = config.scheduling_policy == "priority"
        self._arrivals = 0
        self._pins: dict[str, Claim] = {}  # program -> blocks kept referenced

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
        elif spec.program in self._pins:
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
        self.unpin(program)
        hits, _ = self.pool.prefix_hits(hashes, len(hashes))
        self._pins[program] = self.pool.acquire(hashes, hits)
        return hits

    def unpin(self, program: str) -> bool:
        """Release the program's pin here; returns whether it had one."""
        claim = self._pins.pop(program, None)
        if claim is None:
            return False
        self.pool.release(claim)
        return True

    def has_pin(self, program: str) -> bool:
        return program in self._pins

    @property
    def pinned_blocks(self) -> int:
        return sum(claim.blocks for claim in self._pins.values())

    def audit(self, every_block: bool = False) -> str | None:
        """The first broken invariant of the engine's state, or None (``tasim simulate --check``;
        ``every_block``: see `BlockPool.audit`)."""
        if len(self.running) > self.config.max_num_seqs:
            return f"{len(self.running)} requests running, max_num_seqs is {self.config.max_num_seqs}"
        for req in self.waiting:
            if req.phys or req.claim.blocks:
                return f"queued request {req.spec.id} occupies {req.phys} blocks"
        private = 0
        for req in self.running:
            if req.phys < req.claim.blocks or req.computed > req.length:
                return f"request {req.spec.id}: {req.phys} blocks for {req.claim.blocks} held, {req.computed} of {req.length} tokens computed"
            private += req.phys - req.claim.blocks
        claims = [req.claim for req in self.running] + list(self._pins.values())
        return self.pool.audit(claims, private, every_block)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def begin_step(self, now: float) -> Step:
        """Schedule one iteration at ``now``; the caller waits ``step.duration`` then calls
        `end_step`. A step with nothing scheduled has duration 0 and changes nothing."""
        step = Step(start=now, duration=0.0)
        budget = self.config.max_num_batched_tokens
        budget, decodes = self._schedule_running(step, budget, now)
        if not step.preempted:
            self._admit_waiting(step, budget, now)
        step.stored, step.removed = self.pool.drain_events()
        if step.scheduled:
            self.iterations += 1
            step.shape = self._shape(step, decodes)
            step.duration = self.perf.step_time(step.shape)
        else:
            self.publish_kv(step.stored, step.removed, now)
        return step

    def end_step(self, step: Step, now: float) -> None:
        """`publish_kv` then `complete_step`: the step has run."""
        self.publish_kv(step.stored, step.removed, now)
        self.complete_step(step, now)

    def complete_step(self, step: Step, now: float) -> None:
        """Apply the step's outcome: tokens emitted, requests finished. Its KV events are
        published separately (`publish_kv`), at the step's end."""
        finished: list[EngineRequest] = []
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
            self._release(req)

    def clear_prefix_cache(self, now: float) -> None:
        """Evict every unreferenced cached block, reporting the removals."""
        self.pool.clear()
        self.publish_kv(*self.pool.drain_events(), now)

    def publish_kv(self, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        """Report blocks stored and evicted. Blocks are allocated (and evicted) when a step is
        scheduled, but the engine reports them once the step has run, as vLLM and Dynamo's
        mocker do: a router deciding during the step still sees the blocks this step is about
        to overwrite. (Found replaying the Mooncake synthetic trace: Dynamo's router credited a
        prefix that the running step had already evicted.)"""
        if stored or removed:
            self.listener.on_kv(self.worker, stored, removed, now)

    def waiting_stays_blocked(self, budget: int) -> tuple[bool, Sequence[BlockHash]]:
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
        total_blocks = blocks_for(head.length, cfg.block_size)
        if total_blocks > cfg.num_blocks:
            return False, ()  # due to be dropped
        # Decode steps only take blocks, so a head that does not fit now fits no better later.
        if total_blocks - self._cached_prefix(head)[1] > self.pool.available:
            return True, head.spec.block_hashes[: self._cacheable_blocks(head)]
        return False, ()

    def _cacheable_blocks(self, req: EngineRequest) -> int:
        """Leading full blocks a prefix hit may cover: at least one token is always computed,
        as vLLM does for a fully cached prompt."""
        return (req.length - 1) // self.config.block_size

    def _cached_prefix(self, req: EngineRequest) -> tuple[int, int]:
        """The request's leading blocks in the cache, and how many of those are active."""
        if not self.config.enable_prefix_caching:
            return 0, 0
        return self.pool.prefix_hits(req.spec.block_hashes, self._cacheable_blocks(req))

    # --- scheduling ------------------------------------------------------------------------

    def _schedule_running(self, step: Step, budget: int, now: float) -> tuple[int, _Decodes]:
        """Schedule the running requests; returns the budget left and the decodes among them,
        summed for the step's shape (the others are listed in the returned `_Decodes`)."""
        running = self.running
        scheduled = step.scheduled
        decodes = _Decodes()
        others = decodes.others
        count = context = 0
        bs = self.config.block_size
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.computed
            generated = req.generated
            pending = n = req.prompt + generated - computed
            if n > budget:
                n = budget
            upto = computed + n
            if upto > req.phys * bs or upto // bs > req.full_done:  # a block to take or fill
                victim_was_self = False
                while not self.reserve(req, upto):
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
        pool = self.pool
        bs = cfg.block_size
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            length = req.length
            total_blocks = blocks_for(length, bs)
            if total_blocks > cfg.num_blocks:
                self.waiting.popleft()
                self.listener.on_dropped(self.worker, req.spec, f"needs {total_blocks} KV blocks, pool has {cfg.num_blocks}", now)
                continue
            hits, active_hits = self._cached_prefix(req)
            if total_blocks - active_hits > pool.available:
                break
            cached = hits * bs
            chunk = min(length - cached, budget)
            if not cfg.enable_chunked_prefill and chunk < length - cached:
                if length - cached > cfg.max_num_batched_tokens:
                    self.waiting.popleft()  # no step can ever take it (vLLM rejects it too)
                    self.listener.on_dropped(
                        self.worker,
                        req.spec,
                        f"{length - cached} prompt tokens exceed max_num_batched_tokens without chunked prefill",
                        now,
                    )
                    continue
                break
            self.waiting.popleft()
            req.claim = pool.acquire(req.spec.block_hashes, hits)
            self.unpin(req.spec.program)  # the request now holds what the pin kept
            req.phys = req.full_done = hits
            req.computed = cached
            if not self.reserve(req, cached + chunk):  # cannot happen after the check above
                raise AssertionError(f"{self.worker}: admission of {req.spec.id} failed after capacity check")
            req.admissions += 1
            first = req.admissions == 1
            if first:
                req.cached_tokens = cached
            self.running.append(req)
            step.scheduled.append((req, chunk))
            budget -= chunk
            recompute = 0 if first else max(0, req.lost - cached)
            self.listener.on_admitted(self.worker, req.spec, cached, recompute, first, now)

    def reserve(self, req: EngineRequest, upto_tokens: int) -> bool:
        """Hold blocks for the first ``upto_tokens`` tokens and cache the blocks they complete
        (scheduling a chunk; `tasim.sim.engine.fast_forward` calls it for the chunks of steps it folds)."""
        bs = self.config.block_size
        need = blocks_for(upto_tokens, bs) - req.phys
        if need > 0:
            if not self.pool.allocate(need):
                return False
            req.phys += need
        full = upto_tokens // bs
        if full > req.full_done and self.config.enable_prefix_caching:
            self.pool.register_run(req.claim, req.full_done, full)
        req.full_done = max(req.full_done, full)
        return True

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
        self.running.remove(victim)
        self._release(victim)
        victim.computed = 0
        if self._by_priority:
            self._queue_in_order(victim)
        else:
            self.waiting.appendleft(victim)
        self.listener.on_preempted(self.worker, victim.spec, lost, now)
        return refund

    def _release(self, req: EngineRequest) -> None:
        self.pool.release_private(req.phys - req.claim.blocks)
        self.pool.release(req.claim)
        req.phys = req.full_done = 0

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


class _Decodes:
    """The decodes among a step's running requests, as `decode_shape` takes them, and the
    scheduled running requests that are not decodes."""

    __slots__ = ("count", "context", "others")

    def __init__(self) -> None:
        self.count = 0
        self.context = 0  # their computed tokens before the step
        self.others: list[tuple[EngineRequest, int]] = []


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
