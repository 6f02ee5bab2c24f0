"""The host tier with Dynamo 1.6.1 mocker's semantics (``dynamo_mocker``).

The engine scenario is the one measured with Dynamo's replay (block size 16, 8 GPU blocks, 64
host blocks, 131,072 KV bytes per token): A = 4 blocks, B shares A's first 3, C = 7 other
blocks (it evicts A and B from the GPU), D = A + 1 block, E = A."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from conftest import Recorder, spec
from test_host_tier_engine import TierRecorder, _admitted, _run

from tasim.sim.engine.host_tier import HostAccess, host_hit
from tasim.sim.engine.kv_manager import HostTierSetup
from tasim.sim.engine.mocker_host_tier import MockerHostPool, mocker_host_hit
from tasim.sim.engine.scheduler import Engine, EngineSetup
from tasim.sim.perf.fixed import FixedStep

BS = 16
BLOCK_BYTES = BS * 131072
A = [101, 102, 103, 104]
B = A[:3] + [201]
C = [301, 302, 303, 304, 305, 306, 307]
D = A + [105]


def _engine(recorder: Recorder, host_blocks: int = 64) -> Engine:
    tier = HostTierSetup(host_blocks, BLOCK_BYTES, semantics="dynamo_mocker")
    setup = EngineSetup(block_size=BS, num_blocks=8, max_num_seqs=8, max_num_batched_tokens=256, eviction="lineage", host_tier=tier)
    return Engine("w0", setup, FixedStep(1000.0), recorder)


def test_the_measured_replay_scenario() -> None:
    recorder = TierRecorder()
    engine = _engine(recorder)
    host = engine.kv_cache.host
    assert isinstance(host, MockerHostPool)
    engine.submit(spec("A", 64, 2, A, BS))
    engine.submit(spec("B", 64, 2, B, BS))
    now = _run(engine, 0.0)
    engine.submit(spec("C", 112, 2, C, BS))
    now = _run(engine, now)
    engine.submit(spec("D", 80, 2, D, BS))
    before = now
    now = _run(engine, now)
    # Dynamo: admitted 0.262144 ms later (4 blocks at 32 GB/s), reuse 64 = 0 GPU + 64 host
    cached, admitted_at = _admitted(recorder, "D")
    assert (cached, recorder.host_tokens["D"]) == (64, 64)
    assert admitted_at - before == pytest.approx(0.000262144, rel=1e-9)
    loaded = engine.kv_cache.h2d.bytes_moved
    assert loaded == 4 * BLOCK_BYTES
    # Dynamo: the GPU holds all of E's 4 blocks (from D's load), so no load: reuse 48 + 0
    engine.submit(spec("E", 64, 2, A, BS))
    before = now
    _run(engine, now)
    assert _admitted(recorder, "E") == (48, before)
    assert recorder.host_tokens["E"] == 0 and engine.kv_cache.h2d.bytes_moved == loaded


@dataclass
class HostEventRecorder(TierRecorder):
    host_events: list[tuple[list[int], list[int], float]] = field(default_factory=list)

    def on_host_kv(self, worker, stored, removed, now):  # type: ignore[no-untyped-def]
        self.host_events.append((list(stored), list(removed), now))


def test_host_evictions_reach_the_router_when_the_step_that_made_them_ends() -> None:
    """Dynamo's replay hands the router a pass's KV events at its end, the host blocks its store
    preparations evicted among them; a store completed at the boundary a step starts from is
    published then."""
    recorder = HostEventRecorder()
    engine = _engine(recorder, host_blocks=8)
    engine.submit(spec("A", 64, 2, A, BS))
    now = _run(engine, 0.0)
    ((stored, removed, _),) = recorder.host_events
    assert len(stored) == 4 and not removed  # A's blocks, once their store completed
    recorder.host_events.clear()
    engine.submit(spec("C", 112, 2, C, BS))  # 7 blocks to store where 4 slots are free
    step = engine.begin_step(now)
    assert step.scheduled and len(step.host_removed) == 3
    assert recorder.host_events == []
    engine.end_step(step, step.end)
    assert recorder.host_events == [([], step.host_removed, step.end)]
    assert set(step.host_removed) <= set(stored)


def test_a_prompt_loaded_whole_recomputes_its_last_block() -> None:
    """Dynamo loads all 4 blocks of a 64-token prompt found only on the host and reports 48
    reused; vLLM loads them too and computes only the last token."""
    assert mocker_host_hit(0, 4, 64, BS) == (64, 48)
    assert host_hit(0, 4, 64, BS) == (64, 63)
    assert mocker_host_hit(0, 4, 70, BS) == host_hit(0, 4, 70, BS) == (64, 64)
    assert mocker_host_hit(16, 0, 64, BS) == (0, 16)


def _resident(pool: MockerHostPool, keys: list[int]) -> None:
    stored = pool.prepare_store(keys, 0, len(keys), HostAccess())
    assert stored is not None and stored.keys == keys
    pool.complete_store(stored)


def _eviction_order(pool: MockerHostPool, count: int) -> list[int]:
    """The ``count`` slots the next store of new blocks evicts, oldest first."""
    before = pool.recency()
    new = [1000 + i for i in range(count)]
    stored = pool.prepare_store(new, 0, count, HostAccess())
    assert stored is not None and stored.keys == new
    return [key for key in before if pool.refs(key) is None]


def test_a_completed_store_is_one_cohort_in_sequence_hash_order() -> None:
    # the mocker's sequence hashes put block 3 first, then 1, then 2 (by depth, up to each block)
    ranks = (20, 30, 10)
    pool = MockerHostPool(3, cohort_ranks={1: ranks, 2: ranks, 3: ranks})
    _resident(pool, [1, 2, 3])
    assert pool.recency() == [3, 1, 2]
    plain = MockerHostPool(3)
    _resident(plain, [3, 1, 2])
    assert plain.recency() == [1, 2, 3]  # without them, by tasim's own hash


def test_lookups_and_stores_touch_the_whole_prompt_tail_first() -> None:
    pool = MockerHostPool(6)
    _resident(pool, [1, 2, 3])
    _resident(pool, [4, 5, 6])
    pool.touch_prompt([1, 2, 3, 99], 4)  # 99 is not resident: ignored
    assert pool.recency() == [4, 5, 6, 3, 2, 1]
    assert _eviction_order(pool, 2) == [4, 5]


def test_a_completed_load_touches_what_it_unpins() -> None:
    pool = MockerHostPool(4)
    _resident(pool, [1, 2])
    _resident(pool, [3, 4])
    load = pool.prepare_load([1, 2], 0, 2, HostAccess())
    other = pool.prepare_load([2], 0, 1, HostAccess())
    pool.touch_prompt([3, 4, 1, 2], 4)  # pinned blocks are outside the recency order
    pool.complete_load(load)
    assert pool.recency()[-1] == 1  # 2 is still held by the other load
    pool.complete_load(other)
    assert pool.recency()[-2:] == [1, 2]
