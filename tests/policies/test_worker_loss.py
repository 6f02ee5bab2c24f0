"""A worker lost in live mode: what every policy and the live policy host do about it.

The policies must never route or resume onto a lost worker, must place the programs they had
there elsewhere, and must use the worker again once it joins; the host must log the loss, drop the
worker's cache, send a call that was in flight there again as a new call of the same turn (the
program never notices), and refuse calls while no worker serves.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import LIVE_BLOCK_SIZE, FakeClock, live_host, live_view, routed

from tasim.core import events as ev
from tasim.core.model import RequestSpec
from tasim.live.hashing import sequence_hashes
from tasim.live.router import membership
from tasim.live.router.kv_events import KvEvent, KvEventSubscriber
from tasim.live.router.live_host import Held, NoWorkerServing, PolicyHost
from tasim.live.router.membership import Membership, probe_tokens
from tasim.policies import Hold, Policy, Resume, Route, TurnEnd, make_policy
from tasim.policies.kv_router import KvRouter
from tasim.policies.thunderagent import ThunderAgent

BS = LIVE_BLOCK_SIZE


def _policy(name: str, params: dict | None = None, workers: int = 3, kv_blocks: int = 100) -> Policy:
    return make_policy(name, params or {}, live_view(workers, kv_blocks), np.random.default_rng(0))


def _req(rid: str, program: str, prompt: int = 100, hashes: tuple[int, ...] = ()) -> RequestSpec:
    return RequestSpec(rid, program, 0, prompt, 10, 0, hashes)


def _routes(policy: Policy, count: int, start: int = 0) -> list[str]:
    decisions = [policy.on_request(_req(f"r{start + i}", f"p{start + i}"), 1.0) for i in range(count)]
    assert all(isinstance(d, Route) for d in decisions)
    return [d.worker for d in decisions]  # type: ignore[union-attr]


# --- program-blind policies ----------------------------------------------------------------------


def test_round_robin_skips_a_lost_worker_and_takes_it_back() -> None:
    policy = _policy("round_robin")
    assert _routes(policy, 2) == ["w0", "w1"]
    policy.on_worker_lost("w1", 2.0)
    assert policy.serving == ["w0", "w2"]
    assert _routes(policy, 3, 2) == ["w0", "w2", "w0"]  # turns 2, 3, 4 over the two left
    policy.on_worker_joined("w1", 3.0)
    assert policy.serving == ["w0", "w1", "w2"]  # cluster order again
    assert _routes(policy, 3, 5) == ["w2", "w0", "w1"]  # turns 5, 6, 7 over all three


def test_random_never_picks_a_lost_worker() -> None:
    policy = _policy("random")
    policy.on_worker_lost("w1", 0.0)
    assert set(_routes(policy, 60)) == {"w0", "w2"}
    policy.on_worker_joined("w1", 1.0)
    assert set(_routes(policy, 60, 60)) == {"w0", "w1", "w2"}


def test_least_loaded_picks_among_serving_workers_and_releases_the_lost_ones_calls() -> None:
    policy = _policy("least_loaded")
    assert sorted(_routes(policy, 3)) == ["w0", "w1", "w2"]
    lost = next(r for r in ("r0", "r1", "r2") if policy._where[r] == "w1")
    policy.on_worker_lost("w1", 1.0)
    policy.on_turn_end(TurnEnd(lost, lost, "w1", 100, 0, 0, ok=False), 1.0)  # its call failed
    assert policy.active == {"w0": 1, "w1": 0, "w2": 1}
    assert set(_routes(policy, 2, 3)) == {"w0", "w2"}  # w1, idle but lost, gets nothing


def test_continuum_places_a_lost_workers_programs_afresh() -> None:
    policy = _policy("continuum")
    assert [policy.on_request(_req(f"{p}.0", p), 0.0) for p in "abc"] == [Route("w0"), Route("w1"), Route("w2")]
    policy.on_worker_lost("w1", 1.0)
    assert policy.programs_on == {"w0": 1, "w1": 0, "w2": 1}
    assert policy.on_request(_req("a.1", "a"), 2.0) == Route("w0")  # sticky where its worker serves
    assert policy.on_request(_req("b.1", "b"), 2.0) == Route("w0")  # re-placed: fewest programs, first on ties
    policy.on_worker_joined("w1", 3.0)
    assert policy.on_request(_req("d.0", "d"), 3.0) == Route("w1")  # the rejoined worker is emptiest


# --- Dynamo's KV router --------------------------------------------------------------------------


def test_kv_router_forgets_the_lost_workers_cache_and_sessions() -> None:
    policy = _policy("kv_router", {"session_affinity_ttl_s": 100.0}, workers=2)
    assert isinstance(policy, KvRouter)
    prompt = tuple(range(1, 11))  # 10 full blocks
    policy.on_kv_stored("w1", prompt, 0.0)
    first = policy.on_request(_req("a.0", "a", 160, prompt), 1.0)
    assert first == Route("w1")  # it holds all 10 blocks
    policy.on_worker_lost("w1", 2.0)
    assert policy.index is not None and policy.index.overlaps(prompt, 2.0) == {"w0": 0, "w1": 0}
    costs, _ = policy.costs(_req("a.1", "a", 160, prompt), 2.0)
    assert list(costs) == ["w0"]
    policy.on_turn_end(TurnEnd("a", "a.0", "w1", 160, 0, 0, ok=False), 2.0)
    # The session was bound to w1 (hard affinity); it binds afresh to w0, not to the lost worker.
    assert policy.on_request(_req("a.0r2", "a", 160, prompt), 2.0) == Route("w0")
    binding = policy.sessions.get("a")
    assert binding is not None and binding.worker == "w0"
    policy.on_worker_joined("w1", 3.0)
    assert list(policy.costs(_req("b.0", "b", 160, prompt), 3.0)[0]) == ["w0", "w1"]


def test_kv_router_approximate_index_forgets_the_lost_worker() -> None:
    policy = _policy("kv_router", {"use_kv_events": False}, workers=2)
    assert isinstance(policy, KvRouter) and policy.index is not None
    prompt = tuple(range(1, 11))
    chosen = policy.on_request(_req("a.0", "a", 160, prompt), 0.0)
    assert isinstance(chosen, Route) and policy.index.size() == 10  # recorded on the chosen worker
    policy.on_worker_lost(chosen.worker, 1.0)
    assert policy.index.size() == 0 and policy.index.overlaps(prompt, 1.0) == {"w0": 0, "w1": 0}


# --- ThunderAgent --------------------------------------------------------------------------------


def _ta(**params: object) -> ThunderAgent:
    policy = _policy("thunderagent", dict(params), workers=2, kv_blocks=100)  # 1,600 tokens each
    assert isinstance(policy, ThunderAgent)
    return policy


def test_thunderagent_replaces_displaced_programs_ahead_of_new_ones() -> None:
    ta = _ta()
    assert ta.on_request(_req("a.0", "a", 900), 0.0) == Route("w0")
    assert ta.on_request(_req("b.0", "b", 800), 0.0) == Route("w1")
    assert ta.on_request(_req("c.0", "c", 900), 0.0) == Hold(pause=True)  # no backend has 1,000 free
    ta.on_turn_end(TurnEnd("b", "b.0", "w1", 800, 10, 0), 1.0)
    ta.on_worker_lost("w1", 2.0)
    assert list(ta.capacity) == ["w0"] and ta.programs["b"].backend is None
    assert ta.used("w0") == 1000  # b no longer counts anywhere
    # c waits in the queue, but b was admitted once: it goes to w0 now, as 500 + 100 fits the 600 left.
    assert ta.on_request(_req("b.1", "b", 500), 3.0) == Route("w0")
    assert ta.used("w0") == 1600
    # A new program still queues behind c.
    assert ta.on_request(_req("d.0", "d", 10), 3.0) == Hold(pause=True)


def test_thunderagent_queues_a_displaced_program_when_nothing_has_room() -> None:
    ta = _ta()
    assert ta.on_request(_req("a.0", "a", 1400), 0.0) == Route("w0")
    assert ta.on_request(_req("b.0", "b", 1400), 0.0) == Route("w1")
    ta.on_worker_lost("w1", 1.0)
    ta.on_turn_end(TurnEnd("b", "b.0", "w1", 1400, 0, 0, ok=False), 1.0)  # its call failed with w1
    assert ta.on_request(_req("b.0r2", "b", 1400), 1.0) == Hold(pause=True)
    ta.on_turn_end(TurnEnd("a", "a.0", "w0", 1400, 10, 0), 2.0)
    ta.on_program_end("a", 3.0)
    assert ta.on_tick(5.0) == [Resume("b", "w0")]


def test_thunderagent_forgets_a_lost_origin_and_ticks_with_no_backend() -> None:
    ta = _ta(resume_timeout_s=10.0)
    assert ta.on_request(_req("a.0", "a", 1500), 0.0) == Route("w0")
    assert ta.on_request(_req("b.0", "b", 1500), 0.0) == Route("w1")
    ta.on_turn_end(TurnEnd("b", "b.0", "w1", 1500, 200, 0), 1.0)  # over capacity: paused at the tick
    ta.on_tick(1.0)
    assert ta.queue["b"].origin == "w1"
    ta.on_request(_req("b.1", "b", 1700), 2.0)  # held
    ta.on_worker_lost("w1", 3.0)
    assert ta.queue["b"].origin is None
    # Upstream force-resumes a timed-out program on its origin; with the origin lost, as a new
    # program does: on the serving backend with the fewest programs.
    assert ta.on_tick(12.0) == [Resume("b", "w0", forced=True)]
    ta.on_worker_lost("w0", 13.0)
    assert ta.capacity == {} and ta.on_tick(20.0) == []
    ta.on_worker_joined("w1", 21.0)
    ta.on_worker_joined("w0", 21.0)
    assert list(ta.capacity) == ["w0", "w1"]  # cluster order, for tie-breaks


# --- the live policy host ------------------------------------------------------------------------


def _host(policy: str = "round_robin") -> tuple[PolicyHost, FakeClock, list[ev.Event]]:
    """Two workers of 1,600 tokens; every event through the simulator's checks, KV events logged."""
    return live_host(policy, kv_blocks=100, log_kv_events=True, checked=True)


def test_a_lost_workers_call_is_retried_as_a_new_call_of_the_same_turn() -> None:
    host, clock, events = _host()
    a = routed(host.decide("a", list(range(5, 45)), 8))
    b = routed(host.decide("b", list(range(5, 45)), 8))
    assert (a.worker, b.worker) == ("w0", "w1")
    host.kv_event("w1", KvEvent("stored", (11, 12)))
    clock.t = 1.0
    assert host.worker_lost("w1", "Unavailable: TCP connection failed")
    assert not host.worker_lost("w1", "again")  # once
    assert host.cached_blocks("w1") == 0
    host.kv_event("w1", KvEvent("stored", (13,)))  # a lost worker's events are ignored
    assert host.cached_blocks("w1") == 0
    clock.t = 1.5
    # 3 of 8 tokens had streamed: the retry's prompt holds them, and 5 are still to come.
    retried = routed(host.retry(b, list(range(5, 48)), 5, "worker w1 lost: stream broke"))
    assert retried.worker == "w0" and retried.created  # the call that created b, still
    assert (retried.spec.id, retried.spec.turn, retried.spec.prompt_tokens, retried.spec.output_tokens) == ("b.0r2", 0, 43, 5)
    assert host.programs["b"].in_flight == 1 and host.in_flight == 2 and host.retried == 1 and host.failed == 0
    host.finish(retried, 43, 5, 0)
    host.finish(a, 40, 8, 0)
    assert host.programs["b"].turn == 1 and host.programs["b"].history_tokens == 48
    lost_at = events.index(ev.WorkerLost(1.0, "w1", "Unavailable: TCP connection failed"))
    assert events[lost_at + 1] == ev.KvRemoved(1.0, "w1", (11, 12))
    assert ev.RequestRetried(1.5, "b.0", "b", "w1", "worker w1 lost: stream broke") in events
    assert ev.RequestRouted(1.5, "b.0r2", "w0") in events
    assert not any(isinstance(e, (ev.RequestDropped, ev.ProgramFinished)) for e in events)
    clock.t = 2.0
    assert host.worker_joined("w1") and not host.worker_joined("w1")
    assert events[-1] == ev.WorkerJoined(2.0, "w1")
    assert routed(host.decide("c", list(range(5, 45)), 8)).worker == "w1"


def test_a_session_final_during_the_retry_ends_the_program_after_it() -> None:
    host, clock, events = _host()
    routed(host.decide("x", list(range(5, 45)), 8))  # w0
    b = routed(host.decide("b", list(range(5, 45)), 8))  # w1
    host.session_final("b")  # arrives while b's call is in flight
    host.worker_lost("w1", "gone")
    retried = routed(host.retry(b, list(range(5, 45)), 8, "worker w1 lost"))
    assert "b" in host.programs  # not ended between the lost call and its retry
    host.finish(retried, 40, 8, 0)
    assert "b" not in host.programs
    assert [e for e in events if isinstance(e, ev.ProgramFinished)] == [ev.ProgramFinished(0.0, "b", 48, True)]


def test_a_held_retry_that_the_client_abandons_rolls_back() -> None:
    host, clock, events = _host("thunderagent")

    async def go() -> None:
        big = list(range(5, 5 + 1400))
        routed(host.decide("a", big, 8))  # w0, nearly full
        b = routed(host.decide("b", big, 8))  # w1
        host.worker_lost("w1", "gone")
        held = host.retry(b, big, 8, "worker w1 lost")
        assert isinstance(held, Held)  # w0 has no room for b
        waiting = asyncio.ensure_future(host.wait(held))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(go())
    assert "b" not in host.programs  # the call that created it never happened
    assert host.in_flight == 1 and host.retried == 1 and host.failed == 1
    assert [type(e) for e in events if getattr(e, "program", None) == "b"][-2:] == [ev.RequestDropped, ev.ProgramFinished]


def test_no_serving_worker_refuses_calls_and_fails_retries() -> None:
    host, clock, events = _host()
    a = routed(host.decide("a", list(range(5, 45)), 8))
    host.worker_lost("w0", "gone")
    host.worker_lost("w1", "gone")
    with pytest.raises(NoWorkerServing, match=r"no worker is serving \(lost: w0, w1\)"):
        host.decide("new", list(range(5, 45)), 8)
    assert "new" not in host.programs  # a refused call changes nothing
    with pytest.raises(NoWorkerServing):
        host.retry(a, list(range(5, 45)), 8, "worker w0 lost")
    assert host.failed == 1 and host.refused == 2 and host.in_flight == 0 and "a" not in host.programs
    host.worker_joined("w1")
    assert routed(host.decide("new", list(range(5, 45)), 8)).worker == "w1"


def test_the_host_refuses_a_policy_that_routes_to_a_lost_worker() -> None:
    class Stubborn(Policy):
        name = "stubborn"

        def on_request(self, request: RequestSpec, now: float) -> Route:
            return Route("w1")

    clock = FakeClock()
    host = PolicyHost(Stubborn(live_view(2), Policy.params_model(), np.random.default_rng(0)), clock, lambda e: None, BS)
    host.worker_lost("w1", "gone")
    with pytest.raises(ValueError, match="policy stubborn routed a.0 to lost worker 'w1'"):
        host.decide("a", list(range(5, 45)), 8)


# --- which instance is which worker, and who serves (tasim.live.router.membership) --------------------


class FakeDiscovery:
    """Dynamo's client of the workers as `Membership` uses it: listed instances, each either
    publishing a probe's block on a worker's KV endpoint, alive but silent, or dead."""

    def __init__(self) -> None:
        self.publishes_as: dict[int, str | None] = {}  # instance -> worker endpoint it publishes on (None: no KV events)
        self.dead: set[int] = set()
        self.members: Membership | None = None

    def instance_ids(self) -> list[int]:
        return list(self.publishes_as)

    async def direct(self, request: dict, instance: int):  # noqa: ANN201 - an async iterator, as Dynamo's
        if instance in self.dead:
            raise Exception("Unavailable: TCP connection to 127.0.0.1:1 failed")
        worker = self.publishes_as[instance]
        if worker is not None and self.members is not None:
            self.members.stored(worker, tuple(sequence_hashes(request["token_ids"], BS)[:1]))

        async def reply():  # noqa: ANN202
            yield {"token_ids": [9], "finish_reason": "length"}

        return reply()


def _membership(monkeypatch: pytest.MonkeyPatch) -> tuple[Membership, FakeDiscovery, PolicyHost]:
    monkeypatch.setattr(membership, "PROBE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(membership, "REPROBE_INTERVAL_S", 0.0)
    host, _, _ = _host()
    discovery = FakeDiscovery()
    members = Membership(discovery, ("w0", "w1"), BS, "m", host, KvEventSubscriber({}, host.kv_event))
    discovery.members = members
    return members, discovery, host


async def _settle(members: Membership) -> None:
    while members._probing:
        await asyncio.sleep(0.01)


def test_membership_maps_instances_by_their_kv_events_and_follows_losses_and_joins(monkeypatch: pytest.MonkeyPatch) -> None:
    members, discovery, host = _membership(monkeypatch)

    async def go() -> None:
        discovery.publishes_as = {10: "w1", 20: "w0"}  # instance order says nothing about names
        await members.map_all()
        assert members.instance_of == {"w1": 10, "w0": 20}
        # w1's process dies: its instance leaves discovery.
        del discovery.publishes_as[10]
        members.check(set(discovery.instance_ids()))
        assert host.lost == {"w1"}
        # Its replacement registers as a new instance, publishing on w1's endpoint.
        discovery.publishes_as[30] = "w1"
        members.check(set(discovery.instance_ids()))
        await _settle(members)
        assert members.instance_of == {"w1": 30, "w0": 20} and host.lost == set()

    asyncio.run(go())


def test_membership_reprobes_a_lost_worker_that_is_still_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    members, discovery, host = _membership(monkeypatch)

    async def go() -> None:
        discovery.publishes_as = {10: "w0", 20: "w1"}
        await members.map_all()
        # A stream broke, but discovery still lists the instance and it is dead: it stays lost.
        discovery.dead.add(20)
        members.lose("w1", 20, "Unavailable: Stream ended before generation completed")
        members.lose("w1", 99, "an older instance")  # not w1's instance: ignored
        members.check({10, 20})
        await _settle(members)
        assert host.lost == {"w1"}
        # It answers again (a transient break): it serves again.
        discovery.dead.clear()
        members.check({10, 20})
        await _settle(members)
        assert host.lost == set() and members.instance_of == {"w0": 10, "w1": 20}

    asyncio.run(go())


def test_membership_gives_no_traffic_to_an_instance_without_kv_events(monkeypatch: pytest.MonkeyPatch) -> None:
    members, discovery, host = _membership(monkeypatch)

    async def go() -> None:
        discovery.publishes_as = {10: "w0", 20: None}
        with pytest.raises(RuntimeError, match="worker instance 20 published no KV event for a probe"):
            await members.map_all()
        discovery.publishes_as = {10: "w0", 20: "w1"}
        await members.map_all()
        del discovery.publishes_as[20]
        discovery.publishes_as[40] = None  # a new instance that publishes nothing
        members.check({10, 40})
        await _settle(members)
        assert host.lost == {"w1"} and 40 not in members.instance_of.values()
        members.check({10, 40})  # not probed again before the probe timeout has passed
        assert not members._probing

    asyncio.run(go())


def test_probe_tokens_are_one_distinct_block_each() -> None:
    blocks = {tuple(probe_tokens(n, BS)) for n in range(1, 20_000)}
    assert len(blocks) == 19_999 and all(len(b) == BS and b[-1] == 3 for b in blocks)
    assert probe_tokens(1, BS) == [1] * 14 + [8, 3]
    with pytest.raises(ValueError, match="probe number needs 3 tokens; the block size is 2"):
        probe_tokens(100, 2)
