"""Dynamo mocker's host tier (`MockerHostPool`, a linked LRU) against the plain statement of its
rules, on random histories.

`SlotPerKeyMockerPool` states them one slot at a time on `KeyedHostPool` (an ordered map from key
to slot that is the LRU order itself, pinned and pending slots included): a touch moves each
ready, unpinned key to the end, tail first; a completed store or load moves its cohort there in
rank order. `MockerHostPool` must agree with it on every lookup, every store it takes or refuses,
every KV event and count, and the recency of every ready, unpinned slot, whatever the mix of
shared prefixes, touches, loads, overlapping stores, thresholds and resets."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from itertools import count
from typing import Any

import pytest
from test_host_tier_model import _chains

from tasim.core.model import BlockHash
from tasim.sim.engine.host_tier import HostAccess, HostCopy
from tasim.sim.engine.keyed_host_pool import KeyedHostPool
from tasim.sim.engine.mocker_host_tier import MockerHostPool


class SlotPerKeyMockerPool:
    """The mocker's recency, a move of one key at a time, on a `KeyedHostPool` (wrapped, not
    subclassed: the pool may be compiled)."""

    def __init__(self, capacity: int, store_threshold: int, max_tracker_size: int, cohort_order: Mapping[BlockHash, int] | None) -> None:
        self.pool = KeyedHostPool(capacity, store_threshold, max_tracker_size)
        self.cohort_order = cohort_order

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

    def touch_prompt(self, hashes: Sequence[BlockHash], prompt_blocks: int) -> None:
        slots = self.pool._slots
        for depth in range(min(prompt_blocks, len(hashes)) - 1, -1, -1):
            slot = slots.get(hashes[depth])
            if slot is not None and slot.refs == 0:
                slots.move_to_end(hashes[depth])

    def complete_store(self, store: HostCopy) -> None:
        self.pool.complete_store(store)
        self._touch_cohort(store.keys)

    def complete_load(self, load: HostCopy) -> None:
        self.pool.complete_load(load)
        self._touch_cohort([key for key in load.keys if self.pool.refs(key) == 0])

    def _touch_cohort(self, keys: Sequence[BlockHash]) -> None:
        order = self.cohort_order or {}
        slots = self.pool._slots
        for key in sorted(keys, key=lambda key: order.get(key, key)):
            if key in slots:
                slots.move_to_end(key)

    def ready_recency(self) -> list[BlockHash]:
        return [key for key in self.pool.recency() if self.pool.refs(key) == 0]


def _rank_chain(ranks: dict[int, tuple[int, ...]] | None, order: dict[int, int] | None, chain: list[int]) -> None:
    """`tasim.validation.mocker_hashes.mocker_cohort_ranks` for one more chain."""
    if ranks is not None and order is not None:
        prompt = tuple(order[key] for key in chain)
        for key in chain:
            ranks.setdefault(key, prompt)


def _state(pool: MockerHostPool | SlotPerKeyMockerPool, chains: list[list[int]]) -> tuple[object, ...]:
    every = sorted({key for chain in chains for key in chain})
    recency = pool.recency() if isinstance(pool, MockerHostPool) else pool.ready_recency()
    return (pool.resident, pool.pending, pool.evictable, pool.hits, pool.stored, pool.evicted, [pool.refs(key) for key in every], recency)


def _history(seed: int) -> tuple[int, int]:
    """One random history run on both pools in lockstep; returns its evictions and the prompt
    blocks its touches moved."""
    rng = random.Random(seed)
    fresh = count(1000)
    chains = _chains(rng, fresh)
    capacity = rng.choice([4, 8, 16, 40])
    threshold = rng.choice([0, 0, 0, 2, 3])
    tracker = rng.choice([6, 64_000])
    order = {key: rng.randrange(1 << 64) for key in range(1000, 1300)} if rng.random() < 0.7 else None
    ranks: dict[int, tuple[int, ...]] | None = None if order is None else {}
    for chain in chains:
        _rank_chain(ranks, order, chain)
    ours = MockerHostPool(capacity, threshold, tracker, ranks)
    plain = SlotPerKeyMockerPool(capacity, threshold, tracker, order)
    jobs: list[tuple[HostCopy, HostCopy]] = []
    moved = 0
    for _ in range(rng.randrange(50, 300)):
        action = rng.random()
        hashes = rng.choice(chains)
        if action < 0.06 and len(chains) < 14:
            base = rng.choice(chains)
            chains.append(base[: rng.randrange(len(base) + 1)] + [next(fresh) for _ in range(rng.randrange(1, 10))])
            _rank_chain(ranks, order, chains[-1])
        elif action < 0.25:
            start = rng.randrange(len(hashes))
            found = ours.lookup(hashes, start, len(hashes))
            assert found == plain.lookup(hashes, start, len(hashes))
            blocks, deferred = found
            if blocks and not deferred and rng.random() < 0.6:
                stop = start + blocks
                loads = (ours.prepare_load(hashes, start, stop, HostAccess()), plain.prepare_load(hashes, start, stop, HostAccess()))
                assert loads[0].keys == loads[1].keys
                jobs.append(loads)
        elif action < 0.5:
            before = plain.ready_recency()
            prompt = rng.randrange(len(hashes) + 2)
            # the chain's stores in flight, as a request knows its own: pending, skipped unread
            pending = sorted(run for job, _ in jobs if not job.load and job.hashes is hashes for run in job.runs)
            ours.touch_prompt(hashes, prompt, pending)
            plain.touch_prompt(hashes, prompt)
            moved += before != plain.ready_recency()
        elif action < 0.75:
            start = rng.randrange(len(hashes))
            stop = rng.randrange(start + 1, len(hashes) + 1)
            stores = (ours.prepare_store(hashes, start, stop, HostAccess()), plain.prepare_store(hashes, start, stop, HostAccess()))
            assert (stores[0] is None) == (stores[1] is None)
            if stores[0] is not None and stores[1] is not None:
                assert (stores[0].keys, stores[0].runs) == (stores[1].keys, stores[1].runs)
                if stores[0].keys:
                    jobs.append((stores[0], stores[1]))
        elif action < 0.99 and jobs:
            for pool, job in zip((ours, plain), jobs.pop(rng.randrange(len(jobs))), strict=True):
                if job.load:
                    pool.complete_load(job)
                else:
                    pool.complete_store(job)
        elif not any(job.load for job, _ in jobs):
            ours.reset()
            plain.reset()
            jobs.clear()
        assert ours.take_events() == plain.take_events()
        assert _state(ours, chains) == _state(plain, chains)
        assert ours.audit() is None
    return ours.evicted, moved


@pytest.mark.parametrize("block", range(8))
def test_the_linked_lru_agrees_with_a_slot_per_key(block: int) -> None:
    evicted, moved = map(sum, zip(*(_history(seed) for seed in range(block * 60, block * 60 + 60)), strict=True))
    assert evicted > 0 and moved > 0  # the histories do fill the pools and reorder them
