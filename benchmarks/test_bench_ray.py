"""Ray's overhead per simulation run, against the process pool in the same run.

Sixteen short runs of the tiny scenario (two seeds of eight) go to a private local Ray cluster
(two CPUs, started and stopped inside the measurement, as `compare --ray local` does) and to
the two-process pool. The figure is the extra wall time per run, the cluster's start and stop
included (a few seconds, which dominate for runs this short: Ray pays off for sweeps of long
runs over many machines, not for a laptop's quick comparison)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import RESULTS

from tasim.tools.parallel import LocalPool, RayTasks

pytest.importorskip("ray")

TINY = Path(__file__).resolve().parent.parent / "tests" / "data" / "tiny.yaml"
RUNS = 16


def _plan() -> Any:
    from tasim.tools.comparison import parse_policies, plan_runs

    return plan_runs(str(TINY), parse_policies("round_robin,kv_router"), None, ["duration_s=40"], seeds=RUNS // 2)


def _sweep(backend: Any, out: Path) -> float:
    from tasim.tools.comparison import execute

    started = time.perf_counter()
    execute(_plan(), out, backend, lambda run, summary: None)
    return time.perf_counter() - started


def test_ray_overhead_per_run(benchmark: Any, tmp_path: Path) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    info: dict[str, float] = {}

    def both() -> None:
        pool = _sweep(LocalPool(2), tmp_path / "pool")
        ray = _sweep(RayTasks("local", 2), tmp_path / "ray")
        info.update(pool_s=pool, ray_s=ray, overhead_ms_per_run=(ray - pool) / RUNS * 1e3)

    benchmark.pedantic(both, rounds=1, iterations=1)
    benchmark.extra_info.update(info)
    RESULTS.append(("ray_overhead", info))
