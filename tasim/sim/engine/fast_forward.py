"""Runs of engine steps: how the simulator skips most decode iterations without changing them.

A worker sleeps through one *run* at a time. A run starts with one step scheduled as usual
(`Engine.begin_step`). When that step's shape repeats and fast-forwarding is on, the run
extends over the steps that follow with the same shape, up to the first at whose end a
request finishes. Two shapes repeat: a pure decode step (every running request computes its
one pending token; nobody is admitted or preempted), and decodes plus one chunked prefill
that spends the rest of the budget (a long prompt, so nothing can be admitted; the run stops
before its last chunk). Those steps are all alike, so the run plans them at once instead of
one event each:

* step times come from the perf model for the whole series (`decode_step_ends`, bit for bit
  what single steps would take; a prefill's steps from `step_time` on shapes summed per step);
* only *block boundaries* touch the KV pool: a request whose next token starts a block
  allocates it, one whose token completes a block registers it, and the prefill reserves its
  chunk every step. The run lists those steps and
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
from collections.abc import Sequence
from operator import itemgetter

from tasim.core.model import BlockHash, blocks_for
from tasim.sim.engine.scheduler import Engine, EngineRequest, Step, StepEngine, step_shape
from tasim.sim.perf.base import decode_shape, summed

# The longest run planned at once: runs are cut by arrivals, so planning far ahead is wasted.
MAX_RUN_STEPS = 1024
_TOUCH_ORDER = itemgetter(0, 1, 2)  # step, running position, allocation before registration


class _Boundary:
    """A folded step that touches the KV pool: per request (in running order) whether it
    allocates a block and whether it registers one."""

    __slots__ = ("index", "start", "end", "actions", "prefill_upto", "stored", "removed")

    def __init__(self, index: int, start: float, end: float, actions: list[tuple[EngineRequest, bool, bool]]) -> None:
        self.index = index  # 1-based step number within the run
        self.start = start
        self.end = end
        self.actions = actions
        self.prefill_upto = 0  # the run's prefilling request reserves up to this token (0: none)
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
        self._prefill: tuple[EngineRequest, int] | None = None  # (request, chunk per step), see `extend`
        self._applied = 0  # boundaries scheduled so far
        self._published = 0  # boundaries whose KV events are out
        self._first_published = False

    @property
    def end(self) -> float:
        return self.ends[self.steps - 1]

    @property
    def folds_prefill(self) -> bool:
        """Whether its folded steps carry a prefill chunk besides the decodes."""
        return self._prefill is not None

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
            decoders = self.first.scheduled
            if self._prefill is not None:
                prefilling, chunk = self._prefill
                prefilling.computed += folded * chunk
                decoders = decoders[:-1]
            for req, _ in decoders:
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
        if boundary.prefill_upto:  # last in running order, so last to reserve
            assert self._prefill is not None
            if not engine.reserve(self._prefill[0], boundary.prefill_upto):  # planned within the available blocks
                raise AssertionError(f"{engine.worker}: fast-forwarded prefill chunk found no blocks")
        boundary.stored, boundary.removed = pool.drain_events()

    def extend(self) -> None:
        """Fold the steps that follow the first one and repeat its shape (tasim's own engine
        only: folding plans its block pool ahead). Two shapes repeat:

        * pure decode: every running request computes its one pending token;
        * decode plus one chunked prefill: the newest running request is partway through a
          prompt longer than the budget, and takes all the tokens the decodes before it leave.
          Nothing can be admitted while it does (the budget is spent), and each step its chunk
          is the same; the run stops before the chunk that would complete its prompt."""
        engine = self.engine
        if not isinstance(engine, Engine):
            return
        first = self.first
        scheduled = first.scheduled
        count = len(engine.running)
        if first.preempted or len(scheduled) != count:
            return
        decoders = scheduled
        budget = engine.config.max_num_batched_tokens
        last = MAX_RUN_STEPS
        prefill = None
        newest, chunk = scheduled[-1]
        if chunk > 1 and chunk == budget - (count - 1):
            # Steps 2..k still take a full chunk while more than one chunk is left before them.
            last = min(last, (newest.length - newest.computed - 1) // chunk)
            prefill = (newest, chunk)
            decoders = scheduled[:-1]
        elif chunk != 1 or newest.length - newest.computed != 1:
            return  # the newest request is prefilling: checked first, as it is the usual misfit
        context = 0  # tokens the decoders have computed before the first step
        for req, n in decoders:
            generated = req.generated
            computed = req.computed
            if n != 1 or not generated or req.prompt + generated - computed != 1:
                return
            context += computed
            # At the end of step k (1-based), a request that had generated g tokens has g + k.
            if req.target - generated < last:
                last = req.target - generated
        head_blocks: Sequence[BlockHash] = ()
        if prefill is None:
            blocked, head_blocks = engine.waiting_stays_blocked(budget - count)
            if not blocked:
                return
        if last < 2:
            return
        planned = self._plan_boundaries(engine, last, head_blocks, prefill)
        if planned is None:
            return
        last, boundaries = planned
        cfg = engine.config
        capacity = cfg.num_blocks * cfg.block_size
        if prefill is None:
            self.ends = [first.end, *engine.perf.decode_step_ends(first.end, count, context + count, last - 1, capacity)]
        else:
            self.ends = _mixed_step_ends(engine, first.end, last, len(decoders), context, prefill, capacity)
        self.steps = last
        self._prefill = prefill
        for boundary in boundaries:
            boundary.start = self.ends[boundary.index - 2]
            boundary.end = self.ends[boundary.index - 1]
        self._boundaries = boundaries

    def _plan_boundaries(
        self, engine: Engine, last: int, head_blocks: Sequence[BlockHash], prefill: tuple[EngineRequest, int] | None
    ) -> tuple[int, list[_Boundary]] | None:
        """The steps 2..``last`` that allocate or register blocks, with their actions, and
        ``last`` lowered where the run must stop early; None when no step can be folded.
        ``head_blocks``: a chain prefix whose registration ends the run (chained hashes: a
        block is in it only at its own depth). ``prefill``: the run's prefilling request and its
        chunk, last in running order; it reserves every step."""
        bs = engine.config.block_size
        caching = engine.config.enable_prefix_caching
        head_depth = len(head_blocks)
        decoders = self.first.scheduled if prefill is None else self.first.scheduled[:-1]
        # (step, running position, 0 = allocate | 1 = register | 2 = reserve a prefill chunk,
        # request, depth of the block registered or the token the chunk reserves up to)
        touches: list[tuple[int, int, int, EngineRequest, int]] = []
        if prefill is not None:
            req, chunk = prefill
            touches += [(k, len(decoders), 2, req, req.computed + k * chunk) for k in range(2, last + 1)]
            prefill_phys = req.phys  # as `Engine.reserve` will find it, step by step
        for order, (req, _) in enumerate(decoders):
            c = req.computed  # before the first step; step k computes token c + k
            # The first step reserved through token c + 1; later steps need a block when their
            # token passes the blocks held, and complete one when it fills the next block. Runs
            # are mostly shorter than a block, so most requests have no touch at all.
            k = req.phys * bs - c + 1
            while k <= last:
                touches.append((k, order, 0, req, 0))
                k += bs
            if caching:
                depth = req.full_done
                k = (depth + 1) * bs - c
                while k <= last:
                    touches.append((k, order, 1, req, depth))
                    k += bs
                    depth += 1
        touches.sort(key=_TOUCH_ORDER)
        available = engine.pool.available
        boundaries: list[_Boundary] = []
        for k, _, kind, req, depth in touches:
            if k > last:
                break
            if not boundaries or boundaries[-1].index != k:
                boundaries.append(_Boundary(k, 0.0, 0.0, []))
            actions = boundaries[-1].actions
            if kind != 1:  # takes blocks: one, or the chunk's
                need = 1 if kind == 0 else max(0, blocks_for(depth, bs) - prefill_phys)
                available -= need
                if available < 0:  # step k would preempt: it is scheduled on its own
                    boundaries.pop()
                    last = k - 1
                    break
                if kind == 0:
                    actions.append((req, True, False))
                else:
                    prefill_phys += need
                    boundaries[-1].prefill_upto = depth
            else:
                if actions and actions[-1][0] is req:  # it allocated in this step too
                    actions[-1] = (req, True, True)
                else:
                    actions.append((req, False, True))
                if depth < head_depth and head_blocks[depth] == req.spec.block_hashes[depth]:
                    last = k  # the queue's head may fit after this step
        return (last, boundaries) if last >= 2 else None


class _ChunkStart:
    """The prefilling request as `step_shape` reads it, at the start of a later step's chunk."""

    __slots__ = ("computed", "prompt", "generated")

    def __init__(self, req: EngineRequest) -> None:
        self.computed = req.computed
        self.prompt = req.prompt
        self.generated = req.generated


def _mixed_step_ends(
    engine: Engine, first_end: float, last: int, decoders: int, context: int, prefill: tuple[EngineRequest, int], capacity: int
) -> list[float]:
    """End times of steps 1..``last`` of a decode-plus-prefill run. Step k's shape is that of its
    decodes (their computed tokens ``context`` plus ``(k - 1) * decoders``) plus that of its
    chunk, ``(k - 1) * chunk`` further into the prompt: `step_shape` sums the same terms, and
    every term of ``attn_pairs`` is a multiple of 1/2 far below 2**53, so the sum is exact in
    either order."""
    req, chunk = prefill
    step_time = engine.perf.step_time
    at = _ChunkStart(req)
    ends = [first_end]
    end = first_end
    for k in range(1, last):
        at.computed = req.computed + k * chunk
        shape = summed(decode_shape(decoders, context + k * decoders, capacity), step_shape([(at, chunk)], capacity))
        end = end + step_time(shape)
        ends.append(end)
    return ends
