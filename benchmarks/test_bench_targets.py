"""The speed and memory targets. Each run is the main job (`run_simulation`: event log
written to disk, metrics folded) in a fresh process, so its peak RSS is its own. The peak is
the process's own high-water mark (``VmHWM``): ``ru_maxrss`` survives exec on Linux, so a child
of a large pytest process would report its parent's peak. Where the compiled simulator core is in
use (`tasim.native`), the wall-limited runs are measured with the plain modules too, in the same
run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RESULTS

from tasim import native

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "scenarios"

_CHILD = """
import json, sys, time
from pathlib import Path
from tasim.sim.simulation import run_simulation
from tasim.config.scenario import load_scenario
scenario = load_scenario(Path(sys.argv[1]), sys.argv[3:])
started = time.perf_counter()
summary = run_simulation(scenario, Path(sys.argv[2]))
print(json.dumps({
    "wall_s": time.perf_counter() - started,
    "peak_rss_mib": next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) / 1024,
    "requests_completed": summary["requests_completed"],
    "sim_time_s": summary["sim_time_s"],
    "engine_iterations": summary["engine_iterations"],
}))
"""


def _measure(preset: str, overrides: list[str], out: Path, plain: bool = False) -> dict:
    env = {**os.environ, native.DISABLE: "0"} if plain else None
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(PRESETS / preset), str(out), *overrides],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


TARGETS = {
    # name: (preset, overrides, wall-time limit in seconds or None)
    "swe-agent, 96 programs, one simulated hour": (
        "swe-agent.yaml",
        ["workload.concurrency=96", "duration_s=3600"],
        20.0,
    ),
    "rl-rollout, concurrency 512, 2 replicas, one simulated hour": (
        "rl-rollout.yaml",
        ["workload.max_concurrency=512", "cluster.backends=2", "duration_s=3600"],
        60.0,
    ),
    # 10,000 ten-turn programs on 8 mocker-sized workers: 100,000 requests.
    "100k requests": (
        "multiturn-validation.yaml",
        ["workload.programs=10000", "workload.turns=10", "workload.concurrency=512", "cluster.backends=8", "duration_s=1000000"],
        None,
    ),
}


@pytest.mark.parametrize("name", list(TARGETS))
def test_speed_and_memory_targets(benchmark, name: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    preset, overrides, wall_limit = TARGETS[name]
    runs: list[dict] = []
    benchmark.pedantic(lambda: runs.append(_measure(preset, overrides, tmp_path / "run")), rounds=1, iterations=1)
    figures = runs[0]
    figures["native"] = native.in_use()
    if wall_limit is not None and native.in_use():  # the plain modules beside the compiled ones (tasim.native)
        figures["plain_wall_s"] = _measure(preset, overrides, tmp_path / "plain", plain=True)["wall_s"]
        figures["plain_over_compiled"] = figures["plain_wall_s"] / figures["wall_s"]
    benchmark.extra_info.update(figures)
    RESULTS.append((name, figures))
    assert figures["peak_rss_mib"] < 1024
    if name == "100k requests":
        assert figures["requests_completed"] == 100_000
    if wall_limit is not None:
        assert figures["wall_s"] < wall_limit, f"{name}: {figures['wall_s']:.1f} s wall, target < {wall_limit:.0f} s"


# The swe-agent hour with a host tier twice the GPU pool, against the same hour without. At the
# preset's 48 programs the hour serves the same calls either way. At 96 the GPU pool thrashes
# (prefix hit rate 0.08) and the tier turns that into hits: the hour serves 4.4 times the calls
# in 2.9 times the steps, so the raw wall ratio measures the workload; the simulator's own cost
# is the wall time per call served, held to the target at both.
TIERED_HOURS = {
    "48 programs (the preset)": ["duration_s=3600"],
    "96 programs": ["workload.concurrency=96", "duration_s=3600"],
}


@pytest.mark.parametrize("programs", list(TIERED_HOURS))
def test_a_host_tier_costs_at_most_half_again(benchmark, programs: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    overrides = TIERED_HOURS[programs]
    runs: list[dict] = []
    tiered = [*overrides, "cluster.engine.host_tier.ratio=2"]
    benchmark.pedantic(lambda: runs.append(_measure("swe-agent.yaml", tiered, tmp_path / "tiered")), rounds=1, iterations=1)
    figures = runs[0]
    gpu_only = _measure("swe-agent.yaml", overrides, tmp_path / "gpu-only")
    figures["gpu_only_wall_s"] = gpu_only["wall_s"]
    figures["gpu_only_requests_completed"] = gpu_only["requests_completed"]
    figures["tiered_over_gpu_only"] = figures["wall_s"] / gpu_only["wall_s"]
    figures["per_call_tiered_over_gpu_only"] = figures["tiered_over_gpu_only"] * gpu_only["requests_completed"] / figures["requests_completed"]
    figures["native"] = native.in_use()
    benchmark.extra_info.update(figures)
    RESULTS.append((f"swe-agent hour, {programs}, with a host tier (ratio 2)", figures))
    assert figures["peak_rss_mib"] < 1024
    assert figures["per_call_tiered_over_gpu_only"] <= 1.5, (
        f"{figures['wall_s']:.1f} s for {figures['requests_completed']} calls with the tier, "
        f"{gpu_only['wall_s']:.1f} s for {gpu_only['requests_completed']} without"
    )
