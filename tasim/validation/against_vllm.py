"""``tasim validate vllm``: one scenario through tasim's engine and through vLLM's own scheduler
(`tasim.validation.vllm_engine`), compared request by request.

Both runs are tasim simulations of the same scenario and seed: the same programs, arrivals, tool
gaps, routing and a fixed step time, so every step of either engine starts at the same instant
as long as the two have decided alike. Per request the decisions compared are each admission
(its time and the prefix-cache hit it got, re-admissions after a preemption included), the
preemptions, the first token and the finish; then the run summaries, folded from both event
logs by the same code.

With a host tier (``cluster.engine.host_tier``) vLLM runs its OffloadingConnector (see
`tasim.validation.vllm_engine`), and per request also compared are the tokens of each admission's
hit that came from the host, and its host copy jobs: every load and store, with the step that
planned it, its blocks and when it was done; per worker, the host's KV events (blocks stored,
blocks evicted) step by step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from tasim.config.scenario import FLAVOUR_DEFAULTS, Override, ReplacedFields, Scenario, replaced_by, with_engine_flavour
from tasim.core import events as ev
from tasim.core.model import BlockHash
from tasim.sim.engine.kv_manager import HostTierSetup
from tasim.sim.engine.scheduler import Engine, EngineListener, EngineSetup, Step, StepEngine
from tasim.sim.perf.perf_model import PerfModel
from tasim.sim.simulation import run_simulation
from tasim.validation import TransferObserver, ValidationUnavailable

VALIDATION_FILE = "validation.json"
SIDES = ("tasim", "vllm")
DECISIONS = ("admission step", "prefix-hit tokens", "preemptions", "first-token step", "finish step")
# compared besides with a host tier; its KV events are compared per worker and step
TIER_DECISIONS = ("host-hit tokens", "host loads", "host stores")
HOST_EVENTS = "host KV events"
SHOWN_MISMATCHES = 10
RECORDED_MISMATCHES = 200
# Policies that need an engine feature vLLM's scheduler does not have.
_PINNING_POLICIES = frozenset({"continuum"})


@dataclass(slots=True)
class RequestDecisions:
    """What one engine decided for one request; times in steps (seconds / step time)."""

    admissions: list[tuple[float, int, int]] = field(default_factory=list)  # (step, prefix-hit tokens, of them from the host)
    preemptions: list[float] = field(default_factory=list)
    first_token: float | None = None
    finished: float | None = None
    dropped: str | None = None
    loads: list[tuple[float, tuple[int, ...], float]] = field(default_factory=list)  # (step, blocks, done step)
    stores: list[tuple[float, tuple[int, ...], float]] = field(default_factory=list)

    def value(self, decision: str) -> Any:
        if decision == "admission step":
            return [step for step, _, _ in self.admissions]
        if decision == "prefix-hit tokens":
            return [hit for _, hit, _ in self.admissions]
        if decision == "host-hit tokens":
            return [host for _, _, host in self.admissions]
        if decision == "host loads":
            return self.loads
        if decision == "host stores":
            return self.stores
        if decision == "preemptions":
            return self.preemptions
        if decision == "first-token step":
            return self.first_token
        if decision == "finish step":
            return self.finished if self.dropped is None else f"dropped: {self.dropped}"
        raise KeyError(decision)


class DecisionLog:
    """Folds one event stream into the decisions per request; with a host tier also what the
    engine reports of its host (`on_transfer`, and `on_host_kv` through `HostEventTap`)."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.requests: dict[str, RequestDecisions] = {}
        # per worker: (step, blocks stored, blocks evicted), each sorted (the order within a step means nothing)
        self.host_events: dict[str, list[tuple[float, tuple[BlockHash, ...], tuple[BlockHash, ...]]]] = {}

    def steps(self, t: float) -> float:
        return round(t / self.step_s, 6)

    def __call__(self, event: ev.Event) -> None:
        steps = self.steps(event.t)
        if isinstance(event, ev.RequestArrived):
            self.requests[event.request] = RequestDecisions()
        elif isinstance(event, (ev.PrefillStarted, ev.RequestReadmitted)):
            self.requests[event.request].admissions.append((steps, event.cached_tokens, event.host_tokens))
        elif isinstance(event, ev.RequestPreempted):
            self.requests[event.request].preemptions.append(steps)
        elif isinstance(event, ev.FirstToken):
            self.requests[event.request].first_token = steps
        elif isinstance(event, ev.RequestFinished):
            self.requests[event.request].finished = steps
        elif isinstance(event, ev.RequestDropped):
            self.requests[event.request].dropped = event.reason

    def on_transfer(self, worker: str, request: str, kind: str, blocks: tuple[int, ...], now: float, done: float) -> None:
        decisions = self.requests[request]
        (decisions.loads if kind == "load" else decisions.stores).append((self.steps(now), blocks, self.steps(done)))

    def on_host_kv(self, worker: str, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        self.host_events.setdefault(worker, []).append((self.steps(now), tuple(sorted(stored)), tuple(sorted(removed))))


class HostEventTap:
    """An engine's listener that passes everything on to the simulation and the host tier's KV
    events to a `DecisionLog` too (the simulation logs them only with metrics.log_kv_events)."""

    def __init__(self, listener: EngineListener, log: DecisionLog) -> None:
        self._listener = listener
        self._log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._listener, name)

    def on_host_kv(self, worker: str, stored: list[BlockHash], removed: list[BlockHash], now: float) -> None:
        self._log.on_host_kv(worker, stored, removed, now)
        self._listener.on_host_kv(worker, stored, removed, now)


class TransferTap:
    """tasim's engine, reporting the host copy jobs each step plans to ``on_transfer``. The engine
    has no listener call for them, so they are read from its KV cache manager's jobs in flight:
    the ones not seen after the previous step (held, so no new job can take a finished one's id).
    Folded steps plan none (`Engine.plan_run` folds no step that stores or loads)."""

    def __init__(self, engine: Engine, on_transfer: TransferObserver) -> None:
        self._engine = engine
        self._on_transfer = on_transfer
        self._seen: dict[int, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def begin_step(self, now: float) -> Step:
        engine = self._engine
        step = engine.begin_step(now)
        in_flight = list(engine.kv_cache._in_flight)
        for job in in_flight:
            if id(job) not in self._seen:
                depth = {block: index for index, block in enumerate(job.request.block_hashes)}
                blocks = tuple(sorted(depth[block] for block in job.copy.keys))
                self._on_transfer(engine.worker, job.request.request_id, "load" if job.load else "store", blocks, now, job.done)
        self._seen = {id(job): job for job in in_flight}
        return step


@dataclass(frozen=True, slots=True)
class Mismatch:
    request: str
    decision: str
    tasim: Any
    vllm: Any


@dataclass(frozen=True)
class Comparison:
    requests: int
    identical: dict[str, int]  # per decision compared: requests on which both engines agree
    mismatches: list[Mismatch]
    summaries: dict[str, dict[str, Any]]  # per side
    walls: dict[str, float]
    host_event_steps: int = 0  # with a host tier: worker steps with host KV events on either side
    host_events_identical: int = 0  # of those, the ones with the same events on both

    @property
    def decisions(self) -> tuple[str, ...]:
        return tuple(self.identical)

    @property
    def tiered(self) -> bool:
        return TIER_DECISIONS[0] in self.identical

    @property
    def all_identical(self) -> bool:
        return all(count == self.requests for count in self.identical.values()) and self.host_events_identical == self.host_event_steps


# Every field `oracle_scenario` sets itself: the value it sets (None where it varies) and why.
REPLACED_FIELDS: ReplacedFields = {
    "cluster.engine.flavour": ("vllm", "it compares tasim's vllm engine flavour"),
    "cluster.engine.eviction": (FLAVOUR_DEFAULTS["vllm"]["eviction"], "vLLM evicts least recently used blocks"),
    "cluster.engine.reuse_output_blocks": (FLAVOUR_DEFAULTS["vllm"]["reuse_output_blocks"], "vLLM caches generated blocks"),
    "cluster.perf": (None, "every step of both engines takes --step-ms"),
}


def lost_in_oracle(override: Override) -> str | None:
    """Why a scenario override would be lost in the comparison, or None."""
    return replaced_by(override, REPLACED_FIELDS, "validate vllm")


def oracle_scenario(scenario: Scenario, step_ms: float) -> Scenario:
    """The scenario as both engines run it: tasim's engine in vLLM's flavour (whatever flavour
    the scenario chose), and a fixed step time."""
    scenario = with_engine_flavour(scenario, "vllm")
    reason = unsupported(scenario)
    if reason:
        raise ValidationUnavailable(reason)
    cluster = scenario.cluster
    perf = type(cluster.perf)(model="fixed", step_ms=step_ms)
    return scenario.model_copy(update={"cluster": cluster.model_copy(update={"perf": perf})})


def unsupported(scenario: Scenario) -> str | None:
    """Why the scenario cannot run on vLLM's scheduler, or None."""
    from tasim.sim.runner import engine_setup
    from tasim.validation.vllm_engine import vllm_unsupported

    if scenario.policy.name in _PINNING_POLICIES:
        return f"policy {scenario.policy.name} pins KV blocks, which vLLM's scheduler cannot (choose another policy)"
    return vllm_unsupported(engine_setup(scenario))


def validate(scenario: Scenario, out: Path, step_ms: float) -> Comparison:
    """Run both engines on ``scenario`` (with a fixed step of ``step_ms``), writing each run
    under ``out/<side>``, and compare them."""
    from tasim.validation.vllm_engine import VllmEngine

    oracle = oracle_scenario(scenario, step_ms)
    tiered = oracle.cluster.engine.host_tier is not None
    logs = {side: DecisionLog(step_ms / 1000.0) for side in SIDES}
    factories: dict[str, Callable[..., Any] | None] = {"tasim": None, "vllm": VllmEngine}
    if tiered:
        factories = {"tasim": _tapped_tasim(logs["tasim"]), "vllm": _tapped_vllm(logs["vllm"])}
    summaries, walls = {}, {}
    for side, factory in factories.items():
        started = time.perf_counter()
        summaries[side] = run_simulation(oracle, out / side, engine_factory=factory, observe=logs[side])
        walls[side] = time.perf_counter() - started
    if not tiered:
        return compare(logs["tasim"].requests, logs["vllm"].requests, summaries, walls)
    host_events = (logs["tasim"].host_events, logs["vllm"].host_events)
    return compare(logs["tasim"].requests, logs["vllm"].requests, summaries, walls, DECISIONS + TIER_DECISIONS, host_events)


def _tapped_tasim(log: DecisionLog) -> Callable[[str, EngineSetup, PerfModel, EngineListener], StepEngine]:
    def build(worker: str, config: EngineSetup, perf: PerfModel, listener: EngineListener) -> StepEngine:
        return TransferTap(Engine(worker, config, perf, HostEventTap(listener, log)), log.on_transfer)

    return build


def _tapped_vllm(log: DecisionLog) -> Callable[[str, EngineSetup, PerfModel, EngineListener], StepEngine]:
    from tasim.validation.vllm_engine import VllmEngine

    def build(worker: str, config: EngineSetup, perf: PerfModel, listener: EngineListener) -> StepEngine:
        return VllmEngine(worker, config, perf, HostEventTap(listener, log), on_transfer=log.on_transfer)

    return build


HostEvents = dict[str, list[tuple[float, tuple[BlockHash, ...], tuple[BlockHash, ...]]]]


def compare(
    ours: dict[str, RequestDecisions],
    theirs: dict[str, RequestDecisions],
    summaries: dict[str, dict[str, Any]],
    walls: dict[str, float],
    decisions: tuple[str, ...] = DECISIONS,
    host_events: tuple[HostEvents, HostEvents] | None = None,
) -> Comparison:
    identical = dict.fromkeys(decisions, 0)
    mismatches: list[Mismatch] = []
    for request in sorted(ours.keys() | theirs.keys(), key=_arrival_order(ours, theirs)):
        a, b = ours.get(request), theirs.get(request)
        for decision in decisions:
            mine = a.value(decision) if a else "never arrived"
            other = b.value(decision) if b else "never arrived"
            if mine == other:
                identical[decision] += 1
            else:
                mismatches.append(Mismatch(request, decision, mine, other))
    steps = same = 0
    if host_events is not None:
        mine_by_step, other_by_step = (_by_worker_step(events) for events in host_events)
        for key in sorted(mine_by_step.keys() | other_by_step.keys()):
            steps += 1
            mine, other = mine_by_step.get(key), other_by_step.get(key)
            if mine == other:
                same += 1
            else:
                worker, step = key
                mismatches.append(Mismatch(f"{worker} at step {step:g}", HOST_EVENTS, mine, other))
    return Comparison(len(ours.keys() | theirs.keys()), identical, mismatches, summaries, walls, steps, same)


def _by_worker_step(events: HostEvents) -> dict[tuple[str, float], tuple[tuple[BlockHash, ...], tuple[BlockHash, ...]]]:
    """Host KV events by (worker, step): blocks stored and blocks evicted, each sorted."""
    merged: dict[tuple[str, float], tuple[tuple[BlockHash, ...], tuple[BlockHash, ...]]] = {}
    for worker, entries in events.items():
        for step, stored, removed in entries:
            before = merged.get((worker, step), ((), ()))
            merged[worker, step] = (tuple(sorted(before[0] + stored)), tuple(sorted(before[1] + removed)))
    return merged


def _arrival_order(*logs: dict[str, RequestDecisions]) -> Callable[[str], tuple[int, int]]:
    """Requests in the order they first arrived on either side (dicts keep arrival order)."""
    rank: dict[str, tuple[int, int]] = {}
    for side, log in enumerate(logs):
        for position, request in enumerate(log):
            rank.setdefault(request, (position, side))
    return rank.__getitem__


# --- presenting ---------------------------------------------------------------------------

# (label, summary key or path, unit): the run summaries compared beside the decisions
SUMMARY_ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("requests completed", ("requests_completed",)),
    ("requests dropped", ("requests_dropped",)),
    ("calls/min", ("calls_per_min",)),
    ("output tokens/s", ("output_tokens_per_s",)),
    ("prefix hit rate", ("prefix_hit_rate",)),
    ("preemptions", ("preemptions",)),
    ("recomputed tokens", ("recomputed_tokens",)),
    ("TTFT mean (s)", ("ttft_s", "mean")),
    ("E2E mean (s)", ("e2e_s", "mean")),
    ("engine iterations", ("engine_iterations",)),
)
# beside them with a host tier
TIER_SUMMARY_ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GPU-hit tokens", ("host_tier", "gpu_hit_tokens")),
    ("host-hit tokens", ("host_tier", "host_hit_tokens")),
    ("host stored tokens", ("host_tier", "stored_tokens")),
    ("D2H busy (s)", ("host_tier", "d2h_busy_s")),
    ("H2D busy (s)", ("host_tier", "h2d_busy_s")),
)


def _lookup(summary: dict[str, Any], path: Sequence[str]) -> Any:
    value: Any = summary
    for key in path:
        value = value[key] if value is not None else None
    return value


def decision_table(result: Comparison) -> Table:
    table = Table(title=f"tasim against vLLM {_vllm_version()}'s scheduler: {result.requests} requests", title_justify="left")
    table.add_column("decision, per request")
    table.add_column("identical", justify="right")
    table.add_column("differ", justify="right")
    for decision in result.decisions:
        same = result.identical[decision]
        differ = result.requests - same
        table.add_row(decision, f"{same}", f"{differ}{' ✓' if differ == 0 else ' ✗'}")
    if result.tiered:
        differ = result.host_event_steps - result.host_events_identical
        table.add_row(f"{HOST_EVENTS}, per worker step", f"{result.host_events_identical}", f"{differ}{' ✓' if differ == 0 else ' ✗'}")
    return table


def summary_table(result: Comparison) -> Table:
    table = Table(title="run summaries (difference: tasim − vLLM)", title_justify="left")
    for column in ("metric", "tasim", "vLLM", "difference"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for label, path in SUMMARY_ROWS + (TIER_SUMMARY_ROWS if result.tiered else ()):
        mine, other = (_lookup(result.summaries[side], path) for side in SIDES)
        table.add_row(label, _number(mine), _number(other), _difference(mine, other))
    table.add_row("wall time (s)", f"{result.walls['tasim']:.2f}", f"{result.walls['vllm']:.2f}", "")
    return table


def mismatch_table(result: Comparison, limit: int = SHOWN_MISMATCHES) -> Table | None:
    if not result.mismatches:
        return None
    shown = result.mismatches[:limit]
    table = Table(title=f"first {len(shown)} of {len(result.mismatches)} differences (times in steps)", title_justify="left")
    for column in ("request", "decision", "tasim", "vLLM"):
        table.add_column(column)
    for m in shown:
        table.add_row(m.request, m.decision, _short(m.tasim), _short(m.vllm))
    return table


def validation_record(scenario: Scenario, step_ms: float, result: Comparison) -> dict[str, Any]:
    from tasim.sim.runner import engine_setup

    config = engine_setup(scenario)
    return {
        "scenario": scenario.name,
        "vllm_version": _vllm_version(),
        "step_ms": step_ms,
        "workers": scenario.cluster.backends,
        "policy": scenario.policy.name,
        "engine": {
            "block_size": config.block_size,
            "num_blocks": config.num_blocks,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "enable_prefix_caching": config.enable_prefix_caching,
            "enable_chunked_prefill": config.enable_chunked_prefill,
            "max_model_len": config.max_model_len,
        },
        "host_tier": None if config.host_tier is None else _tier_record(config.host_tier),
        "requests": result.requests,
        "identical": result.identical,
        "host_event_steps": result.host_event_steps,
        "host_events_identical": result.host_events_identical,
        "all_identical": result.all_identical,
        "mismatches": [
            {"request": m.request, "decision": m.decision, "tasim": m.tasim, "vllm": m.vllm} for m in result.mismatches[:RECORDED_MISMATCHES]
        ],
        "mismatch_count": len(result.mismatches),
        "summary": result.summaries,
        "wall_s": result.walls,
    }


def _tier_record(tier: HostTierSetup) -> dict[str, Any]:
    return {
        "blocks": tier.blocks,
        "block_bytes": tier.block_bytes,
        "d2h_gbps": tier.d2h_gbps,
        "h2d_gbps": tier.h2d_gbps,
        "store_threshold": tier.store_threshold,
    }


def _vllm_version() -> str:
    from tasim.validation.vllm_engine import VLLM_VERSION

    return VLLM_VERSION


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.4f}" if abs(value) < 10 else f"{value:,.1f}"


def _difference(mine: Any, other: Any) -> str:
    if mine is None or other is None:
        return "" if mine == other else "✗"
    diff = mine - other
    same = diff == 0 or abs(diff) <= 1e-9 * max(abs(mine), abs(other))
    text = _number(diff) if isinstance(diff, int) else f"{diff:+.4g}"
    return f"{text} {'✓' if same else '✗'}"


def _short(value: Any, width: int = 60) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"
