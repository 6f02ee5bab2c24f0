"""Runs of engine steps: how the simulator skips most decode iterations without changing them.

A worker sleeps through one *run* at a time. A run starts with one step scheduled as usual
(`Engine.begin_step`). When that step is a pure decode step (every running request computes
its one pending token; nobody is admitted or preempted) and fast-forwarding is on, the run
extends over the pure decode steps that follow, up to the first at whose end a request
finishes. Those steps are all alike, so the run plans them at once instead of one event each:

* step times come from the perf model for the whole series (`decode_step_times`, bit for bit
  what single steps would take);
* only *block boundaries* touch the KV pool: a request whose next token starts a block
  allocates it, one whose token completes a block registers it. The run lists those steps and
  applies them lazily, in order, when the simulation catches up (`catch_up`), publishing their
  KV events at their steps' ends;
* nothing else changes until the run ends, so the requests' counters advance in one go.

The run stops early where a step could differ: before a step that needs more blocks than are
free or evictable (preemption), after one that registers a block the queue's head could use.
Anything from outside that changes the engine (a submitted request, a pin, a cache clear)
`cut`s the run to the steps already started. The outcome equals stepping one iteration at a
time; tests compare the two event logs byte for byte.
"""

from __future__ import annotations

import bisect
from operator import itemgetter

import numpy as np

from tasim.model import BlockHash
from tasim.sim.engine import Engine, EngineRequest, Step, StepEngine

# The longest run planned at once: runs are cut by arrivals, so planning far ahead is wasted.
MAX_RUN_STEPS = 1024
_TOUCH_ORDER = itemgetter(0, 1, 2)  # step, running position, allocation before registration


class _Boundary:
    """A folded step that touches the KV pool: per request (in running order) whether it
    allocates a block and whether it registers one."""

    __slots__ = ("index", "start", "end", "actions", "stored", "removed")

    def __init__(self, index: int, start: float, end: float, actions: list[tuple[EngineRequest, bool, bool]]) -> None:
        self.index = index  # 1-based step number within the run
        self.start = start
        self.end = end
        self.actions = actions
        self.stored: list[BlockHash] = []
        self.removed: list[BlockHash] = []


class StepRun:
    """The steps a worker sleeps through; see the module docstring."""

    def __init__(self, engine: StepEngine, first: Step) -> None:
        self.engine = engine
        self.first = first
        self.steps = 1
        self.ends: list[float] = [first.end]  # end of each step; step k + 1 starts at ends[k]
        self._boundaries: list[_Boundary] = []
        self._applied = 0  # boundaries scheduled so far
        self._published = 0  # boundaries whose KV events are out
        self._first_published = False

    @property
    def end(self) -> float:
        return self.ends[self.steps - 1]

    @property
    def next_due(self) -> float:
        """The earliest time at which `catch_up` has something to do."""
        if not self._first_published:
            return self.first.end
        if self._published < self._applied:
            return self._boundaries[self._published].end
        if self._applied < len(self._boundaries) and self._boundaries[self._applied].index <= self.steps:
            return self._boundaries[self._applied].start
        return float("inf")

    def started(self, t: float) -> int:
        """Steps of the run that started before ``t`` (the first always has)."""
        return min(self.steps, 1 + bisect.bisect_left(self.ends, t, 0, self.steps - 1))

    def catch_up(self, t: float) -> list[tuple[float, list[BlockHash], list[BlockHash]]]:
        """Schedule the folded steps that started before ``t`` and return, in order, the KV
        events of the steps that ended at or before ``t`` and were not returned yet."""
        due: list[tuple[float, list[BlockHash], list[BlockHash]]] = []
        first = self.first
        if not self._first_published and first.end <= t:
            self._first_published = True
            due.append((first.end, first.stored, first.removed))
        boundaries = self._boundaries
        while self._applied < len(boundaries):
            boundary = boundaries[self._applied]
            if boundary.index > self.steps or boundary.start >= t:
                break
            self._apply(boundary)
            self._applied += 1
        while self._published < self._applied and boundaries[self._published].end <= t:
            boundary = boundaries[self._published]
            due.append((boundary.end, boundary.stored, boundary.removed))
            self._published += 1
        return due

    def cut(self, t: float) -> bool:
        """Keep only the steps started before ``t`` (call after `catch_up(t)`); returns whether
        the run now ends earlier."""
        started = self.started(t)
        if started == self.steps:
            return False
        self.steps = started
        return True

    def complete(self, now: float) -> None:
        """The last step has ended (its KV events are out): advance the requests through the
        folded steps and apply the last one's outcome."""
        engine = self.engine
        folded = self.steps - 1
        if folded:
            engine.iterations += folded
            for req, _ in self.first.scheduled:
                req.computed += folded
                req.generated += folded
        # A folded run's last step scheduled the same one token per request as its first.
        engine.complete_step(self.first, now)

    def _apply(self, boundary: _Boundary) -> None:
        engine = self.engine
        assert isinstance(engine, Engine), "only tasim's engine has folded steps"
        pool = engine.pool
        for req, allocate, register in boundary.actions:
            if allocate:
                if not pool.allocate(1):  # planned within the available blocks
                    raise AssertionError(f"{engine.worker}: fast-forwarded allocation failed")
                req.phys += 1
            if register:
                pool.register_run(req.claim, req.full_done, req.full_done + 1)
                req.full_done += 1
        boundary.stored, boundary.removed = pool.drain_events()

    def extend(self) -> None:
        """Fold the pure decode steps that follow the first one, if it is one (tasim's own
        engine only: folding plans its block pool ahead)."""
        engine = self.engine
        if not isinstance(engine, Engine):
            return
        first = self.first
        running = engine.running
        count = len(running)
        if first.preempted or len(first.scheduled) != count:
            return
        for req, n in first.scheduled:
            if n != 1 or not req.generated or req.length - req.computed != 1:
                return
        blocked, head_blocks = engine.waiting_stays_blocked(engine.config.max_num_batched_tokens - count)
        if not blocked:
            return
        # At the end of step k (1-based), a request that had generated g tokens has g + k.
        last = min(MAX_RUN_STEPS, min(req.target - req.generated for req, _ in first.scheduled))
        if last < 2:
            return
        planned = self._plan_boundaries(engine, last, head_blocks)
        if planned is None:
            return
        last, boundaries = planned
        context = sum(req.computed for req, _ in first.scheduled)  # before the first step
        contexts = np.arange(1, last, dtype=np.int64) * count + context
        cfg = engine.config
        ends = np.empty(last)
        ends[0] = first.end
        ends[1:] = engine.perf.decode_step_times(count, contexts, cfg.num_blocks * cfg.block_size)
        self.ends = np.cumsum(ends, out=ends).tolist()  # sequential sums: each end = start + duration
        self.steps = last
        for boundary in boundaries:
            boundary.start = self.ends[boundary.index - 2]
            boundary.end = self.ends[boundary.index - 1]
        self._boundaries = boundaries

    def _plan_boundaries(self, engine: Engine, last: int, head_blocks: frozenset[BlockHash]) -> tuple[int, list[_Boundary]] | None:
        """The steps 2..``last`` that allocate or register blocks, with their actions, and
        ``last`` lowered where the run must stop early; None when no step can be folded."""
        bs = engine.config.block_size
        caching = engine.config.enable_prefix_caching
        # (step, running position, 0 = allocate | 1 = register, request, block registered)
        touches: list[tuple[int, int, int, EngineRequest, BlockHash]] = []
        for order, (req, _) in enumerate(self.first.scheduled):
            c = req.computed  # before the first step; step k computes token c + k
            # The first step reserved through token c + 1; later steps need a block when their
            # token passes the blocks held, and complete one when it fills the next block.
            touches += [(k, order, 0, req, 0) for k in range(req.phys * bs - c + 1, last + 1, bs)]
            if caching:
                hashes = req.spec.block_hashes
                first_full = (req.full_done + 1) * bs - c
                touches += [(k, order, 1, req, hashes[block]) for block, k in enumerate(range(first_full, last + 1, bs), req.full_done)]
        touches.sort(key=_TOUCH_ORDER)
        available = engine.pool.available
        boundaries: list[_Boundary] = []
        for k, _, kind, req, block in touches:
            if k > last:
                break
            if not boundaries or boundaries[-1].index != k:
                boundaries.append(_Boundary(k, 0.0, 0.0, []))
            actions = boundaries[-1].actions
            if kind == 0:
                available -= 1
                if available < 0:  # step k would preempt: it is scheduled on its own
                    boundaries.pop()
                    last = k - 1
                    break
                actions.append((req, True, False))
            else:
                if actions and actions[-1][0] is req:  # it allocated in this step too
                    actions[-1] = (req, True, True)
                else:
                    actions.append((req, False, True))
                if block in head_blocks:
                    last = k  # the queue's head may fit after this step
        return (last, boundaries) if last >= 2 else None
