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
* only *block boundaries* touch the KV cache: a request whose next token starts a block
  allocates it, one whose token completes a block registers it, and the prefill reserves its
  chunk every step. The run lists those steps and
  applies them lazily, in order, when the simulation catches up (`catch_up`), publishing their
  KV events at their steps' ends;
* nothing else changes until the run ends, so the requests' counters advance in one go;
  except, with a host tier, the stores in flight that complete at a folded step's start
  (`FoldableEngine.complete_copies`), whose host KV events are published at that instant after
  every step that ends then, as an unfolded step would publish them.

The run stops early where a step could differ: before a step that needs more blocks than are
free or evictable (preemption), after one that registers a block the queue's head could use.
Anything from outside that changes the engine (a submitted request, a pin, a cache clear)
`cut`s the run to the steps already started. The outcome equals stepping one iteration at a
time; tests compare the two event logs byte for byte.

The engine folds through a contract, `FoldableEngine` (what `StepEngine.foldable` gives; None
from an engine that cannot fold): it plans the run (`plan_run`: tasim's `Engine` checks the
shape and times the steps, its KV cache manager lists the block boundaries), reserves a
boundary's slots (`apply_boundary`) and completes the run (`complete_run`). `StepRun`, here,
is the run as the worker sleeps through it."""

from __future__ import annotations

import bisect

from tasim.core.model import BlockHash
from tasim.sim.engine.kv_manager import BlockBoundary
from tasim.sim.engine.scheduler import FoldableEngine, RunPlan, Step, StepEngine

# The longest run planned at once: runs are cut by arrivals, so planning far ahead is wasted.
MAX_RUN_STEPS = 1024


class StepRun:
    """The steps a worker sleeps through; see the module docstring."""

    def __init__(self, engine: StepEngine, first: Step) -> None:
        self.engine = engine
        self.first = first
        self.steps = 1
        self.ends: list[float] = [first.end]  # end of each step; step k + 1 starts at ends[k]
        self._foldable: FoldableEngine | None = None
        self._plan: RunPlan | None = None
        self._boundaries: list[BlockBoundary] = []
        self._events: list[tuple[list[BlockHash], list[BlockHash]]] = []  # of each boundary applied
        self._applied = 0  # boundaries scheduled so far
        self._published = 0  # boundaries whose KV events are out
        self._first_published = False
        self._copy_steps: list[int] = []  # steps that complete host stores when they start
        self._copied = 0  # of those, started

    @property
    def end(self) -> float:
        return self.ends[self.steps - 1]

    @property
    def copied(self) -> int:
        """Its folded steps that completed host stores so far."""
        return self._copied

    @property
    def folds_prefill(self) -> bool:
        """Whether its folded steps carry a prefill chunk besides the decodes."""
        return self._plan is not None and self._plan.prefill is not None

    @property
    def next_due(self) -> float:
        """The earliest time at which `catch_up` has something to do."""
        if not self._first_published:
            return self.first.end
        if self._published < self._applied:
            return self.ends[self._boundaries[self._published].index - 1]
        due = float("inf")
        if self._applied < len(self._boundaries):
            index = self._boundaries[self._applied].index
            if index <= self.steps:
                due = self.ends[index - 2]
        if self._copied < len(self._copy_steps):
            index = self._copy_steps[self._copied]
            if index <= self.steps and self.ends[index - 2] < due:
                due = self.ends[index - 2]
        return due

    def started(self, t: float) -> int:
        """Steps of the run that started before ``t`` (the first always has)."""
        return min(self.steps, 1 + bisect.bisect_left(self.ends, t, 0, self.steps - 1))

    def catch_up(self, t: float) -> list[tuple[float, bool, list[BlockHash], list[BlockHash]]]:
        """Schedule the folded steps that started before ``t`` and return the KV events due:
        those of the steps that ended at or before ``t`` and were not returned yet (with the host
        evictions of the first step, `Step.host_removed`), and the host tier's of the steps that
        started (``True``: publish with `publish_host`), each with its time."""
        due: list[tuple[float, bool, list[BlockHash], list[BlockHash]]] = []
        first = self.first
        if not self._first_published and first.end <= t:
            self._first_published = True
            due.append((first.end, False, first.stored, first.removed))
            if first.host_removed:
                due.append((first.end, True, [], first.host_removed))
        boundaries = self._boundaries
        copy_steps = self._copy_steps
        ends = self.ends
        foldable = self._foldable
        while True:
            index = boundaries[self._applied].index if self._applied < len(boundaries) else self.steps + 1
            if self._copied < len(copy_steps) and copy_steps[self._copied] <= index:
                index = copy_steps[self._copied]  # its copies complete before its slots are taken
                if index > self.steps or ends[index - 2] >= t:
                    break
                due += self._complete_copies(index)
                continue
            if index > self.steps or ends[index - 2] >= t:
                break
            assert foldable is not None  # it planned the boundaries
            self._events.append(foldable.apply_boundary(boundaries[self._applied]))
            self._applied += 1
        while self._published < self._applied:
            end = ends[boundaries[self._published].index - 1]
            if end > t:
                break
            stored, removed = self._events[self._published]
            due.append((end, False, stored, removed))
            self._published += 1
        return due

    def start_copies(self, now: float) -> list[tuple[float, bool, list[BlockHash], list[BlockHash]]]:
        """The host KV events of a step that completes copies and starts exactly at ``now``, as
        another worker's step is about to start then: steps start in worker order, so the
        simulation calls this for the runs of the workers before it."""
        copy_steps = self._copy_steps
        if self._copied < len(copy_steps):
            index = copy_steps[self._copied]
            if index <= self.steps and self.ends[index - 2] == now:
                return self._complete_copies(index)
        return []

    def publish_host(self, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        foldable = self.engine.foldable
        assert foldable is not None  # only such an engine has host KV events to hand a run
        foldable.publish_host_kv(stored, removed, now)

    def _complete_copies(self, index: int) -> list[tuple[float, bool, list[BlockHash], list[BlockHash]]]:
        assert self._foldable is not None  # it planned the copy steps
        start = self.ends[index - 2]
        stored, removed = self._foldable.complete_copies(start)
        self._copied += 1
        return [(start, True, stored, removed)] if stored or removed else []

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
        if self.steps > 1:
            assert self._foldable is not None and self._plan is not None  # only a planned run has more steps
            self._foldable.complete_run(self._plan, self.steps, now)
        else:
            self.engine.complete_step(self.first, now)

    def extend(self) -> None:
        """Fold the steps that follow the first one and repeat its shape, as the engine plans
        them (an engine that cannot fold leaves the run at its first step)."""
        foldable = self.engine.foldable
        if foldable is None:
            return
        plan = foldable.plan_run(self.first, MAX_RUN_STEPS)
        if plan is None:
            return
        self._foldable = foldable
        self._plan = plan
        self.steps = plan.steps
        self.ends = plan.ends
        self._boundaries = plan.boundaries
        self._copy_steps = plan.copy_steps
