"""Engine scheduling with exact expected values: prefix hits, chunked prefill, preemption,
recompute accounting and block conservation."""

from __future__ import annotations

import pytest
from conftest import Recorder, UnitStep, spec
from hypothesis import given, settings
from hypothesis import strategies as st

from tasim.core.model import RequestSpec
from tasim.sim.engine.scheduler import Engine, EngineSetup
from tasim.sim.perf.polynomial import DynamoPolynomial


def run_until_idle(engine: Engine, now: float = 0.0, max_steps: int = 10_000) -> tuple[float, list[list[tuple[str, int]]]]:
    """Run steps back to back; returns the end time and each step's (request, tokens) list."""
    steps = []
    for _ in range(max_steps):
        if not engine.has_work:
            return now, steps
        step = engine.begin_step(now)
        steps.append([(req.spec.id, n) for req, n in step.scheduled])
        now = step.end
        engine.end_step(step, now)
        check_conservation(engine)
    raise AssertionError("engine did not go idle")


def check_conservation(engine: Engine) -> None:
    pool = engine.kv_cache.block_pool
    assert pool.free + pool.active + pool.inactive == pool.num_blocks
    assert min(pool.free, pool.active, pool.inactive) >= 0
    # Every active block is either a private block of a running request or a cached block
    # referenced exactly as many times as running requests hold it.
    refs: dict[int, int] = {}
    private = 0
    for pinned in engine.kv_cache.pinned_hashes():
        for block in pinned:
            refs[block] = refs.get(block, 0) + 1
    for req in engine.running:
        private += req.phys - req.claim.blocks
        for block in req.claim.block_hashes():
            refs[block] = refs.get(block, 0) + 1
    assert pool.active == private + len(refs)
    for block, count in refs.items():
        assert pool.refs(block) == count


def test_prefix_hit_on_repeated_prompt(recorder: Recorder) -> None:
    engine = Engine("w0", EngineSetup(block_size=4, num_blocks=64), UnitStep(), recorder)
    hashes = list(range(100, 104))  # prompt 10 + output 6 = 16 tokens = 4 full blocks
    engine.submit(spec("a", 10, 6, hashes))
    run_until_idle(engine)
    engine.submit(spec("b", 10, 6, hashes))
    run_until_idle(engine)
    finished = {e[1]: e[2] for e in recorder.log if e[0] == "finished"}
    # First time nothing is cached; the repeat reuses the two full prompt blocks (8 tokens).
    assert finished == {"a": 0, "b": 8}


def test_fully_cached_aligned_prompt_recomputes_last_block(recorder: Recorder) -> None:
    engine = Engine("w0", EngineSetup(block_size=4, num_blocks=64), UnitStep(), recorder)
    hashes = [1, 2, 3]
    engine.submit(spec("a", 8, 4, hashes))
    run_until_idle(engine)
    engine.submit(spec("b", 8, 4, hashes))
    run_until_idle(engine)
    # (8 - 1) // 4 = 1 block may be reused: at least one prompt token is always computed.
    assert [e[2] for e in recorder.log if e[0] == "finished"] == [0, 4]


def test_chunked_prefill_split_and_running_first(recorder: Recorder) -> None:
    cfg = EngineSetup(block_size=4, num_blocks=64, max_num_batched_tokens=8)
    engine = Engine("w0", cfg, UnitStep(), recorder)
    engine.submit(spec("d", 3, 4))  # short request: decodes while the long one prefills
    engine.submit(spec("p", 20, 2))
    end, steps = run_until_idle(engine)
    assert steps == [
        [("d", 3), ("p", 5)],  # d prefills 3, p gets the rest of the 8-token budget
        [("d", 1), ("p", 7)],  # running requests first: d decodes, p continues its prefill
        [("d", 1), ("p", 7)],
        [("d", 1), ("p", 1)],  # p's prefill is done (5+7+7+1 = 20); d finishes after 4 tokens
        [("p", 1)],
    ]
    assert [(e[0], e[1], e[3]) for e in recorder.log if e[0] in ("first_token", "finished")] == [
        ("first_token", "d", 1.0),
        ("first_token", "p", 4.0),  # tokens of a step are emitted before its finishes
        ("finished", "d", 4.0),
        ("finished", "p", 5.0),
    ]
    assert end == 5.0


def test_no_chunking_blocks_prompt_over_budget(recorder: Recorder) -> None:
    cfg = EngineSetup(block_size=4, num_blocks=64, max_num_batched_tokens=8, enable_chunked_prefill=False)
    engine = Engine("w0", cfg, UnitStep(), recorder)
    engine.submit(spec("d", 3, 3))
    engine.submit(spec("q", 6, 1))
    _, steps = run_until_idle(engine)
    # q (6 tokens) cannot share the first step's remaining budget of 5, so it waits a step.
    assert steps == [[("d", 3)], [("d", 1), ("q", 6)], [("d", 1)]]


def _preemption_engine(recorder: Recorder, preemption: str) -> Engine:
    cfg = EngineSetup(block_size=2, num_blocks=6, preemption=preemption)  # type: ignore[arg-type]
    engine = Engine("w0", cfg, UnitStep(), recorder)
    for rid, base in (("A", 10), ("B", 20), ("C", 30)):
        engine.submit(spec(rid, 3, 4, [base, base + 1, base + 2], block_size=2))
    return engine


def test_preemption_newest_first_and_recompute(recorder: Recorder) -> None:
    engine = _preemption_engine(recorder, "newest_first")
    end, steps = run_until_idle(engine)
    # Prompts of 3 tokens in 2-token blocks: 2 blocks each fill the 6-block pool. At t=2 A needs
    # a third block for its 5th token; the newest running request, C, is preempted (it had
    # computed 4 tokens). Its cached blocks (31 deepest first, then 30) are evicted for A and B.
    assert steps == [
        [("A", 3), ("B", 3), ("C", 3)],
        [("A", 1), ("B", 1), ("C", 1)],
        [("A", 1), ("B", 1)],
        [("A", 1), ("B", 1)],
        [("C", 5)],  # recompute: 3 prompt + 2 generated tokens, nothing left in the cache
        [("C", 1)],
    ]
    assert recorder.log == [
        ("admitted", "A", 0, 0.0),
        ("admitted", "B", 0, 0.0),
        ("admitted", "C", 0, 0.0),
        ("first_token", "A", None, 1.0),
        ("first_token", "B", None, 1.0),
        ("first_token", "C", None, 1.0),
        ("preempted", "C", 4, 2.0),
        ("finished", "A", 0, 4.0),
        ("finished", "B", 0, 4.0),
        ("readmitted", "C", 0, 4.0),
        ("finished", "C", 0, 6.0),
    ]
    assert recorder.stored == [10, 20, 30, 11, 21, 31, 12, 22, 30, 31, 32]
    assert recorder.removed == [31, 30, 12, 11, 10]
    assert end == 6.0


def test_preemption_oldest_first_preempts_self(recorder: Recorder) -> None:
    engine = _preemption_engine(recorder, "oldest_first")
    _, steps = run_until_idle(engine)
    # A is the oldest running request; when it needs a block it preempts itself.
    assert steps[2:] == [[("B", 1), ("C", 1)], [("B", 1), ("C", 1)], [("A", 5)], [("A", 1)]]
    assert [e for e in recorder.log if e[0] in ("preempted", "readmitted")] == [
        ("preempted", "A", 4, 2.0),
        ("readmitted", "A", 0, 4.0),
    ]
    assert recorder.removed == [11, 10, 22, 21, 20]


def test_priority_scheduling_queues_by_priority_and_preempts_the_lowest(recorder: Recorder) -> None:
    """vLLM's ``--scheduling-policy priority``: the queue in (priority, arrival) order, the
    running request with the highest (priority, arrival) preempted, and a preempted request
    back in its place in the queue (behind a waiting call of higher priority), not at the front."""
    cfg = EngineSetup(block_size=2, num_blocks=6, scheduling_policy="priority")
    engine = Engine("w0", cfg, UnitStep(), recorder)
    for rid, base, priority in (("A", 10, 1), ("B", 20, 2), ("C", 30, 0)):
        engine.submit(spec(rid, 3, 4, [base, base + 1, base + 2], block_size=2), priority)
    first = engine.begin_step(0.0)
    engine.end_step(first, 1.0)
    engine.submit(spec("D", 3, 4, [40, 41, 42], block_size=2), 1)  # arrives with the pool full
    end, steps = run_until_idle(engine, 1.0)
    # C, A, B fill the 6-block pool, in priority order; D waits. At t=2 C needs a third block
    # and B, the lowest priority running, is preempted; at t=4 D (priority 1) goes before B (2).
    assert [[(req.spec.id, n) for req, n in first.scheduled], *steps] == [
        [("C", 3), ("A", 3), ("B", 3)],
        [("C", 1), ("A", 1), ("B", 1)],
        [("C", 1), ("A", 1)],
        [("C", 1), ("A", 1)],
        [("D", 3), ("B", 5)],
        [("D", 1), ("B", 1)],
        [("D", 1)],
        [("D", 1)],
    ]
    assert [e[:2] for e in recorder.log if e[0] in ("admitted", "preempted", "readmitted")] == [
        ("admitted", "C"),
        ("admitted", "A"),
        ("admitted", "B"),
        ("preempted", "B"),
        ("admitted", "D"),
        ("readmitted", "B"),
    ]
    assert end == 8.0


def test_equal_priorities_schedule_as_fcfs(recorder: Recorder) -> None:
    """With every call at one priority, priority scheduling is first come, first served: the
    newest running request is preempted and goes back ahead of everything still queued."""
    fcfs, by_priority = Recorder(), Recorder()
    for log, policy in ((fcfs, "fcfs"), (by_priority, "priority")):
        engine = Engine("w0", EngineSetup(block_size=2, num_blocks=6, scheduling_policy=policy), UnitStep(), log)  # type: ignore[arg-type]
        for rid, base in (("A", 10), ("B", 20), ("C", 30), ("D", 40)):
            engine.submit(spec(rid, 3, 4, [base, base + 1, base + 2], block_size=2))
        run_until_idle(engine)
    assert by_priority.log == fcfs.log and ("preempted", "C", 4, 2.0) in fcfs.log


def test_request_larger_than_pool_is_dropped(recorder: Recorder) -> None:
    engine = Engine("w0", EngineSetup(block_size=4, num_blocks=4), UnitStep(), recorder)
    engine.submit(spec("big", 17, 1))  # needs 5 blocks
    engine.submit(spec("ok", 4, 1))
    run_until_idle(engine)
    assert recorder.kinds("dropped") == ["big"]
    assert recorder.kinds("finished") == ["ok"]


def test_polynomial_step_times_match_dynamo_replay(recorder: Recorder) -> None:
    """Four 3,000-token prompts (50 output tokens) arriving together on one worker with block 64
    and 4,096 blocks. Dynamo 1.6.1's replay (run_trace_replay, polynomial timing) reported these
    first-token and completion times in ms: the first step prefills 3,000 + 3,000 + 2,192 tokens
    with no decode term, the second prefills 3,808 and decodes two requests at u = 2 x 3,001 /
    262,144, then 48 steps decode four requests and one step the last two."""
    engine = Engine("w0", EngineSetup(block_size=64, num_blocks=4096), DynamoPolynomial(), recorder)
    for rid in "abcd":
        engine.submit(spec(rid, 3000, 50, block_size=64))
    run_until_idle(engine)
    times = {(kind, rid): now * 1000 for kind, rid, _, now in recorder.log if kind in ("first_token", "finished")}
    dynamo = {"first_token": (169.092758, 256.480674), "finished": (649.031554, 656.014007)}
    for kind, (early, late) in dynamo.items():
        assert [times[kind, rid] for rid in "abcd"] == pytest.approx([early, early, late, late], abs=1e-5)


def test_pin_keeps_blocks_until_the_next_request_is_admitted(recorder: Recorder) -> None:
    engine = Engine("w0", EngineSetup(block_size=4, num_blocks=6), UnitStep(), recorder)
    engine.submit(spec("a", 8, 1, [1, 2]))
    run_until_idle(engine)
    assert engine.pin("p-a", (1, 2, 3)) == 2  # blocks 1 and 2 are resident; 3 never existed
    assert (engine.kv_cache.block_pool.active, engine.kv_cache.block_pool.inactive) == (2, 0)
    engine.submit(spec("b", 16, 1, [10, 11, 12, 13]))  # needs 4 blocks: only 4 are evictable/free
    run_until_idle(engine)
    assert engine.kv_cache.block_pool.is_cached(1) and engine.kv_cache.block_pool.is_cached(2)  # pinned blocks survived
    engine.submit(spec("c", 4, 1, [20]))
    engine.submit(RequestSpec("a2", "p-a", 1, 9, 1, 8, (1, 2)))  # the pinned program returns
    step = engine.begin_step(10.0)
    assert [req.spec.id for req, _ in step.scheduled] == ["a2", "c"]  # it jumped the queue
    assert step.scheduled[0][1] == 1  # 8 cached tokens reused, 1 computed
    assert engine.kv_cache.pinned_blocks == 0  # admission released the pin; the request holds the blocks
    engine.end_step(step, step.end)
    check_conservation(engine)


requests_strategy = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(0, 3)), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None)
@given(
    requests=requests_strategy,
    num_blocks=st.integers(12, 40),
    budget=st.integers(4, 64),
    preemption=st.sampled_from(["newest_first", "oldest_first"]),
    eviction=st.sampled_from(["lru", "lineage"]),
)
def test_block_conservation_and_completion(requests, num_blocks, budget, preemption, eviction) -> None:
    recorder = Recorder()
    cfg = EngineSetup(block_size=4, num_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=6, preemption=preemption, eviction=eviction)
    engine = Engine("w0", cfg, UnitStep(), recorder)
    ids = []
    for i, (prompt, output, family) in enumerate(requests):
        # requests of a family share a prefix: hashes depend on (family, block index)
        hashes = [family * 1000 + b for b in range((prompt + output) // 4)]
        engine.submit(spec(f"r{i}", prompt, output, hashes))
        ids.append(f"r{i}")
    run_until_idle(engine)
    done = set(recorder.kinds("finished")) | set(recorder.kinds("dropped"))
    assert done == set(ids)
    assert engine.kv_cache.block_pool.active == 0


def test_kv_events_are_published_when_the_step_completes(recorder: Recorder) -> None:
    """Blocks are registered (and evictions made) when a step is scheduled, but reported at its
    end, as vLLM and Dynamo's mocker publish them: a router routing mid-step still sees the
    blocks the running step is overwriting."""
    engine = Engine("w0", EngineSetup(block_size=4, num_blocks=3), UnitStep(), recorder)
    engine.submit(spec("a", 8, 1, [1, 2]))
    run_until_idle(engine)
    assert (recorder.stored, recorder.removed) == ([1, 2], [])
    engine.submit(spec("b", 8, 1, [3, 4]))  # two blocks: the free one and a's leaf block 2
    step = engine.begin_step(5.0)
    assert engine.kv_cache.block_pool.is_cached(3) and not engine.kv_cache.block_pool.is_cached(2)  # changed by scheduling...
    assert (recorder.stored, recorder.removed) == ([1, 2], [])  # ...but not yet reported
    engine.end_step(step, step.end)
    assert (recorder.stored, recorder.removed) == ([1, 2, 3, 4], [2])


@pytest.mark.parametrize(
    ("duplicates", "d_hit", "removed"), [(True, 32, [309]), (False, 16, [101, 309])], ids=["vLLM: duplicates cached", "mocker: duplicates private"]
)
def test_a_recomputed_block_keeps_its_hash_cached_when_vllm_caches_duplicates(
    recorder: Recorder, duplicates: bool, d_hit: int, removed: list[int]
) -> None:
    """B re-sends A's block-aligned prompt, so it recomputes block 101 (a hit stops one token
    short). C then evicts A's copy of 101. vLLM still has B's copy, so D hits both blocks; the
    mocker freed B's copy as private, so D hits one and 101 was reported removed."""
    engine = Engine("w0", EngineSetup(block_size=16, num_blocks=12, cache_duplicates=duplicates), UnitStep(), recorder)
    engine.submit(spec("A", 32, 1, [100, 101], block_size=16))
    run_until_idle(engine)
    engine.submit(spec("B", 32, 1, [100, 101], block_size=16))
    engine.submit(spec("C", 160, 1, list(range(300, 310)), block_size=16))
    run_until_idle(engine)
    engine.submit(spec("D", 33, 1, [100, 101], block_size=16))
    run_until_idle(engine)
    assert {entry[1]: entry[2] for entry in recorder.log if entry[0] == "admitted"} == {"A": 0, "B": 16, "C": 0, "D": d_hit}
    assert recorder.removed == removed
    assert engine.audit(every_block=True) is None
