"""Invariant checks for a simulation (``tasim simulate --check``).

Two kinds, both cheap enough to leave on for any run that fits in memory twice over:

* **The event stream** (`EventChecks` sits between the simulation and the log): time never goes
  backwards; a request arrives once, every later event names an open request, and it ends
  exactly once, finished, or dropped or retried with a reason; a program starts once and finishes once,
  and is released later at most once, only if it did not finish released; at
  the end the requests still open are exactly the ones the run reports unfinished, and a run that
  stopped because its workload completed leaves no request or program open (unless the workload
  ends with work in flight by design: an asynchronous RL trainer's last step leaves rollouts
  running).
* **Engine state** (`Engine.audit`, `BlockPool.audit`), after every run of steps a worker
  completes and at the end: block counts are never negative and add up to the pool; every
  cached block is in one extent; reference counts equal the holders that reference each block;
  active blocks are the referenced cached ones plus the requests' private ones; every
  unreferenced block is reachable by eviction; queued requests hold nothing.

A broken invariant raises `InvariantViolation` with one line naming the time, the place and the
invariant.
"""

from __future__ import annotations

from collections.abc import Callable

from tasim.core import events as ev

Emit = Callable[[ev.Event], None]


class InvariantViolation(Exception):
    """A simulation broke one of its invariants: a bug in tasim, not in the input."""


# Events about one request after its arrival, and the two that end it.
_REQUEST_EVENTS = (
    ev.RequestHeld,
    ev.RequestRouted,
    ev.PrefillStarted,
    ev.RequestPreempted,
    ev.RequestReadmitted,
    ev.FirstToken,
)
_REQUEST_ENDS = (ev.RequestFinished, ev.RequestDropped, ev.RequestRetried)


class EventChecks:
    """Checks each event, then passes it on to ``emit``."""

    def __init__(self, emit: Emit, ends_in_flight: bool = False) -> None:
        self._emit = emit
        self._ends_in_flight = ends_in_flight
        self._now = 0.0
        self._duration_s = float("inf")
        self._open_requests: set[str] = set()
        self._ended_requests: set[str] = set()
        self._open_programs: set[str] = set()
        self._ended_programs: set[str] = set()
        self._unreleased_programs: set[str] = set()  # finished, not (yet) released by their clients

    def __call__(self, event: ev.Event) -> None:
        self._check(event)
        self._emit(event)

    def _fail(self, event: ev.Event, problem: str) -> None:
        raise InvariantViolation(f"t={event.t:.6f} {event.TYPE}: {problem}")

    def _check(self, event: ev.Event) -> None:
        if event.t < self._now:
            self._fail(event, f"time went backwards from {self._now:.6f}")
        self._now = event.t
        if isinstance(event, ev.RunStarted):
            self._duration_s = event.duration_s
        elif isinstance(event, ev.RequestArrived):
            if event.request in self._open_requests or event.request in self._ended_requests:
                self._fail(event, f"request {event.request} arrived twice")
            if event.program not in self._open_programs:
                self._fail(event, f"request {event.request} of program {event.program}, which is not running")
            self._open_requests.add(event.request)
        elif isinstance(event, _REQUEST_EVENTS):
            if event.request not in self._open_requests:
                self._fail(event, f"request {event.request} is not open")
        elif isinstance(event, _REQUEST_ENDS):
            if event.request not in self._open_requests:
                self._fail(event, f"request {event.request} ended but is not open")
            if isinstance(event, (ev.RequestDropped, ev.RequestRetried)) and not event.reason.strip():
                self._fail(event, f"request {event.request} {'dropped' if isinstance(event, ev.RequestDropped) else 'retried'} without a reason")
            self._open_requests.remove(event.request)
            self._ended_requests.add(event.request)
        elif isinstance(event, ev.ProgramStarted):
            if event.program in self._open_programs or event.program in self._ended_programs:
                self._fail(event, f"program {event.program} started twice")
            self._open_programs.add(event.program)
        elif isinstance(event, ev.ProgramFinished):
            if event.program not in self._open_programs:
                self._fail(event, f"program {event.program} finished but is not running")
            self._open_programs.remove(event.program)
            self._ended_programs.add(event.program)
            if not event.released:
                self._unreleased_programs.add(event.program)
        elif isinstance(event, ev.ProgramReleased):
            if event.program not in self._unreleased_programs:
                self._fail(event, f"program {event.program} released but it is not a finished, unreleased program")
            self._unreleased_programs.remove(event.program)
        elif isinstance(event, ev.RunEnded):
            self._check_end(event)

    def _check_end(self, event: ev.RunEnded) -> None:
        if event.unfinished_requests != len(self._open_requests):
            self._fail(event, f"reports {event.unfinished_requests} unfinished requests, {len(self._open_requests)} are open")
        if event.t < self._duration_s and not self._ends_in_flight and (self._open_requests or self._open_programs):
            open_ones = sorted(self._open_requests)[:3] + sorted(self._open_programs)[:3]
            self._fail(event, f"the workload completed with requests or programs still open: {', '.join(open_ones)}")
