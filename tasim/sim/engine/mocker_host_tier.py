"""The host tier as Dynamo 1.6.1's mocker simulates vLLM's (AISimulate, aisimulate-core 0.13.0):
the ``dynamo_mocker`` semantics of ``cluster.engine.host_tier``, for comparing tasim with
Dynamo's replay like with like (``validate dynamo``).

Paths cited are AISimulate's: ``tier.rs`` is ``engine/host_offload/tier.rs``, ``adapter.rs``
``engine/scheduler/vllm/host_offload.rs``, ``core.rs`` ``engine/scheduler/vllm/core.rs``.

Residency, pending stores, load pins, eviction and the copy lanes are vLLM's (`KeyedHostPool`);
recency is the mocker's own. Its LRU holds only ready, unpinned blocks and moves one to the
newest end on each *touch* (``tier.rs``, ``Lru``):

* a completed store touches its blocks, and a completed load those it unpinned, as one cohort
  (``touch_cohort``: one epoch for all, ordered by key inside it);
* looking a request up (at every admission attempt) and preparing a store each touch the
  request's whole prompt, tail first, so its head ends newest (``adapter.rs``, ``lookup`` and
  ``observe_completed_blocks``);
* a request's finish touches nothing (vLLM re-ranks what the request observed then).

Inside a cohort the mocker orders blocks by its sequence hash (a stand-in for vLLM's unordered
Python sets), so which blocks of a cohort are evicted first depends on hash values: given the
mocker's sequence hash of each block (``cohort_order``; `tasim.validation.mocker_hashes`
computes them for a replayed trace) tasim orders them alike, else by its own block hash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tasim.core.model import BlockHash
from tasim.sim.engine.host_tier import HostCopy
from tasim.sim.engine.keyed_host_pool import KeyedHostPool


class MockerHostPool(KeyedHostPool):
    """`KeyedHostPool` with the recency of Dynamo's mocker (see the module docstring)."""

    __slots__ = ("cohort_order",)

    def __init__(
        self, capacity: int, store_threshold: int = 0, max_tracker_size: int = 64_000, cohort_order: Mapping[BlockHash, int] | None = None
    ) -> None:
        super().__init__(capacity, store_threshold, max_tracker_size)
        self.cohort_order = cohort_order  # the mocker's sequence hash of each block, where known

    def touch_prompt(self, hashes: Sequence[BlockHash], prompt_blocks: int) -> None:
        """Touch the ready, unpinned blocks among the first ``prompt_blocks`` of ``hashes``, tail
        first (``adapter.rs``: ``for key in prompt_keys.iter().rev() { tier.touch(key) }``)."""
        slots = self._slots
        for depth in range(min(prompt_blocks, len(hashes)) - 1, -1, -1):
            key = hashes[depth]
            slot = slots.get(key)
            if slot is not None and slot.refs == 0:
                slots.move_to_end(key)

    def complete_store(self, store: HostCopy) -> None:
        """Ready, and touched as one cohort (``tier.rs``: ``tick``, ``touch_cohort``)."""
        super().complete_store(store)
        self._touch_cohort(store.keys)

    def complete_load(self, load: HostCopy) -> None:
        """Unpinned; those no other load holds are touched as one cohort (``tier.rs``:
        ``release_load_pins``)."""
        super().complete_load(load)
        slots = self._slots
        self._touch_cohort([key for key in load.keys if slots[key].refs == 0])

    def _touch_cohort(self, keys: Sequence[BlockHash]) -> None:
        slots = self._slots
        order = self.cohort_order
        ranked = sorted(keys) if order is None else sorted(keys, key=lambda key: order.get(key, key))
        for key in ranked:
            if key in slots:
                slots.move_to_end(key)


def mocker_host_hit(gpu_tokens: int, host_blocks: int, num_tokens: int, block_size: int) -> tuple[int, int]:
    """`tasim.sim.engine.host_tier.host_hit` as the mocker counts it: the same tokens loaded, but
    a load that completes the whole prompt (or all but a partial block) leaves the last full
    block to compute, as a GPU prefix hit does (AISimulate adapter.rs, ``freeze_activated_cost``,
    then the prefill cost's cap)."""
    hit = min(num_tokens, (gpu_tokens // block_size + host_blocks) * block_size) - gpu_tokens
    if hit < block_size:
        return 0, gpu_tokens
    return hit, min(gpu_tokens + hit, (num_tokens - 1) // block_size * block_size)
