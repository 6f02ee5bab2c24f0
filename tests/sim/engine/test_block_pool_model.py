"""The extent-based block pool against a per-block reference model, on random histories.

The reference keeps one record per block and evicts by scanning for the lowest tick, exactly
as the module docstring of `tasim.sim.engine.block_pool` states the rules; the pool must agree with it
on every KV event, every count, every prefix hit and the eviction order, whatever the mix of
shared prefixes, divergent branches, private duplicates, pins and cache clears.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from tasim.sim.engine.block_pool import BlockPool, Claim


class _Block:
    """One physical cached block of the reference."""

    __slots__ = ("hash", "refs", "parent", "children", "tick")

    def __init__(self, block: int, parent: int | None) -> None:
        self.hash, self.refs, self.parent, self.children, self.tick = block, 1, parent, 0, 0


class ReferencePool:
    """Per-block state: hash -> its cached copies, oldest (the primary) first; a copy holds
    [refs, parent hash or None, children, tick]. Without ``duplicates`` a hash has one copy and a
    block computed while its hash is cached stays private."""

    def __init__(self, num_blocks: int, eviction: str, duplicates: bool = False) -> None:
        self.num_blocks = num_blocks
        self.lineage = eviction == "lineage"
        self.duplicates = duplicates
        self.free = num_blocks
        self.blocks: dict[int, list[_Block]] = {}
        self.tick = 0
        self.stored: list[int] = []
        self.removed: list[int] = []

    def _all(self) -> list[_Block]:
        return [copy for copies in self.blocks.values() for copy in copies]

    @property
    def inactive(self) -> int:
        return sum(1 for copy in self._all() if copy.refs == 0)

    @property
    def cached(self) -> int:
        return len(self._all())

    def prefix_hits(self, hashes: list[int], limit: int) -> tuple[int, int]:
        resident = 0
        while resident < limit and hashes[resident] in self.blocks:
            resident += 1
        return resident, sum(1 for block in hashes[:resident] if self.blocks[block][0].refs)

    def acquire(self, hashes: list[int], count: int) -> list[_Block]:
        held = [self.blocks[block][0] for block in hashes[:count]]
        for copy in held:
            copy.refs += 1
        return held

    def release(self, held: list[_Block]) -> None:
        for copy in reversed(held):
            copy.refs -= 1
            if copy.refs == 0:
                self.tick += 1
                copy.tick = self.tick

    def register(self, hashes: list[int], start: int, stop: int, held: list[_Block]) -> None:
        for j in range(start, stop):
            if hashes[j] in self.blocks:
                if self.duplicates:
                    copy = _Block(hashes[j], None)
                    self.blocks[hashes[j]].append(copy)
                    held.append(copy)
                continue  # else a private duplicate
            parent = hashes[j - 1] if j and held and held[-1].hash == hashes[j - 1] else None
            if parent is not None:
                self.blocks[parent][0].children += 1
            copy = _Block(hashes[j], parent)
            self.blocks[hashes[j]] = [copy]
            self.stored.append(hashes[j])
            held.append(copy)

    def allocate(self, count: int) -> bool:
        if count <= self.free:
            self.free -= count
            return True
        if count > self.free + self.inactive:
            return False
        need = count - self.free
        self.free = 0
        for _ in range(need):
            self.evict_one()
        return True

    def evict_one(self) -> None:
        victim = min(
            (copy for copy in self._all() if copy.refs == 0 and not (self.lineage and copy.children)),
            key=lambda copy: copy.tick,
        )
        copies = self.blocks[victim.hash]
        copies.remove(victim)
        if copies:
            return  # another copy keeps the hash cached
        del self.blocks[victim.hash]
        if victim.parent is not None:
            self.blocks[victim.parent][0].children -= 1
        self.removed.append(victim.hash)

    def inactive_order(self) -> list[int]:
        saved = ({block: [copy for copy in copies] for block, copies in self.blocks.items()}, self.removed)
        state = {id(copy): (copy.refs, copy.children, copy.tick) for copy in self._all()}
        self.removed = []
        while self.inactive:
            self.evict_one()
        order = self.removed
        self.blocks, self.removed = saved
        for copy in self._all():
            copy.refs, copy.children, copy.tick = state[id(copy)]
        return order

    def evictable_sparing(self, hashes: list[int], limit: int, cap: int) -> int:
        """Inactive copies older than the oldest inactive primary of ``hashes[:limit]`` (lru;
        lineage: 0 when there is one)."""
        ticks = [self.blocks[block][0].tick for block in hashes[:limit] if block in self.blocks and not self.blocks[block][0].refs]
        if not ticks:
            return cap
        if self.lineage:
            return 0
        return min(cap, sum(1 for copy in self._all() if copy.refs == 0 and copy.tick < min(ticks)))

    def clear(self) -> None:
        while self.inactive:
            self.evict_one()
            self.free += 1

    def drain(self) -> tuple[list[int], list[int]]:
        stored, removed = self.stored, self.removed
        self.stored, self.removed = [], []
        if stored and removed and not set(stored).isdisjoint(removed):
            stored = [b for b in dict.fromkeys(stored) if b in self.blocks]
            removed = [b for b in dict.fromkeys(removed) if b not in self.blocks]
        return stored, removed


def _chains(rng: random.Random, count: int) -> list[list[int]]:
    """Chained hashes: a new chain copies a prefix of an earlier one, then goes its own way.
    Hash = depth * 10**6 + a serial, so a hash has one depth as real chained hashes do."""
    chains: list[list[int]] = []
    serial = 0
    for _ in range(count):
        length = rng.randint(1, 14)
        base = rng.choice(chains) if chains and rng.random() < 0.8 else []
        shared = rng.randint(0, min(len(base), length))
        chain = base[:shared]
        for depth in range(shared, length):
            serial += 1
            chain.append(depth * 10**6 + serial)
        chains.append(chain)
    return chains


@dataclass
class _Holder:
    chain: list[int]
    claim: Claim
    held: list[_Block]
    done: int  # leading blocks registered or hit
    phys: int = 0  # physical blocks taken (hits cost none)
    private: int = field(default=0)


def _check(pool: BlockPool, ref: ReferencePool, chains: list[list[int]], rng: random.Random) -> None:
    assert pool.drain_events() == ref.drain()
    assert (pool.free, pool.inactive) == (ref.free, ref.inactive)
    assert pool.cached_blocks == ref.cached
    for chain in rng.sample(chains, 3):
        limit = rng.randint(0, len(chain))
        assert pool.prefix_hits(chain, limit) == ref.prefix_hits(chain, limit)
        cap = rng.randint(0, ref.inactive + 1)
        assert pool.evictable_sparing(chain, limit, cap) == ref.evictable_sparing(chain, limit, cap)


# Small pools evict constantly; large ones rarely fill, so stale heap entries pile up and get
# compacted away.
CASES = [(seed, 8 + seed, 300) for seed in range(40)] + [(seed, 400, 1500) for seed in range(40, 44)]


# (eviction, duplicates cached): the mocker's two orders with private duplicates, and vLLM's.
POOLS = [("lru", False), ("lineage", False), ("lru", True)]


def _hashes(held: list[_Block]) -> list[int]:
    return [copy.hash for copy in held]


@pytest.mark.parametrize(("eviction", "duplicates"), POOLS, ids=["lru", "lineage", "lru, duplicates cached"])
@pytest.mark.parametrize(("seed", "size", "steps"), CASES)
def test_pool_matches_per_block_reference(eviction: str, duplicates: bool, seed: int, size: int, steps: int) -> None:
    rng = random.Random(seed)
    pool = BlockPool(size, eviction, cache_duplicates=duplicates)  # type: ignore[arg-type]
    ref = ReferencePool(size, eviction, duplicates)
    chains = _chains(rng, 12 if size < 100 else 60)
    holders: list[_Holder] = []
    for _ in range(steps):
        action = rng.random()
        if action < 0.3 or not holders:  # admit: reference the cached prefix
            chain = rng.choice(chains)
            limit = rng.randint(0, len(chain))
            hits, _ = pool.prefix_hits(chain, limit)
            holders.append(_Holder(chain, pool.acquire(chain, hits), ref.acquire(chain, hits), hits))
        elif action < 0.75:  # a step completes some blocks
            holder = rng.choice(holders)
            left = len(holder.chain) - holder.done
            if left:
                count = rng.randint(1, min(left, 4))
                ok = pool.allocate(count)
                assert ok == ref.allocate(count)
                if ok:
                    before = holder.claim.blocks
                    pool.register_run(holder.claim, holder.done, holder.done + count)
                    ref.register(holder.chain, holder.done, holder.done + count, holder.held)
                    holder.private += count - (holder.claim.blocks - before)
                    holder.done += count
        elif action < 0.97:  # a request finishes (or a pin is dropped)
            holder = holders.pop(rng.randrange(len(holders)))
            assert holder.claim.block_hashes() == _hashes(holder.held)
            pool.release(holder.claim)
            pool.release_private(holder.private)
            ref.release(holder.held)
            ref.free += holder.private
        else:
            pool.clear()
            ref.clear()
        _check(pool, ref, chains, rng)
        for holder in holders:
            assert holder.claim.block_hashes() == _hashes(holder.held)
        assert pool.audit([holder.claim for holder in holders], sum(holder.private for holder in holders), True) is None
    assert pool.inactive_order() == ref.inactive_order()


@pytest.mark.parametrize("eviction", ["lru", "lineage"])
def test_stale_candidates_are_compacted(eviction: str) -> None:
    # A pool that never fills: every re-use leaves a stale heap entry behind, which nothing pops.
    pool, ref = BlockPool(1000, eviction), ReferencePool(1000, eviction)  # type: ignore[arg-type]
    chain = [depth * 10**6 for depth in range(6)]
    assert pool.allocate(6) and ref.allocate(6)
    claim, held = Claim(chain), []
    pool.register_run(claim, 0, 6)
    ref.register(chain, 0, 6, held)
    pool.release(claim)
    ref.release(held)
    for cycle in range(200):
        hits = 1 + cycle % 5
        pool.release(pool.acquire(chain, hits))
        ref.release(ref.acquire(chain, hits))
        assert len(pool._candidates) <= 2 * pool.inactive + 64
    assert pool.inactive_order() == ref.inactive_order()
    assert pool.drain_events() == ref.drain()
