"""Which simulations the suite runs: the shipped presets, with only the concurrency (and, in
quick mode, the length) overridden."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lab.paper_shapes.paper import RL, RL_BASELINE, SERVING, SERVING_POLICIES, ServingCase
from tasim.config.policy_spec import PolicySpec
from tasim.config.presets import PRESET_DIR
from tasim.config.scenario import Scenario
from tasim.tools.comparison import Run, Sweep, plan_runs

CONCURRENCY = "workload.concurrency"


@dataclass(frozen=True)
class Mode:
    """How long and how many points: the presets' own windows, or a seconds-long smoke run."""

    quick: bool

    def points(self, case: ServingCase) -> tuple[int, ...]:
        return (case.concurrency[0], case.concurrency[-1]) if self.quick else case.concurrency

    def serving_overrides(self) -> list[str]:
        return ["duration_s=60", "metrics.warmup_s=20"] if self.quick else []

    def rl_overrides(self) -> list[str]:
        if not self.quick:
            return []
        return [
            "workload.prompts_per_step=2",
            "workload.samples_per_prompt=2",
            "workload.turns=3",
            "workload.max_concurrency=4",
            "workload.training_s=5",
        ]


Key = tuple[str, str, int | None]


@dataclass(frozen=True)
class Job:
    """One simulation: ``key`` is (preset, policy, concurrency or None for RL)."""

    key: Key
    scenario: Scenario
    out: Path


def _preset(name: str) -> str:
    return str(PRESET_DIR / f"{name}.yaml")


def _sweep(values: Sequence[int]) -> Sweep:
    return Sweep(CONCURRENCY, tuple(str(v) for v in values), tuple(values))


def _jobs_of(preset: str, runs: Iterable[Run], out: Path) -> list[Job]:
    return [Job((preset, r.policy, r.point.get(CONCURRENCY)), r.scenario, out / preset / r.dirname) for r in runs]


def plan(mode: Mode, out: Path) -> list[Job]:
    """Every run of the suite, validated up front (plan_runs raises before anything runs)."""
    jobs: list[Job] = []
    for case in SERVING:
        specs = [PolicySpec(name) for name in SERVING_POLICIES]
        planned = plan_runs(_preset(case.preset), specs, _sweep(mode.points(case)), mode.serving_overrides())
        jobs += _jobs_of(case.preset, planned.runs, out)
    for rl in RL:
        planned = plan_runs(_preset(rl.preset), [PolicySpec(RL_BASELINE), PolicySpec("thunderagent")], None, mode.rl_overrides())
        jobs += _jobs_of(rl.preset, planned.runs, out)
    # longest first, so the pool's tail is short: RL runs, then high concurrency, ThunderAgent's
    # pause/resume bookkeeping being the slowest serving policy
    return sorted(jobs, key=lambda j: (j.key[2] is not None, -(j.key[2] or 0), j.key[1] != "thunderagent"))


def scenario_of(jobs: Sequence[Job], preset: str) -> Scenario:
    """The scenario of a preset's first job: its policies and points share everything else the text names."""
    return next(job.scenario for job in jobs if job.key[0] == preset)
