"""The simulation clock: a discrete-event kernel with processes, exact absolute-time alarms, a
fixed order for what happens at one instant, and a hook that runs before time advances.

Engines fast-forward through decode steps without an event per step (see `tasim.sim.engine.fast_forward`), so
"what happens at one instant" must not depend on how many steps an engine folds into one
alarm. At any instant ``t`` the order is:

1. the `before` hook with ``t``: engines catch up their folded steps and publish the KV events
   of every step that ended at or before ``t``;
2. engine step ends at ``t`` (finished requests), in worker order;
3. everything else (arrivals, tool calls, policy ticks, pin expiry), in the order it was
   scheduled (processes woken by an interrupt or started first, `URGENT`);
4. engines start their next step at ``t``, in worker order, after all of the above.

The kernel is simpy 4's model, which tasim ran on before, reduced to what the simulator uses
and kept event for event: a process is a generator that yields the event it waits for; events
are queued as ``(time, priority, sequence number, event)`` and, when their turn comes, notify
their waiters in the order these began to wait; starting a process, triggering an event and
ending a process each queue one event, as simpy's did. The same calls therefore happen in the
same order as they did under simpy, and so do event logs, byte for byte. It is tasim's own so
that it can be compiled with the simulator's core (`tasim.native`): simpy spent about 1 us of
interpreted Python per event, and a replay of the Mooncake trace queues 100,000 of them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator, Iterable
from types import TracebackType
from typing import Final

URGENT: Final = 0  # process starts and interrupts: before everything else at their instant
NORMAL: Final = 1  # timeouts, triggered events, ended processes
# Below URGENT: step ends; above NORMAL: step starts. A worker's index is added so that
# simultaneous engines act in a fixed order.
STEP_END_PRIORITY: Final = -(1 << 20)
STEP_START_PRIORITY: Final = 1 << 20


class _Pending:
    """The value of an event not yet triggered."""


PENDING: Final = _Pending()


class Interrupt(Exception):
    """Thrown into a process that another one interrupted (`Process.interrupt`)."""


class Waiter:
    """Something an event notifies when its turn comes: a process to resume, a condition to
    check, or the event itself (an interruption, a slot request or release acts then)."""

    def notify(self, event: Event) -> None:
        raise NotImplementedError


class Event(Waiter):
    """Something a process can wait for. Triggered (`succeed`, `fail`) it is queued at the
    current time; its waiters are notified when the clock reaches it (``waiters`` is then
    None: the event is processed)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.waiters: list[Waiter] | None = []
        self.value: object = PENDING
        self.ok = True
        self.defused = False  # a failure someone handled, not to be raised by the clock

    @property
    def triggered(self) -> bool:
        return self.value is not PENDING

    def succeed(self, value: object = None) -> Event:
        return self._trigger(True, value)

    def fail(self, exception: BaseException) -> Event:
        return self._trigger(False, exception)

    def _trigger(self, ok: bool, value: object) -> Event:
        if self.value is not PENDING:
            raise RuntimeError(f"{self!r} has already been triggered")
        self.ok = ok
        self.value = value
        self.clock.schedule(self, NORMAL, 0.0)
        return self


class Timeout(Event):
    """Triggered ``delay`` seconds from now."""

    def __init__(self, clock: Clock, delay: float, value: object = None) -> None:
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        super().__init__(clock)
        self.value = value
        clock.schedule(self, NORMAL, delay)


class Alarm(Event):
    """Triggered at absolute time ``at`` with ``priority``. The time is exact: a step that ends
    at ``start + duration`` is observed at that float, however long ago it was planned
    (``now + (at - now)`` can miss ``at``, and no delay may hit it exactly)."""

    def __init__(self, clock: Clock, at: float, priority: int) -> None:
        super().__init__(clock)
        self.value = None
        clock.schedule_at(self, priority, at)


class _Start(Event):
    """Starts a process: queued `URGENT` when the process is created."""

    def __init__(self, clock: Clock, process: Process) -> None:
        super().__init__(clock)
        self.value = None
        assert self.waiters is not None
        self.waiters.append(process)
        clock.schedule(self, URGENT, 0.0)


class _Interruption(Event):
    """Throws `Interrupt` into ``process`` at the current instant, `URGENT`, unless it has
    ended by then."""

    def __init__(self, process: Process) -> None:
        super().__init__(process.clock)
        if process.value is not PENDING:
            raise RuntimeError(f"{process!r} has ended and cannot be interrupted")
        if process is self.clock.active:
            raise RuntimeError("a process cannot interrupt itself")
        self.process = process
        self.ok = False
        self.defused = True
        self.value = Interrupt()
        assert self.waiters is not None
        self.waiters.append(self)  # its own waiter: processed, it interrupts
        self.clock.schedule(self, URGENT, 0.0)

    def notify(self, event: Event) -> None:
        process = self.process
        if process.value is not PENDING:
            return
        waiting = process.target.waiters
        assert waiting is not None  # a process waits only on events not yet processed
        waiting.remove(process)  # it stops waiting for what it waited for
        process.notify(event)


ProcessGenerator = Generator[Event, object, object]


class Process(Event):
    """A generator run as a process: resumed with the value of each event it yields (an
    event that failed is thrown into it); itself an event, triggered with the generator's return
    value when it ends."""

    def __init__(self, clock: Clock, generator: ProcessGenerator) -> None:
        super().__init__(clock)
        self.generator = generator
        self.target: Event = _Start(clock, self)

    @property
    def is_alive(self) -> bool:
        return self.value is PENDING

    def interrupt(self) -> None:
        _Interruption(self)

    def notify(self, event: Event) -> None:
        """Resume with ``event``'s outcome until the generator yields an event not yet
        processed (one already processed resumes it at once) or ends."""
        clock = self.clock
        clock.active = self
        # What it yields is checked below: compiled code would otherwise raise a TypeError of its own.
        generator: Generator[object, object, object] = self.generator
        while True:
            try:
                if event.ok:
                    following = generator.send(event.value)
                else:
                    event.defused = True
                    error = event.value
                    assert isinstance(error, BaseException)
                    following = generator.throw(error)
            except StopIteration as stop:
                self.ok = True
                self.value = stop.value
                clock.schedule(self, NORMAL, 0.0)
                break
            except BaseException as error:  # noqa: BLE001 (the process failed: whoever waits on it learns why)
                self.ok = False
                self.value = error
                clock.schedule(self, NORMAL, 0.0)
                break
            if not isinstance(following, Event):
                raise RuntimeError(f"process {generator!r} yielded {following!r}, not an event")
            waiting = following.waiters
            if waiting is not None:
                waiting.append(self)
                self.target = following
                break
            event = following
        clock.active = None


class Condition(Event):
    """Triggered when all (``wait_all``) or any of ``events`` have been processed; fails as soon
    as one of them fails."""

    def __init__(self, clock: Clock, events: Iterable[Event], wait_all: bool) -> None:
        super().__init__(clock)
        self.events = tuple(events)
        self.wait_all = wait_all
        self.count = 0
        if not self.events:
            self.succeed()
            return
        for event in self.events:
            waiting = event.waiters
            if waiting is None:
                self.notify(event)
            else:
                waiting.append(self)
        assert self.waiters is not None
        self.waiters.append(_StopChecks(self))

    def notify(self, event: Event) -> None:
        if self.value is not PENDING:
            return
        self.count += 1
        if not event.ok:
            event.defused = True
            error = event.value
            assert isinstance(error, BaseException)
            self.fail(error)
        elif not self.wait_all or self.count == len(self.events):
            self.succeed()


class _StopChecks(Waiter):
    """Once a condition is processed, the events it still waits on no longer notify it."""

    def __init__(self, condition: Condition) -> None:
        self.condition = condition

    def notify(self, event: Event) -> None:
        condition = self.condition
        for waited in condition.events:
            waiting = waited.waiters
            if waiting and condition in waiting:
                waiting.remove(condition)


class _Stop(Waiter):
    """Ends `Clock.run` when the event it waits on is processed."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def notify(self, event: Event) -> None:
        self.clock.stopped = True


class Slots:
    """``capacity`` slots held one at a time by processes, granted in request order (simpy's
    ``Resource``): ``with slots.request() as slot: yield slot`` holds one for the block."""

    def __init__(self, clock: Clock, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0 (got {capacity})")
        self.clock = clock
        self.capacity = capacity
        self.users: list[SlotRequest] = []
        self.requests: list[SlotRequest] = []  # waiting for a slot
        self.releases: list[SlotRelease] = []  # handing one back

    def request(self) -> SlotRequest:
        return SlotRequest(self)

    def release(self, request: SlotRequest) -> SlotRelease:
        return SlotRelease(self, request)

    def grant(self) -> None:
        """The first waiting request gets a slot if one is free."""
        if self.requests and len(self.users) < self.capacity:
            request = self.requests.pop(0)
            self.users.append(request)
            request.succeed()

    def free(self) -> None:
        """The first release hands its slot back."""
        if self.releases:
            release = self.releases.pop(0)
            if release.request in self.users:
                self.users.remove(release.request)
            release.succeed()


class SlotRequest(Event):
    """Triggered when it holds a slot; processed, it lets the first release proceed (simpy's
    ``Put``, whose own waiter does the same)."""

    def __init__(self, slots: Slots) -> None:
        super().__init__(slots.clock)
        self.slots = slots
        slots.requests.append(self)
        assert self.waiters is not None
        self.waiters.append(self)
        slots.grant()

    def notify(self, event: Event) -> None:
        self.slots.free()

    def __enter__(self) -> SlotRequest:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None) -> None:
        if self.value is PENDING:
            self.slots.requests.remove(self)
        if kind is not GeneratorExit:
            self.slots.release(self)


class SlotRelease(Event):
    """Triggered when its slot is handed back; processed, it lets the first request proceed."""

    def __init__(self, slots: Slots, request: SlotRequest) -> None:
        super().__init__(slots.clock)
        self.slots = slots
        self.request = request
        slots.releases.append(self)
        assert self.waiters is not None
        self.waiters.append(self)
        slots.free()

    def notify(self, event: Event) -> None:
        self.slots.grant()


class Clock:
    """Runs events in order of (time, priority, sequence); calls ``before(t)`` once before
    processing the first event at each new time ``t``."""

    def __init__(self, before: Callable[[float], None]) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, int, Event]] = []
        self._sequence = 0
        self._before = before
        self._synced = -math.inf
        self.active: Process | None = None  # the process running now
        self.stopped = False

    def process(self, generator: ProcessGenerator) -> Process:
        return Process(self, generator)

    def timeout(self, delay: float) -> Timeout:
        return Timeout(self, delay)

    def event(self) -> Event:
        return Event(self)

    def all_of(self, events: Iterable[Event]) -> Condition:
        return Condition(self, events, True)

    def any_of(self, events: Iterable[Event]) -> Condition:
        return Condition(self, events, False)

    def schedule(self, event: Event, priority: int, delay: float) -> None:
        heapq.heappush(self._queue, (self.now + delay, priority, self._sequence, event))
        self._sequence += 1

    def schedule_at(self, event: Event, priority: int, at: float) -> None:
        if at < self.now:
            raise ValueError(f"cannot schedule at {at}, before now ({self.now})")
        heapq.heappush(self._queue, (at, priority, self._sequence, event))
        self._sequence += 1

    def run(self, until: Event | None = None) -> None:
        """Process events until ``until`` has been processed (all of them when None); raises
        what it failed with, or what any other failed event nobody handled failed with."""
        self.stopped = False
        if until is not None:
            waiting = until.waiters
            if waiting is None:
                return
            waiting.append(_Stop(self))
        queue = self._queue
        while not self.stopped:
            if not queue:
                if until is None:
                    return
                raise RuntimeError(f"no events left, and {until!r} was not triggered")
            t = queue[0][0]
            if t > self._synced and t != math.inf:
                self._synced = t
                self._before(t)
            self.now, _, _, event = heapq.heappop(queue)
            waiters = event.waiters
            assert waiters is not None  # an event is queued once
            event.waiters = None
            for waiter in waiters:
                waiter.notify(event)
                if self.stopped:
                    break
            if not event.ok and not event.defused:
                error = event.value
                assert isinstance(error, BaseException)
                raise error
