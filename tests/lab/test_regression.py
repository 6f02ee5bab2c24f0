"""The policy regression suite's quick cases (the full suite runs in `make bench`)."""

from __future__ import annotations

import pytest

from lab import regression
from tasim.policies import POLICIES
from tasim.policies.kv_router import KvRouter

SMALL = [case for case in regression.CASES if case.small]


def test_the_quick_cases_match_the_recorded_baseline() -> None:
    results = regression.run_suite(SMALL, jobs=2)
    # every policy on the live-mocker preset, but one that sets priorities: that needs vLLM's
    # priority scheduling, which the mocker-flavoured preset has not, so it runs on swe-agent
    expected = [f"live-mocker.yaml:{p}" for p in regression.POLICIES if not POLICIES[p].sets_priorities] + ["swe-agent.yaml:autellix"]
    assert sorted(results) == sorted(expected)
    assert regression.drifts(results, regression.load_baseline()) == []


def test_a_deliberately_degraded_policy_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KV router that picks the *most* expensive worker breaks prefix affinity: the suite
    flags its case, and only its case."""
    monkeypatch.setattr(KvRouter, "_pick", lambda self, costs: max(costs, key=costs.get))
    results = regression.run_suite(SMALL, jobs=1)  # in this process, where the patch applies
    found = regression.drifts(results, regression.load_baseline())
    assert {d.case for d in found} == {"live-mocker.yaml:kv_router"}
    assert "prefix_hit_rate" in {d.metric for d in found}
    assert all(d.line().startswith("live-mocker.yaml:kv_router ") for d in found)


def test_drift_arithmetic() -> None:
    baseline = {"a": {"output_tokens_per_s": 100.0, "prefix_hit_rate": 0.50}}
    within = {"a": {"output_tokens_per_s": 101.9, "prefix_hit_rate": 0.509}}
    assert regression.drifts(within, baseline) == []
    outside = {"a": {"output_tokens_per_s": 97.9, "prefix_hit_rate": 0.489}}
    assert [(d.metric, d.allowed) for d in regression.drifts(outside, baseline)] == [
        ("output_tokens_per_s", "±2%"),
        ("prefix_hit_rate", "±1 pp"),
    ]
    new_case = regression.drifts({"b": {"output_tokens_per_s": 1.0, "prefix_hit_rate": 0.1}}, baseline)
    assert [d.line() for d in new_case] == [
        "b output_tokens_per_s: baseline missing, now 1 (allowed ±2%)",
        "b prefix_hit_rate: baseline missing, now 0.1 (allowed ±1 pp)",
    ]


def test_every_registered_policy_has_recorded_cases() -> None:
    """A policy added to the registry joins the suite, and the suite fails until its cases are
    recorded (`make baseline`): none is skipped silently."""
    assert {case.policy for case in regression.CASES} == set(POLICIES)
    assert set(regression.load_baseline()) == {case.key for case in regression.CASES}
