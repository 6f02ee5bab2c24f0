"""The live policy host: the router's program table around one tasim policy, on asyncio.

It does for live traffic what `tasim.sim.runner.Simulation` does in simulated time: turns each
incoming call into a `RequestSpec` (block hashes from the token ids, exactly as Dynamo computes
them), asks the policy, holds the call while its program is paused, applies the policy's
program decisions, reports first tokens, turn ends (with the engine's real usage), program ends
and the workers' KV events, and appends the same typed events to the log. Nothing here talks to
Dynamo: the router component (`tasim.live.router`) moves the bytes, so this class can be tested
and benchmarked on its own.

Failure semantics: a call that fails or is cancelled leaves the program table as it was before
the call (its turn number and history are unchanged, and a program that this call created is
forgotten again); the policy hears ``TurnEnd(ok=False)`` for it, as it would in simulation.

Program ends: a session-final ends its program; one for a program the table does not hold (never
seen, already ended, expired) is an idempotent success, only counted. A session-final that comes
while a call of the program is in flight ends the program when its last call has ended, so the
policy hears that turn end before the program end and the log keeps its order. A program with no
call in flight or held, idle longer than ``idle_ttl_s``, is ended as if its session-final had
come: clients that never send one (ThunderAgent upstream has no such TTL; Dynamo's port expires
after 600 s) would otherwise grow the table, and the policy's capacity accounting, without bound.
Idle programs are kept in the order they went idle, so expiry, checked at every call and policy
tick, costs one step per expired program.

Lost workers: `worker_lost` takes a worker out of service (its cache with it) and tells the
policy, which places that worker's programs elsewhere; `retry` sends a call that was in flight on
it again, as a new call of the same turn, without the program noticing (no failed turn, no
program end in between). `worker_joined` brings a worker back. While no worker serves, calls are
refused with `NoWorkerServing`.

A resumed call is routed (in flight, logged) in the same step as the policy's `Resume`, not when
its waiting task next runs, so no tick or program end can come between a resume and the routing
(ThunderAgent's upstream race: a pause between the paused check and backend resolution left a
request without a backend, HTTP 500).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tasim import events as ev
from tasim.live.hashing import chain_from, sequence_hashes
from tasim.live.kv_events import KvEvent
from tasim.model import BlockHash, RequestSpec
from tasim.policies import Hold, Pause, Pin, Policy, Resume, Route, TurnEnd
from tasim.policies.base import ProgramDecision

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
Emit = Callable[[ev.Event], None]


# Session ids are kept in the program table and written in every event of the log; real ones
# are UUIDs or short names, so a longer one is refused rather than stored.
MAX_PROGRAM_ID_CHARS = 256


class InvalidProgramId(ValueError):
    """A session (or parent session) id the router refuses; the call changed nothing."""


class NoWorkerServing(RuntimeError):
    """Every worker is lost, so a call cannot be placed; a new call changed nothing."""


@dataclass(slots=True)
class _Program:
    id: str
    one_off: bool
    parent: str | None = None  # x-dynamo-parent-session-id: e.g. the prompt group of a rollout
    turn: int = 0  # completed turns
    turn_calls: int = 0  # calls of this turn so far, so a retried or concurrent call gets an id of its own
    history_tokens: int = 0  # prompt + output of the last completed turn
    context_tokens: int = 0
    failed: bool = False  # its latest call failed
    ending: bool = False  # a session-final came while a call was in flight
    in_flight: int = 0
    held: list[Held] = field(default_factory=list)  # calls waiting for a resume (concurrent calls: several)
    hash_tokens: list[int] = field(default_factory=list)  # tokens behind `hashes` (full blocks)
    hashes: list[BlockHash] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Call:
    """One admitted LLM call: route it to ``worker``, then report on it with this object."""

    spec: RequestSpec
    worker: str
    held_s: float
    created: bool  # this call created its program


@dataclass(frozen=True, slots=True)
class Held:
    """A call the policy holds until it resumes the program; `PolicyHost.wait` for it."""

    spec: RequestSpec
    future: asyncio.Future[Call]  # the call, routed when the policy resumed its program
    created: bool  # this call created its program
    since: float


class PolicyHost:
    """``idle_ttl_s``: end programs idle longer than this (seconds of ``clock``); None: never."""

    def __init__(
        self, policy: Policy, clock: Clock, emit: Emit, block_size: int, log_kv_events: bool = False, idle_ttl_s: float | None = None
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.emit = emit
        self.block_size = block_size
        self.log_kv_events = log_kv_events
        self.idle_ttl_s = idle_ttl_s
        self.programs: dict[str, _Program] = {}
        # Programs with no call in flight or held, oldest first, with the time they went idle.
        self._idle: OrderedDict[str, float] = OrderedDict()
        self.routed: dict[str, int] = {w: 0 for w in policy.view.worker_ids}
        self.in_flight_on: dict[str, int] = {w: 0 for w in policy.view.worker_ids}
        self.in_flight = 0
        self.finished = 0
        self.failed = 0
        self.pauses = 0
        self.resumes = 0
        self.ignored_pins = 0
        self.expired = 0  # programs ended by the idle TTL
        self.unknown_finals = 0  # session-finals for programs not in the table
        self.retried = 0  # calls sent again because their worker was lost
        self.refused = 0  # calls refused because no worker was serving
        self.lost: set[str] = set()  # workers out of service
        self.decision_seconds: deque[float] = deque(maxlen=100_000)  # policy + hashing time per decision
        self._one_offs = 0
        self._cached: dict[str, set[BlockHash]] = {w: set() for w in policy.view.worker_ids}

    # --- calls ---------------------------------------------------------------------------------

    async def admit(self, program_id: str | None, token_ids: list[int], max_tokens: int, parent: str | None = None) -> Call:
        """Route one call; waits while the policy holds it. ``program_id`` None: a one-off
        request, a program of its own that ends with it."""
        admission = self.decide(program_id, token_ids, max_tokens, parent)
        return admission if isinstance(admission, Call) else await self.wait(admission)

    def decide(self, program_id: str | None, token_ids: list[int], max_tokens: int, parent: str | None = None) -> Call | Held:
        """The policy's decision for one call, without waiting: a routed `Call`, or a `Held`
        call to `wait` for (the common case costs no task switch)."""
        for name, value in (("session", program_id), ("parent session", parent)):
            if value is not None and len(value) > MAX_PROGRAM_ID_CHARS:
                raise InvalidProgramId(f"{name} id of {len(value)} characters; at most {MAX_PROGRAM_ID_CHARS} are allowed")
        started = time.perf_counter()
        self._expire_idle(self.clock())
        self._check_serving()
        now = self.clock()  # read after expiry, whose events must not postdate this call's
        program, created = self._program(program_id, now, parent)
        return self._place(program, created, token_ids, max_tokens, started, now)

    def retry(self, call: Call, token_ids: list[int], max_tokens: int, reason: str) -> Call | Held:
        """Send again a call whose worker was lost: ``token_ids`` are its prompt plus the
        output already streamed, ``max_tokens`` what is still to come. The policy hears the
        lost call end (``ok=False``), then the new call arrive. With no worker left the call
        fails instead and `NoWorkerServing` is raised."""
        started = time.perf_counter()
        now = self.clock()
        program = self.programs[call.spec.program]  # a program with a call in flight does not end
        try:
            self._check_serving()
        except NoWorkerServing:
            self.fail(call, reason)
            raise
        self._landed(call, program)
        self.retried += 1
        spec = call.spec
        self.emit(ev.RequestRetried(now, spec.id, program.id, call.worker, reason))
        self._apply(self.policy.on_turn_end(TurnEnd(program.id, spec.id, call.worker, spec.prompt_tokens, 0, 0, ok=False), now))
        return self._place(program, call.created, token_ids, max_tokens, started, self.clock())

    def _check_serving(self) -> None:
        if len(self.lost) == len(self.routed):
            self.refused += 1
            raise NoWorkerServing(f"no worker is serving (lost: {', '.join(sorted(self.lost))})")

    def _place(self, program: _Program, created: bool, token_ids: list[int], max_tokens: int, started: float, now: float) -> Call | Held:
        """Ask the policy about one call of ``program``."""
        base = f"{program.id}.{program.turn}"
        program.turn_calls += 1
        spec = RequestSpec(
            id=base if program.turn_calls == 1 else f"{base}r{program.turn_calls}",
            program=program.id,
            turn=program.turn,
            prompt_tokens=len(token_ids),
            output_tokens=max_tokens,
            history_tokens=program.history_tokens,
            block_hashes=tuple(self._hashes(program, token_ids)),
        )
        self.emit(ev.RequestArrived(now, spec.id, spec.program, spec.turn, spec.prompt_tokens, spec.history_tokens, spec.output_tokens))
        program.context_tokens = spec.prompt_tokens
        decision = self.policy.on_request(spec, now)
        self.decision_seconds.append(time.perf_counter() - started)
        if isinstance(decision, Route):
            return self._routed(program, spec, decision.worker, 0.0, created, now)
        if not isinstance(decision, Hold):
            raise TypeError(f"policy {self.policy.name} returned {decision!r} for a request; expected Route or Hold")
        self.emit(ev.RequestHeld(now, spec.id, program.id))
        if decision.pause:
            self.pauses += 1
            self.emit(ev.ProgramPaused(now, program.id))
        held = Held(spec, asyncio.get_running_loop().create_future(), created, now)
        program.held.append(held)
        return held

    async def wait(self, held: Held) -> Call:
        """Wait for the policy to resume a held call; cancelling the wait rolls the call back
        (unless the program itself ended meanwhile, which cancels the wait)."""
        try:
            return await held.future
        except BaseException:
            if held.future.done() and not held.future.cancelled():
                # Resumed and routed, but the waiter was cancelled before it could take the call.
                self.fail(held.future.result(), "cancelled while held")
                raise
            program = self.programs.get(held.spec.program)
            if program is None:  # the program ended while its call waited
                self.failed += 1
                self.emit(ev.RequestDropped(self.clock(), held.spec.id, held.spec.program, "", "cancelled while held"))
            else:
                if held in program.held:
                    program.held.remove(held)
                self._roll_back(program, held.spec, held.created, "cancelled while held")
            raise

    def first_token(self, call: Call) -> None:
        now = self.clock()
        self.emit(ev.FirstToken(now, call.spec.id))
        self.policy.on_first_token(call.spec.id, call.worker, now)

    def finish(self, call: Call, prompt_tokens: int, output_tokens: int, cached_tokens: int) -> None:
        """The call completed with the engine's usage."""
        now = self.clock()
        spec = call.spec
        program = self.programs[spec.program]
        self._landed(call, program)
        self.finished += 1
        program.turn += 1
        program.turn_calls = 0
        program.failed = False
        program.history_tokens = program.context_tokens = prompt_tokens + output_tokens
        self.emit(ev.RequestFinished(now, spec.id, spec.program, call.worker, prompt_tokens, output_tokens, cached_tokens))
        self._apply(self.policy.on_turn_end(TurnEnd(spec.program, spec.id, call.worker, prompt_tokens, output_tokens, cached_tokens), now))
        self._settle(program)

    def fail(self, call: Call, reason: str) -> None:
        """The call failed or was cancelled after it was routed."""
        program = self.programs[call.spec.program]  # a program with a call in flight does not end
        self._landed(call, program)
        self._roll_back(program, call.spec, call.created, reason, call.worker)

    def session_final(self, program_id: str) -> bool:
        """A client's session-final (``x-dynamo-session-final``). For a program not in the
        table it succeeds all the same, counted in ``unknown_finals``, logging nothing."""
        known = self.end_program(program_id)
        self.unknown_finals += not known
        return known

    def end_program(self, program_id: str) -> bool:
        """End the program (now, or when its calls in flight have ended); False if it was not known."""
        program = self.programs.get(program_id)
        if program is None:
            return False
        if program.in_flight:
            program.ending = True
            return True
        del self.programs[program_id]
        self._idle.pop(program_id, None)
        now = self.clock()
        for held in program.held:
            held.future.cancel()  # a no-op for a future already done
        completed = program.turn > 0 and not program.failed
        self.emit(ev.ProgramFinished(now, program_id, program.context_tokens, completed))
        self._apply(self.policy.on_program_end(program_id, now))
        return True

    # --- policy-driven events ------------------------------------------------------------------

    def tick(self) -> None:
        now = self.clock()
        self._expire_idle(now)  # first, so the policy's pass sees the capacity this frees
        self._apply(self.policy.on_tick(now))

    def worker_lost(self, worker: str, reason: str) -> bool:
        """Take ``worker`` out of service with its cache; False if it already was. Its calls
        in flight fail or are retried as their streams break."""
        if worker in self.lost or worker not in self.routed:
            return False
        now = self.clock()
        self.lost.add(worker)
        self.emit(ev.WorkerLost(now, worker, reason))
        self._drop_cache(worker, now)
        self._apply(self.policy.on_worker_lost(worker, now))
        return True

    def worker_joined(self, worker: str) -> bool:
        """Put a lost ``worker`` back in service; False if it was serving."""
        if worker not in self.lost:
            return False
        self.lost.discard(worker)
        now = self.clock()
        self.emit(ev.WorkerJoined(now, worker))
        self._apply(self.policy.on_worker_joined(worker, now))
        return True

    def kv_event(self, worker: str, event: KvEvent) -> None:
        if worker in self.lost:  # a lost worker's cache is gone; it starts empty when it joins
            return
        now = self.clock()
        if event.kind == "cleared":
            self._drop_cache(worker, now)
        elif event.kind == "stored":
            self._cached[worker].update(event.blocks)
            if self.log_kv_events:
                self.emit(ev.KvStored(now, worker, event.blocks))
            if self.policy.wants_kv_events:
                self.policy.on_kv_stored(worker, event.blocks, now)
        else:
            self._cached[worker].difference_update(event.blocks)
            self._removed(worker, event.blocks, now)

    def cached_blocks(self, worker: str) -> int:
        return len(self._cached[worker])

    # --- helpers -------------------------------------------------------------------------------

    def _program(self, program_id: str | None, now: float, parent: str | None) -> tuple[_Program, bool]:
        program = self.programs.get(program_id) if program_id is not None else None
        if program is not None:
            self._idle.pop(program.id, None)
            program.ending = False  # a call after a session-final continues the session
            return program, False
        if program_id is None:
            self._one_offs += 1
            program = _Program(f"~{self._one_offs}", one_off=True)
        else:
            program = _Program(program_id, one_off=False, parent=parent)
        self.programs[program.id] = program
        self.emit(ev.ProgramStarted(now, program.id, 1 if program.one_off else 0))
        self.policy.on_program_start(program.id, now)
        return program, True

    def _expire_idle(self, now: float) -> None:
        """End every program idle longer than the TTL (oldest first, so it stops at the first
        that is not)."""
        ttl = self.idle_ttl_s
        while ttl is not None and self._idle:
            program_id, since = next(iter(self._idle.items()))
            if now - since <= ttl:
                return
            self.expired += 1
            self.end_program(program_id)

    def _hashes(self, program: _Program, token_ids: list[int]) -> list[BlockHash]:
        """Sequence hashes of the prompt, reusing the program's earlier prefix: agent prompts
        grow turn by turn, so usually only the new blocks are hashed."""
        bs = self.block_size
        known = len(program.hash_tokens)
        full = len(token_ids) // bs * bs
        if known and known <= full and token_ids[:known] == program.hash_tokens:
            hashes = program.hashes + chain_from(program.hashes[-1], token_ids[known:full], bs)
        else:
            hashes = sequence_hashes(token_ids, bs)
        program.hash_tokens = token_ids[:full]
        program.hashes = hashes
        return hashes

    def _routed(self, program: _Program, spec: RequestSpec, worker: str, held_s: float, created: bool, now: float) -> Call:
        if worker not in self.routed or worker in self.lost:
            state = "lost" if worker in self.lost else "unknown"
            raise ValueError(f"policy {self.policy.name} routed {spec.id} to {state} worker {worker!r}")
        self.routed[worker] += 1
        self.in_flight_on[worker] += 1
        program.in_flight += 1
        self.in_flight += 1
        self.emit(ev.RequestRouted(now, spec.id, worker))  # the step's time: events of one step share it
        return Call(spec, worker, held_s, created)

    def _landed(self, call: Call, program: _Program) -> None:
        """``call`` is no longer in flight (finished, failed or about to be retried)."""
        self.in_flight -= 1
        self.in_flight_on[call.worker] -= 1
        program.in_flight -= 1

    def _roll_back(self, program: _Program, spec: RequestSpec, created: bool, reason: str, worker: str = "") -> None:
        now = self.clock()
        self.failed += 1
        program.failed = True
        program.context_tokens = program.history_tokens
        self.emit(ev.RequestDropped(now, spec.id, program.id, worker, reason))
        self._apply(self.policy.on_turn_end(TurnEnd(program.id, spec.id, worker, spec.prompt_tokens, 0, 0, ok=False), now))
        if created and program.turn == 0 and program.in_flight == 0 and not program.held:
            self.end_program(program.id)  # the call that created the program never happened
        else:
            self._settle(program)

    def _settle(self, program: _Program) -> None:
        """After a call of the program ended: end the program if that was awaited, else note
        it idle once nothing of it is in flight or held."""
        if program.in_flight or self.programs.get(program.id) is not program:
            return
        if program.ending or program.one_off:
            self.end_program(program.id)
        elif not program.held:
            self._idle[program.id] = self.clock()
            self._idle.move_to_end(program.id)

    def _apply(self, decisions: Sequence[ProgramDecision]) -> None:
        now = self.clock()
        for decision in decisions:
            if isinstance(decision, Pause):
                self.pauses += 1
                self.emit(ev.ProgramPaused(now, decision.program))
            elif isinstance(decision, Resume):
                self.resumes += 1
                self.emit(ev.ProgramResumed(now, decision.program, decision.worker, decision.forced))
                program = self.programs.get(decision.program)
                if program is not None:
                    waiting, program.held = program.held, []
                    for held in waiting:
                        if not held.future.done():  # routed now: nothing may come between resume and route
                            held.future.set_result(self._routed(program, held.spec, decision.worker, now - held.since, held.created, now))
            elif isinstance(decision, Pin):
                # Dynamo's workers offer no API to keep blocks referenced; the pin is not enforced.
                if not self.ignored_pins:
                    logger.warning("policy %s asks to pin KV blocks; live workers cannot, so pins are ignored", self.policy.name)
                self.ignored_pins += 1
            else:
                raise TypeError(f"policy {self.policy.name} returned {decision!r}; expected Pause, Resume or Pin")

    def _drop_cache(self, worker: str, now: float) -> None:
        """Every block ``worker`` had cached is gone (a cache reset, or the worker with it)."""
        removed = tuple(self._cached[worker])
        self._cached[worker].clear()
        self._removed(worker, removed, now)

    def _removed(self, worker: str, blocks: tuple[BlockHash, ...], now: float) -> None:
        if not blocks:
            return
        if self.log_kv_events:
            self.emit(ev.KvRemoved(now, worker, blocks))
        if self.policy.wants_kv_events:
            self.policy.on_kv_removed(worker, blocks, now)
