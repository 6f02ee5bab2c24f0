"""vLLM 0.31's host KV pool (`tasim.sim.engine.host_tier`) kept one record per slot, in one
ordered map from key to slot that is the LRU order itself.

It is the plain statement of the rules: the tests hold the engine's `ExtentHostPool` to it, and
Dynamo mocker's linked LRU (`tasim.sim.engine.mocker_host_tier`) to the mocker's recency stated
on it. A walk of a prompt costs a dictionary operation per block, so the engine uses neither it
nor its one-move-per-key recency."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tasim.core.model import BlockHash
from tasim.sim.engine.host_tier import PENDING, HostAccess, HostCopy, HostPool


class HostSlot:
    """One host slot. ``refs``: -1 while the store is in flight, else the loads holding it
    (cpu/policies/base.py). A pinned slot stays in the pool, so a load may hold on to it."""

    __slots__ = ("refs",)

    def __init__(self) -> None:
        self.refs = PENDING


class KeyedHostPool(HostPool):
    """`HostPool` with a slot per key, in LRU rank order, oldest first: a rank is given by moving
    a key to the end (vLLM's ranks only grow, cpu/policies/lru.py), so eviction walks from the
    front."""

    __slots__ = ("_slots",)

    def __init__(self, capacity: int, store_threshold: int = 0, max_tracker_size: int = 64_000) -> None:
        super().__init__(capacity, store_threshold, max_tracker_size)
        self._slots: OrderedDict[BlockHash, HostSlot] = OrderedDict()

    @property
    def resident(self) -> int:
        return len(self._slots)

    def refs(self, key: BlockHash) -> int | None:
        slot = self._slots.get(key)
        return None if slot is None else slot.refs

    def lookup(self, hashes: Sequence[BlockHash], start_block: int, limit_blocks: int) -> tuple[int, bool]:
        slots = self._slots
        hit = 0
        for key in hashes[start_block:limit_blocks]:
            slot = slots.get(key)
            if slot is None:
                break
            if slot.refs:  # its store in flight, or being loaded: deferred either way
                return 0, True
            hit += 1
        return hit, False

    def prepare_load(self, hashes: Sequence[BlockHash], start: int, stop: int, access: HostAccess) -> HostCopy:
        slots = self._slots
        pinned = [slots[key] for key in hashes[start:stop]]
        if any(slot.refs < 0 for slot in pinned):
            raise ValueError("a host block is not ready to load")
        for slot in pinned:
            if slot.refs == 0:
                self._evictable -= 1
            slot.refs += 1
        access.observe(hashes, start, stop, [])
        self.hits += len(pinned)
        return HostCopy(True, hashes, [(start, stop)])

    def complete_load(self, load: HostCopy) -> None:
        slots = self._slots
        for key in load.keys:
            slot = slots[key]
            if slot.refs <= 0:
                raise ValueError("a host block is not being loaded")
            slot.refs -= 1
            if slot.refs == 0:
                self._evictable += 1

    def prepare_store(self, hashes: Sequence[BlockHash], start: int, stop: int, access: HostAccess) -> HostCopy | None:
        keys = hashes[start:stop]
        offers = self._offers
        if offers is not None:
            self._count_offers(offers, keys)
        slots = self._slots
        runs: list[tuple[int, int]] = []
        skipped: list[int] = []
        for depth, key in enumerate(keys, start):
            slot = slots.get(key)
            if slot is None:
                if offers is not None and offers.get(key, 0) < self.store_threshold:
                    skipped.append(depth)
                elif runs and runs[-1][1] == depth:
                    runs[-1] = (runs[-1][0], depth + 1)
                else:
                    runs.append((depth, depth + 1))
            elif slot.refs == PENDING:
                skipped.append(depth)  # another request's store: not observed by this one
        access.observe(hashes, start, stop, skipped)
        store = HostCopy(False, hashes, runs)
        need = store.blocks - self.free
        if need > 0 and (need > self._evictable or not self._evict(need, set(keys))):
            return None
        for key in store.keys:
            slots[key] = HostSlot()
        self._pending += store.blocks
        return store

    def complete_store(self, store: HostCopy) -> None:
        slots = self._slots
        for key in store.keys:
            slot = slots.get(key)
            if slot is None or slot.refs != PENDING:
                continue
            slot.refs = 0
            self._pending -= 1
            self._evictable += 1
            self.stored += 1
            self._note_events([key], True)

    def on_request_finished(self, access: HostAccess) -> None:
        slots = self._slots
        hashes = access.hashes
        unseen = access.unseen
        for start, stop in access.tail_first():
            for depth in range(stop - 1, start - 1, -1):
                key = hashes[depth]
                if depth not in unseen and key in slots:
                    slots.move_to_end(key)
        access.clear()

    def recency(self) -> list[BlockHash]:
        """Every resident key, lowest rank first (for tests and debugging)."""
        return list(self._slots)

    def _drop_slots(self) -> None:
        self._slots.clear()
        self._pending = 0
        self._evictable = 0

    def audit(self) -> str | None:
        if len(self._slots) > self.capacity:
            return f"{len(self._slots)} host slots in use, capacity {self.capacity}"
        pending = sum(1 for slot in self._slots.values() if slot.refs == PENDING)
        evictable = sum(1 for slot in self._slots.values() if slot.refs == 0)
        if (pending, evictable) != (self._pending, self._evictable):
            return f"counted {pending} pending, {evictable} evictable host slots; the pool says {self._pending}, {self._evictable}"
        return None

    def _evict(self, count: int, offered: set[BlockHash]) -> bool:
        """Evict ``count`` evictable slots, lowest rank first, none of ``offered``; all or nothing
        (cpu/policies/lru.py:115-159). False when there are too few."""
        chosen: list[BlockHash] = []
        for key, slot in self._slots.items():
            if slot.refs == 0 and key not in offered:
                chosen.append(key)
                if len(chosen) == count:
                    break
        if len(chosen) < count:
            return False
        for key in chosen:
            del self._slots[key]
        self._note_events(chosen, False)
        self._evictable -= count
        self.evicted += count
        return True
