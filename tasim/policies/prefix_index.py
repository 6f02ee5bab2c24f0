"""Per-worker prefix indexes for KV-aware routing, as Dynamo's router keeps them.

Both index kinds answer one question: how many leading blocks of a prompt does each worker
hold? Block hashes are chained (a hash stands for its whole prefix), so a flat set per worker
answers it exactly as Dynamo's radix tree walk does.

* `EventIndex` is fed by the workers' KV stored/removed events, optionally seen ``lag_s`` late
  (Dynamo's replay exposes the same knob as ``kv_event_lag_ms``). Each tier has its own set per
  worker, as Dynamo keeps the device radix tree and one lower-tier indexer per storage tier, so a
  device removal leaves the block's host copy indexed. `EventIndex.lower_runs` walks the lower
  tiers as Dynamo 1.6.1's ``query_lower_tiers`` does (lib/kv-router/src/indexer/
  lower_tier_indexers.rs): from where each worker's device match stopped, the contiguous run of
  host blocks, then from there the contiguous run of disk blocks. The tiers are exclusive that
  way: a block held on the GPU and the host counts once, as device.
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
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from itertools import islice, takewhile

from tasim.core.kv_tier import KvTier
from tasim.core.model import BlockHash

PRUNE_TO_FRACTION = 0.8


def _leading_hits(held: set[BlockHash] | dict[BlockHash, float], hashes: Sequence[object]) -> int:
    # This runs once per worker per routing decision. The hashes are taken as objects so that
    # the compiled loop hands each to the lookup as it is, not unboxed to a C integer and boxed
    # again (a new int object per block).
    hits = 0
    for block in hashes:
        if block not in held:
            break
        hits += 1
    return hits


def _run_from(held: set[BlockHash], hashes: Sequence[BlockHash], start: int) -> int:
    """How many of ``hashes`` from index ``start`` on ``held`` holds without a gap."""
    return len(list(takewhile(held.__contains__, islice(hashes, start, None))))


class EventIndex:
    def __init__(self, workers: Iterable[str], lag_s: float = 0.0) -> None:
        self.lag_s = lag_s
        names = list(workers)
        self._blocks: dict[str, set[BlockHash]] = {w: set() for w in names}  # the device tier
        self._host: dict[str, set[BlockHash]] = {w: set() for w in names}
        self._disk: dict[str, set[BlockHash]] = {w: set() for w in names}
        # whether a lower-tier event ever arrived: until one does (always, without such tiers)
        # there is nothing to walk, as Dynamo allocates a lower-tier indexer on its first event
        self.lower_tiers = False
        self._pending: deque[tuple[float, bool, str, tuple[BlockHash, ...], KvTier]] = deque()

    def stored(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        self._enqueue(True, worker, blocks, now, tier)

    def removed(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        self._enqueue(False, worker, blocks, now, tier)

    def _enqueue(self, stored: bool, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier) -> None:
        if self.lag_s <= 0:
            self._apply(stored, worker, blocks, tier)
        else:
            self._pending.append((now + self.lag_s, stored, worker, tuple(blocks), tier))

    def _apply(self, stored: bool, worker: str, blocks: Sequence[BlockHash], tier: KvTier) -> None:
        if tier == "device":
            held = self._blocks[worker]
        else:
            self.lower_tiers = True
            held = self._host[worker] if tier == "host" else self._disk[worker]
        if stored:
            held.update(blocks)
        else:
            held.difference_update(blocks)

    def overlaps(self, hashes: Sequence[BlockHash], now: float) -> dict[str, int]:
        """Leading blocks of ``hashes`` on each worker's GPU (its device match)."""
        self._deliver(now)
        return {w: _leading_hits(held, hashes) for w, held in self._blocks.items()}

    def overlap(self, worker: str, hashes: Sequence[BlockHash], now: float) -> int:
        """`overlaps` for ``worker`` alone."""
        self._deliver(now)
        return _leading_hits(self._blocks[worker], hashes)

    def _deliver(self, now: float) -> None:
        """Apply the events that have arrived by ``now``."""
        pending = self._pending
        while pending and pending[0][0] <= now:
            _, stored, worker, blocks, tier = pending.popleft()
            self._apply(stored, worker, blocks, tier)

    def lower_runs(self, hashes: Sequence[BlockHash], device: dict[str, int]) -> dict[str, tuple[int, int]]:
        """(host, disk) blocks of ``hashes`` per worker beyond its ``device`` match (what
        `overlaps` answered at this time): the host run from there, then the disk run after it."""
        runs: dict[str, tuple[int, int]] = {}
        for worker, start in device.items():
            host = _run_from(self._host[worker], hashes, start)
            runs[worker] = (host, _run_from(self._disk[worker], hashes, start + host))
        return runs

    def routed(self, worker: str, hashes: Sequence[BlockHash], now: float) -> None:
        """Event-fed indexes learn from events only."""

    def forget(self, worker: str) -> None:
        """``worker`` lost its cache, every tier of it: drop its blocks, and its events still in transit."""
        self._blocks[worker].clear()
        self._host[worker].clear()
        self._disk[worker].clear()
        self._pending = deque(entry for entry in self._pending if entry[2] != worker)

    def size(self) -> int:
        return sum(len(h) for tier in (self._blocks, self._host, self._disk) for h in tier.values())


class _Due:
    """The routings whose blocks expire at one time, and how many blocks still hold that expiry."""

    __slots__ = ("routings", "held")

    def __init__(self) -> None:
        # (worker, blocks, depth of the first block) per routing, not one entry per block
        self.routings: list[tuple[str, tuple[BlockHash, ...], int]] = []
        self.held = 0


class ApproxIndex:
    def __init__(self, workers: Iterable[str], ttl_s: float = 120.0, max_size: int = 1 << 20) -> None:
        self.ttl_s = ttl_s
        self.max_size = max_size
        self._expiry: dict[str, dict[BlockHash, float]] = {w: {} for w in workers}
        # Every routing's blocks, filed under their expiry (`_expiries`, a heap of the keys). A
        # routing's entry turns stale for each block routed again since (its expiry moved) or
        # forgotten. Most go wholly stale (an agent's next turn routes the same prefix again), and
        # the count of blocks still held at each expiry lets their expiry skip them.
        self._due: dict[float, _Due] = {}
        self._expiries: list[float] = []
        self._size = 0

    def routed(self, worker: str, hashes: Sequence[BlockHash], now: float) -> None:
        expiry = now + self.ttl_s
        table = self._expiry[worker]
        blocks = tuple(hashes)
        due = self._due.get(expiry)
        if due is None:
            due = self._due[expiry] = _Due()
            heapq.heappush(self._expiries, expiry)
        fresh = dict.fromkeys(blocks, expiry)
        # The expiries the blocks move from, counted by runs: a prompt is mostly the previous
        # turn's, whose blocks share one expiry object (`is` is then enough to tell a run).
        last: float | None = None
        run = 0
        for held in map(table.get, fresh):
            if held is last:
                run += 1
            else:
                self._moved_from(last, run)
                last, run = held, 1
        self._moved_from(last, run)
        table.update(fresh)
        due.held += len(fresh)
        due.routings.append((worker, blocks, 0))
        if self._size > self.max_size:
            self._drop_earliest(self._size - int(self.max_size * PRUNE_TO_FRACTION))

    def _moved_from(self, held: float | None, count: int) -> None:
        """``count`` blocks that held expiry ``held`` (None: were not held) take another."""
        if held is None:
            self._size += count
        else:
            self._due[held].held -= count

    def forget(self, worker: str) -> None:
        """``worker`` lost its cache: drop its blocks (their entries become stale)."""
        table = self._expiry[worker]
        for held, count in Counter(table.values()).items():
            self._due[held].held -= count
        self._size -= len(table)
        table.clear()

    def overlaps(self, hashes: Sequence[BlockHash], now: float) -> dict[str, int]:
        self._expire(now)
        return {w: _leading_hits(table, hashes) for w, table in self._expiry.items()}

    def overlap(self, worker: str, hashes: Sequence[BlockHash], now: float) -> int:
        """`overlaps` for ``worker`` alone."""
        self._expire(now)
        return _leading_hits(self._expiry[worker], hashes)

    def stored(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        """Approximate mode ignores KV events."""

    def removed(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        """Approximate mode ignores KV events."""

    def size(self) -> int:
        return self._size

    def _expire(self, now: float) -> None:
        expiries = self._expiries
        tables = self._expiry
        while expiries and expiries[0] <= now:
            expiry = heapq.heappop(expiries)
            due = self._due.pop(expiry)
            for worker, blocks, _ in due.routings:
                if due.held == 0:  # the rest is stale
                    break
                table = tables[worker]
                for block in blocks:
                    if table.get(block) == expiry:  # not routed again since, nor forgotten
                        del table[block]
                        due.held -= 1
                        self._size -= 1

    def _drop_earliest(self, count: int) -> None:
        """Drop ``count`` blocks, the earliest-expiring first; on a tie in expiry the deepest
        first, then by worker, then by hash."""
        expiries = self._expiries
        tables = self._expiry
        while count > 0 and expiries:
            expiry = expiries[0]
            due = self._due[expiry]
            ranked = []
            if due.held:  # else every entry is stale, and all go
                ranked = sorted((-(first + depth), worker, block) for worker, blocks, first in due.routings for depth, block in enumerate(blocks))
            taken = 0
            for _, worker, block in ranked:
                if count == 0:
                    break
                taken += 1
                table = tables[worker]
                if table.get(block) == expiry:
                    del table[block]
                    due.held -= 1
                    self._size -= 1
                    count -= 1
            if taken == len(ranked):
                heapq.heappop(expiries)
                del self._due[expiry]
            else:  # the rest of the tie stays, one entry per block, for a later trim or expiry
                due.routings = [(worker, (block,), -neg_depth) for neg_depth, worker, block in ranked[taken:]]


class PredictOnRouteIndex:
    def __init__(self, events: EventIndex, predicted: ApproxIndex) -> None:
        self.events = events
        self.predicted = predicted

    def stored(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        self.events.stored(worker, blocks, now, tier)

    def removed(self, worker: str, blocks: Sequence[BlockHash], now: float, tier: KvTier = "device") -> None:
        self.events.removed(worker, blocks, now, tier)

    def routed(self, worker: str, hashes: Sequence[BlockHash], now: float) -> None:
        self.predicted.routed(worker, hashes, now)

    def overlaps(self, hashes: Sequence[BlockHash], now: float) -> dict[str, int]:
        predicted = self.predicted.overlaps(hashes, now)
        return {w: max(n, predicted[w]) for w, n in self.events.overlaps(hashes, now).items()}

    def overlap(self, worker: str, hashes: Sequence[BlockHash], now: float) -> int:
        """`overlaps` for ``worker`` alone."""
        predicted = self.predicted.overlap(worker, hashes, now)
        return max(self.events.overlap(worker, hashes, now), predicted)

    @property
    def lower_tiers(self) -> bool:
        return self.events.lower_tiers

    def lower_runs(self, hashes: Sequence[BlockHash], device: dict[str, int]) -> dict[str, tuple[int, int]]:
        """The events' lower tiers, continuing from the merged device match."""
        return self.events.lower_runs(hashes, device)

    def forget(self, worker: str) -> None:
        self.events.forget(worker)
        self.predicted.forget(worker)

    def size(self) -> int:
        return self.events.size() + self.predicted.size()
