"""Paged KV block pool with a prefix cache, as vLLM v1 and Dynamo's mocker keep it.

Every physical block is in exactly one of three states:

* **free**: holds nothing reusable (never used, a partial tail block, a duplicate copy);
* **active**: referenced by at least one running request (``refs > 0``);
* **inactive**: cached and unreferenced; reusable by a prefix hit until evicted.

``free + active + inactive == num_blocks`` at all times. A full block is registered under its
chained hash when the step that computes its last token is scheduled; only hashes that were not
resident emit a *stored* event, and only evicting the last copy emits *removed*. Allocation uses
free blocks first and evicts inactive ones only when none are free.

Eviction order of inactive blocks:

* ``lru``: least recently released first. Requests release their blocks tail-first, so a
  sequence's deepest blocks go before its prefix (vLLM's free-queue order).
* ``lineage``: only leaves (no resident child) are evictable, oldest release first; a parent that
  becomes a leaf again keeps its original release tick (Dynamo mocker's default).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from itertools import islice, takewhile
from operator import attrgetter
from typing import Literal, Sequence

from tasim.model import BlockHash

Eviction = Literal["lru", "lineage"]


_refs = attrgetter("refs")


class _Cached:
    """A cached block: references (running requests and pins), the parent's hash (lineage;
    None for a root or after a private duplicate), resident children (lineage), and the
    release tick while unreferenced. A slotted object, not a list: one indirection fewer on
    every access, which shows once the pools outgrow the CPU caches."""

    __slots__ = ("refs", "parent", "children", "tick")

    def __init__(self, parent: BlockHash | None) -> None:
        self.refs = 1
        self.parent = parent
        self.children = 0
        self.tick = 0


class BlockPool:
    def __init__(self, num_blocks: int, eviction: Eviction = "lru") -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.eviction = eviction
        self.free = num_blocks
        self._cached: dict[BlockHash, _Cached] = {}
        self._inactive_lru: OrderedDict[BlockHash, None] = OrderedDict()
        self._inactive_count = 0
        self._leaf_heap: list[tuple[int, BlockHash]] = []
        self._tick = 0
        # KV events since the last drain, in the order they happened.
        self.stored: list[BlockHash] = []
        self.removed: list[BlockHash] = []

    # --- queries ---------------------------------------------------------------------------

    @property
    def inactive(self) -> int:
        return self._inactive_count

    @property
    def active(self) -> int:
        return self.num_blocks - self.free - self._inactive_count

    @property
    def available(self) -> int:
        """Blocks a new reservation can get: free plus evictable."""
        return self.free + self._inactive_count

    @property
    def cached_blocks(self) -> int:
        return len(self._cached)

    def is_cached(self, block: BlockHash) -> bool:
        return block in self._cached

    def refs(self, block: BlockHash) -> int:
        entry = self._cached.get(block)
        return entry.refs if entry else 0

    def prefix_hits(self, hashes: Sequence[BlockHash], limit: int) -> tuple[int, int]:
        """Leading blocks of ``hashes[:limit]`` resident in the cache, and how many of those are
        active (already referenced, so a new reference costs no capacity)."""
        # C-level iteration: admission re-checks a blocked queue head's whole prefix each step.
        cached = self._cached
        resident = list(takewhile(cached.__contains__, hashes[:limit]))
        active = len(resident) - list(map(_refs, map(cached.__getitem__, resident))).count(0)
        return len(resident), active

    def inactive_order(self) -> list[BlockHash]:
        """Inactive blocks in the order they would be evicted (for tests and debugging)."""
        if self.eviction == "lru":
            return list(self._inactive_lru)
        order: list[BlockHash] = []
        children = {h: e.children for h, e in self._cached.items()}
        heap = [(e.tick, h) for h, e in self._cached.items() if e.refs == 0 and e.children == 0]
        heapq.heapify(heap)
        while heap:
            _, block = heapq.heappop(heap)
            order.append(block)
            parent = self._cached[block].parent
            if parent is not None and parent in children:
                children[parent] -= 1
                entry = self._cached[parent]
                if children[parent] == 0 and entry.refs == 0:
                    heapq.heappush(heap, (entry.tick, parent))
        return order

    # --- reference counting ----------------------------------------------------------------

    def acquire(self, blocks: Sequence[BlockHash]) -> None:
        """Reference resident blocks (a prefix hit)."""
        cached = self._cached
        lru = self._inactive_lru if self.eviction == "lru" else None
        reactivated = 0
        for block in blocks:
            entry = cached[block]
            if entry.refs == 0:
                reactivated += 1
                if lru is not None:
                    del lru[block]
                # lineage: the leaf-heap entry goes stale and is skipped when popped
            entry.refs += 1
        self._inactive_count -= reactivated

    def release(self, blocks: Sequence[BlockHash]) -> None:
        """Drop one reference from each block, deepest first, as requests free their blocks."""
        cached = self._cached
        lru = self._inactive_lru if self.eviction == "lru" else None
        heap = self._leaf_heap
        tick = self._tick
        for block in reversed(blocks):
            entry = cached[block]
            entry.refs -= 1
            if entry.refs == 0:
                tick += 1
                entry.tick = tick
                if lru is not None:
                    lru[block] = None
                elif entry.children == 0:
                    heapq.heappush(heap, (tick, block))
        self._inactive_count += tick - self._tick
        self._tick = tick
        if len(heap) > 2 * self._inactive_count + 64:
            self._compact_leaf_heap()

    def release_private(self, count: int) -> None:
        self.free += count

    # --- allocation ------------------------------------------------------------------------

    def allocate(self, count: int) -> bool:
        """Take ``count`` physical blocks, evicting inactive ones if needed; all or nothing."""
        if count <= self.free:
            self.free -= count
            return True
        if count > self.free + self._inactive_count:
            return False
        need = count - self.free
        self.free = 0
        if self.eviction == "lru":
            self._evict_lru(need)
        else:
            self._evict_leaves(need)
        return True

    def register_run(self, hashes: Sequence[BlockHash], start: int, stop: int, held: list[BlockHash]) -> None:
        """Register ``hashes[start:stop]``, the blocks one request just completed, appending
        those it now references to ``held``. A block whose parent the request does not hold
        (it holds a private duplicate) is registered without a parent link."""
        cached = self._cached
        stored = self.stored
        lineage = self.eviction == "lineage"
        for j in range(start, stop):
            block = hashes[j]
            if block in cached:
                continue  # another copy is resident: ours stays a private duplicate
            entry = _Cached(None)
            if lineage and j and held and held[-1] == hashes[j - 1]:
                entry.parent = hashes[j - 1]
                cached[entry.parent].children += 1
            cached[block] = entry
            stored.append(block)
            held.append(block)

    def drain_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """Net KV events since the last drain: blocks now cached that were stored, and blocks
        now gone that were removed. A block evicted and stored again (or the reverse) within
        one drain is reported by its final state, so applying stored then removed is exact."""
        stored, removed = self.stored, self.removed
        self.stored, self.removed = [], []
        if stored and removed and not set(stored).isdisjoint(removed):
            # Rare (a block evicted and registered again, or the reverse, within one step):
            # only then can a list repeat a block or name one whose final state differs.
            cached = self._cached
            stored = [b for b in dict.fromkeys(stored) if b in cached]
            removed = [b for b in dict.fromkeys(removed) if b not in cached]
        return stored, removed

    def clear(self) -> None:
        """Drop every inactive block (as after a weight update); active blocks stay."""
        while self._inactive_count:
            self._evict_one()
            self.free += 1

    # --- internals -------------------------------------------------------------------------

    def _compact_leaf_heap(self) -> None:
        """Drop stale entries (blocks re-acquired or evicted since they were pushed) so the heap
        stays proportional to the inactive pool on a pool that rarely fills."""
        cached = self._cached
        self._leaf_heap = [
            (tick, block)
            for tick, block in self._leaf_heap
            if (entry := cached.get(block)) is not None and entry.refs == 0 and entry.children == 0 and entry.tick == tick
        ]
        heapq.heapify(self._leaf_heap)

    def _evict_lru(self, count: int) -> None:
        lru = self._inactive_lru
        victims = list(islice(lru, count))  # least recently released first
        # Delete through C-level iteration (popitem(last=False) costs ~1.5 us a block).
        deque(map(lru.__delitem__, victims), maxlen=0)
        deque(map(self._cached.__delitem__, victims), maxlen=0)
        self.removed += victims
        self._inactive_count -= count

    def _evict_leaves(self, count: int) -> None:
        """Evict ``count`` leaves, oldest release first (lineage). Evicting a leaf can make its
        parent a leaf; when the parent's tick is below every other leaf's (a sequence released
        deepest first has consecutive ticks), it goes next without a round trip through the
        heap, so evicting a released sequence costs no heap operation per block."""
        cached = self._cached
        heap = self._leaf_heap
        removed = self.removed
        evicted = 0
        while evicted < count:
            tick, block = heapq.heappop(heap)
            entry = cached.get(block)
            if entry is None or entry.refs or entry.children or entry.tick != tick:
                continue  # stale: re-acquired, re-released or evicted since it was pushed
            floor = tick  # every other leaf's tick is above this
            while True:
                del cached[block]
                removed.append(block)
                evicted += 1
                parent_block = entry.parent
                if parent_block is None:
                    break
                parent = cached[parent_block]  # lineage never evicts a block that has children
                parent.children -= 1
                if parent.children or parent.refs:
                    break
                parent_tick = parent.tick
                if evicted == count or parent_tick > floor + 1:
                    heapq.heappush(heap, (parent_tick, parent_block))
                    break
                # Ticks are unique and every other leaf's is above floor: the parent is next.
                if parent_tick > floor:
                    floor = parent_tick
                block, entry = parent_block, parent
        self._inactive_count -= count

    def _evict_one(self) -> None:
        if self.eviction == "lru":
            block, _ = self._inactive_lru.popitem(last=False)
        else:
            while True:
                tick, block = heapq.heappop(self._leaf_heap)
                entry = self._cached.get(block)
                if entry is not None and entry.refs == 0 and entry.children == 0 and entry.tick == tick:
                    break
        entry = self._cached.pop(block)
        self._inactive_count -= 1
        self.removed.append(block)
        if entry.parent is not None:
            parent = self._cached[entry.parent]  # lineage never evicts a block that has children
            parent.children -= 1
            if parent.children == 0 and parent.refs == 0:
                heapq.heappush(self._leaf_heap, (parent.tick, entry.parent))
