"""Little's law across a source's points: which published throughputs and latencies no closed
loop can produce together.

In a closed loop of N programs, each program is always in a step (an LLM call plus the tool call
after it) or between steps (environment setup, a finished program's replacement). With X steps
per second and a mean step of R seconds, X·R is the mean number of programs inside a step, so
X·R ≤ N for any engine, router or workload. A source that gives steps/min and per-step latency
for the same system at the same concurrency, whose product exceeds N, has measured them in
different runs, windows or with different definitions; a simulator can meet at most one of them,
and its error on the other is at least what the bound forces.

The same bookkeeping gives each system's time between steps, N/X − R: the environment set-up's
share of a step (the same for two systems running the same programs), plus, for a router that
holds requests back (`Policy.holds_requests`), the time held wherever its latency leaves that out.
So at one N on one workload, a system that holds nothing back cannot spend longer between steps
than one that does.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasim.policies import policy_class
from tasim.validation.published.measurement_file import Measurements, Point

CONCURRENCY_KEY = "workload.concurrency"  # a closed loop's N, as the points set it


@dataclass(frozen=True)
class StepPair:
    """A steps/min point and a per-step latency point of one system at one concurrency."""

    throughput: Point
    latency: Point
    concurrency: float

    @property
    def occupancy(self) -> float:
        """X·R / N: the share of the programs the two values put inside a step (at most 1)."""
        steps_per_s = self.throughput.published.value / 60
        return steps_per_s * self.latency.published.value / self.concurrency

    @property
    def latency_bound_s(self) -> float:
        """The longest mean step that the published throughput allows: N / X."""
        return self.concurrency * 60 / self.throughput.published.value

    @property
    def between_steps_s(self) -> float:
        """N / X − R: a program's mean time between steps, per step."""
        return self.latency_bound_s - self.latency.published.value


@dataclass(frozen=True)
class BetweenStepsConflict:
    """Two systems at one concurrency of one set-up: ``unheld``'s router holds no request back,
    yet the values give it longer between steps than ``held``."""

    unheld: StepPair
    held: StepPair


def step_pairs(m: Measurements) -> list[StepPair]:
    """Every pair of the file's plain (not ratio) steps/min and per-step latency points with the
    same preset, system and overrides, one of which sets the concurrency; in file order of the
    latency points."""
    plain = [p for p in m.points if p.over is None]
    pairs = []
    for latency in (p for p in plain if p.metric == "turn_latency_s"):
        concurrency = latency.of.set.get(CONCURRENCY_KEY)
        if not isinstance(concurrency, (int, float)) or isinstance(concurrency, bool) or concurrency <= 0:
            continue
        pairs += [
            StepPair(throughput, latency, float(concurrency))
            for throughput in plain
            if throughput.metric == "calls_per_min" and throughput.of == latency.of and throughput.scenario == latency.scenario
        ]
    return pairs


def closed_loop_conflicts(m: Measurements) -> list[StepPair]:
    """The step pairs whose steps/s × step exceeds the concurrency."""
    return [pair for pair in step_pairs(m) if pair.occupancy > 1]


def between_steps_conflicts(m: Measurements) -> list[BetweenStepsConflict]:
    """Pairs of step pairs (each within Little's bound) of two systems at one concurrency and
    set-up where the one whose router holds no request back spends longer between steps."""
    pairs = [pair for pair in step_pairs(m) if pair.occupancy <= 1]

    def holds(pair: StepPair) -> bool:
        return policy_class(m.systems[pair.latency.of.system].name).holds_requests

    def setting(pair: StepPair) -> tuple[object, ...]:
        return pair.latency.scenario, tuple(sorted(pair.latency.of.set.items(), key=str))

    return [
        BetweenStepsConflict(unheld, held)
        for unheld in pairs
        if not holds(unheld)
        for held in pairs
        if holds(held) and setting(held) == setting(unheld) and unheld.between_steps_s > held.between_steps_s
    ]
