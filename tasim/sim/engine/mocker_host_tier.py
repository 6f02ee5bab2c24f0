"""The host tier as Dynamo 1.6.1's mocker simulates vLLM's (AISimulate, aisimulate-core 0.13.0):
the ``dynamo_mocker`` semantics of ``cluster.engine.host_tier``, for comparing tasim with
Dynamo's replay like with like (``validate dynamo``).

Paths cited are AISimulate's: ``tier.rs`` is ``engine/host_offload/tier.rs``, ``adapter.rs``
``engine/scheduler/vllm/host_offload.rs``, ``core.rs`` ``engine/scheduler/vllm/core.rs``.

Residency, pending stores, load pins, eviction (all or nothing, never a block the store offers)
and the copy lanes are vLLM's (`tasim.sim.engine.host_tier`); recency is the mocker's own. Its
LRU holds only ready, unpinned blocks and moves one to the newest end on each *touch*
(``tier.rs``, ``Lru``):

* a completed store touches its blocks, and a completed load those it unpinned, as one cohort
  (``touch_cohort``: one epoch for all, ordered by key inside it);
* looking a request up (at every admission attempt) and preparing a store each touch the
  request's whole prompt, tail first, so its head ends newest (``adapter.rs``, ``lookup`` and
  ``observe_completed_blocks``);
* a request's finish touches nothing (vLLM re-ranks what the request observed then).

Inside a cohort the mocker orders blocks by its sequence hash (a stand-in for vLLM's unordered
Python sets), so which blocks of a cohort are evicted first depends on hash values: given the
order of the mocker's sequence hashes (``cohort_ranks``: for each block, a prompt's blocks'
ranks by depth up to it; `tasim.validation.mocker_hashes` computes them for a replayed trace)
tasim orders them alike, else by its own block hash. A cohort's blocks are consecutive blocks of
one chain, so one look-up of its last block gives all their ranks: a look-up per block, in a map
of every block of a 12,000-request trace, cost a cache miss per block stored (1.2 s of a 5.4 s
replay); and ranks within a prompt are small ints, which a sort compares fast.

The LRU is a doubly linked list through the slots themselves, as the mocker's is, because the
replay touches far more than it stores: on the Mooncake conversation trace (4 workers, 8,192
host blocks each) 12.8 million prompt blocks are visited by touches against 2.2 million stored.
A prompt touched again with nothing moved in between is already in place and costs a comparison
per block, not a move; eviction pops from the oldest end without passing pinned or pending
slots. tests/sim/engine/test_mocker_host_tier_model.py holds it to the plain statement of these
rules, an ordered map from key to slot, on random histories.
"""

from __future__ import annotations

from collections.abc import Sequence

from tasim.core.model import BlockHash
from tasim.sim.engine.host_tier import PENDING, HostAccess, HostCopy, HostPool


class _Slot:
    """One host slot; linked into the LRU (between ``older`` and ``newer``) exactly while it is
    ready and no load pins it (``refs == 0``)."""

    __slots__ = ("key", "refs", "offered", "older", "newer")

    def __init__(self, key: BlockHash) -> None:
        self.key = key
        self.refs = PENDING  # -1 while its store is in flight, else the loads holding it
        self.offered = 0  # the last store preparation that offered it (never evicted by that one)
        self.older = self
        self.newer = self


class MockerHostPool(HostPool):
    """`HostPool` with the recency of Dynamo's mocker (see the module docstring)."""

    __slots__ = ("cohort_ranks", "_slots", "_lru", "_offer", "_spare", "_made")

    def __init__(
        self,
        capacity: int,
        store_threshold: int = 0,
        max_tracker_size: int = 64_000,
        cohort_ranks: dict[BlockHash, tuple[int, ...]] | None = None,
    ) -> None:
        super().__init__(capacity, store_threshold, max_tracker_size)
        self.cohort_ranks = cohort_ranks  # block -> ranks of a prompt's blocks by depth, up to it
        self._slots: dict[BlockHash, _Slot] = {}
        self._lru = _Slot(0)  # the list's sentinel: its ``newer`` is the oldest slot, its ``older`` the newest
        self._offer = 0  # numbers store preparations, for `_Slot.offered`
        self._spare: list[_Slot] = []  # evicted slots, for the next stores to reuse (a replay evicts millions)
        self._made: dict[HostCopy, list[_Slot]] = {}  # each store in flight -> the slots it made, in cohort order

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

    def touch_prompt(self, hashes: Sequence[BlockHash], prompt_blocks: int, pending: Sequence[tuple[int, int]] = ()) -> None:
        """Touch the ready, unpinned blocks among the first ``prompt_blocks`` of ``hashes``, tail
        first (``adapter.rs``: ``for key in prompt_keys.iter().rev() { tier.touch(key) }``).
        ``pending``: depth ranges, ascending and disjoint, known to be pending (the request's own
        stores in flight, 3.6 of the 12.8 million blocks a Mooncake replay's touches visit), so
        not looked up.

        The same order is built head first: the prompt's blocks end as the newest run of the
        list, head newest, so each block goes just older than the one before it, where it often
        already is."""
        lru = self._lru
        place = lru  # the next block goes just older than this
        count = min(prompt_blocks, len(hashes))
        depth = 0
        while depth < count:  # the head already in place, found by following the list alone
            slot = place.older
            if slot is lru or slot.key != hashes[depth]:
                break
            place = slot
            depth += 1
        slots = self._slots
        for skip_start, skip_stop in (*pending, (count, count)):
            for key in hashes[depth : min(skip_start, count)]:
                found = slots.get(key)
                if found is None or found.refs != 0:
                    continue
                if found is not place.older:
                    _unlink(found)
                    _link_older_than(place, found)
                place = found
            if skip_stop > depth:
                depth = skip_stop

    def prepare_load(self, hashes: Sequence[BlockHash], start: int, stop: int, access: HostAccess) -> HostCopy:
        """Pin the blocks, taking them out of the LRU until their loads complete (the mocker
        records no access: a request's finish re-ranks nothing)."""
        slots = self._slots
        pinned = [slots[key] for key in hashes[start:stop]]
        if any(slot.refs < 0 for slot in pinned):
            raise ValueError("a host block is not ready to load")
        for slot in pinned:
            if slot.refs == 0:
                _unlink(slot)
                self._evictable -= 1
            slot.refs += 1
        self.hits += len(pinned)
        return HostCopy(True, hashes, [(start, stop)])

    def complete_load(self, load: HostCopy) -> None:
        """Unpinned; those no other load holds are touched as one cohort (``tier.rs``:
        ``release_load_pins``)."""
        slots = self._slots
        cohort: list[_Slot] = []
        depths: list[int] = []
        ((start, stop),) = load.runs
        for depth in range(start, stop):
            slot = slots[load.hashes[depth]]
            if slot.refs <= 0:
                raise ValueError("a host block is not being loaded")
            slot.refs -= 1
            if slot.refs == 0:
                self._evictable += 1
                cohort.append(slot)
                depths.append(depth)
        lru = self._lru
        for slot in self._in_cohort_order(cohort, depths, load.hashes):
            _link_older_than(lru, slot)

    def prepare_store(self, hashes: Sequence[BlockHash], start: int, stop: int, access: HostAccess) -> HostCopy | None:
        keys = hashes[start:stop]
        offers = self._offers
        if offers is not None:
            self._count_offers(offers, keys)
        slots = self._slots
        self._offer = offer = self._offer + 1
        runs: list[tuple[int, int]] = []
        run_start = run_stop = start
        depth = start
        offered_evictable = 0
        for key in keys:
            slot = slots.get(key)
            if slot is not None:
                slot.offered = offer
                if slot.refs == 0:
                    offered_evictable += 1
            elif offers is None or offers.get(key, 0) >= self.store_threshold:
                if depth != run_stop:
                    if run_stop > run_start:
                        runs.append((run_start, run_stop))
                    run_start = depth
                run_stop = depth + 1
            depth += 1
        if run_stop > run_start:
            runs.append((run_start, run_stop))
        store = HostCopy(False, hashes, runs)
        need = store.blocks - self.free
        if need > 0:
            if need > self._evictable - offered_evictable:
                return None
            self._evict(need, offer)
        spare = self._spare
        made: list[_Slot] = []
        depths: list[int] = []
        for run_start, run_stop in runs:
            for depth in range(run_start, run_stop):
                key = hashes[depth]
                if spare:
                    slot = spare.pop()
                    slot.key = key
                    slot.refs = PENDING
                else:
                    slot = _Slot(key)
                slots[key] = slot
                made.append(slot)
                depths.append(depth)
        if made:
            self._made[store] = self._in_cohort_order(made, depths, hashes)
        self._pending += store.blocks
        return store

    def complete_store(self, store: HostCopy) -> None:
        """Ready, and touched as one cohort (``tier.rs``: ``tick``, ``touch_cohort``). A store
        dropped by `reset` is ignored."""
        made = self._made.pop(store, None)
        if made is None:
            return
        for slot in made:
            slot.refs = 0  # pending until now: nothing evicts or loads a pending slot
        self._pending -= len(made)
        self._evictable += len(made)
        self.stored += len(made)
        self._note_events(store.keys, True)  # in the order of the chain
        lru = self._lru
        for slot in made:
            _link_older_than(lru, slot)

    def on_request_finished(self, access: HostAccess) -> None:
        """The mocker re-ranks nothing when a request finishes."""
        access.clear()

    def recency(self) -> list[BlockHash]:
        """The LRU, oldest first: every ready, unpinned key (pinned and pending slots have no
        place in it until they are touched)."""
        keys: list[BlockHash] = []
        slot = self._lru.newer
        while slot is not self._lru:
            keys.append(slot.key)
            slot = slot.newer
        return keys

    def _drop_slots(self) -> None:
        self._slots.clear()
        self._spare.clear()
        self._made.clear()
        self._lru.older = self._lru.newer = self._lru
        self._pending = 0
        self._evictable = 0

    def audit(self) -> str | None:
        slots = self._slots
        if len(slots) > self.capacity:
            return f"{len(slots)} host slots in use, capacity {self.capacity}"
        pending = sum(1 for slot in slots.values() if slot.refs == PENDING)
        evictable = sum(1 for slot in slots.values() if slot.refs == 0)
        if (pending, evictable) != (self._pending, self._evictable):
            return f"counted {pending} pending, {evictable} evictable host slots; the pool says {self._pending}, {self._evictable}"
        linked = 0
        slot = self._lru
        while slot.newer is not self._lru:
            if slot.newer.older is not slot:
                return f"the host LRU's links disagree at key {slot.newer.key}"
            slot = slot.newer
            if slot.refs != 0 or slots.get(slot.key) is not slot:
                return f"host key {slot.key} is in the LRU but not a ready, unpinned slot"
            linked += 1
        if linked != evictable:
            return f"{linked} slots in the host LRU, {evictable} ready and unpinned"
        return None

    def _in_cohort_order(self, cohort: list[_Slot], depths: list[int], hashes: Sequence[BlockHash]) -> list[_Slot]:
        """The slots of a cohort (those of blocks ``depths`` of the chain ``hashes``, ascending)
        in the order the mocker touches them: by the ranks of the blocks' sequence hashes where
        known, else by key."""
        if len(cohort) < 2:
            return cohort
        known = self.cohort_ranks
        ranks = None if known is None else known.get(hashes[depths[-1]])
        if ranks is None or len(ranks) <= depths[-1]:
            return sorted(cohort, key=_key)
        width = len(cohort)
        # rank and position in one small int: sorted without a key function, compared in C
        order = sorted([ranks[depth] * width + position for position, depth in enumerate(depths)])
        return [cohort[code % width] for code in order]

    def _evict(self, count: int, offer: int) -> None:
        """Evict the ``count`` oldest slots of the LRU that store preparation ``offer`` did not
        offer (vLLM's cpu/policies/lru.py:115-159; the caller made sure there are so many)."""
        lru = self._lru
        slots = self._slots
        spare = self._spare
        keys: list[BlockHash] = []
        slot = lru.newer
        while len(keys) < count:
            following = slot.newer
            if slot.offered != offer:
                _unlink(slot)
                del slots[slot.key]
                keys.append(slot.key)
                spare.append(slot)
            slot = following
        self._note_events(keys, False)
        self._evictable -= count
        self.evicted += count


def _key(slot: _Slot) -> BlockHash:
    return slot.key


def _unlink(slot: _Slot) -> None:
    slot.older.newer = slot.newer
    slot.newer.older = slot.older


def _link_older_than(place: _Slot, slot: _Slot) -> None:
    """Link ``slot`` in just older than ``place`` (the newest end when ``place`` is the sentinel)."""
    older = place.older
    slot.older = older
    slot.newer = place
    older.newer = slot
    place.older = slot


def mocker_host_hit(gpu_tokens: int, host_blocks: int, num_tokens: int, block_size: int) -> tuple[int, int]:
    """`tasim.sim.engine.host_tier.host_hit` as the mocker counts it: the same tokens loaded, but
    a load that completes the whole prompt (or all but a partial block) leaves the last full
    block to compute, as a GPU prefix hit does (AISimulate adapter.rs, ``freeze_activated_cost``,
    then the prefill cost's cap)."""
    hit = min(num_tokens, (gpu_tokens // block_size + host_blocks) * block_size) - gpu_tokens
    if hit < block_size:
        return 0, gpu_tokens
    return hit, min(gpu_tokens + hit, (num_tokens - 1) // block_size * block_size)
