"""Sweeps on Ray: a private local cluster and a running one joined by address give the same
runs as the process pool (event logs byte for byte), and every Ray process started is stopped."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY, assert_usage_error, tasim

pytestmark = pytest.mark.processes  # starts real processes (make test-fast leaves it out)

pytest.importorskip("ray")

ARGS = ("--set", "duration_s=40", "--policies", "round_robin,kv_router", "--seeds", "2", "--jobs", "2")
RAY = str(Path(sys.executable).parent / "ray")


def _ray_processes() -> set[str]:
    found = subprocess.run(["pgrep", "-f", "raylet|gcs_server"], capture_output=True, text=True).stdout.split()
    return set(found)


def _runs(out: Path) -> dict[str, Any]:
    data = json.loads((out / "compare.json").read_text())
    return {f"{r['spec']}-seed{r['seed']}": {k: v for k, v in r["summary"].items() if k != "wall_time_s"} for r in data["runs"]}


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pool")
    result = tasim("compare", TINY, *ARGS, "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def _same_runs(out: Path, pooled: Path) -> None:
    assert _runs(out) == _runs(pooled)
    for name in _runs(pooled):
        assert (out / "runs" / name / "events.jsonl").read_bytes() == (pooled / "runs" / name / "events.jsonl").read_bytes(), name


def test_a_private_local_ray_cluster_gives_the_pools_runs_and_stops(tmp_path: Path, pooled: Path) -> None:
    before = _ray_processes()
    result = tasim("compare", TINY, *ARGS, "--ray", "local", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "Token authentication" not in result.stderr  # Ray's opt-out notice is not the user's concern
    _same_runs(tmp_path, pooled)
    assert _ray_processes() <= before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_running_cluster_joined_by_address_gives_the_pools_runs(tmp_path: Path, pooled: Path) -> None:
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    head = ["--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"]
    subprocess.run([RAY, "start", *head], check=True, capture_output=True, env=env, timeout=120)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tasim", "compare", TINY, *ARGS, "--ray", f"127.0.0.1:{port}", "--out", str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        _same_runs(tmp_path, pooled)
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, env=env, timeout=120)


@pytest.mark.parametrize(
    ("address", "fragment"),
    [
        ("127.0.0.1:1", "--ray 127.0.0.1:1: no Ray cluster answers there"),
        ("nowhere", "--ray nowhere: expected local, auto or HOST:PORT"),
    ],
)
def test_an_unreachable_ray_address_is_one_line_and_exit_2(tmp_path: Path, address: str, fragment: str) -> None:
    assert_usage_error(tasim("compare", TINY, "--policies", "round_robin", "--ray", address, "--out", str(tmp_path / "out")), fragment)
    assert not (tmp_path / "out" / "runs").exists()


# Ctrl-C handed by the kernel to one of the pool's threads, not the main one (which of a
# process's threads gets a signal is the kernel's choice): the launcher must still stop at once.
_SIGNAL_TO_A_POOL_THREAD = """
import signal, sys, threading, time
from tasim.tools.parallel import map_in_processes

signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, even if the tests run in the background

def interrupt_a_pool_thread():
    time.sleep(1.0)
    pool_thread = next(t for t in threading.enumerate() if t is not threading.main_thread() and t is not threading.current_thread())
    signal.pthread_kill(pool_thread.ident, signal.SIGINT)
    print(time.monotonic(), flush=True)

threading.Thread(target=interrupt_a_pool_thread, daemon=True).start()
try:
    map_in_processes(time.sleep, [60, 60], 2)
except KeyboardInterrupt:
    print(time.monotonic(), flush=True)
"""


def test_ctrl_c_received_by_a_pool_thread_stops_the_launcher_at_once() -> None:
    done = subprocess.run([sys.executable, "-c", _SIGNAL_TO_A_POOL_THREAD], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    sent, interrupted = (float(line) for line in done.stdout.split())
    assert interrupted - sent < 2.0  # not when a run ends (60 s)
