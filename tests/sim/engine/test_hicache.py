"""SGLang HiCache's host tier on its own, over a real block pool, with exact values: what each
write policy writes and when, host eviction order, the load-back threshold's edge, and load
timing on the FIFO H2D lane."""

from __future__ import annotations

import pytest

from tasim.core.model import BlockHash
from tasim.sim.engine.block_pool import BlockPool, Claim
from tasim.sim.engine.hicache import HiCache, WritePolicy

BS = 16
KV_BYTES_PER_TOKEN = 131072
BLOCK_BYTES = BS * KV_BYTES_PER_TOKEN  # 2 MiB
GBPS = 32.0
COPY = BLOCK_BYTES / (GBPS * 1e9)  # seconds to copy one block
A = [101, 102, 103, 104]
C = [301, 302, 303, 304, 305, 306, 307]


def _tier(pool: BlockPool, policy: WritePolicy = "write_through", capacity: int = 64, block_size: int = BS, threshold: int = 10) -> HiCache:
    return HiCache(capacity, pool, block_size, BLOCK_BYTES, GBPS, GBPS, policy, threshold)


def _compute(pool: BlockPool, hashes: list[BlockHash]) -> Claim:
    """A request computes (and holds) the blocks ``hashes`` on the GPU."""
    claim = pool.acquire(hashes, 0)
    assert pool.allocate(len(hashes))
    pool.register_run(claim, 0, len(hashes))
    return claim


def _evict_gpu(pool: BlockPool, tier: HiCache, blocks: int) -> list[BlockHash]:
    """Take ``blocks`` GPU blocks, evicting cached ones; the tier hears of it."""
    assert pool.allocate(blocks)
    stored, removed = pool.drain_events()
    tier.on_gpu_events(stored, removed)
    return removed


def _ran(pool: BlockPool, tier: HiCache, hashes: list[BlockHash], now: float, inserts: int = 1) -> None:
    """A request computes ``hashes``, inserts them ``inserts`` times at ``now``, and frees them."""
    claim = _compute(pool, hashes)
    tier.on_gpu_events(*pool.drain_events())
    for _ in range(inserts):
        tier.insert(hashes, len(hashes), now)
    pool.release(claim)


def test_write_through_writes_an_insert_at_once_and_holds_its_blocks_until_written() -> None:
    pool = BlockPool(8)
    tier = _tier(pool)
    claim = _compute(pool, A)
    tier.insert(A, 4, 1.0)
    assert [tier.node_state(key) for key in A] == [(1, True, "writing")] * 4
    assert tier.next_done == 1.0 + 4 * COPY and tier.used == 4
    pool.release(claim)
    assert pool.available == 4  # A is held by its write
    tier.complete(1.0 + 4 * COPY - 1e-9)
    assert tier.node_state(A[0]) == (1, True, "writing")
    tier.complete(1.0 + 4 * COPY)
    assert [tier.node_state(key) for key in A] == [(1, True, "ready")] * 4
    assert pool.available == 8 and tier.stored == 4 and tier.next_done == float("inf")
    assert tier.take_events() == (A, [])
    # a second insert counts a hit and writes nothing
    _ran(pool, tier, A, 2.0)
    assert tier.node_state(A[0]) == (2, True, "ready") and tier.next_done == float("inf")


def test_write_through_selective_writes_at_the_second_hit() -> None:
    pool = BlockPool(8)
    tier = _tier(pool, "write_through_selective")
    _ran(pool, tier, A, 1.0)
    assert tier.node_state(A[0]) == (1, True, "none") and tier.used == 0
    # A's prefix again plus a new block: A's 4 reach 2 hits and are one write; 105 has 1
    _ran(pool, tier, A + [105], 2.0)
    assert [tier.node_state(key) for key in A] == [(2, True, "writing")] * 4
    assert tier.node_state(105) == (1, True, "none")
    assert tier.next_done == 2.0 + 4 * COPY and tier.d2h.bytes_moved == 4 * BLOCK_BYTES


def test_write_through_drops_a_block_evicted_before_it_is_backed_up() -> None:
    pool = BlockPool(8)
    tier = _tier(pool, "write_through_selective")
    _ran(pool, tier, A, 1.0)
    assert _evict_gpu(pool, tier, 8) == A[::-1]
    assert [tier.node_state(key) for key in A] == [None] * 4 and tier.lookup(A, 0, 4) == 0


def test_gpu_eviction_of_a_backed_up_block_leaves_it_host_only() -> None:
    pool = BlockPool(8)
    tier = _tier(pool)
    _ran(pool, tier, A, 1.0)
    tier.complete(2.0)
    _evict_gpu(pool, tier, 8)
    assert [tier.node_state(key) for key in A] == [(1, False, "ready")] * 4
    assert tier.lookup(A, 0, 4) == 4 and tier.lookup(A, 1, 4) == 3


def test_write_back_writes_only_at_gpu_eviction_and_the_eviction_waits_for_it() -> None:
    pool = BlockPool(8)
    tier = _tier(pool, "write_back")
    _ran(pool, tier, A, 1.0, inserts=3)
    assert tier.node_state(A[0]) == (0, True, "none") and tier.used == 0  # no hit counting
    tier.complete(5.0)  # the step that evicts starts at 5
    removed = _evict_gpu(pool, tier, 6)  # 4 free, 2 of A's evicted: its tail first
    assert removed == [104, 103]
    assert tier.flush_until(removed) == 5.0 + 2 * COPY
    assert tier.node_state(104) == (0, False, "ready") and tier.node_state(102) == (0, True, "none")
    assert tier.take_events() == ([104, 103], [])
    # the next step's lookup finds them after A's GPU prefix
    assert tier.lookup(A, 2, 4) == 2


def test_host_eviction_takes_host_only_leaves_least_recently_used_first() -> None:
    pool = BlockPool(8)
    tier = _tier(pool, capacity=11)
    _ran(pool, tier, A, 1.0)  # stamps A's blocks first
    _ran(pool, tier, [201, 202], 1.5)
    tier.complete(2.0)
    _evict_gpu(pool, tier, 8)  # A and 201-202 leave the GPU: host-only
    tier.take_events()
    # C (7 blocks) needs 7 of 11 slots with 5 free: evict_host(7) frees leaves, LRU first: A's
    # tail, then its parent as it becomes a leaf (older than 202), ... then 202, 201
    pool.clear()  # the 8 taken blocks are free again
    pool.release_private(8)
    _ran(pool, tier, C, 3.0)
    assert tier.take_events()[1] == [104, 103, 102, 101, 202, 201]
    assert tier.used == 7 and tier.evicted == 6


def test_host_eviction_spares_blocks_on_the_gpu_and_gives_up_when_too_few_go() -> None:
    pool = BlockPool(16)
    tier = _tier(pool, capacity=8)
    _ran(pool, tier, A, 1.0)
    tier.complete(2.0)
    _evict_gpu(pool, tier, 16)  # A host-only
    pool.clear()
    pool.release_private(16)
    loading = _compute(pool, A)  # A loaded back: on the GPU again
    tier.load_back(A, 0, 4, 3.0)
    assert tier.lookup(A, 0, 4) == 0
    # C's 7 blocks need 7 slots, 4 are free and A's are no host-only leaves: no write
    _ran(pool, tier, C, 3.0)
    assert [tier.node_state(key) for key in C] == [(1, True, "none")] * 7 and tier.used == 4
    pool.release(loading)


@pytest.mark.parametrize(("blocks", "hit"), [(9, 0), (10, 10)])
def test_load_back_threshold_is_ten_tokens(blocks: int, hit: int) -> None:
    pool = BlockPool(32)
    tier = _tier(pool, block_size=1)
    chain = list(range(1, 13))
    _ran(pool, tier, chain, 1.0)
    tier.complete(2.0)
    _evict_gpu(pool, tier, 32)
    assert tier.lookup(chain, 0, blocks) == hit  # all or nothing


def test_loads_queue_on_the_h2d_lane_and_keep_the_host_copy() -> None:
    pool = BlockPool(16)
    tier = _tier(pool)
    _ran(pool, tier, A, 1.0)
    _ran(pool, tier, C, 1.0)
    tier.complete(2.0)
    _evict_gpu(pool, tier, 16)
    assert tier.load_back(A, 0, 4, 5.0) == 5.0 + 4 * COPY
    assert tier.load_back(C, 0, 2, 5.0) == 5.0 + 6 * COPY  # behind A's on the one lane
    assert tier.load_back(C, 2, 3, 6.0) == 6.0 + COPY
    assert tier.h2d.bytes_moved == 7 * BLOCK_BYTES and tier.hits == 7
    assert tier.node_state(A[0]) == (1, True, "ready") and tier.used == 11
    assert tier.next_done == 5.0 + 4 * COPY
    tier.complete(7.0)
    assert tier.next_done == float("inf") and tier.audit() is None


def test_a_recomputed_host_only_block_is_readopted_without_a_hit() -> None:
    pool = BlockPool(8)
    tier = _tier(pool)
    _ran(pool, tier, A, 1.0)
    tier.complete(2.0)
    _evict_gpu(pool, tier, 8)
    pool.clear()
    pool.release_private(8)
    _ran(pool, tier, A + [105], 3.0)  # recomputed (a hit under the threshold would be): no hit for A
    assert tier.node_state(A[0]) == (1, True, "ready") and tier.node_state(105) == (1, True, "writing")


def test_a_reset_is_refused_while_a_load_is_in_flight() -> None:
    pool = BlockPool(16)
    tier = _tier(pool)
    _ran(pool, tier, A, 1.0)
    tier.complete(2.0)
    _evict_gpu(pool, tier, 16)
    tier.load_back(A, 0, 4, 5.0)
    with pytest.raises(RuntimeError, match="while a host load is in flight"):
        tier.reset(5.0 + 2 * COPY)
    tier.reset(5.0 + 4 * COPY)  # the load is done by then: completed first, then emptied
    assert (tier.used, tier.node_state(A[0]), tier.take_events()) == (0, None, ([], A))  # each key by its latest event
