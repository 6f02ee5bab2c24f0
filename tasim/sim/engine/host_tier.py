"""Host (CPU) KV tier of one engine: vLLM 0.31's native CPU offloading at one GPU block per chunk.

Paths cited below are in vLLM 0.31's installed package: ``connector/`` is
``vllm/distributed/kv_transfer/kv_connector/v1/offloading/``, ``cpu/`` is ``vllm/v1/kv_offload/cpu/``.

`HostPool` is the scheduler side of vLLM's OffloadingConnector with its CPUOffloadingManager and
LRU policy, at ``blocks_per_chunk = 1`` (vLLM's default): one host slot per GPU block, keyed by
the block's hash. A slot is *pending* while its store is in flight (not readable, not evictable),
then *ready*: evictable when no load holds it, pinned while loads do. A load leaves the host copy
in place. What a scheduler does with it, per step, as the connector does:

1. At admission of a request with nothing computed, after its GPU prefix of ``g`` blocks:
   ``lookup(hashes, g, num_tokens // block_size)`` gives the host blocks that follow; deferred
   means try this request again next step. `host_hit` turns the blocks into tokens; a hit pins
   them with `prepare_load` (one H2D job; `complete_load` when it is done) and the request's
   stores start after the loaded prefix.
2. After scheduling, for every scheduled request and every request finished since the last
   step: ``prepare_store(hashes, next_store, full prompt blocks computed by the end of the step,
   access)``; None means nothing was stored and the same range is offered again next step,
   otherwise the range is done and the returned keys are one D2H job (`complete_store`).
3. When a request finishes, after its last `prepare_store`: ``on_request_finished(access)``. vLLM
   does this in the step after the request finished, once that step's stores are prepared
   (connector/scheduler.py:1818-1827), so they evict by the ranks from before the re-ranking.

`TransferLane` times the jobs: one FIFO copy lane per direction.

Recency is vLLM's: an LRU rank at insertion, and once more when a request finishes for every
key it observed (loaded, newly stored, or re-offered while ready), tail first so the head of the
prefix ends newest. Lookups do not touch. Eviction takes the lowest rank among the evictable
slots, never one the current store offers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tasim.core.model import BlockHash

_PENDING = -1  # ChunkStatus.ref_cnt of a chunk whose store is in flight (cpu/policies/base.py:25-45)


class TransferLane:
    """One copy direction (D2H or H2D): transfers run one at a time in the order submitted, as
    Dynamo's mocker and vLLM's offloading worker both serialise them per direction.
    ``gb_per_s`` is decimal (1e9 bytes per second); 0 or None copies instantly (Dynamo's
    ``0 = unlimited``)."""

    __slots__ = ("bytes_per_s", "tail_s", "busy_s", "bytes_moved")

    def __init__(self, gb_per_s: float | None) -> None:
        if gb_per_s is not None and gb_per_s < 0:
            raise ValueError("bandwidth must not be negative")
        self.bytes_per_s = gb_per_s * 1e9 if gb_per_s else 0.0
        self.tail_s = 0.0  # when the last submitted transfer is done
        self.busy_s = 0.0  # total time spent copying
        self.bytes_moved = 0

    def submit(self, enter_s: float, nbytes: int) -> float:
        """Queue ``nbytes`` that are ready to copy at ``enter_s``; returns when they are copied."""
        seconds = nbytes / self.bytes_per_s if self.bytes_per_s else 0.0
        self.tail_s = max(enter_s, self.tail_s) + seconds
        self.busy_s += seconds
        self.bytes_moved += nbytes
        return self.tail_s


class HostAccess:
    """The host keys one request observed: what vLLM's manager records per request
    (cpu/manager.py, ``_RequestCacheAccess``) to re-rank them, head to tail, when the request
    finishes. The scheduler keeps one per request and passes it to the pool.

    Kept as depth ranges of the request's chain, not key by key: a request loads and offers
    consecutive blocks, so its observed keys are a few ranges, less the rare depths a call
    skipped (another request's store in flight, or a key under the store threshold)."""

    __slots__ = ("hashes", "spans", "unseen")

    def __init__(self) -> None:
        self.hashes: Sequence[BlockHash] = ()
        self.spans: list[tuple[int, int]] = []  # depth ranges [start, stop) loaded or offered, in call order
        self.unseen: set[int] = set()  # depths inside the spans that no call observed

    def observe(self, hashes: Sequence[BlockHash], start: int, stop: int, skipped: list[int]) -> None:
        """Blocks ``start`` to ``stop`` of ``hashes`` observed, except the depths ``skipped``."""
        self.hashes = hashes
        unseen = self.unseen
        if unseen:  # observed now, though an earlier call skipped it
            for depth in [depth for depth in unseen if start <= depth < stop and depth not in skipped]:
                unseen.discard(depth)
        for depth in skipped:
            if not self._covered(depth):
                unseen.add(depth)
        spans = self.spans
        if spans and spans[-1][0] == start and spans[-1][1] <= stop:
            spans[-1] = (start, stop)  # offered again (it did not fit): one span, however often
        else:
            spans.append((start, stop))

    def _covered(self, depth: int) -> bool:
        return any(start <= depth < stop for start, stop in self.spans)

    def tail_first(self) -> list[tuple[int, int]]:
        """The spans merged into disjoint ranges, deepest first."""
        merged: list[tuple[int, int]] = []
        for start, stop in sorted(self.spans):
            if merged and start <= merged[-1][1]:
                if stop > merged[-1][1]:
                    merged[-1] = (merged[-1][0], stop)
            else:
                merged.append((start, stop))
        merged.reverse()
        return merged

    def clear(self) -> None:
        self.hashes = ()
        self.spans = []
        self.unseen = set()


class HostSlot:
    """One host slot. ``refs``: -1 while the store is in flight, else the loads holding it
    (cpu/policies/base.py). A pinned slot stays in the pool, so a load may hold on to it."""

    __slots__ = ("refs",)

    def __init__(self) -> None:
        self.refs = _PENDING


class _Hit:
    """A `HostPool.lookup` that found no block in flight, kept while nothing disturbs it: its
    arguments, the slots of its hit and their keys, and the key after them (None at the limit).
    Only an eviction of one of its keys, a load pinning one, or a store of the key after them
    changes what the same lookup finds (stores completing and loads ending touch no ready slot)."""

    __slots__ = ("hashes", "start", "limit", "slots", "keys", "miss")

    def __init__(self, hashes: Sequence[BlockHash], start: int, limit: int, slots: list[HostSlot]) -> None:
        stop = start + len(slots)
        self.hashes = hashes
        self.start = start
        self.limit = limit
        self.slots = slots
        self.keys = set(hashes[start:stop])
        self.miss: BlockHash | None = hashes[stop] if stop < limit else None


# Hits kept at most: the requests a scan of the queue looks up step after step.
_KEPT_HITS = 16


class HostPool:
    """Host KV slots with vLLM 0.31's CPUOffloadingManager semantics (cpu/manager.py) and its LRU
    policy (cpu/policies/lru.py), one slot per GPU block.

    ``store_threshold`` (vLLM's ``store_threshold``, cpu/manager.py:250-274): below 2 every new
    key offered is stored; from 2 a key is stored only at its N-th offer, offers counted over the
    ``max_tracker_size`` most recently offered keys."""

    __slots__ = (
        "capacity",
        "store_threshold",
        "max_tracker_size",
        "hits",
        "stored",
        "evicted",
        "_slots",
        "_pending",
        "_evictable",
        "_offers",
        "_events",
        "_hits",
        "_deferred",
    )

    def __init__(self, capacity: int, store_threshold: int = 0, max_tracker_size: int = 64_000) -> None:
        if capacity <= 0:
            raise ValueError("host capacity must be positive")
        self.capacity = capacity
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.hits = 0  # blocks handed to loads
        self.stored = 0  # blocks whose store completed
        self.evicted = 0
        # In LRU rank order, oldest first: a rank is given by moving a key to the end (vLLM's
        # ranks only grow, cpu/policies/lru.py), so eviction walks from the front.
        self._slots: OrderedDict[BlockHash, HostSlot] = OrderedDict()
        self._pending = 0
        self._evictable = 0
        # Offer counts, least recently offered first; only with a threshold (cpu/manager.py:84-87).
        self._offers: OrderedDict[BlockHash, int] | None = OrderedDict() if store_threshold >= 2 else None
        # KV events since the last drain: key -> stored (else removed), in the order of each key's last event.
        self._events: dict[BlockHash, bool] = {}
        # Lookups kept while nothing disturbs them (`_Hit`), by their chain's identity: a queue's
        # head that waits for GPU blocks is looked up again every step, and the load that follows
        # a hit pins its slots without looking each key up again. A deferred lookup is kept only
        # while no slot changes at all.
        self._hits: dict[int, _Hit] = {}
        self._deferred: tuple[Sequence[BlockHash], int, int] | None = None

    def reset(self) -> None:
        """Drop every slot, as vLLM's ``reset_cache`` does when its prefix cache is reset with the
        connector's after a weight update (cpu/manager.py:422-433): no KV event for the slots
        dropped (the manager emits none), events already drained stay, offer counts stay."""
        self._slots.clear()
        self._pending = 0
        self._evictable = 0
        self._hits.clear()
        self._deferred = None

    # --- queries ---------------------------------------------------------------------------

    @property
    def resident(self) -> int:
        """Slots in use, ready or pending."""
        return len(self._slots)

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def evictable(self) -> int:
        return self._evictable

    @property
    def free(self) -> int:
        return self.capacity - len(self._slots)

    def refs(self, key: BlockHash) -> int | None:
        """-1 while the store is in flight, else the loads holding it; None when not resident."""
        slot = self._slots.get(key)
        return None if slot is None else slot.refs

    def lookup(self, hashes: Sequence[BlockHash], start_block: int, limit_blocks: int) -> tuple[int, bool]:
        """Blocks resident and ready from ``start_block`` on (below ``limit_blocks``: the request's
        full blocks, as vLLM caps the hit at ``num_tokens``), and whether the request must be
        looked up again next step instead. It must when the run of resident blocks holds one whose
        store is in flight, or one another request is loading (connector/scheduler.py:671-703,
        :909-940); then the hit is 0. A load pins its blocks, so pinned means being loaded.

        A lookup repeated while nothing disturbed it answers as before (see `_Hit`)."""
        hit_before = self._hits.get(id(hashes))
        if hit_before is not None and hit_before.hashes is hashes and hit_before.start == start_block and hit_before.limit == limit_blocks:
            return len(hit_before.slots), False
        deferred = self._deferred
        if deferred is not None and deferred[0] is hashes and deferred[1] == start_block and deferred[2] == limit_blocks:
            return 0, True
        slots = self._slots
        hit: list[HostSlot] = []
        for key in hashes[start_block:limit_blocks]:  # a slice: no index object per block
            slot = slots.get(key)
            if slot is None:
                break
            if slot.refs:  # its store in flight, or being loaded: deferred either way
                self._deferred = (hashes, start_block, limit_blocks)
                return 0, True
            hit.append(slot)
        hits = self._hits
        if len(hits) >= _KEPT_HITS:
            hits.clear()
        hits[id(hashes)] = _Hit(hashes, start_block, limit_blocks, hit)
        return len(hit), False

    # --- loads -----------------------------------------------------------------------------

    def prepare_load(self, hashes: Sequence[BlockHash], start: int, stop: int, access: HostAccess) -> list[BlockHash]:
        """Pin blocks ``start`` to ``stop`` of ``hashes`` (all ready: a `lookup` hit) for a load;
        returns their keys for `complete_load` (cpu/manager.py, ``prepare_load``)."""
        self.pin_slots(hashes, start, stop, access)
        return list(hashes[start:stop])

    def pin_slots(self, hashes: Sequence[BlockHash], start: int, stop: int, access: HostAccess) -> list[HostSlot]:
        """`prepare_load`, returning the pinned slots themselves for `unpin_slots`."""
        hits = self._hits
        hit_before = hits.get(id(hashes))
        if hit_before is not None and hit_before.hashes is hashes and hit_before.start == start and len(hit_before.slots) >= stop - start:
            pinned = hit_before.slots[: stop - start]  # the lookup's hit, undisturbed since
        else:
            slots = self._slots
            pinned = [slots[key] for key in hashes[start:stop]]
        self._deferred = None
        if hits and stop > start:
            # Pinned keys are the blocks start..stop of a chain; a kept hit's keys are a depth
            # range of its own chain. Chained hashes: two chains share a block only if they
            # agree at the top of the depths both ranges cover.
            for ident, kept in list(hits.items()):
                top = start if start > kept.start else kept.start
                if top < stop and top < kept.start + len(kept.slots) and kept.hashes[top] == hashes[top]:
                    del hits[ident]
        for slot in pinned:
            if slot.refs < 0:
                raise ValueError("a host block is not ready to load")
            if slot.refs == 0:
                self._evictable -= 1
            slot.refs += 1
        access.observe(hashes, start, stop, [])
        self.hits += len(pinned)
        return pinned

    def complete_load(self, keys: Sequence[BlockHash]) -> None:
        """The load is done: unpin. The host copy stays (cpu/manager.py:231-241)."""
        slots = self._slots
        self.unpin_slots([slots[key] for key in keys])

    def unpin_slots(self, pinned: list[HostSlot]) -> None:
        """`complete_load` of slots `pin_slots` returned."""
        self._deferred = None
        for slot in pinned:
            if slot.refs <= 0:
                raise ValueError("a host block is not being loaded")
            slot.refs -= 1
            if slot.refs == 0:
                self._evictable += 1

    # --- stores ----------------------------------------------------------------------------

    def prepare_store(self, hashes: Sequence[BlockHash], start: int, stop: int, access: HostAccess) -> list[BlockHash] | None:
        """Offer blocks ``start`` to ``stop`` of ``hashes`` (cpu/manager.py:244-355). Blocks already
        resident are not stored again; the ready ones count as observed by the request. The new
        ones become pending slots, returned for `complete_store` (empty when there are none).
        None when they do not fit even after evicting every evictable slot not offered here:
        then nothing changes and the caller offers the range again next step
        (connector/scheduler.py:1663-1671)."""
        keys = hashes[start:stop]
        offers = self._offers
        if offers is not None:
            self._count_offers(offers, keys)
        slots = self._slots
        new: list[BlockHash] = []
        skipped: list[int] = []
        depth = start
        for key in keys:
            slot = slots.get(key)
            if slot is None:
                if offers is not None and offers.get(key, 0) < self.store_threshold:
                    skipped.append(depth)
                else:
                    new.append(key)
            elif slot.refs == _PENDING:
                skipped.append(depth)  # another request's store: not observed by this one
            depth += 1
        access.observe(hashes, start, stop, skipped)
        if not new:
            return new
        need = len(new) - self.free
        evicted: list[BlockHash] = []
        if need > 0:
            if need > self._evictable:
                return None
            chosen = self._evict(need, set(keys))
            if chosen is None:
                return None
            evicted = chosen
        self._deferred = None
        if self._hits:
            self._disturb(evicted, new)
        for key in new:
            slots[key] = HostSlot()
        self._pending += len(new)
        return new

    def complete_store(self, keys: Sequence[BlockHash]) -> None:
        """The store is done: the slots become ready and evictable (cpu/manager.py:358-390)."""
        slots = self._slots
        events = self._events
        for key in keys:
            slot = slots.get(key)
            if slot is None or slot.refs != _PENDING:
                continue
            self._deferred = None
            slot.refs = 0
            self._pending -= 1
            self._evictable += 1
            self.stored += 1
            events.pop(key, None)
            events[key] = True

    # --- recency and events ----------------------------------------------------------------

    def on_request_finished(self, access: HostAccess) -> None:
        """Re-rank every resident key the request observed, tail first, so its head ends newest
        (cpu/manager.py:393-419, cpu/policies/lru.py:96-113). Pinned and pending slots take the
        rank too and keep it for when they become evictable. Clears ``access``."""
        slots = self._slots
        hashes = access.hashes
        unseen = access.unseen
        for start, stop in access.tail_first():
            if unseen:
                for depth in range(stop - 1, start - 1, -1):
                    key = hashes[depth]
                    if depth not in unseen and key in slots:
                        slots.move_to_end(key)
                continue
            keys = list(hashes[start:stop])
            keys.reverse()
            for key in keys:
                # one lookup, not two (a key evicted since it was observed is rare); a context
                # manager per block would cost more than the lookup saved
                try:  # noqa: SIM105
                    slots.move_to_end(key)
                except KeyError:
                    pass
        access.clear()

    def take_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """KV events since the last call: keys stored (store completed) and keys removed
        (evicted), each key by its latest event, so applying stored then removed is exact."""
        events = self._events
        self._events = {}
        return [key for key, stored in events.items() if stored], [key for key, stored in events.items() if not stored]

    def audit(self) -> str | None:
        """The first broken invariant of the bookkeeping, or None."""
        if len(self._slots) > self.capacity:
            return f"{len(self._slots)} host slots in use, capacity {self.capacity}"
        pending = sum(1 for slot in self._slots.values() if slot.refs == _PENDING)
        evictable = sum(1 for slot in self._slots.values() if slot.refs == 0)
        if (pending, evictable) != (self._pending, self._evictable):
            return f"counted {pending} pending, {evictable} evictable host slots; the pool says {self._pending}, {self._evictable}"
        return None

    # --- internals -------------------------------------------------------------------------

    def _evict(self, count: int, offered: set[BlockHash]) -> list[BlockHash] | None:
        """Evict ``count`` evictable slots, lowest rank first, none of ``offered``; all or nothing
        (cpu/policies/lru.py:115-159). Returns their keys, or None when there are too few."""
        chosen: list[BlockHash] = []
        for key, slot in self._slots.items():
            if slot.refs == 0 and key not in offered:
                chosen.append(key)
                if len(chosen) == count:
                    break
        if len(chosen) < count:
            return None
        slots = self._slots
        events = self._events
        for key in chosen:
            del slots[key]
            events.pop(key, None)
            events[key] = False
        self._evictable -= count
        self.evicted += count
        return chosen

    def _disturb(self, evicted: list[BlockHash], stored: list[BlockHash]) -> None:
        """Forget the kept hits that an eviction or a new store changes (see `_Hit`)."""
        hits = self._hits
        stored_keys = set(stored)
        for ident, kept in list(hits.items()):
            if (kept.miss is not None and kept.miss in stored_keys) or not kept.keys.isdisjoint(evicted):
                del hits[ident]

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


def host_hit(gpu_tokens: int, host_blocks: int, num_tokens: int, block_size: int) -> tuple[int, int]:
    """vLLM's arithmetic for a host hit of ``host_blocks`` (from `HostPool.lookup`) after a GPU
    prefix of ``gpu_tokens`` (block-aligned, at most ``num_tokens - 1``): the tokens to load and
    the tokens computed once the load is done. The hit is capped at ``num_tokens`` (not ``- 1``)
    and is 0 under one chunk (connector/scheduler.py:772-821); a load that completes the whole
    prompt leaves its last token to compute (``_update_waiting_for_remote_kv``,
    vllm/v1/core/sched/scheduler.py:3052-3097)."""
    hit = min(num_tokens, (gpu_tokens // block_size + host_blocks) * block_size) - gpu_tokens
    if hit < block_size:
        return 0, gpu_tokens
    return hit, min(gpu_tokens + hit, num_tokens - 1)
