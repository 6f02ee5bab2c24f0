"""The paper's per-step latency, which no summary key holds, folded from a run's event log."""

from __future__ import annotations

from pathlib import Path

from tasim import events as ev
from tasim.eventlog import find_events, read_events


def step_latency(run_dir: Path, warmup_s: float) -> float | None:
    """Mean per-step latency from the event log: a step is one LLM call plus the tool call after
    it (the paper's "reasoning plus acting period"), i.e. from a call's arrival to the arrival of
    the program's next call (holds included); a program's last call ends at its finish. Steps
    ending inside the measurement window count, as the summary's requests do."""
    started: dict[str, float] = {}
    finished: dict[str, float] = {}
    total, count = 0.0, 0

    def close(program: str, end: float) -> None:
        nonlocal total, count
        begin = started.pop(program, None)
        if begin is not None and end >= warmup_s:
            total += end - begin
            count += 1

    for event in read_events(find_events(run_dir)):
        if isinstance(event, ev.RequestArrived):
            close(event.program, event.t)
            started[event.program] = event.t
        elif isinstance(event, ev.RequestFinished):
            finished[event.program] = event.t
        elif isinstance(event, ev.ProgramFinished) and event.completed:
            close(event.program, finished.pop(event.program, event.t))
    return total / count if count else None
