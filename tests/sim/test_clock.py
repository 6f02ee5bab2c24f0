"""The simulator's event kernel (`tasim.sim.clock`): the order of events at one instant, exactly,
and event for event the model of simpy 4, which tasim ran on before (random programs of
processes run under both and leave the same trace)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from tasim.sim.clock import Clock, Interrupt, Slots

Trace = list[tuple[float, str]]


def _clock(trace: Trace | None = None) -> Clock:
    return Clock(lambda t: trace.append((t, "before")) if trace is not None else None)


def test_one_instant_urgent_first_then_in_scheduling_order() -> None:
    """Events at one instant run in the order they were queued; a process that ends is itself
    an event queued at that moment, so its parent resumes after what was queued before it."""
    trace: Trace = []
    clock = _clock(trace)
    signal = clock.event()

    def child() -> Generator[Any, Any, str]:
        trace.append((clock.now, "child starts"))
        yield clock.timeout(1.0)
        trace.append((clock.now, "child ends"))
        return "result"

    def parent() -> Generator[Any, Any, None]:
        yield clock.timeout(1.0)
        trace.append((clock.now, "parent wakes"))
        result = yield clock.process(child())
        trace.append((clock.now, f"parent joined {result}"))

    def waiter() -> Generator[Any, Any, None]:
        value = yield signal
        trace.append((clock.now, f"waiter got {value}"))

    def signaller() -> Generator[Any, Any, None]:
        yield clock.timeout(2.0)
        signal.succeed("go")
        trace.append((clock.now, "signalled"))
        yield clock.timeout(0.0)
        trace.append((clock.now, "signaller after a zero timeout"))

    clock.process(parent())
    clock.process(waiter())
    clock.process(signaller())
    clock.run()
    assert trace == [
        (0.0, "before"),
        (1.0, "before"),
        (1.0, "parent wakes"),
        (1.0, "child starts"),
        (2.0, "before"),
        (2.0, "signalled"),  # its timeout was queued at 0, the child's at 1
        (2.0, "child ends"),
        (2.0, "waiter got go"),  # the signal was queued before the zero timeout and the child's end
        (2.0, "signaller after a zero timeout"),
        (2.0, "parent joined result"),
    ]


def test_an_interrupted_process_stops_waiting() -> None:
    trace: Trace = []
    clock = _clock()

    def sleeper() -> Generator[Any, Any, None]:
        try:
            yield clock.timeout(10.0)
            trace.append((clock.now, "slept"))
        except Interrupt:
            trace.append((clock.now, "interrupted"))
        yield clock.timeout(1.0)
        trace.append((clock.now, "done"))

    def alarm(victim: Any) -> Generator[Any, Any, None]:
        yield clock.timeout(3.0)
        victim.interrupt()
        yield clock.timeout(20.0)
        with pytest.raises(RuntimeError, match="has ended and cannot be interrupted"):
            victim.interrupt()
        trace.append((clock.now, "alarm ends"))

    victim = clock.process(sleeper())
    clock.process(alarm(victim))
    clock.run()
    assert trace == [(3.0, "interrupted"), (4.0, "done"), (23.0, "alarm ends")]


def test_conditions() -> None:
    trace: Trace = []
    clock = _clock()
    early, late = clock.timeout(1.0), clock.timeout(5.0)

    def watcher() -> Generator[Any, Any, None]:
        yield clock.timeout(2.0)  # `early` is processed by now: it counts at once
        yield clock.any_of([early, late])
        trace.append((clock.now, "any"))
        yield clock.all_of([early, late])
        trace.append((clock.now, "all"))
        yield clock.all_of([])
        trace.append((clock.now, "none"))

    clock.process(watcher())
    clock.run()
    assert trace == [(2.0, "any"), (5.0, "all"), (5.0, "none")]


def test_a_failure_reaches_the_waiter_or_ends_the_run() -> None:
    clock = _clock()
    caught: list[str] = []

    def failing() -> Generator[Any, Any, None]:
        yield clock.timeout(1.0)
        raise ValueError("no turn fits")

    def parent() -> Generator[Any, Any, None]:
        try:
            yield clock.all_of([clock.process(failing()), clock.timeout(5.0)])
        except ValueError as error:
            caught.append(f"{clock.now} {error}")

    clock.process(parent())
    clock.run()
    assert caught == ["1.0 no turn fits"]

    orphan = _clock()

    def lost() -> Generator[Any, Any, None]:
        yield orphan.timeout(1.0)
        raise KeyError("lost")

    orphan.process(lost())
    with pytest.raises(KeyError, match="lost"):
        orphan.run()


def test_run_until_an_event_and_bad_yields() -> None:
    clock = _clock()
    clock.timeout(7.0)
    done = clock.timeout(3.0)
    clock.run(until=done)
    assert clock.now == 3.0

    def bad() -> Generator[Any, Any, None]:
        yield 42

    clock.process(bad())
    with pytest.raises(RuntimeError, match="yielded 42, not an event"):
        clock.run()


def test_slots_are_granted_in_request_order() -> None:
    trace: Trace = []
    clock = _clock()
    slots = Slots(clock, 2)

    def user(name: str, hold: float) -> Generator[Any, Any, None]:
        with slots.request() as slot:
            yield slot
            trace.append((clock.now, f"{name} in"))
            yield clock.timeout(hold)
        trace.append((clock.now, f"{name} out"))

    for name, hold in (("a", 3.0), ("b", 1.0), ("c", 1.0), ("d", 1.0)):
        clock.process(user(name, hold))
    clock.run()
    assert trace == [
        (0.0, "a in"),
        (0.0, "b in"),
        (1.0, "b out"),
        (1.0, "c in"),
        (2.0, "c out"),
        (2.0, "d in"),
        (3.0, "a out"),
        (3.0, "d out"),
    ]
    with pytest.raises(ValueError, match="capacity must be > 0"):
        Slots(clock, 0)


# --- against simpy ---------------------------------------------------------------------------


@dataclass
class Kernel:
    """The calls a program makes, on either kernel."""

    env: Any
    interrupt_error: type[BaseException]
    slots: Callable[[int], Any]
    run: Callable[[], None]


def _tasim() -> Kernel:
    clock = _clock()
    return Kernel(clock, Interrupt, lambda capacity: Slots(clock, capacity), clock.run)


def _simpy() -> Kernel:
    env = simpy.Environment()
    return Kernel(env, simpy.Interrupt, lambda capacity: simpy.Resource(env, capacity), env.run)


# One action of a process: wait, trigger or await a shared event, wait for several, interrupt
# another process, hold a slot, start and join a child.
ACTIONS = st.one_of(
    st.tuples(st.just("wait"), st.sampled_from([0.0, 0.5, 1.0])),
    st.tuples(st.just("signal"), st.integers(0, 2)),
    st.tuples(st.just("await"), st.integers(0, 2)),
    st.tuples(st.sampled_from(["all", "any"]), st.lists(st.integers(0, 2), max_size=3)),
    st.tuples(st.just("interrupt"), st.integers(0, 4)),
    st.tuples(st.just("slot"), st.sampled_from([0.0, 0.5, 2.0])),
    st.tuples(st.just("child"), st.sampled_from([0.0, 1.0])),
)
PROGRAMS = st.lists(st.lists(ACTIONS, max_size=6), min_size=1, max_size=5)


def _play(kernel: Kernel, programs: list[list[tuple[Any, Any]]]) -> Trace:
    env = kernel.env
    trace: Trace = []
    signals = [env.event() for _ in range(3)]
    slots = kernel.slots(1)
    processes: list[Any] = []

    def child(hold: float) -> Generator[Any, Any, str]:
        yield env.timeout(hold)
        return "child"

    def program(me: int, actions: list[tuple[Any, Any]]) -> Generator[Any, Any, None]:
        for step, (kind, arg) in enumerate(actions):
            note = f"p{me}.{step} {kind}"
            try:
                if kind == "wait":
                    yield env.timeout(arg)
                elif kind == "signal":
                    if not signals[arg].triggered:
                        signals[arg].succeed(me)
                elif kind == "await":
                    note += f" {(yield signals[arg])}"
                elif kind in ("all", "any"):
                    yield (env.all_of if kind == "all" else env.any_of)([signals[i] for i in arg])
                elif kind == "interrupt":
                    if arg < len(processes) and arg != me and processes[arg].is_alive:
                        processes[arg].interrupt()
                elif kind == "slot":
                    with slots.request() as slot:
                        yield slot
                        yield env.timeout(arg)
                else:
                    note += f" {(yield env.process(child(arg)))}"
            except kernel.interrupt_error:
                note += " interrupted"
            trace.append((env.now, note))

    for me, actions in enumerate(programs):
        processes.append(env.process(program(me, actions)))
    kernel.run()
    return trace


@settings(max_examples=300, deadline=None)
@given(PROGRAMS)
def test_random_programs_run_as_under_simpy(programs: list[list[tuple[Any, Any]]]) -> None:
    assert _play(_tasim(), programs) == _play(_simpy(), programs)
