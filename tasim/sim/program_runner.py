"""What a workload driver needs of the simulation (`tasim.sim.runner.Simulation` has it): the
clock, the scenario, how to run one program's script, and the few hooks a training step uses.
The drivers see only this, so they and the simulation do not import each other."""

from __future__ import annotations

from collections.abc import Generator
from typing import Protocol

import numpy as np

from tasim.config.scenario import Scenario
from tasim.core.events import Event as LogEvent
from tasim.sim.clock import Clock, Event
from tasim.workloads import Script


class ProgramRunner(Protocol):
    @property
    def env(self) -> Clock: ...
    @property
    def scenario(self) -> Scenario: ...
    @property
    def block_size(self) -> int: ...
    @property
    def arrival_rng(self) -> np.random.Generator: ...

    def run_program(self, script: Script) -> Generator[Event, object, None]: ...

    def emit(self, event: LogEvent) -> None: ...

    def clear_prefix_caches(self) -> None: ...

    def begin_weight_sync(self, version: int, retry_after_s: float) -> Event: ...

    def end_weight_sync(self, version: int) -> None: ...

    def pop_versions(self, program: str) -> tuple[int, int]: ...
