"""The extent-based host pool against the slot-per-key one, on random histories.

`KeyedHostPool` states vLLM 0.31's rules one slot at a time (an ordered map that is the LRU order
itself); `ExtentHostPool` must agree with it on every lookup, every store it takes or refuses,
every KV event and count, and the whole recency order, whatever the mix of shared prefixes,
divergent branches, loads, overlapping stores, finishes, store thresholds and resets."""

from __future__ import annotations

import random
from itertools import count

import pytest

from tasim.sim.engine.host_tier import ExtentHostPool, HostAccess, HostCopy, HostPool
from tasim.sim.engine.keyed_host_pool import KeyedHostPool


def _chains(rng: random.Random, fresh: count[int]) -> list[list[int]]:
    """Chains of block hashes as chained hashing makes them: a block names its whole prefix, so
    chains that share a block share every block above it."""
    chains: list[list[int]] = []
    for _ in range(rng.randrange(3, 9)):
        prefix = rng.choice(chains)[: rng.randrange(12)] if chains and rng.random() < 0.75 else []
        chains.append(prefix + [next(fresh) for _ in range(rng.randrange(1, 14))])
    return chains


def _state(pool: HostPool, chains: list[list[int]]) -> tuple[object, ...]:
    every = sorted({key for chain in chains for key in chain})
    return (
        pool.resident,
        pool.pending,
        pool.evictable,
        pool.hits,
        pool.stored,
        pool.evicted,
        [pool.refs(key) for key in every],
        pool.recency(),
    )


def _history(seed: int) -> int:
    """One random history run on both pools in lockstep; returns the evictions it made."""
    rng = random.Random(seed)
    fresh = count(1000)
    chains = _chains(rng, fresh)
    capacity = rng.choice([4, 8, 16, 40])
    threshold = rng.choice([0, 0, 0, 2, 3])
    tracker = rng.choice([6, 64_000])
    pools: tuple[HostPool, HostPool] = (ExtentHostPool(capacity, threshold, tracker), KeyedHostPool(capacity, threshold, tracker))
    jobs: list[tuple[HostCopy, HostCopy]] = []
    requests: list[tuple[list[int], HostAccess, HostAccess]] = []  # running: its chain, what it observed in each pool
    for _ in range(rng.randrange(50, 300)):
        action = rng.random()
        hashes = rng.choice(chains)
        if action < 0.08 and len(chains) < 14:
            base = rng.choice(chains)
            chains.append(base[: rng.randrange(len(base) + 1)] + [next(fresh) for _ in range(rng.randrange(1, 10))])
        elif action < 0.3:
            start = rng.randrange(len(hashes))
            found = [pool.lookup(hashes, start, len(hashes)) for pool in pools]
            assert found[0] == found[1]
            blocks, deferred = found[0]
            if blocks and not deferred and rng.random() < 0.6:
                accesses = (HostAccess(), HostAccess())
                loads = [pool.prepare_load(hashes, start, start + blocks, access) for pool, access in zip(pools, accesses, strict=True)]
                assert loads[0].keys == loads[1].keys
                jobs.append((loads[0], loads[1]))
                requests.append((hashes, *accesses))
        elif action < 0.6:
            accesses = (HostAccess(), HostAccess())
            if requests and rng.random() < 0.5:  # a running request stores more of its chain
                hashes, *accesses = requests.pop(rng.randrange(len(requests)))
            start = rng.randrange(len(hashes))
            stop = rng.randrange(start + 1, len(hashes) + 1)
            stores = [pool.prepare_store(hashes, start, stop, access) for pool, access in zip(pools, accesses, strict=True)]
            assert (stores[0] is None) == (stores[1] is None)
            if stores[0] is not None and stores[1] is not None:
                assert stores[0].keys == stores[1].keys
                if stores[0].keys:
                    jobs.append((stores[0], stores[1]))
            requests.append((hashes, accesses[0], accesses[1]))
        elif action < 0.85 and jobs:
            ours, theirs = jobs.pop(rng.randrange(len(jobs)))
            for pool, job in ((pools[0], ours), (pools[1], theirs)):
                if job.load:
                    pool.complete_load(job)
                else:
                    pool.complete_store(job)
        elif action < 0.99 and requests:
            _, *accesses = requests.pop(rng.randrange(len(requests)))
            for pool, access in zip(pools, accesses, strict=True):
                pool.on_request_finished(access)
        elif not any(job.load for job, _ in jobs):  # vLLM refuses a reset under a load
            for pool in pools:
                pool.reset()
            jobs.clear()  # completions of dropped stores are ignored, as the engine drops them
        assert pools[0].take_events() == pools[1].take_events()
        assert _state(pools[0], chains) == _state(pools[1], chains)
        assert pools[0].audit() is None
    return pools[0].evicted


@pytest.mark.parametrize("block", range(10))
def test_extents_agree_with_a_slot_per_key(block: int) -> None:
    evicted = sum(_history(seed) for seed in range(block * 60, block * 60 + 60))
    assert evicted > 0  # the histories do fill the pools
