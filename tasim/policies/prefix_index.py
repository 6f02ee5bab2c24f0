"""Per-worker prefix indexes for KV-aware routing, as Dynamo's router keeps them.

Both index kinds answer one question: how many leading blocks of a prompt does each worker
hold? Block hashes are chained (a hash stands for its whole prefix), so a flat set per worker
answers it exactly as Dynamo's radix tree walk does.

* `EventIndex` is fed by the workers' KV stored/removed events, optionally seen ``lag_s`` late
  (Dynamo's replay exposes the same knob as ``kv_event_lag_ms``).
* `ApproxIndex` (Dynamo's ``--no-router-kv-events``) never sees events: after each routing
  decision it records the request's blocks on the chosen worker, each expiring ``ttl_s`` after its
  last insertion; a size guard prunes the earliest-expiring blocks (deepest first on ties) down
  to 80 % when the index exceeds ``max_size`` blocks.
* `PredictOnRouteIndex` (``--router-predicted-ttl-secs``) is an `EventIndex` plus an
  `ApproxIndex` of the router's own decisions with a short TTL, so a prefix counts from the moment
  it is routed rather than from its first KV event; a worker's overlap is the larger of the two.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import takewhile

from tasim.core.model import BlockHash

PRUNE_TO_FRACTION = 0.8


def _leading_hits(held: set[BlockHash] | dict[BlockHash, float], hashes: Sequence[BlockHash]) -> int:
    # takewhile and list walk the prefix in C: this runs once per worker per routing decision.
    return len(list(takewhile(held.__contains__, hashes)))


class EventIndex:
    def __init__(self, workers: Iterable[str], lag_s: float = 0.0) -> None:
        self.lag_s = lag_s
        self._blocks: dict[str, set[BlockHash]] = {w: set() for w in workers}
        self._pending: deque[tuple[float, bool, str, tuple[BlockHash, ...]]] = deque()

    def stored(self, worker: str, blocks: Sequence[BlockHash], now: float) -> None:
        self._enqueue(True, worker, blocks, now)

    def removed(self, worker: str, blocks: Sequence[BlockHash], now: float) -> None:
        self._enqueue(False, worker, blocks, now)

    def _enqueue(self, stored: bool, worker: str, blocks: Sequence[BlockHash], now: float) -> None:
        if self.lag_s <= 0:
            self._apply(stored, worker, blocks)
        else:
            self._pending.append((now + self.lag_s, stored, worker, tuple(blocks)))

    def _apply(self, stored: bool, worker: str, blocks: Sequence[BlockHash]) -> None:
        held = self._blocks[worker]
        if stored:
            held.update(blocks)
        else:
            held.difference_update(blocks)

    def overlaps(self, hashes: Sequence[BlockHash], now: float) -> dict[str, int]:
        pending = self._pending
        while pending and pending[0][0] <= now:
            _, stored, worker, blocks = pending.popleft()
            self._apply(stored, worker, blocks)
        return {w: _leading_hits(held, hashes) for w, held in self._blocks.items()}

    def routed(self, worker: str, hashes: Sequence[BlockHash], now: float) -> None:
        """Event-fed indexes learn from events only."""

    def forget(self, worker: str) -> None:
        """``worker`` lost its cache: drop its blocks, and its events still in transit."""
        self._blocks[worker].clear()
        self._pending = deque(entry for entry in self._pending if entry[2] != worker)

    def size(self) -> int:
        return sum(len(h) for h in self._blocks.values())


class ApproxIndex:
    def __init__(self, workers: Iterable[str], ttl_s: float = 120.0, max_size: int = 1 << 20) -> None:
        self.ttl_s = ttl_s
        self.max_size = max_size
        self._expiry: dict[str, dict[BlockHash, float]] = {w: {} for w in workers}
        # (expiry, -depth, worker, block): earliest expiry first, deeper blocks first on ties
        self._heap: list[tuple[float, int, str, BlockHash]] = []
        self._size = 0

    def routed(self, worker: str, hashes: Sequence[BlockHash], now: float) -> None:
        expiry = now + self.ttl_s
        table = self._expiry[worker]
        for depth, block in enumerate(hashes):
            if block not in table:
                self._size += 1
            table[block] = expiry
            heapq.heappush(self._heap, (expiry, -depth, worker, block))
        if self._size > self.max_size:
            self._drop_earliest(self._size - int(self.max_size * PRUNE_TO_FRACTION))

    def forget(self, worker: str) -> None:
        """``worker`` lost its cache: drop its blocks (their heap entries become stale)."""
        self._size -= len(self._expiry[worker])
        self._expiry[worker].clear()

    def overlaps(self, hashes: Sequence[BlockHash], now: float) -> dict[str, int]:
        self._expire(now)
        return {w: _leading_hits(table, hashes) for w, table in self._expiry.items()}

    def stored(self, worker: str, blocks: Sequence[BlockHash], now: float) -> None:
        """Approximate mode ignores KV events."""

    def removed(self, worker: str, blocks: Sequence[BlockHash], now: float) -> None:
        """Approximate mode ignores KV events."""

    def size(self) -> int:
        return self._size

    def _expire(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            self._pop_live()

    def _drop_earliest(self, count: int) -> None:
        while count > 0 and self._heap:
            if self._pop_live():
                count -= 1

    def _pop_live(self) -> bool:
        """Pop the heap head; remove its block if the entry is current (not refreshed since)."""
        expiry, _, worker, block = heapq.heappop(self._heap)
        table = self._expiry[worker]
        if table.get(block) == expiry:
            del table[block]
            self._size -= 1
            return True
        return False


class PredictOnRouteIndex:
    def __init__(self, events: EventIndex, predicted: ApproxIndex) -> None:
        self.events = events
        self.predicted = predicted

    def stored(self, worker: str, blocks: Sequence[BlockHash], now: float) -> None:
        self.events.stored(worker, blocks, now)

    def removed(self, worker: str, blocks: Sequence[BlockHash], now: float) -> None:
        self.events.removed(worker, blocks, now)

    def routed(self, worker: str, hashes: Sequence[BlockHash], now: float) -> None:
        self.predicted.routed(worker, hashes, now)

    def overlaps(self, hashes: Sequence[BlockHash], now: float) -> dict[str, int]:
        predicted = self.predicted.overlaps(hashes, now)
        return {w: max(n, predicted[w]) for w, n in self.events.overlaps(hashes, now).items()}

    def forget(self, worker: str) -> None:
        self.events.forget(worker)
        self.predicted.forget(worker)

    def size(self) -> int:
        return self.events.size() + self.predicted.size()
