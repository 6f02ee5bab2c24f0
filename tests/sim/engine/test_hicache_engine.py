"""SGLang HiCache's host tier through tasim's Engine, with exact values (block size 16, a GPU pool
of 8 blocks, one second a step): inserts at prefill completion and at finish, a load-back that
admits at once and holds its step until copied, write-back evictions that hold theirs, and the
tier's copies seen by an idle engine."""

from __future__ import annotations

import pytest
from conftest import spec
from test_host_tier_engine import TierRecorder, _admitted, _run

from tasim.sim.engine.hicache import WritePolicy
from tasim.sim.engine.kv_manager import HostTierSetup
from tasim.sim.engine.scheduler import Engine, EngineSetup
from tasim.sim.perf.fixed import FixedStep

BS = 16
KV_BYTES_PER_TOKEN = 131072
BLOCK_BYTES = BS * KV_BYTES_PER_TOKEN
GBPS = 32.0
COPY = BLOCK_BYTES / (GBPS * 1e9)
A = [101, 102, 103, 104]
C = [301, 302, 303, 304, 305, 306, 307]
D = A + [105]


def _engine(recorder: TierRecorder, policy: WritePolicy = "write_through", h2d_gbps: float = GBPS) -> Engine:
    tier = HostTierSetup(64, BLOCK_BYTES, GBPS, h2d_gbps, semantics="sglang", write_policy=policy)
    setup = EngineSetup(block_size=BS, num_blocks=8, max_num_seqs=8, max_num_batched_tokens=256, cache_duplicates=True, host_tier=tier)
    return Engine("w0", setup, FixedStep(1000.0), recorder)


def test_write_through_inserts_at_prefill_completion_and_at_finish() -> None:
    recorder = TierRecorder()
    engine = _engine(recorder)
    hicache = engine.kv_cache.hicache
    assert hicache is not None and engine.kv_cache.host is None
    engine.submit(spec("A", 64, 3, A + [105], BS))
    step = engine.begin_step(0.0)
    engine.end_step(step, step.end)
    # the prefill's insert at t = 1: A's 4 blocks, one write entering the D2H lane then
    assert [hicache.node_state(key) for key in A] == [(1, True, "writing")] * 4
    assert engine.next_transfer_done == 1.0 + 4 * COPY
    step = engine.begin_step(1.0)  # a decode: no insert
    engine.end_step(step, step.end)
    assert hicache.node_state(A[0]) == (1, True, "writing")
    now = _run(engine, 2.0)
    # the finish at t = 3 inserts the committed 64 + 3 - 1 tokens: A's 4 blocks again (no
    # 5th full block); the write was seen done by the step at t = 2
    assert now == 3.0 and [hicache.node_state(key) for key in A] == [(2, True, "ready")] * 4
    assert recorder.host_stored == A and hicache.node_state(105) is None


def test_a_host_hit_is_admitted_at_once_and_its_step_waits_for_the_load() -> None:
    recorder = TierRecorder()
    engine = _engine(recorder, h2d_gbps=4 * BLOCK_BYTES / 2.5 / 1e9)  # A's 4 blocks load in 2.5 s
    engine.submit(spec("A", 64, 2, A, BS))
    now = _run(engine, 0.0)
    engine.submit(spec("C", 112, 2, C, BS))
    now = _run(engine, now)  # C takes the whole GPU pool: A is host-only
    assert set(recorder.removed) >= set(A)
    engine.submit(spec("D", 80, 2, D, BS))
    start = now
    step = engine.begin_step(start)
    cached, admitted_at = _admitted(recorder, "D")
    assert (cached, recorder.host_tokens["D"], admitted_at) == (64, 64, start)
    assert [(r.spec.id, n) for r, n in step.scheduled] == [("D", 16)]
    assert step.duration == pytest.approx(2.5, rel=1e-12)  # not 1 s: the forward waits for the load
    assert engine.kv_cache.h2d.bytes_moved == 4 * BLOCK_BYTES
    engine.end_step(step, step.end)
    assert engine.audit(every_block=True) is None


def test_write_back_evictions_hold_the_step_until_written() -> None:
    recorder = TierRecorder()
    engine = _engine(recorder, "write_back")
    engine.submit(spec("A", 64, 2, A, BS))
    now = _run(engine, 0.0)
    assert engine.kv_cache.d2h.bytes_moved == 0 and recorder.host_stored == []
    engine.submit(spec("C", 112, 2, C, BS))
    step = engine.begin_step(now)
    # C's prompt takes 7 blocks, 4 are free: 3 of A's are evicted, its tail first, and written
    # back, one copy each, before the step's forward
    assert step.removed == [104, 103, 102]
    assert step.duration == pytest.approx(1.0 + 3 * COPY, rel=1e-12)
    assert recorder.host_stored == [104, 103, 102]
    engine.end_step(step, step.end)
    now = _run(engine, step.end)  # C's decode block evicts (and writes back) A's first
    assert recorder.host_stored == [104, 103, 102, 101]
    engine.submit(spec("E", 64, 2, A, BS))
    _run(engine, now)
    # E's lookup stops one token short of its prompt: 3 of A's blocks load back (48 tokens)
    assert _admitted(recorder, "E")[0] == 48 and recorder.host_tokens["E"] == 48


def test_an_idle_engine_wakes_to_see_its_writes_done() -> None:
    recorder = TierRecorder()
    engine = _engine(recorder)
    engine.submit(spec("A", 64, 1, A, BS))  # finishes in its prefill step: one insert
    step = engine.begin_step(0.0)
    engine.end_step(step, step.end)
    assert not engine.has_work and engine.next_transfer_done == 1.0 + 4 * COPY
    assert engine.kv_cache.active == 4  # held by the write
    step = engine.begin_step(engine.next_transfer_done)
    assert not step.scheduled and engine.kv_cache.active == 0 and recorder.host_stored == A


def test_a_weight_update_empties_the_tier_and_drops_writes_in_flight() -> None:
    recorder = TierRecorder()
    engine = _engine(recorder)
    hicache = engine.kv_cache.hicache
    assert hicache is not None
    engine.submit(spec("A", 64, 2, A, BS))
    now = _run(engine, 0.0)  # A written (4 blocks) and done at 2 s: its finish inserts no new block
    assert recorder.host_stored == A and hicache.used == 4
    engine.submit(spec("C", 112, 1, C, BS))  # finishes in its prefill step: one insert, one write
    step = engine.begin_step(now)
    engine.end_step(step, step.end)
    assert engine.next_transfer_done == step.end + 7 * COPY and engine.kv_cache.active == 7  # held by the write
    engine.clear_prefix_cache(step.end)  # before C's write is done
    # A's four host copies are reported removed; C's write is dropped and its blocks released,
    # then cleared from the GPU with A's leftovers
    assert recorder.host_removed == A and recorder.host_stored == A
    assert (hicache.used, hicache.node_state(A[0]), hicache.node_state(C[0])) == (0, None, None)
    assert (engine.kv_cache.active, engine.kv_cache.cached_blocks, engine.next_transfer_done) == (0, 0, float("inf"))
    assert engine.audit(every_block=True) is None
    engine.submit(spec("E", 64, 1, A, BS))
    _run(engine, step.end)
    assert _admitted(recorder, "E")[0] == 0 and recorder.host_tokens["E"] == 0  # nothing left to load
