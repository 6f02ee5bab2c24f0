"""Commands that start processes leave none behind, however they end: SIGTERM or SIGHUP to the
command, Ctrl-C at its terminal (SIGINT to its whole process group), or a run that fails."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import REPO, ProcessMark

from tasim.tools.parallel import map_in_processes

pytestmark = [pytest.mark.processes, pytest.mark.slow]

# Runs of several seconds each, so the command is mid-run when the signal comes.
COMPARE = ("compare", "swe-agent-2x", "--policies", "round_robin,thunderagent", "--seeds", "2", "--set", "workload.concurrency=96")


def _ctrl_c_as_in_a_terminal() -> None:
    """A foreground command at a terminal has SIGINT at its default; tests started in the
    background by a shell without job control inherit it ignored, and so would the command."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(mark: ProcessMark, out: Path, *more: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tasim", *COMPARE, "--out", str(out), *more]
    # its own process group, so a SIGINT sent to the group reaches it and its workers, as a terminal's Ctrl-C does
    return subprocess.Popen(
        command,
        env=mark.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )


def _wait_for(mark: ProcessMark, count: int, within_s: float = 120) -> None:
    deadline = time.monotonic() + within_s
    while len(mark.alive()) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(mark.alive()) >= count
    time.sleep(1.0)  # the runs are under way


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_compare_leaves_no_process_within_5_s(sig: int, tmp_path: Path) -> None:
    mark = ProcessMark()
    cli = _start(mark, tmp_path / "out", "--jobs", "2")
    _wait_for(mark, 3)  # the command and its two pool workers
    cli.send_signal(sig)
    assert mark.wait_gone(5) == []
    assert cli.wait(5) == 128 + sig
    assert "Traceback" not in cli.stderr.read()  # type: ignore[union-attr]
    assert not (tmp_path / "out" / "compare.json").exists()


SEARCHES = {
    "tune": ("tune", "swe-agent-2x", "--policy", "thunderagent", "--space", "policy.params.pause_threshold=0.8:1", "--objective", "calls_per_min"),
    "calibrate": (
        "calibrate",
        "swe-agent",
        "--against",
        str(REPO / "measurements" / "thunderagent-paper.yaml"),
        "--fit",
        "cluster.perf.mfu=0.2:0.8",
        "--points",
        "fig5-swe-agent-ta-hit-24,fig5-swe-agent-vllm-hit-24",
    ),
}


@pytest.mark.parametrize("search", list(SEARCHES))
def test_sigterm_to_a_search_leaves_no_process_within_5_s(search: str, tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    mark = ProcessMark()
    command = [sys.executable, "-m", "tasim", *SEARCHES[search], "--jobs", "2", "--out", str(tmp_path / "out")]
    cli = subprocess.Popen(command, env=mark.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for(mark, 3)
    cli.send_signal(signal.SIGTERM)
    assert mark.wait_gone(5) == []
    assert cli.wait(5) == 128 + signal.SIGTERM
    assert "Traceback" not in cli.stderr.read()  # type: ignore[union-attr]


def test_ctrl_c_stops_compare_and_its_workers_without_a_traceback_from_each(tmp_path: Path) -> None:
    mark = ProcessMark()
    cli = _start(mark, tmp_path / "out", "--jobs", "2")
    _wait_for(mark, 3)
    import os

    os.killpg(cli.pid, signal.SIGINT)
    assert mark.wait_gone(5) == []
    assert cli.wait(5) == 130
    assert cli.stderr.read().strip().splitlines()[-1] == "interrupted"  # type: ignore[union-attr]


def test_sigterm_to_compare_on_a_private_ray_cluster_stops_the_cluster_and_leaves_no_scratch(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pytest.importorskip("ray")
    mark = ProcessMark()
    # the command's temporary folder, to look into after; short, as Ray's sockets live in it
    temp = Path(tempfile.mkdtemp(prefix="tasim-test-"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    command = [sys.executable, "-m", "tasim", *COMPARE, "--out", str(tmp_path / "out"), "--ray", "local", "--jobs", "2"]
    cli = subprocess.Popen(command, env=mark.env(TMPDIR=str(temp)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(mark, 4)  # the command, Ray's GCS server, raylet and a worker at least
    deadline = time.monotonic() + 60
    while not list(temp.rglob("tasim-run-*")) and cli.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # wait for tasks to be simulating, not for Ray to start
    assert list(temp.rglob("tasim-run-*"))
    cli.send_signal(signal.SIGTERM)
    assert mark.wait_gone(10) == []
    assert cli.wait(5) != 0
    assert list(temp.rglob("tasim-run-*")) == []  # the tasks' scratch folders went with the sweep's


def _sleep_then_fail(seconds: float) -> float:
    if seconds < 0:
        raise ValueError("a failed run")
    time.sleep(seconds)
    return seconds


def test_a_failed_run_ends_the_runs_still_going_at_once() -> None:
    """The pool used to wait for the running items (minutes, for long simulations) before the
    failure reached the caller."""
    started = time.monotonic()
    with pytest.raises(ValueError, match="a failed run"):
        map_in_processes(_sleep_then_fail, [60.0, -1.0], jobs=2)
    assert time.monotonic() - started < 10
