"""The load test: 512 concurrent programs for two minutes through the real live stack
(Dynamo frontend, tasim router under ThunderAgent, two Dynamo mocker workers), with zero failed
requests and zero leaked programs, with calls through the router (proxy) and pinned to its
decisions (pin). The same function fills the load row of docs/results/reliability.md."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lab.reliability import live_load
from tasim.core import events as ev
from tasim.results.eventlog import read_events
from tasim.sim.checks import EventChecks

pytestmark = pytest.mark.processes  # starts real processes (make test-fast leaves it out)

pytest.importorskip("dynamo.llm")


@pytest.mark.parametrize("routing", ["proxy", "pin"])
def test_512_concurrent_programs_for_two_minutes_lose_nothing(routing: str, tmp_path: Path) -> None:
    outcome = live_load(tmp_path / "run", routing=routing)
    driver = json.loads((tmp_path / "run" / "run.json").read_text())["driver"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert driver["wall_s"] >= 120.0  # two minutes of load at time scale 1
    assert driver["programs"] == 2048 and driver["session_finals"] == 2048
    assert driver["failed_requests"] == 0 and not driver["errors"]
    assert summary["requests_completed"] == driver["requests"] == outcome.requests
    assert (summary["requests_dropped"], summary["requests_unfinished"], summary["programs_leaked"]) == (0, 0, 0)
    assert (outcome.lost_requests, outcome.leaked_programs) == (0, 0)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["scenario"]["live"]["routing"] == routing
    # ThunderAgent paused programs under this load and every held call was resumed and routed: the
    # pause/request race was exercised, and it never failed a request. (A program can be paused at
    # the end of its last turn and then end, so pauses may outnumber resumes.)
    held, routed = set(), set()
    checks = EventChecks(lambda event: None)  # the simulator's invariants hold for the live log too
    for event in read_events(tmp_path / "run" / "events.jsonl"):
        checks(event)
        if isinstance(event, ev.RequestHeld):
            held.add(event.request)
        elif isinstance(event, ev.RequestRouted):
            routed.add(event.request)
    assert summary["pauses"] > 0 and summary["resumes"] > 0 and held and held <= routed
    # Every process the stack started is gone (their command lines name files under tmp_path).
    assert str(tmp_path) not in subprocess.run(["pgrep", "-af", "python"], capture_output=True, text=True).stdout
