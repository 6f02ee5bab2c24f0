"""Random, least-loaded and Continuum policies."""

from __future__ import annotations

import numpy as np

from tasim.core.cluster_view import ClusterView, WorkerInfo
from tasim.core.model import RequestSpec
from tasim.policies import Pin, Route, TurnEnd, make_policy

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
    assert policy.predicted_tool_s == {None: 3.2}
    assert list(policy.on_turn_end(TurnEnd("a", "a.2", "w0", 100, 10, 0), 14.0)) == []


def test_continuum_keeps_one_average_per_named_tool() -> None:
    """The fork's per-command averages: a slow test run stops pins before the next test run,
    not before a quick ``cat``; a tool never observed is pinned."""
    policy = make_policy("continuum", {"ttl_s": 3.0, "pin_threshold_s": 2.0, "ema_alpha": 0.5}, VIEW, np.random.default_rng(0))
    policy.on_request(_req("a.0", "a"), 0.0)
    assert list(policy.on_turn_end(TurnEnd("a", "a.0", "w0", 100, 10, 0, tool="pytest"), 1.0)) == [Pin("a", "w0", 3.0)]
    policy.on_request(_req("a.1", "a"), 31.0)  # pytest ran 30 s
    assert list(policy.on_turn_end(TurnEnd("a", "a.1", "w0", 100, 10, 0, tool="cat"), 32.0)) == [Pin("a", "w0", 3.0)]
    policy.on_request(_req("a.2", "a"), 32.5)  # cat ran 0.5 s
    assert policy.predicted_tool_s == {"pytest": 30.0, "cat": 0.5}
    assert list(policy.on_turn_end(TurnEnd("a", "a.2", "w0", 100, 10, 0, tool="pytest"), 33.0)) == []
    policy.on_request(_req("a.3", "a"), 34.0)  # a 1 s pytest: 30 + 0.5 x (1 - 30) = 15.5 s
    assert policy.predicted_tool_s == {"pytest": 15.5, "cat": 0.5}
    assert list(policy.on_turn_end(TurnEnd("a", "a.3", "w0", 100, 10, 0, tool="cat"), 35.0)) == [Pin("a", "w0", 3.0)]
    assert list(policy.on_turn_end(TurnEnd("a", "a.3", "w0", 100, 10, 0, tool="ls"), 35.0)) == [Pin("a", "w0", 3.0)]


# --- session affinity (Dynamo's, in every router mode) -------------------------------------------


def _turn(policy, rid: str, program: str, now: float) -> str:  # type: ignore[no-untyped-def]
    worker = policy.on_request(_req(rid, program), now).worker
    policy.on_turn_end(TurnEnd(program, rid, worker, 100, 10, 0), now + 1.0)
    return worker


def test_round_robin_with_affinity_keeps_programs_and_leaves_the_rotation_alone() -> None:
    policy = make_policy("round_robin", {"session_affinity_ttl_s": 30.0}, VIEW, np.random.default_rng(0))
    assert [_turn(policy, f"{p}.0", p, 0.0) for p in "abcd"] == ["w0", "w1", "w2", "w0"]
    # a bound program's turns do not advance the rotation: e's first turn takes w1, next in line
    assert [_turn(policy, f"{p}.1", p, 10.0) for p in "abcd"] == ["w0", "w1", "w2", "w0"]
    assert _turn(policy, "e.0", "e", 10.0) == "w1"
    # a's last request ended at 11 s; 30 s idle is still bound, 30.5 s is not: it joins the rotation
    assert _turn(policy, "a.2", "a", 41.0) == "w0"
    assert _turn(policy, "a.3", "a", 72.5) == "w2"


def test_affinity_binds_afresh_when_the_program_ends_or_its_worker_is_lost() -> None:
    policy = make_policy("round_robin", {"session_affinity_ttl_s": 30.0}, VIEW, np.random.default_rng(0))
    assert _turn(policy, "a.0", "a", 0.0) == "w0"
    policy.on_program_end("a", 2.0)
    assert _turn(policy, "a.1", "a", 3.0) == "w1"  # a program id seen again is a new session
    policy.on_worker_lost("w1", 5.0)
    assert _turn(policy, "a.2", "a", 6.0) == "w0"  # bound to w1: the third pick of w0, w2 is w0
    policy.on_worker_joined("w1", 7.0)
    assert _turn(policy, "a.3", "a", 8.0) == "w0"


def test_least_loaded_with_affinity_is_verls_global_load_balancer() -> None:
    """verl 0.9.1's GlobalRequestLoadBalancer: a trajectory stays on its server; a new one goes to
    the server with the fewest requests in flight; bound requests count towards that load."""
    policy = make_policy("least_loaded", {"session_affinity_ttl_s": 1e6}, VIEW, np.random.default_rng(0))
    first = {p: policy.on_request(_req(f"{p}.0", p), 0.0).worker for p in "abc"}
    assert sorted(first.values()) == ["w0", "w1", "w2"]
    # a's second call is bound and lands on a's worker although it is now the busiest
    assert policy.on_request(_req("a.1", "a"), 1.0) == Route(first["a"])
    assert policy.active == {w: 1 + (w == first["a"]) for w in ("w0", "w1", "w2")}
    policy.on_turn_end(TurnEnd("b", "b.0", first["b"], 100, 10, 0), 2.0)
    assert policy.on_request(_req("d.0", "d"), 2.0) == Route(first["b"])  # the only idle server
    # per request, without affinity, a's second call would have gone to an idle worker
    blind = make_policy("least_loaded", {}, VIEW, np.random.default_rng(0))
    blind_first = {p: blind.on_request(_req(f"{p}.0", p), 0.0).worker for p in "abc"}
    blind.on_turn_end(TurnEnd("b", "b.0", blind_first["b"], 100, 10, 0), 1.0)
    assert blind.on_request(_req("a.1", "a"), 1.0) == Route(blind_first["b"])


def test_random_with_affinity_draws_once_per_session() -> None:
    policy = make_policy("random", {"session_affinity_ttl_s": 30.0}, VIEW, np.random.default_rng(7))
    workers = {_turn(policy, f"a.{i}", "a", float(i)) for i in range(10)}
    assert len(workers) == 1


def test_a_simulated_continuum_pins_by_the_tool_each_turn_calls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """End to end: the runner hands each turn's named tool to the policy, which pins before a
    quick ``cat`` always and before ``pytest`` only until it has seen one run 10 s."""
    from tasim.config.scenario import Scenario
    from tasim.core import events as ev
    from tasim.results.eventlog import EVENTS_PLAIN, read_events
    from tasim.sim.simulation import run_simulation
    from tasim.workloads import plan_program

    scenario = Scenario.model_validate(
        {
            "name": "tools",
            "seed": 3,
            "duration_s": 10_000,
            "cluster": {"backends": 1, "gpu": "H100", "model": "Llama-3.1-8B", "engine": {"block_size": 16, "kv_blocks": 2000}},
            "workload": {
                "concurrency": 1,
                "programs": 1,
                "turns": 12,
                "task_prompt_tokens": 100,
                "output_tokens": 20,
                "observation_tokens": 20,
                "tools": {"cat": {"share": 1, "latency_s": 0.5}, "pytest": {"share": 1, "latency_s": 10.0}},
            },
            "policy": {"name": "continuum"},
            "metrics": {"warmup_s": 0},
        }
    )
    run_simulation(scenario, tmp_path / "run")
    pins = sum(isinstance(e, ev.ProgramPinned) for e in read_events(tmp_path / "run" / EVENTS_PLAIN))
    tools = [t.tool for t in plan_program(scenario.workload, 3, 0, 10**9).turns]
    expected = sum(tool == "cat" or "pytest" not in tools[:k] for k, tool in enumerate(tools))
    assert "cat" in tools and tools.count("pytest") >= 2  # the draw exercises both cases
    assert pins == expected < len(tools)
