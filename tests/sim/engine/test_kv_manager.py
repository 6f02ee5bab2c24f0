"""The KV cache manager with exact expected values: computed prefixes, slots taken and cached,
evictions and their events, pins, the block boundaries of folded runs, and its audit after
random operations."""

from __future__ import annotations

import random

import pytest

from tasim.sim.engine.kv_manager import ComputedBlocks, HostTierSetup, KVCacheManager, RequestBlocks


def _counts(computed: ComputedBlocks) -> tuple[int, int, int]:
    return computed.gpu_blocks, computed.gpu_active_blocks, computed.host_blocks


def _admit(kv: KVCacheManager, request: RequestBlocks, num_tokens: int) -> ComputedBlocks:
    """Admit ``request`` as the scheduler does, with slots for its first ``num_tokens`` tokens."""
    computed = kv.get_computed_blocks(request, num_tokens)
    assert kv.fits(num_tokens, computed)
    assert kv.allocate_slots(request, num_tokens, computed)
    return computed


def test_a_warm_prefix_is_computed_and_stays_cached_after_free() -> None:
    kv = KVCacheManager(8, 4)
    a = RequestBlocks("a", (1, 2, 3, 4))
    assert _counts(_admit(kv, a, 16)) == (0, 0, 0)  # a cold cache
    assert (a.phys, a.full_done) == (4, 4)
    assert kv.take_events() == ([1, 2, 3, 4], [])
    b = RequestBlocks("b", (1, 2, 9, 10))
    assert _counts(kv.get_computed_blocks(b, 16)) == (2, 2, 0)  # a still references 1 and 2
    kv.free(a)
    assert (a.phys, a.full_done, a.claim.blocks) == (0, 0, 0)
    assert (kv.active, kv.cached_blocks, kv.available) == (0, 4, 8)  # freed blocks stay cached
    assert kv.take_events() == ([], [])
    warm = kv.get_computed_blocks(b, 16)
    assert _counts(warm) == (2, 0, 0)  # cached, no longer referenced
    assert (warm.host_blocks, warm.blocks) == (0, 2)  # no slower tier: nothing computed off the GPU
    again = RequestBlocks("again", (1, 2, 3, 4))
    assert kv.get_computed_blocks(again, 16).gpu_blocks == 3  # its last token is always computed
    assert kv.get_computed_blocks(again, 17).gpu_blocks == 4


def test_without_prefix_caching_nothing_is_computed_or_cached() -> None:
    kv = KVCacheManager(8, 4, enable_caching=False)
    a = RequestBlocks("a", (1, 2))
    _admit(kv, a, 8)
    kv.free(a)
    assert _counts(kv.get_computed_blocks(RequestBlocks("b", (1, 2)), 9)) == (0, 0, 0)
    assert (kv.cached_blocks, kv.take_events()) == (0, ([], []))


def test_allocation_evicts_least_recently_used_blocks_and_reports_them() -> None:
    kv = KVCacheManager(6, 4)
    a, b = RequestBlocks("a", (1, 2, 3)), RequestBlocks("b", (5, 6))
    _admit(kv, a, 12)
    _admit(kv, b, 8)
    kv.free(a)  # a's blocks are released first, its deepest first: 3, 2, 1, then b's 6, 5
    kv.free(b)
    assert kv.take_events() == ([1, 2, 3, 5, 6], [])
    assert (kv.active, kv.cached_blocks, kv.available) == (0, 5, 6)
    c = RequestBlocks("c", (7, 8, 9))
    _admit(kv, c, 12)  # the free block, then the two least recently used
    assert kv.take_events() == ([7, 8, 9], [3, 2])
    assert (kv.active, kv.cached_blocks, kv.available) == (3, 6, 3)
    d = RequestBlocks("d", (11, 12, 13, 14))
    assert not kv.fits(16, kv.get_computed_blocks(d, 16))
    assert not kv.allocate_slots(d, 16)  # all or nothing
    assert (d.phys, kv.available, kv.take_events()) == (0, 3, ([], []))


def test_slots_grow_a_block_at_a_time_and_cache_the_blocks_they_complete() -> None:
    kv = KVCacheManager(8, 4)
    a = RequestBlocks("a", (1, 2, 3))
    _admit(kv, a, 5)  # a full block and one token of the next
    assert (a.phys, a.full_done, kv.take_events()) == (2, 1, ([1], []))
    assert kv.allocate_slots(a, 8)  # fills the second block: nothing to take
    assert (a.phys, a.full_done, kv.take_events()) == (2, 2, ([2], []))
    assert kv.allocate_slots(a, 8)  # nothing to do
    assert kv.allocate_slots(a, 9)
    assert (a.phys, a.full_done, kv.active, kv.take_events()) == (3, 2, 3, ([], []))


def test_a_pin_keeps_blocks_until_a_request_takes_them_over() -> None:
    kv = KVCacheManager(4, 4)
    a = RequestBlocks("a", (1, 2))
    _admit(kv, a, 8)
    kv.free(a)
    assert kv.pin("p", (1, 2, 3)) == 2  # 3 was never cached
    assert (kv.has_pin("p"), kv.pinned_blocks, kv.pinned_hashes()) == (True, 2, [[1, 2]])
    assert (kv.active, kv.available) == (2, 2)
    stranger = RequestBlocks("stranger", (5, 6, 7))
    assert not kv.fits(12, kv.get_computed_blocks(stranger, 12))  # the pinned blocks cannot be evicted
    returning = RequestBlocks("returning", (1, 2, 3))
    computed = kv.get_computed_blocks(returning, 12)
    assert _counts(computed) == (2, 2, 0)
    assert kv.fits(12, computed)  # its prefix is referenced already: one more block
    assert kv.allocate_slots(returning, 12, computed, release_pin="p")
    assert (kv.has_pin("p"), kv.pinned_blocks, returning.phys, kv.active) == (False, 0, 3, 3)
    assert kv.take_events() == ([1, 2, 3], [])
    assert kv.audit([returning], [a, stranger], every_block=True) is None
    assert not kv.unpin("p")


def test_the_audit_names_a_queued_request_that_occupies_blocks() -> None:
    kv = KVCacheManager(4, 4)
    a = RequestBlocks("a", (1,))
    _admit(kv, a, 4)
    assert kv.audit([a], []) is None
    assert kv.audit([], [a]) == "queued request a occupies 1 blocks"


def test_boundaries_of_a_decode_run() -> None:
    kv = KVCacheManager(8, 4)
    a = RequestBlocks("a", (1, 2, 3, 4))
    _admit(kv, a, 6)
    a.computed = 5  # step 1 of the run computes token 6
    # Step k computes token 5 + k: token 8 completes block 2 (step 3), token 9 starts block 3
    # (step 4), token 12 completes it (step 7), token 13 starts block 4 (step 8).
    last, boundaries = kv.plan_boundaries([(a, 1)], None, 10, ()) or (0, [])
    assert last == 10
    assert [(b.index, b.reserves) for b in boundaries] == [(3, [(a, 8)]), (4, [(a, 9)]), (7, [(a, 12)]), (8, [(a, 13)])]
    # The queue's head waits for block 2 of this chain: the run ends with the step completing it.
    last, boundaries = kv.plan_boundaries([(a, 1)], None, 10, (1, 2)) or (0, [])
    assert (last, [(b.index, b.reserves) for b in boundaries]) == (3, [(3, [(a, 8)])])
    assert kv.plan_boundaries([(a, 1)], None, 10, (1, 99)) is not None  # another chain's block 2


def test_a_decode_run_stops_before_a_step_whose_block_cannot_be_had() -> None:
    kv = KVCacheManager(3, 4)
    a = RequestBlocks("a", (1, 2, 3, 4))
    _admit(kv, a, 6)  # 2 of 3 blocks: step 4 takes the last one, step 8 would preempt
    a.computed = 5
    last, boundaries = kv.plan_boundaries([(a, 1)], None, 10, ()) or (0, [])
    assert (last, [b.index for b in boundaries]) == (7, [3, 4, 7])
    assert kv.plan_boundaries([(a, 1)], None, 1, ()) is None


def test_a_folded_prefill_reserves_its_chunk_every_step() -> None:
    kv = KVCacheManager(16, 4)
    p = RequestBlocks("p", tuple(range(100, 110)))
    _admit(kv, p, 8)
    p.computed = 2  # step 1 of the run computes a chunk of 6
    last, boundaries = kv.plan_boundaries([], (p, 6), 3, ()) or (0, [])
    assert (last, [(b.index, b.reserves) for b in boundaries]) == (3, [(2, [(p, 14)]), (3, [(p, 20)])])
    for boundary in boundaries:
        for request, upto in boundary.reserves:
            assert kv.allocate_slots(request, upto)
    assert (p.phys, p.full_done, kv.take_events()) == (5, 5, ([100, 101, 102, 103, 104], []))


def _with_hicache(num_blocks: int) -> tuple[KVCacheManager, RequestBlocks]:
    """A pool of ``num_blocks`` blocks of 4 tokens behind SGLang's host tier (instant copies),
    where request a ran (1, 2, 3, 4), was written to the host and freed: its blocks are
    cached, inactive, evicted 4 first."""
    kv = KVCacheManager(num_blocks, 4, cache_duplicates=True)
    kv.add_host_tier(HostTierSetup(16, 4096, 0.0, 0.0, semantics="sglang", load_back_threshold=1))
    assert kv.hicache is not None
    a = RequestBlocks("a", (1, 2, 3, 4))
    _admit(kv, a, 16)
    kv.take_events()
    kv.insert(a, 4, 0.0)  # write-through: the 4 blocks are written at once
    kv.hicache.complete(0.0)
    kv.free(a)
    return kv, a


def test_sglang_sees_a_gpu_eviction_before_the_next_lookup_of_the_same_step() -> None:
    kv, _ = _with_hicache(8)
    assert kv.hicache is not None
    c = RequestBlocks("c", (21, 22, 23, 24, 25))
    _admit(kv, c, 20)  # 4 free blocks and a's deepest, evicted (not yet drained as an event)
    assert kv.hicache.node_state(4) == (1, False, "ready")
    d = RequestBlocks("d", (1, 2, 3, 4, 5))
    assert _counts(kv.get_computed_blocks(d, 20)) == (3, 0, 1)  # block 4 is found on the host
    assert kv.take_events() == ([21, 22, 23, 24, 25], [4])
    assert kv.hicache.node_state(4) == (1, False, "ready")  # told twice: no change


def test_with_sglang_a_decode_run_stops_before_evicting_a_block_the_blocked_head_looks_up() -> None:
    kv, _ = _with_hicache(8)
    r = RequestBlocks("r", (31, 32, 33, 34, 35, 36))
    _admit(kv, r, 6)  # 2 blocks: 2 free left, then a's 4, 3, 2, 1 go
    r.computed = 5
    # Step k computes token 5 + k: it takes a block at steps 4, 8, 12 and 16, and completes
    # one at steps 3, 7, 11 and 15. The head looks up blocks 1 to 3: steps 4 and 8 take the
    # free blocks, step 12 would evict 4 (not looked up) and step 16 block 3.
    last, boundaries = kv.plan_boundaries([(r, 1)], None, 20, (1, 2, 3)) or (0, [])
    assert (last, [b.index for b in boundaries]) == (15, [3, 4, 7, 8, 11, 12, 15])
    last, boundaries = kv.plan_boundaries([(r, 1)], None, 20, ()) or (0, [])
    assert (last, [b.index for b in boundaries]) == (20, [3, 4, 7, 8, 11, 12, 15, 16, 19, 20])


@pytest.mark.parametrize(("eviction", "duplicates"), [("lru", False), ("lineage", False), ("lru", True)])
def test_the_audit_passes_after_random_operations(eviction: str, duplicates: bool) -> None:
    rng = random.Random(7)
    kv = KVCacheManager(40, 4, eviction=eviction, cache_duplicates=duplicates)  # type: ignore[arg-type]
    families = [[family * 1000 + b for b in range(12)] for family in range(4)]
    running: dict[str, tuple[RequestBlocks, int]] = {}  # id -> (request, tokens with slots)
    idle: list[RequestBlocks] = []
    evicted = 0
    for serial in range(600):
        move = rng.random()
        if move < 0.35:  # admit a request that shares a prefix with its family
            family = rng.choice(families)
            hashes = tuple(family[: rng.randint(2, 8)] + [-(serial * 100 + b) for b in range(1, 5)])  # then its own blocks
            request = RequestBlocks(f"r{serial}", hashes)
            tokens = rng.randint(1, len(hashes) * 4)
            computed = kv.get_computed_blocks(request, tokens)
            if kv.fits(tokens, computed):
                pin = rng.choice([None, "p0", "p1"])
                assert kv.allocate_slots(request, tokens, computed, release_pin=pin)
                running[request.request_id] = (request, tokens)
            else:
                idle.append(request)
        elif move < 0.7 and running:  # a step: more tokens, or preempted when they cannot be had
            request, tokens = running[rng.choice(sorted(running))]
            tokens = min(tokens + rng.randint(1, 6), len(request.block_hashes) * 4)
            if kv.allocate_slots(request, tokens):
                running[request.request_id] = (request, tokens)
            else:
                kv.free(request)
                idle.append(running.pop(request.request_id)[0])
        elif move < 0.9 and running:  # a request finishes
            request, _ = running.pop(rng.choice(sorted(running)))
            kv.free(request)
            idle.append(request)
        elif move < 0.95:
            kv.pin(rng.choice(["p0", "p1"]), tuple(rng.choice(families)[: rng.randint(1, 12)]))
        else:
            kv.unpin(rng.choice(["p0", "p1"]))
        evicted += len(kv.take_events()[1])
        holders = [request for request, _ in running.values()]
        assert kv.audit(holders, idle, every_block=True) is None
        pool = kv.block_pool
        assert pool.free + pool.active + pool.inactive == pool.num_blocks
        assert kv.available == pool.free + pool.inactive
    assert running and idle and evicted > 100  # requests of both kinds, a pool under pressure
