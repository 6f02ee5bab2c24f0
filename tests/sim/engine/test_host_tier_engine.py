"""The host tier through tasim's Engine, with exact values: the scenarios that vLLM 0.31's scheduler
with its OffloadingConnector ran on this box (block size 16, a GPU pool of 8 blocks; A = 4 blocks,
B shares A's first 3, C = 7 other blocks, D = A + 1 block, E = A; two output tokens each), the
LRU order of a full host tier, waking an idle engine, and a folded run cut by a completion."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from conftest import Recorder, spec

from tasim.core.model import BlockHash
from tasim.sim.engine.kv_manager import HostTierSetup
from tasim.sim.engine.scheduler import Engine, EngineSetup
from tasim.sim.perf.fixed import FixedStep

BS = 16
KV_BYTES_PER_TOKEN = 131072  # Llama-3.1-8B, bf16: a block is 2 MiB
BLOCK_BYTES = BS * KV_BYTES_PER_TOKEN
GBPS = 32.0
A = [101, 102, 103, 104]
B = A[:3] + [201]
C = [301, 302, 303, 304, 305, 306, 307]
D = A + [105]


@dataclass
class TierRecorder(Recorder):
    """Also records host tokens at admission and the host tier's KV events."""

    host_tokens: dict[str, int] = field(default_factory=dict)
    host_stored: list[BlockHash] = field(default_factory=list)
    host_removed: list[BlockHash] = field(default_factory=list)

    def on_admitted(self, worker, request, cached_tokens, recompute_tokens, first, now, host_tokens=0):  # type: ignore[no-untyped-def]
        super().on_admitted(worker, request, cached_tokens, recompute_tokens, first, now)
        self.host_tokens[request.id] = host_tokens

    def on_host_kv(self, worker, stored, removed, now):  # type: ignore[no-untyped-def]
        self.host_stored += stored
        self.host_removed += removed


def _engine(recorder: Recorder, host_blocks: int = 64, d2h_gbps: float = GBPS, h2d_gbps: float = GBPS) -> Engine:
    """Every step takes one second."""
    tier = HostTierSetup(host_blocks, BLOCK_BYTES, d2h_gbps, h2d_gbps)
    setup = EngineSetup(block_size=BS, num_blocks=8, max_num_seqs=8, max_num_batched_tokens=256, cache_duplicates=True, host_tier=tier)
    return Engine("w0", setup, FixedStep(1000.0), recorder)


def _run(engine: Engine, now: float) -> float:
    """Step until idle, as the runner does: an engine with nothing to schedule sleeps until its
    next copy is done. Returns the time it went idle."""
    for _ in range(100):
        step = engine.begin_step(now)
        if step.scheduled:
            now = step.end
            engine.end_step(step, now)
            assert engine.audit(every_block=True) is None
            continue
        if engine.next_transfer_done == float("inf") and not engine.has_work:
            return now
        assert engine.next_transfer_done < float("inf"), "stuck with nothing in flight"
        now = max(now, engine.next_transfer_done)
    raise AssertionError("engine did not go idle")


def _admitted(recorder: Recorder, rid: str) -> tuple[int, float]:
    return next((cached, t) for kind, r, cached, t in recorder.log if kind == "admitted" and r == rid)


def test_vllm_scenario_a_to_e() -> None:
    recorder = TierRecorder()
    engine = _engine(recorder)
    host = engine.kv_cache.host
    assert host is not None
    engine.submit(spec("A", 64, 2, A, BS))
    engine.submit(spec("B", 64, 2, B, BS))
    step = engine.begin_step(0.0)
    # B hits A's 3 blocks on the GPU; of its 4 prompt blocks only its own last one is stored
    assert [(r.spec.id, n) for r, n in step.scheduled] == [("A", 64), ("B", 16)]
    assert host.pending == 5
    engine.end_step(step, step.end)
    now = _run(engine, step.end)
    # the step after A and B finish (nothing to compute: it offers their blocks once more) sees
    # the stores done
    assert now == 2.0 and host.pending == 0 and recorder.host_stored == A + [201]
    engine.submit(spec("C", 112, 2, C, BS))
    now = _run(engine, now)
    assert host.stored == 12 and recorder.host_stored == A + [201] + C
    assert set(recorder.removed) == set(A + [201])  # C took the whole GPU pool

    engine.submit(spec("D", 80, 2, D, BS))
    before = now
    now = _run(engine, now)
    cached, admitted_at = _admitted(recorder, "D")
    # A GPU miss, 4 host blocks: parked while they load, then 16 tokens computed
    assert (cached, recorder.host_tokens["D"]) == (64, 64)
    assert admitted_at == before + 4 * BS * KV_BYTES_PER_TOKEN / (GBPS * 1e9)
    assert admitted_at - before == pytest.approx(0.000262144, rel=1e-9)  # 8 MiB at 32 GB/s
    assert host.hits == 4
    assert engine.kv_cache.h2d.bytes_moved == 4 * BLOCK_BYTES
    assert engine.kv_cache.d2h.bytes_moved == (5 + 7 + 1) * BLOCK_BYTES  # D stored only its new block

    engine.submit(spec("E", 64, 2, A, BS))
    before = now
    now = _run(engine, now)
    cached, admitted_at = _admitted(recorder, "E")
    # The GPU holds all 4 blocks but its lookup stops at 3; the host gives the 4th, loaded, and
    # the prompt's last token is computed again
    assert (cached, recorder.host_tokens["E"]) == (63, 15)
    assert admitted_at == before + BLOCK_BYTES / (GBPS * 1e9)
    assert engine.kv_cache.h2d.bytes_moved == 5 * BLOCK_BYTES
    assert host.audit() is None and host.pending == 0


def test_a_full_host_tier_evicts_the_oldest_blocks() -> None:
    # 8 host blocks: C's 7 need 4 of A's and B's 5. A and B were re-ranked as they finished, A
    # first and each tail first, so A's go, its tail first (vLLM: A's 4 evicted before B's)
    recorder = TierRecorder()
    engine = _engine(recorder, host_blocks=8)
    engine.submit(spec("A", 64, 2, A, BS))
    engine.submit(spec("B", 64, 2, B, BS))
    now = _run(engine, 0.0)
    engine.submit(spec("C", 112, 2, C, BS))
    now = _run(engine, now)
    assert recorder.host_removed == A[::-1]
    assert engine.kv_cache.host is not None and engine.kv_cache.host.refs(201) == 0
    engine.submit(spec("D", 80, 2, D, BS))
    _run(engine, now)
    assert _admitted(recorder, "D")[0] == 0 and recorder.host_tokens["D"] == 0  # a miss on both tiers


def test_an_idle_engine_wakes_for_a_load() -> None:
    recorder = TierRecorder()
    engine = _engine(recorder)
    engine.submit(spec("A", 64, 2, A, BS))
    engine.submit(spec("C", 112, 2, C, BS))
    now = _run(engine, 0.0)
    engine.submit(spec("D", 80, 2, D, BS))
    step = engine.begin_step(now)
    # D is parked: nothing to compute, but the engine has work and a completion to wait for
    assert not step.scheduled and engine.parked and engine.has_work
    assert engine.next_transfer_done == now + 4 * BLOCK_BYTES / (GBPS * 1e9)
    step = engine.begin_step(engine.next_transfer_done)
    assert [(r.spec.id, n) for r, n in step.scheduled] == [("D", 16)]
    assert not engine.parked


def test_a_folded_run_completes_a_store_at_the_step_that_sees_it_done() -> None:
    # A's 4-block store takes 2.5 s from the end of its prefill step (t = 1): done at 3.5. Steps
    # start at 1, 2, 3, 4, ...: the step at 4 completes it. Nobody waits, so the run from t = 1
    # folds to A's last token (9 steps) and completes the store inside it, at step 4.
    recorder = TierRecorder()
    engine = _engine(recorder, d2h_gbps=4 * BLOCK_BYTES / 2.5 / 1e9)
    engine.submit(spec("A", 64, 10, A, BS))
    step = engine.begin_step(0.0)
    engine.end_step(step, step.end)
    assert engine.next_transfer_done == 3.5
    step = engine.begin_step(1.0)
    plan = engine.plan_run(step, 1024)
    assert plan is not None and (plan.steps, plan.copy_steps) == (9, [4]) and plan.ends[:4] == [2.0, 3.0, 4.0, 5.0]
    assert engine.complete_copies(4.0) == (A, [])
    assert engine.next_transfer_done == float("inf")
    # with C waiting (7 blocks: it fits only once A is done) the run ends before the step at 4,
    # as a waiting request's lookup could find what a store readies
    waited = _engine(TierRecorder(), d2h_gbps=4 * BLOCK_BYTES / 2.5 / 1e9)
    waited.submit(spec("A", 64, 10, A, BS))
    step = waited.begin_step(0.0)
    waited.end_step(step, step.end)
    waited.submit(spec("C", 112, 2, C, BS))
    step = waited.begin_step(1.0)
    assert [r.spec.id for r in waited.waiting] == ["C"]
    plan = waited.plan_run(step, 1024)
    assert plan is not None and (plan.steps, plan.copy_steps) == (3, [])


def test_a_prefix_cache_reset_empties_the_host_tier_and_drops_its_copies_in_flight() -> None:
    """After a weight update verl resets vLLM's prefix cache with its connector's: every host
    block goes (no KV event, as vLLM's manager emits none), a store still copying is dropped and
    its completion ignored, and the same prompt afterwards finds nothing on the host."""
    recorder = TierRecorder()
    engine = _engine(recorder, d2h_gbps=0.001)  # a 2 MiB block takes 2.1 s to store
    host = engine.kv_cache.host
    assert host is not None
    engine.submit(spec("A", 64, 2, A, BS))
    step = engine.begin_step(0.0)
    engine.end_step(step, step.end)
    step = engine.begin_step(step.end)  # A's last token: A finishes, its 4 blocks still copying
    engine.end_step(step, step.end)
    assert host.pending == 4 and engine.next_transfer_done < float("inf")
    engine.clear_prefix_cache(step.end)
    assert (host.resident, host.pending) == (0, 0)
    assert engine.next_transfer_done == float("inf") and not engine.has_work
    assert recorder.host_stored == [] and recorder.host_removed == []
    assert set(recorder.removed) == set(A)  # the GPU's cached blocks go, as before
    engine.submit(spec("D", 80, 2, D, BS))
    now = _run(engine, 100.0)
    assert _admitted(recorder, "D")[0] == 0 and recorder.host_tokens["D"] == 0
    assert host.stored == 5 and recorder.host_stored == D  # only D's own stores completed
    assert now > 100.0


def test_a_prefix_cache_reset_under_a_host_load_in_flight_is_refused() -> None:
    recorder = TierRecorder()
    engine = _engine(recorder, h2d_gbps=0.001)
    engine.submit(spec("A", 64, 2, A, BS))
    now = _run(engine, 0.0)
    engine.submit(spec("C", 112, 2, C, BS))
    now = _run(engine, now)
    engine.submit(spec("D", 80, 2, D, BS))
    engine.begin_step(now)  # D parked: its 4 host blocks loading
    assert engine.parked
    with pytest.raises(RuntimeError, match="cannot be reset while a host load is in flight"):
        engine.clear_prefix_cache(now)
