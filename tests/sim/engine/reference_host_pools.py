"""Reference models of the host KV pools, one record per slot: vLLM 0.31's rules
(`tasim.sim.engine.host_tier`) and Dynamo mocker's recency (`tasim.sim.engine.mocker_host_tier`)
stated block by block, in an ordered map that is the LRU order itself. The engine's extent
pools must agree with them (`test_host_tier_model`, and the scenario tests run on both)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from tasim.core.model import BlockHash
from tasim.sim.engine.host_tier import PENDING, HostAccess, HostCopy


class HostSlot:
    """One host slot. ``refs``: -1 while the store is in flight, else the loads holding it
    (cpu/policies/base.py). A pinned slot stays in the pool, so a load may hold on to it."""

    __slots__ = ("refs",)

    def __init__(self) -> None:
        self.refs = PENDING


class KeyedHostPool:
    """vLLM's host pool (`tasim.sim.engine.host_tier.HostPool`) with a slot per key, in LRU rank
    order, oldest first: a rank is given by moving a key to the end (vLLM's ranks only grow,
    cpu/policies/lru.py), so eviction walks from the front."""

    def __init__(self, capacity: int, store_threshold: int = 0, max_tracker_size: int = 64_000) -> None:
        if capacity <= 0:
            raise ValueError("host capacity must be positive")
        self.capacity = capacity
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.hits = self.stored = self.evicted = 0
        self._pending = self._evictable = 0
        self._offers: OrderedDict[BlockHash, int] | None = OrderedDict() if store_threshold >= 2 else None
        self._stored_keys: list[BlockHash] = []
        self._removed_keys: list[BlockHash] = []
        self._batches: list[tuple[bool, int]] = []
        self._slots: OrderedDict[BlockHash, HostSlot] = OrderedDict()

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def evictable(self) -> int:
        return self._evictable

    @property
    def free(self) -> int:
        return self.capacity - self.resident

    def recency(self) -> list[BlockHash]:
        return list(self._slots)

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

    def reset(self) -> None:
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

    def take_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """KV events since the last call: keys stored (store completed) and keys removed
        (evicted), each key by its latest event, so applying stored then removed is exact."""
        batches = self._batches
        if not batches:
            return [], []
        stored, removed = self._stored_keys, self._removed_keys
        self._stored_keys, self._removed_keys, self._batches = [], [], []
        if len(batches) == 1 or len(set(stored).union(removed)) == len(stored) + len(removed):
            return stored, removed  # the usual case: no key named twice
        # a key evicted and stored again, or stored again after a reset: its latest event counts,
        # and the keys come in the order of their latest events
        latest: dict[BlockHash, bool] = {}
        begin = {True: 0, False: 0}
        for was_stored, end in batches:
            for key in (stored if was_stored else removed)[begin[was_stored] : end]:
                latest.pop(key, None)
                latest[key] = was_stored
            begin[was_stored] = end
        return [key for key, was_stored in latest.items() if was_stored], [key for key, was_stored in latest.items() if not was_stored]

    def _note_events(self, keys: Sequence[BlockHash], stored: bool) -> None:
        log = self._stored_keys if stored else self._removed_keys
        log.extend(keys)
        self._batches.append((stored, len(log)))

    def _count_offers(self, offers: OrderedDict[BlockHash, int], keys: Sequence[BlockHash]) -> None:
        """One more offer of each key; a full table forgets its least recently offered key, never
        one offered now (cpu/manager.py, ``_record_accesses``)."""
        offered_again = 0
        for key in keys:
            if key in offers:
                offers.move_to_end(key)
                offers[key] += 1
                offered_again += 1
        forgettable = len(offers) - offered_again
        for key in keys:
            if key in offers:
                continue
            if len(offers) >= self.max_tracker_size:
                if forgettable == 0:
                    continue
                offers.popitem(last=False)
                forgettable -= 1
            offers[key] = 1

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


class KeyedMockerPool(KeyedHostPool):
    """`tasim.sim.engine.mocker_host_tier.MockerHostPool` one slot per key: the mocker's
    recency as its own words say it, touch by touch."""

    def __init__(self, capacity: int, cohort_order: Mapping[BlockHash, int] | None = None) -> None:
        super().__init__(capacity)
        self.cohort_order = cohort_order

    def touch_prompt(self, hashes: Sequence[BlockHash], prompt_blocks: int) -> None:
        slots = self._slots
        for depth in range(min(prompt_blocks, len(hashes)) - 1, -1, -1):
            slot = slots.get(hashes[depth])
            if slot is not None and slot.refs == 0:
                slots.move_to_end(hashes[depth])

    def complete_store(self, store: HostCopy) -> None:
        super().complete_store(store)
        self._touch_cohort(store.keys)

    def complete_load(self, load: HostCopy) -> None:
        super().complete_load(load)
        self._touch_cohort([key for key in load.keys if self._slots[key].refs == 0])

    def _touch_cohort(self, keys: Sequence[BlockHash]) -> None:
        order = self.cohort_order
        ranked = sorted(keys) if order is None else sorted(keys, key=lambda key: order.get(key, key))
        for key in ranked:
            if key in self._slots:
                self._slots.move_to_end(key)
