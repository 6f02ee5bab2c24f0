"""The live policy host: the router's program table around one tasim policy, on asyncio.

It does for live traffic what `tasim.sim.runner.Simulation` does in simulated time: turns each
incoming call into a `RequestSpec` (block hashes from the token ids, exactly as Dynamo computes
them), asks the policy, holds the call while its program is paused, applies the policy's
program decisions, reports first tokens, turn ends (with the engine's real usage), program ends
and the workers' KV events, and appends the same typed events to the log. Nothing here talks to
Dynamo: the router component (`tasim.live.router.service`) moves the bytes, so this class can be tested
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

Weight syncs: a trainer brackets each weight update with `begin_weight_sync` and
`end_weight_sync` (the router serves them as ``POST /v1/weight_sync/begin|end``). Both are logged
and told to the policy; the end applies the policy's decisions, so a call it held through the
sync (ThunderAgent) is routed to its worker in that step. A repeated begin of the sync in
progress, or a repeated end of the one that just ended, changes nothing (a trainer's retry);
a begin while another version syncs, a begin of a version not newer than the last synced one,
and an end that matches no begin are refused with `WeightSyncConflict`. What the engines do
meanwhile (abort, empty their caches) is the trainer's business: the router hears it as the
calls' ends and the workers' KV events, as usual. A sync begun with ``gate`` is verl's, done at
the router (proxy routing): it cuts every call it streams (each ends for its client with the
output so far, and `aborted_by_sync` logs it as retried: its client sends it again, prompt plus
partial output, as the next call of the same turn) and closes ``gate``, which calls routed
meanwhile wait on before they reach a worker; the end opens it.

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
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tasim.core import events as ev
from tasim.core.model import BlockHash, RequestSpec
from tasim.hosting.policy_host import Emit, HostCore
from tasim.live.hashing import chain_packed, pack_tokens
from tasim.live.router.kv_events import KvEvent
from tasim.policies import Policy, Route

# Seconds since the run started, as the live router reads them (its own monotonic clock).
WallClock = Callable[[], float]

# A prompt: token ids, or the same packed as little-endian u32 (`pack_tokens`), which is what
# gets hashed and kept, so a client that sends packed tokens saves the conversion.
Prompt = Sequence[int] | bytes


# Session ids are kept in the program table and written in every event of the log; real ones
# are UUIDs or short names, so a longer one is refused rather than stored.
MAX_PROGRAM_ID_CHARS = 256


class InvalidProgramId(ValueError):
    """A session (or parent session) id the router refuses; the call changed nothing."""


class NoWorkerServing(RuntimeError):
    """Every worker is lost, so a call cannot be placed; a new call changed nothing."""


class WeightSyncConflict(ValueError):
    """A weight sync begin or end that contradicts the syncs so far; it changed nothing."""


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
    hashed: bytes = b""  # the packed tokens behind `hashes` (full blocks): bytes, which the GC never scans
    hashes: list[BlockHash] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Call:
    """One admitted LLM call: route it to ``worker``, then report on it with this object."""

    spec: RequestSpec
    worker: str
    held_s: float
    created: bool  # this call created its program
    priority: int = 0  # its place in a priority-scheduling engine's queue, lower first (`Route.priority`)


@dataclass(frozen=True, slots=True)
class Held:
    """A call the policy holds until it resumes the program; `PolicyHost.wait` for it."""

    spec: RequestSpec
    future: asyncio.Future[Call]  # the call, routed when the policy resumed its program
    created: bool  # this call created its program
    since: float


class PolicyHost(HostCore):
    """``idle_ttl_s``: end programs idle longer than this (seconds of ``clock``); None: never."""

    def __init__(
        self, policy: Policy, clock: WallClock, emit: Emit, block_size: int, log_kv_events: bool = False, idle_ttl_s: float | None = None
    ) -> None:
        super().__init__(policy, emit, log_kv_events)
        self.clock = clock
        self.block_size = block_size
        self.idle_ttl_s = idle_ttl_s
        self.programs: dict[str, _Program] = {}
        # Programs with no call in flight or held, oldest first, with the time they went idle.
        self._idle: OrderedDict[str, float] = OrderedDict()
        self.expired = 0  # programs ended by the idle TTL
        self.session_finals = 0
        self.unknown_finals = 0  # session-finals for programs not in the table
        self.retried = 0  # calls sent again because their worker was lost
        self.refused = 0  # calls refused because no worker was serving
        self.decision_seconds: deque[float] = deque(maxlen=100_000)  # policy + hashing time per decision
        self._one_offs = 0
        self._cached: dict[str, set[BlockHash]] = {w: set() for w in policy.view.worker_ids}
        self.syncing: tuple[int, float] | None = None  # (version, since) of a weight sync begun and not ended
        self.synced_version: int | None = None  # the version of the last weight sync that ended
        self.weight_syncs = 0  # weight syncs ended
        self.gate = asyncio.Event()  # closed through a gated weight sync: routed calls wait on it
        self.gate.set()

    # --- calls ---------------------------------------------------------------------------------

    async def admit(self, program_id: str | None, token_ids: Prompt, max_tokens: int, parent: str | None = None) -> Call:
        """Route one call; waits while the policy holds it. ``program_id`` None: a one-off
        request, a program of its own that ends with it."""
        admission = self.decide(program_id, token_ids, max_tokens, parent)
        return admission if isinstance(admission, Call) else await self.wait(admission)

    def decide(self, program_id: str | None, token_ids: Prompt, max_tokens: int, parent: str | None = None) -> Call | Held:
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

    def retry(self, call: Call, token_ids: Prompt, max_tokens: int, reason: str) -> Call | Held:
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
        program.in_flight -= 1
        self.retried += 1
        self.turn_retried(call.spec, call.worker, reason, now)
        return self._place(program, call.created, token_ids, max_tokens, started, self.clock())

    def _check_serving(self) -> None:
        if len(self.lost) == len(self.routed):
            self.refused += 1
            raise NoWorkerServing(f"no worker is serving (lost: {', '.join(sorted(self.lost))})")

    def _place(self, program: _Program, created: bool, token_ids: Prompt, max_tokens: int, started: float, now: float) -> Call | Held:
        """Ask the policy about one call of ``program``."""
        packed = token_ids if isinstance(token_ids, bytes) else pack_tokens(token_ids)
        base = f"{program.id}.{program.turn}"
        program.turn_calls += 1
        spec = RequestSpec(
            id=base if program.turn_calls == 1 else f"{base}r{program.turn_calls}",
            program=program.id,
            turn=program.turn,
            prompt_tokens=len(packed) // 4,
            output_tokens=max_tokens,
            history_tokens=program.history_tokens,
            block_hashes=tuple(self._hashes(program, packed)),
        )
        program.context_tokens = spec.prompt_tokens
        decision = self.arrive(spec, now)
        self.decision_seconds.append(time.perf_counter() - started)
        if isinstance(decision, Route):
            program.in_flight += 1
            return Call(spec, decision.worker, 0.0, created, decision.priority)
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

    def call_first_token(self, call: Call) -> None:
        self.first_token(call.spec.id, call.worker, self.clock())

    def finish(self, call: Call, prompt_tokens: int, output_tokens: int, cached_tokens: int) -> None:
        """The call completed with the engine's usage."""
        now = self.clock()
        spec = call.spec
        program = self.programs[spec.program]
        program.in_flight -= 1
        program.turn += 1
        program.turn_calls = 0
        program.failed = False
        program.history_tokens = program.context_tokens = prompt_tokens + output_tokens
        self.turn_finished(spec, call.worker, prompt_tokens, output_tokens, cached_tokens, now)
        self._settle(program)

    def aborted_by_sync(self, call: Call, output_tokens: int) -> None:
        """A weight sync cut the call after ``output_tokens``: logged as retried (the policy
        hears the call end, ``ok=False``); the turn stays open, so the client's retry (prompt
        plus partial output) is the turn's next call (``<turn>r<n>``)."""
        program = self.programs[call.spec.program]  # a program with a call in flight does not end
        program.in_flight -= 1
        version = self.syncing[0] if self.syncing else self.synced_version
        self.turn_retried(call.spec, call.worker, f"aborted by the weight sync to version {version}", self.clock(), output_tokens)
        self._settle(program)

    def fail(self, call: Call, reason: str) -> None:
        """The call failed or was cancelled after it was routed."""
        program = self.programs[call.spec.program]  # a program with a call in flight does not end
        program.in_flight -= 1
        self._roll_back(program, call.spec, call.created, reason, call.worker)

    def session_final(self, program_id: str) -> bool:
        """A client's session-final (``x-dynamo-session-final``). For a program not in the
        table it succeeds all the same, counted in ``unknown_finals``, logging nothing."""
        known = self.end_program(program_id)
        self.session_finals += 1
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
        self.program_finished(program_id, program.context_tokens, completed, True, now)
        self.program_released(program_id, now)
        return True

    # --- policy-driven events ------------------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        self._expire_idle(now)  # first, so the policy's pass sees the capacity this frees
        super().tick(now)

    def begin_weight_sync(self, version: int, gate: bool = False) -> bool:
        """The trainer starts pushing ``version``: logged and told to the policy (``gate``:
        and `gate` closed until the end); False for a repeated begin of the sync in progress,
        which changes nothing (upstream ThunderAgent's second begin neither restarts its
        watchdog)."""
        if self.syncing is not None:
            if self.syncing[0] == version:
                return False
            raise WeightSyncConflict(f"a weight sync to version {self.syncing[0]} is in progress; end it before beginning version {version}")
        if self.synced_version is not None and version <= self.synced_version:
            raise WeightSyncConflict(f"weight version {version} is not newer than the last synced version {self.synced_version}")
        now = self.clock()
        self.syncing = (version, now)
        if gate:
            self.gate.clear()
        self.weight_sync_began(version, now)
        return True

    def end_weight_sync(self, version: int) -> int | None:
        """The workers serve ``version``: logged, and the policy's decisions applied at once
        (a call it held through the sync is routed now). The number of calls so routed; None
        for a repeated end of the sync that ended last, which changes nothing."""
        if self.syncing is None and version == self.synced_version:
            return None
        if self.syncing is None or self.syncing[0] != version:
            progress = f"the sync to version {self.syncing[0]} is in progress" if self.syncing else "no weight sync is in progress"
            raise WeightSyncConflict(f"end of a weight sync to version {version}, but {progress}")
        in_flight = self.in_flight
        self.syncing = None
        self.synced_version = version
        self.weight_syncs += 1
        self.gate.set()  # its waiters go on in arrival order
        self.weight_sync_ended(version, self.clock())
        return self.in_flight - in_flight

    def worker_lost(self, worker: str, reason: str) -> bool:
        """Take ``worker`` out of service with its cache; False if it already was. Its calls
        in flight fail or are retried as their streams break."""
        if worker in self.lost or worker not in self.routed:
            return False
        now = self.clock()
        self.lost.add(worker)
        self.emit(ev.WorkerLost(now, worker, reason))
        self._drop_cache(worker, now)
        self.apply(self.policy.on_worker_lost(worker, now), now)
        return True

    def worker_joined(self, worker: str) -> bool:
        """Put a lost ``worker`` back in service; False if it was serving."""
        if worker not in self.lost:
            return False
        self.lost.discard(worker)
        now = self.clock()
        self.emit(ev.WorkerJoined(now, worker))
        self.apply(self.policy.on_worker_joined(worker, now), now)
        return True

    def kv_event(self, worker: str, event: KvEvent) -> None:
        if worker in self.lost:  # a lost worker's cache is gone; it starts empty when it joins
            return
        now = self.clock()
        if event.kind == "cleared":
            self._drop_cache(worker, now)
        elif event.kind == "stored":
            if event.tier == "device":
                self._cached[worker].update(event.blocks)
            self.kv_stored(worker, event.blocks, now, event.tier)
        else:
            if event.tier == "device":
                self._cached[worker].difference_update(event.blocks)
            self.kv_removed(worker, event.blocks, now, event.tier)

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
        self.program_started(program.id, 1 if program.one_off else 0, now)
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

    def _hashes(self, program: _Program, packed: bytes) -> list[BlockHash]:
        """Sequence hashes of the prompt, reusing the program's earlier prefix: agent prompts
        grow turn by turn, so usually only the new blocks are hashed."""
        bs = self.block_size
        known = len(program.hashed)
        full = len(packed) // (4 * bs) * (4 * bs)
        if known and known <= full and packed.startswith(program.hashed):
            hashes = program.hashes + chain_packed(program.hashes[-1], packed[known:full], bs)
        else:
            hashes = chain_packed(None, packed, bs)
        program.hashed = packed[:full]
        program.hashes = hashes
        return hashes

    def _roll_back(self, program: _Program, spec: RequestSpec, created: bool, reason: str, worker: str = "") -> None:
        program.failed = True
        program.context_tokens = program.history_tokens
        self.turn_failed(spec, worker, reason, self.clock())
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

    def _resume_held(self, program_id: str, worker: str, now: float) -> None:
        """Route the resumed program's held calls in this step: nothing may come between a
        resume and the routing."""
        program = self.programs.get(program_id)
        if program is None:
            return
        waiting, program.held = program.held, []
        for held in waiting:
            if not held.future.done():
                self.route(held.spec, worker, now)
                program.in_flight += 1
                held.future.set_result(Call(held.spec, worker, now - held.since, held.created))

    def _drop_cache(self, worker: str, now: float) -> None:
        """Every block ``worker`` had cached is gone (a cache reset, or the worker with it)."""
        removed = tuple(self._cached[worker])
        self._cached[worker].clear()
        self.kv_removed(worker, removed, now)
