"""The RL trainer's accounting from its events: idle share, staleness, interrupted and
recomputed work, and the asynchronous modes' throughput."""

from __future__ import annotations

import pytest

from tasim.core import events as ev
from tasim.results.trainer_fold import TrainerFold


def _fold(events: list[ev.Event]) -> TrainerFold:
    fold = TrainerFold()
    for e in events:
        fold.apply(e)
    return fold


ASYNC_RUN: list[ev.Event] = [
    ev.GroupSampled(10.0, 0, "s0.0", 0, 0),
    ev.TrainingStarted(10.0, 0),
    ev.TrainingFinished(15.0, 0),
    ev.WeightSyncStarted(15.0, 1),
    # a call of s0.1 cut short after 40 tokens; its retry finds 64 of its 1,040 prompt tokens
    ev.RequestRetried(16.0, "s0.1.0.3", "s0.1.0", "w0", "weight sync to version 1", 40),
    ev.WeightSyncFinished(17.0, 1),
    ev.RequestArrived(17.0, "s0.1.0.3r2", "s0.1.0", 3, 1040, 900, 60),
    ev.PrefillStarted(17.5, "s0.1.0.3r2", "w0", 64),
    ev.RequestFinished(20.0, "s0.0.0.0", "s0.0.0", "w0", 500, 50, 0),
    ev.RequestFinished(21.0, "s0.1.0.3r2", "s0.1.0", "w0", 1040, 60, 64),
    ev.RequestFinished(22.0, "s1.0.0.0", "s1.0.0", "w0", 500, 70, 0),
    ev.RequestFinished(23.0, "s2.0.0.0", "s2.0.0", "w0", 500, 30, 0),  # never trained on
    ev.GroupEvicted(30.0, 1, "s0.2", 2),
    ev.GroupSampled(30.0, 1, "s0.1", 0, 1),
    ev.GroupSampled(30.0, 1, "s1.0", 1, 1),
    ev.TrainingStarted(30.0, 1),
    ev.TrainingFinished(35.0, 1),
    ev.WeightSyncStarted(35.0, 2),
    ev.WeightSyncFinished(40.0, 2),
]


def test_the_asynchronous_trainers_accounting() -> None:
    fold = _fold(ASYNC_RUN)
    assert fold.asynchronous
    # busy: training 10-15 and 30-35, pushing 15-17 and 35-40: 17 of 40 s
    assert fold.summary() == {
        "trainer_idle_share": pytest.approx(1 - 17 / 40),
        "staleness": {"mean": 0.0, "max": 0.0},
        "staleness_worst": {"mean": pytest.approx(1 / 3), "max": 1.0},
        "groups_evicted": 1,
        "interrupted_calls": 1,
        "interrupted_output_tokens": 40,
        "recomputed_prompt_tokens": 1040 - 64,
    }
    # trained: s0.0 (50), s0.1 (40 + 60), s1.0 (70) over 40 s; generated: those and s2.0's 30,
    # over the 33 s the engines were not stopped
    assert fold.async_throughput() == {
        "steps": 2,
        "step_time_s": [15.0, 20.0],
        "rollout_tokens_per_s": pytest.approx(250 / 33),
        "step_tokens_per_s": pytest.approx(220 / 40),
    }


def test_sync_mode_trains_between_rollout_end_and_training_end_on_fresh_samples() -> None:
    fold = _fold([ev.RolloutFinished(30.0, 0), ev.TrainingFinished(40.0, 0), ev.RolloutFinished(90.0, 1), ev.TrainingFinished(100.0, 1)])
    summary = fold.summary()
    assert not fold.asynchronous
    assert summary["trainer_idle_share"] == pytest.approx(0.8)
    assert summary["staleness"] == summary["staleness_worst"] == {"mean": 0.0, "max": 0.0}


def test_an_overlapping_sync_and_training_count_once() -> None:
    # colocate_async: the engines stop as the trainer samples, so the sync spans the training
    fold = _fold([ev.WeightSyncStarted(10.0, 1), ev.TrainingStarted(10.0, 0), ev.TrainingFinished(15.0, 0), ev.WeightSyncFinished(16.0, 1)])
    assert fold.idle_share() == pytest.approx(10 / 16)
