"""A worker crash under load, on the real live stack (the fault test and the reliability row).

`kill_a_worker` drives agent programs through Dynamo's frontend, the tasim router (proxy or pin
mode) and two mocker workers, SIGKILLs worker ``w1`` while its calls stream, restarts it, lets the run finish, and then
kills both workers to see a call refused. Everything it observed goes to ``out``: the router's
event log (``events.jsonl``), its summary and ``run.json`` with the driver's record and the
fault timeline; `FaultRun` carries the figures.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tasim.config.presets import PRESET_DIR
from tasim.config.scenario import AgentWorkload, Scenario, load_scenario
from tasim.core import events as ev
from tasim.live.clients.http_driver import DriverResult, HttpAgentDriver
from tasim.live.run import finite_scenario, live_summary
from tasim.live.stack.launcher import LiveStack
from tasim.live.stack.tiny_model import vocab_size
from tasim.results.eventlog import EVENTS_PLAIN, read_events
from tasim.results.run_folder import RUN_FILE, SUMMARY_FILE, write_json

WAIT_S = 90.0  # longest wait for the stack to reach a state (a restarted mocker joins in ~10 s)
VICTIM = 1


@dataclass(frozen=True, slots=True)
class FaultRun:
    programs: int
    concurrency: int
    requests: int
    failed_requests: int
    streaming_at_kill: int  # calls in flight on the victim when it was killed
    retried: int
    retried_mid_stream: int  # retried after some of their output had streamed
    replaced_programs: int  # programs served by the victim before the kill and by another worker after
    lost_after_s: float  # kill to the router's loss of the worker (wall seconds)
    rejoined_after_s: float  # restart to the worker serving again
    served_after_rejoin: int  # calls routed to the victim after it joined again
    refused_status: int  # HTTP status of a call while no worker serves
    lost_requests: int
    leaked_programs: int
    wall_s: float


def fault_scenario(programs: int = 128, concurrency: int = 32, routing: str = "proxy") -> Scenario:
    """The live-mocker preset under ThunderAgent with outputs long enough that a kill lands
    mid-stream, and pools that hold both workers' programs but not all of them on one worker,
    so the re-placed programs also meet ThunderAgent's pauses. ``routing``: ``live.routing``."""
    scenario = load_scenario(
        PRESET_DIR / "live-mocker.yaml",
        [
            f"workload.concurrency={concurrency}",
            "cluster.engine.kv_blocks=1024",
            "policy.name=thunderagent",
            "policy.params={}",
            "workload.output_tokens={kind: uniform, low: 100, high: 200}",
            f"live.routing={routing}",
        ],
    )
    return finite_scenario(scenario, programs)


def kill_a_worker(out: Path, programs: int = 128, concurrency: int = 32, time_scale: float = 2.0, routing: str = "proxy") -> FaultRun:
    scenario = fault_scenario(programs, concurrency, routing)
    out.mkdir(parents=True, exist_ok=True)
    events_path = out / EVENTS_PLAIN
    started = time.perf_counter()
    with LiveStack(scenario, time_scale=time_scale, workdir=out / "stack", events_path=events_path) as stack:
        assert stack.model_path is not None
        decisions = stack.status_url if stack.pinned else None
        driver = HttpAgentDriver(
            stack.base_url, stack.model_name, scenario, vocab_size(stack.model_path), time_scale, record_calls=True, decisions_url=decisions
        )
        timeline, result = asyncio.run(_crash_during(stack, driver))
        stack.end_run()
        timeline["refused_status"] = _refused_status(stack)
    wall = time.perf_counter() - started
    summary = live_summary(events_path, wall)
    write_json(out / SUMMARY_FILE, summary)
    record = asdict(result) | {"errors": result.errors[:20], "calls": [asdict(c) for c in result.calls]}
    write_json(out / RUN_FILE, {"mode": "live", "faults": timeline, "driver": record, "scenario": scenario.model_dump(mode="json")})
    return _figures(scenario, events_path, summary, result, timeline, wall)


async def _crash_during(stack: LiveStack, driver: HttpAgentDriver) -> tuple[dict[str, Any], DriverResult]:
    victim = f"w{VICTIM}"
    stack.begin_run()
    driving = asyncio.ensure_future(driver.run())
    status = await _until(stack, lambda s: s["workers"][victim]["routed"] >= 16 and s["workers"][victim]["in_flight"] >= 6, driving)
    killed = time.perf_counter()
    stack.kill_worker(VICTIM)
    await _until(stack, lambda s: not s["workers"][victim]["serving"], driving)
    lost = time.perf_counter()
    stack.restart_worker(VICTIM)
    restarted = time.perf_counter()
    await _until(stack, lambda s: s["workers"][victim]["serving"], driving)
    joined = time.perf_counter()
    result = await driving
    timeline = {
        "streaming_at_kill": status["workers"][victim]["in_flight"],
        "lost_after_s": lost - killed,
        "rejoined_after_s": joined - restarted,
    }
    return timeline, result


async def _until(stack: LiveStack, ready: Callable[[dict[str, Any]], bool], driving: asyncio.Future[Any]) -> dict[str, Any]:
    """Poll the router's status until ``ready``; fails if the run ends or time runs out first."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        status = await asyncio.to_thread(stack.status)
        if ready(status):
            return status
        if driving.done():
            raise RuntimeError("the workload finished before the fault could be staged; give it more programs")
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the router did not reach the awaited state within {WAIT_S:g} s; logs in {stack.workdir}")


def _refused_status(stack: LiveStack) -> int:
    """Kill every worker, wait until the router has lost them, and send one call (pinned:
    ask the router for a worker)."""
    for index in range(stack.scenario.cluster.backends):
        stack.kill_worker(index)
    deadline = time.monotonic() + WAIT_S
    while any(w["serving"] for w in stack.status()["workers"].values()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the router still counts killed workers as serving after {WAIT_S:g} s")
        time.sleep(0.2)
    if stack.pinned:
        url, body = f"{stack.status_url}/v1/route", json.dumps({"token_ids": [5, 6, 7, 8], "max_tokens": 4}).encode()
    else:
        url, body = f"{stack.base_url}/v1/completions", json.dumps({"model": stack.model_name, "prompt": [5, 6, 7, 8], "max_tokens": 4}).encode()
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _figures(scenario: Scenario, events_path: Path, summary: dict[str, Any], result: DriverResult, timeline: dict[str, Any], wall: float) -> FaultRun:
    victim = f"w{VICTIM}"
    lost_at = joined_at = None
    before: set[str] = set()
    after: set[str] = set()
    served_after_rejoin = mid_stream = 0
    arrived: dict[str, ev.RequestArrived] = {}
    retrying: dict[str, int] = {}  # program -> prompt tokens of its call that is being retried
    for event in read_events(events_path):
        if isinstance(event, ev.RequestArrived):
            arrived[event.request] = event
            if event.program in retrying:  # a retry whose prompt grew carries streamed output
                mid_stream += event.prompt_tokens > retrying.pop(event.program)
        elif isinstance(event, ev.RequestRetried):
            retrying[event.program] = arrived[event.request].prompt_tokens
        elif isinstance(event, ev.WorkerLost) and event.worker == victim:
            lost_at = event.t
        elif isinstance(event, ev.WorkerJoined) and event.worker == victim:
            joined_at = event.t
        elif isinstance(event, ev.RequestRouted):
            program = arrived[event.request].program
            if lost_at is None and event.worker == victim:
                before.add(program)
            elif lost_at is not None and joined_at is None and event.worker != victim:
                after.add(program)
            elif joined_at is not None and event.worker == victim:
                served_after_rejoin += 1
    workload = scenario.workload
    assert isinstance(workload, AgentWorkload)  # `fault_scenario`'s: the live-mocker preset's agent programs
    return FaultRun(
        programs=workload.programs or 0,
        concurrency=workload.concurrency,
        requests=result.requests,
        failed_requests=result.failed_requests,
        streaming_at_kill=timeline["streaming_at_kill"],
        retried=summary["requests_retried"],
        retried_mid_stream=mid_stream,
        replaced_programs=len(before & after),
        lost_after_s=timeline["lost_after_s"],
        rejoined_after_s=timeline["rejoined_after_s"],
        served_after_rejoin=served_after_rejoin,
        refused_status=timeline["refused_status"],
        lost_requests=result.failed_requests + summary["requests_unfinished"] + summary["requests_dropped"],
        leaked_programs=summary["programs_leaked"],
        wall_s=wall,
    )
