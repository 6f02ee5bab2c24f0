"""The measured quantities the document compares, read from the runs' results."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lab.paper_shapes.execution import Results
from lab.paper_shapes.paper import hit_metric
from lab.paper_shapes.plan import Job
from tasim.config.scenario import RolloutWorkload, Scenario
from tasim.validation.published.quantities import METRICS


@dataclass(frozen=True)
class Measured:
    """Lookups into the results of one preset (hit rates in percent, as the preset's published
    points measure them), through the metrics published measurements name."""

    results: Results
    preset: str

    def summary(self, policy: str, c: int | None) -> dict[str, Any]:
        return self.results[(self.preset, policy, c)].summary

    def _metric(self, name: str, policy: str, c: int | None) -> float:
        return METRICS[name].of(self.results[(self.preset, policy, c)])

    def steps(self, policy: str, c: int | None) -> float:
        return self._metric("calls_per_min", policy, c)

    def hit(self, policy: str, c: int | None) -> float:
        return self._metric(hit_metric(self.preset), policy, c)

    @property
    def hit_label(self) -> str:
        return METRICS[hit_metric(self.preset)].label

    def turn_latency(self, policy: str, c: int) -> float:
        return self._metric("turn_latency_s", policy, c)

    def call_latency(self, policy: str, c: int) -> float:
        return self._metric("e2e_mean_s", policy, c)

    def working_set(self, policy: str, c: int) -> float:
        ratio: float = self.summary(policy, c)["working_set_ratio"]
        return ratio

    def pool(self) -> str:
        tokens = next(o.summary["kv_pool_tokens"] for k, o in self.results.items() if k[0] == self.preset)
        return f"{tokens / 1e6:.2f}M" if tokens >= 1e6 else f"{tokens / 1e3:.0f}k"


def rl_steps(results: Results, jobs: Sequence[Job]) -> dict[tuple[str, str], float]:
    """Rollout steps/min per (preset, policy) of the RL runs (LLM calls per minute of rollout)."""
    return {job.key[:2]: METRICS["rollout_steps_per_min"].of(results[job.key]) for job in jobs if job.key[2] is None}


def rollout_of(scenario: Scenario) -> RolloutWorkload:
    workload = scenario.workload
    assert isinstance(workload, RolloutWorkload), "only the RL presets have rollout steps"
    return workload
