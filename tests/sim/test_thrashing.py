"""KV thrashing shows up on the swe-agent preset with round-robin on one backend."""

from __future__ import annotations

from pathlib import Path

from conftest import SCENARIOS

from tasim.config.scenario import load_scenario
from tasim.sim.simulation import run_simulation


def _run(tmp_path: Path, concurrency: int) -> dict:
    scenario = load_scenario(
        SCENARIOS / "swe-agent.yaml",
        [f"workload.concurrency={concurrency}", "duration_s=900", "metrics.log_kv_events=false"],
    )
    return run_simulation(scenario, tmp_path / f"c{concurrency}")


def test_hit_rate_high_when_working_set_fits(tmp_path: Path) -> None:
    summary = _run(tmp_path, 24)
    assert summary["working_set_ratio"] <= 1.0
    assert summary["prefix_hit_rate"] >= 0.9


def test_hit_rate_collapses_when_working_set_is_3x_pool(tmp_path: Path) -> None:
    summary = _run(tmp_path, 480)
    assert summary["working_set_ratio"] >= 3.0
    assert summary["prefix_hit_rate"] < 0.6
    assert summary["recomputed_tokens"] > 0
