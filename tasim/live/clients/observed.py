"""The event log of a live run that tasim does not route, written from the client's side.

When Dynamo's own plug-in decides (``live.routing: dynamo-*``) no tasim router sees the calls,
so the driver records what it observes of each one in the simulator's event types, and `tasim
report`, ``--compare-sim`` and the event checks work on that log as on the router's:

* a program starts with its first call and finishes when its client releases it;
* a call arrives when it is sent, and is routed when its first chunk names the worker Dynamo
  chose (``nvext.worker_id``), which is also its first token: a call Dynamo holds (ThunderAgent's
  pauses) shows as time between its arrival and its routing, as a held call does in tasim's log,
  though without a ``RequestHeld`` event, since the client cannot see the hold itself;
* a call finishes with the engine's usage (prompt, completion and cached tokens), or is dropped.

Times are the run's wall clock times ``time_scale``, as the router's are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tasim.core import events as ev
from tasim.results.eventlog import EventWriter


@dataclass(slots=True)
class _Program:
    turn: int = 0  # completed turns
    calls: int = 0  # calls of the current turn so far
    history_tokens: int = 0
    context_tokens: int = 0
    failed: bool = False


@dataclass(frozen=True, slots=True)
class _Call:
    program: str
    request: str


class ObservedCalls:
    """Writes ``header`` at once, then what `sent`, `routed`, `finished`, `failed` and
    `released` report, and `close` ends the log with the calls still open."""

    def __init__(self, writer: EventWriter, header: ev.RunStarted, time_scale: float = 1.0) -> None:
        self.writer = writer
        self.time_scale = time_scale
        self.programs: dict[str, _Program] = {}
        self._open: dict[str, _Call] = {}
        self._t0 = time.monotonic()
        writer.write(header)

    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.time_scale

    def sent(self, program: str, prompt_tokens: int, max_tokens: int) -> str:
        """A call of ``program`` went out; its request id."""
        now = self.now()
        state = self.programs.get(program)
        if state is None:
            state = self.programs[program] = _Program()
            self.writer.write(ev.ProgramStarted(now, program, 0))
        state.calls += 1
        request = f"{program}.{state.turn}" + (f"r{state.calls}" if state.calls > 1 else "")
        self._open[request] = _Call(program, request)
        self.writer.write(ev.RequestArrived(now, request, program, state.turn, prompt_tokens, state.history_tokens, max_tokens))
        return request

    def routed(self, request: str, worker: str) -> None:
        """The call's first chunk came, from ``worker``."""
        now = self.now()
        self.writer.write(ev.RequestRouted(now, request, worker))
        self.writer.write(ev.FirstToken(now, request))

    def finished(self, request: str, worker: str, prompt_tokens: int, output_tokens: int, cached_tokens: int) -> None:
        call = self._open.pop(request)
        state = self.programs[call.program]
        state.turn += 1
        state.calls = 0
        state.failed = False
        state.history_tokens = state.context_tokens = prompt_tokens + output_tokens
        self.writer.write(ev.RequestFinished(self.now(), request, call.program, worker, prompt_tokens, output_tokens, cached_tokens))

    def failed(self, request: str, worker: str, reason: str) -> None:
        call = self._open.pop(request)
        self.programs[call.program].failed = True
        self.writer.write(ev.RequestDropped(self.now(), request, call.program, worker, reason))

    def released(self, program: str) -> None:
        """The client released the program (its session-final went out)."""
        state = self.programs.pop(program, None)
        if state is not None:
            self.writer.write(ev.ProgramFinished(self.now(), program, state.context_tokens, state.turn > 0 and not state.failed))

    def close(self) -> None:
        """End the log; programs never released finish unreleased, as the simulator ends them."""
        now = self.now()
        for program, state in self.programs.items():
            self.writer.write(ev.ProgramFinished(now, program, state.context_tokens, state.turn > 0 and not state.failed, False))
        self.programs.clear()
        self.writer.write(ev.RunEnded(now, 0, len(self._open)))
        self.writer.close()
