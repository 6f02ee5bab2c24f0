"""One RL rollout step at 2,048 concurrent trajectories on 16 replicas (scenarios/rl-scale-2048.yaml,
the shape of ai-dynamo/dynamo#14456, where ThunderAgent's rollout stalled with duplicate request ids
and leaked programs), under ThunderAgent, Dynamo's KV router and verl's global load balancer
(least_loaded with session affinity, the preset's default for it). Per policy, at seed 0: the
step simulates in at most `WALL_LIMIT_S` wall seconds as pytest-benchmark times it, every
trajectory finishes, no request id arrives twice, and nothing is left in flight, held, paused or
in ThunderAgent's program table (`lab.rollout_audit` checks the events as they are emitted).
docs/results/rl-scale.md gives the figures over three seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RESULTS

from lab.rollout_audit import RolloutAudit
from tasim import native
from tasim.config.scenario import load_scenario
from tasim.core.events import Event
from tasim.policies.thunderagent import ThunderAgent
from tasim.results.metrics import MetricsFold
from tasim.sim.runner import Simulation

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "rl-scale-2048.yaml"
TRAJECTORIES = 2048
WALL_LIMIT_S = 60.0
POLICIES = ["thunderagent", "kv_router", "least_loaded"]


@pytest.mark.parametrize("policy", POLICIES)
def test_one_step_at_2048_trajectories(benchmark, policy: str) -> None:  # type: ignore[no-untyped-def]
    scenario = load_scenario(SCENARIO, [f"policy.name={policy}"])
    runs: list[tuple[Simulation, MetricsFold, RolloutAudit]] = []

    def step() -> None:
        fold, audit = MetricsFold(), RolloutAudit()

        def emit(event: Event) -> None:
            fold.apply(event)
            audit(event)

        simulation = Simulation(scenario, emit)
        simulation.run()
        runs.append((simulation, fold, audit))

    benchmark.pedantic(step, rounds=1, iterations=1)
    wall_s = benchmark.stats.stats.max
    ((simulation, fold, audit),) = runs
    summary = fold.summary(wall_time_s=wall_s)
    rollout = summary["rollout"]
    info = {
        "wall_s": wall_s,
        "native": native.in_use(),
        "step_time_s": rollout["step_time_s"]["mean"],
        "prefix_hit_rate": f"{summary['prefix_hit_rate']:.4f}",
        "pauses": summary["pauses"],
        "resumes": summary["resumes"],
        "busiest_worker_in_flight": audit.busiest_worker,
        "requests_completed": summary["requests_completed"],
        "engine_iterations": summary["engine_iterations"],
    }
    benchmark.extra_info.update(info)
    RESULTS.append((f"rl-scale-2048, one step, {policy}", info))
    assert audit.trajectories == TRAJECTORIES
    assert audit.problems() == []
    if isinstance(simulation.policy, ThunderAgent):  # the leak: programs left in its table
        assert simulation.policy.programs == {} and simulation.policy.queue == {}
    assert wall_s <= WALL_LIMIT_S, f"{policy}: {wall_s:.1f} s wall for one step, target <= {WALL_LIMIT_S:.0f} s"
