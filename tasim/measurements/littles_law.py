"""Little's law across a source's points: which published throughputs and latencies no closed
loop can produce together.

In a closed loop of N programs, each program is always in a step (an LLM call plus the tool call
after it) or between steps (environment setup, a finished program's replacement). With X steps
per second and a mean step of R seconds, X·R is the mean number of programs inside a step, so
X·R ≤ N for any engine, router or workload. A source that gives steps/min and per-step latency
for the same system at the same concurrency, whose product exceeds N, has measured them in
different runs, windows or with different definitions; a simulator can meet at most one of them,
and its error on the other is at least what the bound forces.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasim.measurements.schema import Measurements, Point

CONCURRENCY_KEY = "workload.concurrency"  # a closed loop's N, as the points set it


@dataclass(frozen=True)
class Conflict:
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


def closed_loop_conflicts(m: Measurements) -> list[Conflict]:
    """Every pair of the file's plain (not ratio) steps/min and per-step latency points with the
    same preset, system and overrides, one of which sets the concurrency, whose product exceeds
    the concurrency; in file order of the latency points."""
    plain = [p for p in m.points if p.over is None]
    conflicts = []
    for latency in (p for p in plain if p.metric == "step_latency_s"):
        concurrency = latency.of.set.get(CONCURRENCY_KEY)
        if not isinstance(concurrency, (int, float)) or isinstance(concurrency, bool) or concurrency <= 0:
            continue
        for throughput in plain:
            if throughput.metric == "steps_per_min" and throughput.of == latency.of \
                    and throughput.scenario == latency.scenario:
                conflict = Conflict(throughput, latency, float(concurrency))
                if conflict.occupancy > 1:
                    conflicts.append(conflict)
    return conflicts
