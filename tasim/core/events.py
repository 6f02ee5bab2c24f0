"""Typed events: the append-only record both worlds (simulation and live) write.

Every metric tasim reports is a fold over these events (see `tasim.results.metrics`), so a run can be
re-reported, diffed and compared sim-vs-live. Events are immutable slotted dataclasses
(`tasim.core.records.record`); their JSON form is one object per line with a ``type`` key and the
fields in declaration order, which keeps the log byte-identical for the same scenario and seed.
A field with a default is written only when its value differs from it, so a field added that
way leaves the logs of runs that do not use it unchanged, and older logs still read.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from tasim.core.records import record


@record
class Event:
    """Base class: ``t`` is simulated (or live) seconds since the run started."""

    t: float
    TYPE: ClassVar[str] = "event"


@record
class RunStarted(Event):
    """Header of every log: what ran, so `report` needs nothing but the log."""

    TYPE: ClassVar[str] = "run_started"
    scenario: str
    policy: str
    seed: int
    duration_s: float
    workers: tuple[str, ...]
    block_size: int
    kv_blocks_per_worker: int
    warmup_s: float
    host_blocks_per_worker: int = 0  # the host KV tier's slots (0: no tier)


@record
class ProgramStarted(Event):
    TYPE: ClassVar[str] = "program_started"
    program: str
    planned_turns: int


@record
class RequestArrived(Event):
    """A turn's LLM call reaches the router. ``history_tokens``: prompt tokens this program
    already computed in earlier turns (what a perfect cache would serve)."""

    TYPE: ClassVar[str] = "request_arrived"
    request: str
    program: str
    turn: int
    prompt_tokens: int
    history_tokens: int
    output_tokens: int


@record
class RequestHeld(Event):
    TYPE: ClassVar[str] = "request_held"
    request: str
    program: str


@record
class RequestRouted(Event):
    TYPE: ClassVar[str] = "request_routed"
    request: str
    worker: str


@record
class PrefillStarted(Event):
    """First admission into a running batch; ``cached_tokens`` came from the prefix cache, of
    them ``host_tokens`` loaded from the host tier."""

    TYPE: ClassVar[str] = "prefill_started"
    request: str
    worker: str
    cached_tokens: int
    host_tokens: int = 0


@record
class RequestPreempted(Event):
    """Recompute preemption: ``lost_tokens`` of computed KV are freed and must be redone."""

    TYPE: ClassVar[str] = "request_preempted"
    request: str
    worker: str
    lost_tokens: int


@record
class RequestReadmitted(Event):
    """A preempted request re-enters the batch; ``recompute_tokens`` are prefilled again and
    ``cached_tokens`` come from the prefix cache (its own surviving blocks included)."""

    TYPE: ClassVar[str] = "request_readmitted"
    request: str
    worker: str
    recompute_tokens: int
    cached_tokens: int
    host_tokens: int = 0


@record
class FirstToken(Event):
    TYPE: ClassVar[str] = "first_token"
    request: str


@record
class RequestFinished(Event):
    TYPE: ClassVar[str] = "request_finished"
    request: str
    program: str
    worker: str
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int


@record
class RequestDropped(Event):
    """The request can never run (e.g. it needs more KV blocks than the pool has)."""

    TYPE: ClassVar[str] = "request_dropped"
    request: str
    program: str
    worker: str
    reason: str


@record
class RequestRetried(Event):
    """The request ended before its output did (its worker was lost under it, or a weight sync
    aborted it); the call goes out again as a new request of the same turn, whose prompt holds
    the ``output_tokens`` already generated, to be computed again."""

    TYPE: ClassVar[str] = "request_retried"
    request: str
    program: str
    worker: str
    reason: str
    output_tokens: int = 0


@record
class ToolStarted(Event):
    TYPE: ClassVar[str] = "tool_started"
    program: str
    duration_s: float


@record
class ToolFinished(Event):
    TYPE: ClassVar[str] = "tool_finished"
    program: str


@record
class ProgramPaused(Event):
    TYPE: ClassVar[str] = "program_paused"
    program: str


@record
class ProgramResumed(Event):
    TYPE: ClassVar[str] = "program_resumed"
    program: str
    worker: str
    forced: bool


@record
class ProgramPinned(Event):
    """``blocks`` of the program's context stay referenced on ``worker`` for up to ``ttl_s``."""

    TYPE: ClassVar[str] = "program_pinned"
    program: str
    worker: str
    blocks: int
    ttl_s: float


@record
class ProgramFinished(Event):
    """The program's last call ended (its client is done with it). ``completed``: every call
    succeeded (false when a request was dropped, or for a program with no call at all).
    ``released``: its client's release (session-final) went with it; false when the client
    releases it later (`ProgramReleased`) or never (``workload.release``). In live logs the
    router writes this event when the release arrives (or its idle TTL ends the program)."""

    TYPE: ClassVar[str] = "program_finished"
    program: str
    context_tokens: int
    completed: bool
    released: bool = True


@record
class ProgramReleased(Event):
    """The client of a finished program released it (``workload.release: {kind: after}``)."""

    TYPE: ClassVar[str] = "program_released"
    program: str


@record
class KvStored(Event):
    """Full blocks newly cached on a worker, in prefix order (only new stores are reported);
    ``tier``: ``device`` (the GPU pool) or ``host`` (the host tier: its store completed)."""

    TYPE: ClassVar[str] = "kv_stored"
    worker: str
    blocks: tuple[int, ...]
    tier: str = "device"


@record
class KvRemoved(Event):
    TYPE: ClassVar[str] = "kv_removed"
    worker: str
    blocks: tuple[int, ...]
    tier: str = "device"


@record
class WorkerSample(Event):
    """Periodic snapshot of one worker's KV pool and queues."""

    TYPE: ClassVar[str] = "worker_sample"
    worker: str
    used_blocks: int
    cached_blocks: int
    running: int
    waiting: int


@record
class WorkerLost(Event):
    """``worker`` died or left service discovery (live mode); its KV cache went with it and
    nothing is routed there until it joins again."""

    TYPE: ClassVar[str] = "worker_lost"
    worker: str
    reason: str


@record
class WorkerJoined(Event):
    """A lost worker is serving again (restarted or replaced), with an empty KV cache."""

    TYPE: ClassVar[str] = "worker_joined"
    worker: str


@record
class RolloutStarted(Event):
    """An RL step's rollout phase begins with ``trajectories`` to generate."""

    TYPE: ClassVar[str] = "rollout_started"
    step: int
    trajectories: int


@record
class RolloutFinished(Event):
    """The step's last trajectory finished; training starts."""

    TYPE: ClassVar[str] = "rollout_finished"
    step: int


@record
class TrainingStarted(Event):
    """Asynchronous modes: the trainer has the samples of update ``mini_step`` of ``step`` and
    trains on them (in sync mode `RolloutFinished` marks it)."""

    TYPE: ClassVar[str] = "training_started"
    step: int
    mini_step: int = 0


@record
class TrainingFinished(Event):
    """The trainer's update is done; in sync mode, with the weight update (prefix caches were
    reset if configured)."""

    TYPE: ClassVar[str] = "training_finished"
    step: int
    mini_step: int = 0


@record
class WeightSyncStarted(Event):
    """The trainer begins pushing the weights of ``version`` (the trainer steps done so far):
    calls in flight on the engines are aborted and every prefix cache is emptied."""

    TYPE: ClassVar[str] = "weight_sync_started"
    version: int


@record
class WeightSyncFinished(Event):
    """The engines serve with the weights of ``version``; calls parked meanwhile go on."""

    TYPE: ClassVar[str] = "weight_sync_finished"
    version: int


@record
class GroupSampled(Event):
    """The trainer took GRPO group ``group`` into the batch of ``step``; its turns ran under
    weight versions ``min_version`` to ``max_version``."""

    TYPE: ClassVar[str] = "group_sampled"
    step: int
    group: str
    min_version: int
    max_version: int


@record
class GroupEvicted(Event):
    """A finished group was too stale to train on (its span of versions passed the bound);
    a new prompt takes its place."""

    TYPE: ClassVar[str] = "group_evicted"
    step: int
    group: str
    span: int


@record
class RunEnded(Event):
    """With a host tier: the tokens stored to it and the seconds each copy lane was busy, over
    all workers."""

    TYPE: ClassVar[str] = "run_ended"
    engine_iterations: int
    unfinished_requests: int
    host_stored_tokens: int = 0
    d2h_busy_s: float = 0.0
    h2d_busy_s: float = 0.0


EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        RunStarted,
        ProgramStarted,
        RequestArrived,
        RequestHeld,
        RequestRouted,
        PrefillStarted,
        RequestPreempted,
        RequestReadmitted,
        FirstToken,
        RequestFinished,
        RequestDropped,
        RequestRetried,
        ToolStarted,
        ToolFinished,
        ProgramPaused,
        ProgramResumed,
        ProgramPinned,
        ProgramFinished,
        ProgramReleased,
        KvStored,
        KvRemoved,
        WorkerSample,
        WorkerLost,
        WorkerJoined,
        RolloutStarted,
        RolloutFinished,
        TrainingStarted,
        TrainingFinished,
        WeightSyncStarted,
        WeightSyncFinished,
        GroupSampled,
        GroupEvicted,
        RunEnded,
    )
}

_FIELDS: dict[type[Event], tuple[str, ...]] = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in EVENT_TYPES.values()}
# Per event type, its fields that have a default, with the default (written only when different).
_DEFAULTS: dict[type[Event], dict[str, Any]] = {
    cls: defaults
    for cls in EVENT_TYPES.values()
    if (defaults := {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING})
}


def to_record(event: Event) -> dict[str, Any]:
    """JSON-ready dict: ``type`` first, then the fields in declaration order, those at their
    default left out."""
    record: dict[str, Any] = {"type": event.TYPE}
    for name in _FIELDS[type(event)]:
        record[name] = getattr(event, name)
    defaults = _DEFAULTS.get(type(event))
    if defaults:
        for name, default in defaults.items():
            if record[name] == default:
                del record[name]
    return record


def from_record(record: dict[str, Any]) -> Event:
    """Inverse of `to_record`; raises ValueError naming the problem for a bad record."""
    kind = record.get("type")
    cls = EVENT_TYPES.get(kind) if kind is not None else None
    if cls is None:
        raise ValueError(f"unknown event type {kind!r} (allowed: {', '.join(sorted(EVENT_TYPES))})")
    names = _FIELDS[cls]
    defaults = _DEFAULTS.get(cls, {})
    missing = [n for n in names if n not in record and n not in defaults]
    if missing:
        raise ValueError(f"{kind} event lacks field(s) {', '.join(missing)}")
    values: list[Any] = []  # as decoded from JSON, lists made tuples
    for name in names:
        value = record[name] if name in record else defaults[name]
        values.append(tuple(value) if isinstance(value, list) else value)
    return cls(*values)
