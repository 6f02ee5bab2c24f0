"""Policy regression suite: every policy on key presets, headline metrics against a baseline.

A change that moves a policy's output throughput or prefix hit rate on any case by more than
the tolerance is a regression until someone looks and, if it is intended, records the new
numbers with ``make baseline`` (``python -m lab.regression --update``). Simulations are
deterministic, so the tolerances only absorb deliberate small changes, not noise.
``make bench`` checks the whole suite; ``make test`` checks the cases marked ``small``.

    python -m lab.regression [--small] [--jobs N] [--update] [--baseline FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tasim.config.presets import PRESET_DIR
from tasim.config.scenario import load_scenario
from tasim.policies import POLICIES as REGISTERED
from tasim.results.metrics import MetricsFold
from tasim.tools.parallel import map_in_processes

BASELINE = Path(__file__).resolve().parent.parent / "benchmarks" / "baseline.json"
POLICIES = tuple(REGISTERED)  # every registered policy, so a new one joins the suite (and needs `make baseline`)

# metric -> (kind, allowed drift): relative for rates, absolute (fraction) for the hit rate.
TOLERANCES: dict[str, tuple[str, float]] = {
    "output_tokens_per_s": ("relative", 0.02),
    "prefix_hit_rate": ("absolute", 0.01),
}


@dataclass(frozen=True, slots=True)
class Case:
    scenario: str  # preset file name
    policy: str
    overrides: tuple[str, ...] = ()
    small: bool = False  # also part of the quick suite in `make test`

    @property
    def key(self) -> str:
        return f"{self.scenario}:{self.policy}"

    @property
    def run_overrides(self) -> tuple[str, ...]:
        """What the case's simulation applies to its preset: its overrides, then its policy with
        the policy's default parameters."""
        return (*self.overrides, f"policy.name={self.policy}", "policy.params={}")


def _cases() -> tuple[Case, ...]:
    cases = []
    for policy in POLICIES:
        if REGISTERED[policy].sets_priorities:  # vLLM's priority scheduling: none on the mocker-flavoured presets
            priority = ("cluster.engine.scheduling_policy=priority",)
            cases += [
                Case("swe-agent.yaml", policy, ("duration_s=600", "metrics.warmup_s=300", "workload.concurrency=96", *priority), small=True),
                Case("toolorchestra.yaml", policy, ("duration_s=1200", *priority)),
            ]
            continue
        cases += [
            Case("live-mocker.yaml", policy, small=True),  # pauses, thrashing, two tiny workers
            Case("swe-agent.yaml", policy, ("duration_s=600", "metrics.warmup_s=300", "workload.concurrency=96")),  # past the thrashing cliff
            Case("multiturn-validation.yaml", policy, ("duration_s=300",)),  # Dynamo mocker engines
            Case("toolorchestra.yaml", policy, ("duration_s=1200",)),  # heavy-tailed tools, one GPU
            Case("rl-live-mocker.yaml", policy),  # RL rollout steps
        ]
    return tuple(cases)


CASES = _cases()


def run_case(case: Case) -> dict[str, float]:
    """The case's headline metrics (simulated in this process, no files written)."""
    from tasim.sim.runner import Simulation

    fold = MetricsFold()
    Simulation(load_scenario(PRESET_DIR / case.scenario, case.run_overrides), fold.apply).run()
    summary = fold.summary()
    return {metric: float(summary[metric]) for metric in TOLERANCES}


def run_suite(cases: Sequence[Case], jobs: int = 1) -> dict[str, dict[str, float]]:
    return dict(zip((c.key for c in cases), map_in_processes(run_case, list(cases), jobs)))


@dataclass(frozen=True, slots=True)
class Drift:
    case: str
    metric: str
    baseline: float | None
    now: float | None
    allowed: str

    def line(self) -> str:
        before = "missing" if self.baseline is None else f"{self.baseline:.6g}"
        after = "missing" if self.now is None else f"{self.now:.6g}"
        return f"{self.case} {self.metric}: baseline {before}, now {after} (allowed {self.allowed})"


def drifts(results: dict[str, dict[str, float]], baseline: dict[str, dict[str, float]]) -> list[Drift]:
    """Every metric of every case in ``results`` that left its tolerance around ``baseline``."""
    found = []
    for case, metrics in results.items():
        recorded = baseline.get(case, {})
        for metric, (kind, allowed) in TOLERANCES.items():
            now, before = metrics.get(metric), recorded.get(metric)
            label = f"±{allowed:.0%}" if kind == "relative" else f"±{allowed * 100:g} pp"
            if now is None or before is None:
                found.append(Drift(case, metric, before, now, label))
                continue
            gap = abs(now - before) / abs(before) if kind == "relative" and before else abs(now - before)
            if gap > allowed:
                found.append(Drift(case, metric, before, now, label))
    return found


def load_baseline(path: Path = BASELINE) -> dict[str, dict[str, float]]:
    try:
        baseline: dict[str, dict[str, float]] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return baseline


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.regression", description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="only the quick cases (those make test checks)")
    parser.add_argument("--jobs", type=int, default=2, help="simulations in parallel (default 2)")
    parser.add_argument("--update", action="store_true", help="record the results as the new baseline")
    parser.add_argument("--baseline", type=Path, default=BASELINE, help=f"baseline file (default {BASELINE})")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        print(f"error: --jobs must be at least 1 (got {args.jobs})", file=sys.stderr)
        return 2
    cases = [c for c in CASES if c.small or not args.small]
    results = run_suite(cases, args.jobs)
    if args.update:
        baseline = load_baseline(args.baseline) if args.small else {}
        baseline.update(results)
        args.baseline.write_text(json.dumps(dict(sorted(baseline.items())), indent=1) + "\n")
        print(f"recorded {len(results)} cases in {args.baseline}")
        return 0
    found = drifts(results, load_baseline(args.baseline))
    for drift in found:
        print(drift.line())
    print(f"{len(cases)} cases, {len(found)} metric(s) outside tolerance")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
