"""The prompts a router has booked on one worker, as a tree of block runs.

Dynamo's router counts the distinct blocks of the prompts active on a worker (``A_w``) and how
many leading blocks of a new prompt are among them. Every booked prompt is a chain from block 0,
and a chained hash stands for its whole prefix, so the booked prompts form a tree. Keeping it
as *runs* (consecutive blocks that the same prompts share, with their count) instead of a count
per block makes booking and unbooking a prompt cost one step per run on its path, not one per
block: a prompt of 200 blocks typically crosses two or three runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from tasim.core.model import BlockHash, shared_prefix_end


class _Run:
    """Blocks ``hashes[start:stop]``, booked ``count`` times (``hashes`` is any chain holding them)."""

    __slots__ = ("hashes", "start", "stop", "count")

    def __init__(self, hashes: Sequence[BlockHash], start: int, stop: int) -> None:
        self.hashes = hashes
        self.start = start
        self.stop = stop
        self.count = 0


class BookedBlocks:
    def __init__(self) -> None:
        # Runs by their first block's hash: a chain meets every booked block of its own at the
        # start of a run (the run holding the block before ends there or diverges there).
        self._heads: dict[BlockHash, _Run] = {}
        self.distinct = 0  # blocks booked at least once

    def prefix(self, hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of ``hashes`` are booked."""
        heads = self._heads
        depth = 0
        while depth < len(hashes):
            run = heads.get(hashes[depth])
            if run is None:
                break
            depth = shared_prefix_end(run.hashes, hashes, depth, min(run.stop, len(hashes)))
        return depth

    def book(self, hashes: Sequence[BlockHash]) -> None:
        """Count one more prompt ``hashes``."""
        heads = self._heads
        depth = 0
        while depth < len(hashes):
            run = heads.get(hashes[depth])
            if run is None:
                run = heads[hashes[depth]] = _Run(hashes, depth, len(hashes))
                self.distinct += len(hashes) - depth
                end = len(hashes)
            else:
                end = shared_prefix_end(run.hashes, hashes, depth, min(run.stop, len(hashes)))
                if end < run.stop:  # the prompt ends or turns off inside the run: cut it there
                    tail = _Run(run.hashes, end, run.stop)
                    tail.count = run.count
                    run.stop = end
                    heads[run.hashes[end]] = tail
            run.count += 1
            depth = end

    def unbook(self, hashes: Sequence[BlockHash]) -> None:
        """Count one prompt ``hashes`` less; it must have been booked. A run's count never
        exceeds its parent's, so runs that drop to zero are leaves and go."""
        heads = self._heads
        depth = 0
        while depth < len(hashes):
            run = heads[hashes[depth]]
            run.count -= 1
            if run.count == 0:
                del heads[hashes[depth]]
                self.distinct -= run.stop - run.start
            depth = run.stop
