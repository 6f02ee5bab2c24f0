"""Start and supervise a live stack: workers, the tasim router, the Dynamo frontend.

Everything runs on 127.0.0.1 with free ports, in a private temporary directory that holds the
file-discovery store, the generated model folder (when none is given), the router's config and
each process's log. Start order is workers → router (it waits for the workers, probes them and
registers the public model) → frontend; each stage waits for readiness. `LiveStack.stop` (also
on leaving the ``with`` block, on Ctrl-C and on any start-up failure) ends every process group it
started, politely first (the router then writes the end of its event log), and kills what is
still alive after a grace period. SIGTERM and SIGHUP to the launcher unwind the same way, and
every child asks the kernel for SIGTERM when the launcher dies, so even a SIGKILLed launcher
leaves no stack behind.

Dynamo 1.6.1 binds its own ZMQ event-plane publishers (and the mocker's KV-event publishers) on
all interfaces; every address that can be configured (HTTP, request plane, response streams,
system port) is set to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from tasim.config.scenario import Scenario
from tasim.core.errors import LiveError
from tasim.core.lifecycle import exit_on_termination, terminate_with

Engine = Literal["mocker", "vllm", "sglang"]
ENGINES: tuple[str, ...] = ("mocker", "vllm", "sglang")
HOST = "127.0.0.1"
INTERNAL_SUFFIX = "-internal"


class StackError(LiveError):
    """The stack could not start; the message names the process and its log."""


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """Ports to listen on, drawn below the kernel's ephemeral range: a port the kernel can
    hand to some outgoing connection between our check and the server's bind would make the
    server fail to start (seen under load), and those come from the ephemeral range."""
    low, high = 20000, max(20000 + 4 * count + 1000, _ephemeral_low())
    rng = random.Random()
    for _ in range(1000):
        ports = rng.sample(range(low, high), count)
        if all(_bindable(port) for port in ports):
            return ports
    raise StackError(f"no {count} free ports found between {low} and {high}")


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class LiveStack:
    """``scenario`` sizes the workers (block size, blocks, batch limits) and names the policy;
    ``time_scale`` speeds the mocker up (its ``--speedup-ratio``, times the scenario's)."""

    scenario: Scenario
    engine: Engine = "mocker"
    model_path: Path | None = None
    model_name: str = "tasim-model"
    time_scale: float = 1.0
    workdir: Path | None = None
    events_path: Path | None = None
    startup_timeout_s: float = 180.0
    processes: list[_Process] = field(default_factory=list)
    started_groups: list[int] = field(default_factory=list)  # every process group ever started
    _termination: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # SIGTERM/SIGHUP handlers while running
    http_port: int = 0
    status_port: int = 0
    kv_event_ports: list[int] = field(default_factory=list)
    _worker_args: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)

    # --- public --------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def status_url(self) -> str:
        return f"http://{HOST}:{self.status_port}"

    @property
    def pinned(self) -> bool:
        """Decision-only routing (``live.routing: pin``): the workers serve the public model
        name behind a frontend in ``direct`` mode, and the router only decides."""
        return self.scenario.live.routing == "pin"

    @property
    def dynamo_routes(self) -> bool:
        """Dynamo's own Rust plug-in decides (``live.routing: dynamo-*``); the tasim router only
        watches the workers."""
        return self.scenario.live.routed_by_dynamo

    @property
    def worker_model_name(self) -> str:
        """What the workers register as: an internal name that only the router calls in proxy
        mode (so no call bypasses the policy), else the public name, behind a frontend that
        routes by pin (pin mode) or by its own plug-in."""
        return self.model_name + INTERNAL_SUFFIX if self.scenario.live.routing == "proxy" else self.model_name

    @property
    def frontend_log(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "frontend.log"

    @property
    def kv_event_endpoints(self) -> list[str]:
        return [f"tcp://{HOST}:{port}" for port in self.kv_event_ports]

    def __enter__(self) -> LiveStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._termination.enter_context(exit_on_termination())
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tasim-live-")
            self.workdir = Path(self._tmp.name)
        # Children start in the work folder: a relative path handed to them would name another file.
        self.workdir = self.workdir.absolute()
        self.model_path = self.model_path and self.model_path.absolute()
        self.events_path = self.events_path and self.events_path.absolute()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.model_path is None:
            from tasim.live.stack.tiny_model import write_tiny_model

            self.model_path = write_tiny_model(self.workdir / "model")
        self.events_path = self.events_path or self.workdir / "events.jsonl"
        backends = self.scenario.cluster.backends
        self.http_port, self.status_port, *self.kv_event_ports = free_ports(2 + backends)  # one draw: no two alike
        try:
            self._start_workers()
            self._start_router()
            self._wait_http(f"{self.status_url}/status", "router", lambda body: json.loads(body).get("ready") is True)
            self._start_frontend()
            self._wait_http(f"{self.base_url}/v1/models", "frontend", lambda body: f'"{self.model_name}"' in body)
        except BaseException:
            self.stop()
            raise

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop everything started, frontend first, router (which ends its log) before workers."""
        for process in reversed(self.processes):
            self._terminate(process, grace_s)
        self.processes.clear()
        self._termination.close()

    def start_component(self, name: str, args: list[str]) -> None:
        """Start one more process in this stack's environment (same discovery store and
        addresses), stopped with the rest: e.g. a peer router to measure against."""
        self._spawn(name, args)

    def add_frontend(self, name: str, router_mode: str) -> str:
        """Start one more frontend on the same workers (e.g. ``direct``, for pinned calls beside
        a proxy stack) and wait until it serves the workers' model; its base URL."""
        (port,) = free_ports(1)
        self._spawn(name, frontend_command(port, router_mode))
        url = f"http://{HOST}:{port}"
        self._wait_http(f"{url}/v1/models", name, lambda body: f'"{self.worker_model_name}"' in body)
        return url

    def wait_for_model(self, model_name: str) -> None:
        """Wait until the frontend serves ``model_name``."""
        self._wait_http(f"{self.base_url}/v1/models", model_name, lambda body: f'"{model_name}"' in body)

    def begin_run(self) -> None:
        """Start the router's measured run (its clock and event log) now."""
        _post(f"{self.status_url}/run/start")

    def end_run(self) -> None:
        """End the router's measured run now; later requests are not in its log's window."""
        _post(f"{self.status_url}/run/end")

    def mark(self, kind: str, step: int, trajectories: int = 0) -> None:
        """Log an RL step boundary (rollout_started, rollout_finished, training_started, training_finished)."""
        _post(f"{self.status_url}/run/mark", {"kind": kind, "step": step, "trajectories": trajectories})

    def mark_group_sampled(self, step: int, group: str, min_version: int, max_version: int) -> None:
        """Log that the trainer's ``step`` took GRPO ``group``, whose calls were served by weight
        versions ``min_version`` to ``max_version`` (the live summary's staleness)."""
        body = {"kind": "group_sampled", "step": step, "group": group, "min_version": min_version, "max_version": max_version}
        _post(f"{self.status_url}/run/mark", body)

    def begin_weight_sync(self, version: int, abort: bool) -> dict[str, Any]:
        """``POST /v1/weight_sync/begin``: with ``abort`` the router cuts every call streaming and
        holds new ones until the end; its reply (``aborted``: how many calls it cut)."""
        began: dict[str, Any] = _post(f"{self.status_url}/v1/weight_sync/begin", {"version": version, "abort": abort})
        return began

    def end_weight_sync(self, version: int) -> dict[str, Any]:
        """``POST /v1/weight_sync/end``: the workers serve ``version``; held calls go on."""
        ended: dict[str, Any] = _post(f"{self.status_url}/v1/weight_sync/end", {"version": version})
        return ended

    def status(self) -> dict[str, Any]:
        """The router's ``GET /status``: workers, program table, request counts."""
        status: dict[str, Any] = _request(urllib.request.Request(f"{self.status_url}/status"))
        return status

    def clear_caches(self) -> dict[str, Any]:
        """Empty the workers' prefix caches (``{"cleared": bool, "workers": {w: reply}}``)."""
        cleared: dict[str, Any] = _post(f"{self.status_url}/caches/clear")
        return cleared

    def alive(self) -> list[str]:
        return [p.name for p in self.processes if p.popen.poll() is None]

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index``'s process group: a crashed GPU worker, for fault tests."""
        _kill(self._process(f"worker{index}"))

    def restart_worker(self, index: int) -> None:
        """Start worker ``index`` again with its original command (same KV-event port), as a
        supervisor replacing a crashed worker would; the router finds it through discovery."""
        name = f"worker{index}"
        process = self._process(name)
        if process.popen.poll() is None:
            raise StackError(f"{name} is still running")
        args, env = self._worker_args[name]
        self.processes.remove(process)
        replacement = self._spawn(name, args, env)
        self.processes.remove(replacement)
        self.processes.insert(index, replacement)  # keep the stop order: workers stop last

    def _process(self, name: str) -> _Process:
        for process in self.processes:
            if process.name == name:
                return process
        raise StackError(f"no process named {name} in this stack (have: {', '.join(p.name for p in self.processes)})")

    # --- processes -----------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        assert self.workdir is not None  # set by start()
        env = dict(os.environ)
        env.update(
            DYN_DISCOVERY_BACKEND="file",
            DYN_FILE_KV=str(self.workdir / "discovery"),
            DYN_REQUEST_PLANE="tcp",
            DYN_TCP_RPC_HOST=HOST,
            DYN_TCP_RESPONSE_STREAM_HOST=HOST,
            DYN_EVENT_PLANE_HOST=HOST,
            DYN_SYSTEM_HOST=HOST,
            DYN_SELF_HOST_METADATA="0",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        env.setdefault("DYN_LOG", "warn")
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> _Process:
        assert self.workdir is not None
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:  # a restarted worker keeps its predecessor's log
            popen = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env or self._env(),
                cwd=self.workdir,
                start_new_session=True,
                preexec_fn=terminate_with(os.getpid()),
            )
        process = _Process(name, popen, log)
        self.processes.append(process)
        self.started_groups.append(popen.pid)
        return process

    def _start_workers(self) -> None:
        from tasim.live.stack.engines import worker_commands

        assert self.model_path is not None
        for name, args, extra_env in worker_commands(
            self.engine, self.scenario, self.model_path, self.worker_model_name, self.kv_event_ports, self.time_scale
        ):
            self._worker_args[name] = (args, {**self._env(), **extra_env})
            self._spawn(name, *self._worker_args[name])

    def _start_router(self) -> None:
        assert self.workdir is not None and self.model_path is not None and self.events_path is not None
        config = {
            "scenario": self.scenario.model_dump(mode="json"),
            "model_name": self.model_name,
            "model_path": str(self.model_path),
            "kv_event_endpoints": self.kv_event_endpoints,
            "events_path": str(self.events_path),
            "status_port": self.status_port,
            "time_scale": self.time_scale,
        }
        path = self.workdir / "router.json"
        path.write_text(json.dumps(config))
        self._spawn("router", [sys.executable, "-m", "tasim.live.router.service", str(path)])

    def _start_frontend(self) -> None:
        if not self.dynamo_routes:
            self._spawn("frontend", frontend_command(self.http_port, "direct" if self.pinned else "round-robin"))
            return
        from tasim.live.stack.dynamo_policies import plugin_config

        assert self.workdir is not None
        config = self.workdir / "router-policy.yaml"
        config.write_text(yaml.safe_dump(plugin_config(self.scenario, self.time_scale), sort_keys=False))
        # JSON log lines, with the Rust ThunderAgent's scheduler state changes (its only trace of pauses).
        env = {**self._env(), "DYN_LOGGING_JSONL": "1", "DYN_LOG": "warn,thunderagent=debug"}
        self._spawn("frontend", frontend_command(self.http_port, "kv", "--router-policy-config", str(config)), env)

    def _wait_http(self, url: str, name: str, ok: Callable[[str], bool]) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.popen.poll() is not None:
                    raise StackError(
                        f"{process.name} exited with code {process.popen.returncode} during start-up; see {process.log}: {_tail(process.log)}"
                    )
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if ok(reply.read().decode()):
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.25)
        raise StackError(f"{name} not ready within {self.startup_timeout_s:g} s ({url}); logs in {self.workdir}")

    @staticmethod
    def _terminate(process: _Process, grace_s: float) -> None:
        if process.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(timeout=grace_s)
        _kill(process)  # the group may hold children of the leader (Dynamo spawns none today, vLLM does)


def frontend_command(port: int, router_mode: str, *extra: str) -> list[str]:
    """Dynamo's frontend on ``port`` of 127.0.0.1 with ``--router-mode router_mode``."""
    return [sys.executable, "-m", "dynamo.frontend", "--http-host", HOST, "--http-port", str(port), "--router-mode", router_mode, *extra]


def _kill(process: _Process) -> None:
    """SIGKILL the process's whole group and reap the leader."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.popen.pid, signal.SIGKILL)
    process.popen.wait()


def _post(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else b""
    return _request(urllib.request.Request(url, data=data, method="POST", headers={"content-type": "application/json"}))


def _request(request: urllib.request.Request) -> Any:
    """The router's JSON answer to ``request``."""
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.loads(reply.read() or b"null")
    except (urllib.error.URLError, OSError) as exc:
        raise StackError(f"router did not answer {request.full_url}: {exc}") from None


def _tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip()[-300:] for line in text[-lines:])
