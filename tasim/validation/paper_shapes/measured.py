"""The measured quantities the document compares, read from the runs' results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tasim.scenario import RolloutWorkload, Scenario
from tasim.validation.paper_shapes.plan import Job
from tasim.validation.paper_shapes.runner import Results


@dataclass(frozen=True)
class Measured:
    """Lookups into the results of one preset (hit rates in percent)."""

    results: Results
    preset: str

    def summary(self, policy: str, c: int | None) -> dict[str, Any]:
        return self.results[(self.preset, policy, c)].summary

    def steps(self, policy: str, c: int | None) -> float:
        return self.summary(policy, c)["steps_per_min"]

    def hit(self, policy: str, c: int | None) -> float:
        return self.summary(policy, c)["prefix_hit_rate"] * 100

    def step_latency(self, policy: str, c: int) -> float:
        return self.results[(self.preset, policy, c)].step_latency_s or 0.0

    def call_latency(self, policy: str, c: int) -> float:
        return self.summary(policy, c)["e2e_s"]["mean"] or 0.0

    def working_set(self, policy: str, c: int) -> float:
        return self.summary(policy, c)["working_set_ratio"]

    def pool(self) -> str:
        tokens = next(o.summary["kv_pool_tokens"] for k, o in self.results.items() if k[0] == self.preset)
        return f"{tokens / 1e6:.2f}M" if tokens >= 1e6 else f"{tokens / 1e3:.0f}k"


def rollout_steps_per_min(summary: dict[str, Any], scenario_steps: int) -> float:
    """LLM calls per minute of rollout (training phases left out: the engines idle then). The
    summary holds every call (the RL presets have no warm-up) and the rollout time of completed
    steps, so the two match only when every step completed and no call was left unfinished."""
    rollout = summary["rollout"]
    if rollout is None or rollout["steps"] != scenario_steps or summary["requests_unfinished"]:
        raise RuntimeError(f"{summary['scenario']}/{summary['policy']}: the run ended before its last rollout step")
    return summary["requests_completed"] / (rollout["rollout_time_s"]["mean"] * rollout["steps"]) * 60


def rl_steps(results: Results, jobs: Sequence[Job]) -> dict[tuple[str, str], float]:
    """Rollout steps/min per (preset, policy) of the RL runs."""
    return {job.key[:2]: rollout_steps_per_min(results[job.key].summary, rollout_of(job.scenario).steps)
            for job in jobs if job.key[2] is None}


def rollout_of(scenario: Scenario) -> RolloutWorkload:
    workload = scenario.workload
    assert isinstance(workload, RolloutWorkload), "only the RL presets have rollout steps"
    return workload
