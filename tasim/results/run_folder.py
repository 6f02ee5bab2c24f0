"""A run folder: its files, and its summary recomputed from its event log.

``DIR/events.jsonl`` (or ``.gz``) is the record; ``DIR/summary.json`` is its fold plus the wall
time; ``DIR/run.json`` holds the resolved scenario, the tasim version and the wall time (the one
figure not in the log). Files are replaced only once a run has completed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasim.results.eventlog import EventLogError, find_events, read_events
from tasim.results.metrics import MetricsFold

SUMMARY_FILE = "summary.json"
RUN_FILE = "run.json"


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def report_summary(run_dir: Path) -> dict[str, Any]:
    if not run_dir.is_dir():
        raise EventLogError(f"{run_dir}: not a directory")
    path = find_events(run_dir)
    fold = MetricsFold().apply_all(read_events(path))
    wall = None
    run_file = run_dir / RUN_FILE
    if run_file.exists():
        try:
            wall = json.loads(run_file.read_text()).get("wall_time_s")
        except (ValueError, OSError) as exc:
            raise EventLogError(f"{run_file}: unreadable ({exc.__class__.__name__})") from None
    try:
        return fold.summary(wall_time_s=wall)
    except ValueError as exc:
        raise EventLogError(f"{path}: {exc}") from None
