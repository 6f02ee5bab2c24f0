"""What an RL rollout left behind, read from its event log: did every trajectory finish, was a
request id used twice, is anything still in flight, held or paused, and how many requests did
the busiest worker hold at once.

    python -m lab.rollout_audit RUN_DIR [RUN_DIR ...]

A RUN_DIR is a run folder (``tasim simulate``) or a ``tasim compare`` folder, whose runs are
grouped by policy over their seeds. One line per group: trajectories finished out of those
started, duplicate request ids, requests left in flight, requests held and programs paused at
the end, and the most requests in flight on one worker (routed and not yet finished: what its
engine runs or queues), as a mean over the seeds with its 95 % interval. Exit status 1 when a
run left anything behind. `RolloutAudit` is the same fold for a simulation in progress (the
rollout benchmark feeds it every event as it is emitted).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tasim.core import events as ev
from tasim.results.eventlog import find_events, read_events
from tasim.results.stats import mean_interval


class RolloutAudit:
    """A fold over one run's events; `problems` lists what the run left behind."""

    def __init__(self) -> None:
        self.policy = ""
        self.seed = 0
        self.trajectories = 0  # started by the rollout steps
        self.finished = 0  # ProgramFinished with completed=True
        self.incomplete: list[str] = []  # programs finished without completing
        self.duplicates: list[str] = []  # request ids that arrived more than once
        self.unfinished_requests = 0  # as the run's end reports them
        self.ended = False
        self._arrived: set[str] = set()
        self._open: set[str] = set()
        self._held: set[str] = set()
        self._paused: set[str] = set()
        self._routed_to: dict[str, str] = {}
        self._in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}  # per worker, over the run
        self._handlers: dict[type[ev.Event], Callable[[Any], None]] = {
            ev.RunStarted: self._run_started,
            ev.RolloutStarted: self._rollout_started,
            ev.RequestArrived: self._arrived_request,
            ev.RequestHeld: self._held_request,
            ev.RequestRouted: self._routed,
            ev.RequestFinished: self._ended_request,
            ev.RequestDropped: self._ended_request,
            ev.RequestRetried: self._ended_request,
            ev.ProgramPaused: self._program_paused,
            ev.ProgramResumed: self._program_resumed,
            ev.ProgramFinished: self._program_finished,
            ev.RunEnded: self._run_ended,
        }

    def __call__(self, event: ev.Event) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _run_started(self, e: ev.RunStarted) -> None:
        self.policy, self.seed = e.policy, e.seed
        self._in_flight = dict.fromkeys(e.workers, 0)
        self.max_in_flight = dict.fromkeys(e.workers, 0)

    def _rollout_started(self, e: ev.RolloutStarted) -> None:
        self.trajectories += e.trajectories

    def _arrived_request(self, e: ev.RequestArrived) -> None:
        if e.request in self._arrived:
            self.duplicates.append(e.request)
        self._arrived.add(e.request)
        self._open.add(e.request)

    def _held_request(self, e: ev.RequestHeld) -> None:
        self._held.add(e.request)

    def _routed(self, e: ev.RequestRouted) -> None:
        self._held.discard(e.request)
        self._routed_to[e.request] = e.worker
        count = self._in_flight[e.worker] + 1
        self._in_flight[e.worker] = count
        if count > self.max_in_flight[e.worker]:
            self.max_in_flight[e.worker] = count

    def _ended_request(self, e: ev.RequestFinished | ev.RequestDropped | ev.RequestRetried) -> None:
        self._open.discard(e.request)
        self._held.discard(e.request)
        worker = self._routed_to.pop(e.request, None)
        if worker is not None:
            self._in_flight[worker] -= 1

    def _program_paused(self, e: ev.ProgramPaused) -> None:
        self._paused.add(e.program)

    def _program_resumed(self, e: ev.ProgramResumed) -> None:
        self._paused.discard(e.program)

    def _program_finished(self, e: ev.ProgramFinished) -> None:
        self._paused.discard(e.program)
        if e.completed:
            self.finished += 1
        else:
            self.incomplete.append(e.program)

    def _run_ended(self, e: ev.RunEnded) -> None:
        self.ended = True
        self.unfinished_requests = e.unfinished_requests

    @property
    def left_in_flight(self) -> set[str]:
        """Requests that arrived and never ended."""
        return self._open

    @property
    def still_held(self) -> set[str]:
        """Requests held by the policy and never routed."""
        return self._held

    @property
    def still_paused(self) -> set[str]:
        """Programs paused and neither resumed nor finished."""
        return self._paused

    @property
    def busiest_worker(self) -> int:
        """The most requests one worker had in flight at once."""
        return max(self.max_in_flight.values(), default=0)

    def problems(self) -> list[str]:
        """What the run left behind, one line each; empty for a clean rollout."""
        found = []
        if not self.ended:
            found.append("the log has no run_ended event")
        if self.finished != self.trajectories:
            found.append(f"{self.finished} of {self.trajectories} trajectories finished")
        if self.incomplete:
            found.append(f"{len(self.incomplete)} programs ended incomplete, e.g. {self.incomplete[0]}")
        if self.duplicates:
            found.append(f"{len(self.duplicates)} duplicate request ids, e.g. {self.duplicates[0]}")
        if self._open or self.unfinished_requests:
            found.append(f"{len(self._open)} requests left in flight (the run reports {self.unfinished_requests})")
        if self._held:
            found.append(f"{len(self._held)} requests still held, e.g. {min(self._held)}")
        if self._paused:
            found.append(f"{len(self._paused)} programs still paused, e.g. {min(self._paused)}")
        return found


def audit_log(run_dir: Path) -> RolloutAudit:
    audit = RolloutAudit()
    for event in read_events(find_events(run_dir)):
        audit(event)
    return audit


def run_folders(path: Path) -> list[Path]:
    """``path`` itself when it is a run folder, else the run folders of a compare folder."""
    runs = path / "runs"
    return sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else [path]


def _group(run_dir: Path) -> str:
    """A compare run's folder name less its seed (its policy spec); a run folder's own name."""
    return re.sub(r"-seed\d+$", "", run_dir.name)


def _busiest(values: list[int]) -> str:
    interval = mean_interval([float(v) for v in values])
    spread = "" if interval.no_interval else f" ±{interval.half_width:.1f}"
    return f"{interval.mean:.1f}{spread} ({min(values)}-{max(values)})"


def report(paths: Sequence[Path]) -> tuple[list[str], int]:
    """The table's lines, and how many runs left something behind."""
    groups: dict[str, list[RolloutAudit]] = {}
    faulty = 0
    lines = []
    for path in paths:
        for run_dir in run_folders(path):
            audit = audit_log(run_dir)
            groups.setdefault(_group(run_dir), []).append(audit)
            for problem in audit.problems():
                faulty += 1
                lines.append(f"{run_dir}: {problem}")
    header = ("runs", "seeds", "finished", "dup ids", "in flight", "held", "paused", "busiest worker in flight")
    rows = [header]
    for name, audits in groups.items():
        rows.append(
            (
                name,
                ",".join(str(a.seed) for a in audits),
                "/".join((str(sum(a.finished for a in audits)), str(sum(a.trajectories for a in audits)))),
                str(sum(len(a.duplicates) for a in audits)),
                str(sum(len(a.left_in_flight) for a in audits)),
                str(sum(len(a.still_held) for a in audits)),
                str(sum(len(a.still_paused) for a in audits)),
                _busiest([a.busiest_worker for a in audits]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    table = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return [*table, *lines], faulty


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.rollout_audit", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="a run folder, or a compare folder")
    args = parser.parse_args(argv)
    lines, faulty = report(args.run_dirs)
    print("\n".join(lines))
    return 1 if faulty else 0


if __name__ == "__main__":
    sys.exit(main())
