"""The rollout audit (lab/rollout_audit.py): a clean rollout leaves nothing behind, each kind of
leftover is named, in-flight counts follow routes and ends per worker, and the command groups a
compare folder's runs by policy over their seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCENARIOS

from lab.rollout_audit import RolloutAudit, audit_log, main
from tasim.config.scenario import load_scenario
from tasim.core import events as ev
from tasim.results.eventlog import EVENTS_PLAIN, EventWriter
from tasim.sim.simulation import run_simulation


def _header() -> ev.RunStarted:
    return ev.RunStarted(0.0, "s", "p", 0, 100.0, ("w0", "w1"), 16, 100, 0.0)


def _request(t: float, request: str, program: str = "p0") -> ev.RequestArrived:
    return ev.RequestArrived(t, request, program, 0, 10, 0, 5)


def _finished(t: float, request: str, worker: str, program: str = "p0") -> ev.RequestFinished:
    return ev.RequestFinished(t, request, program, worker, 10, 5, 0)


def _fold(events: list[ev.Event]) -> RolloutAudit:
    audit = RolloutAudit()
    for event in events:
        audit(event)
    return audit


def test_a_held_and_paused_rollout_leaves_nothing_behind(tmp_path: Path) -> None:
    """rl-live-mocker under ThunderAgent pauses programs and holds requests, then finishes."""
    seen = RolloutAudit()
    run_simulation(load_scenario(SCENARIOS / "rl-live-mocker.yaml"), tmp_path, observe=seen)
    audit = audit_log(tmp_path)
    assert audit.problems() == seen.problems() == []
    assert audit.trajectories == audit.finished == 32
    assert audit.busiest_worker == seen.busiest_worker > 0
    assert seen.still_held == seen.still_paused == seen.left_in_flight == set()


def test_each_leftover_is_named() -> None:
    audit = _fold(
        [
            _header(),
            ev.RolloutStarted(0.0, 0, 3),
            ev.ProgramStarted(0.0, "p0", 1),
            _request(0.0, "r0"),
            ev.RequestRouted(0.0, "r0", "w0"),
            _request(1.0, "r0"),  # the same id again
            _request(1.0, "r1"),
            ev.RequestHeld(1.0, "r1", "p0"),
            ev.ProgramPaused(1.0, "p1"),
            ev.ProgramFinished(2.0, "p2", 0, completed=False),
            ev.RunEnded(3.0, 10, 2),
        ]
    )
    assert audit.problems() == [
        "0 of 3 trajectories finished",
        "1 programs ended incomplete, e.g. p2",
        "1 duplicate request ids, e.g. r0",
        "2 requests left in flight (the run reports 2)",
        "1 requests still held, e.g. r1",
        "1 programs still paused, e.g. p1",
    ]
    assert _fold([_header()]).problems() == ["the log has no run_ended event"]


def test_in_flight_counts_follow_routes_and_ends_per_worker() -> None:
    audit = _fold(
        [
            _header(),
            *(_request(0.0, r) for r in ("a", "b", "c")),
            ev.RequestRouted(0.0, "a", "w0"),
            ev.RequestRouted(0.0, "b", "w0"),
            _finished(1.0, "a", "w0"),
            ev.RequestRouted(1.0, "c", "w0"),  # a's place: w0 never holds more than two
            ev.RequestRetried(2.0, "b", "p0", "w0", "worker lost"),
            _finished(3.0, "c", "w0"),
            ev.RunEnded(3.0, 10, 0),
        ]
    )
    assert audit.max_in_flight == {"w0": 2, "w1": 0} and audit.busiest_worker == 2
    assert audit.left_in_flight == set()


def _write_log(folder: Path, events: list[ev.Event]) -> None:
    folder.mkdir(parents=True)
    writer = EventWriter(folder / EVENTS_PLAIN)
    for event in events:
        writer.write(event)
    writer.close()


def _clean_run(seed: int, busiest: int) -> list[ev.Event]:
    requests = [f"r{i}" for i in range(busiest)]
    return [
        ev.RunStarted(0.0, "s", "p", seed, 100.0, ("w0", "w1"), 16, 100, 0.0),
        ev.RolloutStarted(0.0, 0, 1),
        *(_request(0.0, r) for r in requests),
        *(ev.RequestRouted(0.0, r, "w1") for r in requests),
        *(_finished(1.0, r, "w1") for r in requests),
        ev.ProgramFinished(1.0, "p0", 10, completed=True),
        ev.RunEnded(2.0, 5, 0),
    ]


def test_the_command_groups_a_compare_folders_runs_over_their_seeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for seed, busiest in ((0, 3), (1, 5)):
        _write_log(tmp_path / "compare" / "runs" / f"kv_router-seed{seed}", _clean_run(seed, busiest))
    assert main([str(tmp_path / "compare")]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["runs", "seeds", "finished"]
    assert row.split()[:7] == ["kv_router", "0,1", "2/2", "0", "0", "0", "0"]
    assert row.endswith("4.0 ±12.7 (3-5)")

    broken = _clean_run(2, 1)[:-1]  # no run_ended
    _write_log(tmp_path / "broken", broken)
    assert main([str(tmp_path / "broken")]) == 1
    assert f"{tmp_path / 'broken'}: the log has no run_ended event" in capsys.readouterr().out.splitlines()
