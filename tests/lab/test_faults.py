"""The fault test on the real live stack, in proxy and pin mode: SIGKILL one of two Dynamo
mocker workers while its calls stream, restart it, then kill both (`lab.faults.kill_a_worker`, which also fills
the fault row of docs/results/reliability.md). No client may see an error or a broken reply, the
programs pinned to the dead worker must be re-placed, and the restarted worker must serve again.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lab.faults import kill_a_worker
from tasim.core import events as ev
from tasim.results.eventlog import read_events
from tasim.sim.checks import EventChecks

pytest.importorskip("dynamo.llm")
pytestmark = [pytest.mark.processes, pytest.mark.slow]


@pytest.mark.parametrize("routing", ["proxy", "pin"])
def test_a_killed_worker_loses_no_request_and_serves_again_after_a_restart(routing: str, tmp_path: Path) -> None:
    run = kill_a_worker(tmp_path / "run", routing=routing)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    driver = record["driver"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())

    # Nothing lost: every call answered, every program ended, none leaked.
    assert driver["failed_requests"] == 0 and not driver["errors"]
    assert driver["programs"] == driver["session_finals"] == run.programs == 128
    assert (run.lost_requests, run.leaked_programs, summary["requests_dropped"], summary["requests_unfinished"]) == (0, 0, 0, 0)
    assert summary["workers_lost"] == 1 and summary["requests_completed"] == driver["requests"]

    # The kill hit calls in flight; they were sent again: through the router, some after part of
    # their output streamed, carrying it on; pinned, each started over on its new worker.
    assert run.streaming_at_kill >= 6 and run.retried >= 1
    assert run.retried_mid_stream >= 1 if routing == "proxy" else run.retried_mid_stream == 0

    # Each client saw one whole reply: as many tokens as it asked for, and usage that adds up
    # (a retried call's usage is reported as the one call the client made).
    for call in driver["calls"]:
        assert len(call["output_token_ids"]) == call["max_tokens"], call["request"]
        assert call["usage"]["prompt_tokens"] == len(call["prompt_token_ids"]), call["request"]
        assert call["usage"]["completion_tokens"] == call["max_tokens"], call["request"]

    # The router's log keeps the simulator's invariants (every request ends once, finished or
    # retried; every program ends), and nothing was routed or resumed onto w1 while it was lost.
    checks = EventChecks(lambda event: None)
    lost_at = joined_at = None
    retrying: dict[str, str] = {}  # program -> its request being retried
    program_of: dict[str, str] = {}
    for event in read_events(tmp_path / "run" / "events.jsonl"):
        checks(event)
        if isinstance(event, ev.WorkerLost):
            assert event.worker == "w1" and lost_at is None
            lost_at = event.t
        elif isinstance(event, ev.WorkerJoined):
            assert event.worker == "w1" and lost_at is not None
            joined_at = event.t
        elif isinstance(event, ev.RequestArrived):
            program_of[event.request] = event.program
        elif isinstance(event, ev.RequestRetried):
            assert event.worker == "w1" and lost_at is not None and joined_at is None
            retrying[event.program] = event.request
        elif isinstance(event, (ev.RequestRouted, ev.ProgramResumed)):
            between = lost_at is not None and joined_at is None
            assert not (between and event.worker == "w1"), event
            program = program_of[event.request] if isinstance(event, ev.RequestRouted) else event.program
            if isinstance(event, ev.RequestRouted) and program in retrying:  # the retry: same turn
                assert event.request.startswith(retrying.pop(program).rsplit("r", 1)[0] + "r")
    assert lost_at is not None and joined_at is not None and not retrying

    # Programs that lived on w1 went on on w0; w1 took work again after its restart.
    assert run.replaced_programs >= 1 and run.served_after_rejoin >= 1
    # With every worker gone a call is refused with 503, not a hang or a 500.
    assert run.refused_status == 503
    # Every process the stack started is gone (their command lines name files under tmp_path).
    assert str(tmp_path) not in subprocess.run(["pgrep", "-af", "python"], capture_output=True, text=True).stdout
