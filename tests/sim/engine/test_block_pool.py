"""Block pool: reference counts, conservation, and the two eviction orders."""

from __future__ import annotations

import pytest

from tasim.sim.engine.block_pool import BlockPool, Claim


def _store_chain(pool: BlockPool, chain: list[int]) -> Claim:
    assert pool.allocate(len(chain))
    claim = Claim(chain)
    pool.register_run(claim, 0, len(chain))
    assert claim.block_hashes() == chain
    return claim


def test_conservation_and_reuse() -> None:
    pool = BlockPool(8)
    claim = _store_chain(pool, [1, 2, 3])
    assert (pool.free, pool.active, pool.inactive) == (5, 3, 0)
    pool.release(claim)
    assert (pool.free, pool.active, pool.inactive) == (5, 0, 3)
    assert pool.prefix_hits([1, 2, 3, 4], limit=4) == (3, 0)
    pool.acquire([1, 2, 3], 2)
    assert (pool.free, pool.active, pool.inactive) == (5, 2, 1)
    assert pool.prefix_hits([1, 2, 3], limit=3) == (3, 2)
    assert pool.drain_events() == ([1, 2, 3], [])


def test_lru_evicts_least_recently_released_deepest_first() -> None:
    pool = BlockPool(6, "lru")
    a = _store_chain(pool, [10, 11, 12])  # request A
    b = _store_chain(pool, [20, 21, 22])  # request B
    pool.release(a)
    pool.release(b)
    # Each request releases tail-first, so its deepest block is the oldest entry.
    assert pool.inactive_order() == [12, 11, 10, 22, 21, 20]
    pool.drain_events()
    assert pool.allocate(4)
    assert pool.drain_events() == ([], [12, 11, 10, 22])
    assert (pool.free, pool.active, pool.inactive) == (0, 4, 2)


def test_reuse_moves_block_to_most_recent() -> None:
    pool = BlockPool(4, "lru")
    pool.release(_store_chain(pool, [1, 2]))
    pool.release(_store_chain(pool, [3, 4]))
    pool.release(pool.acquire([1, 2], 1))
    assert pool.inactive_order() == [2, 4, 3, 1]


def test_lineage_parent_keeps_its_tick_and_waits_for_its_child() -> None:
    pool = BlockPool(6, "lineage")
    first = _store_chain(pool, [1, 2])  # shared prefix 1 -> 2
    second = pool.acquire([1, 2, 3], 2)  # a second request hits 1, 2 ...
    assert pool.allocate(1)
    pool.register_run(second, 2, 3)  # ... and extends the prefix with 3
    pool.release(first)  # no tick: the second request still holds 1, 2
    pool.release(second)  # 3, 2, 1 get ticks 1, 2, 3
    assert pool.inactive_order() == [3, 2, 1]
    pool.release(pool.acquire([1, 2, 3], 2))  # 2, 1 get ticks 4, 5; 3 keeps tick 1
    pool.release(pool.acquire([1, 2, 4], 1))  # 1 gets tick 6
    assert pool.inactive_order() == [3, 2, 1]
    pool.drain_events()
    pool.free = 0  # force eviction
    assert pool.allocate(2)
    assert pool.drain_events() == ([], [3, 2])
    assert pool.inactive_order() == [1]


@pytest.mark.parametrize("eviction", ["lru", "lineage"])
def test_sibling_branches_evict_by_tick(eviction: str) -> None:
    pool = BlockPool(8, eviction)  # type: ignore[arg-type]
    a = _store_chain(pool, [1, 2, 3])
    b = pool.acquire([1, 7, 8], 1)  # holds 1 only
    assert pool.allocate(2)
    pool.register_run(b, 1, 3)  # a sibling branch 7 -> 8 under 1
    pool.release(a)  # 3, 2 get ticks 1, 2 (1 is still held)
    pool.release(b)  # 8, 7, 1 get ticks 3, 4, 5
    # A holder of a block holds its parent, so a parent's tick always exceeds its children's
    # and the oldest block is a leaf: lineage and LRU agree on engine-driven histories.
    assert pool.inactive_order() == [3, 2, 8, 7, 1]
    pool.drain_events()
    assert pool.allocate(6)  # 3 free + 3 evicted
    assert pool.drain_events() == ([], [3, 2, 8])
    assert pool.inactive_order() == [7, 1]


def test_duplicate_register_keeps_private_copy() -> None:
    pool = BlockPool(4)
    assert pool.allocate(2)
    first, second = Claim([7]), Claim([7])
    pool.register_run(first, 0, 1)
    pool.register_run(second, 0, 1)  # a second copy of the same content stays private
    assert (first.blocks, second.blocks) == (1, 0)
    assert pool.refs(7) == 1
    assert pool.drain_events() == ([7], [])


def test_block_after_a_private_copy_has_no_parent() -> None:
    pool = BlockPool(6, "lineage")
    owner = _store_chain(pool, [1, 2])
    late = pool.acquire([1, 2, 3], 1)  # admitted when only 1 was cached ...
    assert pool.allocate(2)
    pool.register_run(late, 1, 3)  # ... so 2 is a private copy and 3 starts a root
    assert late.ranges == [[0, 1], [2, 3]]
    pool.release(late)  # 3 gets tick 1 (the owner still holds 1)
    pool.release(owner)  # 2, 1 get ticks 2, 3
    # 3 is a root, evictable first although 2 is resident; then 2, then 1.
    assert pool.inactive_order() == [3, 2, 1]


def test_allocate_is_all_or_nothing() -> None:
    pool = BlockPool(3)
    claim = _store_chain(pool, [1, 2])
    assert not pool.allocate(2)
    assert (pool.free, pool.active) == (1, 2)
    pool.release(claim)
    assert pool.allocate(3)
    assert pool.drain_events()[1] == [2, 1]


def test_evictable_sparing_counts_the_blocks_evicted_before_a_chain_block() -> None:
    pool = BlockPool(8, "lru")
    a = _store_chain(pool, [10, 11, 12])
    b = _store_chain(pool, [20, 21, 22])
    pool.release(a)
    pool.release(b)  # eviction order: 12, 11, 10, 22, 21, 20
    assert pool.evictable_sparing([20, 21, 22], 3, 10) == 3
    assert pool.evictable_sparing([20, 21, 22], 1, 10) == 5  # only block 20 is watched
    assert pool.evictable_sparing([10, 11, 99], 3, 10) == 1  # 11 goes second
    assert pool.evictable_sparing([20, 21, 22], 3, 2) == 2  # capped
    assert pool.evictable_sparing([7, 8], 2, 4) == 4  # none of its blocks cached
    pool.acquire([20, 21, 22], 3)
    assert pool.evictable_sparing([20, 21, 22], 3, 10) == 10  # referenced blocks are never evicted
    assert pool.evictable_sparing([10, 11, 12], 3, 10) == 0
    lineage = BlockPool(8, "lineage")
    lineage.release(_store_chain(lineage, [10, 11, 12]))
    lineage.release(_store_chain(lineage, [20, 21, 22]))
    assert lineage.evictable_sparing([20, 21, 22], 3, 10) == 0  # no tick order to count on
