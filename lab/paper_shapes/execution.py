"""Running the planned simulations, in parallel processes or by reusing earlier runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from typing import Any

from lab.paper_shapes.plan import Job, Key
from tasim.results.run_folder import RUN_FILE, SUMMARY_FILE
from tasim.tools.parallel import map_in_processes
from tasim.validation.published.quantities import Outcome
from tasim.validation.published.runs import measure, outcome_of
from tasim.validation.published.turn_latency import turn_latency

Results = dict[Key, Outcome]


def execute(job: Job, reuse: bool) -> Outcome:
    """Simulate one job into ``job.out`` (in a worker process), or with ``reuse`` take its
    earlier run from there if that ran the very same scenario."""
    summary = reused_summary(job) if reuse else None
    if summary is None:
        return measure(job.scenario, job.out)
    return outcome_of(job.scenario, summary, turn_latency(job.out, job.scenario.metrics.warmup_s))


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
