"""What an RL trainer's events say (`tasim.sim.rollout`): its idle time, the staleness of what it
trained on, the work weight syncs interrupted, and the groups it sampled.

Busy means training (`RolloutFinished` to `TrainingFinished` in sync mode, `TrainingStarted` to
`TrainingFinished` in the asynchronous ones) or pushing weights (`WeightSyncStarted` to
`WeightSyncFinished`); the trainer is idle the rest of the time up to its last such event,
waiting for samples. Staleness follows verl's ``training/off_policy`` metrics: a group trained at
step k whose turns ran under weight versions v_min..v_max is k - v_max versions stale, k - v_min
at worst.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tasim.core import events as ev
from tasim.core.rollout_ids import rollout_group_of


def _spread(values: list[int]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "max": None}
    return {"mean": float(np.mean(values)), "max": float(max(values))}


@dataclass
class TrainerFold:
    """Feed every event of one run in order to `apply`, then read `summary` and
    `async_throughput`. `tasim.results.metrics.MetricsFold` hands it the events only the trainer
    reads through `apply` and calls the methods of the ones it reads itself directly, so that
    each of those costs one table lookup, not two."""

    asynchronous: bool = False
    _busy_since: float | None = None
    _syncing_since: float | None = None
    _busy: list[tuple[float, float]] = field(default_factory=list)
    _trainer_end: float = 0.0
    _step_ends: dict[int, float] = field(default_factory=dict)
    _sync_s: float = 0.0
    _staleness: list[int] = field(default_factory=list)
    _staleness_worst: list[int] = field(default_factory=list)
    _sampled: set[str] = field(default_factory=set)
    _evicted: int = 0
    _group_tokens: dict[str, int] = field(default_factory=dict)
    _interrupted: int = 0
    _interrupted_tokens: int = 0
    _retry_pending: set[str] = field(default_factory=set)  # programs whose next call is a retry
    _retries: set[str] = field(default_factory=set)  # retry calls not yet admitted
    _recomputed: int = 0
    _prompts: dict[str, int] = field(default_factory=dict)
    _tokens: int = 0  # every output token generated, of calls finished or cut short

    def apply(self, event: ev.Event) -> None:
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    # --- events ------------------------------------------------------------------------------

    def rollout_finished(self, e: ev.RolloutFinished) -> None:
        self._busy_since = e.t  # sync mode: training starts

    def _training_started(self, e: ev.TrainingStarted) -> None:
        self.asynchronous = True
        self._busy_since = e.t

    def training_finished(self, e: ev.TrainingFinished) -> None:
        if self._busy_since is not None:
            self._busy.append((self._busy_since, e.t))
            self._busy_since = None
        self._trainer_end = max(self._trainer_end, e.t)
        self._step_ends[e.step] = e.t

    def _sync_started(self, e: ev.WeightSyncStarted) -> None:
        self._syncing_since = e.t

    def _sync_finished(self, e: ev.WeightSyncFinished) -> None:
        if self._syncing_since is not None:
            self._busy.append((self._syncing_since, e.t))
            self._sync_s += e.t - self._syncing_since
            self._syncing_since = None
        self._trainer_end = max(self._trainer_end, e.t)

    def _group_sampled(self, e: ev.GroupSampled) -> None:
        self._sampled.add(e.group)
        self._staleness.append(e.step - e.max_version)
        self._staleness_worst.append(e.step - e.min_version)

    def _group_evicted(self, e: ev.GroupEvicted) -> None:
        self._evicted += 1

    def generated(self, program: str, output_tokens: int) -> None:
        """Output tokens of ``program``, finished or cut short (a trajectory's response holds
        the output of an aborted call too: its retry's prompt carries it)."""
        self._tokens += output_tokens
        group = rollout_group_of(program)
        if group is not None:
            self._group_tokens[group] = self._group_tokens.get(group, 0) + output_tokens

    def _finished(self, e: ev.RequestFinished) -> None:
        self.generated(e.program, e.output_tokens)

    def retried(self, e: ev.RequestRetried) -> None:
        self._interrupted += 1
        self._interrupted_tokens += e.output_tokens
        self._retry_pending.add(e.program)
        self.generated(e.program, e.output_tokens)

    def arrived(self, e: ev.RequestArrived) -> None:
        if e.program in self._retry_pending:
            self._retry_pending.discard(e.program)
            self._retries.add(e.request)
            self._prompts[e.request] = e.prompt_tokens

    def prefill(self, e: ev.PrefillStarted) -> None:
        if e.request in self._retries:
            self._retries.discard(e.request)
            self._recomputed += self._prompts.pop(e.request) - e.cached_tokens

    # --- summary -----------------------------------------------------------------------------

    def idle_share(self) -> float | None:
        """Of the time up to the trainer's last event, the share it waited for samples."""
        if self._trainer_end <= 0:
            return None
        busy = 0.0
        reach = 0.0
        for start, end in sorted(self._busy):  # the union of the busy spans
            start = max(start, reach)
            if end > start:
                busy += end - start
                reach = end
        return 1.0 - busy / self._trainer_end

    def trained(self, group: str) -> bool:
        return group in self._sampled

    def summary(self) -> dict[str, Any]:
        """Keys shared by every mode (see `tasim.results.metrics.MetricsFold.summary`)."""
        # sync mode samples every group under the weights it was generated with
        fresh = {"mean": 0.0, "max": 0.0}
        return {
            "trainer_idle_share": self.idle_share(),
            "staleness": _spread(self._staleness) if self.asynchronous else fresh,
            "staleness_worst": _spread(self._staleness_worst) if self.asynchronous else fresh,
            "groups_evicted": self._evicted,
            "interrupted_calls": self._interrupted,
            "interrupted_output_tokens": self._interrupted_tokens,
            "recomputed_prompt_tokens": self._recomputed,
        }

    def async_throughput(self) -> dict[str, Any]:
        """The asynchronous modes' step and throughput keys: steps end with their last update;
        full-step throughput counts the output of the groups trained on, over the time to the
        trainer's last event; rollout throughput every token generated, over the time the engines
        were not stopped by a weight sync."""
        ends = [self._step_ends[step] for step in sorted(self._step_ends)]
        step_times = [end - start for start, end in zip([0.0, *ends], ends, strict=False)]
        trained = sum(tokens for group, tokens in self._group_tokens.items() if group in self._sampled)
        serving = self._trainer_end - self._sync_s
        return {
            "steps": len(ends),
            "step_time_s": step_times,
            "rollout_tokens_per_s": self._tokens / serving if serving > 0 else 0.0,
            "step_tokens_per_s": trained / self._trainer_end if self._trainer_end > 0 else 0.0,
        }


# Each handler takes events of the type it is keyed by, a link the dict's type cannot state: its
# event parameter is typed Any here, and `TrainerFold.apply` passes it only events of that type.
_HANDLERS: dict[type[ev.Event], Callable[[TrainerFold, Any], None]] = {
    ev.RolloutFinished: TrainerFold.rollout_finished,
    ev.TrainingStarted: TrainerFold._training_started,
    ev.TrainingFinished: TrainerFold.training_finished,
    ev.WeightSyncStarted: TrainerFold._sync_started,
    ev.WeightSyncFinished: TrainerFold._sync_finished,
    ev.GroupSampled: TrainerFold._group_sampled,
    ev.GroupEvicted: TrainerFold._group_evicted,
    ev.RequestArrived: TrainerFold.arrived,
    ev.PrefillStarted: TrainerFold.prefill,
    ev.RequestFinished: TrainerFold._finished,
    ev.RequestRetried: TrainerFold.retried,
}
