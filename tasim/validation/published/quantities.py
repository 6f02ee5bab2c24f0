"""The metrics a published measurement can name: each a function of what one run yields.

A measurement file's ``metric:`` is a key of `METRICS`. Values are in the units published
sources use (hit rates in percent, latencies in seconds), so a file holds the numbers exactly
as its source prints them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class MetricUnavailable(Exception):
    """The run does not have this metric (no rollout step completed, no step in the window)."""


@dataclass(frozen=True)
class Outcome:
    """What the metrics read of one run: its summary, what the summary lacks, and the planned
    number of RL steps (to tell a finished rollout from a cut one)."""

    summary: dict[str, Any]
    turn_latency_s: float | None  # mean LLM call + following tool; see turn_latency.py
    rollout_steps: int | None  # the scenario's workload.steps for RL rollouts, else None


@dataclass(frozen=True)
class Metric:
    name: str
    label: str  # how tables and plots name it
    unit: str  # appended to values when shown: "" or e.g. " %", " s"
    spec: str  # format spec of a value
    description: str
    of: Callable[[Outcome], float]

    def text(self, value: float) -> str:
        return f"{format(value, self.spec)}{self.unit}"


def _present(value: float | None, what: str) -> float:
    if value is None:
        raise MetricUnavailable(f"no {what} in the measurement window")
    return value


def _rollout(outcome: Outcome) -> dict[str, Any]:
    rollout: dict[str, Any] | None = outcome.summary["rollout"]
    if rollout is None:
        raise MetricUnavailable("no rollout step completed")
    return rollout


def _finished_rollout(outcome: Outcome) -> dict[str, Any]:
    """The rollout summary of a run whose every planned step completed with no call unfinished:
    only then do the summary's calls (all of them: RL presets have no warm-up) match the rollout
    time of its completed steps."""
    rollout = _rollout(outcome)
    if rollout["steps"] != outcome.rollout_steps or outcome.summary["requests_unfinished"]:
        raise MetricUnavailable(f"the run ended before its last rollout step ({rollout['steps']} of {outcome.rollout_steps} completed)")
    return rollout


def rollout_steps_per_min(outcome: Outcome) -> float:
    """LLM calls per minute of rollout time (training phases left out: the engines idle then)."""
    rollout = _finished_rollout(outcome)
    calls: int = outcome.summary["requests_completed"]
    rollout_time_s: float = rollout["rollout_time_s"]["mean"] * rollout["steps"]
    return calls / rollout_time_s * 60


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "calls_per_min",
            "calls/min",
            "",
            ",.1f",
            "LLM calls completed per minute of the measurement window (the ThunderAgent paper's steps/min: an agent step is one call)",
            lambda o: o.summary["calls_per_min"],
        ),
        Metric(
            "prefix_hit_pct",
            "prefix hit rate",
            " %",
            ".0f",
            "prompt tokens served from the prefix cache, in percent",
            lambda o: o.summary["prefix_hit_rate"] * 100,
        ),
        Metric(
            "prefix_hit_pct_since_start",
            "prefix hit rate since start",
            " %",
            ".0f",
            "prompt tokens served from the prefix "
            "cache at first admission, from the run's start to its end (vLLM's cumulative Prometheus counters as "
            "ThunderAgent's --metrics reads them), in percent",
            lambda o: o.summary["prefix_hit_rate_since_start"] * 100,
        ),
        Metric(
            "e2e_mean_s",
            "LLM-call latency",
            " s",
            ",.1f",
            "mean LLM-call latency, arrival to last token (summary e2e_s.mean)",
            lambda o: _present(o.summary["e2e_s"]["mean"], "completed call"),
        ),
        Metric(
            "ttft_mean_s",
            "TTFT",
            " s",
            ",.2f",
            "mean time to first token of an LLM call, arrival (with any hold) to first token (summary ttft_s.mean)",
            lambda o: _present(o.summary["ttft_s"]["mean"], "completed call"),
        ),
        Metric(
            "turn_latency_s",
            "per-step latency",
            " s",
            ",.1f",
            "mean per-step latency: an LLM call plus the tool call after it, "
            "from a call's arrival to the program's next call (the ThunderAgent paper's per-step E2E latency)",
            lambda o: _present(o.turn_latency_s, "step"),
        ),
        Metric(
            "rollout_steps_per_min",
            "rollout calls/min",
            "",
            ",.1f",
            "LLM calls per minute of rollout time, training left out (the ThunderAgent paper's Table 2); needs every planned RL step completed",
            rollout_steps_per_min,
        ),
        Metric(
            "rollout_tokens_per_s",
            "rollout tokens/s",
            "",
            ",.0f",
            "generated tokens per second of rollout time",
            lambda o: _rollout(o)["rollout_tokens_per_s"],
        ),
        Metric(
            "full_step_tokens_per_s",
            "full-step tokens/s",
            "",
            ",.0f",
            "generated tokens per second of whole RL steps: rollout plus training (the verl recipe's full-step throughput)",
            lambda o: _rollout(o)["step_tokens_per_s"],
        ),
        Metric("rollout_time_s", "rollout time", " s", ",.0f", "mean rollout phase of an RL step", lambda o: _rollout(o)["rollout_time_s"]["mean"]),
        Metric("step_time_s", "RL step time", " s", ",.0f", "mean RL step, rollout plus training", lambda o: _rollout(o)["step_time_s"]["mean"]),
    )
}
