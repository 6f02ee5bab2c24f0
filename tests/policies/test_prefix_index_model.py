"""`ApproxIndex` against the plain statement of its rules, on random histories.

`HeapApproxIndex` keeps one heap entry (expiry, -depth, worker, block) per routed block and pops
them in that order: on expiry every entry due, on a trim the earliest until enough current
blocks went; an entry whose block was routed again since (or forgotten) is stale and skipped.
`ApproxIndex` files a routing's blocks together under their expiry, with a count of the blocks
that still hold it. The two must agree on every overlap, size and held block with its expiry (and
the counts must be right), whatever the mix of shared and repeated blocks, refreshes, ties in
expiry, clocks that stand still or go back, trims and forgotten workers."""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import takewhile

import pytest

from tasim.core.model import BlockHash
from tasim.policies.prefix_index import PRUNE_TO_FRACTION, ApproxIndex


class HeapApproxIndex:
    def __init__(self, workers: Iterable[str], ttl_s: float, max_size: int) -> None:
        self.ttl_s = ttl_s
        self.max_size = max_size
        self.expiry: dict[str, dict[BlockHash, float]] = {w: {} for w in workers}
        self.heap: list[tuple[float, int, str, BlockHash]] = []
        self.size = 0

    def routed(self, worker: str, hashes: Sequence[BlockHash], now: float) -> None:
        expiry = now + self.ttl_s
        table = self.expiry[worker]
        for depth, block in enumerate(hashes):
            if block not in table:
                self.size += 1
            table[block] = expiry
            heapq.heappush(self.heap, (expiry, -depth, worker, block))
        if self.size > self.max_size:
            self.drop_earliest(self.size - int(self.max_size * PRUNE_TO_FRACTION))

    def forget(self, worker: str) -> None:
        self.size -= len(self.expiry[worker])
        self.expiry[worker].clear()

    def overlaps(self, hashes: Sequence[BlockHash], now: float) -> dict[str, int]:
        while self.heap and self.heap[0][0] <= now:
            self.pop_live()
        return {w: len(list(takewhile(table.__contains__, hashes))) for w, table in self.expiry.items()}

    def drop_earliest(self, count: int) -> None:
        while count > 0 and self.heap:
            if self.pop_live():
                count -= 1

    def pop_live(self) -> bool:
        expiry, _, worker, block = heapq.heappop(self.heap)
        table = self.expiry[worker]
        if table.get(block) == expiry:
            del table[block]
            self.size -= 1
            return True
        return False


WORKERS = ("w0", "w1", "w2")


def _prompt(rng: random.Random) -> tuple[BlockHash, ...]:
    """A chain off one of a few shared stems, or loose blocks from a small alphabet (repeats and
    blocks at several depths included)."""
    if rng.random() < 0.7:
        stem = rng.randrange(4)
        return tuple(stem * 1000 + depth for depth in range(rng.randrange(0, 12)))
    return tuple(rng.randrange(20) for _ in range(rng.randrange(0, 8)))


@pytest.mark.parametrize("seed", range(40))
def test_matches_one_heap_entry_per_block(seed: int) -> None:
    rng = random.Random(seed)
    ttl_s = rng.choice([0.5, 2.0, 5.0])
    max_size = rng.choice([4, 10, 25, 1 << 20])
    index, model = ApproxIndex(WORKERS, ttl_s, max_size), HeapApproxIndex(WORKERS, ttl_s, max_size)
    now = 0.0
    for _ in range(300):
        roll = rng.random()
        if roll < 0.5:
            now += rng.choice([0.0, 0.0, 0.25, 0.5, 1.0, 0.1])  # 0.1: sums that round apart
        elif roll < 0.55:
            now -= rng.choice([0.25, 1.0])
        op = rng.random()
        if op < 0.55:
            worker, prompt = rng.choice(WORKERS), _prompt(rng)
            index.routed(worker, prompt, now)
            model.routed(worker, prompt, now)
        elif op < 0.95:
            prompt = _prompt(rng)
            assert index.overlaps(prompt, now) == model.overlaps(prompt, now)
        else:
            worker = rng.choice(WORKERS)
            index.forget(worker)
            model.forget(worker)
        assert index.size() == model.size
        assert index._expiry == model.expiry
        held = Counter(expiry for table in model.expiry.values() for expiry in table.values())
        assert {expiry: due.held for expiry, due in index._due.items() if due.held} == held
