"""Output paths as users give them: relative ones (live mode's stack runs its processes in another
folder), folders that cannot be written (one line and exit 2 before any run, never a traceback),
and live runs on machines that cannot hold them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY, ProcessMark, assert_usage_error, tasim

SHORT = ("--set", "duration_s=40")


@pytest.mark.parametrize(
    ("command", "out", "reason"),
    [
        (("simulate", TINY, *SHORT), "/proc/tasim-x", "No such file or directory"),
        (("compare", TINY, "--policies", "round_robin,kv_router", "--jobs", "2", *SHORT), "/sys/kernel/tasim-x", "Operation not permitted"),
        (("compare", TINY, "--policies", "round_robin,kv_router", "--seeds", "2", *SHORT), "/proc/tasim-x/deeper", "No such file or directory"),
    ],
    ids=["simulate-proc", "compare-sys", "compare-seeds-proc"],
)
def test_an_unwritable_out_is_one_line_and_exit_2(command: tuple[str, ...], out: str, reason: str) -> None:
    result = tasim(*command, "--out", out)
    assert_usage_error(result, f"--out {out}: cannot write there ({reason})")


def test_tune_with_an_unwritable_out_is_one_line_and_exit_2() -> None:
    pytest.importorskip("optuna")
    space = ("--space", "policy.params.pause_threshold=0.9:1.0", "--objective", "calls_per_min", "--trials", "1", "--seeds", "1")
    result = tasim("tune", TINY, "--policy", "thunderagent", *space, *SHORT, "--out", "/proc/tasim-x")
    assert_usage_error(result, "--out /proc/tasim-x: cannot write there (No such file or directory)")


def test_a_file_system_error_mid_command_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """What no check up front can foresee (here: a folder where the summary goes) still ends in
    one line naming the file."""
    (tmp_path / "summary.json").mkdir()
    result = tasim("simulate", TINY, *SHORT, "--out", str(tmp_path), "--quiet")
    assert_usage_error(result, "summary.json", "Is a directory")


def test_live_on_an_engine_that_needs_gpus_is_refused_at_once_without_them(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    started = time.monotonic()
    result = tasim("live", "live-mocker", "--engine", "vllm", "--out", str(tmp_path / "out"))
    assert_usage_error(result, f"--engine vllm needs 2 CUDA GPUs (cluster.backends 2 x cluster.tp 1), torch {torch.__version__} sees 0 here")
    assert time.monotonic() - started < 30 and not (tmp_path / "out").exists()


@pytest.mark.processes
@pytest.mark.slow
def test_live_with_a_relative_out_completes_and_leaves_nothing(tmp_path: Path) -> None:
    """The stack's processes start in its own folder: a relative path handed on as given named
    another file there (the router never found its config)."""
    pytest.importorskip("dynamo")
    mark = ProcessMark()
    command = [sys.executable, "-m", "tasim", "live", "live-mocker", "--programs", "6", "--time-scale", "4", "--out", "rel/dir"]
    result = subprocess.run(command, cwd=tmp_path, env=mark.env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "wrote rel/dir/summary.json" in result.stdout
    summary = json.loads((tmp_path / "rel" / "dir" / "summary.json").read_text())
    assert summary["programs_completed"] == 6 and summary["programs_leaked"] == 0
    assert mark.wait_gone(10) == []
