"""The per-step latency the ThunderAgent paper plots (Figs. 1b and 10), which no summary key
holds: a fold over a run's events, fed as the run goes or from its event log. The paper's agent
step is what tasim calls a turn (one LLM call and the tool call after it), so the metric is
``turn_latency_s``: "step" in tasim is an engine iteration, or an RL training step."""

from __future__ import annotations

from pathlib import Path

from tasim.core import events as ev
from tasim.results.eventlog import find_events, read_events


class TurnLatencyFold:
    """Mean per-turn latency: a turn is one LLM call plus the tool call after it (the paper's
    "reasoning plus acting period"), i.e. from a call's arrival to the arrival of the program's
    next call (holds included); a program's last call ends at its finish. Steps ending inside
    the measurement window (from ``warmup_s``) count, as the summary's requests do."""

    def __init__(self, warmup_s: float) -> None:
        self.warmup_s = warmup_s
        self._started: dict[str, float] = {}
        self._finished: dict[str, float] = {}
        self._total = 0.0
        self._count = 0

    def apply(self, event: ev.Event) -> None:
        if isinstance(event, ev.RequestArrived):
            self._close(event.program, event.t)
            self._started[event.program] = event.t
        elif isinstance(event, ev.RequestFinished):
            self._finished[event.program] = event.t
        elif isinstance(event, ev.ProgramFinished) and event.completed:
            self._close(event.program, self._finished.pop(event.program, event.t))

    def _close(self, program: str, end: float) -> None:
        begin = self._started.pop(program, None)
        if begin is not None and end >= self.warmup_s:
            self._total += end - begin
            self._count += 1

    @property
    def mean_s(self) -> float | None:
        """None when no step ended in the window."""
        return self._total / self._count if self._count else None


def turn_latency(run_dir: Path, warmup_s: float) -> float | None:
    """The mean per-step latency of a run directory's event log."""
    fold = TurnLatencyFold(warmup_s)
    for event in read_events(find_events(run_dir)):
        fold.apply(event)
    return fold.mean_s
