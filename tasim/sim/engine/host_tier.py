"""Host (CPU) KV tier of one engine: vLLM 0.31's native CPU offloading at one GPU block per chunk.

Paths cited below are in vLLM 0.31's installed package: ``connector/`` is
``vllm/distributed/kv_transfer/kv_connector/v1/offloading/``, ``cpu/`` is ``vllm/v1/kv_offload/cpu/``.

A host pool is the scheduler side of vLLM's OffloadingConnector with its CPUOffloadingManager
and LRU policy, at ``blocks_per_chunk = 1`` (vLLM's default): one host slot per GPU block, keyed
by the block's hash. A slot is *pending* while its store is in flight (not readable, not
evictable), then *ready*: evictable when no load holds it, pinned while loads do. A load leaves
the host copy in place. What a scheduler does with it, per step, as the connector does:

1. At admission of a request with nothing computed, after its GPU prefix of ``g`` blocks:
   ``lookup(hashes, g, num_tokens // block_size)`` gives the host blocks that follow; deferred
   means try this request again next step. `host_hit` turns the blocks into tokens; a hit pins
   them with `HostPool.prepare_load` (one H2D job, a `HostCopy`; `HostPool.complete_load` when it
   is done) and the request's stores start after the loaded prefix.
2. After scheduling, for every scheduled request and every request finished since the last
   step: ``prepare_store(hashes, next_store, full prompt blocks computed by the end of the step,
   access)``; None means nothing was stored and the same range is offered again next step,
   otherwise the range is done and the returned `HostCopy` is one D2H job
   (`HostPool.complete_store`).
3. When a request finishes, after its last `prepare_store`: ``on_request_finished(access)``. vLLM
   does this in the step after the request finished, once that step's stores are prepared
   (connector/scheduler.py:1818-1827), so they evict by the ranks from before the re-ranking.

`TransferLane` times the jobs: one FIFO copy lane per direction.

Recency is vLLM's: an LRU rank at insertion, and once more when a request finishes for every
key it observed (loaded, newly stored, or re-offered while ready), tail first so the head of the
prefix ends newest. Lookups do not touch. Eviction takes the lowest rank among the evictable
slots, never one the current store offers.

`ExtentHostPool` is the engine's pool; `tasim.sim.engine.keyed_host_pool.KeyedHostPool` keeps the
same rules one record per slot (the tests hold the two alike).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence

from tasim.core.model import BlockHash, shared_prefix_end

PENDING = -1  # ChunkStatus.ref_cnt of a chunk whose store is in flight (cpu/policies/base.py:25-45)


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
        if len(self.spans) == 1:  # the usual request: its prompt offered from one block on
            return self.spans
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


class HostCopy:
    """One copy job's blocks: depth ranges ``runs`` of the chain ``hashes`` (a load's are one
    range), ``blocks`` in all. ``load``: H2D, else a store (D2H)."""

    __slots__ = ("load", "hashes", "runs", "blocks", "_keys")

    def __init__(self, load: bool, hashes: Sequence[BlockHash], runs: list[tuple[int, int]]) -> None:
        self.load = load
        self.hashes = hashes
        self.runs = runs
        self.blocks = sum(stop - start for start, stop in runs)
        self._keys: list[BlockHash] | None = None

    @property
    def keys(self) -> list[BlockHash]:
        """Its blocks' keys, in order (built when first asked: the engine's pool never needs
        them, but a store in flight is asked at every step that evicts from the GPU)."""
        keys = self._keys
        if keys is None:
            keys = self._keys = [key for start, stop in self.runs for key in self.hashes[start:stop]]
        return keys


class HostPool:
    """A host tier's slots under vLLM 0.31's rules (see the module docstring): what every
    representation of them counts and reports alike.

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
        "_pending",
        "_evictable",
        "_offers",
        "_stored_keys",
        "_removed_keys",
        "_batches",
        "_reset_since_drain",
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
        self._pending = 0
        self._evictable = 0
        # Offer counts, least recently offered first; only with a threshold (cpu/manager.py:84-87).
        self._offers: OrderedDict[BlockHash, int] | None = OrderedDict() if store_threshold >= 2 else None
        # KV events since the last drain, in the order they happened, and the batches they came
        # in: whether stored, and the length of that list after the batch.
        self._stored_keys: list[BlockHash] = []
        self._removed_keys: list[BlockHash] = []
        self._batches: list[tuple[bool, int]] = []
        self._reset_since_drain = False  # a reset drops slots without events: a key may then be stored twice

    # --- queries ---------------------------------------------------------------------------

    @property
    def resident(self) -> int:
        """Slots in use, ready or pending."""
        raise NotImplementedError

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def evictable(self) -> int:
        return self._evictable

    @property
    def free(self) -> int:
        return self.capacity - self.resident

    def refs(self, key: BlockHash) -> int | None:
        """-1 while the store is in flight, else the loads holding it; None when not resident."""
        raise NotImplementedError

    def lookup(self, hashes: Sequence[BlockHash], start_block: int, limit_blocks: int) -> tuple[int, bool]:
        """Blocks resident and ready from ``start_block`` on (below ``limit_blocks``: the request's
        full blocks, as vLLM caps the hit at ``num_tokens``), and whether the request must be
        looked up again next step instead. It must when the run of resident blocks holds one whose
        store is in flight, or one another request is loading (connector/scheduler.py:671-703,
        :909-940); then the hit is 0. A load pins its blocks, so pinned means being loaded."""
        raise NotImplementedError

    # --- copies ----------------------------------------------------------------------------

    def prepare_load(self, hashes: Sequence[BlockHash], start: int, stop: int, access: HostAccess) -> HostCopy:
        """Pin blocks ``start`` to ``stop`` of ``hashes`` (all ready: a `lookup` hit) for one load
        (cpu/manager.py, ``prepare_load``)."""
        raise NotImplementedError

    def complete_load(self, load: HostCopy) -> None:
        """The load is done: unpin. The host copy stays (cpu/manager.py:231-241)."""
        raise NotImplementedError

    def prepare_store(self, hashes: Sequence[BlockHash], start: int, stop: int, access: HostAccess) -> HostCopy | None:
        """Offer blocks ``start`` to ``stop`` of ``hashes`` (cpu/manager.py:244-355). Blocks already
        resident are not stored again; the ready ones count as observed by the request. The new
        ones become pending slots, returned as one store (without keys when there are none).
        None when they do not fit even after evicting every evictable slot not offered here:
        then nothing changes and the caller offers the range again next step
        (connector/scheduler.py:1663-1671)."""
        raise NotImplementedError

    def complete_store(self, store: HostCopy) -> None:
        """The store is done: its slots still pending become ready and evictable
        (cpu/manager.py:358-390)."""
        raise NotImplementedError

    def on_request_finished(self, access: HostAccess) -> None:
        """Re-rank every resident key the request observed, tail first, so its head ends newest
        (cpu/manager.py:393-419, cpu/policies/lru.py:96-113). Pinned and pending slots take the
        rank too and keep it for when they become evictable. Clears ``access``."""
        raise NotImplementedError

    def reset(self) -> None:
        """Drop every slot, as vLLM's ``reset_cache`` does when its prefix cache is reset with the
        connector's after a weight update (cpu/manager.py:422-433): no KV event for the slots
        dropped (the manager emits none), events already drained stay, offer counts stay."""
        self._reset_since_drain = True
        self._drop_slots()

    def _drop_slots(self) -> None:
        raise NotImplementedError

    def audit(self) -> str | None:
        """The first broken invariant of the bookkeeping, or None."""
        raise NotImplementedError

    def recency(self) -> list[BlockHash]:
        """Every resident key, lowest rank first (for tests and debugging)."""
        raise NotImplementedError

    # --- shared bookkeeping ----------------------------------------------------------------

    def take_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """KV events since the last call: keys stored (store completed) and keys removed
        (evicted), each key by its latest event, so applying stored then removed is exact."""
        batches = self._batches
        if not batches:
            return [], []
        stored, removed = self._stored_keys, self._removed_keys
        self._stored_keys, self._removed_keys, self._batches = [], [], []
        reset, self._reset_since_drain = self._reset_since_drain, False
        # The usual case: no key named twice. A key is stored again only once removed (evicted,
        # or dropped by a reset, which has no event), and removed again only once stored again.
        if len(batches) == 1 or ((not stored or not removed) and not reset) or len(set(stored).union(removed)) == len(stored) + len(removed):
            return stored, removed
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


class _Extent:
    """Resident keys ``hashes[start:stop]`` of one chain in one state (``refs``: `PENDING` while
    their store is in flight, else the loads holding them), with consecutive LRU ranks from
    ``low``: the deepest key holds it when ``down`` (a finish re-ranked them tail first), else the
    shallowest (a store ranked them head first). ``entry``: its live eviction-heap entry, 0 if
    none. ``fork``: another chain was seen to leave this one after the extent's last block."""

    __slots__ = ("hashes", "start", "stop", "refs", "low", "down", "entry", "fork")

    def __init__(self, hashes: Sequence[BlockHash], start: int, stop: int, refs: int, low: int, down: bool) -> None:
        self.hashes = hashes
        self.start = start
        self.stop = stop
        self.refs = refs
        self.low = low
        self.down = down
        self.entry = 0
        self.fork = False


class ExtentHostPool(HostPool):
    """`HostPool` kept as extents: runs of consecutive blocks of one chain that share their state
    and hold consecutive ranks.

    A request observes its whole prompt (most of it a GPU hit already on the host) and re-ranks
    it when it finishes, so a slot-per-key pool spends its time walking prompts of thousands of
    blocks. Here a walk costs one step per extent: a store's new keys are one extent (ranked
    head first), and a finish re-ranks the extents it covers, each as a whole, deepest first,
    joining neighbours in one state, so each extent's ranks stay consecutive. Ranks come from
    one counter and are never reused, so the lowest evictable rank is always at the evictable
    end of some extent (its deepest block when ``down``, else its shallowest), which an eviction
    heap of extents finds. Per key there is only C-level work: the key-to-extent map (written
    when keys are stored, and for the smaller side of a split or a join) and the KV event lists."""

    __slots__ = ("_where", "_heap", "_stale", "_rank", "_entries")

    def __init__(self, capacity: int, store_threshold: int = 0, max_tracker_size: int = 64_000) -> None:
        super().__init__(capacity, store_threshold, max_tracker_size)
        self._where: dict[BlockHash, _Extent] = {}  # every resident key -> its extent
        # (low, entry, extent) of every evictable extent, and stale ones (the extent's entry moved on)
        self._heap: list[tuple[int, int, _Extent]] = []
        self._stale = 0  # entries in the heap whose extent moved on
        self._rank = 0  # the next rank to give
        self._entries = 0  # heap entries numbered so far

    @property
    def resident(self) -> int:
        return len(self._where)

    def refs(self, key: BlockHash) -> int | None:
        extent = self._where.get(key)
        return None if extent is None else extent.refs

    def lookup(self, hashes: Sequence[BlockHash], start_block: int, limit_blocks: int) -> tuple[int, bool]:
        where = self._where
        depth = start_block
        while depth < limit_blocks:
            extent = where.get(hashes[depth])
            if extent is None:
                break
            if extent.refs:  # its store in flight, or being loaded: deferred either way
                return 0, True
            depth = _agree_until(extent.hashes, hashes, depth, min(extent.stop, limit_blocks))
        return depth - start_block, False

    def prepare_load(self, hashes: Sequence[BlockHash], start: int, stop: int, access: HostAccess) -> HostCopy:
        pieces = self._cover(hashes, start, stop)
        if sum(piece.stop - piece.start for piece in pieces) != stop - start or any(piece.refs < 0 for piece in pieces):
            raise ValueError("a host block is not ready to load")
        for piece in pieces:
            if piece.refs == 0:
                self._evictable -= piece.stop - piece.start
                self._drop_entry(piece)
            piece.refs += 1
        access.observe(hashes, start, stop, [])
        self.hits += stop - start
        return HostCopy(True, hashes, [(start, stop)])

    def complete_load(self, load: HostCopy) -> None:
        for start, stop in load.runs:
            for piece in self._cover(load.hashes, start, stop):
                if piece.refs <= 0:
                    raise ValueError("a host block is not being loaded")
                piece.refs -= 1
                if piece.refs == 0:
                    self._evictable += piece.stop - piece.start
                    self._push(piece)

    def prepare_store(self, hashes: Sequence[BlockHash], start: int, stop: int, access: HostAccess) -> HostCopy | None:
        offers = self._offers
        if offers is not None:
            self._count_offers(offers, hashes[start:stop])
        where = self._where
        runs: list[tuple[int, int]] = []  # the new keys, as depth ranges
        skipped: list[int] = []  # depths not observed: another request's store, or under the threshold
        new = 0
        offered_evictable = 0  # evictable keys among those offered: they stay
        depth = start
        while depth < stop:
            extent = where.get(hashes[depth])
            if extent is not None:
                end = _agree_until(extent.hashes, hashes, depth, min(extent.stop, stop))
                if extent.refs == PENDING:
                    skipped.extend(range(depth, end))
                elif extent.refs == 0:
                    offered_evictable += end - depth
                depth = end
                continue
            end = depth + 1
            while end < stop and hashes[end] not in where:
                end += 1
            if offers is None:
                runs.append((depth, end))
                new += end - depth
            else:
                threshold = self.store_threshold
                for gap in range(depth, end):
                    if offers.get(hashes[gap], 0) < threshold:
                        skipped.append(gap)
                    elif runs and runs[-1][1] == gap:
                        runs[-1] = (runs[-1][0], gap + 1)
                        new += 1
                    else:
                        runs.append((gap, gap + 1))
                        new += 1
            depth = end
        access.observe(hashes, start, stop, skipped)
        if new:
            need = new - (self.capacity - len(where))
            if need > 0:
                if need > self._evictable - offered_evictable:
                    return None
                self._evict(need, hashes, start, stop)
            rank = self._rank
            for run_start, run_stop in runs:
                extent = _Extent(hashes, run_start, run_stop, PENDING, rank, False)
                rank += run_stop - run_start
                for key in hashes[run_start:run_stop]:
                    where[key] = extent
            self._rank = rank
            self._pending += new
        return HostCopy(False, hashes, runs)

    def complete_store(self, store: HostCopy) -> None:
        for start, stop in store.runs:
            for piece in self._cover(store.hashes, start, stop):
                if piece.refs != PENDING:
                    continue  # dropped by a reset, and stored again by another request since
                size = piece.stop - piece.start
                piece.refs = 0
                self._pending -= size
                self._evictable += size
                self.stored += size
                self._push(piece)
                self._note_events(piece.hashes[piece.start : piece.stop], True)

    def on_request_finished(self, access: HostAccess) -> None:
        hashes = access.hashes
        unseen = access.unseen
        rank = self._rank
        for start, stop in access.tail_first():
            pieces = self._cover(hashes, start, stop)
            if unseen:
                pieces = self._without(pieces, unseen)
            # deepest first; neighbours in one state become one extent (their new ranks are
            # consecutive), so a program's prefix stays a few extents however many turns it has;
            # not across a fork, where the next chain to pass would only cut it again
            last = len(pieces)
            while last:
                first = last - 1
                while first:
                    above = pieces[first - 1]
                    if above.fork or above.stop != pieces[first].start or above.refs != pieces[first].refs:
                        break
                    first -= 1
                extent = self._joined(hashes, pieces[first:last])
                extent.low = rank
                extent.down = True
                rank += extent.stop - extent.start
                if extent.refs == 0:
                    self._push(extent)
                last = first
        self._rank = rank
        access.clear()

    def recency(self) -> list[BlockHash]:
        """Every resident key, lowest rank first (for tests and debugging)."""
        ranked: list[tuple[int, BlockHash]] = []
        for extent in {id(extent): extent for extent in self._where.values()}.values():
            for depth in range(extent.start, extent.stop):
                offset = extent.stop - 1 - depth if extent.down else depth - extent.start
                ranked.append((extent.low + offset, extent.hashes[depth]))
        return [key for _, key in sorted(ranked)]

    def _drop_slots(self) -> None:
        self._where.clear()
        self._heap.clear()
        self._stale = 0
        self._pending = 0
        self._evictable = 0

    def audit(self) -> str | None:
        where = self._where
        if len(where) > self.capacity:
            return f"{len(where)} host slots in use, capacity {self.capacity}"
        extents = {id(extent): extent for extent in where.values()}
        live = {entry for _, entry, extent in self._heap if extent.entry == entry}
        if len(self._heap) - len(live) != self._stale:
            return f"{len(self._heap) - len(live)} stale host heap entries, counted {self._stale}"
        pending = evictable = 0
        for extent in extents.values():
            if not extent.start < extent.stop:
                return f"an empty host extent holds key {extent.hashes[extent.start]}"
            if any(where.get(key) is not extent for key in extent.hashes[extent.start : extent.stop]):
                return f"a key of the host extent from depth {extent.start} maps elsewhere"
            size = extent.stop - extent.start
            if extent.refs == PENDING:
                pending += size
            elif extent.refs == 0:
                evictable += size
                if extent.entry not in live:
                    return f"evictable host extent from depth {extent.start} cannot be evicted (no heap entry)"
        if (pending, evictable) != (self._pending, self._evictable):
            return f"counted {pending} pending, {evictable} evictable host slots; the pool says {self._pending}, {self._evictable}"
        return None

    # --- internals -------------------------------------------------------------------------

    def _push(self, extent: _Extent) -> None:
        """Make ``extent`` (evictable) a candidate under its current lowest rank."""
        self._drop_entry(extent)
        self._entries += 1
        extent.entry = self._entries
        heapq.heappush(self._heap, (extent.low, self._entries, extent))

    def _drop_entry(self, extent: _Extent) -> None:
        """Its entry in the heap, if any, goes stale; the heap sheds them once they are half."""
        if extent.entry:
            extent.entry = 0
            self._stale += 1
            heap = self._heap
            if 2 * self._stale > len(heap) + 64:  # in place: an eviction in progress holds the list
                heap[:] = [item for item in heap if item[2].entry == item[1]]
                heapq.heapify(heap)
                self._stale = 0

    def _split(self, extent: _Extent, at: int) -> tuple[_Extent, _Extent]:
        """Cut ``extent`` before depth ``at``: the piece above (``[start, at)``) and the one below.
        The smaller piece is the new object, so the key map changes for it only."""
        above, below = at - extent.start, extent.stop - at
        low_above = extent.low + below if extent.down else extent.low
        low_below = extent.low if extent.down else extent.low + above
        where = self._where
        if above <= below:
            upper = _Extent(extent.hashes, extent.start, at, extent.refs, low_above, extent.down)  # no fork: ``extent`` follows
            for key in extent.hashes[extent.start : at]:
                where[key] = upper
            extent.start, extent.low = at, low_below
            lower = extent
        else:
            lower = _Extent(extent.hashes, at, extent.stop, extent.refs, low_below, extent.down)
            lower.fork = extent.fork
            for key in extent.hashes[at : extent.stop]:
                where[key] = lower
            extent.stop, extent.low, extent.fork = at, low_above, False
            upper = extent
        if extent.refs == 0:
            self._push(upper)
            self._push(lower)
        return upper, lower

    def _joined(self, hashes: Sequence[BlockHash], pieces: list[_Extent]) -> _Extent:
        """``pieces``, neighbours on the chain ``hashes`` in depth order and in one state, as one
        extent: the largest, grown over the others (their keys map to it now). Ranks are the
        caller's to set."""
        if len(pieces) == 1:
            return pieces[0]
        keeper = max(pieces, key=_size)
        where = self._where
        for piece in pieces:
            if piece is not keeper:
                for key in hashes[piece.start : piece.stop]:
                    where[key] = keeper
                self._drop_entry(piece)
        keeper.hashes = hashes
        keeper.start = pieces[0].start
        keeper.stop = pieces[-1].stop
        keeper.fork = pieces[-1].fork
        return keeper

    def _isolate(self, extent: _Extent, start: int, stop: int) -> _Extent:
        """The piece of ``extent`` holding depths ``start`` to ``stop``, split from the rest."""
        if start > extent.start:
            extent = self._split(extent, start)[1]
        if stop < extent.stop:
            extent = self._split(extent, stop)[0]
        return extent

    def _cover(self, hashes: Sequence[BlockHash], start: int, stop: int) -> list[_Extent]:
        """The extents holding the resident blocks ``start`` to ``stop`` of ``hashes``, in depth
        order, split so that each lies inside the range and on the chain."""
        where = self._where
        pieces: list[_Extent] = []
        depth = start
        while depth < stop:
            extent = where.get(hashes[depth])
            if extent is None:
                depth += 1
                continue
            limit = min(extent.stop, stop)
            end = _agree_until(extent.hashes, hashes, depth, limit)
            extent = self._isolate(extent, depth, end)
            if end < limit:
                extent.fork = True
            pieces.append(extent)
            depth = end
        return pieces

    def _without(self, pieces: list[_Extent], unseen: set[int]) -> list[_Extent]:
        """``pieces`` (of one chain) less the blocks at the depths ``unseen``, split around them."""
        kept: list[_Extent] = []
        for piece in pieces:
            for depth in sorted(depth for depth in unseen if piece.start <= depth < piece.stop):
                if depth > piece.start:
                    upper, piece = self._split(piece, depth)
                    kept.append(upper)
                if depth + 1 == piece.stop:
                    break
                piece = self._split(piece, depth + 1)[1]
            else:
                kept.append(piece)
        return kept

    def _evict(self, count: int, hashes: Sequence[BlockHash], start: int, stop: int) -> None:
        """Evict ``count`` evictable slots (there are enough), lowest rank first, none of the
        blocks ``start`` to ``stop`` of ``hashes`` (the store being prepared) (cpu/policies/lru.py:115-159).
        An extent's ranks are consecutive and no other slot's lie between them, so once its
        evictable end is the lowest it goes as a whole, or as much of it as is needed."""
        heap = self._heap
        where = self._where
        aside: list[_Extent] = []  # offered: out of the heap until the eviction is done
        evicted = 0
        while evicted < count:
            _, entry, extent = heapq.heappop(heap)
            if extent.entry != entry:
                self._stale -= 1
                continue  # stale: pinned, re-ranked, split or evicted since it was pushed
            extent.entry = 0  # out of the heap
            top = max(extent.start, start)
            bottom = min(extent.stop, stop)
            if top < bottom and extent.hashes[top] == hashes[top]:
                # chained hashes: the blocks both hold are one depth range
                extent = self._isolate(extent, top, _agree_until(extent.hashes, hashes, top, bottom))
                self._drop_entry(extent)  # a split pushed it
                aside.append(extent)
                continue
            take = min(extent.stop - extent.start, count - evicted)
            if extent.down:  # deepest first
                cut = extent.stop - take
                gone = list(extent.hashes[cut : extent.stop])
                gone.reverse()
                extent.stop = cut
            else:
                cut = extent.start + take
                gone = list(extent.hashes[extent.start : cut])
                extent.start = cut
            extent.low += take
            for key in gone:
                del where[key]
            self._note_events(gone, False)
            evicted += take
            if extent.start < extent.stop:
                self._push(extent)
        for extent in aside:
            self._push(extent)
        self._evictable -= count
        self.evicted += count


def _size(extent: _Extent) -> int:
    return extent.stop - extent.start


def _agree_until(theirs: Sequence[BlockHash], ours: Sequence[BlockHash], depth: int, limit: int) -> int:
    """`tasim.core.model.shared_prefix_end`, with its common case (the chains agree up to
    ``limit``) settled here: compiled code calls an interpreted function at a cost."""
    if theirs is ours or theirs[limit - 1] == ours[limit - 1]:
        return limit
    return shared_prefix_end(theirs, ours, depth, limit)


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
