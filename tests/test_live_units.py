"""Live mode without Dynamo processes: Dynamo's block hashing, the KV-event wire format, the
policy host's program table (routing, turn ends, failures, holds and resumes, KV events), the
router's status and metrics, and the `live` command's one-line errors for bad input."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

# the live extra (not Dynamo itself: only the hashing cross-check needs that)
msgpack = pytest.importorskip("msgpack")
pytest.importorskip("zmq")
pytest.importorskip("xxhash")

from conftest import LIVE_BLOCK_SIZE, SCENARIOS, FakeClock, live_view  # noqa: E402
from conftest import live_host as _host  # noqa: E402

from tasim import events as ev  # noqa: E402
from tasim.cli import main  # noqa: E402
from tasim.live.hashing import chain_from, local_block_hashes, pack_tokens, sequence_hashes  # noqa: E402
from tasim.live.host import PolicyHost  # noqa: E402
from tasim.live.kv_events import KvEvent, KvEventSubscriber, decode_message  # noqa: E402
from tasim.live.status import prometheus_text, status_snapshot  # noqa: E402
from tasim.model import RequestSpec  # noqa: E402
from tasim.policies import TurnEnd  # noqa: E402
from tasim.policies.kv_router import KvRouter  # noqa: E402
from tasim.policies.round_robin import RoundRobin  # noqa: E402
from tasim.policies.thunderagent import ThunderAgent  # noqa: E402

BS = LIVE_BLOCK_SIZE


# --- helpers -------------------------------------------------------------------------------------


def _tokens(n: int, start: int = 5) -> list[int]:
    return list(range(start, start + n))


def _frames(seq: int, events: list[Any]) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), msgpack.packb([1700000000.0, events, 0])]


class RecordingRoundRobin(RoundRobin):
    """Round robin that records every turn end it hears."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.turn_ends: list[TurnEnd] = []

    def on_turn_end(self, turn: TurnEnd, now: float):
        self.turn_ends.append(turn)
        return ()


# --- hashing -------------------------------------------------------------------------------------


def test_local_block_hashes_match_dynamo() -> None:
    llm = pytest.importorskip("dynamo.llm")
    rng = np.random.default_rng(3)
    cases = [
        (_tokens(32), 16),
        (_tokens(40), 16),
        (_tokens(31), 16),
        (_tokens(3), 16),
        ([], 16),
        (rng.integers(0, 150_000, size=200).tolist(), 16),
        (rng.integers(0, 2**32, size=96).tolist(), 32),
        (_tokens(64), 4),
        (_tokens(30), 1),
    ]
    for tokens, bs in cases:
        expected = llm.compute_block_hash_for_seq(tokens, bs)
        assert local_block_hashes(tokens, bs) == expected, (len(tokens), bs)
        assert len(expected) == len(tokens) // bs


def test_sequence_hashes_match_a_real_mocker_kv_event() -> None:
    # block_hashes of a BlockStored event the Dynamo mocker published for tokens 5..36
    assert sequence_hashes(_tokens(32), 16) == [12561198586583604988, 17946932516392534513]
    # the first block's sequence hash is its local hash; later ones are chained, not local
    local = local_block_hashes(_tokens(32), 16)
    assert local[0] == 12561198586583604988 and local[1] != 17946932516392534513


def test_partial_tail_block_is_not_hashed() -> None:
    full = sequence_hashes(_tokens(32), 16)
    assert sequence_hashes(_tokens(47), 16) == full
    assert sequence_hashes(_tokens(15), 16) == []
    assert len(sequence_hashes(_tokens(48), 16)) == 3
    assert sequence_hashes(_tokens(48), 16)[:2] == full


def test_chain_from_continues_sequence_hashes() -> None:
    tokens = _tokens(100, start=1000)
    whole = sequence_hashes(tokens, 16)
    assert len(whole) == 6
    for cut in (1, 2, 5):
        head = sequence_hashes(tokens[: cut * 16], 16)
        assert head + chain_from(head[-1], tokens[cut * 16 :], 16) == whole
    assert chain_from(None, tokens, 16) == whole
    # a different parent changes every later hash
    assert chain_from(whole[0] ^ 1, tokens[16:], 16)[0] != whole[1]


# --- KV events wire format -----------------------------------------------------------------------


def test_decode_mocker_message() -> None:
    tokens = _tokens(32)
    frames = _frames(
        42,
        [
            {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": tokens, "block_size": 16},
            {"type": "BlockRemoved", "block_hashes": [3]},
            {"type": "AllBlocksCleared"},
        ],
    )
    seq, events = decode_message(frames)
    assert seq == 42
    assert events == [KvEvent("stored", (1, 2), tuple(tokens)), KvEvent("removed", (3,)), KvEvent("cleared")]


def test_decode_vllm_array_message() -> None:
    tokens = _tokens(32)
    big = 2**64 - 1  # hashes are u64: msgpack must keep them exact
    frames = _frames(
        7,
        [
            ["BlockStored", [1, big], None, tokens, 16, None, "GPU"],
            ["BlockRemoved", [big], "GPU"],
            ["AllBlocksCleared"],
            ["SomethingNew", [9]],  # unknown tags are skipped
        ],
    )
    seq, events = decode_message(frames)
    assert seq == 7
    assert events == [KvEvent("stored", (1, big), tuple(tokens)), KvEvent("removed", (big,)), KvEvent("cleared")]


@pytest.mark.parametrize(
    "frames",
    [
        [b"", (1).to_bytes(8, "big")],  # two frames
        [b"", (1).to_bytes(4, "big"), msgpack.packb([0.0, [], 0])],  # 4-byte sequence number
        [b"", (1).to_bytes(8, "big"), msgpack.packb({"events": []})],  # payload not an array
        [b"", (1).to_bytes(8, "big"), msgpack.packb([0.0])],  # no events
        [b"", (1).to_bytes(8, "big"), msgpack.packb([0.0, "x", 0])],  # events not an array
        [b"", (1).to_bytes(8, "big"), b"\xc1"],  # not msgpack
        [b"", (1).to_bytes(8, "big"), msgpack.packb([0.0, [], 0]) + b"\x01"],  # trailing bytes
    ],
)
def test_decode_rejects_bad_frames(frames: list[bytes]) -> None:
    with pytest.raises(ValueError):
        decode_message(frames)


def test_subscriber_counts_sequence_gaps_and_skips_bad_messages() -> None:
    seen: list[tuple[str, KvEvent]] = []
    sub = KvEventSubscriber({}, lambda w, e: seen.append((w, e)))
    sub._receive("w0", _frames(1, [{"type": "BlockStored", "block_hashes": [1]}]))
    sub._receive("w0", _frames(2, [{"type": "BlockStored", "block_hashes": [2]}]))
    assert sub.gaps == {}
    sub._receive("w0", _frames(4, [{"type": "BlockRemoved", "block_hashes": [1]}]))
    assert sub.gaps == {"w0": 1}
    sub._receive("w1", _frames(9, []))  # a worker's first message is never a gap
    sub._receive("w0", [b"", b"\x00"])  # undecodable: dropped, not counted, sequence unchanged
    sub._receive("w0", _frames(5, []))
    assert sub.gaps == {"w0": 1}
    assert sub.messages == 5
    assert seen == [("w0", KvEvent("stored", (1,))), ("w0", KvEvent("stored", (2,))), ("w0", KvEvent("removed", (1,)))]


def test_subscriber_gap_from_seq_1_to_3() -> None:
    sub = KvEventSubscriber({}, lambda w, e: None)
    sub._receive("w1", _frames(1, []))
    sub._receive("w1", _frames(3, []))
    assert sub.gaps == {"w1": 1}
    assert sub.messages == 2


# --- policy host -----------------------------------------------------------------------------------


def test_round_robin_routes_and_emits_in_order() -> None:
    async def go() -> None:
        host, clock, events = _host()
        first_prompt = _tokens(40)
        call = await host.admit("p", first_prompt, 8)
        assert call.worker == "w0" and call.spec.id == "p.0" and call.held_s == 0.0
        assert events == [
            ev.ProgramStarted(0.0, "p", 0),
            ev.RequestArrived(0.0, "p.0", "p", 0, 40, 0, 8),
            ev.RequestRouted(0.0, "p.0", "w0"),
        ]
        clock.t = 1.0
        host.call_first_token(call)
        clock.t = 2.0
        host.finish(call, 40, 8, 0)
        assert events[3:] == [ev.FirstToken(1.0, "p.0"), ev.RequestFinished(2.0, "p.0", "p", "w0", 40, 8, 0)]
        del events[:]
        clock.t = 3.0
        second = await host.admit("p", first_prompt + _tokens(8, 900) + _tokens(20, 2000), 4)
        assert second.worker == "w1" and second.spec.id == "p.1"
        assert second.spec.turn == 1 and second.spec.history_tokens == 48 and second.spec.prompt_tokens == 68
        assert events == [ev.RequestArrived(3.0, "p.1", "p", 1, 68, 48, 4), ev.RequestRouted(3.0, "p.1", "w1")]
        assert host.routed == {"w0": 1, "w1": 1}
        assert host.in_flight == 1 and host.finished == 1
        assert host.programs["p"].in_flight == 1

    asyncio.run(go())


def test_finish_then_end_program() -> None:
    async def go() -> None:
        host, clock, events = _host()
        call = await host.admit("p", _tokens(20), 5)
        clock.t = 4.0
        host.finish(call, 20, 5, 16)
        assert host.end_program("p") is True
        assert events[-2:] == [ev.RequestFinished(4.0, "p.0", "p", "w0", 20, 5, 16), ev.ProgramFinished(4.0, "p", 25, True)]
        assert host.programs == {} and host.in_flight == 0
        n = len(events)
        assert host.end_program("p") is False
        assert host.end_program("nobody") is False
        assert len(events) == n

    asyncio.run(go())


def test_program_without_completed_turn_ends_not_completed() -> None:
    host, _, events = _host()
    host.fail(asyncio.run(host.admit("p", _tokens(20), 5)), "engine error")  # forgets p: its call never happened
    host.finish(asyncio.run(host.admit("q", _tokens(20), 5)), 20, 5, 0)
    host.fail(asyncio.run(host.admit("q", _tokens(40), 5)), "engine error")
    assert host.end_program("q") is True
    assert [e for e in events if isinstance(e, ev.ProgramFinished)] == [
        ev.ProgramFinished(0.0, "p", 0, False),
        ev.ProgramFinished(0.0, "q", 25, False),
    ]


def test_one_off_call_is_a_program_that_ends_itself() -> None:
    async def go() -> None:
        host, clock, events = _host()
        call = await host.admit(None, _tokens(33), 3)
        assert call.spec.program == "~1" and call.spec.id == "~1.0"
        clock.t = 1.5
        host.finish(call, 33, 3, 0)
        assert events == [
            ev.ProgramStarted(0.0, "~1", 1),
            ev.RequestArrived(0.0, "~1.0", "~1", 0, 33, 0, 3),
            ev.RequestRouted(0.0, "~1.0", "w0"),
            ev.RequestFinished(1.5, "~1.0", "~1", "w0", 33, 3, 0),
            ev.ProgramFinished(1.5, "~1", 36, True),
        ]
        assert host.programs == {}
        second = await host.admit(None, _tokens(10), 3)
        assert second.spec.program == "~2" and second.worker == "w1"

    asyncio.run(go())


def _recording_host() -> tuple[PolicyHost, FakeClock, list[ev.Event], RecordingRoundRobin]:
    policy = RecordingRoundRobin(live_view(), RoundRobin.params_model(), np.random.default_rng(0))
    clock = FakeClock()
    events: list[ev.Event] = []
    return PolicyHost(policy, clock, events.append, BS), clock, events, policy


def test_failed_call_rolls_back_the_program() -> None:
    async def go() -> None:
        host, clock, events, policy = _recording_host()
        first = await host.admit("p", _tokens(40), 8)
        host.finish(first, 40, 8, 0)
        program = host.programs["p"]
        before = (program.turn, program.history_tokens, program.context_tokens)
        assert before == (1, 48, 48)
        del events[:]
        clock.t = 2.0
        failing = await host.admit("p", _tokens(70), 8)
        assert failing.spec.id == "p.1" and failing.worker == "w1"
        assert program.context_tokens == 70
        clock.t = 3.0
        host.fail(failing, "engine error")
        assert (program.turn, program.history_tokens, program.context_tokens) == before
        assert host.programs == {"p": program} and program.in_flight == 0
        assert events[-1] == ev.RequestDropped(3.0, "p.1", "p", "w1", "engine error")
        assert policy.turn_ends[-1] == TurnEnd("p", "p.1", "w1", 70, 0, 0, ok=False)
        assert host.failed == 1 and host.in_flight == 0 and host.finished == 1
        retry = await host.admit("p", _tokens(70), 8)
        assert retry.spec.turn == 1 and retry.spec.history_tokens == 48

    asyncio.run(go())


def test_retry_after_failure_gets_a_fresh_request_id() -> None:
    async def go() -> None:
        host, _, _ = _host()
        host.finish(await host.admit("p", _tokens(40), 8), 40, 8, 0)
        failing = await host.admit("p", _tokens(70), 8)
        host.fail(failing, "engine error")
        retry = await host.admit("p", _tokens(70), 8)
        assert (failing.spec.id, retry.spec.id) == ("p.1", "p.1r2")

    asyncio.run(go())


def test_program_with_a_failed_call_is_not_completed() -> None:
    async def go() -> None:
        host, _, events = _host()
        host.finish(await host.admit("p", _tokens(40), 8), 40, 8, 0)
        host.fail(await host.admit("p", _tokens(70), 8), "engine error")
        assert host.end_program("p") is True
        assert events[-1] == ev.ProgramFinished(0.0, "p", 48, False)

    asyncio.run(go())


def test_concurrent_calls_of_one_program_get_distinct_ids() -> None:
    async def go() -> None:
        host, _, _ = _host()
        a = await host.admit("p", _tokens(20), 4)
        b = await host.admit("p", _tokens(20), 4)
        assert (a.spec.id, b.spec.id) == ("p.0", "p.0r2")
        assert host.programs["p"].in_flight == 2

    asyncio.run(go())


def test_failing_first_call_forgets_the_program() -> None:
    async def go() -> None:
        host, clock, events, policy = _recording_host()
        call = await host.admit("q", _tokens(20), 4)
        clock.t = 1.0
        host.fail(call, "connection reset")
        assert host.programs == {}
        assert events == [
            ev.ProgramStarted(0.0, "q", 0),
            ev.RequestArrived(0.0, "q.0", "q", 0, 20, 0, 4),
            ev.RequestRouted(0.0, "q.0", "w0"),
            ev.RequestDropped(1.0, "q.0", "q", "w0", "connection reset"),
            ev.ProgramFinished(1.0, "q", 0, False),
        ]
        assert policy.turn_ends == [TurnEnd("q", "q.0", "w0", 20, 0, 0, ok=False)]
        assert host.in_flight == 0 and host.failed == 1
        # the program id starts again from turn 0: a new program, whose ids start again too
        again = await host.admit("q", _tokens(20), 4)
        assert again.spec.id == "q.0" and again.spec.history_tokens == 0 and again.created

    asyncio.run(go())


def test_ending_a_program_with_a_call_in_flight_waits_for_the_call() -> None:
    async def go() -> None:
        host, clock, events, policy = _recording_host()
        host.finish(await host.admit("p", _tokens(20), 4), 20, 4, 0)
        call = await host.admit("p", _tokens(40), 4)
        assert host.end_program("p") is True
        assert "p" in host.programs and not any(isinstance(e, ev.ProgramFinished) for e in events)
        clock.t = 1.0
        host.fail(call, "late")
        assert events[-2:] == [ev.RequestDropped(1.0, "p.1", "p", "w1", "late"), ev.ProgramFinished(1.0, "p", 24, False)]
        assert policy.turn_ends[-1] == TurnEnd("p", "p.1", "w1", 40, 0, 0, ok=False)  # heard before the end
        assert host.programs == {} and host.in_flight == 0 and host.failed == 1

    asyncio.run(go())


# ThunderAgent (upstream defaults: buffer 100 tokens per program, threshold 1.0) on two workers of
# 8 blocks x 16 tokens = 128 tokens: a 20-token program needs 120, so each worker fits exactly one.


async def _two_placed_and_one_held() -> tuple[PolicyHost, FakeClock, list[ev.Event], asyncio.Task[Any], list[Any]]:
    host, clock, events = _host("thunderagent", kv_blocks=8)
    assert isinstance(host.policy, ThunderAgent)
    a = await host.admit("A", _tokens(20), 4)
    b = await host.admit("B", _tokens(20, 100), 4)
    assert (a.worker, b.worker) == ("w0", "w1")
    del events[:]
    clock.t = 1.0
    task = asyncio.create_task(host.admit("C", _tokens(20, 200), 4))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done()
    assert events == [
        ev.ProgramStarted(1.0, "C", 0),
        ev.RequestArrived(1.0, "C.0", "C", 0, 20, 0, 4),
        ev.RequestHeld(1.0, "C.0", "C"),
        ev.ProgramPaused(1.0, "C"),
    ]
    assert len(host.programs["C"].held) == 1 and host.pauses == 1
    assert list(host.policy.queue) == ["C"]
    return host, clock, events, task, [a, b]


def test_thunderagent_held_new_program_cancelled_is_forgotten() -> None:
    async def go() -> None:
        host, clock, events, task, _ = await _two_placed_and_one_held()
        del events[:]
        clock.t = 2.0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert list(host.programs) == ["A", "B"]
        assert events == [
            ev.RequestDropped(2.0, "C.0", "C", "", "cancelled while held"),
            ev.ProgramFinished(2.0, "C", 0, False),
        ]
        assert host.policy.queue == {} and "C" not in host.policy.programs
        assert host.in_flight == 2 and host.failed == 1 and host.routed == {"w0": 1, "w1": 1}

    asyncio.run(go())


def test_thunderagent_held_new_program_resumes_when_room_frees() -> None:
    async def go() -> None:
        host, clock, events, task, (a, _) = await _two_placed_and_one_held()
        clock.t = 3.0
        host.finish(a, 20, 4, 0)
        assert host.end_program("A") is True
        clock.t = 6.0  # past the 5 s scheduler interval
        host.tick()  # A's room on w0 is free again: the scheduler resumes C there
        call = await asyncio.wait_for(task, 1.0)
        assert call.worker == "w0" and call.spec.id == "C.0" and call.held_s == 5.0
        assert events[-3:] == [
            ev.ProgramFinished(3.0, "A", 24, True),
            ev.ProgramResumed(6.0, "C", "w0", False),
            ev.RequestRouted(6.0, "C.0", "w0"),
        ]
        assert host.programs["C"].held == [] and host.resumes == 1
        assert host.routed == {"w0": 2, "w1": 1}

    asyncio.run(go())


def test_thunderagent_tick_without_room_keeps_holding() -> None:
    async def go() -> None:
        host, clock, events, task, _ = await _two_placed_and_one_held()
        n = len(events)
        clock.t = 6.0
        host.tick()
        await asyncio.sleep(0)
        assert not task.done() and len(events) == n
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())


def test_ending_a_held_program_cancels_its_call() -> None:
    async def go() -> None:
        host, clock, events, task, _ = await _two_placed_and_one_held()
        clock.t = 2.0
        assert host.end_program("C") is True
        with pytest.raises(asyncio.CancelledError):
            await task
        assert list(host.programs) == ["A", "B"]
        finished = [e for e in events if isinstance(e, ev.ProgramFinished)]
        assert [(e.t, e.program, e.completed) for e in finished] == [(2.0, "C", False)]  # once, not again by the roll-back
        assert events[-1] == ev.RequestDropped(2.0, "C.0", "C", "", "cancelled while held")

    asyncio.run(go())


def test_block_hashes_reuse_the_programs_prefix() -> None:
    async def go() -> None:
        host, _, _ = _host()
        first = _tokens(40, 7)
        a = await host.admit("p", first, 4)
        assert list(a.spec.block_hashes) == sequence_hashes(first, BS) and len(a.spec.block_hashes) == 2
        longer = first + _tokens(45, 3000)  # 85 tokens: extends the first prompt, 5 full blocks
        b = await host.admit("p", pack_tokens(longer), 4)  # packed tokens are taken as they are
        assert b.spec.prompt_tokens == 85 and list(b.spec.block_hashes) == sequence_hashes(longer, BS) and len(b.spec.block_hashes) == 5
        assert host.programs["p"].hashed == pack_tokens(longer[:80])
        other = _tokens(50, 9000)  # does not extend it
        c = await host.admit("p", other, 4)
        assert list(c.spec.block_hashes) == sequence_hashes(other, BS)
        shorter = other[:20]  # a prefix shorter than what is known
        d = await host.admit("p", shorter, 4)
        assert list(d.spec.block_hashes) == sequence_hashes(shorter, BS)
        changed = list(other)
        changed[3] += 1  # same length, first block differs
        e = await host.admit("p", changed + _tokens(16), 4)
        assert list(e.spec.block_hashes) == sequence_hashes(changed + _tokens(16), BS)
        assert list(e.spec.block_hashes)[1:] != sequence_hashes(other + _tokens(16), BS)[1:]

    asyncio.run(go())


def test_kv_events_update_cached_blocks_without_telling_a_policy_that_does_not_ask() -> None:
    host, clock, events = _host()
    assert host.policy.wants_kv_events is False
    host.kv_event("w0", KvEvent("stored", (1, 2, 3)))
    host.kv_event("w1", KvEvent("stored", (4,)))
    assert (host.cached_blocks("w0"), host.cached_blocks("w1")) == (3, 1)
    host.kv_event("w0", KvEvent("removed", (2, 99)))
    assert host.cached_blocks("w0") == 2
    host.kv_event("w0", KvEvent("cleared"))
    assert (host.cached_blocks("w0"), host.cached_blocks("w1")) == (0, 1)
    assert events == []  # log_kv_events is off


def test_kv_events_reach_kv_router_index_and_log() -> None:
    async def go() -> None:
        host, clock, events = _host("kv_router", log_kv_events=True)
        policy = host.policy
        assert isinstance(policy, KvRouter) and policy.wants_kv_events
        prompt = _tokens(48, 11)
        hashes = tuple(sequence_hashes(prompt, BS))
        probe = RequestSpec("x.0", "x", 0, 48, 4, 0, hashes)
        clock.t = 1.0
        host.kv_event("w1", KvEvent("stored", hashes, tuple(prompt)))
        # cost = (P + ISL) / bs - overlap + active + new: w0 3 + 3, w1 (3 - 3) + 3
        assert policy.costs(probe, 1.0) == ({"w0": 6.0, "w1": 3.0}, {"w0": 0, "w1": 3})
        clock.t = 2.0
        host.kv_event("w1", KvEvent("removed", (hashes[1],)))
        assert policy.costs(probe, 2.0)[1] == {"w0": 0, "w1": 1}
        assert host.cached_blocks("w1") == 2
        clock.t = 3.0
        host.kv_event("w1", KvEvent("cleared"))
        assert policy.costs(probe, 3.0)[1] == {"w0": 0, "w1": 0}
        host.kv_event("w0", KvEvent("cleared"))  # nothing cached: nothing logged, nothing told
        assert events[:2] == [ev.KvStored(1.0, "w1", hashes), ev.KvRemoved(2.0, "w1", (hashes[1],))]
        assert len(events) == 3 and isinstance(events[2], ev.KvRemoved)
        assert (events[2].t, events[2].worker, sorted(events[2].blocks)) == (3.0, "w1", sorted((hashes[0], hashes[2])))
        # routed through the host: the worker that reports the prefix cached gets the next call
        clock.t = 4.0
        host.kv_event("w0", KvEvent("stored", hashes))
        longer = prompt + _tokens(16, 500)
        call = await host.admit("p", longer, 4)
        assert call.worker == "w0" and call.spec.block_hashes == tuple(sequence_hashes(longer, BS))
        assert call.spec.block_hashes[:3] == hashes

    asyncio.run(go())


# --- status and metrics --------------------------------------------------------------------------


def _router() -> SimpleNamespace:
    host, clock, _ = _host()
    kv = KvEventSubscriber({}, host.kv_event)
    decisions = SimpleNamespace(calls={"q.0": None}, unreported=2)  # pin mode's calls handed out and not reported
    return SimpleNamespace(host=host, instance_of={"w0": 101, "w1": 102}, kv=kv, decisions=decisions, ready=True, clock=clock)


def test_prometheus_text_and_status_snapshot() -> None:
    router = _router()
    host = router.host

    async def go() -> None:
        host.finish(await host.admit("p", _tokens(20), 4), 20, 4, 0)
        await host.admit("p", _tokens(40), 4)

    asyncio.run(go())
    for program in ("gone1", "gone2", "gone3"):
        assert host.session_final(program) is False
    router.kv._receive("w0", _frames(1, [{"type": "BlockStored", "block_hashes": [1, 2]}]))
    router.kv._receive("w0", _frames(3, [{"type": "BlockRemoved", "block_hashes": [2]}]))
    router.kv._receive("w1", _frames(1, [{"type": "BlockStored", "block_hashes": [7, 8, 9]}]))
    router.clock.t = 12.5
    assert host.worker_lost("w1", "test") and not host.worker_lost("w1", "again")
    text = prometheus_text(router)
    assert text.endswith("\n")
    lines = text.splitlines()
    for line in (
        'tasim_router_requests_routed_total{worker="w0"} 1',
        'tasim_router_requests_routed_total{worker="w1"} 1',
        "tasim_router_requests_finished_total 1",
        "tasim_router_requests_failed_total 0",
        "tasim_router_requests_in_flight 1",
        "tasim_router_programs_live 1",
        "tasim_router_programs_held 0",
        "tasim_router_pauses_total 0",
        "tasim_router_resumes_total 0",
        "tasim_router_session_finals_total 3",
        "tasim_router_session_finals_unknown_total 3",
        "tasim_router_programs_expired_total 0",
        'tasim_router_cached_blocks{worker="w0"} 1',
        'tasim_router_cached_blocks{worker="w1"} 0',  # a lost worker's cache went with it
        'tasim_router_kv_event_gaps_total{worker="w0"} 1',
        "tasim_router_requests_retried_total 0",
        "tasim_router_requests_refused_total 0",
        'tasim_router_worker_serving{worker="w0"} 1',
        'tasim_router_worker_serving{worker="w1"} 0',
        'tasim_router_worker_requests_in_flight{worker="w1"} 1',
        "# TYPE tasim_router_requests_routed_total counter",
        "# TYPE tasim_router_requests_in_flight gauge",
    ):
        assert line in lines, line
    assert [line.split(" ")[0] for line in lines if line.startswith("tasim_router_decision")] == [
        'tasim_router_decision_ms{quantile="0.5"}',
        'tasim_router_decision_ms{quantile="0.99"}',
        "tasim_router_decision_max_ms",
    ]
    assert all(line.startswith("# ") or len(line.split(" ")) == 2 for line in lines)

    snapshot = status_snapshot(router)
    decision = snapshot.pop("decision_ms")
    assert set(decision) == {"p50", "p99", "max"} and all(v is not None and v >= 0 for v in decision.values())
    assert snapshot == {
        "ready": True,
        "policy": "round_robin",
        "time_s": 12.5,
        "workers": {
            "w0": {"instance_id": 101, "serving": True, "routed": 1, "in_flight": 0, "cached_blocks": 1},
            "w1": {"instance_id": 102, "serving": False, "routed": 1, "in_flight": 1, "cached_blocks": 0},
        },
        "programs": {
            "live": 1,
            "held": 0,
            "expired": 0,
            "unknown_finals": 3,
            "table": {"p": {"parent": None, "turn": 1, "history_tokens": 24, "in_flight": 1, "held": False}},
        },
        "requests": {"in_flight": 1, "finished": 1, "failed": 0, "retried": 0, "refused": 0, "session_finals": 3},
        "pinned_calls": {"unreported": 1, "expired": 2},
        "pauses": 0,
        "resumes": 0,
        "ignored_pins": 0,
        "kv_events": {"messages": 3, "gaps": {"w0": 1}},
    }


def test_status_with_no_decisions_yet() -> None:
    router = _router()
    assert status_snapshot(router)["decision_ms"] == {"p50": None, "p99": None, "max": None}
    assert "decision_ms{" not in prometheus_text(router)


def test_prometheus_counters_are_exact_above_a_million() -> None:
    router = _router()
    router.host.routed["w0"] = 1_234_567
    assert 'tasim_router_requests_routed_total{worker="w0"} 1234567' in prometheus_text(router).splitlines()


# --- call priorities (policies that set them, on priority-scheduling engines) -----------------------


def test_priority_scheduling_goes_live_on_vllm_workers_started_to_schedule_by_priority() -> None:
    from tasim.live.engines import worker_commands
    from tasim.live.run import prepare_scenario
    from tasim.scenario import load_scenario

    overrides = ["policy.name=autellix", "policy.params={}", "cluster.engine.scheduling_policy=priority"]
    scenario = prepare_scenario(load_scenario(SCENARIOS / "swe-agent.yaml", overrides), "http", 4, "vllm")
    ((_, args, _),) = worker_commands("vllm", scenario, Path("/model"), "m", [5557], 1.0)
    assert args[-2:] == ["--scheduling-policy", "priority"]
    fcfs = prepare_scenario(load_scenario(SCENARIOS / "swe-agent.yaml"), "http", 4, "vllm")
    ((_, args, _),) = worker_commands("vllm", fcfs, Path("/model"), "m", [5557], 1.0)
    assert "--scheduling-policy" not in args  # vLLM's default, fcfs


def test_a_proxied_call_carries_its_priority_where_dynamos_vllm_worker_reads_it() -> None:
    from tasim.live.router import prioritized

    request = {"token_ids": [1, 2], "routing": {"priority_jump": 0.0}}
    # queue 3 of a priority policy (lower first) -> routing.priority -3 -> vLLM priority 3
    assert prioritized(request, 3) == {"token_ids": [1, 2], "routing": {"priority_jump": 0.0, "priority": -3}}
    assert prioritized({"token_ids": [1]}, 1) == {"token_ids": [1], "routing": {"priority": -1}}
    assert prioritized(request, 0) is request  # no priority: the request as the frontend sent it
    assert request == {"token_ids": [1, 2], "routing": {"priority_jump": 0.0}}  # never changed in place


# --- CLI: bad input fails before any process starts ------------------------------------------------


@pytest.fixture
def no_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    import tasim.live.run as run
    import tasim.live.stack as stack

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a live stack was started")

    monkeypatch.setattr(run, "run_live", refuse)
    monkeypatch.setattr(run, "LiveStack", refuse)
    monkeypatch.setattr(stack.LiveStack, "__init__", refuse)


LIVE = str(SCENARIOS / "live-mocker.yaml")


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        ([LIVE, "--time-scale", "0"], ["--time-scale", "must be a positive finite number (got 0)"]),
        ([LIVE, "--time-scale", "-1"], ["--time-scale", "must be a positive finite number (got -1)"]),
        ([LIVE, "--time-scale", "inf"], ["--time-scale", "must be a positive finite number (got inf)"]),
        ([LIVE, "--engine", "tpu"], ["--engine", "invalid choice", "tpu"]),
        ([LIVE, "--programs", "0"], ["--programs", "must be at least 1 (got 0)"]),
        ([LIVE, "--model", "/nonexistent"], ["--model /nonexistent: no config.json there"]),
        ([LIVE, "--engine", "vllm", "--time-scale", "2"], ["--time-scale must be 1 with --engine vllm"]),
        ([str(SCENARIOS / "swe-agent.yaml")], ["finite workload", "workload.programs", "--programs"]),
        (["/nonexistent.yaml"], ["/nonexistent.yaml"]),
        ([LIVE, "--routing", "sideways"], ["--routing", "invalid choice", "sideways"]),
        ([LIVE, "--routing", "pin", "--set", "live.routing=proxy"], ["--set live.routing=proxy: --routing pin sets live.routing too"]),
        ([LIVE, "--routing", "dynamo-two-tier"], ["set policy.name=cache_aware (got thunderagent)"]),
        ([LIVE, "--routing", "dynamo-thunderagent", "--set", "policy.params={placement: best_fit}"], ["no counterpart", "placement"]),
        ([str(SCENARIOS / "rl-live-mocker.yaml"), "--driver", "verl", "--routing", "dynamo-thunderagent"], ["the verl driver runs through"]),
        (
            [
                str(SCENARIOS / "swe-agent.yaml"),
                "--programs",
                "4",
                "--set",
                "policy.name=autellix",
                "--set",
                "policy.params={}",
                "--set",
                "cluster.engine.scheduling_policy=priority",
            ],
            ["scheduling_policy priority (policy autellix) runs live on --engine vllm only, not mocker", "simulate it instead"],
        ),
        (
            [str(SCENARIOS / "swe-agent.yaml"), "--programs", "4", "--engine", "sglang", "--set", "cluster.engine.scheduling_policy=priority"],
            ["scheduling_policy priority (policy round_robin) runs live on --engine vllm only, not sglang"],
        ),
    ],
)
def test_live_bad_input_is_one_line_and_starts_nothing(
    argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str], no_stack: None
) -> None:
    _assert_one_line_error(["live", *argv], fragments, capsys)


def test_live_refuses_a_trace_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_stack: None) -> None:
    # scenarios/mooncake-synthetic.yaml reads a trace from outside the repository, so a small
    # trace scenario of its own keeps this independent of that data
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 60, "output_length": 20, "hash_ids": [1, 2]}\n')
    scenario = tmp_path / "trace.yaml"
    scenario.write_text("cluster: {engine: {block_size: 16, kv_blocks: 64}}\nworkload: {kind: mooncake_trace, path: t.jsonl}\n")
    fragments = ["the http driver runs agent workloads (workload.kind: agent), not 'mooncake_trace'"]
    _assert_one_line_error(["live", str(scenario)], fragments, capsys)


def _assert_one_line_error(argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error:"), lines[0]
    assert "Traceback" not in captured.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert captured.out == ""


# --- the stack's children die with the launcher --------------------------------------------------


def test_a_child_whose_launcher_died_before_it_asked_to_die_with_it_leaves_before_exec() -> None:
    """PR_SET_PDEATHSIG only covers a parent that dies after the request: a child that finds
    another parent (init took it over) exits as if told, rather than running unsupervised."""
    import os
    import subprocess
    import sys

    from tasim.lifecycle import terminate_with

    if not sys.platform.startswith("linux"):
        pytest.skip("parent-death signals are Linux's")
    ours = subprocess.Popen(["true"], preexec_fn=terminate_with(os.getpid()))
    orphaned = subprocess.Popen(["sleep", "30"], preexec_fn=terminate_with(os.getpid() + 1_000_000))
    assert ours.wait(10) == 0 and orphaned.wait(10) == 143
