"""The reference hashes (`make reference-hashes`, lab/reference_hashes.py): the committed table
lists exactly the reference set, a run reproduces its recorded digest, and check mode reports
each difference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import reference_hashes
from lab.regression import CASES
from tasim.config.presets import PRESET_DIR

RUNS = {run.key: run for run in reference_hashes.reference_runs()}
SMALLEST_CASE = "regression:rl-live-mocker.yaml:round_robin"  # 727 events
SMALLEST_REPLAY = "replay:multiturn-validation.yaml:workers8-block64-pool32768:round_robin"  # 3,721 events


def test_the_table_lists_exactly_the_reference_set() -> None:
    """A preset, policy or case added without `--update` fails here."""
    assert len(RUNS) == len(reference_hashes.reference_runs())  # no key twice
    assert sorted(reference_hashes.load_table()) == sorted(RUNS)


def test_the_reference_set_covers_every_case_preset_and_mooncake_replay() -> None:
    kinds = [key.split(":")[0] for key in RUNS]
    assert kinds.count("regression") == len(CASES)
    assert {f"regression:{case.key}" for case in CASES} <= set(RUNS)
    assert {key for key in RUNS if key.startswith("preset:")} == {f"preset:{path.name}@300s" for path in PRESET_DIR.glob("*.yaml")}
    assert {key for key in RUNS if key.startswith("mooncake:")} == {"mooncake:mooncake-conversation.yaml", "mooncake:mooncake-synthetic.yaml"}
    assert kinds.count("replay") == 8
    # a preset whose warm-up is as long as the cut would be refused: its warm-up goes
    assert RUNS["preset:swe-agent.yaml@300s"].overrides == ("duration_s=300", "metrics.warmup_s=0")
    assert RUNS["preset:live-mocker.yaml@300s"].overrides == ("duration_s=300",)


@pytest.mark.parametrize("key", [SMALLEST_CASE, SMALLEST_REPLAY])
def test_a_reference_run_reproduces_its_recorded_digest(key: str) -> None:
    assert reference_hashes.digest(RUNS[key]) == reference_hashes.load_table()[key]


def test_check_mode_prints_each_difference_and_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(reference_hashes, "reference_runs", lambda: [RUNS[SMALLEST_CASE]])
    table = tmp_path / "hashes.json"
    recorded = reference_hashes.load_table()[SMALLEST_CASE]

    assert reference_hashes.main(["--update", "--jobs", "1", "--table", str(table)]) == 0
    assert json.loads(table.read_text()) == {SMALLEST_CASE: recorded}
    assert reference_hashes.main(["--jobs", "1", "--table", str(table)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"recorded 1 digests in {table}", "1 runs, 0 difference(s)"]

    changed = {SMALLEST_CASE: {"sha256": "0" * 64, "events": 1}, "preset:gone.yaml@300s": recorded}
    table.write_text(json.dumps(changed))
    assert reference_hashes.main(["--jobs", "1", "--table", str(table)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "preset:gone.yaml@300s: in the table but not in the reference set",
        f"{SMALLEST_CASE}: recorded 000000000000 (1 events), now {recorded['sha256'][:12]} (727 events)",
        "1 runs, 2 difference(s)",
    ]

    assert reference_hashes.main(["--jobs", "1", "--table", str(tmp_path / "none.json")]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{SMALLEST_CASE}: missing from the table (now {recorded['sha256'][:12]}, 727 events)",
        "1 runs, 1 difference(s)",
    ]
