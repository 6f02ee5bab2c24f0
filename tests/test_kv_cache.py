"""Block pool: reference counts, conservation, and the two eviction orders."""

from __future__ import annotations

from tasim.sim.kv_cache import BlockPool


def _store_chain(pool: BlockPool, chain: list[int]) -> None:
    assert pool.allocate(len(chain))
    held: list[int] = []
    pool.register_run(chain, 0, len(chain), held)
    assert held == chain


def test_conservation_and_reuse() -> None:
    pool = BlockPool(8)
    _store_chain(pool, [1, 2, 3])
    assert (pool.free, pool.active, pool.inactive) == (5, 3, 0)
    pool.release([1, 2, 3])
    assert (pool.free, pool.active, pool.inactive) == (5, 0, 3)
    assert pool.prefix_hits([1, 2, 3, 4], limit=4) == (3, 0)
    pool.acquire([1, 2])
    assert (pool.free, pool.active, pool.inactive) == (5, 2, 1)
    assert pool.prefix_hits([1, 2, 3], limit=3) == (3, 2)
    assert pool.drain_events() == ([1, 2, 3], [])


def test_lru_evicts_least_recently_released_deepest_first() -> None:
    pool = BlockPool(6, "lru")
    _store_chain(pool, [10, 11, 12])  # request A
    _store_chain(pool, [20, 21, 22])  # request B
    pool.release([10, 11, 12])
    pool.release([20, 21, 22])
    # Each request releases tail-first, so its deepest block is the oldest entry.
    assert pool.inactive_order() == [12, 11, 10, 22, 21, 20]
    pool.drain_events()
    assert pool.allocate(4)
    assert pool.drain_events() == ([], [12, 11, 10, 22])
    assert (pool.free, pool.active, pool.inactive) == (0, 4, 2)


def test_reuse_moves_block_to_most_recent() -> None:
    pool = BlockPool(4, "lru")
    _store_chain(pool, [1, 2])
    _store_chain(pool, [3, 4])
    pool.release([1, 2])
    pool.release([3, 4])
    pool.acquire([1])
    pool.release([1])
    assert pool.inactive_order() == [2, 4, 3, 1]


def test_lineage_evicts_leaves_first_and_parents_keep_their_tick() -> None:
    pool = BlockPool(6, "lineage")
    _store_chain(pool, [1, 2])  # shared prefix 1 -> 2
    assert pool.allocate(1)
    pool.register_run([1, 2, 3], 2, 3, [1, 2])  # a request holding 1, 2 extends the prefix with 3
    pool.release([1, 2])  # first request ends: 2 then 1 become inactive (ticks 1, 2)
    pool.release([3])  # tick 3
    # LRU would evict 2 (oldest) and orphan 3; lineage only evicts leaves: 3, then 2 (tick 1), then 1.
    assert pool.inactive_order() == [3, 2, 1]
    pool.drain_events()
    pool.free = 0  # force eviction
    assert pool.allocate(2)
    assert pool.drain_events() == ([], [3, 2])
    assert pool.inactive_order() == [1]


def test_duplicate_register_keeps_private_copy() -> None:
    pool = BlockPool(4)
    assert pool.allocate(2)
    first: list[int] = []
    second: list[int] = []
    pool.register_run([7], 0, 1, first)
    pool.register_run([7], 0, 1, second)  # a second copy of the same content stays private
    assert (first, second) == ([7], [])
    assert pool.refs(7) == 1
    assert pool.drain_events() == ([7], [])


def test_allocate_is_all_or_nothing() -> None:
    pool = BlockPool(3)
    _store_chain(pool, [1, 2])
    assert not pool.allocate(2)
    assert (pool.free, pool.active) == (1, 2)
    pool.release([1, 2])
    assert pool.allocate(3)
    assert pool.drain_events()[1] == [2, 1]
