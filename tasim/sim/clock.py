"""The simulation clock: simpy with exact absolute-time alarms, a fixed order for what happens at
one instant, and a hook that runs before time advances.

Engines fast-forward through decode steps without an event per step (see `tasim.sim.runs`), so
"what happens at one instant" must not depend on how many steps an engine folds into one
alarm. At any instant ``t`` the order is:

1. the `before` hook with ``t``: engines catch up their folded steps and publish the KV events
   of every step that ended at or before ``t``;
2. engine step ends at ``t`` (finished requests), in worker order;
3. everything else (arrivals, tool calls, policy ticks, pin expiry), in simpy's order;
4. engines start their next step at ``t``, in worker order, after all of the above.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import simpy
from simpy.events import EventPriority

# Below simpy's URGENT (0) and NORMAL (1): step ends; above them: step starts. A worker's index
# is added so that simultaneous engines act in a fixed order.
STEP_END_PRIORITY = -(1 << 20)
STEP_START_PRIORITY = 1 << 20


class Alarm(simpy.Event):
    """An event that fires at absolute time ``at`` with ``priority``. The time is exact: a step
    that ends at ``start + duration`` is observed at that float, however long ago it was
    planned (``now + (at - now)`` can miss ``at``, and no delay may hit it exactly)."""

    def __init__(self, env: Clock, at: float, priority: int) -> None:
        # As simpy's Timeout initialises itself: an event already successful, merely scheduled.
        self.env = env
        self.callbacks: list[Callable[[simpy.Event], None]] = []
        self._value = None
        self._ok = True
        env.schedule_at(self, priority, at)


class Clock(simpy.Environment):
    """A simpy environment that calls ``before(t)`` once before processing the first event at
    each new time ``t``, and schedules events at absolute times."""

    def __init__(self, before: Callable[[float], None]) -> None:
        super().__init__(initial_time=0.0)
        self._before = before
        self._synced = -math.inf

    def schedule_at(self, event: simpy.Event, priority: int, at: float) -> None:
        if at < self._now:
            raise ValueError(f"cannot schedule at {at}, before now ({self._now})")
        # simpy's own schedule() takes a delay; its queue holds (time, priority, id, event).
        heapq.heappush(self._queue, (at, EventPriority(priority), next(self._eid), event))

    def step(self) -> None:
        t = self.peek()
        if t > self._synced and t != math.inf:
            self._synced = t
            self._before(t)
        super().step()
