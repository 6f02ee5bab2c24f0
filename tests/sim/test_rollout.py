"""The RL trainers' schedules (`tasim.sim.rollout`), event by event, on a fixed step time:
every trajectory is one call of a 160-token prompt and 100 output tokens, a prefill step then
one token per 10 ms step, so a call that runs alone lasts 1.00 s."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import SCENARIOS

from tasim.config.scenario import Scenario, load_scenario
from tasim.core import events as ev
from tasim.policies.thunderagent import ThunderAgent
from tasim.sim.runner import Simulation

TRAINER_EVENTS = (
    ev.RolloutStarted,
    ev.GroupSampled,
    ev.GroupEvicted,
    ev.TrainingStarted,
    ev.TrainingFinished,
    ev.WeightSyncStarted,
    ev.WeightSyncFinished,
)


def _run(**workload: object) -> list[ev.Event]:
    scenario = Scenario.model_validate(
        {
            "duration_s": 600,
            "cluster": {"backends": 1, "engine": {"kv_blocks": 1000, "block_size": 16}, "perf": {"model": "fixed", "step_ms": 10}},
            "workload": {
                "kind": "rl_rollout",
                "prompts_per_step": 1,
                "samples_per_prompt": 2,
                "steps": 2,
                "turns": 1,
                "system_prompt_tokens": 0,
                "task_prompt_tokens": 160,
                "output_tokens": 100,
                "setup_s": 0,
                **workload,
            },
        }
    )
    log: list[ev.Event] = []
    Simulation(scenario, log.append, check=True).run()
    return log


def _trainer(log: list[ev.Event]) -> list[tuple[object, ...]]:
    """The trainer's events as (type, time rounded to 1 ms, fields after the time)."""
    return [(e.TYPE, round(e.t, 3), *(getattr(e, f.name) for f in dataclasses.fields(e)[1:])) for e in log if isinstance(e, TRAINER_EVENTS)]


def test_one_step_off_trains_each_batch_while_the_next_generates_one_version_behind() -> None:
    log = _run(mode="one_step_off", prompts_per_step=2, training_s=5, weight_sync_s=1)
    assert _trainer(log) == [
        ("rollout_started", 0.0, 0, 4),
        ("group_sampled", 1.0, 0, "s0.0", 0, 0),
        ("group_sampled", 1.0, 0, "s0.1", 0, 0),
        ("rollout_started", 1.0, 1, 4),  # the next batch goes in as this one trains
        ("training_started", 1.0, 0, 0),
        ("training_finished", 6.0, 0, 0),
        ("group_sampled", 6.0, 1, "s1.0", 0, 0),  # ready since 2.00, generated under version 0
        ("group_sampled", 6.0, 1, "s1.1", 0, 0),
        ("weight_sync_started", 6.0, 1),  # the weights of step 0's update; nothing in flight
        ("weight_sync_finished", 7.0, 1),
        ("training_started", 7.0, 1, 0),
        ("training_finished", 12.0, 1, 0),
    ]
    assert not [e for e in log if isinstance(e, ev.RequestRetried)]


def test_separate_async_aborts_at_the_push_and_samples_the_resumed_group_one_version_later() -> None:
    log = _run(mode="separate_async", mini_steps=1, warmup_batches=1, max_concurrency=2, training_s=0.505, weight_sync_s=0.5)
    assert _trainer(log) == [
        ("rollout_started", 0.0, 0, 4),  # step 0's batch and one ahead; the cap runs s0.0 first
        ("group_sampled", 1.0, 0, "s0.0", 0, 0),
        ("training_started", 1.0, 0, 0),
        ("training_finished", 1.505, 0, 0),
        # s0.1 started at 1.00; the engine stops at the end of its 51st token's step, 1.51
        ("weight_sync_started", 1.505, 1),
        ("weight_sync_finished", 2.01, 1),
        ("rollout_started", 2.01, 1, 2),  # s1.0 waits for s0.1's slots
        # s0.1 retries at 2.51 with 51 more prompt tokens and 49 to go: done at 3.00
        ("group_sampled", 3.0, 1, "s0.1", 0, 1),
        ("training_started", 3.0, 1, 0),
        ("training_finished", 3.505, 1, 0),
        ("weight_sync_started", 3.505, 2),  # s1.0, started at 3.00, is aborted in turn
        ("weight_sync_finished", 4.01, 2),
    ]
    retried = [(e.request, e.output_tokens, round(e.t, 3)) for e in log if isinstance(e, ev.RequestRetried)]
    assert retried == [("s0.1.0.0", 51, 1.51), ("s0.1.1.0", 51, 1.51), ("s1.0.0.0", 51, 3.51), ("s1.0.1.0", 51, 3.51)]
    resumed = [(e.request, e.prompt_tokens, e.output_tokens, round(e.t, 3)) for e in log if isinstance(e, ev.RequestArrived) and "r" in e.request]
    assert resumed == [("s0.1.0.0r2", 211, 49, 2.51), ("s0.1.1.0r2", 211, 49, 2.51)]
    end = log[-1]
    assert isinstance(end, ev.RunEnded) and end.unfinished_requests == 0  # s1.0's retries were not sent yet


def test_a_group_past_the_staleness_bound_is_dropped_and_replaced() -> None:
    log = _run(mode="separate_async", mini_steps=1, warmup_batches=1, max_concurrency=2, training_s=0.505, weight_sync_s=0.5, max_off_policy_span=1)
    assert _trainer(log)[6:] == [
        ("rollout_started", 2.01, 1, 2),
        # s0.1 finishes at 3.00 spanning versions 0 to 1: two steps, past the bound of one
        ("group_evicted", 3.0, 1, "s0.1", 2),
        ("rollout_started", 3.0, 1, 2),  # its replacement, s1.1, queues behind s1.0
        ("group_sampled", 4.0, 1, "s1.0", 1, 1),
        ("training_started", 4.0, 1, 0),
        ("training_finished", 4.505, 1, 0),
        ("weight_sync_started", 4.505, 2),
        ("weight_sync_finished", 5.01, 2),
    ]


def test_colocate_async_stops_the_engines_for_the_training_and_resumes_after_the_push() -> None:
    log = _run(mode="colocate_async", warmup_batches=1, max_concurrency=2, training_s=0.5, weight_sync_s=0.5)
    assert _trainer(log) == [
        ("rollout_started", 0.0, 0, 4),
        ("group_sampled", 1.0, 0, "s0.0", 0, 0),
        ("weight_sync_started", 1.0, 1),  # the engines stop as the trainer samples
        ("training_started", 1.0, 0, 0),
        ("training_finished", 1.5, 0, 0),
        ("weight_sync_finished", 2.0, 1),
        ("rollout_started", 2.0, 1, 2),
        # s0.1's calls, sent as the engines stopped, waited at the gate: all under version 1
        ("group_sampled", 3.0, 1, "s0.1", 1, 1),
        ("weight_sync_started", 3.0, 2),
        ("training_started", 3.0, 1, 0),
        ("training_finished", 3.5, 1, 0),
        ("weight_sync_finished", 4.0, 2),
    ]
    assert not [e for e in log if isinstance(e, ev.RequestRetried)]
    end = log[-1]
    assert isinstance(end, ev.RunEnded) and end.unfinished_requests == 2  # s1.0's calls, at the gate


def test_fully_async_starts_groups_within_its_budget_and_restarts_it_at_each_push() -> None:
    # the budget: 2 groups a cycle x 1.5 = 3 started per push; one group in flight at a time
    budget = {"prompts_per_step": 2, "mini_steps": 2, "staleness_threshold": 0.5, "concurrent_groups_per_worker": 1}
    log = _run(mode="fully_async", training_s=1.01, weight_sync_s=0.5, **budget)
    assert _trainer(log) == [
        ("rollout_started", 0.0, 0, 2),
        ("rollout_started", 1.0, 0, 2),  # s0.1 as s0.0 finishes
        ("group_sampled", 1.0, 0, "s0.0", 0, 0),  # one group per update, first finished first
        ("training_started", 1.0, 0, 0),
        ("training_finished", 1.505, 0, 0),
        ("rollout_started", 2.0, 0, 2),  # s0.2, the third: the rollouter pauses
        ("group_sampled", 2.0, 0, "s0.1", 0, 0),
        ("training_started", 2.0, 0, 1),
        ("training_finished", 2.505, 0, 1),
        ("weight_sync_started", 2.505, 1),  # s0.2 is cut short at 2.51
        ("weight_sync_finished", 3.01, 1),
        # the budget restarts at 1 (s0.2 still running): s1.0 starts as s0.2 finishes
        ("rollout_started", 4.0, 1, 2),
        ("group_sampled", 4.0, 1, "s0.2", 0, 1),
        ("training_started", 4.0, 1, 0),
        ("training_finished", 4.505, 1, 0),
        ("rollout_started", 5.0, 1, 2),
        ("group_sampled", 5.0, 1, "s1.0", 1, 1),
        ("training_started", 5.0, 1, 1),
        ("training_finished", 5.505, 1, 1),
        ("weight_sync_started", 5.505, 2),
        ("weight_sync_finished", 6.01, 2),
    ]
    retried = [(e.request, e.output_tokens, round(e.t, 3)) for e in log if isinstance(e, ev.RequestRetried)]
    assert retried == [("s0.2.0.0", 51, 2.51), ("s0.2.1.0", 51, 2.51), ("s1.1.0.0", 51, 5.51), ("s1.1.1.0", 51, 5.51)]


@pytest.mark.parametrize("mode", ["one_step_off", "colocate_async", "separate_async", "fully_async"])
def test_the_async_modes_are_deterministic(mode: str) -> None:
    assert _run(mode=mode, steps=3, mini_steps=1) == _run(mode=mode, steps=3, mini_steps=1)


@pytest.mark.parametrize(("mode", "training_s"), [("colocate_async", 200), ("separate_async", 20)])
def test_thunderagent_keeps_nothing_of_finished_programs_across_aborts_and_retries(mode: str, training_s: int) -> None:
    scenario = load_scenario(
        SCENARIOS / "rl-async.yaml",
        [
            f"workload.mode={mode}",
            "workload.prompts_per_step=8",
            "workload.samples_per_prompt=4",
            "workload.steps=3",
            "workload.turns=6",
            f"workload.training_s={training_s}",
            "workload.max_concurrency=64",
            "policy.name=thunderagent",
        ],
    )
    log: list[ev.Event] = []
    simulation = Simulation(scenario, log.append, check=True)
    simulation.run()
    policy = simulation.policy
    assert isinstance(policy, ThunderAgent)
    assert [e for e in log if isinstance(e, ev.RequestRetried)]  # the syncs cut calls short
    started = {e.program for e in log if isinstance(e, ev.ProgramStarted)}
    finished = {e.program for e in log if isinstance(e, ev.ProgramFinished)}
    assert set(policy.programs) == started - finished  # only the trajectories still running
    assert policy.weight_sync_since is None and not policy._sync_held
    ids = [e.request for e in log if isinstance(e, ev.RequestArrived)]
    assert len(ids) == len(set(ids))
