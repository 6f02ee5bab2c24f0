"""Shared helpers for tests: a recording engine listener, request builders and a live policy host."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tasim.config.scenario import Scenario, parse_scenario
from tasim.core.cluster_view import ClusterView, WorkerInfo
from tasim.core.model import BlockHash, RequestSpec

if TYPE_CHECKING:
    from tasim.core import events as ev
    from tasim.live.router.live_host import Call, Held, PolicyHost

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
TEST_DATA = REPO / "tests" / "data"
TINY = str(TEST_DATA / "tiny.yaml")


class FakeClock:
    """A clock that reads ``t``, for code that takes a clock function (the live policy host)."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


LIVE_BLOCK_SIZE = 16


def live_view(workers: int = 2, kv_blocks: int = 64) -> ClusterView:
    """``workers`` workers named ``w0 …`` with ``kv_blocks`` blocks of 16 tokens each."""
    return ClusterView(tuple(WorkerInfo(f"w{i}", LIVE_BLOCK_SIZE, kv_blocks, 64, 2048) for i in range(workers)))


def live_host(
    policy: str = "round_robin",
    params: dict[str, Any] | None = None,
    *,
    workers: int = 2,
    kv_blocks: int = 64,
    ttl: float | None = None,
    log_kv_events: bool = False,
    checked: bool = False,
) -> tuple[PolicyHost, FakeClock, list[ev.Event]]:
    """The live router's `PolicyHost` on a `FakeClock`, recording its events (through the
    simulator's `EventChecks` when ``checked``)."""
    import numpy as np

    from tasim.live.router.live_host import PolicyHost  # the live extra: only the live tests import it
    from tasim.policies import make_policy
    from tasim.sim.checks import EventChecks

    clock = FakeClock()
    events: list[ev.Event] = []
    chosen = make_policy(policy, params or {}, live_view(workers, kv_blocks), np.random.default_rng(0))
    emit = EventChecks(events.append) if checked else events.append
    return PolicyHost(chosen, clock, emit, LIVE_BLOCK_SIZE, log_kv_events, ttl), clock, events


def tokens(n: int, start: int = 5) -> list[int]:
    """``n`` consecutive token ids from ``start``: a prompt for the live tests."""
    return list(range(start, start + n))


def kv_event_frames(seq: int, events: list[Any]) -> list[bytes]:
    """A KV-event message as a worker publishes it: topic, 8-byte sequence number, and the
    msgpack batch ``[timestamp, events, data-parallel rank]``."""
    import msgpack  # the live extra: only the live tests import it

    return [b"", seq.to_bytes(8, "big"), msgpack.packb([1700000000.0, events, 0])]


def routed(admission: Call | Held) -> Call:
    """The admission, which must be a routed call (not held)."""
    from tasim.live.router.live_host import Call

    assert isinstance(admission, Call), admission
    return admission


async def serve_completions(handler: Any) -> tuple[Any, str]:
    """A fake frontend on 127.0.0.1 (a free port) answering ``POST /v1/completions`` with
    ``handler``: its aiohttp runner (clean it up) and base URL."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def tasim(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tasim`` in a subprocess, as a user would."""
    return subprocess.run([sys.executable, "-m", "tasim", *args], capture_output=True, text=True, cwd=cwd or REPO)


def processes_with_environ(entry: str) -> list[int]:
    """The processes whose environment holds ``entry`` (``NAME=value``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if entry.encode() in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return found


class ProcessMark:
    """A variable put in the environment of a command: every process it starts inherits it, so
    those still alive afterwards can be found (`alive`), whichever session or parent they have."""

    def __init__(self) -> None:
        self.name = "TASIM_TEST_MARK"
        self.value = uuid.uuid4().hex

    def env(self, **more: str) -> dict[str, str]:
        return {**os.environ, **more, self.name: self.value}

    def alive(self) -> list[int]:
        return processes_with_environ(f"{self.name}={self.value}")

    def wait_gone(self, within_s: float) -> list[int]:
        """The marked processes still alive after up to ``within_s`` seconds."""
        deadline = time.monotonic() + within_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.alive()


def assert_usage_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit status 2, one line on stderr containing every fragment, no traceback."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def spec(rid: str, prompt: int, output: int, hashes: list[BlockHash] | None = None, block_size: int = 4, program: str | None = None) -> RequestSpec:
    """A request whose full blocks get distinct hashes unless ``hashes`` are given."""
    if hashes is None:
        base = zlib.crc32(rid.encode()) % 10_000 * 1000
        hashes = [base + i for i in range((prompt + output) // block_size)]
    return RequestSpec(rid, program or rid, 0, prompt, output, 0, tuple(hashes))


@dataclass
class Recorder:
    """EngineListener that records (kind, request id, detail) tuples."""

    log: list[tuple] = field(default_factory=list)
    stored: list[BlockHash] = field(default_factory=list)
    removed: list[BlockHash] = field(default_factory=list)

    def on_admitted(self, worker, request, cached_tokens, length, first, now):
        self.log.append(("admitted" if first else "readmitted", request.id, cached_tokens, now))

    def on_preempted(self, worker, request, lost_tokens, now):
        self.log.append(("preempted", request.id, lost_tokens, now))

    def on_kv(self, worker, stored, removed, now):
        self.stored += stored
        self.removed += removed

    def on_first_token(self, worker, request, now):
        self.log.append(("first_token", request.id, None, now))

    def on_finished(self, worker, request, cached_tokens, now):
        self.log.append(("finished", request.id, cached_tokens, now))

    def on_dropped(self, worker, request, reason, now):
        self.log.append(("dropped", request.id, reason, now))

    def kinds(self, kind: str) -> list[str]:
        return [entry[1] for entry in self.log if entry[0] == kind]


class UnitStep:
    """Perf model where every non-empty step takes exactly one second."""

    name = "unit"

    def step_time(self, shape) -> float:
        return 1.0


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def small_async_rollout(backends: int, mode: str = "colocate_async", **workload: Any) -> Scenario:
    """verl's asynchronous trainers on a small pool with a fixed 10 ms step: three batches of six
    three-turn trajectories sharing a 40-token system prompt; every sync stops the engines
    mid-generation, and with equal steps a sync often begins as one worker's step ends (the
    vLLM oracle's and the fast-forward tests' case). ``workload`` changes its fields."""
    return parse_scenario(
        {
            "name": "rl-async-small",
            "duration_s": 600,
            "cluster": {
                "backends": backends,
                "engine": {"block_size": 16, "kv_blocks": 30, "max_num_seqs": 4, "max_num_batched_tokens": 256},
                "perf": {"model": "fixed", "step_ms": 10.0},
            },
            "workload": {
                "kind": "rl_rollout",
                "mode": mode,
                "reset_prefix_cache": True,
                "prompts_per_step": 2,
                "samples_per_prompt": 3,
                "steps": 3,
                "warmup_batches": 1,
                "max_concurrency": 8,
                "turns": 3,
                "setup_s": 0,
                "system_prompt_tokens": 40,
                "task_prompt_tokens": {"kind": "uniform", "low": 20, "high": 120},
                "output_tokens": {"kind": "uniform", "low": 10, "high": 60},
                "observation_tokens": 30,
                "tool_latency_s": 0.05,
                "training_s": 0.3,
                "weight_sync_s": 0.1,
                "abort_retry_delay_s": 0.05,
                **workload,
            },
            "policy": {"name": "round_robin"},
        },
        "rl-async-small",
    )
