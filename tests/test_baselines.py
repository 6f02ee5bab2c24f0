"""Random, least-loaded and Continuum policies."""

from __future__ import annotations

import numpy as np

from tasim.model import RequestSpec
from tasim.policies import Pin, Route, TurnEnd, make_policy
from tasim.view import ClusterView, WorkerInfo

VIEW = ClusterView(tuple(WorkerInfo(f"w{i}", 16, 1000, 256, 8192) for i in range(3)))


def _req(rid: str, program: str = "p") -> RequestSpec:
    return RequestSpec(rid, program, 0, 100, 10, 0, ())


def test_random_is_seeded_and_uses_every_worker() -> None:
    picks = [make_policy("random", {}, VIEW, np.random.default_rng(7)).on_request(_req("a"), 0.0) for _ in range(3)]
    assert len(set(picks)) == 1  # same seed, same first pick
    policy = make_policy("random", {}, VIEW, np.random.default_rng(7))
    assert {policy.on_request(_req(str(i)), 0.0).worker for i in range(60)} == {"w0", "w1", "w2"}


def test_least_loaded_counts_active_requests() -> None:
    policy = make_policy("least_loaded", {}, VIEW, np.random.default_rng(0))
    first = [policy.on_request(_req(f"r{i}"), 0.0).worker for i in range(3)]
    assert sorted(first) == ["w0", "w1", "w2"]  # one each before any worker gets a second
    policy.on_turn_end(TurnEnd("p", "r1", first[1], 100, 10, 0), 1.0)
    assert policy.on_request(_req("r3"), 1.0) == Route(first[1])


def test_continuum_pins_while_tools_are_short_and_sticks_programs() -> None:
    policy = make_policy("continuum", {"ttl_s": 3.0, "pin_threshold_s": 2.0}, VIEW, np.random.default_rng(0))
    assert policy.on_request(_req("a.0", "a"), 0.0) == Route("w0")
    assert policy.on_request(_req("b.0", "b"), 0.0) == Route("w1")  # fewest live programs
    assert list(policy.on_turn_end(TurnEnd("a", "a.0", "w0", 100, 10, 0), 1.0)) == [Pin("a", "w0", 3.0)]
    assert policy.on_request(_req("a.1", "a"), 2.5) == Route("w0")  # tool took 1.5 s: sticky
    assert list(policy.on_turn_end(TurnEnd("a", "a.1", "w0", 100, 10, 0), 3.0)) == [Pin("a", "w0", 3.0)]
    policy.on_request(_req("a.2", "a"), 13.0)  # a 10 s tool: average 1.5 + 0.2 x 8.5 = 3.2 s > 2 s
    assert policy.predicted_tool_s == 3.2
    assert list(policy.on_turn_end(TurnEnd("a", "a.2", "w0", 100, 10, 0), 14.0)) == []
