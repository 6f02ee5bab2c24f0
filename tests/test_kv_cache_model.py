"""The extent-based block pool against a per-block reference model, on random histories.

The reference keeps one record per block and evicts by scanning for the lowest tick, exactly
as the module docstring of `tasim.sim.kv_cache` states the rules; the pool must agree with it
on every KV event, every count, every prefix hit and the eviction order, whatever the mix of
shared prefixes, divergent branches, private duplicates, pins and cache clears.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from tasim.sim.kv_cache import BlockPool, Hold


class ReferencePool:
    """Per-block state: hash -> [refs, parent hash or None, children, tick]."""

    def __init__(self, num_blocks: int, eviction: str) -> None:
        self.num_blocks = num_blocks
        self.lineage = eviction == "lineage"
        self.free = num_blocks
        self.blocks: dict[int, list] = {}
        self.tick = 0
        self.stored: list[int] = []
        self.removed: list[int] = []

    @property
    def inactive(self) -> int:
        return sum(1 for entry in self.blocks.values() if entry[0] == 0)

    def prefix_hits(self, hashes: list[int], limit: int) -> tuple[int, int]:
        resident = 0
        while resident < limit and hashes[resident] in self.blocks:
            resident += 1
        return resident, sum(1 for block in hashes[:resident] if self.blocks[block][0])

    def acquire(self, hashes: list[int], count: int) -> list[int]:
        for block in hashes[:count]:
            self.blocks[block][0] += 1
        return list(hashes[:count])

    def release(self, held: list[int]) -> None:
        for block in reversed(held):
            entry = self.blocks[block]
            entry[0] -= 1
            if entry[0] == 0:
                self.tick += 1
                entry[3] = self.tick

    def register(self, hashes: list[int], start: int, stop: int, held: list[int]) -> None:
        for j in range(start, stop):
            if hashes[j] in self.blocks:
                continue  # private duplicate
            parent = hashes[j - 1] if j and held and held[-1] == hashes[j - 1] else None
            if parent is not None:
                self.blocks[parent][2] += 1
            self.blocks[hashes[j]] = [1, parent, 0, 0]
            self.stored.append(hashes[j])
            held.append(hashes[j])

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
            (entry[3], block) for block, entry in self.blocks.items()
            if entry[0] == 0 and not (self.lineage and entry[2])
        )[1]
        parent = self.blocks.pop(victim)[1]
        if parent is not None:
            self.blocks[parent][2] -= 1
        self.removed.append(victim)

    def inactive_order(self) -> list[int]:
        saved = ({block: list(entry) for block, entry in self.blocks.items()}, self.removed)
        self.removed = []
        while self.inactive:
            self.evict_one()
        order = self.removed
        self.blocks, self.removed = saved
        return order

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
    hold: Hold
    held: list[int]
    done: int  # leading blocks registered or hit
    phys: int = 0  # physical blocks taken (hits cost none)
    private: int = field(default=0)


def _check(pool: BlockPool, ref: ReferencePool, chains: list[list[int]], rng: random.Random) -> None:
    assert pool.drain_events() == ref.drain()
    assert (pool.free, pool.inactive) == (ref.free, ref.inactive)
    assert pool.cached_blocks == len(ref.blocks)
    for chain in rng.sample(chains, 3):
        limit = rng.randint(0, len(chain))
        assert pool.prefix_hits(chain, limit) == ref.prefix_hits(chain, limit)


# Small pools evict constantly; large ones rarely fill, so stale heap entries pile up and get
# compacted away.
CASES = [(seed, 8 + seed, 300) for seed in range(40)] + [(seed, 400, 1500) for seed in range(40, 44)]


@pytest.mark.parametrize("eviction", ["lru", "lineage"])
@pytest.mark.parametrize(("seed", "size", "steps"), CASES)
def test_pool_matches_per_block_reference(eviction: str, seed: int, size: int, steps: int) -> None:
    rng = random.Random(seed)
    pool, ref = BlockPool(size, eviction), ReferencePool(size, eviction)  # type: ignore[arg-type]
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
                    before = holder.hold.blocks
                    pool.register_run(holder.hold, holder.done, holder.done + count)
                    ref.register(holder.chain, holder.done, holder.done + count, holder.held)
                    holder.private += count - (holder.hold.blocks - before)
                    holder.done += count
        elif action < 0.97:  # a request finishes (or a pin is dropped)
            holder = holders.pop(rng.randrange(len(holders)))
            assert holder.hold.block_hashes() == holder.held
            pool.release(holder.hold)
            pool.release_private(holder.private)
            ref.release(holder.held)
            ref.free += holder.private
        else:
            pool.clear()
            ref.clear()
        _check(pool, ref, chains, rng)
        for holder in holders:
            assert holder.hold.block_hashes() == holder.held
    assert pool.inactive_order() == ref.inactive_order()


@pytest.mark.parametrize("eviction", ["lru", "lineage"])
def test_stale_candidates_are_compacted(eviction: str) -> None:
    # A pool that never fills: every re-use leaves a stale heap entry behind, which nothing pops.
    pool, ref = BlockPool(1000, eviction), ReferencePool(1000, eviction)  # type: ignore[arg-type]
    chain = [depth * 10**6 for depth in range(6)]
    assert pool.allocate(6) and ref.allocate(6)
    hold, held = Hold(chain), []
    pool.register_run(hold, 0, 6)
    ref.register(chain, 0, 6, held)
    pool.release(hold)
    ref.release(held)
    for cycle in range(200):
        hits = 1 + cycle % 5
        pool.release(pool.acquire(chain, hits))
        ref.release(ref.acquire(chain, hits))
        assert len(pool._candidates) <= 2 * pool.inactive + 64
    assert pool.inactive_order() == ref.inactive_order()
    assert pool.drain_events() == ref.drain()
