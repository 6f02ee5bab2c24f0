"""Dynamo 1.6.1's own Rust plug-ins as live baselines (``live.routing: dynamo-thunderagent``,
``dynamo-two-tier``): the frontend's policy file made from the scenario, the client's event log,
the pause trace read from the frontend's log, and (slow) the real stack on CPU: mocker workers
behind a frontend that routes with the plug-in, driven by the same programs as tasim's runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from tasim.config.scenario import load_scenario
from tasim.core import events as ev
from tasim.live.clients.observed import ObservedCalls
from tasim.live.stack.dynamo_policies import PluginConfigError, pause_snapshots, plugin_config, plugin_summary
from tasim.results.eventlog import EventWriter, read_events
from tasim.sim.checks import EventChecks

pytestmark = pytest.mark.processes  # starts real processes (make test-fast leaves it out)

SCENARIO = REPO / "scenarios" / "live-mocker.yaml"


def test_thunderagent_plugin_gets_tasims_values_with_durations_scaled() -> None:
    scenario = load_scenario(
        SCENARIO, ["live.routing=dynamo-thunderagent", "policy.params={pause_threshold: 0.9, pause_target: 0.8, scheduler_interval_s: 2.0}"]
    )
    assert plugin_config(scenario, 4.0) == {
        "request_classifier": {
            "type": "thunderagent",
            "parameters": {
                "pause_threshold": 0.9,
                "pause_target": 0.8,
                "resume_hysteresis": 0.0,
                "scheduler_interval_seconds": 0.5,
                "acting_token_weight": 1.0,
                "buffer_per_program": 100,
                "resume_timeout_seconds": 450.0,
                "session_retention_seconds": 150.0,  # live.program_idle_ttl_s 600 / 4
            },
        },
        "worker_selection": {"aggregated": "thunderagent", "instances": [{"name": "thunderagent", "type": "thunderagent"}]},
    }


def test_two_tier_plugin_gets_cache_awares_thresholds() -> None:
    scenario = load_scenario(SCENARIO, ["live.routing=dynamo-two-tier", "policy.name=cache_aware", "policy.params={cache_threshold: 0.25}"])
    document = plugin_config(scenario, 1.0)
    assert document == {
        "worker_selection": {
            "aggregated": "two_tier",
            "instances": [
                {
                    "name": "two_tier",
                    "type": "dynamo-two-tier-cost-fn",
                    "parameters": {"cache_threshold": 0.25, "balance_abs_threshold": 32, "balance_rel_threshold": 1.1},
                }
            ],
        }
    }
    assert yaml.safe_load(yaml.safe_dump(document)) == document


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["live.routing=dynamo-thunderagent", "policy.name=kv_router"],
            "live.routing dynamo-thunderagent runs Dynamo's peer of tasim's thunderagent: set policy.name=thunderagent (got kv_router)",
        ),
        (["live.routing=dynamo-two-tier"], "set policy.name=cache_aware (got thunderagent)"),
        (
            ["live.routing=dynamo-thunderagent", "policy.params={placement: best_fit, idle_ttl_s: 5}"],
            "Dynamo's plug-in has no counterpart of thunderagent parameter(s) idle_ttl_s, placement (it takes: ",
        ),
        (
            ["live.routing=dynamo-two-tier", "policy.name=cache_aware", "policy.params={session_affinity_ttl_s: 5}"],
            "parameter(s) session_affinity_ttl_s",
        ),
    ],
)
def test_what_the_plugin_cannot_run_is_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(PluginConfigError, match=None) as raised:
        plugin_config(load_scenario(SCENARIO, overrides), 1.0)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_pause_snapshots_are_read_from_the_frontends_json_log(tmp_path: Path) -> None:
    log = tmp_path / "frontend.log"
    state = '{"level":"DEBUG","target":"thunderagent","message":"ThunderAgent scheduler state changed",'
    log.write_text(
        "\n".join(
            [
                '{"level":"WARN","message":"something else"}',
                state + '"active_programs":10,"marked_for_pause":10,"paused_programs":4,"programs":14,"tracked_requests":14,"waiting_requests":4}',
                "not json ThunderAgent scheduler state changed",
                state + '"active_programs":6,"marked_for_pause":0,"paused_programs":8,"programs":14,"tracked_requests":14,"waiting_requests":8}',
                state + '"active_programs":14,"marked_for_pause":0,"paused_programs":0,"programs":14,"tracked_requests":14,"waiting_requests":0}',
            ]
        )
    )
    assert [(s.programs, s.active, s.paused, s.waiting_requests) for s in pause_snapshots(log)] == [(14, 10, 4, 4), (14, 6, 8, 8), (14, 14, 0, 0)]
    assert plugin_summary(log) == {"state_changes": 3, "with_paused_programs": 2, "peak_paused_programs": 8, "peak_waiting_requests": 8}


def test_the_clients_log_keeps_the_simulators_invariants(tmp_path: Path) -> None:
    scenario = load_scenario(SCENARIO, ["live.routing=dynamo-thunderagent"])
    from tasim.live.run import observed_header

    header = observed_header(scenario)
    assert (header.policy, header.workers) == ("dynamo-thunderagent", ("w0", "w1"))
    observed = ObservedCalls(EventWriter(tmp_path / "events.jsonl"), header)
    a = observed.sent("A", 40, 4)
    observed.routed(a, "w1")
    observed.finished(a, "w1", 40, 4, 32)
    again = observed.sent("A", 60, 4)
    retried = observed.sent("A", 60, 4)  # a second call of the same turn gets an id of its own
    observed.failed(again, "", "HTTP 503")
    observed.routed(retried, "w0")
    observed.finished(retried, "w0", 60, 4, 0)
    observed.released("A")
    b = observed.sent("B", 10, 2)
    observed.routed(b, "w0")
    observed.finished(b, "w0", 10, 2, 0)  # and never released
    observed.close()
    events = list(read_events(tmp_path / "events.jsonl"))
    checks = EventChecks(lambda event: None)
    for event in events:
        checks(event)
    assert (a, again, retried, b) == ("A.0", "A.1", "A.1r2", "B.0")
    assert [type(e).__name__ for e in events][-3:] == ["RequestFinished", "ProgramFinished", "RunEnded"]
    finished = {e.program: (e.context_tokens, e.completed, e.released) for e in events if isinstance(e, ev.ProgramFinished)}
    assert finished == {"A": (64, True, True), "B": (12, True, False)}
    assert events[-1].unfinished_requests == 0  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize(("routing", "policy"), [("dynamo-thunderagent", "thunderagent"), ("dynamo-two-tier", "cache_aware")])
def test_the_rust_plugin_stack_runs_the_same_programs_on_cpu(routing: str, policy: str, tmp_path: Path) -> None:
    pytest.importorskip("dynamo.llm")
    from tasim.live.run import finite_scenario, run_live, simulated_twin
    from tasim.sim.simulation import run_simulation

    scenario = load_scenario(SCENARIO, [f"live.routing={routing}", f"policy.name={policy}", "policy.params={}"])
    out = tmp_path / "run"
    summary = run_live(scenario, out, time_scale=2.0)
    record = json.loads((out / "run.json").read_text())
    driver = record["driver"]
    assert driver["failed_requests"] == 0 and not driver["errors"] and driver["programs"] == 24 == driver["session_finals"]
    assert summary["requests_completed"] == driver["requests"] and summary["programs_completed"] == 24
    assert (summary["programs_leaked"], summary["requests_unfinished"], summary["requests_dropped"]) == (0, 0, 0)
    events = list(read_events(out / "events.jsonl"))
    checks = EventChecks(lambda event: None)
    for event in events:
        checks(event)
    assert events[0].policy == routing  # type: ignore[attr-defined]
    # Every call was answered by one of the two workers, as the router mapped their instances.
    assert {e.worker for e in events if isinstance(e, ev.RequestRouted)} <= {"w0", "w1"}
    assert len({e.worker for e in events if isinstance(e, ev.RequestRouted)}) == 2
    # Dynamo's plug-in lands where tasim simulates its peer, within the live-vs-sim tolerance of
    # tasim's own live runs (tests/live/test_live_e2e.py): the same programs on the same workers.
    simulated = run_simulation(simulated_twin(finite_scenario(scenario, None), "mocker"), tmp_path / "sim")
    assert abs(summary["prefix_hit_rate"] - simulated["prefix_hit_rate"]) <= 0.05
    assert abs(summary["output_tokens_per_s"] / simulated["output_tokens_per_s"] - 1) <= 0.15
    config = yaml.safe_load((out / "stack" / "router-policy.yaml").read_text())
    if routing == "dynamo-thunderagent":
        assert config["request_classifier"]["parameters"]["scheduler_interval_seconds"] == 2.5  # 5 s at time scale 2
        assert driver["dynamo_plugin"]["state_changes"] > 0  # the scheduler ran and logged its state
    else:
        assert "dynamo_plugin" in driver and config["worker_selection"]["instances"][0]["type"] == "dynamo-two-tier-cost-fn"
    assert str(tmp_path) not in subprocess.run(["pgrep", "-af", "python"], capture_output=True, text=True).stdout
