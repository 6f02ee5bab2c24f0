"""The metrics fold on a hand-written event sequence gives exact values, and tables show them under the right names."""

from __future__ import annotations

import pytest

from tasim.core import events as ev
from tasim.results.metrics import SUMMARY_KEYS, MetricsFold
from tasim.results.render import side_by_side


def test_fold_exact_values() -> None:
    log = [
        ev.RunStarted(0.0, "s", "round_robin", 1, 120.0, ("w0",), 16, 100, 0.0),
        ev.ProgramStarted(0.0, "p0", 2),
        ev.RequestArrived(0.0, "p0.0", "p0", 0, 100, 0, 11),
        ev.RequestRouted(0.0, "p0.0", "w0"),
        ev.PrefillStarted(0.0, "p0.0", "w0", 0),
        ev.FirstToken(0.5, "p0.0"),
        ev.RequestFinished(1.5, "p0.0", "p0", "w0", 100, 11, 0),
        ev.WorkerSample(2.0, "w0", 50, 60, 0, 0),
        ev.RequestArrived(2.0, "p0.1", "p0", 1, 161, 111, 5),
        ev.PrefillStarted(2.0, "p0.1", "w0", 48),  # history 111 tokens = 6 full blocks (96), only 48 cached
        ev.RequestPreempted(2.1, "p0.1", "w0", 60),
        ev.RequestReadmitted(2.2, "p0.1", "w0", 60, 0),
        ev.FirstToken(3.0, "p0.1"),
        ev.RequestFinished(4.0, "p0.1", "p0", "w0", 161, 5, 48),
        ev.ProgramFinished(4.0, "p0", 166, True),
        ev.RunEnded(120.0, 42, 0),
    ]
    summary = MetricsFold().apply_all(log).summary(wall_time_s=1.25)
    assert tuple(summary) == SUMMARY_KEYS
    assert summary["requests_completed"] == 2
    assert summary["programs_completed"] == 1
    assert summary["calls_per_min"] == pytest.approx(1.0)  # 2 requests in 2 minutes
    assert summary["output_tokens_per_s"] == pytest.approx(16 / 120)
    assert summary["prefix_hit_rate"] == pytest.approx(48 / 261)
    assert summary["ttft_s"]["mean"] == pytest.approx(0.75)
    assert summary["e2e_s"]["p50"] == pytest.approx(1.75)
    assert summary["tpot_s"]["mean"] == pytest.approx((1.0 / 10 + 1.0 / 4) / 2)
    assert summary["recomputed_tokens"] == (96 - 48) + 60
    assert summary["preemptions"] == 1
    assert summary["mean_kv_utilization"] == pytest.approx(0.5)
    # live context: 100 tokens for 1.5 s, 111 until 2.0, 161 until 4.0 -> integral 150+55.5+322
    assert summary["working_set_ratio"] == pytest.approx((150 + 55.5 + 322) / 120 / 1600)
    assert summary["engine_iterations"] == 42
    assert summary["forced_resumes"] == 0
    assert summary["ttfr_by_prompt_s"]["<2k"] == {"mean": 0.5, "p50": 0.5, "p90": 0.5, "p99": 0.5, "count": 1}
    assert summary["ttfr_by_prompt_s"][">=32k"]["count"] == 0
    assert summary["kv_imbalance"] == {"mean": 0.0, "max": 0.0}  # one worker
    assert summary["wall_time_s"] == 1.25


def test_the_since_start_hit_rate_counts_every_first_admission_as_vllms_counters_do() -> None:
    # warm-up 3 s: the windowed rate sees only p0.1 (finished at 4.0); the since-start rate counts
    # p0.0 (admitted at 0, before the window), p0.1 once (its readmission is not a query in vLLM
    # >= 0.11) and p1.0, admitted but unfinished at the end
    log = [
        ev.RunStarted(0.0, "s", "round_robin", 1, 10.0, ("w0",), 16, 100, 3.0),
        ev.RequestArrived(0.0, "p0.0", "p0", 0, 100, 0, 11),
        ev.PrefillStarted(0.0, "p0.0", "w0", 32),
        ev.RequestFinished(1.5, "p0.0", "p0", "w0", 100, 11, 32),
        ev.RequestArrived(2.0, "p0.1", "p0", 1, 161, 111, 5),
        ev.PrefillStarted(2.0, "p0.1", "w0", 48),
        ev.RequestPreempted(2.1, "p0.1", "w0", 60),
        ev.RequestReadmitted(2.2, "p0.1", "w0", 60, 96),
        ev.RequestFinished(4.0, "p0.1", "p0", "w0", 161, 5, 48),
        ev.RequestArrived(5.0, "p1.0", "p1", 0, 200, 0, 50),
        ev.PrefillStarted(5.0, "p1.0", "w0", 16),
        ev.RunEnded(10.0, 9, 1),
    ]
    summary = MetricsFold().apply_all(log).summary()
    assert summary["prefix_hit_rate"] == pytest.approx(48 / 161)
    assert summary["prefix_hit_rate_since_start"] == pytest.approx((32 + 48 + 16) / (100 + 161 + 200))


def test_imbalance_and_forced_resumes() -> None:
    log = [
        ev.RunStarted(0.0, "s", "thunderagent", 1, 30.0, ("w0", "w1"), 16, 100, 0.0),
        ev.WorkerSample(0.0, "w0", 10, 0, 0, 0),
        ev.WorkerSample(0.0, "w1", 10, 0, 0, 0),
        ev.WorkerSample(5.0, "w0", 90, 0, 0, 0),
        ev.WorkerSample(5.0, "w1", 40, 0, 0, 0),
        ev.ProgramResumed(6.0, "p1", "w1", True),
        ev.ProgramResumed(7.0, "p2", "w0", False),
        ev.WorkerSample(10.0, "w0", 50, 0, 0, 0),
        ev.WorkerSample(10.0, "w1", 80, 0, 0, 0),
        ev.RunEnded(30.0, 1, 0),
    ]
    summary = MetricsFold().apply_all(log).summary()
    assert summary["kv_imbalance"]["mean"] == pytest.approx((0.0 + 0.5 + 0.3) / 3)
    assert summary["kv_imbalance"]["max"] == pytest.approx(0.5)
    assert (summary["resumes"], summary["forced_resumes"]) == (2, 1)
    assert summary["mean_kv_utilization"] == pytest.approx((10 + 10 + 90 + 40 + 50 + 80) / 600)


def _trajectory(start: float, finish: float | None, program: str) -> list[ev.Event]:
    started: list[ev.Event] = [ev.ProgramStarted(start, program, 1)]
    return started if finish is None else [*started, ev.ProgramFinished(finish, program, 10, True)]


def test_grpo_groups_complete_with_their_last_sample() -> None:
    """Step 0 runs two groups of two samples (s0.1.1 starts late, as under a concurrency cap);
    step 1's group s1.1 still has a sample running when the run ends, so it is left out."""
    log = sorted(
        [
            ev.RunStarted(0.0, "s", "round_robin", 1, 30.0, ("w0",), 16, 100, 0.0),
            ev.RolloutStarted(0.0, 0, 4),
            *_trajectory(0.0, 3.0, "s0.0.0"),
            *_trajectory(0.0, 7.0, "s0.0.1"),  # group s0.0: complete at 7 s, its first sample waited 4 s
            *_trajectory(0.0, 4.0, "s0.1.0"),
            *_trajectory(2.0, 10.0, "s0.1.1"),  # group s0.1: complete at 10 s, its first sample waited 6 s
            ev.RolloutFinished(10.0, 0),
            ev.TrainingFinished(15.0, 0),
            ev.RolloutStarted(15.0, 1, 4),
            *_trajectory(15.0, 18.0, "s1.0.0"),
            *_trajectory(15.0, 20.0, "s1.0.1"),  # group s1.0: 5 s from start to complete, a 2 s wait
            *_trajectory(15.0, 19.0, "s1.1.0"),
            *_trajectory(15.0, None, "s1.1.1"),
            ev.RunEnded(30.0, 9, 0),
        ],
        key=lambda e: e.t,
    )
    rollout = MetricsFold().apply_all(log).summary()["rollout"]
    assert rollout["steps"] == 1
    assert rollout["groups"] == 3
    # numpy's linear percentiles of (5, 7, 10) and (2, 4, 6)
    assert rollout["group_completion_s"] == pytest.approx({"mean": 22 / 3, "p50": 7.0, "p90": 9.4, "p99": 9.94})
    assert rollout["group_wait_s"] == pytest.approx({"mean": 4.0, "p50": 4.0, "p90": 5.6, "p99": 5.96})


@pytest.mark.parametrize(("last_sample_started", "groups"), [(False, 1), (True, 2)])
def test_a_group_counts_once_its_step_has_started_every_trajectory(last_sample_started: bool, groups: int) -> None:
    """The log does not say how many samples a group has: until step 1 has started all four of
    its trajectories, s1.0 (both samples started and finished) might still have one to come."""
    log = [
        ev.RunStarted(0.0, "s", "round_robin", 1, 30.0, ("w0",), 16, 100, 0.0),
        ev.RolloutStarted(0.0, 0, 1),
        *_trajectory(0.0, 1.0, "s0.0.0"),
        ev.RolloutFinished(1.0, 0),
        ev.TrainingFinished(2.0, 0),
        ev.RolloutStarted(2.0, 1, 4),
        *_trajectory(2.0, 3.0, "s1.0.0"),
        *_trajectory(2.0, 4.0, "s1.0.1"),
        ev.ProgramStarted(4.0, "s1.1.0", 1),
        *([ev.ProgramStarted(4.0, "s1.1.1", 1)] if last_sample_started else []),
        ev.RunEnded(30.0, 9, 0),
    ]
    rollout = MetricsFold().apply_all(log).summary()["rollout"]
    assert rollout["groups"] == groups
    assert rollout["group_completion_s"]["p99"] == pytest.approx(1.0 if groups == 1 else 1.99)  # s0.0 1 s, s1.0 2 s


def test_repeat_forced_resumes_are_those_of_a_program_forced_before() -> None:
    """A program forced again after a second timeout; its first forced resume counts as forced
    before, even where it fell in the warm-up and is itself not counted."""
    log = [
        ev.RunStarted(0.0, "s", "thunderagent", 1, 30.0, ("w0",), 16, 100, 5.0),
        ev.ProgramResumed(1.0, "p1", "w0", True),  # warm-up
        ev.ProgramResumed(6.0, "p2", "w0", True),
        ev.ProgramResumed(7.0, "p1", "w0", True),  # p1 again
        ev.ProgramResumed(8.0, "p2", "w0", False),
        ev.ProgramResumed(9.0, "p2", "w0", True),  # p2 again
        ev.ProgramResumed(10.0, "p3", "w0", True),
        ev.RunEnded(30.0, 0, 0),
    ]
    summary = MetricsFold().apply_all(log).summary()
    assert (summary["resumes"], summary["forced_resumes"], summary["repeat_forced_resumes"]) == (5, 4, 2)


def test_incomplete_log_is_an_error() -> None:
    with pytest.raises(ValueError, match="incomplete"):
        MetricsFold().apply_all([ev.RunStarted(0.0, "s", "p", 1, 10.0, ("w0",), 16, 10, 0.0)]).summary()


def test_event_records_round_trip() -> None:
    event = ev.KvStored(1.5, "w1", (1, 2, 3))
    assert ev.from_record(ev.to_record(event)) == event
    with pytest.raises(ValueError, match="lacks field"):
        ev.from_record({"type": "kv_stored", "t": 1.0})


def test_side_by_side_names_calls_per_min_llm_calls_per_minute() -> None:
    # live --compare-sim's table: one LLM call completed in a 60 s run is 1 call/min
    log = [
        ev.RunStarted(0.0, "s", "round_robin", 1, 60.0, ("w0",), 16, 100, 0.0),
        ev.RequestArrived(0.0, "p0.0", "p0", 0, 100, 0, 11),
        ev.PrefillStarted(0.0, "p0.0", "w0", 0),
        ev.FirstToken(0.5, "p0.0"),
        ev.RequestFinished(1.5, "p0.0", "p0", "w0", 100, 11, 0),
        ev.RunEnded(60.0, 3, 0),
    ]
    live = MetricsFold().apply_all(log).summary()
    table = side_by_side({"live": live, "simulated": {**live, "calls_per_min": 2.0}})
    rows = {label: (a, b, difference) for label, a, b, difference in zip(*(column.cells for column in table.columns))}
    assert rows["calls/min"] == ("1.000", "2.000", "-50.0%")
