"""End-to-end shape on the swe-agent preset (one backend, thrashing regime): ThunderAgent keeps
its prefix hits and out-runs round-robin; Continuum sits in between."""

from __future__ import annotations

from pathlib import Path

from conftest import SCENARIOS
from tasim.rundir import run_simulation
from tasim.scenario import load_scenario


def _run(tmp_path: Path, policy: str) -> dict:
    scenario = load_scenario(
        SCENARIOS / "swe-agent.yaml",
        ["workload.concurrency=96", "duration_s=900", f"policy.name={policy}"],
    )
    return run_simulation(scenario, tmp_path / policy)


def test_thunderagent_beats_round_robin_when_kv_thrashes(tmp_path: Path) -> None:
    rr = _run(tmp_path, "round_robin")
    ta = _run(tmp_path, "thunderagent")
    cont = _run(tmp_path, "continuum")
    assert rr["prefix_hit_rate"] <= 0.5
    assert ta["prefix_hit_rate"] >= 0.85
    assert ta["steps_per_min"] >= 1.5 * rr["steps_per_min"]
    assert ta["pauses"] > 0 and ta["resumes"] > 0
    assert rr["steps_per_min"] < cont["steps_per_min"] < ta["steps_per_min"]
    assert cont["pins"] > 0
