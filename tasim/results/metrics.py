"""Metrics as a fold over events: the simulator and `tasim report` compute the same summary.

Rates count requests that *finished* inside the measurement window [warmup_s, end of run];
latency statistics and the prefix hit rate are over the same requests. One figure is not
windowed: ``prefix_hit_rate_since_start``, the ratio of vLLM's cumulative Prometheus counters
(`vllm:prefix_cache_hits` / `vllm:prefix_cache_queries`) read at the end of the run, i.e. every
first admission since the start (vLLM >= 0.11 leaves readmissions after a preemption out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tasim.core import events as ev
from tasim.core.rollout_ids import rollout_group_of
from tasim.results.trainer_fold import TrainerFold

SUMMARY_KEYS = (
    "scenario",
    "policy",
    "seed",
    "workers",
    "requests_completed",
    "programs_completed",
    "requests_dropped",
    "requests_unfinished",
    "requests_retried",
    "workers_lost",
    "calls_per_min",
    "output_tokens_per_s",
    "prefix_hit_rate",
    "prefix_hit_rate_since_start",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "recomputed_tokens",
    "preemptions",
    "pauses",
    "resumes",
    "forced_resumes",
    "repeat_forced_resumes",
    "pins",
    "ttfr_by_prompt_s",
    "kv_pool_tokens",
    "mean_kv_utilization",
    "kv_imbalance",
    "working_set_ratio",
    "rollout",
    "host_tier",
    "engine_iterations",
    "sim_time_s",
    "wall_time_s",
)


# Prompt-size buckets for time to first response (fairness across prompt sizes, cf.
# ThunderAgent issues #45/#46): label and upper bound in tokens.
PROMPT_BUCKETS = (("<2k", 2048), ("2k-8k", 8192), ("8k-32k", 32768), (">=32k", None))


def _bucket(prompt_tokens: int) -> str:
    for label, bound in PROMPT_BUCKETS:
        if bound is None or prompt_tokens < bound:
            return label
    raise AssertionError("unreachable")


@dataclass(slots=True)
class _Req:
    arrival: float
    prompt: int
    history: int
    first_turn: bool
    first_token: float | None = None
    cached: int | None = None


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    arr = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


@dataclass(slots=True)
class _Step:
    """One RL step: rollout start/end, training end, and its trajectories' finish times."""

    started: float
    trajectories: int
    trajectories_started: int = 0
    rollout_end: float | None = None
    training_end: float | None = None
    output_tokens: int = 0
    finishes: list[float] = field(default_factory=list)


def _rollout_end(step: _Step) -> float:
    """When the rollout of ``step``, one whose rollout finished, ended."""
    assert step.rollout_end is not None
    return step.rollout_end


def _straggler_share(step: _Step) -> float:
    """Share of the rollout spent waiting for the last 5 % of trajectories."""
    assert step.rollout_end is not None
    duration = step.rollout_end - step.started
    if not step.finishes or duration <= 0:
        return 0.0
    finishes = sorted(step.finishes)
    t95 = finishes[max(0, -(-len(finishes) * 95 // 100) - 1)]
    return (step.rollout_end - t95) / duration


@dataclass(slots=True)
class _Group:
    """One GRPO group, the samples of one prompt of ``step``: when its first member started, how
    many members started, and when each one that finished did, in order."""

    step: _Step
    first_start: float
    members: int = 0
    finishes: list[float] = field(default_factory=list)

    def complete(self) -> bool:
        """Every member finished. The log does not say how many samples a group has, so that is
        known only once its step has started all its trajectories (or its rollout has ended)."""
        step = self.step
        membership_known = step.rollout_end is not None or step.trajectories_started >= step.trajectories
        return membership_known and len(self.finishes) == self.members


def _group_summary(groups: list[_Group]) -> dict[str, Any]:
    """The rollout keys of the GRPO groups that completed, in every trainer mode."""
    return {
        "groups": len(groups),
        "group_completion_s": _stats([g.finishes[-1] - g.first_start for g in groups]),
        "group_wait_s": _stats([g.finishes[-1] - g.finishes[0] for g in groups]),
    }


@dataclass
class MetricsFold:
    """Feed every event of one run in order to `apply`, then call `summary`."""

    header: ev.RunStarted | None = None
    end: ev.RunEnded | None = None
    _requests: dict[str, _Req] = field(default_factory=dict)
    _ttft: list[float] = field(default_factory=list)
    _tpot: list[float] = field(default_factory=list)
    _e2e: list[float] = field(default_factory=list)
    _completed: int = 0
    _output_tokens: int = 0
    _prompt_tokens: int = 0
    _cached_tokens: int = 0
    _queried_since_start: int = 0
    _hit_since_start: int = 0
    _host_since_start: int = 0
    _recomputed: int = 0
    _programs_completed: int = 0
    _dropped: int = 0
    _retried: int = 0
    _workers_lost: int = 0
    _preemptions: int = 0
    _pauses: int = 0
    _resumes: int = 0
    _forced_resumes: int = 0
    _repeat_forced_resumes: int = 0
    _forced_programs: set[str] = field(default_factory=set)  # force-resumed at least once, window or not
    _pins: int = 0
    _ttfr: dict[str, list[float]] = field(default_factory=lambda: {label: [] for label, _ in PROMPT_BUCKETS})
    _util_sum: float = 0.0
    _util_samples: int = 0
    # imbalance: max - min utilisation across workers at each sample time
    _sample_t: float | None = None
    _sample_utils: list[float] = field(default_factory=list)
    _imbalances: list[float] = field(default_factory=list)
    # working set: time integral of the sum of live programs' context tokens
    _steps: list[_Step] = field(default_factory=list)
    _program_starts: dict[str, float] = field(default_factory=dict)
    _trajectory_latency: list[float] = field(default_factory=list)
    _groups: dict[str, _Group] = field(default_factory=dict)
    _trainer: TrainerFold = field(default_factory=TrainerFold)
    _contexts: dict[str, int] = field(default_factory=dict)
    _context_sum: int = 0
    _context_since: float = 0.0
    _context_integral: float = 0.0

    def apply(self, event: ev.Event) -> None:
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def apply_all(self, events: Iterable[ev.Event]) -> MetricsFold:
        for event in events:
            self.apply(event)
        return self

    # --- handlers ----------------------------------------------------------------------------

    def _run_started(self, e: ev.RunStarted) -> None:
        self.header = e

    def _program_started(self, e: ev.ProgramStarted) -> None:
        if not self._steps:
            return
        self._program_starts[e.program] = e.t
        key = rollout_group_of(e.program)
        if key is not None:
            step = self._steps[-1]
            step.trajectories_started += 1
            self._groups.setdefault(key, _Group(step, e.t)).members += 1

    def _rollout_started(self, e: ev.RolloutStarted) -> None:
        self._steps.append(_Step(e.t, e.trajectories))

    def _rollout_finished(self, e: ev.RolloutFinished) -> None:
        self._steps[-1].rollout_end = e.t
        self._trainer.rollout_finished(e)

    def _training_finished(self, e: ev.TrainingFinished) -> None:
        self._steps[-1].training_end = e.t
        self._trainer.training_finished(e)

    def _to_trainer(self, e: ev.Event) -> None:
        """An event only the trainer's accounting reads."""
        self._trainer.apply(e)

    def _arrived(self, e: ev.RequestArrived) -> None:
        self._trainer.arrived(e)
        self._requests[e.request] = _Req(e.t, e.prompt_tokens, e.history_tokens, e.turn == 0)
        self._set_context(e.program, e.prompt_tokens, e.t)

    def _prefill(self, e: ev.PrefillStarted) -> None:
        self._trainer.prefill(e)
        req = self._requests.get(e.request)
        if req is not None and req.cached is None:
            req.cached = e.cached_tokens
            self._queried_since_start += req.prompt
            self._hit_since_start += e.cached_tokens
            self._host_since_start += e.host_tokens

    def _first_token(self, e: ev.FirstToken) -> None:
        req = self._requests.get(e.request)
        if req is not None and req.first_token is None:
            req.first_token = e.t

    def _readmitted(self, e: ev.RequestReadmitted) -> None:
        if self._in_window(e.t):
            self._recomputed += e.recompute_tokens

    def _finished(self, e: ev.RequestFinished) -> None:
        self._trainer.generated(e.program, e.output_tokens)
        self._set_context(e.program, e.prompt_tokens + e.output_tokens, e.t)
        if self._steps:
            self._steps[-1].output_tokens += e.output_tokens
        req = self._requests.pop(e.request, None)
        if req is None or not self._in_window(e.t):
            return
        self._completed += 1
        self._output_tokens += e.output_tokens
        self._prompt_tokens += e.prompt_tokens
        self._cached_tokens += e.cached_tokens
        bs = self.header.block_size if self.header else 1
        # The engine never computes the KV of a call's last output token, so of the previous
        # call's prompt + output only (history - 1) tokens' full blocks can be cached.
        reusable = min((req.history - 1) // bs, (req.prompt - 1) // bs) * bs if req.history else 0
        self._recomputed += max(0, reusable - e.cached_tokens)
        self._e2e.append(e.t - req.arrival)
        if req.first_token is not None:
            self._ttft.append(req.first_token - req.arrival)
            if req.first_turn:
                self._ttfr[_bucket(req.prompt)].append(req.first_token - req.arrival)
            if e.output_tokens > 1:
                self._tpot.append((e.t - req.first_token) / (e.output_tokens - 1))

    def _dropped_request(self, e: ev.RequestDropped) -> None:
        self._requests.pop(e.request, None)
        self._dropped += self._in_window(e.t)

    def _retried_request(self, e: ev.RequestRetried) -> None:
        self._trainer.retried(e)
        self._requests.pop(e.request, None)  # its retry arrives as a request of its own
        self._retried += self._in_window(e.t)

    def _worker_lost(self, e: ev.WorkerLost) -> None:
        self._workers_lost += self._in_window(e.t)

    def _preempted(self, e: ev.RequestPreempted) -> None:
        self._preemptions += self._in_window(e.t)

    def _paused(self, e: ev.ProgramPaused) -> None:
        self._pauses += self._in_window(e.t)

    def _resumed(self, e: ev.ProgramResumed) -> None:
        repeat = e.forced and e.program in self._forced_programs
        if e.forced:
            self._forced_programs.add(e.program)
        if self._in_window(e.t):
            self._resumes += 1
            self._forced_resumes += e.forced
            self._repeat_forced_resumes += repeat

    def _pinned(self, e: ev.ProgramPinned) -> None:
        self._pins += self._in_window(e.t)

    def _program_finished(self, e: ev.ProgramFinished) -> None:
        self._set_context(e.program, 0, e.t)
        started = self._program_starts.pop(e.program, None)
        if started is not None:
            self._trajectory_latency.append(e.t - started)
            self._steps[-1].finishes.append(e.t)
            key = rollout_group_of(e.program)
            if key is not None:
                self._groups[key].finishes.append(e.t)
        del self._contexts[e.program]
        if e.completed and self._in_window(e.t):
            self._programs_completed += 1

    def _sample(self, e: ev.WorkerSample) -> None:
        if not (self.header and self._in_window(e.t)):
            return
        utilization = e.used_blocks / self.header.kv_blocks_per_worker
        self._util_sum += utilization
        self._util_samples += 1
        if e.t != self._sample_t:
            self._close_sample_group()
            self._sample_t = e.t
        self._sample_utils.append(utilization)

    def _close_sample_group(self) -> None:
        if self._sample_utils:
            self._imbalances.append(max(self._sample_utils) - min(self._sample_utils))
            self._sample_utils = []

    def _run_ended(self, e: ev.RunEnded) -> None:
        self._set_context("", 0, e.t)
        self._close_sample_group()
        self.end = e

    # --- helpers -----------------------------------------------------------------------------

    def _in_window(self, t: float) -> bool:
        return self.header is None or t >= self.header.warmup_s

    def _set_context(self, program: str, tokens: int, t: float) -> None:
        """Track the sum of live programs' contexts as a step function of time."""
        if self.header is not None and t > self._context_since:
            start = max(self._context_since, self.header.warmup_s)
            if t > start:
                self._context_integral += self._context_sum * (t - start)
        self._context_since = max(self._context_since, t)
        if program:
            self._context_sum += tokens - self._contexts.get(program, 0)
            self._contexts[program] = tokens

    def _rollout_summary(self) -> dict[str, Any] | None:
        """RL steps that completed their rollout: step time runs from rollout start to the end of
        training (to the rollout's end for a step whose training the run did not reach)."""
        if self._trainer.asynchronous:
            return self._async_rollout_summary()
        steps = [s for s in self._steps if s.rollout_end is not None]
        if not steps:
            return None
        rollout_time = sum(_rollout_end(s) - s.started for s in steps)
        step_times = [(s.training_end or _rollout_end(s)) - s.started for s in steps]
        tokens = sum(s.output_tokens for s in steps)
        groups = [g for g in self._groups.values() if g.complete()]
        return {
            "steps": len(steps),
            "step_time_s": _stats(step_times),
            "rollout_time_s": _stats([_rollout_end(s) - s.started for s in steps]),
            "rollout_tokens_per_s": tokens / rollout_time if rollout_time > 0 else 0.0,
            "step_tokens_per_s": tokens / sum(step_times) if sum(step_times) > 0 else 0.0,
            "trajectory_latency_s": _stats(self._trajectory_latency),
            "straggler_share": float(np.mean([_straggler_share(s) for s in steps])),
            **_group_summary(groups),
            **self._trainer.summary(),
        }

    def _async_rollout_summary(self) -> dict[str, Any]:
        """The asynchronous trainers' steps: there is no rollout phase, so rollout_time_s and
        straggler_share are null; a group counts once the trainer sampled it."""
        trainer = self._trainer
        throughput = trainer.async_throughput()
        groups = [g for key, g in self._groups.items() if trainer.trained(key) and len(g.finishes) == g.members]
        return {
            "steps": throughput["steps"],
            "step_time_s": _stats(throughput["step_time_s"]),
            "rollout_time_s": _stats([]),
            "rollout_tokens_per_s": throughput["rollout_tokens_per_s"],
            "step_tokens_per_s": throughput["step_tokens_per_s"],
            "trajectory_latency_s": _stats(self._trajectory_latency),
            "straggler_share": None,
            **_group_summary(groups),
            **trainer.summary(),
        }

    def _host_tier_summary(self) -> dict[str, Any] | None:
        if self.header is None or self.end is None or not self.header.host_blocks_per_worker:
            return None
        return {
            "host_blocks_per_worker": self.header.host_blocks_per_worker,
            "gpu_hit_tokens": self._hit_since_start - self._host_since_start,
            "host_hit_tokens": self._host_since_start,
            "stored_tokens": self.end.host_stored_tokens,
            "d2h_busy_s": self.end.d2h_busy_s,
            "h2d_busy_s": self.end.h2d_busy_s,
        }

    def summary(self, wall_time_s: float | None = None) -> dict[str, Any]:
        """The run's summary, one entry per key of SUMMARY_KEYS (the documentation's summary
        reference is generated from this list):

        ``scenario``: the scenario's name
        ``policy``: the policy's name
        ``seed``: the scenario's seed
        ``workers``: engine replicas
        ``requests_completed``: LLM calls finished inside the measurement window [metrics.warmup_s, duration_s]
        ``programs_completed``: programs whose last call finished in the window, released or not
        ``requests_dropped``: calls that could never run (larger than a worker's KV pool, or refused as longer than the engine serves)
        ``requests_unfinished``: calls still in flight when the run stopped at duration_s
        ``requests_retried``: live mode: calls sent again because their worker was lost (0 in simulation)
        ``workers_lost``: live mode: workers lost during the run (0 in simulation)
        ``calls_per_min``: LLM calls completed per minute of the window (the ThunderAgent paper calls these
            steps/min: an agent step is one call)
        ``output_tokens_per_s``: output tokens of those calls per second of the window
        ``prefix_hit_rate``: prompt tokens served from the prefix cache at each call's first admission, over
            all prompt tokens of the calls in the window
        ``prefix_hit_rate_since_start``: the same over every first admission since the run started, window or
            not: vLLM's cumulative prefix_cache_hits / prefix_cache_queries read at the end of the run, as
            ThunderAgent's --metrics monitor reports them
        ``ttft_s``: time to first token (arrival, including any hold, to first token): mean, p50, p90, p99
        ``tpot_s``: time per output token after the first: mean, p50, p90, p99
        ``e2e_s``: arrival-to-finish time of a call: mean, p50, p90, p99
        ``recomputed_tokens``: tokens prefilled again that had been computed before: history a perfect cache
            would have served (thrashing) plus recompute after preemption
        ``preemptions``: engine preemptions (recompute)
        ``pauses``: programs paused by the policy (a new program queued for room counts as one)
        ``resumes``: paused programs resumed
        ``forced_resumes``: resumes forced by a timeout, without a capacity check (ThunderAgent)
        ``repeat_forced_resumes``: those of them of a program forced before (one that waited out a
            second timeout or more)
        ``pins``: KV pins taken (Continuum)
        ``ttfr_by_prompt_s``: time to first response of programs' first calls (arrival, including any hold,
            to first token) by prompt size, <2k, 2k-8k, 8k-32k and >=32k tokens: statistics and count each
        ``kv_pool_tokens``: KV pool of one worker in tokens
        ``mean_kv_utilization``: mean fraction of each worker's blocks referenced by running calls (sampled
            every metrics.sample_interval_s)
        ``kv_imbalance``: mean and max over sample times of the spread (max - min) of KV utilisation across
            workers
        ``working_set_ratio``: time-averaged sum of live programs' context tokens over all workers' KV pool
            tokens: above 1 the offered working set does not fit
        ``rollout``: rl_rollout workloads only (else null): steps; step_time_s (rollout start to end of
            training) and rollout_time_s statistics; rollout_tokens_per_s (generated tokens over rollout time)
            and step_tokens_per_s (over the full step time); trajectory_latency_s statistics; straggler_share
            (mean over steps of the share of the rollout spent after 95 % of its trajectories had finished);
            groups (GRPO groups, the samples of one prompt, whose every sample finished, in a step the run
            cut short too; like trajectory_latency_s, over every trajectory, warm-up or not);
            group_completion_s statistics (per group, its first sample's start to its last sample's finish:
            when its advantage can be computed) and group_wait_s statistics (per group, its first sample's
            finish to its last one's: how long finished samples wait for the group's straggler);
            trainer_idle_share (of the time to the trainer's last event, the share it waited for samples:
            neither training nor pushing weights); staleness and staleness_worst (mean and max over the
            groups trained on of the step minus the newest, and the oldest, weight version their turns ran
            under; 0 in sync mode); groups_evicted (finished groups dropped as too stale);
            interrupted_calls and interrupted_output_tokens (calls a weight sync or a lost worker cut short,
            and the output they had generated: their retries compute it again as prompt);
            recomputed_prompt_tokens (the retries' prompt tokens not found in cache).
            Asynchronous modes (workload.mode other than sync): steps end with their last update and
            step_time_s is the time between step ends; step_tokens_per_s counts the output of the groups
            trained on (cut-short calls' included) over the time to the trainer's last event;
            rollout_tokens_per_s every output token generated over the time the engines were not stopped
            by a weight sync; rollout_time_s and straggler_share are null (there is no rollout phase); a
            group counts once the trainer sampled it
        ``host_tier``: runs with cluster.engine.host_tier only (else null), over every first admission since
            the run started and every worker: host_blocks_per_worker; gpu_hit_tokens and host_hit_tokens (prompt
            tokens found on the GPU, and loaded from the host: together the hits of prefix_hit_rate_since_start);
            stored_tokens (copied to the host); d2h_busy_s and h2d_busy_s (seconds each copy lane was busy)
        ``engine_iterations``: engine steps simulated
        ``sim_time_s``: simulated seconds the run lasted
        ``wall_time_s``: wall-clock seconds the run took (read from run.json by `tasim report`: not a property
            of the simulated run)
        """
        if self.header is None or self.end is None:
            raise ValueError("event log is incomplete: it needs a run_started and a run_ended event")
        h = self.header
        end_t = self.end.t
        window = max(end_t - h.warmup_s, 1e-12)
        pool_tokens = h.kv_blocks_per_worker * h.block_size
        cluster_tokens = pool_tokens * len(h.workers)
        result: dict[str, Any] = {
            "scenario": h.scenario,
            "policy": h.policy,
            "seed": h.seed,
            "workers": len(h.workers),
            "requests_completed": self._completed,
            "programs_completed": self._programs_completed,
            "requests_dropped": self._dropped,
            "requests_unfinished": self.end.unfinished_requests,
            "requests_retried": self._retried,
            "workers_lost": self._workers_lost,
            "calls_per_min": self._completed / window * 60.0,
            "output_tokens_per_s": self._output_tokens / window,
            "prefix_hit_rate": self._cached_tokens / self._prompt_tokens if self._prompt_tokens else 0.0,
            "prefix_hit_rate_since_start": self._hit_since_start / self._queried_since_start if self._queried_since_start else 0.0,
            "ttft_s": _stats(self._ttft),
            "tpot_s": _stats(self._tpot),
            "e2e_s": _stats(self._e2e),
            "recomputed_tokens": self._recomputed,
            "preemptions": self._preemptions,
            "pauses": self._pauses,
            "resumes": self._resumes,
            "forced_resumes": self._forced_resumes,
            "repeat_forced_resumes": self._repeat_forced_resumes,
            "pins": self._pins,
            "ttfr_by_prompt_s": {label: {**_stats(v), "count": len(v)} for label, v in self._ttfr.items()},
            "kv_pool_tokens": pool_tokens,
            "mean_kv_utilization": self._util_sum / self._util_samples if self._util_samples else 0.0,
            "kv_imbalance": {
                "mean": float(np.mean(self._imbalances)) if self._imbalances else 0.0,
                "max": max(self._imbalances, default=0.0),
            },
            "working_set_ratio": self._context_integral / window / cluster_tokens,
            "rollout": self._rollout_summary(),
            "host_tier": self._host_tier_summary(),
            "engine_iterations": self.end.engine_iterations,
            "sim_time_s": end_t,
            "wall_time_s": wall_time_s,
        }
        assert tuple(result) == SUMMARY_KEYS
        return result


# Each handler takes events of the type it is keyed by, a link the dict's type cannot state: its
# event parameter is typed Any here, and `MetricsFold.apply` passes it only events of that type.
_HANDLERS: dict[type[ev.Event], Callable[[MetricsFold, Any], None]] = {
    ev.RunStarted: MetricsFold._run_started,
    ev.ProgramStarted: MetricsFold._program_started,
    ev.RolloutStarted: MetricsFold._rollout_started,
    ev.RolloutFinished: MetricsFold._rollout_finished,
    ev.TrainingFinished: MetricsFold._training_finished,
    ev.TrainingStarted: MetricsFold._to_trainer,
    ev.WeightSyncStarted: MetricsFold._to_trainer,
    ev.WeightSyncFinished: MetricsFold._to_trainer,
    ev.GroupSampled: MetricsFold._to_trainer,
    ev.GroupEvicted: MetricsFold._to_trainer,
    ev.RequestArrived: MetricsFold._arrived,
    ev.PrefillStarted: MetricsFold._prefill,
    ev.FirstToken: MetricsFold._first_token,
    ev.RequestReadmitted: MetricsFold._readmitted,
    ev.RequestFinished: MetricsFold._finished,
    ev.RequestDropped: MetricsFold._dropped_request,
    ev.RequestRetried: MetricsFold._retried_request,
    ev.WorkerLost: MetricsFold._worker_lost,
    ev.RequestPreempted: MetricsFold._preempted,
    ev.ProgramPaused: MetricsFold._paused,
    ev.ProgramResumed: MetricsFold._resumed,
    ev.ProgramPinned: MetricsFold._pinned,
    ev.ProgramFinished: MetricsFold._program_finished,
    ev.WorkerSample: MetricsFold._sample,
    ev.RunEnded: MetricsFold._run_ended,
}


def summary_value(summary: dict[str, Any], path: tuple[str, ...]) -> Any:
    """A value of a (nested) summary, e.g. ``("rollout", "step_time_s", "mean")``."""
    value: Any = summary
    for key in path:
        value = value[key]
    return value
