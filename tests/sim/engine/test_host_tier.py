"""Host KV tier: vLLM 0.31's CPU offloading at one block per chunk, and the copy lanes.

The scenario tests replay what vLLM 0.31's scheduler with its OffloadingConnector did on this
box (block size 16; A = 4 blocks, B shares A's first 3, C = 7 other blocks, D = A + 1 block,
E = A), calling the pool in the order the connector does. Both representations of the pool run
them (the engine's extents and the slot per key); `test_host_tier_model` holds them alike on random
histories."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tasim.sim.engine.host_tier import ExtentHostPool, HostAccess, HostCopy, HostPool, TransferLane, host_hit
from tasim.sim.engine.keyed_host_pool import KeyedHostPool

BS = 16
A = [1, 2, 3, 4]
B = [1, 2, 3, 5]
C = [10, 11, 12, 13, 14, 15, 16]
D = [1, 2, 3, 4, 6]
E = [1, 2, 3, 4]


class Pool:
    """A pool as the tests call it: copies named by their keys (a test completes the store it
    prepared by naming its blocks)."""

    def __init__(self, capacity: int, store_threshold: int = 0, max_tracker_size: int = 64_000) -> None:
        self.inner: HostPool = POOL_CLASS[0](capacity, store_threshold, max_tracker_size)
        self._copies: dict[tuple[int, ...], HostCopy] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def prepare_store(self, hashes: list[int], start: int, stop: int, access: HostAccess) -> list[int] | None:
        store = self.inner.prepare_store(hashes, start, stop, access)
        if store is None:
            return None
        self._copies[tuple(store.keys)] = store
        return store.keys

    def prepare_load(self, hashes: list[int], start: int, stop: int, access: HostAccess) -> list[int]:
        load = self.inner.prepare_load(hashes, start, stop, access)
        self._copies[tuple(load.keys)] = load
        return load.keys

    def complete_store(self, keys: list[int]) -> None:
        self.inner.complete_store(self._copies.pop(tuple(keys)))

    def complete_load(self, keys: list[int]) -> None:
        self.inner.complete_load(self._copies.pop(tuple(keys)))


POOL_CLASS: list[type[HostPool]] = [ExtentHostPool]


@pytest.fixture(autouse=True, params=[ExtentHostPool, KeyedHostPool], ids=["extents", "keyed"])
def pool_class(request: pytest.FixtureRequest) -> Iterator[None]:
    POOL_CLASS[0] = request.param
    yield
    POOL_CLASS[0] = ExtentHostPool


def _stored(pool: Pool, hashes: list[int]) -> list[int]:
    """One request stores its blocks, the store completes and the request finishes."""
    access = HostAccess()
    keys = pool.prepare_store(hashes, 0, len(hashes), access)
    assert keys is not None
    pool.complete_store(keys)
    pool.on_request_finished(access)
    return keys


def _a_and_b(pool: Pool) -> list[HostAccess]:
    """Step 1: A prefills 64 tokens, B (48 GPU-hit tokens) 16; both offer all their blocks.
    Step 2: both stores complete; A and B finish. Returns what they observed, for the manager
    to hear of their finish in step 3."""
    access_a, access_b = HostAccess(), HostAccess()
    assert pool.prepare_store(A, 0, 4, access_a) == A
    # B's first 3 blocks are pending from A's store: not stored twice, not observed by B.
    assert pool.prepare_store(B, 0, 4, access_b) == [5]
    assert (pool.resident, pool.pending) == (5, 5)
    pool.complete_store(A)
    pool.complete_store([5])
    assert pool.take_events() == ([1, 2, 3, 4, 5], [])
    return [access_a, access_b]


def test_measured_vllm_scenario() -> None:
    pool = Pool(64)
    finished = _a_and_b(pool)  # 5 host blocks stored, not 7
    # Step 3: C's 7 blocks are stored (the connector prepares the step's stores, then tells the
    # manager that A and B finished).
    access_c = HostAccess()
    assert pool.prepare_store(C, 0, 7, access_c) == C
    for access in finished:
        pool.on_request_finished(access)
    pool.complete_store(C)
    pool.on_request_finished(access_c)
    assert pool.take_events() == (C, [])
    assert pool.audit() is None
    # Step 5: D (80 tokens) misses the GPU; its first 4 blocks are on the host.
    blocks, deferred = pool.lookup(D, 0, 80 // BS)
    assert (blocks, deferred) == (4, False)
    assert host_hit(0, blocks, 80, BS) == (64, 64)
    access_d = HostAccess()
    loading = pool.prepare_load(D, 0, 4, access_d)
    assert loading == A and pool.hits == 4 and pool.refs(1) == 1
    # While D loads them, a request hitting them waits.
    assert pool.lookup(E, 0, 4) == (0, True)
    pool.complete_load(loading)  # step 6
    assert pool.refs(1) == 0 and pool.resident == 12  # the host copy stays
    # Step 7: D's stores start after its loaded prefix: only the new block.
    assert pool.prepare_store(D, 4, 5, access_d) == [6]
    pool.complete_store([6])
    pool.on_request_finished(access_d)
    # Step 9: E = A; the GPU holds all 4 blocks but its lookup stops at num_tokens - 1 (3
    # blocks); the host gives the 4th, and the load leaves the last token to compute.
    gpu_tokens = (64 - 1) // BS * BS
    blocks, deferred = pool.lookup(E, gpu_tokens // BS, 64 // BS)
    assert (blocks, deferred) == (1, False)
    assert host_hit(gpu_tokens, blocks, 64, BS) == (16, 63)
    assert pool.prepare_load(E, 3, 4, HostAccess()) == [4]
    assert pool.audit() is None


def test_eight_host_blocks_evict_a_before_b() -> None:
    pool = Pool(8)
    finished = _a_and_b(pool)
    access_c = HostAccess()
    # 5 resident, 3 free: C's 7 blocks evict 4, the lowest ranks (A's, inserted first).
    assert pool.prepare_store(C, 0, 7, access_c) == C
    for access in finished:
        pool.on_request_finished(access)
    assert pool.take_events() == ([], A)
    assert pool.refs(5) == 0 and pool.evicted == 4
    pool.complete_store(C)
    assert pool.lookup(D, 0, 5) == (0, False)  # D misses entirely
    assert pool.audit() is None


def test_finish_reranks_tail_first() -> None:
    pool = Pool(6)
    _stored(pool, [1, 2, 3, 4])  # re-ranked 4, 3, 2, 1: the head is newest
    pool.take_events()
    assert pool.prepare_store([7, 8, 9], 0, 3, HostAccess()) == [7, 8, 9]
    assert pool.take_events() == ([], [4])
    assert pool.prepare_store([20], 0, 1, HostAccess()) == [20]
    assert pool.take_events() == ([], [3])


def test_ranks_are_kept_without_a_finish() -> None:
    pool = Pool(4)
    access = HostAccess()
    keys = pool.prepare_store([1, 2, 3, 4], 0, 4, access)
    assert keys is not None
    pool.complete_store(keys)
    pool.take_events()
    assert pool.prepare_store([7, 8], 0, 2, HostAccess()) == [7, 8]  # insertion order: head first
    assert pool.take_events() == ([], [1, 2])


def test_ready_reoffer_counts_as_observed() -> None:
    pool = Pool(3)
    _stored(pool, [1])
    _stored(pool, [2])
    reuse = HostAccess()
    assert pool.prepare_store([1], 0, 1, reuse) == []  # already resident: not stored twice
    pool.on_request_finished(reuse)  # ... but 1 is now newer than 2
    pool.take_events()
    assert pool.prepare_store([3, 4], 0, 2, HostAccess()) == [3, 4]
    assert pool.take_events() == ([], [2])


def test_offered_blocks_are_never_evicted() -> None:
    pool = Pool(2)
    _stored(pool, [1])
    _stored(pool, [2])
    pool.take_events()
    assert pool.prepare_store([1, 5], 0, 2, HostAccess()) == [5]  # 1 is the oldest, but offered
    assert pool.take_events() == ([], [2])
    single = Pool(1)
    _stored(single, [1])
    assert single.prepare_store([1, 5], 0, 2, HostAccess()) is None
    assert single.refs(1) == 0 and single.audit() is None


def test_pending_store_defers_the_lookup() -> None:
    pool = Pool(64)
    keys = pool.prepare_store(A, 0, 4, HostAccess())
    assert keys == A
    # E' = A + 1 block, 16 GPU-hit tokens: its host run is pending, so it waits (measured:
    # ``lookup E: gpu=16 -> (None, False)``).
    longer = [*A, 6]
    assert pool.lookup(longer, 1, 5) == (0, True)
    assert pool.lookup([9, *A[1:]], 0, 4) == (0, False)  # a miss ends the run first
    pool.complete_store(A)
    blocks, deferred = pool.lookup(longer, 0, 5)  # measured: ``gpu=0 -> (64, True)``
    assert (blocks, deferred) == (4, False)
    assert host_hit(0, blocks, 80, BS) == (64, 64)


def test_loading_a_pending_block_is_refused() -> None:
    pool = Pool(4)
    assert pool.prepare_store([1], 0, 1, HostAccess()) == [1]
    with pytest.raises(ValueError):
        pool.prepare_load([1], 0, 1, HostAccess())


def test_pinned_block_is_never_evicted_and_the_copy_stays() -> None:
    pool = Pool(4)
    _stored(pool, [1, 2, 3, 4])
    pool.take_events()
    loading = pool.prepare_load([1, 2], 0, 2, HostAccess())
    assert (pool.refs(1), pool.evictable) == (1, 2)
    assert pool.prepare_store([7, 8, 9], 0, 3, HostAccess()) is None  # need 3, 2 evictable
    assert pool.prepare_store([7, 8], 0, 2, HostAccess()) == [7, 8]
    assert pool.take_events() == ([], [4, 3])
    pool.complete_load(loading)
    assert (pool.refs(1), pool.refs(2), pool.evictable) == (0, 0, 2)
    assert pool.lookup([1, 2], 0, 2) == (2, False)
    assert pool.audit() is None


def test_full_pool_refuses_then_retry_succeeds() -> None:
    pool = Pool(4)
    first = pool.prepare_store([1, 2, 3, 4], 0, 4, HostAccess())
    assert first is not None
    access = HostAccess()
    assert pool.prepare_store([5], 0, 1, access) is None  # all 4 pending: nothing to evict
    assert (pool.resident, pool.pending) == (4, 4)
    pool.complete_store(first)
    assert pool.prepare_store([5], 0, 1, access) == [5]  # offered again next step
    assert pool.take_events() == ([2, 3, 4], [1])  # 1 was stored, then evicted
    assert (pool.resident, pool.pending, pool.free) == (4, 1, 0)
    assert pool.audit() is None


def test_store_threshold_stores_at_the_second_offer() -> None:
    pool = Pool(64, store_threshold=2)
    assert pool.prepare_store(A, 0, 4, HostAccess()) == []
    assert pool.prepare_store(B, 0, 4, HostAccess()) == [1, 2, 3]
    pool.complete_store([1, 2, 3])
    blocks, deferred = pool.lookup(D, 0, 5)
    assert (blocks, deferred) == (3, False)
    assert host_hit(0, blocks, 80, BS) == (48, 48)  # measured: D loads 48 and computes 32


def test_offer_table_forgets_the_least_recently_offered() -> None:
    pool = Pool(8, store_threshold=2, max_tracker_size=2)
    assert pool.prepare_store([1, 2], 0, 2, HostAccess()) == []
    assert pool.prepare_store([3], 0, 1, HostAccess()) == []  # forgets 1
    assert pool.prepare_store([1, 2], 0, 2, HostAccess()) == [2]


def test_events_report_each_block_by_its_latest_state() -> None:
    pool = Pool(1)
    _stored(pool, [1])
    assert pool.prepare_store([2], 0, 1, HostAccess()) == [2]
    pool.complete_store([2])
    assert pool.prepare_store([1], 0, 1, HostAccess()) == [1]
    pool.complete_store([1])
    assert pool.take_events() == ([1], [2])
    assert pool.take_events() == ([], [])


def test_lane_time_and_fifo() -> None:
    four_blocks = 4 * BS * 131072
    assert four_blocks == 8_388_608
    assert TransferLane(32).submit(0.0, four_blocks) == 0.000262144
    # Two loads queued together at 2 s on a 0.01 GB/s lane finish back to back (measured in
    # Dynamo's replay at 2838.861 and 3468.007 ms).
    lane = TransferLane(0.01)
    assert lane.submit(2.0, four_blocks) == pytest.approx(2.8388608)
    assert lane.submit(2.0, 3 * BS * 131072) == pytest.approx(3.4680064)
    assert lane.submit(10.0, four_blocks) == pytest.approx(10.8388608)  # an idle lane starts at once
    assert lane.busy_s == pytest.approx(0.8388608 * 2 + 0.6291456)
    assert lane.bytes_moved == 2 * four_blocks + 3 * BS * 131072


def test_unlimited_lane_is_instant() -> None:
    for lane in (TransferLane(0), TransferLane(None)):
        assert lane.submit(1.5, 10**12) == 1.5
        assert (lane.busy_s, lane.bytes_moved) == (0.0, 10**12)


def test_host_hit_arithmetic() -> None:
    assert host_hit(0, 0, 80, BS) == (0, 0)
    assert host_hit(32, 0, 80, BS) == (0, 32)
    assert host_hit(0, 4, 70, BS) == (64, 64)  # a partial last block is never on the host
    assert host_hit(48, 1, 64, BS) == (16, 63)  # the whole prompt: its last token is computed


def test_invalid_settings() -> None:
    with pytest.raises(ValueError):
        Pool(0)
    with pytest.raises(ValueError):
        TransferLane(-1.0)
