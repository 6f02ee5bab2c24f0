"""tasim's side: the same trace through the simulator, configured as Dynamo's mocker runs it."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tasim.config.scenario import FLAVOUR_DEFAULTS, MooncakeTraceWorkload, Override, ReplacedFields, Scenario, replaced_by
from tasim.core import events as ev
from tasim.validation.measures import RequestRecord
from tasim.validation.workload_trace import ReplayTrace

if TYPE_CHECKING:
    from tasim.sim.engine.scheduler import EngineFactory, EngineListener, EngineSetup
    from tasim.sim.perf import PerfModel

# Long enough for any trace to drain: the run ends when its last request completes.
_UNBOUNDED_S = 1e7

# The mocker's timing, which tasim's side of the replay uses whatever the scenario says (its
# engine runs the mocker flavour: `against_dynamo.validate`).
MOCKER_PERF_MODEL = "dynamo_polynomial"

# Every field `replay_scenario` sets itself: the value it sets (None where it varies) and why.
REPLACED_FIELDS: ReplacedFields = {
    "policy": (None, "each router in --routers runs with Dynamo's defaults"),
    "cluster.engine.flavour": ("mocker", "Dynamo's replay runs the mocker"),
    "cluster.engine.eviction": (FLAVOUR_DEFAULTS["mocker"]["eviction"], "the mocker evicts leaves first"),
    "cluster.engine.reuse_output_blocks": (
        FLAVOUR_DEFAULTS["mocker"]["reuse_output_blocks"],
        "the mocker caches its output under token ids of its own",
    ),
    "cluster.engine.host_tier.semantics": ("dynamo_mocker", "Dynamo's replay runs the mocker's host tier"),
    "cluster.engine.host_tier.store_threshold": (0, "the mocker stores every block it is offered"),
    "cluster.perf.model": (MOCKER_PERF_MODEL, "the mocker's step times"),
    "metrics.warmup_s": (0.0, "every request of the trace is measured"),
    "metrics.sample_interval_s": (_UNBOUNDED_S, "the replay takes no samples"),
}


def lost_in_replay(override: Override) -> str | None:
    """Why a scenario override would be lost in the replay, or None."""
    return replaced_by(override, REPLACED_FIELDS, "validate dynamo")


def replay_scenario(scenario: Scenario, trace: ReplayTrace, router: str) -> Scenario:
    """``scenario`` (mocker-flavoured, `against_dynamo.validate`) replaying ``trace`` under
    ``router`` with the mocker's timing and the KV pool size fixed to a number."""
    cluster = scenario.cluster
    engine = cluster.engine.model_copy(update={"kv_blocks": cluster.kv_blocks_per_worker()})
    perf = cluster.perf.model_copy(update={"model": MOCKER_PERF_MODEL})
    workload = MooncakeTraceWorkload(
        kind="mooncake_trace",
        path=str(trace.path),
        trace_block_size=trace.trace_block_size,
        arrival_speedup=trace.arrival_speedup,
    )
    return scenario.model_copy(
        update={
            "cluster": cluster.model_copy(update={"engine": engine, "perf": perf}),
            "workload": workload,
            # Dynamo's replay runs its router with its defaults, so tasim's does too
            "policy": scenario.policy.model_copy(update={"name": router, "params": {}, "defaults": {}}),
            "duration_s": _UNBOUNDED_S,
            "metrics": scenario.metrics.model_copy(update={"warmup_s": 0.0, "sample_interval_s": _UNBOUNDED_S}),
        }
    )


class _Collector:
    """Folds the event stream into one record per completed request."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.first_token: dict[str, float] = {}
        self.first_cached: dict[str, int] = {}
        self.most_cached: dict[str, int] = {}
        self.records: list[RequestRecord] = []
        # by exact type: a replay sends tens of thousands of events this way
        self._handlers: dict[type[ev.Event], Callable[[Any], None]] = {
            ev.RequestArrived: self._arrived,
            ev.PrefillStarted: self._prefill_started,
            ev.RequestReadmitted: self._readmitted,
            ev.FirstToken: self._first_token,
            ev.RequestFinished: self._finished,
        }

    def __call__(self, event: ev.Event) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _arrived(self, event: ev.RequestArrived) -> None:
        self.arrived[event.request] = event.t

    def _prefill_started(self, event: ev.PrefillStarted) -> None:
        self.first_cached[event.request] = self.most_cached[event.request] = event.cached_tokens

    def _readmitted(self, event: ev.RequestReadmitted) -> None:
        self.most_cached[event.request] = max(self.most_cached[event.request], event.cached_tokens)

    def _first_token(self, event: ev.FirstToken) -> None:
        self.first_token[event.request] = event.t

    def _finished(self, event: ev.RequestFinished) -> None:
        self.records.append(
            RequestRecord(
                arrival_ms=self.arrived[event.request] * 1000.0,
                first_token_ms=self.first_token[event.request] * 1000.0,
                finish_ms=event.t * 1000.0,
                input_tokens=event.prompt_tokens,
                output_tokens=event.output_tokens,
                reused_tokens=self.most_cached[event.request],
                first_reused_tokens=self.first_cached[event.request],
            )
        )


def run_tasim(scenario: Scenario, trace: ReplayTrace, router: str) -> tuple[list[RequestRecord], int, float]:
    """Completed requests, the number that did not complete, and the wall time in seconds."""
    from tasim.sim.runner import Simulation

    collector = _Collector()
    engine_factory = _mocker_tier_engines(scenario, trace)
    gc.collect()  # earlier runs' garbage (a finished simulation is a cycle) is not this run's
    started = time.perf_counter()
    if engine_factory is None:
        Simulation(replay_scenario(scenario, trace, router), collector).run()
    else:
        Simulation(replay_scenario(scenario, trace, router), collector, engine_factory=engine_factory).run()
    wall = time.perf_counter() - started
    return collector.records, trace.requests - len(collector.records), wall


def _mocker_tier_engines(scenario: Scenario, trace: ReplayTrace) -> EngineFactory | None:
    """With a host tier: engines whose tier orders a cohort of blocks by the sequence hashes
    Dynamo's replay gives them, as the mocker does (`tasim.sim.engine.mocker_host_tier`);
    None without one."""
    if scenario.cluster.engine.host_tier is None:
        return None
    from tasim.sim.engine.kv_manager import HostTierSetup
    from tasim.sim.engine.scheduler import Engine
    from tasim.validation.mocker_hashes import mocker_cohort_ranks

    ranks = mocker_cohort_ranks(trace.path, trace.trace_block_size, scenario.cluster.engine.block_size)

    def build(worker: str, config: EngineSetup, perf: PerfModel, listener: EngineListener) -> Engine:
        tier = config.host_tier
        assert tier is not None
        ordered = HostTierSetup(tier.blocks, tier.block_bytes, tier.d2h_gbps, tier.h2d_gbps, tier.store_threshold, tier.semantics, cohort_ranks=ranks)
        return Engine(worker, replace(config, host_tier=ordered), perf, listener)

    return build
