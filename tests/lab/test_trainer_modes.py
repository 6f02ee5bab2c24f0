"""lab.trainer_modes: per mode and policy, means with intervals and the paired ratio to sync."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.trainer_modes import main, table


def _run(mode: str, seed: int, step_tokens: float) -> dict[str, object]:
    rollout = {
        "steps": 2,
        "step_tokens_per_s": step_tokens,
        "trainer_idle_share": 0.5,
        "staleness_worst": {"mean": 1.0 if mode != "sync" else 0.0},
        "group_completion_s": {"p99": 100.0},
        "interrupted_output_tokens": 40 * (mode != "sync"),
        "recomputed_prompt_tokens": 1000 * (mode != "sync"),
    }
    return {"spec": "thunderagent", "overrides": {"workload.mode": mode}, "summary": {"seed": seed, "rollout": rollout}}


COMPARE = {"runs": [_run("sync", 0, 100.0), _run("sync", 1, 200.0), _run("separate_async", 0, 150.0), _run("separate_async", 1, 300.0)]}


def test_rows_give_means_and_the_ratio_to_the_same_policys_sync_paired_by_seed() -> None:
    rows = table(COMPARE)
    assert rows[1][:2] == ["sync", "thunderagent"] and rows[1][2].startswith("150 ±") and rows[1][-1] == "-"
    # both seeds 1.5x their sync: the same ratio at every seed, no interval
    assert rows[2] == ["separate_async", "thunderagent", "225 ±953", "0.50", "1.00", "100", "20", "500", "1.500×"]


def test_a_folder_without_a_finished_rollout_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "compare.json").write_text(json.dumps({"runs": [{"spec": "x", "overrides": {}, "summary": {"seed": 0, "rollout": None}}]}))
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'compare.json'}: no rl_rollout run in it completed a step\n"
