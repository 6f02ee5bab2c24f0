"""Running the planned simulations, in parallel processes or by reusing earlier runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any, Sequence

from tasim.parallel import map_in_processes
from tasim.rundir import RUN_FILE, SUMMARY_FILE, run_simulation
from tasim.validation.paper_shapes.plan import Job, Key
from tasim.validation.paper_shapes.step_latency import step_latency


@dataclass(frozen=True)
class Outcome:
    """What the document reads of one run: its summary and what the summary lacks."""

    summary: dict[str, Any]
    step_latency_s: float | None  # mean LLM call + following tool (agent runs only)


Results = dict[Key, Outcome]


def execute(job: Job, reuse: bool) -> Outcome:
    """Simulate one job (in a worker process), or with ``reuse`` take its earlier run from
    ``job.out`` if that ran the very same scenario; then fold what the summary lacks from the log."""
    summary = reused_summary(job) if reuse else None
    if summary is None:
        summary = run_simulation(job.scenario, job.out)
    latency = None if job.key[2] is None else step_latency(job.out, job.scenario.metrics.warmup_s)
    return Outcome(summary, latency)


def reused_summary(job: Job) -> dict[str, Any] | None:
    """The summary of an earlier run in ``job.out``, or None when it ran anything else."""
    try:
        ran = json.loads((job.out / RUN_FILE).read_text())["scenario"]
        summary = json.loads((job.out / SUMMARY_FILE).read_text())
    except (OSError, ValueError, KeyError):
        return None
    return summary if ran == job.scenario.model_dump(mode="json") else None


def run_all(jobs: Sequence[Job], workers: int, reuse: bool = False) -> Results:
    """Runs are deterministic, so results do not depend on ``workers``."""
    outcomes = map_in_processes(partial(execute, reuse=reuse), jobs, workers)
    return {job.key: outcome for job, outcome in zip(jobs, outcomes)}
