"""`tasim.live.router.live_host`: the policy host's program table (routing, turn ends, failures, holds and resumes, KV events)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

# the live extra
pytest.importorskip("msgpack")
pytest.importorskip("zmq")
pytest.importorskip("xxhash")

from conftest import LIVE_BLOCK_SIZE, FakeClock, live_view  # noqa: E402
from conftest import live_host as _host  # noqa: E402
from conftest import tokens as _tokens  # noqa: E402

from tasim.core import events as ev  # noqa: E402
from tasim.core.model import RequestSpec  # noqa: E402
from tasim.live.hashing import pack_tokens, sequence_hashes  # noqa: E402
from tasim.live.router.kv_events import KvEvent  # noqa: E402
from tasim.live.router.live_host import PolicyHost  # noqa: E402
from tasim.policies import TurnEnd  # noqa: E402
from tasim.policies.kv_router import KvRouter  # noqa: E402
from tasim.policies.round_robin import RoundRobin  # noqa: E402
from tasim.policies.thunderagent import ThunderAgent  # noqa: E402

BS = LIVE_BLOCK_SIZE


class RecordingRoundRobin(RoundRobin):
    """Round robin that records every turn end it hears."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.turn_ends: list[TurnEnd] = []

    def on_turn_end(self, turn: TurnEnd, now: float):
        self.turn_ends.append(turn)
        return ()


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


def test_a_call_cut_by_a_gated_weight_sync_is_retried_as_the_turns_next_call() -> None:
    """The turn stays open: the policy hears the cut call end (not ok), the log has it retried
    with the tokens it generated, the client's retry gets the turn's next id, and the gate is
    closed from the begin to the end of the sync."""

    async def go() -> None:
        policy = RecordingRoundRobin(live_view(2), RoundRobin.params_model(), np.random.default_rng(0))
        clock = FakeClock()
        events: list[ev.Event] = []
        host = PolicyHost(policy, clock, events.append, BS)
        host.finish(await host.admit("p", _tokens(40), 8), 40, 8, 0)
        cut = await host.admit("p", _tokens(70), 100)
        clock.t = 2.0
        assert host.begin_weight_sync(3, gate=True) and not host.gate.is_set()
        host.aborted_by_sync(cut, 37)
        assert events[-1] == ev.RequestRetried(2.0, "p.1", "p", cut.worker, "aborted by the weight sync to version 3", 37)
        assert policy.turn_ends[-1] == TurnEnd("p", "p.1", cut.worker, 70, 37, 0, ok=False)
        assert (host.programs["p"].turn, host.in_flight, host.failed) == (1, 0, 0)
        retry = await host.admit("p", _tokens(107), 63)
        assert retry.spec.id == "p.1r2" and retry.spec.prompt_tokens == 107
        assert host.end_weight_sync(3) == 0 and host.gate.is_set()
        host.finish(retry, 107, 63, 0)
        assert host.programs["p"].turn == 2 and host.session_final("p")
        assert [e.completed for e in events if isinstance(e, ev.ProgramFinished)] == [True]

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


def test_host_tier_events_reach_kv_router_with_their_tier_and_leave_the_gpu_count() -> None:
    """A worker's host-tier (CPU offload) blocks: logged with their tier, credited by kv_router at
    0.75 a block beyond the GPU prefix, and not counted among the blocks cached on the GPU."""
    host, clock, events = _host("kv_router", log_kv_events=True)
    policy = host.policy
    assert isinstance(policy, KvRouter)
    prompt = _tokens(64, 11)
    hashes = tuple(sequence_hashes(prompt, BS))
    probe = RequestSpec("x.0", "x", 0, 64, 4, 0, hashes)
    clock.t = 1.0
    host.kv_event("w1", KvEvent("stored", hashes, tier="host"))
    assert host.cached_blocks("w1") == 0
    assert policy.tier_overlaps(probe, 1.0) == {"w0": (0, 0, 0), "w1": (0, 4, 0)}
    assert policy.cached_tokens(probe, 1.0)["w1"] == 48
    assert policy.costs(probe, 1.0)[0] == {"w0": 8.0, "w1": 5.0}  # 4 + 4 new, (4 - 0.75 x 4) + 4
    clock.t = 2.0
    host.kv_event("w1", KvEvent("removed", hashes[2:], tier="host"))
    assert policy.tier_overlaps(probe, 2.0)["w1"] == (0, 2, 0)
    assert events == [ev.KvStored(1.0, "w1", hashes, "host"), ev.KvRemoved(2.0, "w1", hashes[2:], "host")]
