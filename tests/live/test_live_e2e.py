"""End to end on real Dynamo: mocker workers + the tasim router + the Dynamo frontend.

Each policy runs ``scenarios/live-mocker.yaml`` (24 programs x 3-5 turns on two tiny workers)
once, ThunderAgent also in pin mode (``thunderagent@pin``: the router only decides, calls go to a
``direct`` frontend pinned to its choice), and round robin once more on
``scenarios/live-mocker-host-tier.yaml`` (``round_robin+host-tier``: mocker workers with a host KV
tier); the tests below read those runs. Which worker served a call is checked against what the
*workers* publish: every worker's KV-event stream is recorded by a subscriber of the test's own,
and the last full prompt block of each call must be cached on the worker the policy chose.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgpack
import pytest
import zmq
from conftest import REPO, processes_with_environ

from tasim.config.scenario import load_scenario
from tasim.core import events as ev
from tasim.live.clients.http_driver import DriverResult, HttpAgentDriver
from tasim.live.hashing import sequence_hashes
from tasim.live.run import finite_scenario, live_summary, simulated_twin
from tasim.live.stack.launcher import LiveStack, StackError
from tasim.live.stack.tiny_model import vocab_size
from tasim.results.eventlog import EVENTS_PLAIN, read_events
from tasim.sim.simulation import run_simulation

pytest.importorskip("dynamo.llm")
pytestmark = [pytest.mark.processes, pytest.mark.slow]

SCENARIO = REPO / "scenarios" / "live-mocker.yaml"
HOST_TIER_SCENARIO = REPO / "scenarios" / "live-mocker-host-tier.yaml"
TIME_SCALE = 2.0


class WorkerEvents(threading.Thread):
    """Records (order, worker index, stored block hashes) straight from the workers' publishers."""

    def __init__(self, endpoints: list[str]) -> None:
        super().__init__(daemon=True)
        self.endpoints = endpoints
        self.stored: list[tuple[int, int, list[int]]] = []
        self._halt = threading.Event()
        self._connected = threading.Event()

    def run(self) -> None:
        context = zmq.Context()
        sockets = []
        poller = zmq.Poller()
        for endpoint in self.endpoints:
            sock = context.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(endpoint)
            poller.register(sock, zmq.POLLIN)
            sockets.append(sock)
        self._connected.set()
        order = 0
        while not self._halt.is_set():
            for sock, _ in poller.poll(100):
                frames = sock.recv_multipart()
                for event in msgpack.unpackb(frames[-1], raw=False, strict_map_key=False)[1]:
                    if event.get("type") == "BlockStored":
                        self.stored.append((order, sockets.index(sock), list(event["block_hashes"])))
                        order += 1
        for sock in sockets:
            sock.close(linger=0)
        context.term()

    def start_and_wait(self) -> None:
        self.start()
        self._connected.wait(10)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


@dataclass
class LiveRun:
    summary: dict
    simulated: dict
    driver: DriverResult
    events: list[ev.Event]
    worker_stores: list[tuple[int, int, list[int]]]
    block_size: int
    status: dict = field(default_factory=dict)
    metrics: str = ""
    process_groups: list[int] = field(default_factory=list)


_RUNS: dict[str, LiveRun] = {}


def live_run(key: str, tmp_root: Path) -> LiveRun:
    """``key``: a policy name, with ``@pin`` for decision-only routing, ``+host-tier`` for the
    scenario with a host tier."""
    if key in _RUNS:
        return _RUNS[key]
    name, _, tier = key.partition("+")
    policy, _, routing = name.partition("@")
    overrides = [f"policy.name={policy}", "policy.params={}", f"live.routing={routing or 'proxy'}"]
    scenario = finite_scenario(load_scenario(HOST_TIER_SCENARIO if tier else SCENARIO, overrides), None)
    out = tmp_root / key
    out.mkdir(parents=True)
    events_path = out / EVENTS_PLAIN
    stack = LiveStack(scenario, time_scale=TIME_SCALE, workdir=out / "stack", events_path=events_path)
    with stack:
        recorder = WorkerEvents(stack.kv_event_endpoints)
        recorder.start_and_wait()
        time.sleep(0.5)  # let the subscriptions reach the publishers
        assert stack.model_path is not None
        driver = HttpAgentDriver(
            stack.base_url,
            stack.model_name,
            scenario,
            vocab_size(stack.model_path),
            TIME_SCALE,
            record_calls=True,
            decisions_url=stack.status_url if stack.pinned else None,
        )
        stack.begin_run()
        result = asyncio.run(driver.run())
        stack.end_run()
        time.sleep(0.3)
        recorder.stop()
        status = stack.status()
        metrics = urllib.request.urlopen(f"{stack.status_url}/metrics", timeout=10).read().decode()

    run = LiveRun(
        summary=live_summary(events_path, None),
        simulated=run_simulation(simulated_twin(scenario, "mocker"), out / "sim"),
        driver=result,
        events=list(read_events(events_path)),
        worker_stores=recorder.stored,
        block_size=scenario.cluster.engine.block_size,
        status=status,
        metrics=metrics,
        process_groups=list(stack.started_groups),
    )
    _RUNS[key] = run
    return run


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("live")


POLICIES = ("thunderagent", "round_robin", "kv_router", "thunderagent@pin", "round_robin+host-tier")


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_completes_and_no_program_leaks(policy: str, tmp_root: Path) -> None:
    run = live_run(policy, tmp_root)
    planned = run.simulated["requests_completed"]  # the same 24 programs, simulated
    assert run.driver.failed_requests == 0, run.driver.errors[:3]
    assert run.driver.programs == 24 and run.driver.session_finals == 24
    assert run.summary["requests_completed"] == planned == run.driver.requests
    assert run.summary["programs_completed"] == 24
    assert run.summary["programs_leaked"] == 0
    assert run.summary["requests_unfinished"] == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_each_call_ran_on_the_worker_the_policy_chose(policy: str, tmp_root: Path) -> None:
    run = live_run(policy, tmp_root)
    routed = {e.request: e.worker for e in run.events if isinstance(e, ev.RequestRouted)}
    stored_on: dict[int, set[int]] = {}
    first_store: dict[int, int] = {}
    for _, worker, hashes in run.worker_stores:
        for block in hashes:
            stored_on.setdefault(block, set()).add(worker)
            first_store.setdefault(block, worker)
    first_caller: dict[int, str] = {}
    assert len(run.driver.calls) == run.driver.requests
    for call in run.driver.calls:
        assert routed[call.request] == call.worker  # the reply names the router's logged choice
        last_block = sequence_hashes(call.prompt_token_ids, run.block_size)[-1]
        chosen = int(call.worker[1:])
        # The chosen worker holds the prompt: it computed it (stored now) or had it cached.
        assert chosen in stored_on.get(last_block, set()), f"{call.request}: block not on {call.worker}"
        first_caller.setdefault(last_block, call.worker)
    # A block's first store anywhere is on the worker chosen for the first call that contained it.
    for block, worker in first_caller.items():
        assert first_store[block] == int(worker[1:])


def test_mocker_workers_run_the_scenarios_host_tier(tmp_root: Path) -> None:
    """The workers' host tier serves prompts: the live hit rate (held to the tiered simulation's
    above) is well above what the same programs hit without a tier. Dynamo 1.6.1's mocker,
    started with ZMQ KV-event ports as here, publishes only its GPU pool's events, on those ports
    and on Dynamo's event plane alike (measured), so the tier shows in what the calls reused, not
    in the events."""
    run = live_run("round_robin+host-tier", tmp_root)
    no_tier = load_scenario(SCENARIO, ["policy.name=round_robin", "policy.params={}"])
    without = run_simulation(simulated_twin(finite_scenario(no_tier, None), "mocker"), tmp_root / "round_robin-no-tier")
    assert run.simulated["host_tier"]["host_hit_tokens"] > 0
    assert run.summary["prefix_hit_rate"] >= without["prefix_hit_rate"] + 0.10
    # Live, only the tier's size is known: workers do not say which tier a hit came from.
    unknown = dict.fromkeys(("gpu_hit_tokens", "host_hit_tokens", "stored_tokens", "d2h_busy_s", "h2d_busy_s"))
    assert run.summary["host_tier"] == {"host_blocks_per_worker": 321, **unknown}


@pytest.mark.parametrize("key", ["thunderagent", "thunderagent@pin"])
def test_thunderagent_pauses_and_resumes_every_paused_program(key: str, tmp_root: Path) -> None:
    run = live_run(key, tmp_root)
    assert run.summary["pauses"] > 0
    paused: set[str] = set()
    held: set[str] = set()
    for e in run.events:
        if isinstance(e, ev.ProgramPaused):
            paused.add(e.program)
        elif isinstance(e, ev.ProgramResumed):
            paused.discard(e.program)
        elif isinstance(e, ev.RequestHeld):
            held.add(e.request)
        elif isinstance(e, ev.RequestRouted):
            held.discard(e.request)
        elif isinstance(e, ev.ProgramFinished):
            # A program paused after its last turn is released by its session-final request.
            paused.discard(e.program)
    assert not held, f"held calls never routed: {sorted(held)[:5]}"
    assert not paused
    assert run.summary["resumes"] > 0


@pytest.mark.parametrize("policy", POLICIES)
def test_live_matches_simulation(policy: str, tmp_root: Path) -> None:
    run = live_run(policy, tmp_root)
    live, sim = run.summary, run.simulated
    assert abs(live["prefix_hit_rate"] - sim["prefix_hit_rate"]) <= 0.05
    assert abs(live["output_tokens_per_s"] / sim["output_tokens_per_s"] - 1) <= 0.15


@pytest.mark.parametrize("policy", POLICIES)
def test_no_process_outlives_the_stack(policy: str, tmp_root: Path) -> None:
    run = live_run(policy, tmp_root)
    assert len(run.process_groups) == 4  # two workers, router, frontend
    for group in run.process_groups:
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)  # signal 0: does any process of the group exist?


@pytest.mark.parametrize("policy", POLICIES)
def test_router_status_and_metrics_account_for_every_call(policy: str, tmp_root: Path) -> None:
    run = live_run(policy, tmp_root)
    status = run.status
    assert status["ready"] and status["policy"] == policy.partition("+")[0].partition("@")[0]
    assert status["pinned_calls"] == {"unreported": 0, "expired": 0}
    assert status["programs"]["live"] == 0  # the router's own table is empty: nothing leaked
    assert status["requests"] == {"in_flight": 0, "finished": run.driver.requests, "failed": 0, "retried": 0, "refused": 0, "session_finals": 24}
    assert all(info["serving"] and info["in_flight"] == 0 for info in status["workers"].values())
    routed = {w: info["routed"] for w, info in status["workers"].items()}
    assert sum(routed.values()) == run.driver.requests
    assert all(isinstance(info["instance_id"], int) for info in status["workers"].values())
    assert status["kv_events"]["gaps"] == {}
    for worker, count in routed.items():
        assert f'tasim_router_requests_routed_total{{worker="{worker}"}} {count}' in run.metrics.splitlines()
    assert f"tasim_router_pauses_total {status['pauses']}" in run.metrics.splitlines()


def test_a_failed_start_names_the_process_and_leaves_nothing_running(tmp_path: Path) -> None:
    scenario = finite_scenario(load_scenario(SCENARIO), None)
    empty_model = tmp_path / "no-model"
    empty_model.mkdir()
    stack = LiveStack(scenario, model_path=empty_model, workdir=tmp_path / "stack", startup_timeout_s=60)
    with pytest.raises(StackError, match=r"worker[01] exited with code \d+ during start-up; see .*worker[01]\.log"):
        stack.start()
    assert stack.started_groups  # the workers did start, and were stopped
    for group in stack.started_groups:
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)


def test_a_client_gone_while_held_leaves_the_program_table_as_it_was(tmp_path: Path) -> None:
    """ThunderAgent on two 24-block workers: A and B fill them, so C is held; C's client hangs up,
    and the router forgets C as if it never came. A's next turn then streams normally."""
    scenario = finite_scenario(load_scenario(SCENARIO, ["cluster.engine.kv_blocks=24"]), None)

    async def session(stack: LiveStack) -> tuple[list[int], dict, int, str]:
        url = f"{stack.base_url}/v1/completions"
        statuses = []
        async with aiohttp.ClientSession() as client:
            for name in ("A", "B"):  # 250 prompt tokens + 100 buffer each: one program per worker
                body = {"model": stack.model_name, "prompt": list(range(10, 260)), "max_tokens": 4}
                async with client.post(url, json=body, headers={"x-dynamo-session-id": name}) as reply:
                    statuses.append(reply.status)
            body = {"model": stack.model_name, "prompt": list(range(300, 550)), "max_tokens": 4}
            with pytest.raises(asyncio.TimeoutError):
                async with client.post(url, json=body, headers={"x-dynamo-session-id": "C"}, timeout=aiohttp.ClientTimeout(total=2)):
                    pass
            await asyncio.sleep(1)
            table = stack.status()["programs"]
            body = {"model": stack.model_name, "prompt": list(range(10, 270)), "max_tokens": 5, "stream": True}
            async with client.post(url, json=body, headers={"x-dynamo-session-id": "A"}) as reply:
                stream_status, text = reply.status, await reply.text()
        return statuses, table, stream_status, text

    with LiveStack(scenario, workdir=tmp_path / "stack", events_path=tmp_path / EVENTS_PLAIN) as stack:
        stack.begin_run()
        statuses, table, stream_status, text = asyncio.run(session(stack))
        stack.end_run()
        # The mocker serves no clear_kv_blocks endpoint (Dynamo's vLLM and SGLang workers do).
        reset = stack.clear_caches()
    assert reset["cleared"] is False and sorted(reset["workers"]) == ["w0", "w1"]
    assert {reply["status"] for reply in reset["workers"].values()} == {"unsupported"}
    assert statuses == [200, 200]
    assert sorted(table["table"]) == ["A", "B"] and table["held"] == 0
    assert table["table"]["A"] == {"parent": None, "turn": 1, "history_tokens": 254, "in_flight": 0, "held": False}
    assert stream_status == 200 and text.count("data: ") == 7 and text.rstrip().endswith("data: [DONE]")  # 5 tokens, final chunk, [DONE]
    events = list(read_events(tmp_path / EVENTS_PLAIN))
    dropped = [e for e in events if isinstance(e, ev.RequestDropped)]
    assert [(e.request, e.reason) for e in dropped] == [("C.0", "cancelled while held")]
    finished = [e for e in events if isinstance(e, ev.ProgramFinished)]
    assert [(e.program, e.completed) for e in finished] == [("C", False)]
    last = [e for e in events if isinstance(e, ev.RequestFinished)][-1]
    assert (last.request, last.worker, last.cached_tokens) == ("A.1", "w0", 240)  # A's first 15 blocks, cached where A ran


def _stack_processes(discovery: Path) -> list[int]:
    """Processes whose environment names this stack's discovery store."""
    return processes_with_environ(f"DYN_FILE_KV={discovery}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_tasim_live_leaves_no_stack_behind(sig: int, tmp_path: Path) -> None:
    """SIGTERM unwinds through the launcher's clean-up; after SIGKILL, the kernel tells every
    child (they asked for SIGTERM when their parent dies)."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "tasim", "live", str(SCENARIO), "--out", str(out), "--time-scale", "2"]
    cli = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    discovery = out / "stack" / "discovery"
    deadline = time.monotonic() + 120
    while len(_stack_processes(discovery)) < 4 and time.monotonic() < deadline:  # 2 workers, router, frontend
        time.sleep(0.5)
    assert len(_stack_processes(discovery)) == 4
    time.sleep(2)  # programs are running
    cli.send_signal(sig)
    assert cli.wait(60) == (128 + sig if sig == signal.SIGTERM else -sig)
    deadline = time.monotonic() + 30
    while _stack_processes(discovery) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _stack_processes(discovery) == []
    assert not (out / "summary.json").exists()  # an interrupted run writes no summary
