"""What policies do around a weight sync: ThunderAgent holds every new call through it (before
any accounting), skips its passes and ends a sync whose end never comes after its watchdog;
session-affinity routers forget their bindings."""

from __future__ import annotations

import numpy as np

from tasim.core.cluster_view import ClusterView, WorkerInfo
from tasim.core.model import RequestSpec
from tasim.policies import Hold, Pause, Release, Route, TurnEnd, make_policy
from tasim.policies.baselines import LeastLoaded
from tasim.policies.thunderagent import ThunderAgent


def _view(workers: int = 2, kv_blocks: int = 100) -> ClusterView:
    return ClusterView(tuple(WorkerInfo(f"w{i}", 16, kv_blocks, 256, 8192) for i in range(workers)))


def _ta(**params: object) -> ThunderAgent:
    policy = make_policy("thunderagent", params, _view(workers=1), np.random.default_rng(0))
    assert isinstance(policy, ThunderAgent)
    return policy


def _call(program: str, turn: int, prompt: int) -> RequestSpec:
    return RequestSpec(f"{program}.{turn}", program, turn, prompt, 10, 0, ())


def test_thunderagent_holds_new_calls_through_a_sync_and_admits_them_at_its_end_in_order() -> None:
    ta = _ta()
    assert ta.on_request(_call("a", 0, 500), 0.0) == Route("w0")
    ta.on_turn_end(TurnEnd("a", "a.0", "w0", 500, 10, 0), 1.0)
    ta.on_weight_sync_begin(2.0)
    # a placed program's next call, and two new programs: the second does not fit (capacity
    # 1,600 tokens, 100 tokens of buffer per program)
    assert ta.on_request(_call("a", 1, 600), 3.0) == Hold()
    assert ta.on_request(_call("b", 0, 400), 3.5) == Hold()
    assert ta.on_request(_call("c", 0, 900), 4.0) == Hold()
    assert ta.on_tick(5.0) == ()  # no pass during the sync
    assert set(ta.programs) == {"a"} and ta.programs["a"].steps == 1  # held before any accounting
    assert list(ta.on_weight_sync_end(9.0)) == [Release("a", "w0"), Release("b", "w0"), Pause("c")]
    assert ta.programs["a"].steps == 2 and list(ta.queue) == ["c"]
    assert ta.programs["c"].held_since == 9.0
    assert ta.on_weight_sync_end(10.0) == ()  # idempotent


def test_thunderagents_watchdog_ends_a_sync_at_the_first_tick_past_its_timeout() -> None:
    ta = _ta(weight_sync_timeout_s=300.0)
    ta.on_weight_sync_begin(0.0)
    ta.on_weight_sync_begin(100.0)  # a second begin does not restart the watchdog
    assert ta.on_request(_call("a", 0, 500), 10.0) == Hold()
    assert ta.on_tick(299.0) == ()
    assert list(ta.on_tick(300.0)) == [Release("a", "w0")]
    assert ta.weight_sync_since is None
    assert ta.on_request(_call("b", 0, 500), 301.0) == Route("w0")


def test_a_program_that_ends_during_a_sync_leaves_nothing_held() -> None:
    ta = _ta()
    ta.on_weight_sync_begin(0.0)
    ta.on_request(_call("a", 0, 500), 1.0)
    ta.on_program_end("a", 2.0)
    assert ta.on_weight_sync_end(3.0) == []


def test_session_affinity_bindings_are_forgotten_at_a_sync() -> None:
    policy = make_policy("least_loaded", {"session_affinity_ttl_s": 1800}, _view(), np.random.default_rng(0))
    assert isinstance(policy, LeastLoaded)
    first = policy.on_request(_call("a", 0, 100), 0.0)
    assert isinstance(first, Route)
    other = "w1" if first.worker == "w0" else "w0"
    policy.sessions.bind("b", first.worker, 0.1)
    assert policy.on_request(_call("b", 0, 100), 0.1) == first  # bound: the busier worker
    policy.on_turn_end(TurnEnd("a", "a.0", first.worker, 100, 0, 0, ok=False), 0.3)
    assert policy.active == {first.worker: 1, other: 0}
    assert policy.sessions.worker("a", 0.4) == first.worker
    policy.on_weight_sync_begin(1.0)
    assert policy.sessions.worker("a", 1.0) is None and policy.sessions.worker("b", 1.0) is None
    assert policy.on_request(_call("a", 0, 100), 2.0) == Route(other)  # bound afresh, to the least loaded


def test_each_call_held_through_a_sync_is_admitted_at_its_end_and_one_given_up_is_forgotten() -> None:
    ta = _ta()
    assert ta.on_request(_call("a", 0, 500), 0.0) == Route("w0")
    ta.on_turn_end(TurnEnd("a", "a.0", "w0", 500, 10, 0), 1.0)
    ta.on_weight_sync_begin(2.0)
    # two concurrent calls of one program (each admitted at the end), and a new program's call
    # whose client leaves while held: it ends unrouted, never accounted, so the end forgets it
    first, second = _call("a", 1, 600), RequestSpec("a.1r2", "a", 1, 600, 10, 0, ())
    for call in (first, second, _call("b", 0, 400)):
        assert ta.on_request(call, 3.0) == Hold()
    assert ta.on_turn_end(TurnEnd("b", "b.0", "", 400, 0, 0, ok=False), 4.0) == ()
    assert list(ta.on_weight_sync_end(5.0)) == [Release("a", "w0"), Release("a", "w0")]
    assert ta.programs["a"].steps == 3 and set(ta.programs) == {"a"}
