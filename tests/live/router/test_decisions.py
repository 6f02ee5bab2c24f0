"""Decision-only routing (``live.routing: pin``) without Dynamo: the decision service
(`tasim.live.router.decisions`) served over real HTTP and WebSocket on 127.0.0.1 around the live policy
host, with the simulator's event checks on its log. The pin-mode stack itself runs in
tests/live/test_live_e2e.py (``thunderagent@pin``), test_live_load.py and test_live_faults.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("xxhash")

import aiohttp  # noqa: E402
from conftest import FakeClock  # noqa: E402
from conftest import live_host as _host  # noqa: E402
from conftest import tokens as _tokens  # noqa: E402

from tasim.core import events as ev  # noqa: E402
from tasim.live.clients.pinned import DecisionSocket  # noqa: E402
from tasim.live.router.decisions import PIN_HEADER, PRIORITY_HEADER, Decisions, decision_app, serve_app  # noqa: E402
from tasim.live.router.live_host import PolicyHost  # noqa: E402
from tasim.live.stack.launcher import HOST, free_ports  # noqa: E402

INSTANCES = {"w0": 100, "w1": 101}
BAD_OP = "bad frame: Invalid value 'nonsense' - at `$.op` (ops: route, first, done, fail, retry, end, weight_sync_begin, weight_sync_end, cancel)"


class Workers:
    """What the router knows of the workers: their instances, and which ones would fail a
    probe (a client's report of a failure is checked, never just believed)."""

    def __init__(self, host: PolicyHost) -> None:
        self.host = host
        self.dead: set[str] = set()
        self.probed: list[tuple[str, int]] = []

    async def confirm_lost(self, worker: str, instance: int, reason: str) -> None:
        self.probed.append((worker, instance))
        if worker in self.dead:
            self.host.worker_lost(worker, reason)


@asynccontextmanager
async def service(
    policy: str = "round_robin",
    kv_blocks: int = 64,
    max_retries: int = 3,
    report_timeout_s: float | None = None,
    params: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[str, Decisions, Workers, FakeClock, list[ev.Event]]]:
    host, clock, events = _host(policy, params, kv_blocks=kv_blocks, checked=True)
    workers = Workers(host)
    decisions = Decisions(host, INSTANCES.get, workers.confirm_lost, max_retries, report_timeout_s)
    (port,) = free_ports(1)
    runner = await serve_app(decision_app(decisions), port)
    try:
        yield f"http://{HOST}:{port}", decisions, workers, clock, events
    finally:
        await runner.cleanup()


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else None
    async with session.post(url, data=data, json=None if data is not None else body) as reply:
        text = await reply.text()
        return reply.status, (await reply.json(content_type=None)) if text else None


def test_route_first_and_done_log_the_call_as_proxy_mode_does() -> None:
    async def go() -> None:
        async with service() as (url, decisions, _, clock, events), aiohttp.ClientSession() as session:
            status, a = await _post(session, f"{url}/v1/route", {"program": "A", "token_ids": _tokens(20), "max_tokens": 4})
            assert status == 200
            assert a == {"call": "A.0", "worker": "w0", "instance_id": 100, "pin": {PIN_HEADER: "100"}, "held_s": 0.0}
            status, b = await _post(session, f"{url}/v1/route", {"program": "B", "parent": "g", "token_ids": _tokens(20, 100), "max_tokens": 4})
            assert (status, b["worker"], b["pin"]) == (200, "w1", {PIN_HEADER: "101"})
            clock.t = 0.5
            assert await _post(session, f"{url}/v1/first", {"call": "A.0"}) == (204, None)
            assert await _post(session, f"{url}/v1/first", {"call": "A.0"}) == (204, None)  # a repeat changes nothing
            clock.t = 1.0
            done = {"call": "A.0", "prompt_tokens": 20, "completion_tokens": 4, "cached_tokens": 16}
            assert await _post(session, f"{url}/v1/done", done) == (204, None)
            assert await _post(session, f"{url}/v1/end", {"program": "A"}) == (200, {"known": True})
            assert await _post(session, f"{url}/v1/end", {"program": "never"}) == (200, {"known": False})
            host = decisions.host
            assert (host.finished, host.in_flight, host.session_finals, host.unknown_finals) == (1, 1, 2, 1)
            assert list(decisions.calls) == ["B.0"]
            a_events = [e for e in events if getattr(e, "program", None) == "A" or getattr(e, "request", "").startswith("A.")]
            assert [type(e).__name__ for e in a_events] == [
                "ProgramStarted",
                "RequestArrived",
                "RequestRouted",
                "FirstToken",
                "RequestFinished",
                "ProgramFinished",
            ]
            assert a_events[3] == ev.FirstToken(0.5, "A.0")

    asyncio.run(go())


def test_a_calls_priority_travels_in_the_headers_the_client_sends() -> None:
    # Autellix: a program's second call queues by the service its first received, 2.5 s from
    # first token to end, which is PLAS queue 1 (boundaries 2, 4, ... s); Dynamo's frontend
    # copies x-dynamo-request-priority into routing.priority, which its vLLM worker negates.
    async def go() -> None:
        async with service("autellix") as (url, _, _, clock, _), aiohttp.ClientSession() as session:
            status, first = await _post(session, f"{url}/v1/route", {"program": "A", "token_ids": _tokens(20), "max_tokens": 4})
            assert (status, first["pin"]) == (200, {PIN_HEADER: "100"})  # queue 0: nothing to send
            clock.t = 0.5
            await _post(session, f"{url}/v1/first", {"call": "A.0"})
            clock.t = 3.0
            await _post(session, f"{url}/v1/done", {"call": "A.0", "prompt_tokens": 20, "completion_tokens": 4})
            status, second = await _post(session, f"{url}/v1/route", {"program": "A", "token_ids": _tokens(30), "max_tokens": 4})
            assert (status, second["pin"]) == (200, {PIN_HEADER: "100", PRIORITY_HEADER: "-1"})

    asyncio.run(go())


BAD_BODIES = [
    ("route", {"program": "x" * 257, "token_ids": [1]}, 400, "session id of 257 characters; at most 256 are allowed"),
    ("route", {"parent": "y" * 300, "token_ids": [1]}, 400, "parent session id of 300 characters"),
    ("route", {"token_ids": [-1]}, 400, "Expected `int` >= 0 - at `$.token_ids[0]`"),
    ("route", {"token_ids": [1 << 32]}, 400, "Expected `int` <= 4294967295"),
    ("route", {"programm": "p", "token_ids": [1]}, 400, "unknown field `programm` (fields: token_ids, tokens, max_tokens, program, parent)"),
    ("route", {"program": "p"}, 400, "give the prompt once: token_ids (a list of ids) or tokens (base64 of little-endian u32)"),
    ("route", {"token_ids": [1], "tokens": "AQAAAA=="}, 400, "give the prompt once"),
    ("route", {"tokens": "AQAA"}, 400, "tokens: 3 bytes is not a whole number of little-endian u32 token ids"),
    ("route", {"tokens": "!!"}, 400, "Invalid base64 encoded string - at `$.tokens`"),
    ("route", b"{not json", 400, "not JSON"),
    ("done", {"call": "nope.0", "prompt_tokens": 1, "completion_tokens": 1}, 404, "no call 'nope.0' is routed and unreported"),
    ("first", {"call": "nope.0"}, 404, "no call 'nope.0'"),
    ("fail", {"call": "nope.0", "reason": ""}, 400, "Expected `str` of length >= 1 - at `$.reason`"),
    ("retry", {"call": "nope.0", "reason": "x"}, 400, "give the prompt once"),
    ("retry", {"call": "nope.0", "reason": "x", "token_ids": [1]}, 404, "no call 'nope.0'"),
    ("end", {}, 400, "missing required field `program`"),
    ("weight_sync/begin", {}, 400, "missing required field `version`"),
    ("weight_sync/begin", {"version": -1}, 400, "Expected `int` >= 0 - at `$.version`"),
    ("weight_sync/begin", {"version": "3"}, 400, "Expected `int`, got `str` - at `$.version`"),
    ("weight_sync/begin", {"version": 1, "step": 1}, 400, "unknown field `step` (fields: version, abort)"),
    ("weight_sync/begin", {"version": 1, "abort": True}, 400, "abort needs live.routing proxy: with pin routing the calls stream past the router"),
    ("weight_sync/end", b"", 400, "not JSON"),
    ("weight_sync/end", {"version": 1}, 409, "end of a weight sync to version 1, but no weight sync is in progress"),
]


@pytest.mark.parametrize(("operation", "body", "status", "message"), BAD_BODIES, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_BODIES)])
def test_bad_bodies_get_a_one_line_4xx_and_change_nothing(operation: str, body: Any, status: int, message: str) -> None:
    async def go() -> None:
        async with service() as (url, decisions, _, _clock, events), aiohttp.ClientSession() as session:
            got, answer = await _post(session, f"{url}/v1/{operation}", body)
            assert got == status and message in answer["error"] and "\n" not in answer["error"]
            assert events == [] and decisions.host.programs == {} and decisions.calls == {}

    asyncio.run(go())


def test_socket_answers_by_id_and_refuses_bad_frames_in_one_line() -> None:
    async def go() -> None:
        async with service() as (url, decisions, _, _clock, _events), aiohttp.ClientSession() as session:
            socket = DecisionSocket(session, f"{url}/v1/socket")
            answers = await asyncio.gather(*(socket.ask("route", {"program": p, "token_ids": _tokens(20), "max_tokens": 4}) for p in "ABC"))
            assert [(a["call"], a["worker"], a["instance_id"]) for a in answers] == [("A.0", "w0", 100), ("B.0", "w1", 101), ("C.0", "w0", 100)]
            for call in ("A.0", "B.0"):
                await socket.tell("first", {"call": call})
                await socket.tell("done", {"call": call, "prompt_tokens": 20, "completion_tokens": 4})
            await socket.tell("fail", {"call": "C.0", "reason": "the client gave up"})
            assert await socket.ask("end", {"program": "A"}) == {"known": True}
            refused = await socket.ask("route", {"program": "z" * 300, "token_ids": [1]})
            assert refused == {"status": 400, "error": "session id of 300 characters; at most 256 are allowed"}
            await socket.tell("done", {"call": "gone.0", "prompt_tokens": 1, "completion_tokens": 1})  # no id: answered with id null
            await socket.tell("nonsense", {})
            assert await socket.ask("end", {"program": "B"}) == {"known": True}  # frames are handled in order
            assert socket.errors == [
                "no call 'gone.0' is routed and unreported (ids come from /v1/route)",
                BAD_OP,
            ]
            host = decisions.host
            assert (host.finished, host.failed, host.in_flight, list(host.programs)) == (2, 1, 0, [])
            await socket.close()

    asyncio.run(go())


def test_a_message_may_carry_a_batch_of_frames_and_is_answered_in_one() -> None:
    """Frames queued in one turn of a client's loop travel as one JSON array
    (`tasim.live.frames`); the service handles them in order, a bad one alone refused, and
    sends the answers of one turn as one array."""

    async def go() -> None:
        async with service() as (url, decisions, _, _clock, _events), aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{url}/v1/socket") as socket:
                batch = [
                    {"op": "route", "id": 1, "program": "A", "token_ids": _tokens(20), "max_tokens": 4},
                    {"op": "route", "id": 2, "program": "B", "token_ids": _tokens(20, 50), "max_tokens": 4},
                    {"op": "nonsense", "id": 3},
                    {"op": "done", "call": "A.0", "prompt_tokens": 20, "completion_tokens": 4},
                    {"op": "end", "id": 4, "program": "A"},
                ]
                await socket.send_json(batch)
                answers = json.loads(await socket.receive_bytes(timeout=5))
                assert answers == [
                    {"call": "A.0", "worker": "w0", "instance_id": 100, "pin": {PIN_HEADER: "100"}, "held_s": 0.0, "id": 1},
                    {"call": "B.0", "worker": "w1", "instance_id": 101, "pin": {PIN_HEADER: "101"}, "held_s": 0.0, "id": 2},
                    {
                        "id": None,
                        "status": 400,
                        "error": BAD_OP,
                    },
                    {"known": True, "id": 4},
                ]
                await socket.send_str("[1, 2")
                assert json.loads(await socket.receive_bytes(timeout=5)) == {
                    "id": None,
                    "status": 400,
                    "error": "bad message: not JSON (Input data was truncated)",
                }
            assert (decisions.host.finished, sorted(decisions.calls)) == (1, ["B.0"])

    asyncio.run(go())


def test_a_call_handed_out_after_its_asker_gave_up_is_given_back() -> None:
    """The cancel frame reaches the service after the call was placed (not held, so nothing
    to cancel there): the client, seeing the answer of a question it abandoned, fails the call
    at once instead of leaving it routed until the report timeout."""

    async def go() -> None:
        async with service() as (url, decisions, _, _clock, events), aiohttp.ClientSession() as session:
            socket = DecisionSocket(session, f"{url}/v1/socket")
            assert await socket.ask("end", {"program": "nobody"}) == {"known": False}  # opens the socket
            asked = asyncio.ensure_future(socket.ask("route", {"program": "A", "token_ids": _tokens(20), "max_tokens": 4}))
            await asyncio.sleep(0)  # the route frame is queued
            asked.cancel()
            await asyncio.gather(asked, return_exceptions=True)
            for _ in range(50):
                if decisions.host.failed:
                    break
                await asyncio.sleep(0.02)
            assert (decisions.host.failed, decisions.calls, decisions.host.in_flight) == (1, {}, 0)
            assert [(e.request, e.reason) for e in events if isinstance(e, ev.RequestDropped)] == [
                ("A.0", "client: the client gave up waiting for the answer")
            ]
            assert (socket._abandoned, socket.errors) == (set(), [])  # the late cancel got no answer of its own
            await socket.close()

    asyncio.run(go())


# ThunderAgent on two workers of 8 blocks x 16 tokens: a 20-token program (plus its 100-token
# buffer) fills a worker, so a third program is held until one ends (as in test_live_host).


def test_a_cancel_is_the_last_word_on_a_question_still_waiting_and_nothing_after_an_answer() -> None:
    async def go() -> None:
        async with (
            service("thunderagent", kv_blocks=8) as (url, decisions, _, clock, events),
            aiohttp.ClientSession() as session,
            session.ws_connect(f"{url}/v1/socket") as socket,
        ):
            clock.t = 1.0
            routes = [{"op": "route", "id": i, "program": p, "token_ids": _tokens(20, 100 * i), "max_tokens": 4} for i, p in enumerate("ABC", 1)]
            await socket.send_json(routes)  # C is held: A and B fill both workers
            answered = json.loads(await socket.receive_bytes(timeout=5))
            assert [(a["id"], a["call"]) for a in answered] == [(1, "A.0"), (2, "B.0")]
            await socket.send_json([{"op": "cancel", "id": 3}, {"op": "cancel", "id": 1}, {"op": "cancel", "id": 99}])
            assert json.loads(await socket.receive_bytes(timeout=5)) == {"cancelled": True, "id": 3}
            await socket.send_json({"op": "end", "id": 4, "program": "C"})  # no answer came for 1 or 99 meanwhile
            assert json.loads(await socket.receive_bytes(timeout=5)) == {"known": False, "id": 4}
            assert sorted(decisions.calls) == ["A.0", "B.0"]
            assert [(e.request, e.reason) for e in events if isinstance(e, ev.RequestDropped)] == [("C.0", "cancelled while held")]

    asyncio.run(go())


async def _two_placed_and_one_asked(socket: DecisionSocket) -> asyncio.Task[dict[str, Any]]:
    for program, start in (("A", 5), ("B", 100)):
        await socket.ask("route", {"program": program, "token_ids": _tokens(20, start), "max_tokens": 4})
    asked = asyncio.ensure_future(socket.ask("route", {"program": "C", "token_ids": _tokens(20, 200), "max_tokens": 4}))
    await asyncio.sleep(0.2)
    assert not asked.done()
    return asked


def test_a_held_call_is_answered_when_the_policy_resumes_its_program() -> None:
    async def go() -> None:
        async with service("thunderagent", kv_blocks=8) as (url, decisions, _, clock, events), aiohttp.ClientSession() as session:
            socket = DecisionSocket(session, f"{url}/v1/socket")
            clock.t = 1.0
            asked = await _two_placed_and_one_asked(socket)
            clock.t = 3.0
            await socket.tell("done", {"call": "A.0", "prompt_tokens": 20, "completion_tokens": 4})
            assert await socket.ask("end", {"program": "A"}) == {"known": True}
            clock.t = 6.0  # past the 5 s scheduler interval: C resumes on A's worker
            decisions.host.tick()
            answer = await asyncio.wait_for(asked, 5)
            assert answer == {"call": "C.0", "worker": "w0", "instance_id": 100, "pin": {PIN_HEADER: "100"}, "held_s": 5.0}
            assert [e for e in events if isinstance(e, (ev.RequestHeld, ev.ProgramResumed))] == [
                ev.RequestHeld(1.0, "C.0", "C"),
                ev.ProgramResumed(6.0, "C", "w0", False),
            ]
            await socket.close()

    asyncio.run(go())


@pytest.mark.parametrize("how", ["socket cancel", "socket closed", "http client gone"])
def test_a_client_that_leaves_while_held_rolls_its_call_back(how: str) -> None:
    async def go() -> None:
        async with service("thunderagent", kv_blocks=8) as (url, decisions, _, clock, events), aiohttp.ClientSession() as session:
            socket = DecisionSocket(session, f"{url}/v1/socket")
            clock.t = 1.0
            asked = await _two_placed_and_one_asked(socket)
            clock.t = 2.0
            if how == "socket cancel":
                asked.cancel()
                for _ in range(50):  # until the service's acknowledgment of the cancel arrives
                    if not socket._abandoned:
                        break
                    await asyncio.sleep(0.02)
                assert (socket._abandoned, socket.errors) == (set(), [])
            elif how == "socket closed":
                await socket.close()
            else:
                asked.cancel()  # rolled back by the cancel frame; now the same over HTTP
                await asyncio.sleep(0.2)
                body = {"program": "D", "token_ids": _tokens(20, 300), "max_tokens": 4}
                with pytest.raises(TimeoutError):
                    await session.post(f"{url}/v1/route", json=body, timeout=aiohttp.ClientTimeout(total=0.3))
            await asyncio.gather(asked, return_exceptions=True)
            await asyncio.sleep(0.3)
            host = decisions.host
            assert sorted(host.programs) == ["A", "B"] and host.in_flight == 2 and sorted(decisions.calls) == ["A.0", "B.0"]
            dropped = [e for e in events if isinstance(e, ev.RequestDropped)]
            assert [(e.request, e.reason) for e in dropped] == [("C.0", "cancelled while held")] + (
                [("D.0", "cancelled while held")] if how == "http client gone" else []
            )
            await socket.close()

    asyncio.run(go())


def test_a_retry_checks_the_worker_and_the_policy_places_the_call_again() -> None:
    async def go() -> None:
        async with service(max_retries=1) as (url, decisions, workers, clock, events), aiohttp.ClientSession() as session:
            socket = DecisionSocket(session, f"{url}/v1/socket")
            a = await socket.ask("route", {"program": "A", "token_ids": _tokens(20), "max_tokens": 4})
            assert a["worker"] == "w0"
            # The worker answers its probe: not lost; the call is placed again (round robin: w1).
            clock.t = 1.0
            again = await socket.ask("retry", {"call": "A.0", "reason": "frontend HTTP 503", "token_ids": _tokens(20), "max_tokens": 4})
            assert (again["call"], again["worker"], workers.probed, decisions.host.lost) == ("A.0r2", "w1", [("w0", 100)], set())
            # One retry allowed: the next failure fails the call for good.
            gave_up = await socket.ask("retry", {"call": "A.0r2", "reason": "frontend HTTP 503", "token_ids": _tokens(20), "max_tokens": 4})
            assert gave_up == {"status": 503, "error": "call A.0r2 failed on 2 workers; giving up (1 retries allowed)"}
            # A worker that does not answer its probe is lost, and the call goes elsewhere.
            b = await socket.ask("route", {"program": "B", "token_ids": _tokens(20, 50), "max_tokens": 4})
            workers.dead.add(b["worker"])
            moved = await socket.ask("retry", {"call": b["call"], "reason": "connection refused", "token_ids": _tokens(20, 50), "max_tokens": 4})
            assert moved["worker"] != b["worker"] and decisions.host.lost == {b["worker"]}
            assert [e.reason for e in events if isinstance(e, ev.RequestRetried)] == [
                "worker w0: client: frontend HTTP 503",
                f"worker {b['worker']}: client: connection refused",
            ]
            await socket.close()

    asyncio.run(go())


def test_calls_never_reported_are_failed_after_the_timeout_and_their_programs_idle() -> None:
    async def go() -> None:
        async with service(report_timeout_s=0.2) as (url, decisions, _, _clock, events), aiohttp.ClientSession() as session:
            socket = DecisionSocket(session, f"{url}/v1/socket")
            await socket.ask("route", {"program": "A", "token_ids": _tokens(20), "max_tokens": 4})
            await asyncio.sleep(0.3)
            decisions.expire_unreported()
            assert decisions.unreported == 1 and not decisions.calls and decisions.host.in_flight == 0
            assert [e.reason for e in events if isinstance(e, ev.RequestDropped)] == ["no report from the client within 0.2 s"]
            await socket.close()

    asyncio.run(go())


# --- weight syncs ----------------------------------------------------------------------------------


def test_thunderagent_holds_calls_through_a_weight_sync_and_its_end_routes_them() -> None:
    """A placed program's next call and a new program's first, both arriving during the sync,
    wait unaccounted; the trainer's end routes the first to its program's worker and admits the
    second where there is room (ThunderAgent's `Release`)."""

    async def go() -> None:
        async with service("thunderagent", kv_blocks=8) as (url, decisions, _, clock, events), aiohttp.ClientSession() as session:
            socket = DecisionSocket(session, f"{url}/v1/socket")
            a = await socket.ask("route", {"program": "A", "token_ids": _tokens(20), "max_tokens": 4})
            assert (a["call"], a["worker"]) == ("A.0", "w0")
            clock.t = 1.0
            assert await _post(session, f"{url}/v1/done", {"call": "A.0", "prompt_tokens": 20, "completion_tokens": 4}) == (204, None)
            clock.t = 2.0
            assert await _post(session, f"{url}/v1/weight_sync/begin", {"version": 1}) == (200, {"version": 1, "began": True})
            clock.t = 2.5
            assert await _post(session, f"{url}/v1/weight_sync/begin", {"version": 1}) == (200, {"version": 1, "began": False})
            clock.t = 3.0
            a1 = asyncio.ensure_future(socket.ask("route", {"program": "A", "token_ids": _tokens(24), "max_tokens": 4}))
            await asyncio.sleep(0.1)
            clock.t = 3.5
            b0 = asyncio.ensure_future(socket.ask("route", {"program": "B", "token_ids": _tokens(20, 100), "max_tokens": 4}))
            await asyncio.sleep(0.2)
            assert not a1.done() and not b0.done()
            host = decisions.host
            assert host.policy.programs["A"].steps == 1 and "B" not in host.policy.programs  # held before any accounting
            clock.t = 4.0
            host.tick()  # no pass during the sync
            assert not a1.done() and not b0.done()
            clock.t = 6.0
            ended = await socket.ask("weight_sync_end", {"version": 1})
            assert ended == {"version": 1, "ended": True, "released": 2}
            answers = await asyncio.wait_for(asyncio.gather(a1, b0), 5)
            assert [(x["call"], x["worker"], x["held_s"]) for x in answers] == [("A.1", "w0", 3.0), ("B.0", "w1", 2.5)]
            assert host.in_flight == 2 and host.policy.programs["A"].steps == 2
            assert await socket.ask("weight_sync_end", {"version": 1}) == {"version": 1, "ended": False, "released": 0}  # a repeat
            assert [e for e in events if e.t >= 2.0 and not isinstance(e, (ev.RequestArrived, ev.ProgramStarted))] == [
                ev.WeightSyncStarted(2.0, 1),
                ev.RequestHeld(3.0, "A.1", "A"),
                ev.RequestHeld(3.5, "B.0", "B"),
                ev.WeightSyncFinished(6.0, 1),
                ev.RequestRouted(6.0, "A.1", "w0"),
                ev.RequestRouted(6.0, "B.0", "w1"),
            ]
            await socket.close()

    asyncio.run(go())


def test_thunderagents_watchdog_releases_held_calls_at_the_first_tick_past_its_timeout() -> None:
    async def go() -> None:
        async with service("thunderagent", kv_blocks=8) as (url, decisions, _, clock, events), aiohttp.ClientSession() as session:
            socket = DecisionSocket(session, f"{url}/v1/socket")
            clock.t = 1.0
            assert await socket.ask("weight_sync_begin", {"version": 7}) == {"version": 7, "began": True}
            clock.t = 2.0
            asked = asyncio.ensure_future(socket.ask("route", {"program": "A", "token_ids": _tokens(20), "max_tokens": 4}))
            await asyncio.sleep(0.2)
            host = decisions.host
            clock.t = 300.9  # 299.9 s into the sync (watchdog: 300 s)
            host.tick()
            await asyncio.sleep(0.1)
            assert not asked.done()
            clock.t = 301.0
            host.tick()
            answer = await asyncio.wait_for(asked, 5)
            assert (answer["call"], answer["worker"], answer["held_s"]) == ("A.0", "w0", 299.0)
            assert host.syncing == (7, 1.0)  # the trainer's sync is still open: only the policy gave up waiting
            clock.t = 302.0
            assert await socket.ask("weight_sync_end", {"version": 7}) == {"version": 7, "ended": True, "released": 0}
            assert (host.syncing, host.synced_version, host.weight_syncs) == (None, 7, 1)
            assert [e for e in events if not isinstance(e, (ev.RequestArrived, ev.ProgramStarted))] == [
                ev.WeightSyncStarted(1.0, 7),
                ev.RequestHeld(2.0, "A.0", "A"),
                ev.RequestRouted(301.0, "A.0", "w0"),
                ev.WeightSyncFinished(302.0, 7),
            ]
            await socket.close()

    asyncio.run(go())


def test_weight_syncs_that_contradict_the_last_one_are_refused_and_change_nothing() -> None:
    async def go() -> None:
        async with service() as (url, decisions, _, _clock, events), aiohttp.ClientSession() as session:
            sync = f"{url}/v1/weight_sync"
            assert await _post(session, f"{sync}/begin", {"version": 2}) == (200, {"version": 2, "began": True})
            assert await _post(session, f"{sync}/begin", {"version": 3}) == (
                409,
                {"error": "a weight sync to version 2 is in progress; end it before beginning version 3"},
            )
            assert await _post(session, f"{sync}/end", {"version": 3}) == (
                409,
                {"error": "end of a weight sync to version 3, but the sync to version 2 is in progress"},
            )
            assert await _post(session, f"{sync}/end", {"version": 2}) == (200, {"version": 2, "ended": True, "released": 0})
            assert await _post(session, f"{sync}/begin", {"version": 2}) == (
                409,
                {"error": "weight version 2 is not newer than the last synced version 2"},
            )
            assert await _post(session, f"{sync}/begin", {"version": 3}) == (200, {"version": 3, "began": True})
            assert events == [ev.WeightSyncStarted(0.0, 2), ev.WeightSyncFinished(0.0, 2), ev.WeightSyncStarted(0.0, 3)]
            assert decisions.host.syncing == (3, 0.0)

    asyncio.run(go())


def test_a_call_given_up_while_a_sync_held_it_is_never_accounted() -> None:
    async def go() -> None:
        async with service("thunderagent", kv_blocks=8) as (url, decisions, _, clock, events), aiohttp.ClientSession() as session:
            socket = DecisionSocket(session, f"{url}/v1/socket")
            await socket.ask("route", {"program": "A", "token_ids": _tokens(20), "max_tokens": 4})
            assert await _post(session, f"{url}/v1/done", {"call": "A.0", "prompt_tokens": 20, "completion_tokens": 4}) == (204, None)
            clock.t = 1.0
            await socket.ask("weight_sync_begin", {"version": 1})
            asked = asyncio.ensure_future(socket.ask("route", {"program": "A", "token_ids": _tokens(24), "max_tokens": 4}))
            await asyncio.sleep(0.2)
            asked.cancel()
            await asyncio.gather(asked, return_exceptions=True)
            await asyncio.sleep(0.2)
            clock.t = 2.0
            assert await socket.ask("weight_sync_end", {"version": 1}) == {"version": 1, "ended": True, "released": 0}
            host = decisions.host
            assert host.in_flight == 0 and host.policy.programs["A"].steps == 1
            assert [(e.request, e.reason) for e in events if isinstance(e, ev.RequestDropped)] == [("A.1", "cancelled while held")]
            await socket.close()

    asyncio.run(go())


def test_session_affinity_bindings_are_forgotten_at_a_weight_sync() -> None:
    async def go() -> None:
        affinity = {"session_affinity_ttl_s": 1800.0}  # round robin behind Dynamo's session affinity
        async with service(params=affinity) as (url, decisions, _, _clock, _events), aiohttp.ClientSession() as session:
            socket = DecisionSocket(session, f"{url}/v1/socket")
            workers = []
            for turn in range(3):
                if turn == 2:
                    await socket.ask("weight_sync_begin", {"version": 1})
                    await socket.ask("weight_sync_end", {"version": 1})
                answer = await socket.ask("route", {"program": "A", "token_ids": _tokens(20 + 4 * turn), "max_tokens": 4})
                workers.append(answer["worker"])
                done = {"call": answer["call"], "prompt_tokens": 20 + 4 * turn, "completion_tokens": 4}
                assert await _post(session, f"{url}/v1/done", done) == (204, None)
            assert workers == ["w0", "w0", "w1"]  # bound, then bound afresh by the rotation
            assert decisions.host.programs["A"].turn == 3  # the program goes on
            await socket.close()

    asyncio.run(go())
