"""Paged KV block pool with a prefix cache, as vLLM v1 and Dynamo's mocker keep it.

Every physical block is in exactly one of three states:

* **free**: holds nothing reusable (never used, a partial tail block, a duplicate copy);
* **active**: referenced by at least one holder (a running request or a pin);
* **inactive**: cached and unreferenced; reusable by a prefix hit until evicted.

``free + active + inactive == num_blocks`` at all times. A full block is registered under its
chained hash when the step that computes its last token is scheduled; only hashes that were not
resident emit a *stored* event, and only evicting the last copy emits *removed*. Allocation uses
free blocks first and evicts inactive ones only when none are free.

A block computed while its hash is already cached (a fully cached prompt's last block, which is
always recomputed, or two prefills of one prefix overlapping) is a *duplicate*. Dynamo's mocker
keeps it private to its request (freed, uncached, when the request ends). vLLM caches it as a
second copy (``cache_duplicates``): the copy is referenced, released and evicted like any cached
block, lookups use the oldest copy (the *primary*), and when the primary is evicted the next
oldest copy takes its place, so the hash stays resident while any copy is.

Eviction order of inactive blocks, by *release tick* (each block that loses its last reference
gets the next tick; a holder releases its blocks deepest first):

* ``lru``: lowest tick first, so a sequence's deepest blocks go before its prefix (vLLM's
  free-queue order).
* ``lineage``: only leaves (no resident child) are evictable, lowest tick first; a parent that
  becomes a leaf again keeps its original tick (Dynamo mocker's default).

With the engine's holders (each references its chain from block 0, so whoever references a
block references its parent) a parent's tick always exceeds its children's: the lowest tick is
always a leaf, and the two orders evict alike.

Representation. Block hashes are chained, so a hash has one depth: block ``j`` of every chain
that contains it. Python bookkeeping per block costs about a microsecond and a long-context
replay moves millions of blocks, so the pool keeps *extents* instead: runs of consecutive
blocks of one chain that share their state (the same references and, once unreferenced,
consecutive ticks). Holders reference whole extents: an extent splits where a new holder's
prefix ends inside it, and the only holder of an extent with nothing hanging off its tail grows
it in place as it completes blocks. Per block there is only C-level work left: the hash-to-extent
map and the KV event lists. Evicting follows the per-block rules exactly: within an extent the
ticks are consecutive, so once its tail is the oldest candidate the whole extent goes next.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Sequence
from itertools import count
from typing import Literal

from tasim.core.model import BlockHash, shared_prefix_end

Eviction = Literal["lru", "lineage"]


# A batch of KV events: stored (else removed), the event list's length after it, and the
# blocks as depths [start, stop) of a chain (a removed batch may name more: promoted duplicates
# stay cached and are left out of the event list).
_Batch = tuple[bool, int, Sequence[BlockHash], int, int]


def _may_share_a_block(batches: list[_Batch], events: int) -> bool:
    """Whether a stored and a removed batch can name the same block; False only when none do.
    Chained hashes make this a test per pair of batches instead of a set of every block: two
    chains holding the same block at some depth agree on every block above it, so depth ranges
    that overlap share a block only if the chains agree at the top of the overlap. Falls back
    to True (the caller then intersects sets) when the pairs would cost more than the set."""
    stored = [batch for batch in batches if batch[0]]
    removed = [batch for batch in batches if not batch[0]]
    if len(stored) * len(removed) > events // 2:
        return True
    for _, _, ours, start, stop in stored:
        for _, _, theirs, other_start, other_stop in removed:
            top = start if start > other_start else other_start
            if top < stop and top < other_stop and ours[top] == theirs[top]:
                return True
    return False


class _Extent:
    """Blocks ``hashes[start:stop]`` of one chain (``hashes`` is any chain that contains them).

    ``tick`` is the release tick of the deepest block while unreferenced (the block at depth
    ``d`` has ``tick + stop - 1 - d``). Lineage only: ``parent`` is the extent holding the block
    before the first, when that block is its parent (None for a root, or after a private
    duplicate), and ``children`` counts the extents whose parent this one is; they all hang off
    its last block. Empty once evicted."""

    __slots__ = ("hashes", "start", "stop", "refs", "parent", "children", "tick", "serial", "duplicate")

    def __init__(self, hashes: Sequence[BlockHash], start: int, stop: int, parent: _Extent | None, serial: int) -> None:
        self.hashes = hashes
        self.start = start
        self.stop = stop
        self.refs = 1
        self.parent = parent
        self.children = 0
        self.tick = 0
        self.serial = serial  # breaks tick ties between heap entries of different extents
        self.duplicate = False  # a one-block later copy of a cached hash, not (yet) its primary

    def __deepcopy__(self, memo: dict[int, object]) -> _Extent:
        # Written out: a class compiled by tasim.native has no generic copy.
        clone = memo[id(self)] = _Extent(self.hashes, self.start, self.stop, None, self.serial)
        clone.parent = copy.deepcopy(self.parent, memo)
        clone.refs, clone.children, clone.tick, clone.duplicate = self.refs, self.children, self.tick, self.duplicate
        return clone


class Claim:
    """The cached blocks one holder (a running request, a pin) references: depth ranges ``[start, stop)`` of its chain
    ``hashes``, and the duplicates it computed (``copies``, one block each). A new range starts
    after a gap: a block the holder computed while another copy was already cached (a private
    block, or one of ``copies``). ``last`` is the extent holding its deepest range block."""

    __slots__ = ("hashes", "ranges", "blocks", "last", "copies")

    def __init__(self, hashes: Sequence[BlockHash]) -> None:
        self.hashes = hashes
        self.ranges: list[list[int]] = []
        self.blocks = 0
        self.last: _Extent | None = None
        self.copies: list[_Extent] = []

    def block_hashes(self) -> list[BlockHash]:
        depths = [depth for start, stop in self.ranges for depth in range(start, stop)]
        depths += [copy.start for copy in self.copies]
        return [self.hashes[depth] for depth in sorted(depths)]


class BlockPool:
    def __init__(self, num_blocks: int, eviction: Eviction = "lru", cache_duplicates: bool = False) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        if cache_duplicates and eviction == "lineage":
            raise ValueError("cached duplicates are vLLM's, which evicts lru")
        self.num_blocks = num_blocks
        self.eviction = eviction
        self._lineage = eviction == "lineage"
        self._duplicates = cache_duplicates
        # hash -> its cached duplicates (not the primary, which `_heads` reaches), oldest first
        self._copies: dict[BlockHash, list[_Extent]] = {}
        self.free = num_blocks
        # Extents by their first block's hash. A chain that holds a resident block at depth d
        # holds the one before it in the same extent or in one ending at d (chained hashes), so
        # walking a chain from its root meets every resident block at an extent's start.
        self._heads: dict[BlockHash, _Extent] = {}
        self._cached = 0
        self._inactive_count = 0
        # (tick, serial, extent) for every extent whose deepest block may be next to evict;
        # entries go stale when the extent changes and are skipped when popped.
        self._candidates: list[tuple[int, int, _Extent]] = []
        self._tick = 0
        self._serials = count()
        # KV events since the last drain, in the order they happened, and the batches they were
        # appended in, in order: whether stored, the list's length after it, and the blocks as
        # depths ``[start, stop)`` of a chain.
        self.stored: list[BlockHash] = []
        self.removed: list[BlockHash] = []
        self._batches: list[_Batch] = []

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
        return self._cached

    def is_cached(self, block: BlockHash) -> bool:
        """Whether ``block`` is resident (a scan of every extent: for tests and debugging)."""
        return self._extent_of(block) is not None

    def refs(self, block: BlockHash) -> int:
        """References to ``block`` (a scan of every extent: for tests and debugging)."""
        extent = self._extent_of(block)
        return extent.refs if extent else 0

    def prefix_hits(self, hashes: Sequence[BlockHash], limit: int) -> tuple[int, int]:
        """Leading blocks of ``hashes[:limit]`` resident in the cache, and how many of those are
        active (already referenced, so a new reference costs no capacity)."""
        heads = self._heads
        resident = active = 0
        while resident < limit:
            extent = heads.get(hashes[resident])
            if extent is None:
                break
            end = shared_prefix_end(extent.hashes, hashes, resident, min(extent.stop, limit))
            if extent.refs:
                active += end - resident
            resident = end
        return resident, active

    def evictable_sparing(self, hashes: Sequence[BlockHash], limit: int, cap: int) -> int:
        """How many inactive blocks go, in eviction order, before the first cached block of
        ``hashes[:limit]`` that is inactive; at most ``cap`` (also when none is). Allocations may
        take that many blocks beyond the free ones and leave every cached block of the chain
        cached. Walks the candidate heap as a tree, smallest tick first, without popping it.
        Exact for lru; lineage order answers 0 when the chain has an inactive block."""
        heads = self._heads
        spared = -1  # the lowest tick among the chain's inactive blocks
        depth = 0
        while depth < limit:
            extent = heads.get(hashes[depth])
            if extent is None:
                depth += 1
                continue
            end = shared_prefix_end(extent.hashes, hashes, depth, min(extent.stop, limit))
            if not extent.refs:
                tick = extent.tick + extent.stop - end  # the chain's deepest block in it goes first
                if spared < 0 or tick < spared:
                    spared = tick
            depth = end
        if spared < 0:
            return cap
        if self._lineage:
            return 0  # leaves go first: a tick alone does not place a block in the order
        candidates = self._candidates
        frontier = [(candidates[0][0], 0)] if candidates else []
        seen: set[int] = set()
        count = 0
        while frontier and count < cap:
            tick, at = heapq.heappop(frontier)
            if tick >= spared:
                break  # every entry below it in the heap has a tick at least as high
            _, serial, extent = candidates[at]
            if not extent.refs and extent.tick == tick and extent.start < extent.stop and serial not in seen:
                seen.add(serial)
                count += min(extent.stop - extent.start, spared - tick)  # ticks of distinct extents never interleave
            for child in (2 * at + 1, 2 * at + 2):
                if child < len(candidates):
                    heapq.heappush(frontier, (candidates[child][0], child))
        return min(count, cap)

    def audit(self, claims: Sequence[Claim], private: int, every_block: bool = False) -> str | None:
        """The first broken invariant of the bookkeeping, or None (``tasim simulate --check``).
        ``holds``: every holder's references; ``private``: blocks the holders' requests occupy
        outside the cache (partial tails, private copies). The checks cost O(extents), except
        ``every_block``: no block is cached twice, O(cached blocks)."""
        if min(self.free, self.active, self._inactive_count) < 0:
            return f"negative block count (free {self.free}, active {self.active}, inactive {self._inactive_count})"
        lineage = self._lineage
        live = {id(extent) for extent in self._heads.values()}
        seen: set[BlockHash] = set()
        cached = inactive = 0
        children: dict[int, int] = {}
        for head, extent in self._heads.items():
            if not extent.start < extent.stop or extent.hashes[extent.start] != head:
                return f"extent indexed under block {head} does not start with it"
            if extent.refs < 0:
                return f"negative reference count {extent.refs} on block {head}"
            if every_block:
                blocks = extent.hashes[extent.start : extent.stop]
                if not seen.isdisjoint(blocks):
                    return f"a block of extent {head} is cached twice"
                seen.update(blocks)
            cached += extent.stop - extent.start
            inactive += extent.stop - extent.start if extent.refs == 0 else 0
            parent = extent.parent
            if parent is not None:
                if id(parent) not in live or parent.stop != extent.start:
                    return f"extent {head} hangs off a block that is not cached"
                children[id(parent)] = children.get(id(parent), 0) + 1
        duplicates = [duplicate for copies in self._copies.values() for duplicate in copies]
        for duplicate in duplicates:
            if not duplicate.duplicate or duplicate.stop != duplicate.start + 1 or self._extent_at(duplicate.hashes, duplicate.start) is None:
                return f"duplicate of block {duplicate.hashes[duplicate.start]} is not a cached copy beside a primary"
            cached += 1
            inactive += 0 if duplicate.refs else 1
        if (cached, inactive) != (self._cached, self._inactive_count):
            return f"counted {cached} cached, {inactive} inactive; the pool says {self._cached}, {self._inactive_count}"
        referenced: dict[int, int] = {}
        for claim in claims:
            for duplicate in claim.copies:
                referenced[id(duplicate)] = referenced.get(id(duplicate), 0) + 1
            for start, stop in claim.ranges:
                depth = start
                while depth < stop:
                    found = self._heads.get(claim.hashes[depth])
                    if found is None or found.start != depth or found.stop > stop or found.hashes[found.stop - 1] != claim.hashes[found.stop - 1]:
                        return f"a holder's block {claim.hashes[depth]} is not the start of a cached extent inside its range"
                    referenced[id(found)] = referenced.get(id(found), 0) + 1
                    depth = found.stop
        active_cached = 0
        for head, extent in [*self._heads.items(), *((d.hashes[d.start], d) for d in duplicates)]:
            if extent.refs != referenced.get(id(extent), 0):
                return f"block {head} has {extent.refs} references but {referenced.get(id(extent), 0)} holders"
            active_cached += extent.stop - extent.start if extent.refs else 0
            if lineage and extent.children != children.get(id(extent), 0):
                return f"extent {head} counts {extent.children} children, {children.get(id(extent), 0)} hang off it"
        if self.active != active_cached + private:
            return f"{self.active} active blocks, but holders reference {active_cached} and occupy {private} privately"
        reachable = {id(extent) for tick, _, extent in self._candidates if extent.tick == tick}
        for head, extent in [*self._heads.items(), *((d.hashes[d.start], d) for d in duplicates)]:
            if extent.refs == 0 and not (lineage and extent.children) and id(extent) not in reachable:
                return f"unreferenced block {head} cannot be evicted (no candidate entry)"
        return None

    def __deepcopy__(self, memo: dict[int, object]) -> BlockPool:
        # Written out: a class compiled by tasim.native has no generic copy. Chains of hashes
        # are immutable and shared.
        clone = BlockPool(self.num_blocks, self.eviction, self._duplicates)
        memo[id(self)] = clone
        clone.free, clone._cached, clone._inactive_count, clone._tick = self.free, self._cached, self._inactive_count, self._tick
        clone._heads = copy.deepcopy(self._heads, memo)
        clone._copies = copy.deepcopy(self._copies, memo)
        clone._candidates = copy.deepcopy(self._candidates, memo)
        clone._serials = copy.copy(self._serials)
        clone.stored, clone.removed, clone._batches = list(self.stored), list(self.removed), list(self._batches)
        return clone

    def inactive_order(self) -> list[BlockHash]:
        """Inactive blocks in the order they would be evicted (for tests and debugging)."""
        clone = copy.deepcopy(self)
        clone.removed = []
        clone._evict(clone._inactive_count)
        return clone.removed

    # --- references ------------------------------------------------------------------------

    def acquire(self, hashes: Sequence[BlockHash], blocks: int) -> Claim:
        """Reference ``hashes[:blocks]``, all resident (a prefix hit), for a new holder."""
        claim = Claim(hashes)
        if not blocks:
            return claim
        claim.ranges.append([0, blocks])
        claim.blocks = blocks
        heads = self._heads
        depth = 0
        while depth < blocks:
            extent = heads[hashes[depth]]
            end = shared_prefix_end(extent.hashes, hashes, depth, min(extent.stop, blocks))
            if end < extent.stop:
                extent = self._split(extent, end)
            if extent.refs == 0:
                self._inactive_count -= end - depth  # its candidate entry goes stale
            extent.refs += 1
            depth = end
        claim.last = extent
        return claim

    def release(self, claim: Claim) -> None:
        """Drop the holder's references, deepest block first, as a finished request frees them."""
        hashes = claim.hashes
        heads = self._heads
        candidates = self._candidates
        lineage = self._lineage
        tick = self._tick
        for start, stop in self._release_order(claim):
            path = []
            depth = start
            while depth < stop:
                extent = heads[hashes[depth]]
                path.append(extent)
                depth = extent.stop
            if not path:  # one of its duplicates
                path = [next(copy for copy in claim.copies if copy.start == start)]
            for extent in reversed(path):
                extent.refs -= 1
                if extent.refs == 0:
                    extent.tick = tick + 1
                    tick += extent.stop - extent.start
                    if not (lineage and extent.children):
                        heapq.heappush(candidates, (extent.tick, extent.serial, extent))
        claim.ranges = []
        claim.copies = []
        claim.blocks = 0
        claim.last = None
        self._inactive_count += tick - self._tick
        self._tick = tick
        if len(candidates) > 2 * self._inactive_count + 64:
            self._compact_candidates()

    @staticmethod
    def _release_order(claim: Claim) -> list[list[int]] | list[tuple[int, int]]:
        """The holder's ranges and duplicates, deepest first; a duplicate as an empty range
        ``(depth, depth)`` (its extent is in ``hold.copies``, not reachable by hash)."""
        if not claim.copies:
            return list(reversed(claim.ranges))
        spans = [(start, stop) for start, stop in claim.ranges] + [(copy.start, copy.start) for copy in claim.copies]
        return sorted(spans, reverse=True)

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
        self._evict(need)
        return True

    def register_run(self, claim: Claim, start: int, stop: int) -> None:
        """Register blocks ``start`` to ``stop`` of the holder's chain, which its request just
        completed, and reference them. A block cached since the request's prefix hit (another
        request registered it) is a duplicate (see the module docstring), and the block after it
        starts a new range without a parent link."""
        hashes = claim.hashes
        heads = self._heads
        ranges = claim.ranges
        depth = start
        if depth and not (ranges and ranges[-1][1] == depth):
            # The block before is a duplicate, so this one may sit inside the extent that holds
            # the cached copy.
            extent = self._extent_at(hashes, depth)
            if extent is not None:
                depth = self._duplicated(claim, depth, shared_prefix_end(extent.hashes, hashes, depth, min(extent.stop, stop)))
        # From here the block before ``depth`` is either ours or in an extent ending at or
        # diverging from our chain at ``depth``, so a cached block at ``depth`` starts an extent.
        while depth < stop:
            extent = heads.get(hashes[depth])
            if extent is not None:
                depth = self._duplicated(claim, depth, shared_prefix_end(extent.hashes, hashes, depth, min(extent.stop, stop)))
                continue
            end = depth + 1
            if heads.keys().isdisjoint(hashes[end:stop]):  # the common case, checked in C
                end = stop
            else:
                while hashes[end] not in heads:
                    end += 1
            self._register_new(claim, depth, end)
            depth = end

    def drain_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """Net KV events since the last drain: blocks now cached that were stored, and blocks
        now gone that were removed. A block evicted and stored again (or the reverse) within
        one drain is reported by its final state, so applying stored then removed is exact."""
        stored, removed, batches = self.stored, self.removed, self._batches
        self.stored, self.removed, self._batches = [], [], []
        if stored and removed and _may_share_a_block(batches, len(stored) + len(removed)):
            both = set(stored).intersection(removed)
            if both:
                # Rare (a block evicted and registered again, or the reverse, within one
                # step): a block's final state is that of the last batch that named it.
                final: dict[BlockHash, bool] = {}
                begin = {True: 0, False: 0}
                for was_stored, end, *_ in batches:
                    events = stored if was_stored else removed
                    for block in events[begin[was_stored] : end]:
                        if block in both:
                            final[block] = was_stored
                    begin[was_stored] = end
                stored = [b for b in dict.fromkeys(stored) if final.get(b, True)]
                removed = [b for b in dict.fromkeys(removed) if not final.get(b, False)]
        return stored, removed

    def clear(self) -> None:
        """Drop every inactive block (as after a weight update); active blocks stay."""
        inactive = self._inactive_count
        if inactive:
            self._evict(inactive)
            self.free += inactive

    # --- internals -------------------------------------------------------------------------

    def _duplicated(self, claim: Claim, start: int, stop: int) -> int:
        """The holder computed blocks ``start`` to ``stop`` of its chain, all already cached:
        private blocks, or (``cache_duplicates``) cached copies it references. Returns ``stop``."""
        if self._duplicates:
            for depth in range(start, stop):
                copy = _Extent(claim.hashes, depth, depth + 1, None, next(self._serials))
                copy.duplicate = True
                self._copies.setdefault(claim.hashes[depth], []).append(copy)
                claim.copies.append(copy)
            claim.blocks += stop - start
            self._cached += stop - start
        return stop

    def _promote(self, block: BlockHash) -> bool:
        """The primary copy of ``block`` is being evicted: its oldest duplicate, if any, takes
        its place (returns whether one did)."""
        copies = self._copies.get(block)
        if copies is None:
            return False
        copy = copies.pop(0)
        if not copies:
            del self._copies[block]
        copy.duplicate = False
        self._heads[block] = copy
        return True

    def _register_new(self, claim: Claim, start: int, stop: int) -> None:
        """Register blocks ``start`` to ``stop`` of the holder's chain, none of them cached."""
        hashes = claim.hashes
        ranges = claim.ranges
        parent = claim.last
        if ranges and ranges[-1][1] == start:  # the holder has the block before
            assert parent is not None  # a holder with a range has an extent holding its deepest block
            ranges[-1][1] = stop
            if parent.refs == 1 and not parent.children:  # its only holder: grow it in place
                parent.hashes = hashes  # same blocks up to the old end (chained hashes)
                parent.stop = stop
                extent = parent
            else:
                extent = _Extent(hashes, start, stop, parent if self._lineage else None, next(self._serials))
                if self._lineage:
                    parent.children += 1
                self._heads[hashes[start]] = extent
        else:
            ranges.append([start, stop])
            extent = _Extent(hashes, start, stop, None, next(self._serials))
            self._heads[hashes[start]] = extent
        claim.last = extent
        claim.blocks += stop - start
        self._cached += stop - start
        self.stored += hashes[start:stop]
        self._batches.append((True, len(self.stored), hashes, start, stop))

    def _split(self, extent: _Extent, at: int) -> _Extent:
        """Cut ``extent`` before depth ``at``; returns the new extent above the cut. The part
        below keeps the object, so whatever names it (candidate entries, holders' deepest
        extents, children's parent) stays right."""
        head = _Extent(extent.hashes, extent.start, at, extent.parent, next(self._serials))
        head.refs = extent.refs
        head.tick = extent.tick + extent.stop - at
        if self._lineage:
            head.children = 1
            extent.parent = head
        extent.start = at
        self._heads[head.hashes[head.start]] = head
        self._heads[extent.hashes[at]] = extent
        return head

    def _evict(self, count: int) -> None:
        """Evict ``count`` inactive blocks, lowest tick first (lineage: leaves only). Evicting
        an extent's deepest block makes the next one up the lowest-tick candidate, and (lineage)
        evicting an extent's first block can make its parent a leaf whose tick is next too, so a
        released sequence goes without a heap operation per extent."""
        heads = self._heads
        candidates = self._candidates
        removed = self.removed
        batches = self._batches
        lineage = self._lineage
        evicted = 0
        while evicted < count:
            tick, _, extent = heapq.heappop(candidates)
            if extent.refs or extent.tick != tick or extent.start == extent.stop or (lineage and extent.children):
                continue  # stale: referenced, released again, evicted or split since it was pushed
            if extent.duplicate:  # its hash stays cached by the primary: no event
                self._copies[extent.hashes[extent.start]].remove(extent)
                if not self._copies[extent.hashes[extent.start]]:
                    del self._copies[extent.hashes[extent.start]]
                extent.stop = extent.start
                evicted += 1
                continue
            floor = tick  # every other candidate's tick is above this
            while True:
                take = min(extent.stop - extent.start, count - evicted)
                cut = extent.stop - take
                gone = extent.hashes[cut : extent.stop]
                if self._copies:  # a hash with a duplicate stays cached by it
                    gone = [block for block in gone if not self._promote(block)]
                removed += reversed(gone)
                batches.append((False, len(removed), extent.hashes, cut, extent.stop))
                evicted += take
                floor = max(floor, extent.tick + take - 1)
                extent.stop = cut
                if cut > extent.start:  # enough evicted; the rest waits under its next tick
                    extent.tick += take
                    heapq.heappush(candidates, (extent.tick, extent.serial, extent))
                    break
                if heads.get(extent.hashes[cut]) is extent:  # else a duplicate took its place
                    del heads[extent.hashes[cut]]
                parent = extent.parent
                if parent is None:
                    break
                parent.children -= 1  # lineage never evicts an extent with children
                if parent.children or parent.refs:
                    break
                if evicted == count or parent.tick > floor + 1:
                    heapq.heappush(candidates, (parent.tick, parent.serial, parent))
                    break
                extent = parent  # ticks are unique and every other candidate's is above floor
        self._cached -= count
        self._inactive_count -= count

    def _compact_candidates(self) -> None:
        """Drop stale entries so the heap stays proportional to the inactive pool on a pool that
        rarely fills."""
        lineage = self._lineage
        self._candidates = [
            (tick, serial, extent)
            for tick, serial, extent in self._candidates
            if extent.refs == 0 and extent.tick == tick and extent.start < extent.stop and not (lineage and extent.children)
        ]
        heapq.heapify(self._candidates)

    def _extent_at(self, hashes: Sequence[BlockHash], depth: int) -> _Extent | None:
        """The extent holding block ``depth`` of chain ``hashes``, if it is cached: the one
        starting at the deepest of the chain's blocks up to ``depth`` that starts an extent
        (one starting further up cannot reach past it)."""
        heads = self._heads
        for start in range(depth, -1, -1):
            extent = heads.get(hashes[start])
            if extent is not None:
                return extent if extent.stop > depth and extent.hashes[depth] == hashes[depth] else None
        return None

    def _extent_of(self, block: BlockHash) -> _Extent | None:
        for extent in self._heads.values():
            if block in extent.hashes[extent.start : extent.stop]:
                return extent
        return None
